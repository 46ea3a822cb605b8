"""Algorithm 1 (FlexFlow sec. 5.2) as a tuned loop over the `TaskGraph`'s flat per-id lists, and
the helpers delta simulation (`_delta`) shares with it.

A heap entry is ``(ready, key, id)``: keys are unique, so the id is never compared and the pop
order is exactly (ready, key) — the same in full and delta simulation.
"""

from __future__ import annotations

import gc
import math
import os
from array import array
from heapq import heapify, heappop, heappush, heapreplace
from itertools import islice

from ..errors import SimulationError
from ._layout import KEY_FIELDS, MAX_PARTS
from ._taskstore import TaskGraph, find_cycle

try:  # the compiled pass; without Numba every simulation uses the Python loop below
    import numpy as _np

    from . import _fastpass
except ImportError:  # pragma: no cover - numba is a declared dependency
    _fastpass = None

#: Set AUTOPAR_PURE_PYTHON=1 to time every task graph with the Python loop (the reference).
PURE_PYTHON = os.environ.get("AUTOPAR_PURE_PYTHON", "") not in ("", "0")


def check_resolution(g: TaskGraph, makespan: float) -> None:
    """Exactness needs ``start + duration > start`` in floating point for every task (see the
    simulator's docstring).  ``ulp(makespan) <= every duration`` guarantees it for every start up
    to the makespan."""
    if math.ulp(makespan) <= g._dmin:
        return
    dur = g._dur
    g._dmin = dmin = min((min(d) if type(d) is tuple else d for d in map(dur.__getitem__, g._id.values())),
                         default=math.inf)
    if math.ulp(makespan) > dmin:
        raise SimulationError(
            f"the shortest task lasts {dmin!r} s, below the floating-point resolution "
            f"{math.ulp(makespan)!r} s of the step time {makespan!r} s: adding it to a start time "
            f"would not move it, so FIFO order by ready time is not well defined; give every task "
            f"at least {math.ulp(makespan)!r} s")


def compiled(g: TaskGraph) -> bool:
    """Will `timed_pass` use the compiled loop for `g`?"""
    return not PURE_PYTHON and _fastpass is not None and g._compilable


def timed_pass(g: TaskGraph, every: int = 0, python: bool = False, compact: bool = True):
    """Algorithm 1 on `g`, compiled when possible: (ready, start, end, bind, order, last end per
    resource index, checkpoint positions, checkpoint vectors, part ends), the checkpoints every
    `every` tasks of the order (only position 0 when `every` is 0); the end of part h of task i
    is at ``i * MAX_PARTS + h`` of the part ends.  The compiled pass drops dead records
from the edge pool first when they are many, unless `compact` is false (a `DeltaSimulator`
compacts between batches: compaction renumbers the pool its journal refers to).

    The per-id times and the order are flat `array.array`s ('d' and 'q'), the rest lists.  Flat
    arrays because a delta simulator keeps them between passes: the compiled pass's results copy
    into them at memory speed (converting 10^5 floats to a list costs milliseconds), and the
    cyclic garbage collector, which traverses every element of a young list, ignores them."""
    if not python and compiled(g):
        if compact and compaction_due(g):
            compact_edges(g)
        return _compiled_pass(g, every)
    rdy, st, en, bind, seq, last, pen = full_pass(g)
    if every:
        pos, vecs = checkpoints(seq, en, g._rix, len(g._rlist), every, pen)
    else:
        pos, vecs = [0], [[0.0] * len(g._rlist)]
    return (array("d", rdy), array("d", st), array("d", en), array("q", bind), array("q", seq), last, pos, vecs,
            pen)


def _flat(typecode: str, a) -> array:
    """A numpy array's contents as an `array.array` (one memory copy)."""
    out = array(typecode)
    if a.size:
        out.frombytes(memoryview(_np.ascontiguousarray(a)).cast("B"))
    return out


def _run(fn, *args):
    """``fn(*args)`` for a compiled pass.

    Numba compiles a pass (or loads it from its cache) the first time it meets a new combination
    of argument types, and that leaves reference cycles behind which hold the arguments: views of
    the graph's flat arrays.  A search runs with the cyclic collector paused and what it holds
    frozen (`gc_regime`), so nothing would free those views, and the graph's next append to an
    array they view would raise ``BufferError: cannot resize an array that is exporting buffers``
    (the first `autopar plan` on a machine with an empty Numba cache did).  So after a call that
    compiled, the cycles are collected at once; every later call is just the call."""
    known = len(fn.signatures)
    out = fn(*args)
    if len(fn.signatures) != known:
        gc.collect()
    return out


def _view(a: array, dtype):
    return _np.frombuffer(a, dtype) if len(a) else _np.zeros(0, dtype)


def _parts_views(g: TaskGraph, cap: int):
    """The graph's part slots as the compiled passes read them: (parts per id, resource index
    per slot, duration per slot), the slots as ``cap x MAX_PARTS`` matrices."""
    return (_view(g._a_np, _np.int8), _view(g._a_prix, _np.int64).reshape(cap, MAX_PARTS),
            _view(g._a_pdur, _np.float64).reshape(cap, MAX_PARTS))


def resume_pass(g: TaskGraph, every: int, oseq: array, osim: bytearray, mod: bytearray,
                rdy: array, st: array, en: array, bind: array, ordy: array, oen: array,
                ofinal: list, quiet: int, pen: array, open_: array):
    """Delta simulation's re-timing from the cut on, compiled (`_fastpass.resume_pass_arrays`,
    which says what the arguments are): `rdy`, `st`, `en`, `bind`, `pen` — copies of the old
    timeline's (`ordy`, `oen`, `open_`: part ends), sized to the graph's ids — are re-timed in
    place.  Returns (order, cut, stop,
    every resource's last end at the stop in the new and in the old timeline, checkpoint
    positions between the cut and the stop, their vectors), or None when the graph was edited in
    ways `mod` does not report (the caller then simulates in full)."""
    nres = len(g._rlist)
    cap = len(g._key)
    i64, f64 = _np.int64, _np.float64
    seq, count, cut, stop, last, olast, cnt, ck = _run(
        _fastpass.resume_pass_arrays,
        _view(g._a_alive, _np.int8), _view(g._a_gen, i64), _view(g._a_dur, f64), _view(g._a_rix, i64),
        nres, _view(g._a_key, i64).reshape(cap, KEY_FIELDS), _view(g._e_rec, i64).reshape(-1, 4),
        _view(g._e_alive, _np.int8), every, _view(oseq, i64), _np.frombuffer(osim, _np.uint8),
        _np.frombuffer(mod, _np.uint8), _view(rdy, f64), _view(st, f64), _view(en, f64), _view(bind, i64),
        _view(ordy, f64), _view(oen, f64), _np.array(ofinal + [0.0] * (nres - len(ofinal)), f64), quiet,
        *_parts_views(g, cap), _view(pen, f64).reshape(cap, MAX_PARTS), _view(open_, f64).reshape(cap, MAX_PARTS))
    if count < 0:
        return None
    if count != len(g._id):
        rem = cnt.tolist()
        start = next(i for i in g._id.values() if rem[i] > 0)
        raise find_cycle(start, g._pred, lambda p: rem[p] > 0, g._key)
    end = count - (len(oseq) - stop)  # the re-timed stretch ends here
    c0 = cut // every + 1  # rows after the cut (those up to it are the old ones)
    pos = list(range(c0 * every, end, every))
    return _flat("q", seq), cut, stop, last.tolist(), olast.tolist(), pos, list(ck[c0:c0 + len(pos)].copy())


def compaction_due(g: TaskGraph) -> bool:
    """Does the edge pool hold so many dead records that a pass should drop them first?"""
    return len(g._e_alive) > 2 * g._nedges + 65536


def _compiled_pass(g: TaskGraph, every: int):
    nres = len(g._rlist)
    cap = len(g._key)
    i64 = _np.int64
    keys = _view(g._a_key, i64).reshape(cap, KEY_FIELDS)
    step = every if every > 0 else max(cap, 1)
    rdy, st, en, bind, seq, count, last, cnt, ck, pen = _run(
        _fastpass.full_pass_arrays,
        _view(g._a_alive, _np.int8), _view(g._a_gen, i64), _view(g._a_dur, _np.float64),
        _view(g._a_rix, i64), nres, keys, _view(g._e_rec, i64).reshape(-1, 4),
        _view(g._e_alive, _np.int8), step, *_parts_views(g, cap))
    if count != len(g._id):
        rem = cnt.tolist()
        start = next(i for i in g._id.values() if rem[i] > 0)
        raise find_cycle(start, g._pred, lambda p: rem[p] > 0, g._key)
    last = last.tolist()
    check_resolution(g, max(last, default=0.0))
    pos = list(range(0, max(count, 1), step)) if every else [0]
    vecs = list(ck) if every else [[0.0] * nres]
    return (_flat("d", rdy), _flat("d", st), _flat("d", en), _flat("q", bind), _flat("q", seq), last,
            pos, vecs, _flat("d", pen))


def compact_edges(g: TaskGraph) -> None:
    """Drop dead records from the edge pool (it only grows between compactions)."""
    rec = _view(g._e_rec, _np.int64).reshape(-1, 4)
    ok = _run(_fastpass.live_edges, _view(g._a_alive, _np.int8), _view(g._a_gen, _np.int64), rec,
              _view(g._e_alive, _np.int8))
    fresh, alive = array("q"), array("b")
    fresh.frombytes(_np.ascontiguousarray(rec[ok]).tobytes())
    alive.frombytes(_np.ones(int(ok.sum()), _np.int8).tobytes())
    g._e_rec, g._e_alive = fresh, alive
    g._compactions += 1


def full_pass(g: TaskGraph):
    """Algorithm 1 on `g` in Python (the reference the compiled pass is tested against):
    returns (ready, start, end, bind, order, last end per resource index, part ends).

    ``bind[t]`` is the predecessor whose completion made `t` ready — the last of its inputs to
    finish, in pop order (-1 without predecessors); delta simulation watches it.
    """
    key, pred, succ, dur, rix = g._key, g._pred, g._succ, g._dur, g._rix
    cap = len(key)
    cnt = [0] * cap
    rdy = [0.0] * cap
    st = [0.0] * cap
    en = [0.0] * cap
    bind = [-1] * cap
    heap = []
    for i in g._id.values():
        c = len(pred[i])
        if c:
            cnt[i] = c
        else:
            heap.append((0.0, key[i], i))
    heapify(heap)
    last = [0.0] * len(g._rlist)
    pen = array("d", bytes(8 * MAX_PARTS * cap))
    seq: list[int] = []
    emit = seq.append
    while heap:
        r, _, i = heap[0]
        R = rix[i]
        if type(R) is int:
            s = last[R]
            if s < r:
                s = r
            e = s + dur[i]
            last[R] = e
        else:
            s, e = place_parts(i, r, R, dur[i], last, pen)
        st[i] = s
        en[i] = e
        emit(i)
        top = True  # the popped entry is still heap[0]: the first ready successor replaces it
        for j in succ[i]:
            if rdy[j] < e:
                rdy[j] = e
            c = cnt[j] - 1
            cnt[j] = c
            if not c:
                bind[j] = i
                if top:
                    heapreplace(heap, (rdy[j], key[j], j))
                    top = False
                else:
                    heappush(heap, (rdy[j], key[j], j))
        if top:
            heappop(heap)
    if len(seq) != len(g._id):
        start = next(i for i in g._id.values() if cnt[i] > 0)
        raise find_cycle(start, pred, lambda p: cnt[p] > 0, key)
    check_resolution(g, max(last, default=0.0))
    return rdy, st, en, bind, seq, last, pen


def place_parts(i: int, r: float, R: tuple, ds: tuple, last: list, pen: array) -> tuple[float, float]:
    """Run the parts of task `i`, ready at `r`, each on its resource after the last task there;
    their ends go to `pen`.  Returns the task's (start, end): its first part's start, its last
    part's end."""
    s = e = None
    b = i * MAX_PARTS
    for h, (Rh, d) in enumerate(zip(R, ds)):
        a = last[Rh]
        if a < r:
            a = r
        z = a + d
        last[Rh] = z
        pen[b + h] = z
        if s is None or a < s:
            s = a
        if e is None or z > e:
            e = z
    return s, e


def row(v, n: int) -> list[float]:
    """A checkpoint vector — a list, or a numpy row as the compiled passes leave them (converting
    every row to a list costs more than the rows a re-timing reads) — as a list of `n` floats;
    resources added since it was taken are idle (0)."""
    out = v[:] if type(v) is list else v.tolist()
    out += [0.0] * (n - len(out))
    return out


def checkpoints(seq, en, rix, nres: int, every: int, pen):
    """Last end time per resource index before positions 0, every, 2*every, ... of `seq`."""
    v = [0.0] * nres
    pos, vecs = [], []
    for c in range(0, max(len(seq), 1), every):
        pos.append(c)
        vecs.append(v[:])
        for x in islice(seq, c, c + every):
            R = rix[x]
            if type(R) is int:
                v[R] = en[x]
            else:
                for h, Rh in enumerate(R):
                    v[Rh] = pen[x * MAX_PARTS + h]
    return pos, vecs
