"""Exhaustive search: the true optimum under the simulator, for small graphs (FlexFlow sec. 8.4).

Depth-first over the ops in graph (topological) order, every configuration of the SOAP space per
op (all degree vectors, every injective assignment of the tasks to devices), branch and bound:
a partial strategy (ops ``0..i`` configured) is abandoned when a lower bound of the simulated step
time of *every* completion is not below the best complete strategy found so far (the
*incumbent*: the fastest of the strategies the caller passes — baselines, MCMC's result, the
optimum of a smaller space).  Children are visited cheapest bound first.  Leaves are timed with
delta simulation along the search path (siblings differ in one op) and must fit in memory.
Pruning never loses a faster strategy (up to a relative 1e-12, the margin that absorbs rounding
between bounds and simulated times), so the result is optimal.

Every bound below holds for the simulator's semantics (`planner.sim.simulator`: a task starts when
all its predecessors have ended and its resource is free, resources run FIFO by (ready, key))
and the task graph `planner.sim.taskgraph` builds; durations include its 1 ns floor.

* **Load.**  Every device and link runs all its tasks: compute of the configured ops, both
  directions of transfers between them, rings and updates of parameters whose users are all
  configured.  The busiest resource bounds the step; so does the total device work plus the
  cheapest work of each unconfigured op, spread over all devices.
* **Critical path, per task.**  ``ef(x)``, a lower bound on the end of task x's forward task,
  is exact longest-path arithmetic over the configured producers (a transfer lasts at least its
  route latency plus bytes over the slowest link).  ``D(x)`` bounds ``step - end(backward x)``:
  the gradient it sends to each producer task it read (plus that task's backward duration and
  ``D``), the ring all-reduce and updates of its parameters once all their users are configured
  (rings sharing a link run one after another; the gradients x sends are ready when x ends,
  before its rings' barrier, so on a shared link FIFO runs them first), and the windows below.
  ``D`` of a task is fixed when its op is placed, since only earlier ops follow it in the
  backward pass.  So the step lasts at least ``ef + pb + D`` for every configured task, and
  ``ef + rt + pb + D`` for one whose op has unconfigured consumers, rt the least round trip from
  its forward end to its backward's ready time over all configurations of the later ops (the
  memoized tails of `_exhaustive_tails`), and at least `Static.rt` of any unconfigured op.
* **FIFO windows** (`_exhaustive_windows`): when an op whose parameters it alone uses is placed,
  ``T_m >= T_k + to[m]`` and ``step >= T_k + end`` for the end ``T`` of an op's last backward task,
  counting the updates FIFO provably runs before later backward tasks and the gradients and
  rings it provably queues behind k's rings.  With ``step >= T_m + min_t D(m, t)`` (t may be
  the last task of m) this gives ``D(k, t) >= D*(k) = max(end, to[m] + min_t D(m, t))``.

Symmetry: on a topology whose devices are interchangeable (identical devices, every pair joined
by its own identical link — one P100 node with an NVLink per pair), relabelling devices does not
change the simulated time, so only strategies whose devices appear in order 0, 1, 2, ... of first
use are visited.

Cost: transfers per (op, input, configuration, producer configuration) and rings, updates and
tails per (op, configuration) are memoized; the critical-path part of a child's bound is checked
before its loads, and its window only when that does not prune it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Iterable

from ..ir.graph import OperatorGraph
from ..ir.strategy import ParallelConfig, Strategy, degree_choices, enumerate_configs
from ..sim.taskgraph import DeltaSession, TaskGraphBuilder
from ._exhaustive_bound import Bounds, Placed
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
    windows: int = 0         # FIFO windows computed


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


def exhaustive_search(builder: TaskGraphBuilder, incumbent: Strategy | Iterable[Strategy], *,
                      time_limit_s: float | None = None, space: str = "soap", symmetry: bool | None = None,
                      log=None) -> ExhaustiveResult:
    """The optimal strategy under the simulator (see the module docstring).

    `incumbent` is one complete strategy or several (baselines, MCMC's result): the search starts
    from the fastest that fits and only looks for strictly faster ones.  With `time_limit_s` the
    search may stop early; `optimal` then is False.
    """
    t0 = time.perf_counter()
    starts = [incumbent] if isinstance(incumbent, Strategy) else list(incumbent)
    if not starts:
        raise ValueError("exhaustive_search needs at least one incumbent strategy (a baseline such as data parallelism)")
    return _Search(builder, starts, time_limit_s, symmetry, log, t0, space).run()


class _Search:
    def __init__(self, builder, starts, time_limit_s, symmetry, log, t0, space="soap"):
        self.b = builder
        self.g: OperatorGraph = builder.graph
        self.n = builder.num_devices
        self.t0, self.limit, self.log = t0, time_limit_s, log
        # Relabelling devices maps aligned blocks to non-blocks, so symmetry needs a closed space.
        self.sym = (devices_interchangeable(builder) if symmetry is None else symmetry) and space == "soap"
        self.ops = list(self.g.ops)
        self.N = len(self.ops)
        self.configs = [all_configs(op, self.n, space) for op in self.ops]
        self.space = math.prod(len(c) for c in self.configs)
        self.B = Bounds(builder, self.configs)
        self.S, self.rt = self.B.S, self.B.rt
        self.nres = self.n + len(builder.topology.links)
        self.best, self.best_time = None, math.inf
        for s in starts:
            s.validate(self.g, self.n)
            mem = MemoryTracker(builder, s)
            t = DeltaSession(builder, s).step_time if mem.fits() else math.inf
            if self.best is None or t < self.best_time:
                self.best, self.best_time = s, t
        self.session = DeltaSession(builder, self.best)
        self.memory = MemoryTracker(builder, self.best)
        self.nodes = self.leaves = self.improvements = 0
        self._pos: list[tuple[int, int]] = []   # (child, children) per depth of the current path
        self.stopped = False
        self._last_log = t0

    # -- search --------------------------------------------------------------------------------
    def run(self) -> ExhaustiveResult:
        self._dfs(0, [], [0.0] * self.nres, 0.0, 0, 0.0)
        return ExhaustiveResult(self.best, self.best_time, not self.stopped, self.nodes, self.leaves,
                                self.improvements, time.perf_counter() - self.t0, self.space, self.sym, self.B.windows)

    def _threshold(self) -> float:
        return self.best_time * (1 - 1e-12)

    def _dfs(self, i: int, placed: list[Placed], load: list[float], dev_work: float, used: int, floor: float) -> None:
        if i == self.N:
            self._leaf(placed)
            return
        S, B = self.S, self.B
        boundary = B.boundary(i)
        children = []
        for cfg in self.configs[i]:
            if self.sym:
                new = [d for d in cfg.devices if d >= used]
                if new != list(range(used, used + len(new))):
                    continue
            node = B.place(i, cfg, placed)
            self.nodes += 1
            bound = B.bound(i, node, placed, load, dev_work, floor, boundary, self._threshold())
            if bound < self._threshold() and S.window_ok[i]:
                B.add_window(i, node, placed)
                bound = B.bound(i, node, placed, load, dev_work, floor, boundary, self._threshold())
            if bound < self._threshold():
                children.append((bound, len(children), node))
        now = time.perf_counter()
        if self.limit is not None and now - self.t0 > self.limit:
            self.stopped = True
            return
        if self.log and now - self._last_log > 60:
            self._last_log = now
            where = " > ".join(f"{k + 1}/{n}" for k, n in self._pos[:4])
            self.log(f"[{now - self.t0:8.1f}s] {self.nodes} nodes, {self.leaves} leaves, at depth {i} "
                     f"({self.ops[i].name}: {len(children)} of {len(self.configs[i])} configurations under the bound); "
                     f"child {where} of the first depths")
        children.sort(key=lambda c: c[:2])
        self._pos.append((0, len(children)))
        for k, (bound, _, node) in enumerate(children):
            self._pos[-1] = (k, len(children))
            if bound >= self._threshold():
                break  # sorted: every later child is pruned too (the incumbent only improves)
            placed.append(node)
            work = 0.0
            for r, v in B.load(i, node, placed).items():
                load[r] += v
                if r < self.n:
                    work += v
            nused = max(used, max(node.cfg.devices) + 1) if self.sym else used
            self._dfs(i + 1, placed, load, dev_work + work, nused, max(floor, node.contrib))
            for r, v in node.delta.items():
                load[r] -= v
            placed.pop()
            if self.stopped:
                break
        self._pos.pop()

    def _walk(self, configs: list[ParallelConfig]):
        """`Bounds.walk`: the bound of every prefix of a complete strategy (for checks)."""
        return self.B.walk(configs)

    def _leaf(self, placed: list[Placed]) -> None:
        self.leaves += 1
        s = self.session
        for op, node in zip(self.ops, placed):
            if s.strategy[op.name] != node.cfg:
                s.change(op.name, node.cfg)
                self.memory.change(op.name, node.cfg)
        t = s.step_time
        if t < self.best_time and self.memory.fits():
            self.best_time, self.best = t, s.strategy.renamed("exhaustive")
            self.improvements += 1
            if self.log:
                self.log(f"[{time.perf_counter() - self.t0:8.1f}s] new best {t * 1e3:.6f} ms after "
                         f"{self.nodes} nodes, {self.leaves} leaves")
