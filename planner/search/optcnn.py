"""OptCNN: layer-wise parallelization, optimal under its own cost model (OptCNN sec. 5).

    result = optcnn(graph, topology, CostModel())
    result.strategy, result.cost, result.seconds

The cost model (`_optcnn_tables`) sums per layer compute and synchronization times and per edge
transfer times with no overlap between layers (eq. 1).  Minimising that sum over one
configuration per layer is a pairwise optimisation problem, solved exactly by OptCNN's node and
edge eliminations, the enumeration of the final graph and the undoing of the eliminations
(`_elimination`, Algorithm 1; Theorems 1 and 2 make the result optimal).

Layers.  OptCNN gives every *layer* one configuration.  In our operator graphs a layer is a set
of ops that share parameters — the unrolled steps of one recurrent cell are one layer, exactly
like the grey boxes of FlexFlow's Figure 14 — so those ops are tied to one variable (when their
parallel dims agree).  If the tied graph is still too wide to enumerate (NMT's per-step attention
links every decoder step with the encoder's whole output), parameter-free ops created by the same
line of model code with the same shapes — the per-step copies of one layer of the unrolled loop —
are tied as well, and the problem is solved again; `OptCNNResult.tying` says which was used.
CNNs never need the second level: Inception-v3 and ResNet-101 reduce completely with node, edge
and leaf eliminations, as the paper reports (a final graph of two layers, here folded by leaf
elimination too).

What OptCNN cannot express, by design: inter-layer parallelism (its cost is a sum), placements
other than aligned blocks of consecutive devices, and different configurations for the steps of
one recurrent layer.  FlexFlow's MCMC search (`planner.search.mcmc`) starts from its result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..cost.model import CostModel
from ..errors import StrategyError
from ..hardware.topology import DeviceTopology
from ..ir.graph import OperatorGraph
from ..ir.strategy import Strategy
from ._elimination import DEFAULT_MAX_WORK, EliminationStats, EliminationTooLarge, PairwiseProblem, plan_order, solve
from ._optcnn_tables import Tables

#: Per-op cap on the tasks of all configurations together (`optcnn_configs`).  Transfer tables
#: are (tasks of the producer's configurations) x (tasks of the consumer's), so this bounds their
#: cost; at 16 devices no op of the zoo needs thinning with first-block placements, at 64 the
#: configurations with fewer partitioned dimensions are kept.
DEFAULT_MAX_TASKS = 512
AUTO_ALIGNED_UP_TO = 8
#: Work (table entries) below which tying by parameters alone is kept even if call-site tying
#: would be cheaper: finer layers can only lower OptCNN's cost.
PREFER_PARAMETER_TYING_UP_TO = 3e7


@dataclass(frozen=True)
class OptCNNResult:
    strategy: Strategy
    cost: float            # predicted step time under OptCNN's cost model (seconds)
    seconds: float         # wall time of the search
    ops: int
    layers: int            # groups of ops that take one configuration
    tying: str             # "parameters" or "parameters+call-site"
    configs: int           # configurations over all layers
    thinned_ops: int       # ops whose configuration list was cut to max_tasks
    stats: EliminationStats

    def summary(self) -> str:
        s = self.stats
        return (f"OptCNN: {self.ops} ops as {self.layers} layers (tying by {self.tying}); "
                f"{s.edge_eliminations} edge, {s.node_eliminations} node and {s.leaf_eliminations} leaf "
                f"eliminations, final graph of {s.final_variables} layers; cost {self.cost * 1e3:.3f} ms; "
                f"{self.seconds:.2f} s")


def optcnn(graph: OperatorGraph, topology: DeviceTopology, cost: CostModel, *,
           max_tasks: int | None = DEFAULT_MAX_TASKS, placements: str = "auto",
           max_work: float = DEFAULT_MAX_WORK) -> OptCNNResult:
    """The optimal strategy under OptCNN's cost model (see the module docstring)."""
    t0 = time.perf_counter()
    if placements == "auto":
        placements = "aligned" if topology.num_devices <= AUTO_ALIGNED_UP_TO else "first"
    tables = Tables(graph, topology, cost, max_tasks, placements)
    tying, layers, work = "parameters", _Layers(graph, tables, call_site=False), 0.0
    _, work, _ = plan_order(layers.problem(with_tables=False))
    if work > PREFER_PARAMETER_TYING_UP_TO:
        finer = _Layers(graph, tables, call_site=True)
        _, work2, _ = plan_order(finer.problem(with_tables=False))
        if work2 < work:
            tying, layers, work = "parameters+call-site", finer, work2
    try:
        assignment, total, stats = solve(layers.problem(), max_work=max_work)
    except EliminationTooLarge as e:
        raise StrategyError(f"OptCNN cannot solve {graph.name} on {topology.name}: {e}") from e
    strategy = Strategy.from_mapping(graph, layers.configs(assignment), "optcnn")
    return OptCNNResult(strategy, float(total), time.perf_counter() - t0, len(graph.ops), layers.num_layers, tying,
                        sum(layers.sizes), tables.thinned, stats)


def optcnn_cost(graph: OperatorGraph, topology: DeviceTopology, cost: CostModel, strategy: Strategy, *,
                max_tasks: int | None = DEFAULT_MAX_TASKS, placements: str = "aligned",
                call_site: bool = False) -> float:
    """OptCNN's predicted step time of `strategy`, whose configurations must lie in its space
    and agree within each tied layer."""
    layers = _Layers(graph, Tables(graph, topology, cost, max_tasks, placements), call_site)
    problem = layers.problem()
    assignment = []
    for v, members in enumerate(layers.groups):
        cfgs = {strategy[m] for m in members}
        if len(cfgs) != 1:
            raise StrategyError(f"ops {', '.join(members[:4])} form one OptCNN layer but have different configurations")
        cfg = cfgs.pop()
        try:
            assignment.append(layers.tables.configs[members[0]].index(cfg))
        except ValueError:
            raise StrategyError(f"op {members[0]}: configuration {cfg.describe(graph[members[0]])} is not in "
                                "OptCNN's space (degrees on an aligned block of consecutive devices)") from None
    return problem.cost(assignment)


# -- layers ------------------------------------------------------------------------------------

def _tie(graph: OperatorGraph, call_site: bool) -> list[list[str]]:
    """Groups of op names that take one configuration, in graph order."""
    parent = {op.name: op.name for op in graph.ops}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        if graph[a].pardims == graph[b].pardims:
            parent[find(b)] = find(a)

    for users in graph.param_users.values():
        for u in users[1:]:
            union(users[0], u)
    if call_site:
        first: dict[tuple, str] = {}
        for op in graph.ops:
            if op.params or not op.source:
                continue
            key = (op.source, op.kind, op.pardims, op.outputs,
                   tuple(graph.input_spec(op, i) for i in range(len(op.inputs))), op.input_maps)
            if key in first:
                union(first[key], op.name)
            else:
                first[key] = op.name
    groups: dict[str, list[str]] = {}
    for op in graph.ops:
        groups.setdefault(find(op.name), []).append(op.name)
    return list(groups.values())


class _Layers:
    """The variables of the optimisation: groups of ops that take one configuration.

    Ops without inputs or parameters (graph inputs, constants such as a causal mask) that feed
    several layers get one variable per consumer: they are built where they are used, and one
    shared variable would join otherwise unrelated layers (twelve transformer blocks reading one
    mask) into a graph no elimination can take apart.  The op keeps its first copy's
    configuration; the copies' compute is charged once.
    """

    def __init__(self, graph: OperatorGraph, tables: Tables, call_site: bool):
        self.graph, self.tables = graph, tables
        groups = _tie(graph, call_site)
        var_of = {name: v for v, members in enumerate(groups) for name in members}
        self.edge_var: dict[tuple[str, int], int] = {}  # (consumer, input j) -> variable of the producer copy
        self.copies: dict[str, list[int]] = {}
        for op in graph.ops:
            for j, ref in enumerate(op.inputs):
                src = graph[ref.op]
                if len(groups[var_of[src.name]]) == 1 and not src.inputs and not src.params \
                        and len(graph.consumers[src.name]) > 1:
                    if src.name not in self.copies:
                        self.copies[src.name] = [var_of[src.name]]
                    else:
                        self.copies[src.name].append(len(groups))
                        groups.append([src.name])
                    self.edge_var[(op.name, j)] = self.copies[src.name][-1]
                else:
                    self.edge_var[(op.name, j)] = var_of[src.name]
        self.groups = groups
        self.var_of = var_of
        self.sizes = [len(tables.configs[m[0]]) for m in groups]

    def configs(self, assignment: list[int]) -> dict:
        out = {}
        for v, members in enumerate(self.groups):
            for name in members:
                if name not in out:  # a split source keeps its first copy's choice
                    out[name] = self.tables.configs[members[0]][assignment[v]]
        return out

    def problem(self, with_tables: bool = True) -> PairwiseProblem:
        graph, tables = self.graph, self.tables
        problem = PairwiseProblem(self.sizes)
        for op in graph.ops:
            v = self.edge_var_self(op.name)
            for j, ref in enumerate(op.inputs):
                u = self.edge_var[(op.name, j)]
                if not with_tables:
                    if u != v:
                        problem.pairs.setdefault((min(u, v), max(u, v)), np.zeros(0))
                    continue
                table = tables.edge(graph[ref.op], ref.index, op, j)
                if u == v:
                    problem.add_unary(v, np.diagonal(table))
                else:
                    problem.add_pair(u, v, table)
        if not with_tables:
            return problem
        for v, members in enumerate(self.groups):
            if v != self.var_of[members[0]]:
                continue  # a copy of a split source: its compute is charged once
            charged: set[str] = set()
            for name in members:
                op = graph[name]
                problem.add_unary(v, tables.compute(op))
                own = []
                for j, p in enumerate(op.params):
                    if p.name in charged:
                        continue
                    users = graph.param_users[p.name]
                    if all(self.var_of[u] == v for u in users):
                        charged.add(p.name)
                        own.append(j)
                    else:
                        # A parameter shared across layers: each user pays its part.
                        problem.add_unary(v, tables.sync(op, [j], share=1.0 / len(users)))
                if own:
                    problem.add_unary(v, tables.sync(op, own))
        return problem

    @property
    def num_layers(self) -> int:
        """Groups of ops with one configuration (copies of split sources not counted)."""
        return len(self.groups) - sum(len(c) - 1 for c in self.copies.values())

    def edge_var_self(self, name: str) -> int:
        return self.var_of[name]
