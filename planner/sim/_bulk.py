"""Batched edits of a `TaskGraph`: many tasks or edges per call, for the task-graph builder.

Building a task graph (FlexFlow sec. 5.1) adds some 10^5 tasks and several times as many edges,
and every MCMC proposal (sec. 6.2) rebuilds thousands of them; one call per task or edge spends
most of its time on call overhead, attribute lookups and per-call bookkeeping.  The functions here
do exactly what `TaskGraph._add` and `TaskGraph._add_edge` do, element by element and in the given
order — same ids, same validation and error messages, same edge-pool records, and journal
entries that undo the same edits (a whole batch in one entry) — with the graph's lists bound once
per batch and the counters (version, edge count, generations, smallest duration) written back
once.  A batch that meets an invalid element stops
there, with every element before it added, exactly as the same calls one by one would leave it.

Every function takes the `TaskGraph` ``g`` it edits and writes its columns directly.  This module
sits below the task store (`_taskstore` calls it for `add_tasks`/`add_edges`) and imports only the
layout rules the two share (`_layout`), so the two depend one way.
"""

from __future__ import annotations

import math
from array import array
from itertools import chain, compress, repeat
from operator import eq as _eq
from operator import is_
from operator import not_ as _not
from operator import index as _as_index

from ..errors import SimulationError, TaskGraphCycleError
from ._layout import _PADS, KEY_FIELDS, KEY_PAD, MAX_PARTS, _check_duration, _is_int

_INF = math.inf
_NP_TYPE = {"q": "int64", "d": "float64", "b": "int8"}  # numpy views of the graph's flat arrays
_TUPLE, _INT, _FLOAT, _SIX = {tuple}, {int}, {float}, {6}
_POSITIVE = (0.0).__lt__   # also false for NaN
_FINITE = _INF.__gt__


def add_tasks(g, tasks, ats=None, out: list | None = None) -> list[int]:
    """Add ``(key, resource, duration, kind, nbytes, label)`` tasks in order, as `TaskGraph._add`
    would one by one; ``ats[n]`` is the id task n must reuse (-1: any).  Returns (and appends to
    `out`) the id of every task added."""
    if out is None:
        out = []
    if type(tasks) is not list:
        tasks = list(tasks)
    if tasks and _add_tasks_checked(g, tasks, ats, out):
        return out
    return _add_tasks_loop(g, tasks, ats, out)


def _add_tasks_checked(g, tasks: list, ats, out: list) -> bool:
    """Add the whole batch column by column (C loops) when every task passes `TaskGraph._add`'s
    checks and fits the compiled pass; False, with nothing changed, when one does not (the loop
    then adds the batch, raising where `_add` would)."""
    m = len(tasks)
    try:
        if set(map(len, tasks)) != _SIX:
            return False
        K, R, D, KIND, NB, LAB = zip(*tasks)
        rtypes = set(map(type, R))
        multi = tuple in rtypes
        if multi:
            # Tasks with parts (`_taskstore._parts`), checked by column too: anything unusual
            # (a non-float duration, an int subclass) goes to the loop, which `_add` checks.
            P = [p for p in range(m) if type(R[p]) is tuple or type(D[p]) is tuple]
            RT = list(map(R.__getitem__, P))
            DT = list(map(D.__getitem__, P))
            plens = list(map(len, RT))
            if (set(map(type, RT)) != _TUPLE or set(map(type, DT)) != _TUPLE
                    or plens != list(map(len, DT)) or min(plens) < 2 or max(plens) > MAX_PARTS
                    or set(map(type, chain.from_iterable(DT))) != _FLOAT):
                return False
            if set(map(type, chain.from_iterable(RT))) != _INT:
                return False
            # Routes the graph has seen are known to be distinct links (`TaskGraph._route_rix`);
            # the others are checked once each.
            X = list(map(g._route_rix.get, R))
            fresh = dict.fromkeys(compress(R, map(is_, X, repeat(None)))) if None in X else {}
            if any(type(r) is tuple and len(frozenset(r)) != len(r) for r in fresh):
                return False
            total = sum(map(sum, DT))  # finite only if every part's duration is (else: the loop)
            pmin = min(map(min, DT))
            if not (total - total == 0.0 and pmin > 0.0):
                return False
            single = [p for p in range(m) if type(R[p]) is not tuple]
            rtypes = set(type(R[p]) for p in single)
            durs = list(D)
            for p in single:
                durs[p] = float(D[p])
            sdurs = list(map(durs.__getitem__, single))
        else:
            durs = sdurs = list(map(float, D))
        lens = list(map(len, K))
    except (TypeError, ValueError, SimulationError):
        return False
    ids = g._id
    if (set(map(type, K)) != _TUPLE or not rtypes <= _INT
            or not all(map(_is_int, chain.from_iterable(K)))
            or not (all(map(_POSITIVE, sdurs)) and all(map(_FINITE, sdurs)))
            or min(lens) == 0 or max(lens) > KEY_FIELDS):
        return False
    import numpy as np
    try:
        flat = np.frombuffer(array("q", chain.from_iterable(K)), np.int64)  # fields beyond 64 bits: the loop
    except OverflowError:
        return False
    if flat.min() <= KEY_PAD or len(set(K)) != m or not ids.keys().isdisjoint(K):
        return False
    # Every task is valid: nothing below can fail.  Ids as `_add` assigns them in order: the
    # given one, else the last free one, else the next beyond the end.
    keys = g._key
    n = len(keys)
    free = g._free
    neg = m if ats is None else ats.count(-1)
    take = min(len(free), neg)
    popped = free[-1:-take - 1:-1] if take else []
    if take:
        del free[-take:]
    if ats is None:
        I = popped + list(range(n, n + m - take))
        old, new = range(take), range(take, m)
    else:
        fill = chain(popped, range(n, n + neg - take))
        I = [at if at >= 0 else next(fill) for at in ats]
        if neg == take:
            old, new = range(m), range(m, m)
        else:
            old = [p for p in range(m) if I[p] < n]
            new = [p for p in range(m) if I[p] >= n]
    rindex, rlist = g._rindex, g._rlist
    if multi:
        # Dense resource indices of each route, and its row of part slots, memoized per graph
        # (`TaskGraph._route_rix`): a session adds transfers over the same routes again and again.
        if fresh:
            # Resources numbered in order of first use, as `_add` numbers them: the first use of
            # a resource is in the first route (or single resource) not seen before that has it.
            for r in dict.fromkeys(chain.from_iterable(r if type(r) is tuple else (r,) for r in fresh)):
                if r not in rindex:
                    rindex[r] = len(rlist)
                    rlist.append(r)
            cache, row = g._route_rix, g._route_row
            for r in fresh:
                if type(r) is int:
                    cache[r] = rindex[r]
                else:
                    cache[r] = dr = tuple(map(rindex.__getitem__, r))
                    row[r] = array("q", dr + _PAD_Q[len(dr)]).tobytes()
            X = list(map(cache.__getitem__, R))
        AX, AD = X[:], durs[:]
        any(map(AX.__setitem__, P, repeat(-1)))
        any(map(AD.__setitem__, P, map(max, DT)))
        d = min(min(sdurs, default=_INF), pmin)
        g._multipart = True
    else:
        for r in dict.fromkeys(R):
            if r not in rindex:
                rindex[r] = len(rlist)
                rlist.append(r)
        X = AX = list(map(rindex.__getitem__, R))
        AD = durs
        d = min(durs)
    if d < g._dmin:
        g._dmin = d
    G = range(g._gseq + 1, g._gseq + m + 1)
    g._gseq += m
    # The flat key rows: each key's fields, padded to KEY_FIELDS.
    rows = np.full((m, KEY_FIELDS), KEY_PAD, np.int64)
    if min(lens) == max(lens):
        rows[:, :lens[0]] = flat.reshape(m, lens[0])
    else:
        rows[np.arange(KEY_FIELDS) < np.array(lens)[:, None]] = flat
    cols = ((K, keys, None), (R, g._res, None), (X, g._rix, None), (AX, None, g._a_rix), (durs, g._dur, None),
            (AD, None, g._a_dur), (KIND, g._kind, None), (NB, g._nbytes, None), (LAB, g._label, None),
            (G, None, g._a_gen))
    if old:
        # Ids taken back (free or held): overwrite their slots, as `_add` does.
        whole = len(old) == m
        io = I if whole else list(map(I.__getitem__, old))
        at = np.array(io, np.int64)
        for col, lst, arr in cols:
            vals = col if whole else list(map(col.__getitem__, old))
            if lst is not None:
                any(map(lst.__setitem__, io, vals))
            if arr is not None:
                np.frombuffer(arr, _NP_TYPE[arr.typecode])[at] = vals
        np.frombuffer(g._a_alive, np.int8)[at] = 1
        np.frombuffer(g._a_np, np.int8)[at] = 0  # reused ids lose the parts of the task they held
        _put_keys(g, at, rows if whole else rows[old])
    if new:
        if len(new) < m:
            cols = tuple((list(map(col.__getitem__, new)), lst, arr) for col, lst, arr in cols)
            rows = rows[new]
        k = len(rows)
        for col, lst, arr in cols:
            if lst is not None:
                lst.extend(col)
            if arr is not None:
                arr.extend(col)
        g._a_alive.frombytes(b"\x01" * k)
        g._a_key.frombytes(rows.tobytes())
        g._pred.extend([set() for _ in range(k)])
        g._succ.extend([set() for _ in range(k)])
        if multi and len(P) == k == m:
            # A batch of new tasks that all have parts (fresh transfers): their part slots as
            # they are appended, instead of empty slots written over.
            g._a_np.frombytes(bytes(plens))
            g._a_prix.frombytes(b"".join(map(g._route_row.__getitem__, RT)))
            g._a_pdur.frombytes(_part_durations(DT, plens).tobytes())
            multi = False  # done
        else:
            g._grow_parts(k)
    if multi:
        _put_parts(g, list(map(I.__getitem__, P)), RT, DT, plens)
    ids.update(zip(K, I))
    if g._journal is not None:
        g._journal.append((5, I))  # one entry per batch (`TaskGraph._rollback`)
    g._version += m
    out.extend(I)
    return True


_PAD_Q = tuple((0,) * (MAX_PARTS - n) for n in range(MAX_PARTS + 1))


def _part_durations(dur: list, lens: list):
    """Rows of `MAX_PARTS` part durations (zero-padded) of duration tuples `dur` of lengths
    `lens`, as a numpy array."""
    import numpy as np
    flat = np.frombuffer(array("d", chain.from_iterable(dur)), np.float64)
    rows = np.zeros((len(dur), MAX_PARTS))
    rows[np.arange(MAX_PARTS) < np.array(lens)[:, None]] = flat  # row by row, as the parts come
    return rows


def _put_parts(g, io: list, routes: list, dur: list, lens: list) -> None:
    """Write the part slots of ids `io` (tasks with parts: resource tuples `routes`, whose rows
    `TaskGraph._route_row` holds, duration tuples `dur` of lengths `lens`), a whole batch with
    numpy."""
    import numpy as np
    k = len(io)
    a_np = np.frombuffer(g._a_np, np.int8)
    a_np[io] = lens
    prix = np.frombuffer(g._a_prix, np.int64).reshape(-1, MAX_PARTS)
    prix[io] = np.frombuffer(b"".join(map(g._route_row.__getitem__, routes)), np.int64).reshape(k, MAX_PARTS)
    pdur = np.frombuffer(g._a_pdur, np.float64).reshape(-1, MAX_PARTS)
    pdur[io] = _part_durations(dur, lens)
    del a_np, prix, pdur  # release the arrays' buffers: they may grow again


def _put_keys(g, io: list, rows) -> None:
    """Overwrite the flat key rows of ids `io` with `rows` (an int64 array of KEY_FIELDS columns)."""
    import numpy as np
    flat = np.frombuffer(g._a_key, np.int64).reshape(-1, KEY_FIELDS)
    flat[io] = rows
    del flat  # releases the array's buffer: it may grow again


def _add_tasks_loop(g, tasks, ats, out: list) -> list[int]:
    """`add_tasks` one task at a time: `TaskGraph._add`'s steps with the graph's lists bound once."""
    if any(type(t[1]) is tuple or type(t[2]) is tuple for t in tasks if type(t) is tuple and len(t) == 6):
        # Tasks with parts: `_add` itself, task by task (this path only runs for batches with an
        # invalid task, which raises where `_add` does).
        add = g._add
        for (key, resource, duration, kind, nbytes, label), at in zip(tasks, repeat(-1) if ats is None else ats):
            out.append(add(key, resource, duration, kind, nbytes, label, at))
        return out
    ids, keys, res, rixs, durs = g._id, g._key, g._res, g._rix, g._dur
    kinds, nbs, labels, preds, succs = g._kind, g._nbytes, g._label, g._pred, g._succ
    a_dur, a_rix, a_key, a_alive, a_gen = g._a_dur, g._a_rix, g._a_key, g._a_alive, g._a_gen
    a_np = g._a_np
    free, rindex, rlist, journal = g._free, g._rindex, g._rlist, g._journal
    emit = out.append
    dmin, gseq, n0 = g._dmin, g._gseq, len(out)
    # Tasks appended at the end of the id range go to the flat arrays at once, when the batch ends.
    t_dur: list[float] = []
    t_rix: list[int] = []
    t_gen: list[int] = []
    t_key: list = []
    try:
        for (key, resource, duration, kind, nbytes, label), at in zip(tasks, repeat(-1) if ats is None else ats):
            if type(key) is not tuple or not all(map(_is_int, key)):
                raise SimulationError(
                    f"task key {key!r} must be a tuple of ints: keys order tasks on a tie, so they must "
                    f"compare with each other")
            if key in ids:
                raise SimulationError(f"task {key!r} is already in the task graph; remove it first to replace it")
            d = float(duration)
            if not 0.0 < d < _INF:
                _check_duration(key, duration)
            if type(resource) is int:
                r = resource
            else:
                try:
                    r = _as_index(resource)
                except TypeError:
                    raise SimulationError(f"task {key!r}: resource {resource!r} must be an int") from None
            rix = rindex.get(r)
            if rix is None:
                rix = rindex[r] = len(rlist)
                rlist.append(r)
            if d < dmin:
                dmin = d
            lk = len(key)
            if lk <= KEY_FIELDS and (not key or min(key) > KEY_PAD):
                row = key + _PADS[lk]
            else:
                row = _PADS[0]
                g._compilable = False
            gseq += 1
            if at >= 0 or free:
                i = at if at >= 0 else free.pop()
                keys[i] = key
                res[i] = r
                rixs[i] = rix
                durs[i] = d
                kinds[i] = kind
                nbs[i] = nbytes
                labels[i] = label
                a_dur[i] = d
                a_rix[i] = rix
                a_np[i] = 0
                a_alive[i] = 1
                a_gen[i] = gseq
                try:
                    a_key[i * KEY_FIELDS:(i + 1) * KEY_FIELDS] = array("q", row)
                except OverflowError:
                    g._compilable = False
            else:
                i = len(keys)
                keys.append(key)
                res.append(r)
                rixs.append(rix)
                durs.append(d)
                kinds.append(kind)
                nbs.append(nbytes)
                labels.append(label)
                preds.append(set())
                succs.append(set())
                t_dur.append(d)
                t_rix.append(rix)
                t_gen.append(gseq)
                t_key.append(row)
            ids[key] = i
            if journal is not None:
                journal.append((0, i))
            emit(i)
    finally:
        g._dmin = dmin
        g._gseq = gseq
        g._version += len(out) - n0
        if t_dur:
            a_dur.extend(t_dur)
            a_rix.extend(t_rix)
            a_alive.frombytes(b"\x01" * len(t_dur))
            a_gen.extend(t_gen)
            g._grow_parts(len(t_dur))
            _extend_keys(g, a_key, t_key)
    return out


def _extend_keys(g, a_key: array, rows: list) -> None:
    """Append padded key rows; a row with a field beyond 64 bits makes the graph use the Python
    pass, exactly as `TaskGraph._add` handles it."""
    n = len(a_key)
    try:
        a_key.extend(chain.from_iterable(rows))
    except OverflowError:
        del a_key[n:]
        for row in rows:
            try:
                a_key.extend(row)
            except OverflowError:
                a_key.extend(_PADS[0])
                g._compilable = False


def resolve(g, edges) -> tuple[list, list, tuple | None]:
    """Ids of the ends of edges given by keys, up to the first unknown key: (sources,
    destinations, that edge or None)."""
    ids = g._id
    if type(edges) is not list:
        edges = list(edges)
    try:
        S, D = zip(*edges)
        return list(map(ids.__getitem__, S)), list(map(ids.__getitem__, D)), None
    except (KeyError, TypeError, ValueError):
        pass
    A: list[int] = []
    B: list[int] = []
    for src, dst in edges:
        try:
            a, b = ids[src], ids[dst]
        except (KeyError, TypeError):
            return A, B, (src, dst)
        A.append(a)
        B.append(b)
    return A, B, None


def unknown(g, edge: tuple) -> None:
    """Raise the error `TaskGraph.add_edge` raises for an edge with an unknown key."""
    g._ix(edge[0])
    g._ix(edge[1])


def add_edges(g, A: list, B: list, out: list | None = None) -> list:
    """Add edges ``A[n] -> B[n]`` (ids) in order, as `TaskGraph._add_edge` would one by one.
    Returns (and appends to `out`) the positions of the edges that were new."""
    if out is None:
        out = []
    k = len(A)
    if not k:
        return out
    if any(map(_eq, A, B)):
        return _add_edges_loop(g, A, B, out)  # raises at the loop, after the edges before it
    succ = g._succ
    if len(set(zip(A, B))) == k:
        if not any(map(set.__contains__, map(succ.__getitem__, A), B)):
            _add_new_edges(g, A, B)  # the common case: all new
            out.extend(range(k))
            return out
        P = list(compress(range(k), map(_not, map(set.__contains__, map(succ.__getitem__, A), B))))
    else:
        # Repeated edges: the first of each, if the graph lacks it (pair -> first position).
        first = dict(zip(zip(reversed(A), reversed(B)), range(k - 1, -1, -1)))
        P = sorted(compress(first.values(), map(_not, map(set.__contains__, map(succ.__getitem__, map(
            A.__getitem__, first.values())), map(B.__getitem__, first.values())))))
    if P:
        _add_new_edges(g, list(map(A.__getitem__, P)), list(map(B.__getitem__, P)))
        out.extend(P)
    return out


def _add_new_edges(g, A: list, B: list) -> None:
    """Add edges none of which the graph has, none repeated and none a loop, column by column
    (C loops), in order."""
    k = len(A)
    succ, pred = g._succ, g._pred
    any(map(set.add, map(succ.__getitem__, A), B))
    any(map(set.add, map(pred.__getitem__, B), A))
    e0 = len(g._e_alive)
    if g._journal is not None:
        g._journal.append((6, e0, A, B))  # one entry per batch (`TaskGraph._rollback`)
    gen = g._a_gen
    g._e_rec.extend(chain.from_iterable(zip(A, B, map(gen.__getitem__, A), map(gen.__getitem__, B))))
    g._e_alive.frombytes(b"\x01" * k)
    g._version += k
    g._nedges += k


def _add_edges_loop(g, A: list, B: list, out: list) -> list:
    """`add_edges` one edge at a time, for a batch with a loop (which raises where it is)."""
    succ = g._succ
    emit = out.append
    NA: list[int] = []
    NB: list[int] = []
    seen: set = set()
    try:
        for n, a, b in zip(range(len(A)), A, B):
            if a == b:
                raise TaskGraphCycleError(f"edge {g._key[a]!r} -> itself would be a cycle of one task")
            if b in succ[a] or (a, b) in seen:
                continue
            seen.add((a, b))
            NA.append(a)
            NB.append(b)
            emit(n)
    finally:
        if NA:
            _add_new_edges(g, NA, NB)
    return out
