"""The task graph container the simulator times (FlexFlow sec. 5.1, Table 2).

A `TaskGraph` is mutable on purpose: delta simulation (sec. 5.3) edits one op's tasks in place
instead of rebuilding 10^5 tasks.  Internally every task has a dense integer id and its
properties live in flat lists indexed by id, so the simulation loops in `_replay` touch no
per-task objects; adjacency is a `set` of ids per task, so edges can be added idempotently and
removed in O(1).  Ids of removed tasks are recycled through a free list — except while a
`DeltaSimulator` still needs the old task's key, resource and times to replay the old timeline;
then the ids wait in `_held` until the simulator releases them.

Next to the Python lists, the graph keeps flat `array.array` mirrors of what Algorithm 1 reads —
durations, resource indices, keys padded to `KEY_FIELDS` fields, liveness and a generation per
id, and an append-only pool of edges — so the compiled pass (`_fastpass`) reads them in place
without converting 10^5 tasks per simulation.  A graph whose keys do not fit (longer than
`KEY_FIELDS`, or a field beyond 62 bits) simply uses the Python pass.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from itertools import compress, repeat
from operator import index as _as_index
from typing import Iterator

from ..errors import SimulationError, TaskGraphCycleError, UnknownTaskError
from . import _bulk
from ._layout import _NO_PARTS, _PADS, KEY_FIELDS, KEY_PAD, MAX_PARTS, _check_duration, _is_int, _parts


@dataclass(frozen=True)
class TaskInfo:
    """What the graph knows about one task; times live in a `Timeline`."""

    key: tuple
    resource: int
    duration: float
    kind: str = "compute"
    nbytes: float = 0.0
    label: str = ""


class TaskGraph:
    """Tasks on resources (devices and links alike) with ordering edges between them."""

    __slots__ = ("_id", "_key", "_res", "_rix", "_dur", "_kind", "_nbytes", "_label",
                 "_pred", "_succ", "_free", "_held", "_hold", "_rindex", "_rlist",
                 "_version", "_dmin", "_a_dur", "_a_rix", "_a_key", "_a_alive", "_a_gen",
                 "_e_rec", "_e_alive", "_nedges", "_compilable",
                 "_gseq", "_journal", "_compactions", "_a_np", "_a_prix", "_a_pdur", "_multipart",
                 "_route_rix", "_route_row")

    def __init__(self) -> None:
        self._id: dict[tuple, int] = {}      # key -> id of live tasks
        self._key: list = []                 # id -> key (kept after removal until the id is reused)
        self._res: list[int] = []            # id -> resource as the caller named it
        self._rix: list[int] = []            # id -> dense resource index (0..number of resources)
        self._dur: list[float] = []
        self._kind: list[str] = []
        self._nbytes: list[float] = []
        self._label: list[str] = []
        self._pred: list[set[int]] = []
        self._succ: list[set[int]] = []
        self._free: list[int] = []
        self._held: dict[int, None] = {}     # removed ids a DeltaSimulator still reads (ordered set)
        self._hold = False
        self._rindex: dict[int, int] = {}    # resource -> dense index; never shrinks
        self._rlist: list[int] = []          # dense index -> resource
        self._version = 0                    # bumped by every edit; timelines and simulators check it
        self._dmin = math.inf                # lower bound of every duration ever set
        # Flat mirrors for the compiled pass (module docstring).
        self._a_dur = array("d")
        self._a_rix = array("q")
        self._a_key = array("q")             # KEY_FIELDS per id
        self._a_alive = array("b")
        self._a_gen = array("q")             # bumped when an id's task is removed
        # Tasks with parts (`_parts`): the lists hold tuples (resources, dense indices, durations),
        # `_a_rix` -1 and `_a_dur` the longest part; per id, the number of parts (0: none) and
        # MAX_PARTS slots of dense resource index and duration.
        self._a_np = array("b")
        self._a_prix = array("q")
        self._a_pdur = array("d")
        self._multipart = False              # ever held a task with parts (`simulator` checks)
        # Batched adds (`_bulk`): a resource or route as named -> its dense index or indices; a
        # route -> its row of MAX_PARTS part slots (dense indices, zero-padded) as bytes.
        self._route_rix: dict = {}
        self._route_row: dict = {}
        self._e_rec = array("q")             # per edge: src, dst and their generations at add time
        self._e_alive = array("b")
        self._nedges = 0                     # live edges
        self._compilable = True
        self._gseq = 0                       # generations are never reused: a revived id's old
        #                                      edge records become live again, no others do
        self._journal: list | None = None    # edits since the simulator's last batch (rollback)
        self._compactions = 0                # edge-pool compactions (they renumber pool records)

    # -- queries ---------------------------------------------------------------------------
    def __contains__(self, key) -> bool:
        return key in self._id

    def __len__(self) -> int:
        return len(self._id)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._id)

    def keys(self):
        return self._id.keys()

    def placements(self) -> int:
        """Tasks counted once per resource they occupy (a task with k parts counts k): what the
        graph holds in the units of a task graph without multi-part tasks."""
        if not self._multipart:
            return len(self._id)
        return len(self._id) + sum(len(r) - 1 for r, a in zip(self._rix, self._a_alive) if a and type(r) is tuple)

    def _dense(self, r: int) -> int:
        rix = self._rindex.get(r)
        if rix is None:
            rix = self._rindex[r] = len(self._rlist)
            self._rlist.append(r)
        return rix

    def _set_parts(self, i: int, rix, dur) -> None:
        """Write id `i`'s part slots (`rix`, `dur` tuples for a task with parts; ints/floats
        otherwise: no parts)."""
        if type(rix) is tuple:
            k = len(rix)
            self._a_np[i] = k
            self._a_prix[i * MAX_PARTS:i * MAX_PARTS + k] = array("q", rix)
            self._a_pdur[i * MAX_PARTS:i * MAX_PARTS + k] = array("d", dur)
        else:
            self._a_np[i] = 0

    def _grow_parts(self, k: int) -> None:
        """Part slots for `k` ids appended at the end (no parts)."""
        self._a_np.frombytes(bytes(k))
        self._a_prix.frombytes(_NO_PARTS * k)
        self._a_pdur.frombytes(_NO_PARTS * k)

    def _ix(self, key) -> int:
        try:
            return self._id[key]
        except (KeyError, TypeError):
            raise UnknownTaskError(f"no task {key!r} in the task graph ({len(self._id)} tasks)") from None

    def task(self, key) -> TaskInfo:
        i = self._ix(key)
        return TaskInfo(self._key[i], self._res[i], self._dur[i], self._kind[i], self._nbytes[i], self._label[i])

    def preds(self, key) -> tuple:
        k = self._key
        return tuple(k[j] for j in self._pred[self._ix(key)])

    def succs(self, key) -> tuple:
        k = self._key
        return tuple(k[j] for j in self._succ[self._ix(key)])

    def resources(self) -> list[int]:
        """Every resource some task ever used, in order of first use."""
        return list(self._rlist)

    def num_edges(self) -> int:
        return sum(len(self._succ[i]) for i in self._id.values())

    # -- edits -----------------------------------------------------------------------------
    def add_task(self, key, resource: int, duration: float, kind: str = "compute",
                 nbytes: float = 0.0, label: str = "") -> None:
        self._add(key, resource, duration, kind, nbytes, label)

    def _add(self, key, resource, duration, kind, nbytes, label, at: int = -1) -> int:
        """Add a task; `at` >= 0 reuses that id, which must be free and not on the free list
        (a simulator reviving a task it removed)."""
        if type(key) is not tuple or not all(map(_is_int, key)):
            raise SimulationError(
                f"task key {key!r} must be a tuple of ints: keys order tasks on a tie, so they must "
                f"compare with each other")
        if key in self._id:
            raise SimulationError(f"task {key!r} is already in the task graph; remove it first to replace it")
        if type(resource) is tuple or type(duration) is tuple:
            r, d = _parts(key, resource, duration)
            rix = tuple(map(self._dense, r))
            dlo, dhi, arix = min(d), max(d), -1
            self._multipart = True
        else:
            d = float(duration)
            if not 0.0 < d < math.inf:
                _check_duration(key, duration)
            try:
                r = _as_index(resource)
            except TypeError:
                raise SimulationError(f"task {key!r}: resource {resource!r} must be an int") from None
            rix = arix = self._dense(r)
            dlo = dhi = d
        if dlo < self._dmin:
            self._dmin = dlo
        if len(key) <= KEY_FIELDS and (not key or min(key) > KEY_PAD):
            row = key + _PADS[len(key)]
        else:
            row = _PADS[0]
            self._compilable = False
        if at >= 0 or self._free:
            i = at if at >= 0 else self._free.pop()
            self._key[i] = key
            self._res[i] = r
            self._rix[i] = rix
            self._dur[i] = d
            self._kind[i] = kind
            self._nbytes[i] = nbytes
            self._label[i] = label
            self._a_dur[i] = dhi
            self._a_rix[i] = arix
            self._a_alive[i] = 1
            self._gseq += 1
            self._a_gen[i] = self._gseq
            self._set_parts(i, rix, d)
            try:
                self._a_key[i * KEY_FIELDS:(i + 1) * KEY_FIELDS] = array("q", row)
            except OverflowError:
                self._compilable = False
        else:
            i = len(self._key)
            self._key.append(key)
            self._res.append(r)
            self._rix.append(rix)
            self._dur.append(d)
            self._kind.append(kind)
            self._nbytes.append(nbytes)
            self._label.append(label)
            self._pred.append(set())
            self._succ.append(set())
            self._a_dur.append(dhi)
            self._a_rix.append(arix)
            self._a_alive.append(1)
            self._gseq += 1
            self._a_gen.append(self._gseq)
            self._grow_parts(1)
            self._set_parts(i, rix, d)
            try:
                self._a_key.extend(row)
            except OverflowError:
                self._a_key.extend(_PADS[0])
                self._compilable = False
        self._id[key] = i
        self._version += 1
        if self._journal is not None:
            self._journal.append((0, i))
        return i

    def add_tasks(self, tasks) -> None:
        """Add ``(key, resource, duration, kind, nbytes, label)`` tasks: the same as `add_task`
        on each in order (an invalid one raises with those before it added), in one call."""
        _bulk.add_tasks(self, tasks)

    def remove_task(self, key) -> None:
        self._remove(self._ix(key))

    def _remove(self, i: int) -> None:
        """Drop task `i` and its edges.  Its key, resource and duration stay readable until the id
        is reused, which a holding simulator defers (`_held`)."""
        key = self._key[i]
        del self._id[key]
        succ, pred = self._succ, self._pred
        ps, ss = pred[i], succ[i]
        for p in ps:
            succ[p].discard(i)
        for s in ss:
            pred[s].discard(i)
        self._nedges -= len(ps) + len(ss)
        self._a_alive[i] = 0  # the pool's edges of this id die with it (alive and generation)
        pred[i] = set()
        succ[i] = set()
        if self._journal is not None:
            self._journal.append((1, i, key, self._res[i], self._rix[i], self._dur[i], self._kind[i],
                                  self._nbytes[i], self._label[i], self._a_gen[i], ps, ss))
        if self._hold:
            self._held[i] = None
        else:
            self._free.append(i)
        self._version += 1


    def add_edge(self, src, dst) -> None:
        """`dst` cannot start before `src` ends.  Adding an existing edge changes nothing."""
        self._add_edge(self._ix(src), self._ix(dst))

    def add_edges(self, edges) -> None:
        """Add ``(src, dst)`` edges: the same as `add_edge` on each in order, in one call."""
        a, b, bad = _bulk.resolve(self, edges)
        _bulk.add_edges(self, a, b)
        if bad is not None:
            _bulk.unknown(self, bad)

    def _add_edge(self, a: int, b: int) -> bool:
        if a == b:
            raise TaskGraphCycleError(f"edge {self._key[a]!r} -> itself would be a cycle of one task")
        sa = self._succ[a]
        if b in sa:
            return False
        sa.add(b)
        self._pred[b].add(a)
        self._version += 1
        self._nedges += 1
        gen = self._a_gen
        if self._journal is not None:
            self._journal.append((2, a, b, len(self._e_alive)))
        self._e_rec.extend((a, b, gen[a], gen[b]))
        self._e_alive.append(1)
        return True

    def remove_edge(self, src, dst) -> None:
        self._remove_edge(self._ix(src), self._ix(dst))

    def _remove_edge(self, a: int, b: int) -> None:
        sa = self._succ[a]
        if b not in sa:
            raise SimulationError(f"no edge {self._key[a]!r} -> {self._key[b]!r} to remove")
        sa.discard(b)
        self._pred[b].discard(a)
        self._version += 1
        self._nedges -= 1
        killed = self._kill_pool_edge(a, b)
        if self._journal is not None:
            self._journal.append((3, a, b, killed))

    def _kill_pool_edge(self, a: int, b: int) -> list[int]:
        """Mark the pool's live record of edge a -> b removed (a rare edit: a vectorized scan)."""
        import numpy as np
        gen = self._a_gen
        rec = np.frombuffer(self._e_rec, np.int64).reshape(-1, 4)
        hit = np.flatnonzero((rec[:, 0] == a) & (rec[:, 1] == b) & (rec[:, 2] == gen[a]) & (rec[:, 3] == gen[b])
                             & (np.frombuffer(self._e_alive, np.int8) != 0))
        killed = hit.tolist()
        for e in killed:
            self._e_alive[e] = 0
        return killed

    def set_duration(self, key, duration) -> None:
        self._set_duration(self._ix(key), duration)

    def _set_duration(self, i: int, duration) -> bool:
        if type(self._dur[i]) is tuple:
            raise SimulationError(
                f"task {self._key[i]!r} has parts on {self._res[i]!r}: set_duration changes a task "
                f"with one resource; remove this task and add it again with new part durations")
        d = _check_duration(self._key[i], duration)
        if d == self._dur[i]:
            return False
        if d < self._dmin:
            self._dmin = d
        if self._journal is not None:
            self._journal.append((4, i, self._dur[i]))
        self._dur[i] = d
        self._a_dur[i] = d
        self._version += 1
        return True

    def _rollback(self, journal: list) -> None:
        """Undo the edits `journal` recorded, newest first: the graph becomes what it was, every
        task under its old id.  Ids of undone additions are dead afterwards; the caller rebuilds
        the free list (`_free_dead`).

        Journal entries: ``(0, id)`` a task added, ``(1, id, key, ..., preds, succs)`` one
        removed, ``(2, a, b, pool index)`` an edge added, ``(3, a, b, pool indices killed)`` one
        removed, ``(4, id, old duration)``; batches (`planner.sim._bulk`) record ``(5, ids)`` for
        tasks and ``(6, first pool index, sources, targets)`` for edges, so a rollback costs C
        loops over the batch, not a Python step per element."""
        ids, key_, pred, succ = self._id, self._key, self._pred, self._succ
        alive, e_alive = self._a_alive, self._e_alive
        self._journal = None
        # Ids whose first edit in the batch added them die at the end; the others were there
        # before and come back.  Edges from or to the former need no set surgery on that side
        # (their sets are cleared), only on the side of the latter.
        old = bytearray(b"\x01") * len(key_)
        for entry in reversed(journal):
            op = entry[0]
            if op == 5:
                any(map(old.__setitem__, entry[1], repeat(0)))
            elif op == 0:
                old[entry[1]] = 0
            elif op == 1:
                old[entry[1]] = 1
        for entry in reversed(journal):
            op, i = entry[0], entry[1]
            if op == 6:
                self._undo_edges(i, entry[2], entry[3], old)
            elif op == 5:
                self._undo_tasks(i)
            elif op == 2:
                self._undo_edges(entry[3], (i,), (entry[2],), old)
            elif op == 0:
                self._undo_tasks((i,))
            elif op == 1:    # a task removed
                _, _, key, res, rix, dur, kind, nbytes, label, gen, ps, ss = entry
                key_[i], self._res[i], self._rix[i], self._dur[i] = key, res, rix, dur
                self._kind[i], self._nbytes[i], self._label[i] = kind, nbytes, label
                if type(rix) is tuple:
                    self._a_dur[i], self._a_rix[i] = max(dur), -1
                else:
                    self._a_dur[i], self._a_rix[i] = dur, rix
                self._a_gen[i] = gen
                self._set_parts(i, rix, dur)
                if len(key) <= KEY_FIELDS and (not key or min(key) > KEY_PAD):
                    self._a_key[i * KEY_FIELDS:(i + 1) * KEY_FIELDS] = array("q", key + _PADS[len(key)])
                alive[i] = 1
                ids[key] = i
                pred[i], succ[i] = ps, ss
                any(map(set.add, map(succ.__getitem__, ps), repeat(i)))
                any(map(set.add, map(pred.__getitem__, ss), repeat(i)))
                self._nedges += len(ps) + len(ss)
            elif op == 3:    # an edge removed
                b = entry[2]
                succ[i].add(b)
                pred[b].add(i)
                for e in entry[3]:
                    e_alive[e] = 1
                self._nedges += 1
            else:            # a duration changed
                self._dur[i] = self._a_dur[i] = entry[2]
        self._version += 1

    def _undo_tasks(self, I) -> None:
        """Undo added tasks `I` (ids; their edges to old tasks are gone already)."""
        any(map(self._id.__delitem__, map(self._key.__getitem__, I)))
        any(map(self._a_alive.__setitem__, I, repeat(0)))
        any(map(set.clear, map(self._pred.__getitem__, I)))
        any(map(set.clear, map(self._succ.__getitem__, I)))

    def _undo_edges(self, e0: int, A, B, old: bytearray) -> None:
        """Undo added edges ``A[n] -> B[n]`` (pool records from `e0` on): out of the sets of their
        ends that come back (`old`), and their pool records dead."""
        k = len(A)
        self._nedges -= k
        self._e_alive[e0:e0 + k] = array("b", bytes(k))
        succ, pred = self._succ, self._pred
        oa = list(map(old.__getitem__, A))
        ob = list(map(old.__getitem__, B))
        any(map(set.discard, map(succ.__getitem__, compress(A, oa)), compress(B, oa)))
        any(map(set.discard, map(pred.__getitem__, compress(B, ob)), compress(A, ob)))

    def _free_dead(self) -> None:
        """The free list becomes every dead id (after a rollback)."""
        import numpy as np
        alive = np.frombuffer(self._a_alive, np.int8) if len(self._a_alive) else np.zeros(0, np.int8)
        self._free = np.flatnonzero(alive == 0).tolist()[::-1]
        self._held.clear()

    def __repr__(self) -> str:
        return f"TaskGraph({len(self._id)} tasks, {len(self._rlist)} resources)"


def find_cycle(start: int, pred: list, unfinished, key: list) -> TaskGraphCycleError:
    """The error for a simulation that stalled: a cycle among unfinished tasks, by name.

    Every unfinished task waits for at least one unfinished predecessor (otherwise it would have
    run), so walking such predecessors from any unfinished task must revisit a task; the walk
    between the two visits is a cycle.
    """
    seen: dict[int, int] = {}
    path: list[int] = []
    x = start
    while x not in seen:
        seen[x] = len(path)
        path.append(x)
        x = next(p for p in pred[x] if unfinished(p))
    cycle = path[seen[x]:][::-1]  # walked backwards along edges
    first = min(range(len(cycle)), key=lambda n: key[cycle[n]])  # start at the smallest key
    cycle = cycle[first:] + cycle[:first]
    names = [repr(key[i]) for i in cycle] + [repr(key[cycle[0]])]
    if len(names) > 9:
        names = names[:4] + [f"... ({len(cycle)} tasks) ..."] + names[-4:]
    return TaskGraphCycleError(
        f"the task graph has a dependency cycle: {' -> '.join(names)}; no task on it can ever "
        f"start — remove one of these edges")
