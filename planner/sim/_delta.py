"""Delta simulation (FlexFlow sec. 5.3, Algorithm 2) as an exact replay from a cut: the tuned loop.

Why it is exact, and how the cut and the convergence test are chosen, is in the docstring of
`planner.sim.simulator`.  This module is the code; its shape follows CPython's costs:

* **Pull, not push.**  Algorithm 1 pushes every finished task's end to each successor (a Python
  step per edge).  Here a waiting task *watches one input* — the one that finished last in the
  old timeline (`bind`) — and when that one finishes, reads all its inputs at once with
  ``max(map(en.__getitem__, preds))``, a C loop; unfinished tasks read ``inf``, so a task whose
  inputs finish in a new order simply watches the unfinished one.  All-to-all dependencies cost a
  C loop instead of a Python loop per edge.
* **In place.**  New times overwrite the old ones as they are computed; the old ready and end
  times stay readable in two flat copies (C-speed to make).  A pass that stops midway (a cycle,
  or a budget spent) leaves `S._broken` set and the simulator re-simulates in full.
* The hot loop does no convergence bookkeeping: the old order is walked, and the states
  compared, only when a test is due.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from heapq import heapify, heappop, heappush, heapreplace
from itertools import chain, islice, repeat

from ._layout import MAX_PARTS
from ._replay import check_resolution, place_parts, row
from ._taskstore import TaskGraph, find_cycle

INF = math.inf
#: Re-timed tasks in a row that kept their end before the convergence test runs.
QUIET = 16


def _part_ends(last: list, R: tuple, pen, x: int) -> None:
    """Each part's resource of task `x` (resources `R`) last ended with that part (part ends
    from ``x * MAX_PARTS`` in `pen`)."""
    b = x * MAX_PARTS
    for h, Rh in enumerate(R):
        last[Rh] = pen[b + h]


def delta_pass(g: TaskGraph, S, seeds, new, removed, limit: float = INF,
               budget: float = INF) -> dict | None:
    """Re-time the timeline held by `S` (a `DeltaSimulator`) after edits: `seeds` are old tasks
    with new inputs or duration, `new` added and `removed` deleted tasks (ids).

    When more than `limit` tasks lie after the cut, the replay only goes on while it has
    re-timed at most `budget` tasks: a change that is absorbed early still pays off, one that
    shifts the rest of the step is better served by a full simulation.  Returns None when it
    gives up; `S._broken` then says that `S`'s times are partly rewritten (as after a cycle
    error), and the caller must simulate in full."""
    key, pred, succ, dur, rix = g._key, g._pred, g._succ, g._dur, g._rix
    rdy, en, bind, seq, simf = S._rdy, S._en, S._bind, S._seq, S._sim
    nres = len(g._rlist)

    # 1. The cut C = (time, key): old tasks before it keep their times.
    Ct, Ck = INF, ()
    for x in chain(seeds, removed):
        r = rdy[x]
        if r < Ct or (r == Ct and key[x] < Ck):
            Ct, Ck = r, key[x]
    # A seed or new task whose inputs all lie before the cut may be ready before it: lower the
    # cut to it.  C only decreases, so one pass suffices.
    for x in chain(seeds, new):
        r = 0.0
        for p in pred[x]:
            if not simf[p]:
                break
            rp = rdy[p]
            if rp > Ct or (rp == Ct and key[p] >= Ck):
                break
            if en[p] > r:
                r = en[p]
        else:
            if r < Ct or (r == Ct and key[x] < Ck):
                Ct, Ck = r, key[x]
    L = len(seq)
    cut = bisect_left(seq, (Ct, Ck), key=lambda i: (rdy[i], key[i])) if Ct < INF else L
    if L - cut + len(new) <= limit:
        budget = INF
    elif budget < 1:
        return None

    # 2. Every resource's last end just before the cut: nearest checkpoint, then a short scan.
    j = bisect_right(S._ck_pos, cut) - 1
    last = row(S._ck_vec[j], nres)
    pen = S._pen
    for x in islice(seq, S._ck_pos[j], cut):
        R = rix[x]
        if type(R) is int:
            last[R] = en[x]
        else:
            _part_ends(last, R, pen, x)
    at_cut = last[:]
    olast = last[:]  # the same state advanced along the *old* order, for the convergence test
    ofinal = S._final + [0.0] * (nres - len(S._final))  # old last end of every resource

    # 3. Set up.  New times are written in place (`S` is marked for a full simulation if the
    # pass fails midway); the old times stay readable in the copies `ordy`, `oen`.  Every task
    # after the cut reads inf until re-timed and watches the input that finished last before
    # (`bind`); one whose inputs are all before the cut is ready now.
    S._epoch += 1
    ep = S._epoch
    sm, st = S._sm, S._st
    W: dict[int, list] = {}  # task -> the tasks that watch it
    ordy = rdy[:]
    oen = en[:]
    any(map(en.__setitem__, islice(seq, cut, None), repeat(INF)))
    any(map(en.__setitem__, new, repeat(INF)))
    any(map(oen.__setitem__, new, repeat(math.nan)))  # a new task's end is never "unchanged"
    for x in chain(seeds, new, removed):
        sm[x] = ep

    def wait(x: int) -> None:
        """Watch the unfinished input of `x` most likely to finish last (new inputs first)."""
        best, bv = -1, -1.0
        for p in pred[x]:
            if en[p] == INF:
                v = oen[p] if simf[p] else INF
                if v > bv:
                    best, bv = p, v
        w = W.get(best)
        if w is None:
            W[best] = [x]
        else:
            w.append(x)

    heap = []
    for x in islice(seq, cut, None):
        if sm[x] == ep:
            continue  # seeds below; removed tasks never run
        b = bind[x]
        if b >= 0 and en[b] == INF:
            w = W.get(b)
            if w is None:
                W[b] = [x]
            else:
                w.append(x)
        else:  # its last input is before the cut, hence all are: ready as before
            heap.append((rdy[x], key[x], x))
    for x in chain(seeds, new):
        ps = pred[x]
        if not ps:
            bind[x] = -1
            heap.append((0.0, key[x], x))
            continue
        r = max(map(en.__getitem__, ps))
        if r == INF:
            wait(x)
        else:
            bind[x] = max(ps, key=lambda p: (rdy[p], key[p]))  # last to finish, in pop order
            heap.append((r, key[x], x))
    heapify(heap)

    # 4. Replay in (ready, key) order.  The hot loop only re-times.  The convergence test
    # (docstring) runs once QUIET re-timed tasks in a row kept their end and no seed or new task
    # is left: it walks the old order up to the next event — olast becomes the old per-resource
    # state there — and compares: same tasks done, same last ends, no moved end with a successor
    # still to run, every removed task behind.
    order: list[int] = []
    emit = order.append
    waiting = list(chain(seeds, new))  # seeds and new tasks, pruned as they are re-timed
    gone_set = set(removed)
    gone = len(removed)            # removed tasks the old order has not passed yet
    npassed = 0                    # old tasks passed by the old order
    passed_open: list[int] = []    # passed by the old order, not re-timed yet
    changed: list[int] = []        # re-timed with a new end
    quiet = 0
    recheck = 0      # re-timed count before which the convergence test is not run again
    stop = QUIET     # re-timed count at which the loop looks at tests and budget again
    i = cut
    converged = False
    S._broken = True  # until the pass completes
    opn: dict[int, array] = {}  # old part ends of the re-timed tasks with parts
    while heap:
        r, _, t = heap[0]
        R = rix[t]
        if type(R) is int:
            s = last[R]
            if s < r:
                s = r
            e = s + dur[t]
            last[R] = e
        else:
            if t not in opn:
                opn[t] = pen[t * MAX_PARTS:(t + 1) * MAX_PARTS]
            s, e = place_parts(t, r, R, dur[t], last, pen)
        rdy[t] = r
        st[t] = s
        en[t] = e
        emit(t)
        if e == oen[t]:
            quiet += 1
        else:
            changed.append(t)
            quiet = 0
        top = True  # heap[0] is still t's entry: the first ready watcher replaces it
        ws = W.pop(t, None)
        if ws is not None:
            for x in ws:
                ps = pred[x]
                rx = e if len(ps) == 1 else max(map(en.__getitem__, ps))
                if rx == INF:
                    wait(x)
                else:
                    bind[x] = t
                    if top:
                        heapreplace(heap, (rx, key[x], x))
                        top = False
                    else:
                        heappush(heap, (rx, key[x], x))
        if top:
            heappop(heap)
        if len(order) < stop:
            continue
        n = len(order)
        if n > budget:
            return None  # S._broken stays set
        if quiet < QUIET or n < recheck:
            stop = min(max(recheck, n + QUIET - quiet), budget + 1)
            continue
        stop = n + 1
        # Each failed test postpones the next by as many re-timed tasks as it cost steps,
        # which keeps testing within a constant factor of the replay.
        if waiting:
            waiting = [x for x in waiting if en[x] == INF]
            if waiting:
                recheck = len(order) + QUIET + len(waiting)
                continue
        if heap:
            Pr, Pk = heap[0][0], heap[0][1]
        else:
            Pr, Pk = INF, ()
        while i < L:
            x = seq[i]
            xr = ordy[x]
            if xr > Pr or (xr == Pr and key[x] >= Pk):
                break
            i += 1
            R = rix[x]
            if type(R) is int:
                olast[R] = oen[x]
            else:
                old = opn.get(x)  # a task with parts the replay re-timed: its old part ends
                if old is None:
                    _part_ends(olast, R, pen, x)
                else:
                    _part_ends(olast, R, old, 0)
            if x in gone_set:
                gone -= 1
            else:
                npassed += 1
                if en[x] == INF:
                    passed_open.append(x)
        recheck = len(order) + QUIET
        # All new tasks are re-timed (waiting is empty), so the others are old ones.
        if gone or len(order) - len(new) != npassed:
            continue
        # (A passed task not re-timed yet was delayed by an input whose end moved, so the
        # moved-end test below would catch it too; this one is cheaper.)
        passed_open = [x for x in passed_open if en[x] == INF]
        recheck += len(passed_open)
        if passed_open:
            continue
        # A resource whose last ends differ only matters if an old task still has to run on it
        # (its final old end is later than the old end so far).
        recheck += nres >> 3
        if last != olast and any(a != b and f != b for a, b, f in zip(last, olast, ofinal)):
            continue
        changed = [c for c in changed if any(en[y] == INF for y in succ[c])]
        recheck += len(changed)
        if not changed:
            converged = True
            break

    if converged:
        # Tasks from the stop on keep their old times (some were waiting or queued).
        tail = seq[i:]
        any(map(en.__setitem__, tail, map(oen.__getitem__, tail)))
        # (Their part ends were never rewritten: every task the replay re-timed lies before the stop.)
    else:
        i = L  # the whole old suffix is replaced
        if cut + len(order) != len(g._id):
            start = next(x for x in g._id.values() if en[x] == INF)
            raise find_cycle(start, pred, lambda p: en[p] == INF, key)
    # Resources with old tasks still to come end as before; the others where the replay left them.
    final = [f if f != b else a for a, b, f in zip(last, olast, ofinal)] if converged else last
    makespan = max(final, default=0.0)
    check_resolution(g, makespan)

    # 5. Commit: flags, order, checkpoints (every `every` tasks of the new stretch).
    for t in new:
        simf[t] = True
    for x in removed:
        simf[x] = False
    every = S._every
    v = at_cut
    mid_pos: list[int] = []
    mid_vec: list[list[float]] = []
    for c in range(0, len(order), every):
        mid_pos.append(cut + c)
        mid_vec.append(v[:])
        for t in islice(order, c, c + every):
            R = rix[t]
            if type(R) is int:
                v[R] = en[t]
            else:
                _part_ends(v, R, pen, t)
    pos, vecs = S._ck_pos, S._ck_vec
    lo = bisect_right(pos, cut)
    hi = bisect_left(pos, i) if converged else len(pos)
    shift = cut + len(order) - i
    if mid_pos and mid_pos[0] == pos[lo - 1]:  # the cut itself was a checkpoint
        del mid_pos[0], mid_vec[0]
    later = vecs[hi:]
    moved = [R for R, (a, b) in enumerate(zip(last, olast)) if a != b] if converged else ()
    if moved and later:
        # A resource whose last end moved has no old task after the stop (the convergence test),
        # so the old checkpoints after it hold its old last end all along: they get the new one.
        later = [row(v, nres) for v in later]
        for v in later:
            for R in moved:
                v[R] = last[R]
    S._ck_pos = pos[:lo] + mid_pos + [p + shift for p in pos[hi:]]
    S._ck_vec = vecs[:lo] + mid_vec + later
    seq[cut:i] = array("q", order)
    S._makespan = makespan
    S._final = final
    S._broken = False
    return {"mode": "delta", "tasks": len(g._id), "seeds": len(seeds), "new": len(new),
            "removed": len(removed), "cut": cut, "stop": i, "converged": converged,
            "retimed": len(order), "budgeted": budget < INF}
