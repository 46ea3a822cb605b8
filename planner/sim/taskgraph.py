"""From (operator graph, topology, strategy) to a task graph — FlexFlow sec. 5.1.

Tasks
-----
* **Compute**: a forward and a backward task for every partition of every op, on the device the
  configuration gives it.  Durations come from the cost model (`planner.cost`).
* **Communication**: for every tensor edge producer → consumer and every pair (producer task,
  consumer device) whose regions intersect (the consumer's region includes convolution halos, see
  `planner.ir.graph.AxisMap`), one transfer of the intersection.  Pieces that several consumer tasks
  on one device need are sent once.  The gradient of the same region flows back along the reverse
  route in the backward pass.  On the same device no transfer is needed: a plain edge orders the
  tasks.
* **Parameter synchronization**: the replicas of every parameter region are synchronized after
  the backward pass (`_sync_groups`), modelled as a ring all-reduce: with *r* replicas holding
  *b* bytes, every ring edge carries ``2(r-1)/r · b`` bytes, i.e. the aggregated traffic of the
  reduce-scatter and all-gather phases, and pays ``2(r-1)`` times its route latency.  Ops that
  share a parameter (unrolled recurrent steps) all feed one synchronization, so their gradients
  accumulate first, as in the runtime.
* **Update**: an optimizer step per device per parameter it holds, after synchronization.

Routes and links
----------------
A transfer travels the route `DeviceTopology.route` gives.  It occupies *every* link of the
route, all from the producer's end on, and the consumer starts once every link is done.  On each
link it lasts ``bytes / link bandwidth + route latency``: uncontended, the transfer takes as long
as its slowest link (cut-through, not store-and-forward), and a transfer that shares any link
with other traffic queues behind it in FIFO order — the contention the paper models by treating
links as communication devices.  It is one communication task with a part per link (the paper's
one task per transfer, sec. 5.1; `planner.sim.simulator` on tasks with parts), keyed ``(..., 0)``;
a route of more than `MAX_PARTS` links becomes several such tasks ``(..., c)``.

Keys
----
Task keys are tuples of ints ``(stage, op or parameter index, ...)`` — stage 0 forward, 1
backward, 2 synchronization, 3 update — so that on a tie (equal ready times on one device, the
only case where the key decides the order) forward work goes before backward work.  They are
derived from op and task indices only, never from the order of construction, so a task graph built from scratch and one edited op by op (`DeltaSession`) name
their tasks identically and the simulator breaks ties identically.  That is what makes delta
simulation's timeline comparable, task by task, with full simulation's.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ..cost.model import CostModel
from ..errors import StrategyError
from ..ir.graph import Op, OperatorGraph
from ..ir.regions import Box, intersect, maximal, volume
from ._plans import (_MIN_TRANSFER_BYTES, PlanMemo, _sync_groups, edge_plan, op_plan, param_core, param_feed,
                     param_plan, route_columns)
from ..ir.strategy import ParallelConfig, Strategy, check_config
from . import trainer_model
from .buckets import DEFAULT_BUCKET_BYTES
from .gc_regime import gc_paused, refreeze
from .simulator import DeltaSimulator, TaskGraph, Timeline


#: Optimizer state tensors kept per parameter element (SGD with momentum: the momentum buffer;
#: Adam: first and second moments).
OPTIMIZER_STATES = {"sgd": 1, "adam": 2}


@dataclass(frozen=True)
class Transfer:
    """One piece of a tensor moving between devices (before it is split over route links)."""

    src_dev: int
    dst_dev: int
    nbytes: float
    src_tasks: tuple[int, ...]
    dst_tasks: tuple[int, ...]


class TaskGraphBuilder:
    """Builds and edits task graphs of one (graph, topology, cost model).

    Everything that does not depend on device placement — which producer tasks overlap which
    consumer tasks and by how many bytes, per-task costs, parameter holdings — is memoized per
    (op, degrees), so repeated simulations during a search pay for it once.  Each task group's
    tasks and edges are memoized too, per configuration(s) (`planner.sim._plans`), and added in bulk
    (`TaskGraph.add_tasks`, `add_edges`); the topology and cost model must not change after the
    builder is made (the cost model's own memo assumes that already).
    """

    def __init__(self, graph: OperatorGraph, topology, cost: CostModel, optimizer: str = "sgd", *,
                 runtime="auto", bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        """`runtime`: ``"auto"`` models the step as autopar's trainer runs it where the trainer's
        model applies (`planner.sim.trainer_model.trainer_calibration`: local CPU ranks) and as
        FlexFlow's idealized runtime elsewhere; a `RuntimeCalibration` forces the trainer's model
        with it; None forces FlexFlow's.  `bucket_bytes` is the trainer's all-reduce bucket size."""
        if optimizer not in OPTIMIZER_STATES:
            raise StrategyError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZER_STATES)}")
        self.graph = graph
        self.optimizer = optimizer
        self.topology = topology
        self.cost = cost
        self.num_devices = topology.num_devices
        self.num_ops = len(graph.ops)
        self._param_index = {name: i for i, name in enumerate(graph.param_specs)}
        self._in_shapes = {op.name: tuple(graph.input_spec(op, i).shape for i in range(len(op.inputs)))
                           for op in graph.ops}
        self._overlap_cache: dict = {}
        self._ranges_cache: dict = {}
        self._resource_of_link = [self.num_devices + i for i in range(len(topology.links))]
        self._route_cache: dict[tuple[int, int], tuple[float, tuple]] = {}
        self._route_columns: dict[tuple[int, int], tuple] = {}
        self._param_box_cache: dict = {}
        self._box_lists: dict = {}  # interned tuples of parameter boxes (`_holdings`)
        # Whole task groups per configuration (`planner.sim._plans`).
        self._plans = PlanMemo()
        self.runtime = trainer_model.trainer_calibration(topology, cost, graph) if runtime == "auto" else runtime
        self.bucket_bytes = bucket_bytes
        if self.runtime is not None:
            self._requires_grad = trainer_model.requires_grad(graph)
            self._batch_draw_s = trainer_model.batch_draw_time(graph, self.runtime)   # every step, every rank
            self._held: dict = {}  # (parameter, its users' configurations) -> holdings
            self._delays: dict = {}  # message key -> its latency's virtual resource

    def _delay_resource(self, key: tuple) -> int:
        """A virtual resource of its own for the latency of the message keyed `key` (the same
        for the same key for the builder's life, so every build names it alike)."""
        r = self._delays.get(key)
        if r is None:
            r = self._delays[key] = trainer_model.DELAY_BASE + len(self._delays)
        return r

    # -- memoized, placement-free pieces -----------------------------------------------------
    def _task_ranges(self, op: Op, degrees: tuple[int, ...]) -> list[dict]:
        key = (op.name, degrees)
        hit = self._ranges_cache.get(key)
        if hit is None:
            hit = [op.task_ranges(degrees, c) for c in product(*(range(d) for d in degrees))]
            self._ranges_cache[key] = hit
        return hit

    def overlaps(self, consumer: Op, j: int, cdeg: tuple[int, ...], pdeg: tuple[int, ...]) -> list[tuple[int, int, Box]]:
        """(producer task, consumer task, intersection box) for input `j` of `consumer`."""
        key = (consumer.name, j, cdeg, pdeg)
        hit = self._overlap_cache.get(key)
        if hit is not None:
            return hit
        ref = consumer.inputs[j]
        producer = self.graph[ref.op]
        out = producer.outputs[ref.index]
        shape = out.shape
        p_ranges = self._task_ranges(producer, pdeg)
        # Per producer pardim: the output axis it partitions (None: a reduction dim, all tasks).
        axis_of = [out.dims.index(p.name) if p.name in out.dims else None for p in producer.pardims]
        steps = [p.size // d for p, d in zip(producer.pardims, pdeg)]
        strides = []
        acc = 1
        for d in reversed(pdeg):
            strides.append(acc)
            acc *= d
        strides.reverse()
        result: list[tuple[int, int, Box]] = []
        for ct, cr in enumerate(self._task_ranges(consumer, cdeg)):
            cbox = consumer.input_box(j, cr, shape)
            if volume(cbox) == 0:
                continue
            coord_ranges = []
            for k, ax in enumerate(axis_of):
                if ax is None:
                    coord_ranges.append(range(pdeg[k]))
                else:
                    lo, hi = cbox[ax]
                    coord_ranges.append(range(lo // steps[k], (hi - 1) // steps[k] + 1))
            for coord in product(*coord_ranges):
                pt = sum(c * s for c, s in zip(coord, strides))
                inter = intersect(producer.output_box(ref.index, p_ranges[pt]), cbox)
                if inter is not None:
                    result.append((pt, ct, inter))
        self._overlap_cache[key] = result
        return result

    def transfers(self, consumer: Op, j: int, ccfg: ParallelConfig, pcfg: ParallelConfig,
                  itemsize: int) -> tuple[list[Transfer], list[tuple[int, int]]]:
        """Cross-device transfers and same-device (producer task, consumer task) edges of one input."""
        pieces: dict[tuple[int, int], dict[Box, list[int]]] = {}
        local: list[tuple[int, int]] = []
        for pt, ct, box in self.overlaps(consumer, j, ccfg.degrees, pcfg.degrees):
            sd, dd = pcfg.devices[pt], ccfg.devices[ct]
            if sd == dd:
                local.append((pt, ct))
            else:
                pieces.setdefault((pt, dd), {}).setdefault(box, []).append(ct)
        out = []
        for (pt, dd), boxes in pieces.items():
            nbytes = float(sum(volume(b) for b in boxes) * itemsize)
            dst = tuple(sorted({ct for cts in boxes.values() for ct in cts}))
            out.append(Transfer(pcfg.devices[pt], dd, max(nbytes, _MIN_TRANSFER_BYTES), (pt,), dst))
        return out, local

    # -- parameter holdings ------------------------------------------------------------------
    def holdings(self, strategy: Strategy, param: str) -> dict[int, list[Box]]:
        """device -> the boxes of parameter `param` (its view) that tasks on it read, less those
        another box read there contains (they change no cell it holds)."""
        users = self.graph.param_users[param]
        return self._holdings(users, [strategy[u] for u in users], param)

    def _holdings(self, users, configs, param: str) -> dict[int, list[Box]]:
        held: dict[int, set[Box]] = {}
        cache = self._param_box_cache
        seen = set()
        for user, cfg in zip(users, configs):
            key = (user, param, cfg.degrees)
            boxes = cache.get(key)
            if boxes is None:
                op = self.graph[user]
                j = next(k for k, p in enumerate(op.params) if p.name == param)
                boxes = tuple(op.param_box(j, r) for r in self._task_ranges(op, cfg.degrees))
                # Users that read equal boxes share one tuple, so equal contributions (unrolled
                # steps under one configuration) are seen as one below.
                boxes = cache[key] = self._box_lists.setdefault(boxes, boxes)
            contribution = (id(boxes), cfg.devices)
            if contribution in seen:
                continue
            seen.add(contribution)
            for dev, box in zip(cfg.devices, boxes):
                hs = held.get(dev)
                if hs is None:
                    held[dev] = {box}
                else:
                    hs.add(box)
        return {d: sorted(bs if len(bs) == 1 else maximal(bs)) for d, bs in held.items()}

    def sync_groups(self, strategy: Strategy, param: str) -> list[tuple[tuple[int, ...], float]]:
        """(sorted devices, bytes) for every set of devices that hold the same parameter cells."""
        return _sync_groups(self.holdings(strategy, param), self.graph.param_specs[param])

    # -- building ------------------------------------------------------------------------------
    def build(self, strategy: Strategy, into: "TaskGraph | DeltaSimulator | None" = None) -> TaskGraph:
        """The whole task graph of `strategy` (Algorithm 1's BuildTaskGraph)."""
        strategy.validate(self.graph, self.num_devices)
        tg = into if into is not None else TaskGraph()
        with gc_paused():
            if self.runtime is not None:
                self._add_plan(tg, self._chain_plan())
            for i, op in enumerate(self.graph.ops):
                self._add_op(tg, i, op, strategy[op.name])
            for i, op in enumerate(self.graph.ops):
                for j in range(len(op.inputs)):
                    self._add_edge_group(tg, strategy, i, op, j)
            if self.runtime is not None:
                self._add_plan(tg, self._sync_plan(strategy))
            else:
                for p in self.graph.param_specs:
                    self._add_param_group(tg, strategy, p)
            refreeze()  # in a search (`gc_regime.frozen_heap`), the collector leaves this graph alone
        return tg

    def _add_op(self, tg, i: int, op: Op, cfg: ParallelConfig) -> list:
        """Add op `i`'s compute tasks under `cfg`; returns their keys."""
        return self._add_plan(tg, self._op_plan(i, op, cfg))

    def _op_plan(self, i: int, op: Op, cfg: ParallelConfig) -> tuple:
        plan = self._plans.get((i, cfg))
        if plan is None:
            build = op_plan if self.runtime is None else trainer_model.op_plan
            plan = self._plans.put((i, cfg), build(self, i, op, cfg))
        return plan

    def _chain_plan(self) -> tuple:
        """The trainer model's static program barriers (`planner.sim.trainer_model.chain_plan`)."""
        plan = self._plans.get(("chain",))
        if plan is None:
            plan = self._plans.put(("chain",), trainer_model.chain_plan(self))
        return plan

    def _sync_plan(self, strategy: Strategy) -> tuple:
        """The trainer model's buckets, waits and optimizer steps for `strategy`'s holdings
        (`planner.sim.trainer_model.sync_plan`), memoized per holdings."""
        holdings = {}
        for p in self.graph.param_specs:
            users = self.graph.param_users[p]
            configs = tuple(strategy[u] for u in users)
            held = self._held.get((p, configs))
            if held is None:
                held = self._held[(p, configs)] = self._holdings(users, configs, p)
            holdings[p] = held
        key = ("sync", tuple((p, tuple((d, tuple(bs)) for d, bs in sorted(h.items()))) for p, h in holdings.items()))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans.put(key, trainer_model.sync_plan(self, holdings))
        return plan

    def _hops(self, src: int, dst: int) -> tuple[float, tuple[tuple[int, float, str], ...]]:
        """(route latency, ((link resource, bandwidth, label), ...)) of a device pair, memoized."""
        hit = self._route_cache.get((src, dst))
        if hit is None:
            links = self.topology.links
            hops = tuple((self._resource_of_link[li], links[li].bandwidth, links[li].label)
                         for li in self.topology.route(src, dst))
            hit = self._route_cache[(src, dst)] = (self.topology.route_latency(src, dst), hops)
        return hit

    def _route(self, src: int, dst: int) -> tuple:
        """`_hops` of a device pair as the plans of `planner.sim._plans` read it
        (`planner.sim._plans.route_columns`), memoized."""
        hit = self._route_columns.get((src, dst))
        if hit is None:
            hit = self._route_columns[(src, dst)] = route_columns(*self._hops(src, dst))
        return hit

    def _add_edge_group(self, tg, strategy: Strategy, i: int, op: Op, j: int) -> list:
        """Add the transfers (or same-device edges) of input `j` of op `i`; returns the new keys."""
        return self._add_plan(tg, self._edge_plan(strategy, i, op, j))

    def _edge_plan(self, strategy: Strategy, i: int, op: Op, j: int) -> tuple:
        ccfg, pcfg = strategy[op.name], strategy[op.inputs[j].op]
        if self.runtime is None:
            key = (i, j, ccfg, pcfg)
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans.put(key, edge_plan(self, i, op, j, ccfg, pcfg))
            return plan
        # The trainer's exchange sends an op's inputs for one peer together (`trainer_model.riders`).
        rides = trainer_model.riders(self, i, op, j, strategy)
        key = (i, j, ccfg, pcfg, rides)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans.put(key, trainer_model.edge_plan(self, i, op, j, ccfg, pcfg, rides))
        return plan

    @property
    def _edges_share_messages(self) -> bool:
        """Whether an edge's tasks depend on its consumer's other inputs (`trainer_model.riders`:
        who posts a receive and waits for a send), so that a change of one input's producer
        rebuilds them all."""
        rt = self.runtime
        return rt is not None and ((rt.post_s > 0 and rt.receives_ahead) or rt.send_wait_s > 0)

    def _add_param_group(self, tg, strategy: Strategy, param: str) -> list:
        """Ring all-reduce per sync group, then an update per device holding the parameter
        (`planner.sim._plans.param_plan`); returns the new keys."""
        return self._add_plan(tg, self._param_plan(strategy, param))

    def _param_plan(self, strategy: Strategy, param: str) -> tuple:
        configs = tuple(strategy[u] for u in self.graph.param_users[param])
        key = (param, configs)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans.put(key, param_plan(self, param, configs))
        return plan

    def _param_core(self, param: str, holdings: dict) -> tuple:
        """`planner.sim._plans.param_core`, memoized per (parameter, holdings)."""
        key = ("core", param, tuple([(d, tuple(holdings[d])) for d in sorted(holdings)]))
        core = self._plans.get(key)
        if core is None:
            core = self._plans.put(key, param_core(self, param, holdings))
        return core

    def _param_feed(self, param: str, k: int, user: str, cfg: ParallelConfig, core: tuple) -> list:
        """`planner.sim._plans.param_feed` of the k-th user of `param`, memoized per (parameter,
        user, configuration, core)."""
        key = ("feed", param, k, cfg, core[4])
        feed = self._plans.get(key)
        if feed is None:
            feed = self._plans.put(key, ((), param_feed(self, self.graph.index[user], cfg, core)))[1]
        else:
            feed = feed[1]
        return feed

    @staticmethod
    def _add_plan(tg, plan: tuple) -> list:
        tg.add_tasks(plan[0])
        tg.add_edges(plan[1])
        return list(plan[2])


def _diff(old: tuple, new: tuple) -> tuple | None:
    """How the group of plan `old` becomes that of plan `new` (same owner): (keys of the old
    tasks to remove, new tasks to add, edges both plans have that may lose an end to this
    change, edges only `old` has, edges only `new` has) — a task counts as kept only if key,
    resource, duration, kind, bytes and label are all the same.  None when the plans share no
    task (replace the group whole).

    Two plans of one parameter with the same core (`planner.sim._plans.param_plan`) differ only in
    the feeds that are not the same objects: the core's tasks and edges stay, and so do the
    feeds of the users whose configuration did not change — whose backward tasks, like the
    core's tasks, this change does not touch, so none of those edges can lose an end."""
    if len(old) > 3 and len(new) > 3:
        (oc, of), (nc, nf) = old[3], new[3]
        if oc is nc and len(of) == len(nf):
            changed = [k for k in range(len(nf)) if of[k] is not nf[k]]
            return ([], [], [], [e for k in changed for e in of[k]], [e for k in changed for e in nf[k]])
    ot, nt = old[0], new[0]
    oset = set(ot)
    keep = [t for t in nt if t in oset]
    if not keep:
        return None
    kset = set(keep)
    remove = [t[0] for t in ot if t not in kset]
    add = [t for t in nt if t not in kset]
    oe, ne = set(old[1]), new[1]
    both = [e for e in ne if e in oe]
    nset = set(ne)
    only_old = [e for e in old[1] if e not in nset]
    only_new = [e for e in ne if e not in oe]
    return remove, add, both, only_old, only_new


def _removed_keys(owned: dict, new_plans: dict, diffs: dict) -> set:
    """Keys of the tasks a change removes: every old task of a group replaced whole, the
    dropped ones of a group changed by its difference."""
    gone = set()
    for owner, plan in new_plans.items():
        d = diffs.get(owner)
        if d is not None:
            gone.update(d[0])
        else:
            old = owned.get(owner)
            if old is not None:
                gone.update(old[2])
    return gone


def _stale_edges(only_old: list, gone: set) -> bool:
    """Does an edge only the old plan has join two tasks that stay (it would survive)?"""
    return any(a not in gone and b not in gone for a, b in only_old)


class DeltaSession:
    """A strategy under incremental change: `change(op, cfg)` edits only the tasks that op's
    configuration decides — its own compute tasks, the transfers on its input and output edges,
    the synchronization and updates of its parameters — and re-times the timeline with delta
    simulation (FlexFlow sec. 5.3, Algorithm 2; see `planner.sim.simulator`).

    The task graph is a function of the strategy (keys never depend on the order of edits), so a
    change that brings back the strategy from before the previous change — a rejected proposal
    taken back — restores the graph from before it exactly, and the session tells the simulator
    so instead of having it compare every edited edge.

    The changed ops' compute groups are replaced whole; every other affected group (the
    transfers of an edge, a parameter's synchronization) is edited by the difference between its
    old and its new plan: tasks identical in every field stay, with their edges, and only edges
    the new plan adds, or whose end this change removed and re-added, are added.  A parameter
    shared by 40 unrolled steps has every step's backward tasks feeding its ring on each
    device; a change of one step's configuration that leaves the cells each device holds as
    they were keeps the plan's core and the other 39 feeds (the same memoized objects,
    `planner.sim._plans.param_plan`), so computing the difference and applying it touch that step's
    edges only.  A group whose new plan drops an edge between two tasks that both stay is
    replaced whole instead (edge removals are the slow edit)."""

    def __init__(self, builder: TaskGraphBuilder, strategy: Strategy):
        self.builder = builder
        strategy.validate(builder.graph, builder.num_devices)
        self.strategy = strategy
        self._before: tuple | None = None  # configs before the last change
        self._replaced: dict[tuple, tuple] = {}  # the plans that change replaced, per owner
        self._owned: dict[tuple, tuple] = {}     # owner -> the plan its tasks and edges came from
        self.sim = DeltaSimulator(TaskGraph(), track=False)
        g = builder.graph
        with gc_paused():
            if builder.runtime is not None:
                self._owned[("chain",)] = plan = builder._chain_plan()
                builder._add_plan(self.sim, plan)
            for i, op in enumerate(g.ops):
                self._owned[("op", i)] = plan = builder._op_plan(i, op, strategy[op.name])
                builder._add_plan(self.sim, plan)
            for i, op in enumerate(g.ops):
                for j in range(len(op.inputs)):
                    self._owned[("edge", i, j)] = plan = builder._edge_plan(strategy, i, op, j)
                    builder._add_plan(self.sim, plan)
            if builder.runtime is not None:
                self._owned[("sync",)] = plan = builder._sync_plan(strategy)
                builder._add_plan(self.sim, plan)
            else:
                for p in g.param_specs:
                    self._owned[("param", p)] = plan = builder._param_plan(strategy, p)
                    builder._add_plan(self.sim, plan)
            self.sim.resimulate()
            refreeze()  # in a search (`gc_regime.frozen_heap`), the collector leaves this graph alone

    @property
    def step_time(self) -> float:
        return self.sim.makespan

    def timeline(self) -> Timeline:
        return self.sim.timeline()

    def change(self, op_name: str, cfg: ParallelConfig) -> float:
        """Apply a new configuration for one op; return the new simulated step time."""
        return self.change_many({op_name: cfg})

    def change_many(self, changes: dict[str, ParallelConfig]) -> float:
        """New configurations for several ops at once: every affected task group is rebuilt,
        then one delta simulation re-times the step.  Returns the new simulated step time."""
        with gc_paused():
            try:
                return self._change_many(changes)
            finally:
                refreeze()  # in a search, what the change built joins the frozen heap

    def _change_many(self, changes: dict[str, ParallelConfig]) -> float:
        b = self.builder
        g = b.graph
        strategy = self.strategy
        ops: dict[int, None] = {}
        edges: dict[tuple, None] = {}
        params: dict[str, None] = {}
        for name, cfg in changes.items():
            op = g[name]
            check_config(op, cfg, b.num_devices)
            if strategy[name] == cfg:
                continue
            i = g.index[name]
            ops[i] = None
            for j in range(len(op.inputs)):
                edges[("edge", i, j)] = None
            for c, j, _ in g.consumers[name]:
                ci = g.index[c]
                for jj in range(len(g.ops[ci].inputs)) if b._edges_share_messages else (j,):
                    edges[("edge", ci, jj)] = None
            for p in op.params:
                params[p.name] = None
            strategy = strategy.with_config(name, cfg)
        if not ops:
            return self.sim.makespan
        sim = self.sim
        restores = strategy.configs == self._before
        if restores and sim.can_rollback():
            # The previous change taken back (a rejected proposal): undo its edits from the
            # simulator's journal and bring back the timeline from before it.
            sim.rollback()
            self._owned.update(self._replaced)
            self._before, self._replaced = None, {}
            self.strategy = strategy
            return sim.makespan
        # Every affected group's new plan; an op group is replaced whole, the other groups by
        # their difference from the old plan (`_diff`).
        owned = self._owned
        new_plans = {("op", i): b._op_plan(i, g.ops[i], strategy.configs[i]) for i in ops}
        for owner in edges:
            ci, j = owner[1], owner[2]
            new_plans[owner] = b._edge_plan(strategy, ci, g.ops[ci], j)
        if b.runtime is not None:
            if params:
                new_plans[("sync",)] = b._sync_plan(strategy)
        else:
            for p in params:
                new_plans[("param", p)] = b._param_plan(strategy, p)
        diffs = {}
        for owner, plan in new_plans.items():
            old = owned.get(owner)
            if owner[0] != "op" and old is not None:
                d = _diff(old, plan)
                if d is not None:
                    diffs[owner] = d
        gone = _removed_keys(owned, new_plans, diffs)  # keys of every task this change removes
        if diffs and any(_stale_edges(d[3], gone) for d in diffs.values()):
            # An edge the new plan drops between tasks that both stay: replace those groups whole.
            # (Replacing more only removes more, so the other groups stay free of stale edges.)
            diffs = {o: d for o, d in diffs.items() if not _stale_edges(d[3], gone)}
            gone = _removed_keys(owned, new_plans, diffs)
        replaced = {}
        for owner, plan in new_plans.items():
            old = replaced[owner] = owned.get(owner)
            d = diffs.get(owner)
            if d is not None:
                sim.remove_tasks(d[0])
            elif old is not None:
                sim.remove_tasks(old[2])
        self._replaced = replaced
        self._before = self.strategy.configs
        self.strategy = strategy
        for owner, plan in new_plans.items():
            owned[owner] = plan
            d = diffs.get(owner)
            if d is not None:
                sim.add_tasks(d[1])
                # Edges only the new plan has, and kept ones that lost an end this change re-added.
                sim.add_edges(d[4] + [e for e in d[2] if e[0] in gone or e[1] in gone])
            else:
                b._add_plan(sim, plan)
        sim.resimulate(restores=restores)
        return sim.makespan
