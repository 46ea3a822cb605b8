"""A start for MCMC that runs the branches of a CNN's modules side by side: FlexFlow sec. 8.5's
Inception-v3 strategy (Figure 13).

FlexFlow's best strategy for Inception-v3 "exploits intra-operation parallelism for operations
on the critical path and uses a combination of intra- and inter-operation parallelism for
operations on different branches.  This results in a well-balanced workload and reduces data
transfers for parameter synchronization."  `branch_placement` builds such a strategy from a base
(data parallelism):

* A **branch** is a chain of single-consumer ops that ends in an input of a concatenation (an
  Inception module's 1x1, 5x5, double 3x3 and pool towers).  Ops outside branches (the stem, a
  linear chain; the concatenations; the classifier) keep the base configuration: intra-op
  parallelism on the critical path.
* Inside a node, each module's branches go to the node's GPUs by longest-processing-time-first
  list scheduling (inter-op parallelism), every branch op split by sample across the nodes only,
  one task per node on that GPU: a branch's parameters then have one replica per node instead
  of one per GPU, so their ring all-reduce pays 2(nodes-1) route latencies on each network link
  instead of 2(GPUs-1) (with Inception's 284 small parameter tensors on 16 GPUs the latencies
  alone keep each NIC busy for 27 ms under data parallelism).
* A branch with more than `spread` times its share (module work / GPUs per node) keeps the base
  configuration: alone on one GPU it would be the module's critical path.

`balanced_branches` also lets a branch take two or more GPUs of each node ("intra-operation
parallelism for operations on the critical path", within the node): the heaviest tower of a
module split by sample over a pair of GPUs, the light ones sharing the others.  Per module it
picks, for every branch, a block of each node's GPUs (one GPU, a pair, an aligned block, the
whole node) minimizing the module's critical path — the most loaded GPU — plus `alpha` times the
time the branches' parameter synchronization adds to each node's network link (a ring over the
r = nodes x block replicas pays 2(r-1) times the route latency and 2(r-1)/r of the bytes on it).
Costs are the cost model's task times; the search is exhaustive with branch and bound (a
module has at most a handful of branches).

On inception_v3 and `p100-4x4` (data parallelism 53.35 ms, OptCNN 49.64):

| placement | step | compute per GPU (max / mean) | busiest NIC link |
|---|---|---|---|
| `branch_placement`, spread 2 | 45.67 ms | 42.94 / 28.46 ms | 26.34 ms |
| `balanced_branches`, alpha 0.5 | 40.04 ms | 30.10 / 28.31 ms | 26.61 ms |
| `balanced_branches`, alpha 1 | 39.33 ms | 30.44 / 28.06 ms | 25.78 ms |
| `balanced_branches`, alpha 2 | 41.57 ms | 32.02 / 27.30 ms | 22.92 ms |

`branch_placement` puts every module's heaviest branch on GPU 0 of each node (42.9 ms of work
there, 18.6 on GPU 3); the balanced placement splits Mixed_6b-6e's double 7x7 tower over a pair
of GPUs and runs the 1x1, 7x7 and pool towers on the other two.  On `k80-16x4` the network is the
bottleneck (114 ms on each node's NIC link against 30 ms of compute) and every branch on one GPU
(`branch_placement` with no spread limit, 128.9 ms) stays the better start.
"""

from __future__ import annotations

import itertools
import math

from ..cost.model import kind_class
from ..errors import StrategyError
from ..ir.graph import DimKind, Op, OperatorGraph
from ..ir.strategy import ParallelConfig, Strategy, check_config
from ..sim.taskgraph import TaskGraphBuilder

DEFAULT_SPREAD = 2.0
DEFAULT_ALPHA = 1.0


def module_branches(graph: OperatorGraph) -> dict[str, list[list[str]]]:
    """concatenation op -> its branches (each a list of op names, last op first), found by
    walking back from each input through ops with one input and one consumer.  An op belongs to
    the first branch that reaches it; only concatenations with two or more branches appear."""
    consumers = graph.consumers
    taken: set[str] = set()
    out: dict[str, list[list[str]]] = {}
    for op in graph.ops:
        if op.kind != "concat":
            continue
        found = []
        for ref in op.inputs:
            chain, x = [], ref.op
            while (x not in taken and len(consumers[x]) == 1 and graph[x].kind not in ("concat", "input")
                   and graph[x].inputs):
                chain.append(x)
                taken.add(x)
                if len(graph[x].inputs) != 1:
                    break
                x = graph[x].inputs[0].op
            if chain:
                found.append(chain)
        if len(found) >= 2:
            out[op.name] = found
    return out


def branch_placement(builder: TaskGraphBuilder, base: Strategy, spread: float = DEFAULT_SPREAD) -> Strategy | None:
    """`base` with the branches of every module placed side by side (see the module docstring).
    None when the graph has no convolutions or no modules of branches, or the topology has one
    node (or nodes of different sizes): on one node of four P100s every branch whole on one GPU
    leaves the module waiting for its heaviest branch, 145 ms for Inception-v3 against data
    parallelism's 102."""
    graph, topology = builder.graph, builder.topology
    found = _modules_and_nodes(builder)
    if found is None:
        return None
    modules, nodes = found
    gpus = len(nodes[0])
    cfgs = dict(base.items())

    def config(op: Op, gpu: int) -> ParallelConfig | None:
        degrees = [len(nodes) if p.kind is DimKind.SAMPLE else 1 for p in op.pardims]
        cfg = ParallelConfig(tuple(degrees), tuple(devs[gpu] for devs in nodes))
        try:
            check_config(op, cfg, topology.num_devices)
        except StrategyError:
            return None
        return cfg

    def work(chain: list[str]) -> float:
        total = 0.0
        for name in chain:
            cfg = config(graph[name], 0)
            if cfg is None:
                return float("inf")
            est = builder.cost.task_cost(graph[name], cfg.degrees, topology.devices[cfg.devices[0]],
                                         builder._in_shapes[name])
            total += est.forward + est.backward
        return total

    for branches in modules.values():
        costs = [work(chain) for chain in branches]
        share = sum(c for c in costs if c != float("inf")) / gpus
        loads = [0.0] * gpus
        for k in sorted(range(len(branches)), key=lambda k: -costs[k]):
            if costs[k] > spread * share:
                continue  # stays in the base configuration
            gpu = min(range(gpus), key=lambda j: loads[j])
            loads[gpu] += costs[k]
            for name in branches[k]:
                cfgs[name] = config(graph[name], gpu)
    return Strategy.from_mapping(graph, cfgs, "branches")


def _modules_and_nodes(builder: TaskGraphBuilder) -> tuple[dict[str, list[list[str]]], list] | None:
    """(module_branches, devices of each node) when branches can be placed: a CNN with modules
    of branches on two or more nodes of equally many devices; else None."""
    graph, topology = builder.graph, builder.topology
    if not any(kind_class(op.kind)[0].name == "conv" for op in graph.ops):
        return None
    modules = module_branches(graph)
    if not modules:
        return None
    nodes = [topology.devices_by_node[nd] for nd in topology.nodes]
    if len(nodes) < 2 or len({len(devs) for devs in nodes}) != 1:
        return None
    return modules, nodes


def node_blocks(gpus: int) -> list[tuple[int, ...]]:
    """The blocks of a node's GPUs a branch may take: each GPU, every pair (aligned pairs only
    on nodes of more than four GPUs), aligned blocks of 4, 8, ... and the whole node."""
    out = [(k,) for k in range(gpus)]
    if gpus > 2:
        out += list(itertools.combinations(range(gpus), 2)) if gpus <= 4 else \
            [(k, k + 1) for k in range(0, gpus - 1, 2)]
    w = 4
    while w < gpus:
        out += [tuple(range(k, k + w)) for k in range(0, gpus - w + 1, w)]
        w *= 2
    if gpus > 1:
        out.append(tuple(range(gpus)))
    return out


def balanced_branches(builder: TaskGraphBuilder, base: Strategy, alpha: float = DEFAULT_ALPHA) -> Strategy | None:
    """`base` with every module's branches on blocks of each node's GPUs, split by sample over
    the nodes and the block, chosen to minimize each module's most loaded GPU plus `alpha` x
    the network time of the branches' parameter synchronization (see the module docstring).
    None where `branch_placement` is None (no modules of branches, or one node)."""
    graph, topology = builder.graph, builder.topology
    found = _modules_and_nodes(builder)
    if found is None:
        return None
    modules, nodes = found
    gpus = len(nodes[0])
    blocks = node_blocks(gpus)
    widths = sorted({len(blk) for blk in blocks})
    # A ring edge between nodes: the last GPU of one node to the first of the next.
    latency = topology.route_latency(nodes[0][-1], nodes[1][0])
    bandwidth = topology.route_bandwidth(nodes[0][-1], nodes[1][0])
    cfgs = dict(base.items())

    def config(op: Op, block: tuple[int, ...]) -> ParallelConfig | None:
        degrees = [len(nodes) * len(block) if p.kind is DimKind.SAMPLE else 1 for p in op.pardims]
        cfg = ParallelConfig(tuple(degrees), tuple(devs[k] for devs in nodes for k in block))
        try:
            check_config(op, cfg, topology.num_devices)
        except StrategyError:
            return None
        return cfg

    def work(chain: list[str], w: int) -> float:
        """Seconds of forward and backward on each GPU of a block of `w` GPUs per node."""
        total = 0.0
        for name in chain:
            cfg = config(graph[name], tuple(range(w)))
            if cfg is None:
                return math.inf
            est = builder.cost.task_cost(graph[name], cfg.degrees, topology.devices[cfg.devices[0]],
                                         builder._in_shapes[name])
            total += est.forward + est.backward
        return total

    def network(chain: list[str], w: int) -> float:
        """Seconds the chain's ring all-reduces keep one node's link to the network busy."""
        r = len(nodes) * w
        return sum(2 * (r - 1) * (latency + p.nbytes / r / bandwidth) for name in chain for p in graph[name].params)

    for branches in modules.values():
        cost = {w: [work(chain, w) for chain in branches] for w in widths}
        net = {w: [network(chain, w) for chain in branches] for w in widths}
        order = sorted(range(len(branches)), key=lambda k: -cost[1][k])
        choice = _best_blocks(order, blocks, cost, net, gpus, alpha)
        if choice is None:
            continue  # no block fits some branch: the module keeps the base configuration
        for k, blk in choice.items():
            for name in branches[k]:
                cfgs[name] = config(graph[name], blk)
    return Strategy.from_mapping(graph, cfgs, "branches")


def _best_blocks(order: list[int], blocks: list[tuple[int, ...]], cost: dict, net: dict, gpus: int,
                 alpha: float) -> dict[int, tuple[int, ...]] | None:
    """Branch -> block minimizing (max GPU load + alpha x network seconds, network seconds), by
    depth-first search over `order` (heaviest first) pruned by the objective so far, which no
    further branch can lower."""
    best: list = [(math.inf, math.inf), None]
    loads = [0.0] * gpus
    picked: dict[int, tuple[int, ...]] = {}

    def visit(i: int, nc: float) -> None:
        bound = (max(loads) + alpha * nc, nc)
        if bound >= best[0]:
            return
        if i == len(order):
            best[0], best[1] = bound, dict(picked)
            return
        k = order[i]
        for blk in blocks:
            c = cost[len(blk)][k]
            if c == math.inf:
                continue
            for j in blk:
                loads[j] += c
            picked[k] = blk
            visit(i + 1, nc + net[len(blk)][k])
            for j in blk:
                loads[j] -= c
        picked.pop(k, None)

    visit(0, 0.0)
    return best[1]
