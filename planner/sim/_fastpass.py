"""Algorithm 1 (FlexFlow sec. 5.2) compiled with Numba: the same loop as `_replay.full_pass`,
over flat arrays the `TaskGraph` keeps next to its Python lists.

Why compiled.  A full simulation of a 64-GPU task graph (10^5 tasks) costs about 2 µs per task in
CPython, and a random one-op change moves most of a training step (see `planner.sim.simulator`), so
exact re-timing is close to a full pass whatever the algorithm.  Compiled, the pass costs a few
tens of nanoseconds per task: re-timing stops being what a search or a delta simulation pays
for, and the task-graph edits (proportional to the change) are what is left.

Exactness.  The loop performs the same floating-point operations as the Python reference in the
same order per task (``start = max(last end on the resource, ready)``, ``end = start +
duration``, ``ready = max over inputs``), and pops tasks in the same ``(ready, key)`` order: keys
are compared field by field as Python compares tuples (a missing field sorts first, see
`_taskstore.KEY_PAD`).  The timeline is the unique fixed point of `planner.sim.simulator`, so both
implementations return bit-identical times; the tests compare them on random graphs.

Ties.  A zoo task graph of 10^5 tasks has only ~10^3 distinct ready times, so a heap ordered by
(ready, key) spends most of its comparisons on keys.  Ours orders ready times only, takes every
task with the smallest ready time out at once and sorts that batch by key: the same order,
because a task that becomes ready while the batch runs is ready strictly later than the batch
(`planner.sim.simulator`).

Delta simulation (sec. 5.3) re-times from a cut with the same loop (`resume_pass_arrays`): the
old timeline before the cut is kept, and the pass starts in the state Algorithm 1 is in there.

Edges live in an append-only pool (source, target, both ids' generations at the time); an edge
is live while both ids are live with those generations and it was not removed.  Generations are
never reused, so a task revived by a rollback gets its old edges back and no stale ones.  Each pass builds
the successor lists (CSR) of the live edges first, in linear time.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _key_less(a: int, b: int, keys) -> bool:
    """key of task a < key of task b (fields compared as Python compares tuples)."""
    for k in range(keys.shape[1]):
        x = keys[a, k]
        y = keys[b, k]
        if x != y:
            return x < y
    return False


# The heap orders ready times only: every task with the smallest ready time is taken out at once
# and the batch is sorted by key.  That is Algorithm 1's (ready, key) order, because a task that
# becomes ready while the batch runs is ready strictly later (module docstring), and it spares the
# heap the key comparisons of the many ties (a zoo task graph of 10^5 tasks has ~10^3 distinct
# ready times).
@njit(cache=True)
def _sift_down(hr, hi, n: int, pos: int) -> None:
    r = hr[pos]
    i = hi[pos]
    while True:
        c = 2 * pos + 1
        if c >= n:
            break
        if c + 1 < n and hr[c + 1] < hr[c]:
            c += 1
        if hr[c] < r:
            hr[pos] = hr[c]
            hi[pos] = hi[c]
            pos = c
        else:
            break
    hr[pos] = r
    hi[pos] = i


@njit(cache=True)
def _sift_up(hr, hi, pos: int) -> None:
    r = hr[pos]
    i = hi[pos]
    while pos > 0:
        parent = (pos - 1) >> 1
        if r < hr[parent]:
            hr[pos] = hr[parent]
            hi[pos] = hi[parent]
            pos = parent
        else:
            break
    hr[pos] = r
    hi[pos] = i


@njit(cache=True)
def _sort_by_key(ids, n: int, tmp, keys) -> None:
    """Sort ids[:n] by key: insertion sort for short runs, merged bottom-up."""
    run = 16
    for lo in range(0, n, run):
        hi = min(lo + run, n)
        for i in range(lo + 1, hi):
            x = ids[i]
            j = i - 1
            while j >= lo and _key_less(x, ids[j], keys):
                ids[j + 1] = ids[j]
                j -= 1
            ids[j + 1] = x
    width = run
    src = ids
    dst = tmp
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            a = lo
            b = mid
            for k in range(lo, hi):
                if a < mid and (b >= hi or not _key_less(src[b], src[a], keys)):
                    dst[k] = src[a]
                    a += 1
                else:
                    dst[k] = src[b]
                    b += 1
        src, dst = dst, src
        width *= 2
    if src is not ids:
        ids[:n] = src[:n]


@njit(cache=True)
def _pop_ready(hr, hi, n: int, batch, tmp, keys):
    """Pop every task of the heap ready at its earliest time into `batch`, sorted by key (the
    order Algorithm 1 runs ties in); returns (how many, the heap's new size)."""
    r = hr[0]
    b = 0
    while n > 0 and hr[0] == r:
        batch[b] = hi[0]
        b += 1
        n -= 1
        if n > 0:
            hr[0] = hr[n]
            hi[0] = hi[n]
            _sift_down(hr, hi, n, 0)
    if b > 1:
        _sort_by_key(batch, b, tmp, keys)
    return b, n


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
def _successors(alive, gen, rec, ealive):
    """Successor lists of the live edges (CSR: offsets, targets) and the live edges' mask."""
    cap = alive.shape[0]
    m = rec.shape[0]
    off = np.zeros(cap + 1, np.int64)
    ok = live_edges(alive, gen, rec, ealive)
    for e in range(m):
        if ok[e]:
            off[rec[e, 0] + 1] += 1
    for i in range(cap):
        off[i + 1] += off[i]
    adj = np.empty(off[cap], np.int64)
    fill = off[:cap].copy()
    for e in range(m):
        if ok[e]:
            a = rec[e, 0]
            adj[fill[a]] = rec[e, 1]
            fill[a] += 1
    return off, adj, ok


@njit(cache=True, inline="always")
def _place(t: int, r: float, count: int, every: int, ck, last, rix, dur, rdy, st, en, seq,
           npt, prix, pdur, pen) -> float:
    """Run task `t`, ready at `r`, as the `count`-th of the order: on its resource after the last
    task there (FIFO, FlexFlow sec. 5.2) — a task with parts runs each part so on its own
    resource, and starts with its first part to start and ends with its last part to end;
    checkpoint row ``count // every`` first.  Returns its end."""
    if count % every == 0:
        ck[count // every, :] = last
    k = npt[t]
    if k == 0:
        R = rix[t]
        s = last[R]
        if s < r:
            s = r
        e = s + dur[t]
        last[R] = e
    else:
        s = np.inf
        e = -np.inf
        for h in range(k):
            R = prix[t, h]
            a = last[R]
            if a < r:
                a = r
            b = a + pdur[t, h]
            last[R] = b
            pen[t, h] = b
            if a < s:
                s = a
            if b > e:
                e = b
    rdy[t] = r
    st[t] = s
    en[t] = e
    seq[count] = t
    return e


@njit(cache=True, inline="always")
def _ended(last, x: int, npt, rix, prix, en, pen) -> None:
    """Task `x` ran: its resource — each part's, for a task with parts — last ended with it
    (ends `en`, part ends `pen`)."""
    k = npt[x]
    if k == 0:
        last[rix[x]] = en[x]
    else:
        for h in range(k):
            last[prix[x, h]] = pen[x, h]


@njit(cache=True, inline="always")
def _release(t: int, e: float, off, adj, cnt, rdy, bind, hr, hi, n: int) -> int:
    """Task `t` ended at `e`: each successor is ready no earlier, and one whose last input this
    was joins the heap bound to `t`.  Returns the heap's new size."""
    for p in range(off[t], off[t + 1]):
        j = adj[p]
        if rdy[j] < e:
            rdy[j] = e
        c = cnt[j] - 1
        cnt[j] = c
        if c == 0:
            bind[j] = t
            hr[n] = rdy[j]
            hi[n] = j
            n += 1
            _sift_up(hr, hi, n - 1)
    return n


@njit(cache=True)
def _run(hr, hi, n: int, off, adj, cnt, dur, rix, keys, rdy, st, en, bind, last, seq, count: int,
         every: int, ck, npt, prix, pdur, pen):
    """Algorithm 1's loop from a heap of `n` ready tasks, the order filled from position `count`
    on; checkpoint row c gets every resource's last end before position ``c * every``.  Returns
    the position after the last task run."""
    batch = np.empty(hr.shape[0], np.int64)
    tmp = np.empty(hr.shape[0], np.int64)
    while n > 0:
        r = hr[0]
        b, n = _pop_ready(hr, hi, n, batch, tmp, keys)
        for q in range(b):
            i = batch[q]
            e = _place(i, r, count, every, ck, last, rix, dur, rdy, st, en, seq, npt, prix, pdur, pen)
            count += 1
            n = _release(i, e, off, adj, cnt, rdy, bind, hr, hi, n)
    return count


@njit(cache=True)
def _run_rejoin(hr, hi, n: int, off, adj, cnt, dur, rix, keys, rdy, st, en, bind, last, seq, count: int,
                every: int, ck, oseq, ordy, oen, ofinal, mod, done, quiet: int, npt, prix, pdur, pen, open_):
    """`_run` from the cut, stopping where the new timeline rejoins the old one: at a point P
    between two ready times where the new simulation's state is the old one's — the same tasks
    done (every edited and new task among them, every removed one passed), no task whose end
    moved with a successor still to run, and the same last end on every resource that still
    has old tasks to run (`planner.sim.simulator`, step 3).  From P on Algorithm 1 runs exactly as
    before.  The test runs once `quiet` re-timed tasks in a row kept their end, and each failed
    test postpones the next by as many tasks as it cost steps.

    Returns (position after the last task run, position of P in the old order — its length if
    the pass ran to the end —, every resource's last end at P in the old timeline)."""
    L = oseq.shape[0]
    nres = last.shape[0]
    cap = rdy.shape[0]
    olast = last.copy()  # the old simulation's state, advanced along the old order
    waiting = 0          # edited or new tasks not re-timed yet
    gone = 0             # removed tasks the walk has not passed
    for x in range(cap):
        if mod[x] == 1 or mod[x] == 2:
            waiting += 1
        elif mod[x] == 3:
            gone += 1
    fresh = 0            # new tasks re-timed
    passed = 0           # old tasks the walk passed
    i = count            # the walk's position in the old order (from the cut)
    start = count
    opened = np.empty(L, np.int64)   # passed by the walk, not re-timed yet
    nopen = 0
    changed = np.empty(cap, np.int64)  # re-timed with a new end
    nchanged = 0
    still = 0        # re-timed tasks in a row that kept their end
    recheck = 0      # re-timed count before which no test runs
    batch = np.empty(hr.shape[0], np.int64)
    tmp = np.empty(hr.shape[0], np.int64)
    while True:
        retimed = count - start
        if still >= quiet and retimed >= recheck and waiting == 0:
            Pr = hr[0] if n > 0 else np.inf
            while i < L and ordy[oseq[i]] < Pr:
                x = oseq[i]
                i += 1
                _ended(olast, x, npt, rix, prix, oen, open_)
                if mod[x] == 3:
                    gone -= 1
                else:
                    passed += 1
                    if not done[x]:
                        opened[nopen] = x
                        nopen += 1
            recheck = retimed + quiet
            if gone == 0 and retimed - fresh == passed:
                k = 0
                for q in range(nopen):
                    if not done[opened[q]]:
                        opened[k] = opened[q]
                        k += 1
                nopen = k
                recheck += nopen
                if nopen == 0:
                    same = True
                    recheck += nres >> 3
                    for R in range(nres):
                        if last[R] != olast[R] and ofinal[R] != olast[R]:
                            same = False
                            break
                    if same:
                        k = 0
                        for q in range(nchanged):
                            c = changed[q]
                            for p in range(off[c], off[c + 1]):
                                if not done[adj[p]]:
                                    changed[k] = c
                                    k += 1
                                    break
                        nchanged = k
                        recheck += nchanged
                        if nchanged == 0:
                            return count, i, olast
        if n == 0:
            return count, L, olast
        r = hr[0]
        b, n = _pop_ready(hr, hi, n, batch, tmp, keys)
        for q in range(b):
            t = batch[q]
            e = _place(t, r, count, every, ck, last, rix, dur, rdy, st, en, seq, npt, prix, pdur, pen)
            count += 1
            done[t] = True
            f = mod[t]
            if f == 1 or f == 2:
                waiting -= 1
                fresh += f == 2
            if f != 2 and e == oen[t]:
                still += 1
            else:
                changed[nchanged] = t
                nchanged += 1
                still = 0
            n = _release(t, e, off, adj, cnt, rdy, bind, hr, hi, n)


@njit(cache=True)
def full_pass_arrays(alive, gen, dur, rix, nres: int, keys, rec, ealive, every: int, npt, prix, pdur):
    """Algorithm 1 over the arrays.  Returns (ready, start, end, bind, order, count, last end per
    resource index, remaining input counts, checkpoint vectors); ``count`` < live tasks means a
    cycle (the tasks with a remaining count > 0 never ran).  Checkpoint row c holds every
    resource's last end before position ``c * every`` of the order."""
    cap = alive.shape[0]
    off, adj, ok = _successors(alive, gen, rec, ealive)
    cnt = np.zeros(cap, np.int64)
    for e in range(rec.shape[0]):
        if ok[e]:
            cnt[rec[e, 1]] += 1
    rdy = np.zeros(cap, np.float64)
    st = np.zeros(cap, np.float64)
    en = np.zeros(cap, np.float64)
    bind = np.full(cap, -1, np.int64)
    hr = np.empty(cap, np.float64)
    hi = np.empty(cap, np.int64)
    n = 0
    live = 0
    for i in range(cap):
        if alive[i] != 0:
            live += 1
            if cnt[i] == 0:
                hr[n] = 0.0
                hi[n] = i
                n += 1
    for p in range((n >> 1) - 1, -1, -1):
        _sift_down(hr, hi, n, p)
    last = np.zeros(nres, np.float64)
    seq = np.empty(live, np.int64)
    ck = np.zeros(((live + every - 1) // every if live > 0 else 1, nres), np.float64)
    pen = np.zeros(prix.shape, np.float64)
    count = _run(hr, hi, n, off, adj, cnt, dur, rix, keys, rdy, st, en, bind, last, seq, 0, every, ck,
                 npt, prix, pdur, pen)
    return rdy, st, en, bind, seq[:count], count, last, cnt, ck, pen


@njit(cache=True)
def resume_pass_arrays(alive, gen, dur, rix, nres: int, keys, rec, ealive, every: int,
                       oseq, osim, mod, rdy, st, en, bind, ordy, oen, ofinal, quiet: int,
                       npt, prix, pdur, pen, open_):
    """Delta simulation's re-timing (FlexFlow sec. 5.3) compiled: Algorithm 1 from the cut on.

    `rdy`, `st`, `en`, `bind` hold the old timeline (ids of tasks added since hold anything) and
    are re-timed in place; `oseq` is the old order, `osim` flags the tasks it ran and `mod` marks
    the edited ones: 1 an old task with new inputs or duration (a seed), 2 a new task, 3 a
    removed one.  The cut C is `planner.sim.simulator`'s: the smallest old (ready, key) of a seed or
    removed task, lowered to (latest end of its inputs, key) for a seed or new task whose inputs
    all ran before C.  Every old task before C keeps its times, and the pass resumes in the state
    Algorithm 1 is in at C: each resource's last end, and as ready every task whose inputs all
    ran, with the ready time and the last input (`bind`) a full pass gives it.

    It stops where the new timeline rejoins the old one (`_run_rejoin`; `ordy`, `oen` are the
    old ready and end times, `ofinal` every resource's old last end), once `quiet` re-timed
    tasks in a row kept their end; 0 never stops early.

    Returns (order, count, cut, stop, last end per resource index, the old one at the stop,
    remaining input counts, checkpoint vectors): the order is the old one up to the cut, the
    re-timed tasks, and the old one from position `stop` on (the old length: no rejoin);
    ``count`` < live tasks means a cycle, and ``count`` == -1 an old task before the cut with an
    input after it (edits the caller did not report)."""
    cap = alive.shape[0]
    m = rec.shape[0]
    # 1. The cut (Ct, key of task Cx); Cx = -1: no cut, nothing changed.
    Ct = np.inf
    Cx = -1
    for x in range(cap):
        if mod[x] == 1 or mod[x] == 3:
            if Cx < 0 or (rdy[x] < Ct or (rdy[x] == Ct and _key_less(x, Cx, keys))):
                Ct = rdy[x]
                Cx = x
    ok = live_edges(alive, gen, rec, ealive)
    late = np.zeros(cap, np.bool_)
    top = np.zeros(cap, np.float64)
    for e in range(m):
        if ok[e]:
            a = rec[e, 0]
            b = rec[e, 1]
            if mod[b] == 1 or mod[b] == 2:
                if osim[a] == 0 or (Cx >= 0 and not (rdy[a] < Ct or (rdy[a] == Ct and _key_less(a, Cx, keys)))):
                    late[b] = True
                elif en[a] > top[b]:
                    top[b] = en[a]
    for x in range(cap):
        if (mod[x] == 1 or mod[x] == 2) and not late[x]:
            if Cx < 0 or (top[x] < Ct or (top[x] == Ct and _key_less(x, Cx, keys))):
                Ct = top[x]
                Cx = x
    L = oseq.shape[0]
    lo = 0
    hi = L
    if Cx < 0:
        lo = L
    while lo < hi:  # the first position of the old order at or after C
        mid = (lo + hi) >> 1
        y = oseq[mid]
        if rdy[y] < Ct or (rdy[y] == Ct and _key_less(y, Cx, keys)):
            lo = mid + 1
        else:
            hi = mid
    cut = lo
    # 2. The state at the cut: the prefix done, every resource's last end.
    done = np.zeros(cap, np.bool_)
    last = np.zeros(nres, np.float64)
    for k in range(cut):
        x = oseq[k]
        done[x] = True
        _ended(last, x, npt, rix, prix, en, pen)
    live = 0
    for x in range(cap):
        if alive[x] != 0:
            live += 1
            if not done[x]:
                rdy[x] = 0.0
                bind[x] = -1
    off = np.zeros(cap + 1, np.int64)
    cnt = np.zeros(cap, np.int64)
    for e in range(m):
        if ok[e]:
            a = rec[e, 0]
            b = rec[e, 1]
            if done[b]:
                if not done[a]:
                    return oseq[:0], -1, cut, 0, last, last, cnt, np.zeros((1, nres), np.float64)
                continue
            off[a + 1] += 1
            if done[a]:
                if rdy[b] < en[a]:
                    rdy[b] = en[a]
                # The input a full pass runs last: the largest (ready, key).
                c = bind[b]
                if c < 0 or rdy[c] < rdy[a] or (rdy[c] == rdy[a] and _key_less(c, a, keys)):
                    bind[b] = a
            else:
                cnt[b] += 1
    # Successor lists of the edges into tasks still to run.
    for i in range(cap):
        off[i + 1] += off[i]
    adj = np.empty(off[cap], np.int64)
    fill = off[:cap].copy()
    for e in range(m):
        if ok[e]:
            b = rec[e, 1]
            if not done[b]:
                a = rec[e, 0]
                adj[fill[a]] = b
                fill[a] += 1
    hr = np.empty(cap, np.float64)
    hi_ = np.empty(cap, np.int64)
    n = 0
    for x in range(cap):
        if alive[x] != 0 and not done[x] and cnt[x] == 0:
            hr[n] = rdy[x]
            hi_[n] = x
            n += 1
    for p in range((n >> 1) - 1, -1, -1):
        _sift_down(hr, hi_, n, p)
    seq = np.empty(max(live, cut), np.int64)
    seq[:cut] = oseq[:cut]
    ck = np.zeros(((live + every - 1) // every if live > 0 else 1, nres), np.float64)
    if quiet <= 0:
        count = _run(hr, hi_, n, off, adj, cnt, dur, rix, keys, rdy, st, en, bind, last, seq, cut, every, ck,
                     npt, prix, pdur, pen)
        return seq[:count], count, cut, L, last, last, cnt, ck
    count, stop, olast = _run_rejoin(hr, hi_, n, off, adj, cnt, dur, rix, keys, rdy, st, en, bind, last, seq,
                                     cut, every, ck, oseq, ordy, oen, ofinal, mod, done, quiet,
                                     npt, prix, pdur, pen, open_)
    if stop < L:
        # The old order from the stop on runs as before: its old times, and each task's `bind`
        # as a full pass gives it (its inputs may have run in a new order before the stop).
        tail = np.zeros(cap, np.bool_)
        for k in range(stop, L):
            x = oseq[k]
            tail[x] = True
            rdy[x] = ordy[x]
            en[x] = oen[x]
            bind[x] = -1
            seq[count] = x
            count += 1
        for e in range(m):
            if ok[e]:
                b = rec[e, 1]
                if tail[b]:
                    a = rec[e, 0]
                    c = bind[b]
                    if c < 0 or rdy[c] < rdy[a] or (rdy[c] == rdy[a] and _key_less(c, a, keys)):
                        bind[b] = a
    return seq[:count], count, cut, stop, last, olast, cnt, ck
