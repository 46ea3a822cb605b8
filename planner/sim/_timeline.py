"""Execution timelines: when every task of a task graph is ready, starts and ends.

A `Timeline` reads the simulator's flat per-id lists through small `Mapping` views keyed by task
key, so handing one out costs nothing (delta simulation returns one after every move of a
search).  A timeline from `simulate()` owns private copies and stays valid forever; one from a
`DeltaSimulator` is a live view of the simulator's state and refuses to be read once the task
graph has been edited again (call `detached()` to keep a copy across edits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import SimulationError, UnknownTaskError
from ._layout import MAX_PARTS


class _Data:
    """Shared backing of one timeline's views."""

    __slots__ = ("ids", "key", "res", "dur", "rdy", "st", "en", "seq", "pen", "owner", "version", "_by_res")

    def __init__(self, ids, key, res, dur, rdy, st, en, seq, owner=None, pen=None):
        self.ids, self.key, self.res, self.dur = ids, key, res, dur
        self.rdy, self.st, self.en, self.seq = rdy, st, en, seq
        self.pen = pen  # part ends, MAX_PARTS slots per id (tasks with parts: res and dur are tuples)
        self.owner = owner                       # a TaskGraph whose edits make this view stale
        self.version = owner._version if owner is not None else 0
        self._by_res: dict[int, list] | None = None

    def check(self) -> None:
        if self.owner is not None and self.owner._version != self.version:
            raise SimulationError(
                "this timeline is a view of a DeltaSimulator whose task graph has been edited since; "
                "call resimulate() for the new timeline, or detached() before editing to keep this one")

    def ix(self, key) -> int:
        self.check()
        try:
            return self.ids[key]
        except (KeyError, TypeError):
            raise UnknownTaskError(f"no task {key!r} in this timeline ({len(self.ids)} tasks)") from None

    def by_res(self) -> dict[int, list]:
        self.check()
        if self._by_res is None:
            out: dict[int, list] = {}
            res, key = self.res, self.key
            for i in self.seq:  # the order tasks ran in, hence each resource's FIFO order
                r = res[i]
                if type(r) is tuple:  # a task with parts is on each part's resource
                    for rh in r:
                        lst = out.get(rh)
                        if lst is None:
                            lst = out[rh] = []
                        lst.append(key[i])
                    continue
                lst = out.get(r)
                if lst is None:
                    lst = out[r] = []
                lst.append(key[i])
            self._by_res = out
        return self._by_res


class _TimeMap(Mapping):
    """key -> one of ready/start/end, read through to the backing list."""

    __slots__ = ("_d", "_which")

    def __init__(self, data: _Data, which: str):
        self._d = data
        self._which = which

    def __getitem__(self, key) -> float:
        d = self._d
        return getattr(d, self._which)[d.ix(key)]

    def __contains__(self, key) -> bool:
        self._d.check()
        return key in self._d.ids

    def __iter__(self):
        self._d.check()
        return iter(self._d.ids)

    def __len__(self) -> int:
        return len(self._d.ids)

    def __repr__(self) -> str:
        return f"<{self._which} times of {len(self._d.ids)} tasks>"


@dataclass(frozen=True, eq=False, repr=False)
class Timeline:
    """Ready, start and end time of every task (seconds from the start of the step).

    `order(resource)` gives the FIFO order the simulation chose; `makespan` is the step time.
    Compare two timelines with `same_as` (exact by default): `==` is identity.
    """

    start: Mapping
    end: Mapping
    ready: Mapping
    makespan: float
    _data: _Data = field(compare=False)

    @classmethod
    def _of(cls, data: _Data, makespan: float) -> "Timeline":
        return cls(_TimeMap(data, "st"), _TimeMap(data, "en"), _TimeMap(data, "rdy"), makespan, data)

    def __len__(self) -> int:
        return len(self._data.ids)

    def __repr__(self) -> str:
        return f"Timeline({len(self._data.ids)} tasks, makespan={self.makespan!r})"

    def order(self, resource: int) -> list:
        """Keys of the tasks on `resource` in the order they run (empty for an unused resource)."""
        return list(self._data.by_res().get(resource, ()))

    def spans(self, resource: int) -> list[tuple[tuple, float, float]]:
        """(key, start, end) of every task on `resource` — of its part there, for a task with
        parts — in the order they ran."""
        d = self._data
        out = []
        last = 0.0
        for key in self.order(resource):
            i = d.ids[key]
            r = d.res[i]
            if type(r) is tuple:
                e = d.pen[i * MAX_PARTS + r.index(resource)]
                s = d.rdy[i] if last < d.rdy[i] else last  # FIFO: ready, or when the last one ended
            else:
                s, e = d.st[i], d.en[i]
            out.append((key, s, e))
            last = e
        return out

    def resources(self) -> list[int]:
        """Resources with at least one task."""
        return sorted(self._data.by_res())

    def busy(self) -> dict[int, float]:
        """Seconds each resource spends running tasks."""
        d = self._data
        d.check()
        out: dict[int, float] = {}
        res, dur = d.res, d.dur
        for i in d.ids.values():
            r = res[i]
            if type(r) is tuple:
                for rh, dh in zip(r, dur[i]):
                    out[rh] = out.get(rh, 0.0) + dh
            else:
                out[r] = out.get(r, 0.0) + dur[i]
        return out

    def parts(self, key) -> list[tuple[int, float, float]]:
        """(resource, start, end) of each part of a task (one for a task with one resource)."""
        d = self._data
        i = d.ix(key)
        r = d.res[i]
        if type(r) is not tuple:
            return [(r, d.st[i], d.en[i])]
        # The simulator keeps part ends only: a part starts where `spans` puts it on its resource.
        return [next((rh, s, e) for k, s, e in self.spans(rh) if k == key) for rh in r]

    def same_as(self, other: "Timeline", tol: float = 0.0) -> bool:
        """Same tasks and, within `tol` seconds (exactly by default), the same times."""
        a, b = self._data, other._data
        a.check()
        b.check()
        if len(a.ids) != len(b.ids) or abs(self.makespan - other.makespan) > tol:
            return False
        bids = b.ids
        ar, ast, aen, br, bst, ben = a.rdy, a.st, a.en, b.rdy, b.st, b.en
        for k, i in a.ids.items():
            j = bids.get(k)
            if j is None:
                return False
            if tol == 0.0:
                if ar[i] != br[j] or ast[i] != bst[j] or aen[i] != ben[j]:
                    return False
            elif abs(ar[i] - br[j]) > tol or abs(ast[i] - bst[j]) > tol or abs(aen[i] - ben[j]) > tol:
                return False
            if type(a.res[i]) is tuple:
                if a.res[i] != b.res[j]:
                    return False
                pa, pb = a.pen, b.pen
                for h in range(len(a.res[i])):
                    if abs(pa[i * MAX_PARTS + h] - pb[j * MAX_PARTS + h]) > tol:
                        return False
        return True

    def differences(self, other: "Timeline", limit: int = 5) -> list[str]:
        """Up to `limit` human-readable differences from `other` (for test failure messages)."""
        a, b = self._data, other._data
        out = []
        if self.makespan != other.makespan:
            out.append(f"makespan {self.makespan!r} != {other.makespan!r}")
        for k, i in a.ids.items():
            if len(out) >= limit:
                break
            j = b.ids.get(k)
            if j is None:
                out.append(f"{k!r} missing from other")
            elif (a.rdy[i], a.st[i], a.en[i]) != (b.rdy[j], b.st[j], b.en[j]):
                out.append(f"{k!r}: ready/start/end {(a.rdy[i], a.st[i], a.en[i])} != "
                           f"{(b.rdy[j], b.st[j], b.en[j])}")
        for k in b.ids:
            if len(out) >= limit:
                break
            if k not in a.ids:
                out.append(f"{k!r} missing from self")
        return out

    def detached(self) -> "Timeline":
        """A copy that no later edit of a task graph can invalidate."""
        d = self._data
        d.check()
        live = list(d.ids.values())
        # Re-index densely: the copy holds only live tasks.
        ids = {d.key[i]: n for n, i in enumerate(live)}
        pick = lambda arr: [arr[i] for i in live]  # noqa: E731
        where = {i: n for n, i in enumerate(live)}
        seq = [where[i] for i in d.seq if i in where]
        pen = None
        if d.pen is not None:
            pen = [0.0] * (MAX_PARTS * len(live))
            for n, i in enumerate(live):
                if type(d.res[i]) is tuple:
                    pen[n * MAX_PARTS:(n + 1) * MAX_PARTS] = d.pen[i * MAX_PARTS:(i + 1) * MAX_PARTS]
        data = _Data(ids, pick(d.key), pick(d.res), pick(d.dur), pick(d.rdy), pick(d.st), pick(d.en), seq, pen=pen)
        return Timeline._of(data, self.makespan)
