"""Expert-designed strategies, the baselines of FlexFlow sec. 8.2.1, and the placement-only space.

* **CNNs — "one weird trick"** (Krizhevsky 2014; OptCNN sec. 6's OWT): data parallelism for the
  convolutional and pooling part, model parallelism for the densely-connected layers: every
  linear layer's output features are split over all devices, and the parameter-free ops between
  dense layers (ReLU, dropout) follow that split, so only activations move, never weights.
* **RNNs** (Wu et al. 2016, GNMT, as FlexFlow describes it): data parallelism across nodes — the
  whole graph is replicated on every node with a share of the batch — and model parallelism
  inside a node: all ops of the same *depth* run on the same GPU.  A layer is a set of ops that
  share parameters (the unrolled steps of one LSTM layer); its depth is one more than the deepest
  layer it reads from, and depth d goes to GPU (d - 1) mod (GPUs per node).  Parameter-free ops
  take the depth of their deepest input.
* **Placement only** (REINFORCE's space, Mirhoseini et al. 2017): every op whole, on one device;
  only the operation dimension is searched.  `PlacementSpace` is the proposal space MCMC uses
  for it; `layer_placement` (the RNN expert on one node's devices, no data parallelism) and a
  single device are its starting points.

`expert` picks the CNN rule for graphs with convolutions, the RNN rule for graphs with unrolled
(parameter-sharing) layers, and refuses others: there is no published expert strategy to copy.
"""

from __future__ import annotations

import random
from typing import Callable

import networkx as nx

from ..cost.model import kind_class
from ..errors import StrategyError
from ..hardware.topology import DeviceTopology
from ..ir.graph import DimKind, Op, OperatorGraph
from ..ir.strategy import ParallelConfig, Strategy, check_config, data_parallel, model_parallel, single_device
from .layer_blocks import layer_blocks  # noqa: F401  (re-exported: an expert-style start)


def _largest(size: int, limit: int, granule: int = 1) -> int:
    units = size // granule
    return max(d for d in range(1, min(limit, units) + 1) if units % d == 0)


def _is_conv_or_pool(op: Op) -> bool:
    return kind_class(op.kind)[0].name in ("conv", "pool")


def _is_dense(op: Op) -> bool:
    return bool(op.params) and kind_class(op.kind)[0].name == "gemm"


# -- CNNs ------------------------------------------------------------------------------------

def expert_cnn(graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    """"One weird trick": data parallel up to the first dense layer, model parallel after it."""
    n = topology.num_devices
    if not any(_is_conv_or_pool(op) for op in graph.ops):
        raise StrategyError(f"expert-cnn: graph {graph.name} has no convolution or pooling op; "
                            "the CNN expert strategy ('one weird trick') does not apply")
    dp = data_parallel(graph, n)
    dense_from = next((i for i, op in enumerate(graph.ops) if _is_dense(op)), len(graph.ops))
    split: dict[str, tuple[str, int]] = {}   # op -> (feature dim of its output, degree)
    cfgs = {}
    for i, op in enumerate(graph.ops):
        cfg = dp[op.name]
        if i >= dense_from:
            cfg = _dense_config(graph, op, n, split) or cfg
        cfgs[op.name] = cfg
    return Strategy.from_mapping(graph, cfgs, "expert-cnn")


def _dense_config(graph: OperatorGraph, op: Op, n: int, split: dict) -> ParallelConfig | None:
    degrees = [1] * len(op.pardims)
    if _is_dense(op):
        for i, p in enumerate(op.pardims):
            if p.kind is DimKind.PARAMETER:
                degrees[i] = _largest(p.size, n, p.granule)
                split[op.name] = (p.name, degrees[i])
                break
        else:
            return None
    else:
        # Follow the split of a dense producer when the output keeps its feature axis.
        src = next((split[r.op] for r in op.inputs if r.op in split), None)
        if src is None or not op.inputs:
            return None
        dim, deg = src
        producer = graph[next(r.op for r in op.inputs if r.op in split)]
        axis = producer.output.dims.index(dim) if dim in producer.output.dims else None
        if axis is None or len(op.output.shape) != len(producer.output.shape):
            return None
        name = op.output.dims[axis]
        idx = next((i for i, p in enumerate(op.pardims) if p.name == name), None)
        if idx is None or op.pardims[idx].size % deg or (op.pardims[idx].size // deg) % op.pardims[idx].granule:
            return None
        degrees[idx] = deg
        split[op.name] = (name, deg)
    k = 1
    for d in degrees:
        k *= d
    return ParallelConfig(tuple(degrees), tuple(range(k)))


# -- RNNs ------------------------------------------------------------------------------------

def layer_depths(graph: OperatorGraph) -> dict[str, int]:
    """Depth of every op: layers (ops sharing parameters, or one op with its own parameters)
    count 1 more than the deepest layer they read from; parameter-free ops take their inputs'."""
    param_group: dict[str, str] = {}
    for users in graph.param_users.values():
        root = param_group.get(users[0], users[0])
        for u in users:
            param_group.setdefault(u, root)
    node = {op.name: ("layer", param_group[op.name]) if op.name in param_group else ("op", op.name)
            for op in graph.ops}
    g = nx.DiGraph()
    g.add_nodes_from(set(node.values()))
    for op in graph.ops:
        for r in op.inputs:
            if node[r.op] != node[op.name]:
                g.add_edge(node[r.op], node[op.name])
    cond = nx.condensation(g)
    weight = {c: int(any(m[0] == "layer" for m in cond.nodes[c]["members"])) for c in cond.nodes}
    depth: dict[int, int] = {}
    for c in nx.topological_sort(cond):
        preds = [depth[p] for p in cond.predecessors(c)]
        depth[c] = (max(preds) if preds else 0) + weight[c]
    mapping = cond.graph["mapping"]
    return {op.name: depth[mapping[node[op.name]]] for op in graph.ops}


def expert_rnn(graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    """Data parallel across nodes, one layer depth per GPU inside each node."""
    if not any(len(users) > 1 for users in graph.param_users.values()):
        raise StrategyError(f"expert-rnn: graph {graph.name} has no unrolled recurrent layer (no op shares "
                            "parameters); the RNN expert strategy does not apply")
    nodes = [topology.devices_by_node[nd] for nd in topology.nodes]
    per_node = min(len(d) for d in nodes)
    depths = layer_depths(graph)
    cfgs = {}
    for op in graph.ops:
        gpu = max(depths[op.name] - 1, 0) % per_node
        sample = next((i for i, p in enumerate(op.pardims) if p.kind is DimKind.SAMPLE), None)
        reps = _largest(op.pardims[sample].size, len(nodes), op.pardims[sample].granule) if sample is not None else 1
        degrees = [1] * len(op.pardims)
        if sample is not None:
            degrees[sample] = reps
        cfgs[op.name] = ParallelConfig(tuple(degrees), tuple(nodes[i][gpu] for i in range(reps)))
    return Strategy.from_mapping(graph, cfgs, "expert-rnn")


def expert(graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    """The expert strategy that fits the graph: CNN rule with convolutions, RNN rule with unrolled layers."""
    if any(_is_conv_or_pool(op) for op in graph.ops):
        return expert_cnn(graph, topology).renamed("expert")
    if any(len(users) > 1 for users in graph.param_users.values()):
        return expert_rnn(graph, topology).renamed("expert")
    raise StrategyError(f"expert: graph {graph.name} is neither a CNN (no convolution) nor an unrolled RNN "
                        "(no shared parameters); there is no expert-designed strategy for it")


def expert_applies(graph: OperatorGraph) -> bool:
    return (any(_is_conv_or_pool(op) for op in graph.ops)
            or any(len(users) > 1 for users in graph.param_users.values()))


# -- placement only --------------------------------------------------------------------------

def layer_placement(graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    """Every op whole on one device: layer depth d on device (d - 1) mod n (model parallelism)."""
    depths = layer_depths(graph)
    n = topology.num_devices
    cfgs = {op.name: ParallelConfig((1,) * len(op.pardims), (max(depths[op.name] - 1, 0) % n,)) for op in graph.ops}
    return Strategy.from_mapping(graph, cfgs, "layer-placement")


class PlacementSpace:
    """REINFORCE's space: degrees all 1, one device per op.  A proposal moves one op to a
    uniformly random device (symmetric, as Metropolis–Hastings needs)."""

    name = "placement"

    def __init__(self, num_devices: int):
        self.num_devices = num_devices

    def random(self, op: Op, rng: random.Random, current: ParallelConfig | None = None) -> ParallelConfig:
        return ParallelConfig((1,) * len(op.pardims), (rng.randrange(self.num_devices),))

    def contains(self, op: Op, cfg: ParallelConfig) -> bool:
        return all(d == 1 for d in cfg.degrees) and len(cfg.devices) == 1


Rule = Callable[[OperatorGraph, DeviceTopology], Strategy]

#: The fixed-rule baselines by name (FlexFlow 8.2.1): how each is built and a one-line description.
#: `search.named` lists them with the searched ones; `search.plan` simulates some of them.
RULES: dict[str, tuple[Rule, str]] = {
    "data-parallel": (lambda g, t: data_parallel(g, t.num_devices),
                      "every op split along its sample dimension over all devices"),
    "model-parallel": (lambda g, t: model_parallel(g, t.num_devices),
                       "the parameters of every layer split evenly over all devices (FlexFlow 8.2.1)"),
    "single-device": (lambda g, t: single_device(g, 0), "the whole model on device 0"),
    "expert": (expert, "CNNs: data parallel convolutions, model parallel dense layers; RNNs: data parallel "
               "across nodes, one layer depth per GPU (FlexFlow 8.2.1)"),
    "expert-cnn": (expert_cnn, "'one weird trick': data parallel convolutions and pools, model parallel dense "
                   "layers (Krizhevsky 2014)"),
    "expert-rnn": (expert_rnn, "data parallel across nodes, ops of one layer depth on one GPU per node (GNMT)"),
    "layer-placement": (layer_placement, "every op whole, layer depth d on device d-1 mod n (model parallelism)"),
}
