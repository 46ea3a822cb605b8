"""Facts about a graph that hold for *every* strategy, for the exhaustive search's bounds.

Computed once per search (`Static`), used by `planner.search.exhaustive` and
`planner.search._exhaustive_windows`.  Each is a property of the task graph `TaskGraphBuilder`
builds (see `planner.sim.taskgraph`), whatever the configurations:

* ``every_reads[(v, j)]`` — every task of op v reads a non-empty part of input j, so its
  backward task sends a gradient to some task of the producer (exact, from the axis maps: the
  extreme one-element ranges of each partitioned dimension decide it).
* ``all_read[(v, j)]`` — every element of input j is read by some task of v, so every task of
  the producer feeds some task of v forward and receives a gradient from it.
* ``bound_from[k]`` — ops every task of which is an ancestor of some backward task of op k
  (k itself and, recursively, consumers of such an op with ``every_reads``).
* ``upstream_of[k]`` — ops every forward task of which is an ancestor of some forward task of
  op k (k itself and, recursively, producers of such an op with ``all_read``).
* ``rt[v]`` — for any task c of op v: the end of its backward task minus the ready time of its
  forward task is at least ``fmin(v) + bmin(v) + max rt`` over consumers with ``all_read``.
* ``gap[(m, k)]`` — for m after k: the last backward task of k ends at least this long after the
  last backward task of m (a chain of ``every_reads`` producers from m down to k, each adding its
  cheapest backward task); absent when there is no such chain.
* ``maxring[m][l]`` — the most ring all-reduce time the parameters of op m can put on link l, over
  all configurations of m (None when m shares a parameter with another op).
* ``edge_ub[(v, j)][l]`` — the most transfer time one direction of edge j of op v can put on link
  l: per ordered device pair routed over l, at most (tasks of the producer per device) transfers
  of at most the whole tensor.

All durations include the simulator's 1 ns floor for free tasks (`sim.MIN_TASK_SECONDS`).
"""

from __future__ import annotations

import math

from ..ir.regions import union_volume
from ..ir.strategy import ParallelConfig, degree_choices
from ..sim import MIN_TASK_SECONDS, TaskGraphBuilder

TICK = MIN_TASK_SECONDS
#: Margin for strict comparisons between bounds summed in different orders (times are ~1e-4 s,
#: rounding errors ~1e-19 s; real gaps are either 0 or at least a nanosecond).
EPS = 1e-15
NEG = -math.inf


class Static:
    def __init__(self, builder: TaskGraphBuilder, configs: list[list[ParallelConfig]]):
        self.b = builder
        g = self.g = builder.graph
        topo = builder.topology
        self.n = builder.num_devices
        self.nlinks = len(topo.links)
        self.ops = list(g.ops)
        self.N = len(self.ops)
        self.index = g.index
        self._task: dict = {}
        self._xfer: dict = {}
        idx = self.index
        self.prods = [[idx[ref.op] for ref in op.inputs] for op in self.ops]
        self.cons: list[list[tuple[int, int]]] = [[] for _ in self.ops]
        for v, op in enumerate(self.ops):
            for j, ref in enumerate(op.inputs):
                self.cons[idx[ref.op]].append((v, j))
        self.last_consumer = [max((c for c, _ in cs), default=-1) for cs in self.cons]
        self.every_reads, self.all_read = {}, {}
        for v, op in enumerate(self.ops):
            for j in range(len(op.inputs)):
                shape = g.input_spec(op, j).shape
                self.every_reads[(v, j)] = every_task_reads(op, j, shape)
                self.all_read[(v, j)] = all_elements_read(op, j, shape)
        products = {d.product: d for d in topo.devices}
        self.fmin, self.bmin, self.min_work = [], [], []
        for i, op in enumerate(self.ops):
            f = bw = w = math.inf
            for degrees in degree_choices(op, self.n):
                for dev in products.values():
                    tf, tb = self.task_time(i, degrees, dev)
                    f, bw, w = min(f, tf), min(bw, tb), min(w, (tf + tb) * math.prod(degrees))
            self.fmin.append(f)
            self.bmin.append(bw)
            self.min_work.append(w)
        self.rest_work = [sum(self.min_work[i:]) for i in range(self.N + 1)]
        self.rt = [0.0] * self.N
        for v in range(self.N - 1, -1, -1):
            after = max((self.rt[c] for c, j in self.cons[v] if self.all_read[(c, j)]), default=0.0)
            self.rt[v] = self.fmin[v] + self.bmin[v] + after
        self.rt_suffix = [max(self.rt[i:], default=0.0) for i in range(self.N + 1)]
        self.bound_from = [self._bound_from(k) for k in range(self.N)]
        self.upstream_of = [self._upstream_of(k) for k in range(self.N)]
        self.gap = {}
        for m in range(self.N):
            dist = {m: 0.0}
            for v in range(m, -1, -1):
                if v not in dist:
                    continue
                for j, u in enumerate(self.prods[v]):
                    if self.every_reads[(v, j)]:
                        dist[u] = max(dist.get(u, NEG), dist[v] + self.bmin[u])
            for k, d in dist.items():
                if k != m:
                    self.gap[(m, k)] = d
        # Parameters: users (op indices), whether shared, index in the builder's numbering.
        self.users = {p: [idx[u] for u in us] for p, us in g.param_users.items()}
        self.last_user = {p: max(us) for p, us in self.users.items()}
        self.first_user = {p: min(us) for p, us in self.users.items()}
        self.params_of = [list(dict.fromkeys(p.name for p in op.params)) for op in self.ops]
        self.params_first_at: list[list[str]] = [[] for _ in self.ops]
        for p, i in self.first_user.items():
            self.params_first_at[i].append(p)
        self.params_last_at: list[list[str]] = [[] for _ in self.ops]
        for p, i in self.last_user.items():
            self.params_last_at[i].append(p)
        self.pindex = builder._param_index
        shared = {p for p, us in self.users.items() if len(us) > 1}
        self.has_shared = [any(p in shared for p in ps) for ps in self.params_of]
        # Windows need every ring on a link to be known or bounded: no parameter may be shared
        # between an op up to k and one after it, and no op after k may share parameters.
        self.window_ok = []
        for k in range(self.N):
            ok = bool(self.params_of[k]) and not self.has_shared[k]
            ok = ok and not any(self.has_shared[m] for m in range(k + 1, self.N))
            ok = ok and not any(min(us) <= k < max(us) for us in self.users.values())
            self.window_ok.append(ok)
        self.max_per_dev = [max((max(c.devices.count(d) for d in set(c.devices)) for c in cs), default=1)
                            for cs in configs]
        self.maxring = [self._max_ring(m, configs[m]) if self.params_of[m] and not self.has_shared[m] else None
                        for m in range(self.N)]
        self.ring_ops = [m for m in range(self.N) if self.params_of[m]]
        self.edge_ub = {}
        for v, op in enumerate(self.ops):
            for j, ref in enumerate(op.inputs):
                out = g[ref.op].outputs[ref.index]
                self.edge_ub[(v, j)] = self._edge_ub(self.prods[v][j], max(1.0, float(math.prod(out.shape) * out.itemsize)))

    # -- per-task costs ---------------------------------------------------------------------
    def task_time(self, i: int, degrees: tuple[int, ...], device) -> tuple[float, float]:
        """(forward, backward) seconds of one task as the task graph has them (1 ns floor)."""
        key = (i, degrees, device.product)
        hit = self._task.get(key)
        if hit is None:
            op = self.ops[i]
            est = self.b.cost.task_cost(op, degrees, device, self.b._in_shapes[op.name])
            hit = self._task[key] = (max(est.forward, TICK), max(est.backward, TICK))
        return hit

    def link_tasks(self, src: int, dst: int, nbytes: float, latency_mult: int = 1) -> list[tuple[int, float]]:
        """(link, duration) of every link task of one transfer, as `TaskGraphBuilder` makes them."""
        if src == dst:
            return []
        latency, hops = self.b._hops(src, dst)
        lat = latency * latency_mult
        return [(res - self.n, lat + nbytes / bw) for res, bw, _ in hops]

    def xfer_times(self, src: int, dst: int, nbytes: float) -> tuple[float, float]:
        """(forward, backward) time of one transfer: its slowest link task each way, memoized."""
        key = (src, dst, nbytes)
        hit = self._xfer.get(key)
        if hit is None:
            hit = self._xfer[key] = (max(d for _, d in self.link_tasks(src, dst, nbytes)),
                                     max(d for _, d in self.link_tasks(dst, src, nbytes)))
        return hit

    def rings(self, prefix, param: str) -> "Rings":
        """Ring tasks and updates of one parameter under `prefix` (every user configured)."""
        b = self.b
        groups = []
        for devs, nbytes in b.sync_groups(prefix, param):
            r = len(devs)
            per_edge = 2.0 * (r - 1) / r * nbytes
            tasks = []
            for e in range(r):
                tasks += self.link_tasks(devs[e], devs[(e + 1) % r], per_edge, 2 * (r - 1))
            own: dict[int, float] = {}
            for link, dur in tasks:
                own[link] = own.get(link, 0.0) + dur
            groups.append(Group(frozenset(devs), tasks, own))
        spec = self.g.param_specs[param]
        itemsize = spec.nbytes // max(1, math.prod(spec.shape))
        devices = b.topology.devices
        upd = {d: max(b.cost.update_time(union_volume(boxes) * itemsize, devices[d], b.optimizer), TICK)
               for d, boxes in b.holdings(prefix, param).items()}
        return Rings(param, self.pindex[param], groups, upd)

    # -- graph facts ------------------------------------------------------------------------
    def _bound_from(self, k: int) -> frozenset[int]:
        out = {k}
        for v in range(k + 1, self.N):
            if any(u in out and self.every_reads[(v, j)] for j, u in enumerate(self.prods[v])):
                out.add(v)
        return frozenset(out)

    def _upstream_of(self, k: int) -> frozenset[int]:
        out = {k}
        for v in range(k - 1, -1, -1):
            if any(c in out and self.all_read[(c, j)] for c, j in self.cons[v]):
                out.add(v)
        return frozenset(out)

    def _max_ring(self, m: int, configs: list[ParallelConfig]) -> list[float]:
        best = [0.0] * self.nlinks
        name = self.ops[m].name
        for cfg in configs:
            prefix = Prefix({name: cfg})
            load = [0.0] * self.nlinks
            for p in self.params_of[m]:
                for grp in self.rings(prefix, p).groups:
                    for link, dur in grp.own.items():
                        load[link] += dur
            best = [max(a, c) for a, c in zip(best, load)]
        return best

    def _edge_ub(self, producer: int, nbytes: float) -> list[float]:
        out = [0.0] * self.nlinks
        per = self.max_per_dev[producer]
        for a in range(self.n):
            for c in range(self.n):
                for link, dur in self.link_tasks(a, c, nbytes):
                    out[link] += per * dur
        return out


class Group:
    """One ring all-reduce group: its device set, its link tasks, and their time per link."""

    __slots__ = ("devset", "tasks", "own")

    def __init__(self, devset: frozenset[int], tasks: list[tuple[int, float]], own: dict[int, float]):
        self.devset, self.tasks, self.own = devset, tasks, own


class Rings:
    """Synchronization of one parameter: its groups and the update time on each holder."""

    __slots__ = ("param", "pi", "groups", "upd")

    def __init__(self, param: str, pi: int, groups: list[Group], upd: dict[int, float]):
        self.param, self.pi, self.groups, self.upd = param, pi, groups, upd


class Prefix:
    """A partial strategy that answers `strategy[op]` for the configured ops (for builder.holdings)."""

    def __init__(self, configs: dict[str, ParallelConfig]):
        self.configs = configs

    def __getitem__(self, name: str) -> ParallelConfig:
        return self.configs[name]


def every_task_reads(op, j: int, shape) -> bool:
    """Whatever the configuration, every task of `op` reads a non-empty part of input j."""
    for m, size in zip(op.input_maps[j], shape):
        if m.dim is None:
            lo, hi = (m.lo or 0), (size if m.hi is None else m.hi)
            if hi <= lo:
                return False
            continue
        extent = (m.kernel - 1) * m.dilation + 1
        first = -m.pad + m.shift                              # the task holding only index 0
        last = (op.pardim(m.dim).size - 1) * m.stride - m.pad + m.shift   # ... only the last index
        if first + extent <= 0 or last >= size:
            return False
    return True


def all_elements_read(op, j: int, shape) -> bool:
    """Whatever the configuration, every element of input j is read by some task of `op`."""
    for m, size in zip(op.input_maps[j], shape):
        if m.dim is None:
            if (m.lo or 0) > 0 or (size if m.hi is None else m.hi) < size:
                return False
            continue
        extent = (m.kernel - 1) * m.dilation + 1
        start = -m.pad + m.shift
        end = (op.pardim(m.dim).size - 1) * m.stride - m.pad + m.shift + extent
        if m.stride > extent or start > 0 or end < size:
            return False
    return True
