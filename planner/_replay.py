"""Algorithm 1 (FlexFlow sec. 5.2) as a tuned loop over the `TaskGraph`'s flat per-id lists, and
the helpers delta simulation (`_delta`) shares with it.

A heap entry is ``(ready, key, id)``: keys are unique, so the id is never compared and the pop
order is exactly (ready, key) — the same in full and delta simulation.
"""

from __future__ import annotations

import math
from heapq import heapify, heappop, heappush, heapreplace
from itertools import islice

from ._taskstore import TaskGraph, find_cycle
from .errors import SimulationError


def check_resolution(g: TaskGraph, makespan: float) -> None:
    """Exactness needs ``start + duration > start`` in floating point for every task (see the
    simulator's docstring).  ``ulp(makespan) <= every duration`` guarantees it for every start up
    to the makespan."""
    if math.ulp(makespan) <= g._dmin:
        return
    dur = g._dur
    g._dmin = dmin = min((dur[i] for i in g._id.values()), default=math.inf)
    if math.ulp(makespan) > dmin:
        raise SimulationError(
            f"the shortest task lasts {dmin!r} s, below the floating-point resolution "
            f"{math.ulp(makespan)!r} s of the step time {makespan!r} s: adding it to a start time "
            f"would not move it, so FIFO order by ready time is not well defined; give every task "
            f"at least {math.ulp(makespan)!r} s")


def full_pass(g: TaskGraph):
    """Algorithm 1 on `g`: returns (ready, start, end, bind, order, last end per resource index).

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
    seq: list[int] = []
    emit = seq.append
    while heap:
        r, _, i = heap[0]
        R = rix[i]
        s = last[R]
        if s < r:
            s = r
        e = s + dur[i]
        last[R] = e
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
    return rdy, st, en, bind, seq, last


def checkpoints(seq, en, rix, nres: int, every: int):
    """Last end time per resource index before positions 0, every, 2*every, ... of `seq`."""
    v = [0.0] * nres
    pos, vecs = [], []
    for c in range(0, max(len(seq), 1), every):
        pos.append(c)
        vecs.append(v[:])
        for x in islice(seq, c, c + every):
            v[rix[x]] = en[x]
    return pos, vecs
