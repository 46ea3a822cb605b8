"""FIFO windows: what the order of op k's parameter traffic does to the rest of the backward pass.

A bound that holds for every schedule cannot see this: an optimal scheduler would run parameter
updates (which nothing waits for) last and let gradients overtake all-reduce rings.  The
simulator runs every resource in FIFO order of (ready time, key) (`planner.sim.simulator`), so an
update ready before a backward task on its device runs first, and a gradient ready after a ring
on its link waits for it.  On one P100 node that costs data parallelism 16 us of LeNet's 332 us
step, and a misplaced gradient can cost 25 us behind a ring; without it every strategy within
16 us of the optimum survives the bound.

Let ``T_k`` be the end of the last backward task of op k (all of whose parameters only k uses)
and t* that task, on device g.  Everything below is relative to ``T_k`` and holds whichever
task t* is, so `window` takes the minimum over the tasks of k.  Ops up to k are configured,
later ops are not (the window is computed when k is placed and stays valid in its subtree).

1. **Descendants** of t*'s backward task (backward tasks of earlier ops, gradient transfers,
   barriers, rings and updates) get lower bounds on ready and end times by longest paths
   (``Lr``, ``Le``).
2. **Queue behind k's rings.**  The ring tasks of k's parameters in groups that contain g are
   ready at exactly ``T_k + 1 ns`` (their barrier waits for t* and for nothing that ends after
   ``T_k``).  A descendant on the same link ready provably later (``Lr > 1 ns``: a gradient past
   the first hop, a ring of an earlier op) runs after all of them: it starts no earlier than
   ``1 ns`` plus their total time.
3. **Update bound.**  Such a ring task x ends by ``max(ready, T_k) + duration + U``, U the work
   left at ``T_k`` on its link (a task on a non-idling resource waits only for work ahead of it).
   By Reich's formula U is the supremum over tau of the work arriving (becoming ready) in
   [tau, T_k] minus ``T_k - tau``; it only grows when arrivals move later, so upper bounds on
   arrival times suffice (`_link_items`, `_backlog`):
   * later ops m's rings arrive by ``T_m + 1 ns <= T_k - gap(m, k) + 1 ns``, at most their
     largest possible ring time per link (`Static.maxring`);
   * ancestors of k's backward tasks arrive before they end: a gradient into backward task t of
     k by ``T_k - pb(k, t)``, a transfer into a forward task of ``upstream_of[k]`` by
     ``T_k - pf(k, t) - pb(k, t)``, one into a task of a later op u of ``bound_from[k]`` by
     ``T_k - bmin(u) - gap(u, k)`` (``- fmin(u)`` more when forward), unconfigured ones at most
     `Static.edge_ub` per link;
   * everything else may arrive as late as ``T_k``, except what is provably ready after
     ``T_k + 1 ns`` (descendants with ``Lr > 1 ns``, rings of earlier ops whose barrier waits for
     a descendant) and k's rings with the same device set and a larger parameter index (same
     ready time, larger key).
   The update of k's parameter on g is ready by the end barrier of its groups that contain g: at
   most ``2 ns`` plus the largest such ring end after ``T_k`` (exactly ``T_k`` when g is in no
   group).
4. **Interference.**  On g, a task y descending from t* cannot start before
   ``T_k + (work of g's tasks on its path from t*) + (updates u with ready(u) < ready(y))``:
   they all run on g after ``T_k`` (their ready times are at least ``T_k``) and FIFO puts them
   first.  ``ready(u) < ready(y)`` is proven by ``ub(u) + eps < Lr(y)`` (updates' keys are
   larger than backward tasks', so a tie would not do).  Pass 1 computes ``Lr`` without it (for
   the exclusions of 3), pass 2 with it.

Results: ``to[m] = min over t* of max over tasks of m of Le`` (so ``T_m >= T_k + to[m]``) and
``end`` (so the step lasts at least ``T_k + end``: every descendant, plus, per link, the
one-resource bound of the rings on it followed by their end barrier and updates).  A window
that cannot prove an update early nor delay a gradient or ring behind k's rings (`_hopeless`)
is not computed: skipping one only weakens the bound.
"""

from __future__ import annotations

from ._exhaustive_static import EPS, NEG, TICK, Static


def window(S: Static, placed: list, k: int) -> tuple[dict[int, float], float] | None:
    """(to, end) as in the module docstring, or None when it cannot be bounded or would prove
    no update early (`_hopeless`; the critical path already covers the rest)."""
    if not S.window_ok[k] or _hopeless(S, placed, k):
        return None
    cases = [_case(S, placed, k, ts) for ts in range(len(placed[k].dev))]
    to = {}
    for m in range(k):
        vals = [c[0].get(m) for c in cases]
        if all(v is not None for v in vals):
            to[m] = min(vals)
    return to, min(c[1] for c in cases)


def _case(S: Static, placed: list, k: int, ts: int) -> tuple[dict[int, float], float]:
    g = placed[k].dev[ts]
    first = _propagate(S, placed, k, ts, g, None)
    upd = _update_bounds(S, placed, k, g, first)
    second = _propagate(S, placed, k, ts, g, upd)
    return second.to, second.end


def _hopeless(S: Static, placed: list, k: int) -> bool:
    """True when no update of k can be proven ahead of a descendant: each bound of its ready
    time (its ring, plus the backlog of the rings and transfers of unconfigured ops alone, an
    underestimate) is at least the longest path from any task of k (``max D``)."""
    K = placed[k]
    longest = max(K.D)
    queue = _ring_queue(S, placed, k, None)
    for v in range(k + 1):                      # gradients that may wait for k's rings
        for xs, _, _ in placed[v].edges:
            if any(link in queue for x in xs for link, _ in x.bwd_links):
                return False
    for m in range(k):                          # rings of earlier ops that may wait for k's
        for p in S.params_last_at[m]:
            for grp in placed[m].params[p].groups:
                if any(queue.get(link, 0.0) > S.gap.get((k, m), 0.0) for link in grp.own):
                    return False
    full, items = _link_items(S, placed, k, -1, None, configured=False)
    for p in S.params_of[k]:
        for grp in K.params[p].groups:
            if any(2 * TICK + busy + _backlog(full[link], items[link]) < longest - EPS
                   for link, busy in grp.own.items()):
                return False
        if any(not any(d in grp.devset for grp in K.params[p].groups) for d in K.params[p].upd):
            return False                        # an update waiting for no ring: ready at T_k
    return True


def _ring_queue(S: Static, placed: list, k: int, g: int | None) -> dict[int, float]:
    """Per link: time of k's ring tasks in groups that contain g (all groups when g is None).
    With g the device of t*, they are all ready at exactly ``T_k + 1 ns``: a task on the same
    link that is ready later waits until they have all run."""
    out: dict[int, float] = {}
    for p in S.params_of[k]:
        for grp in placed[k].params[p].groups:
            if g is None or g in grp.devset:
                for link, dur in grp.own.items():
                    out[link] = out.get(link, 0.0) + dur
    return out


class _Pass:
    __slots__ = ("le", "xfer_lr", "barrier", "to", "end")


def _propagate(S: Static, placed: list, k: int, ts: int, g: int, upd) -> _Pass:
    out = _Pass()
    le: dict[tuple[int, int], float] = {(k, ts): 0.0}
    pw: dict[tuple[int, int], float] = {(k, ts): 0.0}   # g's work on the path after T_k, before the task
    xfer_lr: dict[tuple[int, int, int], float] = {}     # (consumer, input, transfer) -> Lr of its backward hops
    barrier: dict[tuple[str, int], float] = {}
    rings_on: dict[int, list[tuple[float, float, float]]] = {}
    queue = _ring_queue(S, placed, k, g)
    end = 0.0

    def behind(ready: float, link: int) -> float:
        """Earliest start of a task on `link` ready at ``T_k + ready``: after k's rings there
        when it is ready after them (FIFO)."""
        if ready > TICK + EPS and link in queue:
            return max(ready, TICK + queue[link])
        return ready

    def w_out(m: int, t: int) -> float:
        return pw[(m, t)] + (placed[m].pb[t] if placed[m].dev[t] == g and (m, t) != (k, ts) else 0.0)

    def params(m: int) -> None:
        nonlocal end
        for p in S.params_first_at[m]:
            users = S.users[p]
            rings = placed[S.last_user[p]].params[p]
            ends = {}
            for gi, grp in enumerate(rings.groups):
                preds = [le[(u, t)] for u in users for t, d in enumerate(placed[u].dev)
                         if d in grp.devset and (u, t) in le]
                if not preds:
                    continue
                lb = barrier[(p, gi)] = max(preds)
                lr = lb + TICK
                follow = TICK + max(rings.upd[d] for d in grp.devset)
                last = lr
                for link, dur in grp.tasks:
                    start = behind(lr, link) if m < k else lr
                    rings_on.setdefault(link, []).append((start, dur, follow))
                    last = max(last, start + dur)
                ends[gi] = last + TICK
                end = max(end, ends[gi])
            for d, dur in rings.upd.items():
                mine = [gi for gi, grp in enumerate(rings.groups) if d in grp.devset]
                if mine:
                    vals = [ends[gi] for gi in mine if gi in ends]
                else:
                    vals = [le[(u, t)] for u in users for t, dd in enumerate(placed[u].dev) if dd == d and (u, t) in le]
                if vals:
                    end = max(end, max(vals) + dur)

    params(k)
    for m in range(k - 1, -1, -1):
        P = placed[m]
        nt = len(P.dev)
        lr = [NEG] * nt
        wp = [NEG] * nt
        for c, j in S.cons[m]:
            if c > k:
                continue
            xfers, local, _ = placed[c].edges[j]
            for pt, ct in local:
                v = le.get((c, ct))
                if v is not None:
                    lr[pt] = max(lr[pt], v)
                    wp[pt] = max(wp[pt], w_out(c, ct))
            for xi, x in enumerate(xfers):
                ready, w = NEG, NEG
                for ct in x.dst_tasks:
                    v = le.get((c, ct))
                    if v is not None:
                        ready, w = max(ready, v), max(w, w_out(c, ct))
                if ready > NEG:
                    xfer_lr[(c, j, xi)] = ready
                    arrive = max(behind(ready, link) + dur for link, dur in x.bwd_links)
                    lr[x.src_task] = max(lr[x.src_task], arrive)
                    wp[x.src_task] = max(wp[x.src_task], w)
        for t in range(nt):
            if lr[t] == NEG:
                continue
            base = lr[t]
            if P.dev[t] == g:
                extra = sum(dur for ub, dur in upd if ub + EPS < lr[t]) if upd else 0.0
                base = max(base, wp[t] + extra)
            le[(m, t)] = base + P.pb[t]
            pw[(m, t)] = wp[t]
            end = max(end, le[(m, t)])
        params(m)
    # One link at a time: the rings on it run one after another, then a barrier and updates.
    for items in rings_on.values():
        items.sort(reverse=True)
        acc, follow = 0.0, float("inf")
        for lr_, dur, fol in items:
            acc += dur
            follow = min(follow, fol)
            end = max(end, lr_ + acc + follow)
    to = {}
    for (m, t), v in le.items():
        if m < k:
            to[m] = max(to.get(m, NEG), v)
    out.le, out.xfer_lr, out.barrier, out.to, out.end = le, xfer_lr, barrier, to, end
    return out


def _update_bounds(S: Static, placed: list, k: int, g: int, first: _Pass) -> list[tuple[float, float]]:
    """(upper bound of ready - T_k, duration) of every update of k's parameters on g."""
    K = placed[k]
    backlog = [_backlog(full, items) for full, items in zip(*_link_items(S, placed, k, g, first))]
    own = [K.params[p] for p in S.params_of[k]]
    out = []
    for rings in own:
        if g not in rings.upd:
            continue
        mine = [grp for grp in rings.groups if g in grp.devset]
        if not mine:
            out.append((0.0, rings.upd[g]))
            continue
        ub = 0.0
        for grp in mine:
            for link, busy in grp.own.items():
                # k's rings that wait for t* too are ready at T_k + 1 ns as well: ahead unless
                # they have the same devices and a larger parameter index (a larger key).
                ahead = sum(grp2.own.get(link, 0.0) for r2 in own for grp2 in r2.groups
                            if grp2 is not grp and g in grp2.devset
                            and not (grp2.devset == grp.devset and r2.pi > rings.pi))
                ub = max(ub, 2 * TICK + busy + ahead + backlog[link])
        out.append((ub, rings.upd[g]))
    return out


def _link_items(S: Static, placed: list, k: int, g: int, first: _Pass | None,
                configured: bool = True) -> tuple[list[float], list[list]]:
    """Per link, the tasks that may arrive (become ready) by ``T_k``: ``full`` — work that may
    arrive as late as ``T_k``; ``items`` — (upper bound of arrival - T_k, work).  Without
    `configured`, only the unconfigured ops' (an underestimate)."""
    full = [0.0] * S.nlinks
    items: list[list[tuple[float, float]]] = [[] for _ in range(S.nlinks)]
    bound, upstream = S.bound_from[k], S.upstream_of[k]
    K = placed[k]
    dk = min(K.pb)
    dfk = min(f + b for f, b in zip(K.pf, K.pb))
    for m in range(k if configured else 0):                          # rings of earlier ops: after, if they wait for a descendant
        for p in S.params_last_at[m]:
            for gi, grp in enumerate(placed[m].params[p].groups):
                if first.barrier.get((p, gi), NEG) <= EPS:
                    for link, dur in grp.own.items():
                        full[link] += dur
    for p in S.params_of[k] if configured else ():   # k's rings that do not wait for t*
        for grp in K.params[p].groups:
            if g not in grp.devset:
                for link, dur in grp.own.items():
                    full[link] += dur
    for v in range(k + 1 if configured else 0):   # transfers between configured ops
        for j, (xfers, _, _) in enumerate(placed[v].edges):
            for xi, x in enumerate(xfers):
                for link, dur in x.fwd_links:
                    if v in upstream:           # ends by the start of a forward task of k
                        items[link].append((-dfk, dur))
                    else:
                        full[link] += dur
                if first.xfer_lr.get((v, j, xi), NEG) > TICK + EPS:
                    continue                    # ready after T_k + 1 ns
                for link, dur in x.bwd_links:
                    full[link] += dur
    for v in range(k + 1, S.N):                 # transfers touching ops not configured yet
        for j, u in enumerate(S.prods[v]):
            ub = S.edge_ub[(v, j)]
            fwd = -(S.fmin[v] + S.bmin[v] + S.gap[(v, k)]) if v in bound else None
            bwd = (-dk if u == k else -(S.bmin[u] + S.gap[(u, k)])) if u in bound else None
            for link, work in enumerate(ub):
                if work > 0.0:
                    for arrival in (fwd, bwd):
                        if arrival is None:
                            full[link] += work
                        else:
                            items[link].append((arrival, work))
    for m in S.ring_ops:                        # rings of later ops: ready by T_m + 1 ns
        if m <= k:
            continue
        gap = S.gap.get((m, k))
        for link, work in enumerate(S.maxring[m]):
            if work > 0.0:
                if gap is None:
                    full[link] += work
                else:
                    items[link].append((TICK - gap, work))
    return full, items


def _backlog(full: float, items: list[tuple[float, float]]) -> float:
    """Work left at ``T_k`` on a non-idling resource (Reich's formula: the supremum over tau of
    the work arriving in [tau, T_k] minus ``T_k - tau``; arriving later only lowers it)."""
    best = acc = full
    for arrival, work in sorted(items, reverse=True):
        acc += work
        best = max(best, acc + arrival)
    return best
