"""Starts for MCMC that put recurrent layers side by side: FlexFlow sec. 8.5's NMT strategy.

FlexFlow's best NMT strategy (sec. 8.5, Figure 14) rests on three observations:

1. "for a layer with a large number of network parameters and little computation (e.g., the
   embed layer), it is beneficial to perform the computation on a small number of GPU devices to
   reduce parameter synchronization costs";
2. "for a layer with a large number of network parameters and a heavy computation workload
   (e.g., the softmax layer), FlexFlow uses parallelism in the channel dimension and assigns the
   computation for a subset of channels to each task";
3. "for multiple recurrent layers (e.g., the LSTM and attention layers), FlexFlow uses
   concurrency among different layers as well as parallelism within each operation".

`layer_blocks` builds such a strategy from a base (OptCNN's, which parallelizes every op over
all devices and so has no concurrency among layers):

* **Recurrent layers** (the unrolled steps sharing one set of parameters, steps feeding steps)
  each get an aligned block of devices: with k layers on n devices, the largest power of two
  <= n / k (blocks wrap around when k > n).  Every step keeps its base configuration with the
  largest degrees halved until its tasks fit the block (observation 3).
* **Light ops around them** (`neighbours=True`): an op with at most one recurrent step's forward
  FLOPs goes to the block of the layer it feeds (every consumer on one block: the embedding and
  the slices that feed the first layer, its zero states) or else to the block that sends it the
  most input bytes (attention on the encoder memory, the per-step ops after the last layer).
  One with parameters is split along its parameter dims inside the block (observation 1); one
  without copies the configuration of its largest producer on the block when the dims allow,
  else it is split by sample over the block.
* **Heavy ops** (more forward FLOPs than a recurrent step: the per-step softmax projection of
  NMT) go to the first layer's block, split along their parameter (channel) dims (observation
  2), with the ops downstream of them (the stacked logits, the loss) on the same devices.  The
  first layers are idle when the backward pass starts (it runs the layers in reverse), so the
  softmax's backward overlaps the last layers' instead of queueing in front of them; and
  with no sample split the softmax's large weight is never synchronized.

On nmt and 16 P100s (`p100-4x4`), OptCNN's strategy (every layer 4 x 4 on all 16 GPUs) takes
59.4 ms; only the recurrent layers on blocks of their own, 56.6 ms; with their neighbours and
the softmax on the first node, 41.1 ms.

**Two layers to a block** (`share=2`).  In NMT the decoder starts when the attention has the
whole encoder memory, so of its four layers only two run at a time (encoder 1 beside encoder 2,
then decoder 1 beside decoder 2).  On one node of four GPUs a GPU per layer leaves half of them
idle in each phase (90.3 ms, OptCNN 77.6); blocks of two GPUs taken in turn — encoder 1 and
decoder 1 on GPUs 0-1, encoder 2 and decoder 2 on GPUs 2-3, each step's hidden units split in
two, everything else as in OptCNN — keep all four busy and do 23 % less LSTM work than OptCNN's
2 x 2 split of every step on all four (an LSTM step split two ways costs 1.15x its whole cost,
four ways 1.5x): 67.9 ms.

The plan simulates the three (`neighbours=True`, `False`, and `False` with `share=2`) and
starts MCMC from the fastest: with one device per layer (four layers on four GPUs) the layers
alone do better on rnnlm; two to a block wins on nmt on one node and loses elsewhere (rnntc on
`p100-1x4` 33.6 ms against 30.9, nmt on `p100-4x4` 63.3 against 41.1, on `k80-16x4` 271.2 against
198.5).
"""

from __future__ import annotations

import math

from ..errors import StrategyError
from ..hardware.topology import DeviceTopology
from ..ir.graph import DimKind, Op, OperatorGraph
from ..ir.strategy import ParallelConfig, Strategy, check_config
from .mcmc import layers_of


def recurrent_layers(graph: OperatorGraph) -> list[tuple[str, ...]]:
    """Groups of ops sharing parameters whose steps feed each other, in graph order."""
    return sorted((m for m in set(layers_of(graph).values())
                   if any(r.op in m for x in m for r in graph[x].inputs)),
                  key=lambda m: graph.index[m[0]])


def layer_blocks(graph: OperatorGraph, topology: DeviceTopology, base: Strategy, *,
                 neighbours: bool = True, share: int = 1) -> Strategy | None:
    """`base` with every recurrent layer on a block of devices of its own and, with
    `neighbours`, the ops around the layers placed with them (see the module docstring); with
    `share` > 1, blocks `share` times as large, taken in turn by the layers.  None when the
    graph has fewer than two recurrent layers, `share` leaves fewer than two blocks, or a
    step's degrees cannot be scaled down evenly to its block."""
    groups = recurrent_layers(graph)
    if len(groups) < 2:
        return None
    n = topology.num_devices
    size = 1
    while size * 2 <= max(1, n // len(groups)):
        size *= 2
    size *= share
    if size * 2 > n:
        return None
    blocks = [tuple(range((k * size) % n, (k * size) % n + size)) for k in range(len(groups))]
    cfgs = dict(base.items())
    where: dict[str, int] = {}  # op -> index of its block
    for k, members in enumerate(groups):
        for m in members:
            degrees = list(base[m].degrees)
            while math.prod(degrees) > size:
                j = max(range(len(degrees)), key=lambda x: degrees[x])
                if degrees[j] % 2:
                    return None
                degrees[j] //= 2
            cfg = _fits(graph[m], degrees, blocks[k], n)
            if cfg is None:
                return None
            cfgs[m] = cfg
            where[m] = k
    name = "layer-blocks"
    if neighbours:
        _place_neighbours(graph, n, blocks, where, cfgs)
    return Strategy.from_mapping(graph, cfgs, name)


def _place_neighbours(graph: OperatorGraph, n: int, blocks: list[tuple[int, ...]], where: dict[str, int],
                      cfgs: dict[str, ParallelConfig]) -> None:
    layer_ops = set(where)
    step_flops = max(graph[m].flops_fwd for m in layer_ops)
    consumers = graph.consumers

    def light(op: Op) -> bool:
        return op.flops_fwd <= step_flops

    # Feeders, consumers first: every consumer on one block.
    for op in reversed(graph.ops):
        if op.name in where or not light(op):
            continue
        on = {where.get(c) for c, _, _ in consumers[op.name]}
        if len(on) == 1 and None not in on:
            where[op.name] = on.pop()
    # Followers, producers first: the block that sends the most input bytes.
    heavy: list[str] = []
    for op in graph.ops:
        if op.name in where:
            continue
        if not light(op):
            heavy.append(op.name)
            continue
        sent: dict[int, float] = {}
        for r in op.inputs:
            if r.op in where:
                sent[where[r.op]] = sent.get(where[r.op], 0.0) + graph[r.op].outputs[r.index].nbytes
        if sent:
            where[op.name] = max(sent, key=lambda b: (sent[b], -b))
    for op in graph.ops:
        if op.name in where and op.name not in layer_ops:
            cfg = _with_neighbours(graph, op, blocks[where[op.name]], n, cfgs,
                                   [r.op for r in op.inputs if where.get(r.op) == where[op.name]])
            if cfg is not None:
                cfgs[op.name] = cfg
    # Heavy ops on the first layer's block, split by channel; what reads them follows.
    placed = set(heavy)
    for op in graph.ops:
        if op.name in placed:
            cfg = _spread(op, blocks[0], n, DimKind.PARAMETER, sample=1)
        elif op.name not in where and any(r.op in placed for r in op.inputs):
            cfg = _with_neighbours(graph, op, blocks[0], n, cfgs, [r.op for r in op.inputs if r.op in placed],
                                   sample=1)
        else:
            continue
        if cfg is not None:
            cfgs[op.name] = cfg
            placed.add(op.name)


def _with_neighbours(graph: OperatorGraph, op: Op, block: tuple[int, ...], n: int, cfgs: dict,
                     producers: list[str], sample: int | None = None) -> ParallelConfig | None:
    """A configuration of `op` on `block`: split by parameter inside it when `op` has
    parameters; else the degrees of its largest producer among `producers` on the dims of the
    same name, on the producer's devices, when that fits; else spread (`_spread`)."""
    if op.params:
        return _spread(op, block, n, DimKind.PARAMETER, sample)
    for p in sorted(producers, key=lambda p: -graph[p].outputs[0].nbytes):
        src, cfg = graph[p], cfgs[p]
        deg = {d.name: x for d, x in zip(src.pardims, cfg.degrees)}
        degrees = [deg.get(d.name, 1) for d in op.pardims]
        if math.prod(degrees) == cfg.num_tasks:
            fit = _fits(op, degrees, cfg.devices, n)
            if fit is not None:
                return fit
    return _spread(op, block, n, DimKind.SAMPLE, sample)


def _spread(op: Op, block: tuple[int, ...], n: int, first: DimKind, sample: int | None = None) -> ParallelConfig | None:
    """`op` over `block`: as much of the block as divides on dims of kind `first`, largest dim
    first, then on the others; the sample dim gets at most `sample` when given."""
    degrees = [1] * len(op.pardims)
    left = len(block)
    order = sorted(range(len(op.pardims)), key=lambda i: (op.pardims[i].kind is not first, -op.pardims[i].size))
    for i in order:
        p = op.pardims[i]
        d = left if sample is None or p.kind is not DimKind.SAMPLE else min(sample, left)
        while d > 1 and (p.size % d or (p.size // d) % p.granule):
            d //= 2
        degrees[i] = d
        left //= d
    return _fits(op, degrees, block[:math.prod(degrees)], n)


def _fits(op: Op, degrees, devices, n: int) -> ParallelConfig | None:
    cfg = ParallelConfig(tuple(degrees), tuple(devices)[:math.prod(degrees)])
    try:
        check_config(op, cfg, n)
    except StrategyError:
        return None
    return cfg
