"""Peak memory per device under a strategy.

Counted at the end of the forward pass, the peak of a training step: every activation that the
backward pass needs is alive, and so are the parameters, their gradients and the optimizer state.

* Parameters: the union of the regions of each parameter that tasks on the device read (two tasks
  of one op on a device holding the same shard hold it once).
* Gradients: as large as the parameters held.
* Optimizer state: `OPTIMIZER_STATES` tensors per parameter element (momentum; Adam's moments).
* Activations: the output region of every forward task on the device, plus every input piece
  received from another device (kept for the backward pass).  Ops with no parameters and no
  saved inputs could free theirs earlier; we do not model recomputation or early freeing, so the
  figure is an upper bound of what a straightforward runtime keeps.
* Receives posted ahead: on gloo ranks the runtime posts a step's receives as it begins
  (`autopar.trainer.comm.RecvAhead`, up to 64 MiB beyond the exchange it waits for), so at the end
  of the forward pass the buffers for the gradients still to come back are allocated too: every
  piece a device sent forward that returns a gradient counts once more on the sender (the
  budget's cap is not applied, keeping the figure an upper bound and a sum over edges).
"""

from __future__ import annotations

from ..ir.regions import union_volume, volume
from ..ir.strategy import Strategy
from .taskgraph import OPTIMIZER_STATES, TaskGraphBuilder
from .trainer_model import _FLOAT


def peak_memory(builder: TaskGraphBuilder, strategy: Strategy) -> dict[int, int]:
    g = builder.graph
    mem = [0] * builder.num_devices
    factor = 2 + OPTIMIZER_STATES[builder.optimizer]  # weights, gradients, optimizer state
    for name, spec in g.param_specs.items():
        itemsize = spec.nbytes // max(1, volume(tuple((0, s) for s in spec.shape)))
        for dev, boxes in builder.holdings(strategy, name).items():
            mem[dev] += factor * union_volume(boxes) * itemsize
    for op in g.ops:
        cfg = strategy[op.name]
        ranges = builder._task_ranges(op, cfg.degrees)
        for t, dev in enumerate(cfg.devices):
            for k, out in enumerate(op.outputs):
                mem[dev] += volume(op.output_box(k, ranges[t])) * out.itemsize
        for j, ref in enumerate(op.inputs):
            for d, n in edge_memory(builder, op, j, cfg, strategy[ref.op]).items():
                mem[d] += n
    return {d: int(m) for d, m in enumerate(mem)}


def edge_memory(builder: TaskGraphBuilder, op, j: int, cfg, pcfg) -> dict[int, int]:
    """Bytes input `j` of `op` holds at the peak per device (module doc): the pieces received, and
    on gloo ranks the buffers posted ahead for their gradients on the senders."""
    ref = op.inputs[j]
    spec = builder.graph[ref.op].outputs[ref.index]
    transfers, _ = builder.transfers(op, j, cfg, pcfg, spec.itemsize)
    rt = builder.runtime
    ahead = (rt is not None and not rt.launches_async and spec.dtype in _FLOAT
             and builder._requires_grad[builder.graph.index[ref.op]])
    out: dict[int, int] = {}
    for tr in transfers:
        out[tr.dst_dev] = out.get(tr.dst_dev, 0) + int(tr.nbytes)
        if ahead:
            out[tr.src_dev] = out.get(tr.src_dev, 0) + int(tr.nbytes)
    return out


def check_fits(builder: TaskGraphBuilder, strategy: Strategy, peak: dict[int, int] | None = None) -> list[str]:
    """Messages for every device whose peak memory exceeds its capacity (empty when it fits)."""
    peak = peak if peak is not None else peak_memory(builder, strategy)
    out = []
    for d, used in peak.items():
        cap = builder.topology.devices[d].memory
        if used > cap:
            out.append(f"device {d} ({builder.topology.devices[d].name}) needs {used / 2**30:.2f} GiB "
                       f"but has {cap / 2**30:.2f} GiB ({(used - cap) / 2**30:.2f} GiB over)")
    return out
