"""Bounds of the exhaustive search for one partial strategy: placing an op, its loads, its
critical-path terms and its window (`planner.search.exhaustive` states the bounds and why they
hold; `_exhaustive_static`, `_exhaustive_tails` and `_exhaustive_windows` compute their parts).

`Bounds.place` builds the node of one op under one configuration given the nodes placed before
it; `Bounds.bound` is the lower bound of every completion of that prefix.  Transfers per
(op, input, configuration, producer configuration) and rings, updates and tails per
(op, configuration) are memoized; the critical-path part of a bound is computed before the loads
(it prunes most children on its own), and the caller computes a window only when neither does.
"""

from __future__ import annotations

import math

from ..ir.strategy import ParallelConfig
from ..sim.taskgraph import TaskGraphBuilder
from ._exhaustive_static import NEG, TICK, Prefix, Static
from ._exhaustive_tails import round_trips
from ._exhaustive_windows import window

#: Memoized transfer lists kept at most (about 0.5 kB each).
_MAX_EDGES = 1_000_000


class Xfer:
    """One transfer of an input edge: its producer task, the consumer tasks it feeds, and its
    link tasks forward and backward (the gradient goes back the reverse route)."""

    __slots__ = ("src_task", "dst_tasks", "fwd_links", "bwd_links", "f_time", "b_time")

    def __init__(self, src_task, dst_tasks, fwd_links, bwd_links):
        self.src_task, self.dst_tasks = src_task, dst_tasks
        self.fwd_links, self.bwd_links = fwd_links, bwd_links
        self.f_time = max(d for _, d in fwd_links)
        self.b_time = max(d for _, d in bwd_links)


class Placed:
    """A configured op on the search path, with what the bounds need about its tasks."""

    __slots__ = ("cfg", "dev", "pf", "pb", "ef", "D", "edges", "delta", "params", "dstar", "contrib")


class Bounds:
    """The graph facts, round-trip table and memos of one search, and the bound arithmetic."""

    def __init__(self, builder: TaskGraphBuilder, configs: list[list[ParallelConfig]]):
        self.b = builder
        self.g = builder.graph
        self.ops = list(self.g.ops)
        self.n = builder.num_devices
        self.nres = self.n + len(builder.topology.links)
        self.S = Static(builder, configs)
        self.rt = round_trips(self.S, configs)
        self.windows = 0
        self._edges: dict = {}
        self._owns: dict = {}

    def edge(self, i: int, j: int, cfg: ParallelConfig, pcfg: ParallelConfig) -> tuple:
        """(transfers, same-device pairs, link load) of input j of op i, memoized."""
        key = (i, j, cfg, pcfg)
        hit = self._edges.get(key)
        if hit is None:
            S, op = self.S, self.ops[i]
            ref = op.inputs[j]
            transfers, local = self.b.transfers(op, j, cfg, pcfg, self.g[ref.op].outputs[ref.index].itemsize)
            xs, load = [], {}
            for tr in transfers:
                x = Xfer(tr.src_tasks[0], tr.dst_tasks, S.link_tasks(tr.src_dev, tr.dst_dev, tr.nbytes),
                         S.link_tasks(tr.dst_dev, tr.src_dev, tr.nbytes))
                xs.append(x)
                for link, dur in x.fwd_links + x.bwd_links:
                    load[self.n + link] = load.get(self.n + link, 0.0) + dur
            if len(self._edges) >= _MAX_EDGES:
                self._edges.clear()             # a bounded memo: long searches revisit recent pairs
            hit = self._edges[key] = (xs, local, tuple(load.items()))
        return hit

    def own(self, i: int, cfg: ParallelConfig, placed: list[Placed]) -> tuple:
        """(forward times, backward times, parameter rings, tail per task, own load) of op i:
        memoized unless a parameter it is the last user of is shared (then the rings depend on
        the other users' configurations)."""
        key = (i, cfg)
        hit = self._owns.get(key)
        if hit is not None:
            return hit
        S, op = self.S, self.ops[i]
        devices = self.b.topology.devices
        times = [S.task_time(i, cfg.degrees, devices[d]) for d in cfg.devices]
        pf, pb = [f for f, _ in times], [bw for _, bw in times]
        load: dict[int, float] = {}
        for d, (f, bw) in zip(cfg.devices, times):
            load[d] = load.get(d, 0.0) + f + bw
        params = {}
        if S.params_last_at[i]:
            configs = {self.ops[u].name: placed[u].cfg for u in range(i)}
            configs[op.name] = cfg
            prefix = Prefix(configs)
            for p in S.params_last_at[i]:
                rings = params[p] = S.rings(prefix, p)
                for grp in rings.groups:
                    for link, dur in grp.tasks:
                        load[self.n + link] = load.get(self.n + link, 0.0) + dur
                for d, dur in rings.upd.items():
                    load[d] = load.get(d, 0.0) + dur
        tails = [self.tail(params.values(), d) for d in cfg.devices]
        hit = (pf, pb, params, tails, tuple(load.items()))
        if not any(len(S.users[p]) > 1 for p in S.params_last_at[i]):
            self._owns[key] = hit
        return hit

    def place(self, i: int, cfg: ParallelConfig, placed: list[Placed]) -> Placed:
        """Tasks, transfers, forward ends and ``D`` of op i under `cfg` (module docstring)."""
        S = self.S
        node = Placed()
        node.cfg, node.dev = cfg, cfg.devices
        node.pf, node.pb, node.params, tails, _ = self.own(i, cfg, placed)
        start = [0.0] * len(cfg.devices)
        D = [t[0] for t in tails]
        edges = []
        for j, u in enumerate(S.prods[i]):
            P = placed[u]
            xs, local, _ = e = self.edge(i, j, cfg, P.cfg)
            for x in xs:
                ready = P.ef[x.src_task] + x.f_time
                back = x.b_time + P.pb[x.src_task] + P.D[x.src_task]
                for ct in x.dst_tasks:
                    if ready > start[ct]:
                        start[ct] = ready
                    if back > D[ct]:
                        D[ct] = back
            for pt, ct in local:
                if P.ef[pt] > start[ct]:
                    start[ct] = P.ef[pt]
                back = P.pb[pt] + P.D[pt]
                if back > D[ct]:
                    D[ct] = back
            edges.append(e)
        node.edges = edges
        for t, (_, rings_on, follow) in enumerate(tails):
            if rings_on:
                D[t] = max(D[t], self.tail_after_gradients(t, rings_on, follow, edges))
        node.ef = [s + f for s, f in zip(start, node.pf)]
        node.D = D
        node.delta = None
        node.dstar = NEG
        node.contrib = max(e + p + x for e, p, x in zip(node.ef, node.pb, D))
        return node

    def load(self, i: int, node: Placed, placed: list[Placed]) -> dict[int, float]:
        """Resource time op i adds once placed: its tasks, its input transfers both ways, and
        the rings and updates of parameters whose last user it is."""
        if node.delta is None:
            delta: dict[int, float] = {}
            for r, v in self.own(i, node.cfg, placed)[4]:
                delta[r] = delta.get(r, 0.0) + v
            for e in node.edges:
                for r, v in e[2]:
                    delta[r] = delta.get(r, 0.0) + v
            node.delta = delta
        return node.delta

    @staticmethod
    def tail(params, d: int) -> tuple[float, dict[int, float], float]:
        """Least time from the end of a backward task on device d to the end of the step through
        the rings and updates of parameters whose barrier waits for it; with the ring time per
        link of those groups and the least update that follows the last of them."""
        out = 0.0
        on_link: dict[int, float] = {}
        follow = math.inf
        for rings in params:
            mine = [grp for grp in rings.groups if d in grp.devset]
            if not mine and d in rings.upd:
                out = max(out, rings.upd[d])
            for grp in mine:
                upd = max(rings.upd[x] for x in grp.devset)
                out = max(out, 2 * TICK + max(dur for _, dur in grp.tasks) + upd)
                follow = min(follow, upd)
                for link, dur in grp.own.items():
                    on_link[link] = on_link.get(link, 0.0) + dur
        if on_link:
            out = max(out, 2 * TICK + max(on_link.values()) + follow)
        return out, on_link, follow

    @staticmethod
    def tail_after_gradients(t: int, rings_on: dict[int, float], follow: float, edges: list) -> float:
        """The gradients task t sends to its producers are ready when it ends, its rings 1 ns
        later (their barrier waits for t too): on a link they share, FIFO runs the gradients
        first, so the rings end at least their time plus the gradients' after t."""
        ahead: dict[int, float] = {}
        for xs, _, _ in edges:
            for x in xs:
                if t in x.dst_tasks:
                    for link, dur in x.bwd_links:
                        if link in rings_on:
                            ahead[link] = ahead.get(link, 0.0) + dur
        return max((max(TICK, a) + rings_on[link] + TICK + follow for link, a in ahead.items()), default=0.0)

    def add_window(self, i: int, node: Placed, placed: list[Placed]) -> None:
        placed.append(node)
        try:
            win = window(self.S, placed, i)
        finally:
            placed.pop()
        self.windows += 1
        if win is None:
            return
        to, end = win
        dstar = end
        for m, v in to.items():
            dstar = max(dstar, v + min(placed[m].D))
        node.dstar = dstar
        node.D = [max(x, dstar) for x in node.D]
        node.contrib = max(e + p + x for e, p, x in zip(node.ef, node.pb, node.D))

    # -- bound ---------------------------------------------------------------------------------
    def boundary(self, i: int) -> list[tuple[int, float]]:
        """(op, rt) for ops up to i with an unplaced consumer: their backward tasks wait for a
        round trip through the unplaced ops (rt: `_exhaustive_tails`, or when that table is too
        big, at least rt when the consumer reads all of the output)."""
        S = self.S
        out = []
        for u in range(i + 1):
            if S.last_consumer[u] <= i:
                continue
            rt = max((S.rt[c] for c, j in S.cons[u] if c > i and S.all_read[(c, j)]), default=0.0)
            if rt > 0.0 or self.rt is not None:
                out.append((u, rt))
        return out

    def path_bound(self, i: int, node: Placed, placed: list[Placed], floor: float, boundary: list) -> float:
        """The critical-path part of the bound (cheap: no loads)."""
        out = max(floor, node.contrib, self.S.rt_suffix[i + 1])
        for u, rt in boundary:
            P = node if u == i else placed[u]
            if self.rt is None:
                out = max(out, P.contrib + rt)
            else:
                out = max(out, max(e + r + p + d for e, r, p, d in zip(P.ef, self.rt[u][P.cfg], P.pb, P.D)))
        return out

    def bound(self, i: int, node: Placed, placed: list[Placed], load: list[float], dev_work: float,
              floor: float, boundary: list, threshold: float = math.inf) -> float:
        """Lower bound of every completion of the prefix ending with `node`; the loads are left
        out when the critical path alone reaches `threshold`."""
        S, n = self.S, self.n
        out = self.path_bound(i, node, placed, floor, boundary)
        if out >= threshold:
            return out
        busiest = max(load)
        work = dev_work
        for r, v in self.load(i, node, placed).items():
            busiest = max(busiest, load[r] + v)
            if r < n:
                work += v
        return max(out, busiest, (work + S.rest_work[i + 1]) / n)

    def walk(self, configs: list[ParallelConfig]):
        """Place `configs` (a complete strategy, in op order) one op at a time as the search
        would, yielding (op index, its node, the bound of that prefix, the nodes placed before
        it); the bounds are computed in full (for checks and diagnostics)."""
        placed: list[Placed] = []
        load = [0.0] * self.nres
        work = floor = 0.0
        for i, cfg in enumerate(configs):
            node = self.place(i, cfg, placed)
            if self.S.window_ok[i]:
                self.add_window(i, node, placed)
            bound = self.bound(i, node, placed, load, work, floor, self.boundary(i))
            yield i, node, bound, placed
            placed.append(node)
            for r, v in self.load(i, node, placed).items():
                load[r] += v
                if r < self.n:
                    work += v
            floor = max(floor, node.contrib)
