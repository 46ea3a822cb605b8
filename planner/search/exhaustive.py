"""Exhaustive search: the true optimum under the simulator, for small graphs (FlexFlow sec. 8.4).

Depth-first over the ops in graph (topological) order, every configuration of the SOAP space per
op (all degree vectors, every injective assignment of the tasks to devices), pruned A*-style:
a partial strategy is abandoned when a lower bound of every completion's simulated step time is
not below the best complete strategy found so far (the *incumbent*, seeded with the best of the
baselines).  Leaves are timed with delta simulation along the search path (siblings differ in
one op), and must fit in memory.

Lower bound of a partial strategy (ops 0..i assigned; each bound is valid for the simulator's
semantics, so pruning never loses the optimum):

* **load** — every device and link must run its assigned tasks: compute of the assigned ops,
  transfers between assigned ops (forward and backward), synchronization and updates of
  parameters whose users are all assigned.  The step takes at least the busiest one.
* **average load** — that plus the least total compute any configuration of each unassigned op
  needs, spread over all devices.
* **critical path** — with ``F(v)`` a bound on when the first forward task of v can end and
  ``B(v)`` on when the first backward task of v can end: ``F(v) = fwd_min(v) + max over inputs
  u of (F(u) + x_f(u, v))`` and ``B(v) = bwd_min(v) + max(F(v), max over consumers c of (B(c) +
  x_b(c, v)))``; ``x`` is the smallest, over the receiving tasks, of the slowest piece a task
  must receive from another device (0 when unassigned); unassigned ops use their cheapest
  configuration.  An edge counts only when every task on the receiving side depends on the
  other side (a concatenation's task may read nothing of one input; a slice leaves most of its
  producer unread).

Symmetry: on a topology whose devices are interchangeable (identical devices, every pair joined
by its own identical link — one P100 node with an NVLink per pair), relabelling devices does not
change the simulated time, so only strategies whose devices appear in order 0, 1, 2, ... of first
use are visited.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from ..graph import OperatorGraph
from ..strategy import ParallelConfig, Strategy, degree_choices, enumerate_configs
from ..taskgraph import DeltaSession, TaskGraphBuilder, _union_volume
from ._memtrack import MemoryTracker


@dataclass
class ExhaustiveResult:
    strategy: Strategy
    step_time: float
    optimal: bool            # False when the time limit stopped the search first
    nodes: int               # partial strategies whose bound was computed
    leaves: int              # complete strategies simulated
    improvements: int        # times the incumbent improved
    seconds: float
    space_size: int          # strategies in the space (before symmetry and pruning)
    symmetric: bool


def devices_interchangeable(builder: TaskGraphBuilder) -> bool:
    """True when every permutation of device ids leaves every simulation unchanged."""
    topo = builder.topology
    first = topo.devices[0]
    if any((d.product, d.kind, d.memory, d.peak_flops, d.mem_bandwidth) !=
           (first.product, first.kind, first.memory, first.peak_flops, first.mem_bandwidth) for d in topo.devices):
        return False
    links = set()
    sig = None
    for a in range(topo.num_devices):
        for b in range(topo.num_devices):
            if a == b:
                continue
            route = topo.route(a, b)
            if len(route) != 1:
                return False
            link = topo.links[route[0]]
            s = (link.kind, link.bandwidth, link.latency)
            if sig is None:
                sig = s
            if s != sig or route[0] in links:
                return False
            links.add(route[0])
    return True


SPACES = ("soap", "sorted", "aligned")


def all_configs(op, num_devices: int, space: str = "soap") -> list[ParallelConfig]:
    """Configurations of one op: ``soap`` — every degree vector times every injective device
    tuple (MCMC's space); ``sorted`` — device tuples in increasing order only (which task goes to
    which device of the set is fixed); ``aligned`` — `enumerate_configs`' aligned blocks."""
    if space == "aligned":
        return enumerate_configs(op, num_devices)
    if space not in SPACES:
        raise ValueError(f"unknown space {space!r}; spaces: {', '.join(SPACES)}")
    out = []
    for degrees in degree_choices(op, num_devices):
        k = math.prod(degrees)
        tuples = (itertools.permutations(range(num_devices), k) if space == "soap"
                  else itertools.combinations(range(num_devices), k))
        for devs in tuples:
            out.append(ParallelConfig(degrees, devs))
    return out


def exhaustive_search(builder: TaskGraphBuilder, incumbent: Strategy, *, time_limit_s: float | None = None,
                      space: str = "soap", symmetry: bool | None = None, log=None) -> ExhaustiveResult:
    """The optimal strategy under the simulator (see the module docstring).

    `incumbent` is any complete strategy (the best baseline): the search only looks for strictly
    faster ones.  With `time_limit_s` the search may stop early; `optimal` then is False.
    """
    t0 = time.perf_counter()
    return _Search(builder, incumbent, time_limit_s, symmetry, log, t0, space).run()


class _Search:
    def __init__(self, builder, incumbent, time_limit_s, symmetry, log, t0, space="soap"):
        self.b = builder
        self.g: OperatorGraph = builder.graph
        self.n = builder.num_devices
        self.t0, self.limit, self.log = t0, time_limit_s, log
        # Relabelling devices maps aligned blocks to non-blocks, so symmetry needs a closed space.
        self.sym = (devices_interchangeable(builder) if symmetry is None else symmetry) and space == "soap"
        self.space_name = space
        g = self.g
        self.ops = list(g.ops)
        self.index = g.index
        self.configs = [all_configs(op, self.n, space) for op in self.ops]
        self.space = math.prod(len(c) for c in self.configs)
        self.nres = self.n + len(builder.topology.links)
        self.session = DeltaSession(builder, incumbent)
        self.memory = MemoryTracker(builder, incumbent)
        self.best = incumbent
        self.best_time = self.session.step_time if self.memory.fits() else math.inf
        self.nodes = self.leaves = self.improvements = 0
        self.stopped = False
        self._last_log = t0
        dev0 = builder.topology.devices[0]
        self._task: dict[tuple, tuple[float, float]] = {}
        self._tails: dict[tuple, float] = {}
        # Cheapest configuration of each op: for unassigned ops in the bounds.
        self.min_fwd, self.min_bwd, self.min_work = [], [], []
        for i, op in enumerate(self.ops):
            f = b = w = math.inf
            for degrees in degree_choices(op, self.n):
                tf, tb = self.task_time(i, degrees, dev0)
                f, b = min(f, tf), min(b, tb)
                w = min(w, (tf + tb) * math.prod(degrees))
            self.min_fwd.append(f)
            self.min_bwd.append(b)
            self.min_work.append(w)
        self.rest_work = [sum(self.min_work[i:]) for i in range(len(self.ops) + 1)]
        self.last_user = {p: max(self.index[u] for u in users) for p, users in g.param_users.items()}
        self.every_reads = {(k, j): _reads_nonempty(op, j, g.input_spec(op, j).shape)
                            for k, op in enumerate(self.ops) for j in range(len(op.inputs))}
        self.all_read = {(k, j): _reads_everything(op, j) for k, op in enumerate(self.ops) for j in range(len(op.inputs))}
        self.params_done_at: dict[int, list[str]] = {}
        for p, i in self.last_user.items():
            self.params_done_at.setdefault(i, []).append(p)

    def task_time(self, i: int, degrees: tuple[int, ...], device) -> tuple[float, float]:
        key = (i, degrees, device.product)
        hit = self._task.get(key)
        if hit is None:
            op = self.ops[i]
            est = self.b.cost.task_cost(op, degrees, device, self.b._in_shapes[op.name])
            hit = self._task[key] = (est.forward, est.backward)
        return hit

    # -- search --------------------------------------------------------------------------------
    def run(self) -> ExhaustiveResult:
        assigned: list[ParallelConfig] = []
        load = [0.0] * self.nres
        self._dfs(0, assigned, load, used=0)
        return ExhaustiveResult(self.best, self.best_time, not self.stopped, self.nodes, self.leaves,
                                self.improvements, time.perf_counter() - self.t0, self.space, self.sym)

    def _dfs(self, i: int, assigned: list[ParallelConfig], load: list[float], used: int) -> None:
        if self.stopped:
            return
        if i == len(self.ops):
            self._leaf(assigned)
            return
        op = self.ops[i]
        children = []
        for cfg in self.configs[i]:
            if self.sym:
                new = [d for d in cfg.devices if d >= used]
                if new != list(range(used, used + len(new))):
                    continue
            assigned.append(cfg)
            delta = self._load_delta(i, assigned)
            bound = self._bound(i, assigned, load, delta)
            assigned.pop()
            self.nodes += 1
            if bound < self.best_time * (1 - 1e-12):
                children.append((bound, cfg, delta))
        now = time.perf_counter()
        if self.limit is not None and now - self.t0 > self.limit:
            self.stopped = True
            return
        if self.log and now - self._last_log > 60:
            self._last_log = now
            self.log(f"[{now - self.t0:8.1f}s] {self.nodes} nodes, {self.leaves} leaves, at depth {i} "
                     f"({op.name}: {len(children)} of {len(self.configs[i])} configurations under the bound)")
        children.sort(key=lambda c: c[0])
        for bound, cfg, delta in children:
            if bound >= self.best_time * (1 - 1e-12):
                break  # sorted: every later child is pruned too (the incumbent only improves)
            assigned.append(cfg)
            for r, v in delta.items():
                load[r] += v
            nused = max(used, max(cfg.devices) + 1) if self.sym else used
            self._dfs(i + 1, assigned, load, nused)
            for r, v in delta.items():
                load[r] -= v
            assigned.pop()
            if self.stopped:
                return

    def _leaf(self, assigned: list[ParallelConfig]) -> None:
        self.leaves += 1
        s = self.session
        for op, cfg in zip(self.ops, assigned):
            if s.strategy[op.name] != cfg:
                s.change(op.name, cfg)
                self.memory.change(op.name, cfg)
        t = s.step_time
        if t < self.best_time and self.memory.fits():
            self.best_time, self.best = t, s.strategy.renamed("exhaustive")
            self.improvements += 1
            if self.log:
                self.log(f"[{time.perf_counter() - self.t0:8.1f}s] new best {t * 1e3:.6f} ms after "
                         f"{self.nodes} nodes, {self.leaves} leaves")

    # -- bounds --------------------------------------------------------------------------------
    def _strategy_prefix(self, assigned) -> dict[str, ParallelConfig]:
        return {self.ops[k].name: c for k, c in enumerate(assigned)}

    def _load_delta(self, i: int, assigned: list[ParallelConfig]) -> dict[int, float]:
        """Resource time op i adds once assigned: its tasks, its input transfers, and the
        synchronization and updates of parameters whose last user it is."""
        b, op, cfg = self.b, self.ops[i], assigned[i]
        topo = b.topology
        delta: dict[int, float] = {}
        for dev in cfg.devices:
            f, bw = self.task_time(i, cfg.degrees, topo.devices[dev])
            delta[dev] = delta.get(dev, 0.0) + f + bw
        for j, ref in enumerate(op.inputs):
            pcfg = assigned[self.index[ref.op]]
            itemsize = self.g[ref.op].outputs[ref.index].itemsize
            transfers, _ = b.transfers(op, j, cfg, pcfg, itemsize)
            for tr in transfers:
                for direction in ((tr.src_dev, tr.dst_dev), (tr.dst_dev, tr.src_dev)):
                    lat = topo.route_latency(*direction)
                    for li in topo.route(*direction):
                        r = self.n + li
                        delta[r] = delta.get(r, 0.0) + lat + tr.nbytes / topo.links[li].bandwidth
        params = self.params_done_at.get(i)
        if params:
            prefix = _Prefix(self._strategy_prefix(assigned))
            for p in params:
                for devs, nbytes in b.sync_groups(prefix, p):
                    r = len(devs)
                    per_edge = 2.0 * (r - 1) / r * nbytes
                    for e in range(r):
                        a, c = devs[e], devs[(e + 1) % r]
                        lat = topo.route_latency(a, c) * 2 * (r - 1)
                        for li in topo.route(a, c):
                            delta[self.n + li] = delta.get(self.n + li, 0.0) + lat + per_edge / topo.links[li].bandwidth
                spec = self.g.param_specs[p]
                itemsize = spec.nbytes // max(1, math.prod(spec.shape))
                for dev, boxes in b.holdings(prefix, p).items():
                    delta[dev] = delta.get(dev, 0.0) + b.cost.update_time(_union_volume(boxes) * itemsize, topo.devices[dev])
        return delta

    def _bound(self, i: int, assigned: list[ParallelConfig], load: list[float], delta: dict[int, float]) -> float:
        busiest = max(max(load[r] + delta.get(r, 0.0) for r in range(self.nres)), 0.0)
        total = sum(load[:self.n]) + sum(v for r, v in delta.items() if r < self.n)
        average = (total + self.rest_work[i + 1]) / self.n
        return max(busiest, average, self._critical_path(assigned))

    def _critical_path(self, assigned: list[ParallelConfig]) -> float:
        b, topo = self.b, self.b.topology
        m = len(assigned)
        F = [0.0] * len(self.ops)
        fmin, bmin = [], []
        for k, op in enumerate(self.ops):
            if k < m:
                cfg = assigned[k]
                times = [self.task_time(k, cfg.degrees, topo.devices[d]) for d in cfg.devices]
                fmin.append(min(t[0] for t in times))
                bmin.append(min(t[1] for t in times))
            else:
                fmin.append(self.min_fwd[k])
                bmin.append(self.min_bwd[k])
        # Per edge (producer u, consumer k): None when some task does not depend on the other
        # side (then the edge gives no bound), else the smallest slowest-piece time.
        xf: dict[tuple[int, int], float | None] = {}
        xb: dict[tuple[int, int], float | None] = {}
        for k, op in enumerate(self.ops):
            for j, ref in enumerate(op.inputs):
                u = self.index[ref.op]
                if k >= m:
                    xf[(u, k)] = _merge(xf.get((u, k), 0.0), 0.0 if self.every_reads[(k, j)] else None)
                    xb[(u, k)] = _merge(xb.get((u, k), 0.0), 0.0 if self.all_read[(k, j)] else None)
                    continue
                ccfg, pcfg = assigned[k], assigned[u]
                pairs = b.overlaps(op, j, ccfg.degrees, pcfg.degrees)
                itemsize = self.g[ref.op].outputs[ref.index].itemsize
                transfers, _ = b.transfers(op, j, ccfg, pcfg, itemsize)
                slow_in: dict[int, float] = {}
                slow_out: dict[int, float] = {}
                for tr in transfers:
                    t = topo.transfer_time(tr.src_dev, tr.dst_dev, tr.nbytes)
                    for ct in tr.dst_tasks:
                        slow_in[ct] = max(slow_in.get(ct, 0.0), t)
                    for pt in tr.src_tasks:
                        slow_out[pt] = max(slow_out.get(pt, 0.0), t)
                nc, npd = len(ccfg.devices), len(pcfg.devices)
                read_by = {ct for _, ct, _ in pairs}
                read_of = {pt for pt, _, _ in pairs}
                f = min(slow_in.get(t, 0.0) for t in range(nc)) if len(read_by) == nc else None
                bw = min(slow_out.get(t, 0.0) for t in range(npd)) if len(read_of) == npd else None
                xf[(u, k)] = _merge(xf.get((u, k), 0.0), f)
                xb[(u, k)] = _merge(xb.get((u, k), 0.0), bw)
        for k, op in enumerate(self.ops):
            best = 0.0
            for ref in op.inputs:
                u = self.index[ref.op]
                x = xf.get((u, k))
                if x is not None:
                    best = max(best, F[u] + x)
            F[k] = best + fmin[k]
        B = [0.0] * len(self.ops)
        out = 0.0
        for k in range(len(self.ops) - 1, -1, -1):
            best = F[k]
            for c, j, _ in self.g.consumers[self.ops[k].name]:
                ci = self.index[c]
                x = xb.get((k, ci))
                if x is not None:
                    best = max(best, B[ci] + x)
            B[k] = best + bmin[k]
            out = max(out, B[k])
        # After the backward pass, every holder of a parameter all-reduces and updates it.
        for k in range(m):
            op = self.ops[k]
            if op.params and all(self.last_user[p.name] < m for p in op.params):
                out = max(out, B[k] + self._tail(k, assigned))
        return out

    def _tail(self, k: int, assigned: list[ParallelConfig]) -> float:
        """Smallest time from the first backward task of op k to the end of the step: the
        slowest holder's ring all-reduce plus update, for each of its parameters."""
        op = self.ops[k]
        shared = any(len(self.g.param_users[p.name]) > 1 for p in op.params)
        key = (k, assigned[k])
        if not shared and key in self._tails:
            return self._tails[key]
        b, topo = self.b, self.b.topology
        prefix = _Prefix(self._strategy_prefix(assigned))
        worst = 0.0
        on_link: dict[int, float] = {}   # ring transfers of all these parameters share links
        least_update = math.inf
        for p in dict.fromkeys(q.name for q in op.params):
            ring: dict[int, float] = {}
            for devs, nbytes in b.sync_groups(prefix, p):
                r = len(devs)
                per_edge = 2.0 * (r - 1) / r * nbytes
                t = 0.0
                for a, c in zip(devs, devs[1:] + devs[:1]):
                    lat = topo.route_latency(a, c) * 2 * (r - 1)
                    for li in topo.route(a, c):
                        d_link = lat + per_edge / topo.links[li].bandwidth
                        on_link[li] = on_link.get(li, 0.0) + d_link
                        t = max(t, d_link)
                for d in devs:
                    ring[d] = max(ring.get(d, 0.0), t)
            spec = self.g.param_specs[p]
            itemsize = spec.nbytes // max(1, math.prod(spec.shape))
            for dev, boxes in b.holdings(prefix, p).items():
                upd = b.cost.update_time(_union_volume(boxes) * itemsize, topo.devices[dev])
                worst = max(worst, ring.get(dev, 0.0) + upd)
                if dev in ring:
                    least_update = min(least_update, upd)
        if on_link:
            worst = max(worst, max(on_link.values()) + (0.0 if math.isinf(least_update) else least_update))
        if not shared:
            self._tails[key] = worst
        return worst


def _merge(a: float | None, b: float | None) -> float | None:
    """Two inputs from the same producer: the bound holds only if it holds for both."""
    if a is None or b is None:
        return None
    return max(a, b)


def _reads_nonempty(op, j: int, shape) -> bool:
    """Whatever the configuration, every task of `op` reads a non-empty part of input j."""
    for m, size in zip(op.input_maps[j], shape):
        if m.dim is None:
            lo, hi = (m.lo or 0), (size if m.hi is None else m.hi)
            if hi <= lo:
                return False
        elif m.shift != 0 or m.pad >= m.kernel:
            return False
    return True


def _reads_everything(op, j: int) -> bool:
    """Whatever the configurations, every element of input j is read by some task of `op`."""
    for m in op.input_maps[j]:
        if m.dim is None:
            if m.lo is not None or m.hi is not None:
                return False
        elif m.shift != 0 or m.stride > m.kernel * m.dilation or m.pad != 0 and m.stride > 1:
            return False
    return True


class _Prefix:
    """A partial strategy that answers `strategy[op]` for the assigned ops (for builder.holdings)."""

    def __init__(self, configs: dict[str, ParallelConfig]):
        self.configs = configs

    def __getitem__(self, name: str) -> ParallelConfig:
        return self.configs[name]
