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

On inception_v3 and 16 P100s (`p100-4x4`) this gives 45.7 ms against data parallelism's 53.4 and
OptCNN's 49.6, and MCMC improves it further.
"""

from __future__ import annotations

from ..cost import kind_class
from ..errors import StrategyError
from ..graph import DimKind, Op, OperatorGraph
from ..strategy import ParallelConfig, Strategy, check_config
from ..taskgraph import TaskGraphBuilder

DEFAULT_SPREAD = 2.0


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
    if not any(kind_class(op.kind)[0].name == "conv" for op in graph.ops):
        return None
    modules = module_branches(graph)
    if not modules:
        return None
    per_node = {len(topology.devices_by_node[nd]) for nd in topology.nodes}
    if len(per_node) != 1:
        return None
    gpus = per_node.pop()
    nodes = [topology.devices_by_node[nd] for nd in topology.nodes]
    if len(nodes) < 2:
        return None
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
