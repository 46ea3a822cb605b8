"""Algorithm 1 (FlexFlow sec. 5.2) compiled with Numba: the same loop as `_replay.full_pass`,
over flat arrays the `TaskGraph` keeps next to its Python lists.

Why compiled.  A full simulation of a 64-GPU task graph (10^5 tasks) costs about 2 µs per task in
CPython, and a random one-op change moves most of a training step (see `planner.simulator`), so
exact re-timing is close to a full pass whatever the algorithm.  Compiled, the pass costs a few
tens of nanoseconds per task: re-timing stops being what a search or a delta simulation pays
for, and the task-graph edits (proportional to the change) are what is left.

Exactness.  The loop performs the same floating-point operations as the Python reference in the
same order per task (``start = max(last end on the resource, ready)``, ``end = start +
duration``, ``ready = max over inputs``), and pops tasks in the same ``(ready, key)`` order: keys
are compared field by field as Python compares tuples (a missing field sorts first, see
`_taskstore.KEY_PAD`).  The timeline is the unique fixed point of `planner.simulator`, so both
implementations return bit-identical times; the tests compare them on random graphs.

Edges live in an append-only pool (source, target, both ids' generations at the time); an edge
is live while both ids are live with those generations and it was not removed.  Generations are
never reused, so a task revived by a rollback gets its old edges back and no stale ones.  Each pass builds
the successor lists (CSR) of the live edges first, in linear time.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _before(a: int, b: int, rdy, keys) -> bool:
    """(ready, key) of task a < that of task b."""
    ra = rdy[a]
    rb = rdy[b]
    if ra != rb:
        return ra < rb
    for k in range(keys.shape[1]):
        x = keys[a, k]
        y = keys[b, k]
        if x != y:
            return x < y
    return False


@njit(cache=True)
def _sift_down(heap, n: int, pos: int, rdy, keys) -> None:
    item = heap[pos]
    while True:
        c = 2 * pos + 1
        if c >= n:
            break
        if c + 1 < n and _before(heap[c + 1], heap[c], rdy, keys):
            c += 1
        if _before(heap[c], item, rdy, keys):
            heap[pos] = heap[c]
            pos = c
        else:
            break
    heap[pos] = item


@njit(cache=True)
def _sift_up(heap, pos: int, rdy, keys) -> None:
    item = heap[pos]
    while pos > 0:
        parent = (pos - 1) >> 1
        if _before(item, heap[parent], rdy, keys):
            heap[pos] = heap[parent]
            pos = parent
        else:
            break
    heap[pos] = item


@njit(cache=True)
def live_edges(alive, gen, rec, ealive):
    """Mask of the pool's live edges (`rec` rows: source, target, their generations)."""
    m = rec.shape[0]
    ok = np.zeros(m, np.bool_)
    for e in range(m):
        a = rec[e, 0]
        b = rec[e, 1]
        ok[e] = ealive[e] != 0 and alive[a] != 0 and alive[b] != 0 and rec[e, 2] == gen[a] and rec[e, 3] == gen[b]
    return ok


@njit(cache=True)
def full_pass_arrays(alive, gen, dur, rix, nres: int, keys, rec, ealive, every: int):
    """Algorithm 1 over the arrays.  Returns (ready, start, end, bind, order, count, last end per
    resource index, remaining input counts, checkpoint vectors); ``count`` < live tasks means a
    cycle (the tasks with a remaining count > 0 never ran).  Checkpoint row c holds every
    resource's last end before position ``c * every`` of the order."""
    cap = alive.shape[0]
    m = rec.shape[0]
    # Successor lists of the live edges (CSR) and input counts.
    off = np.zeros(cap + 1, np.int64)
    cnt = np.zeros(cap, np.int64)
    ok = live_edges(alive, gen, rec, ealive)
    for e in range(m):
        if ok[e]:
            off[rec[e, 0] + 1] += 1
            cnt[rec[e, 1]] += 1
    for i in range(cap):
        off[i + 1] += off[i]
    adj = np.empty(off[cap], np.int64)
    fill = off[:cap].copy()
    for e in range(m):
        if ok[e]:
            a = rec[e, 0]
            adj[fill[a]] = rec[e, 1]
            fill[a] += 1

    rdy = np.zeros(cap, np.float64)
    st = np.zeros(cap, np.float64)
    en = np.zeros(cap, np.float64)
    bind = np.full(cap, -1, np.int64)
    heap = np.empty(cap, np.int64)
    n = 0
    live = 0
    for i in range(cap):
        if alive[i] != 0:
            live += 1
            if cnt[i] == 0:
                heap[n] = i
                n += 1
    for p in range((n >> 1) - 1, -1, -1):
        _sift_down(heap, n, p, rdy, keys)
    last = np.zeros(nres, np.float64)
    seq = np.empty(live, np.int64)
    nck = (live + every - 1) // every if live > 0 else 1
    ck = np.zeros((nck, nres), np.float64)
    count = 0
    while n > 0:
        i = heap[0]
        if count % every == 0:
            ck[count // every, :] = last
        r = rdy[i]
        R = rix[i]
        s = last[R]
        if s < r:
            s = r
        e = s + dur[i]
        last[R] = e
        st[i] = s
        en[i] = e
        seq[count] = i
        count += 1
        top = True  # heap[0] is still i: the first ready successor replaces it
        for q in range(off[i], off[i + 1]):
            j = adj[q]
            if rdy[j] < e:
                rdy[j] = e
            c = cnt[j] - 1
            cnt[j] = c
            if c == 0:
                bind[j] = i
                if top:
                    heap[0] = j
                    _sift_down(heap, n, 0, rdy, keys)
                    top = False
                else:
                    heap[n] = j
                    n += 1
                    _sift_up(heap, n - 1, rdy, keys)
        if top:
            n -= 1
            if n > 0:
                heap[0] = heap[n]
                _sift_down(heap, n, 0, rdy, keys)
    return rdy, st, en, bind, seq[:count], count, last, cnt, ck
