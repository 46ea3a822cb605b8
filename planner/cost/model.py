"""The cost model: how long one task of an op takes on a device, forward and backward.

Two sources, as in FlexFlow (sec. 5.1, assumption A1: an op's time depends on its sizes, not its
data, and is measured once per size) and OptCNN (sec. 5.1, the per-layer compute cost t_c):

* **profile** — a mean measured by `autopar profile` (`planner.cost.profiler`) and kept in the
  profile cache (`planner.cost.profile_cache`), looked up by the task's key (device product, op kind,
  shard shapes, dtype, attributes);
* **analytic** — a roofline estimate (`AnalyticModel`) for every key the cache does not hold.

Every `Estimate` says which source it came from, and `CostModel.stats()` counts them, so a plan
can report how much of its prediction rests on measurements.

Input shapes.  An `Op` does not carry the shapes of its inputs (the graph does), and a task's
input shards — halos included — need them, so `task_cost` takes them as its fourth argument:
``task_cost(op, degrees, device, graph_input_shapes(graph, op))``.  Callers that would rather not
pass them call `CostModel.bind(graph)` once; `task_cost` then looks them up by op identity.

Speed.  A search calls `task_cost` ~1e5 times on a few thousand distinct (op, degrees, device
product) triples, so results are memoized on ``(id(op), degrees, device.product, device.kind,
device.host_workers, input_shapes)``: a hit is one dict lookup and returns the very same `Estimate`
object.  The memo keeps a reference to the op so its id cannot be reused while the entry lives.
The memo is not invalidated when the cache changes: build a new `CostModel` after profiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import CostModelError
from ..hardware.topology import Device
from ..ir.graph import DTYPE_BYTES, Op, OperatorGraph
from .profile_cache import (COLD_SUFFIX, ProfileCache, attrs_text, cold_kind, hot_kind, key_of_shapes, kind_of,
                            op_dtype, task_shapes)

__all__ = ["AnalyticModel", "CostModel", "Estimate", "KindClass", "graph_input_shapes", "kind_class"]

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Estimate:
    forward: float  # seconds for one task (one partition) of the op
    backward: float  # seconds
    source: str  # "profile" or "analytic"
    # GPUs: the host's seconds issuing the forward and backward kernels (None: not measured); the
    # kernels run behind it (`RuntimeCalibration.launches_async`)
    host: tuple[float, float] | None = None

    @property
    def total(self) -> float:
        return self.forward + self.backward


# -- analytic (roofline) model ---------------------------------------------------------------

@dataclass(frozen=True)
class KindClass:
    """How a family of op kinds uses a device.

    `efficiency`: fraction of peak FLOP/s reached at large sizes.  `gemm`: the op is a reduction
    (matrix multiply, convolution) whose efficiency falls on small shards.  `kernels_fwd`/`_bwd`:
    kernel launches per task.  `reads`: passes over each input in the forward pass (a training
    batch norm reads its input once for statistics and once to normalize).  `param_reads`: passes
    over the parameters (0 for a gather, which reads only the rows it needs).  `gather`: output rows
    are copied from a table (embedding), costing a read per output element.  `free`: a view that
    moves no data (reshape, flatten, select, and graph inputs).
    """

    name: str
    efficiency: float
    gemm: bool = False
    kernels_fwd: int = 1
    kernels_bwd: int = 1
    reads: int = 1
    param_reads: int = 1
    gather: bool = False
    free: bool = False


# Large-size efficiencies (fraction of peak): cuDNN implicit-GEMM fp32 convolutions 0.60 (55-65%
# across ResNet/Inception layers; 3×3 stride-1 layers additionally get `winograd_speedup`); cuBLAS
# SGEMM 0.75 (75-85% on large squares, less the bias epilogue); an LSTM/GRU cell is two GEMMs plus
# a pointwise gate kernel (0.55); attention interleaves batched GEMMs with a softmax (0.50).  For
# the memory-bound families 0.25 only matters when their FLOP count is unusually high.
_CLASSES = {c.name: c for c in (
    KindClass("conv", 0.60, gemm=True, kernels_fwd=1, kernels_bwd=2),
    KindClass("gemm", 0.75, gemm=True, kernels_fwd=1, kernels_bwd=2),
    KindClass("rnn_cell", 0.55, gemm=True, kernels_fwd=3, kernels_bwd=5),
    KindClass("attention", 0.50, gemm=True, kernels_fwd=4, kernels_bwd=7),
    KindClass("elementwise", 0.25),
    KindClass("norm", 0.25, reads=2),
    KindClass("softmax", 0.25, reads=2),
    KindClass("pool", 0.25),
    KindClass("loss", 0.25, kernels_fwd=2, kernels_bwd=2, reads=2),
    KindClass("embedding", 0.25, kernels_bwd=2, param_reads=0, gather=True),
    KindClass("copy", 0.25),
    KindClass("view", 1.0, kernels_fwd=0, kernels_bwd=0, free=True),
    KindClass("generic", 0.30),
)}

_KIND_NAMES = {
    "conv": ("conv", "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose", "conv_transpose1d",
             "conv_transpose2d", "conv_transpose3d"),
    "gemm": ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "dense", "fc"),
    "rnn_cell": ("lstm_cell", "gru_cell", "rnn_cell", "lstm", "gru", "rnn"),
    "attention": ("attention", "multihead_attention", "self_attention", "scaled_dot_product_attention", "sdpa"),
    "elementwise": ("elementwise", "pointwise", "activation", "relu", "relu6", "gelu", "silu", "tanh", "sigmoid",
                    "elu", "leaky_relu", "hardtanh", "add", "sub", "mul", "div", "neg", "exp", "log", "sqrt",
                    "pow", "clamp", "where", "dropout", "scale", "residual", "binary", "unary"),
    "norm": ("norm", "batch_norm", "batchnorm", "layer_norm", "layernorm", "group_norm", "instance_norm",
             "rms_norm", "local_response_norm", "lrn"),
    "softmax": ("softmax", "log_softmax"),
    "pool": ("pool", "max_pool", "maxpool", "avg_pool", "avgpool", "max_pool1d", "max_pool2d", "avg_pool1d",
             "avg_pool2d", "adaptive_avg_pool", "adaptive_avg_pool2d", "adaptive_max_pool2d", "global_pool",
             "global_avg_pool"),
    "loss": ("loss", "cross_entropy", "nll_loss", "mse_loss", "ctc_loss", "bce_loss"),
    "embedding": ("embedding", "embedding_bag", "gather", "index_select"),
    "copy": ("concat", "cat", "stack", "pad", "copy", "contiguous", "sum", "mean", "reduce", "repeat", "expand_copy",
             "source"),
    "view": ("input", "placeholder", "output", "view", "reshape", "flatten", "squeeze", "unsqueeze", "identity",
             "select", "slice", "narrow", "split", "chunk", "getitem", "transpose", "permute", "expand", "unbind"),
    # Calls the importer could not classify: their FLOPs and bytes are known, their shape is not.
    "generic": ("opaque",),
}
_KIND_TO_CLASS = {k: _CLASSES[c] for c, names in _KIND_NAMES.items() for k in names}


def kind_class(kind: str) -> tuple[KindClass, bool]:
    """The class of an op kind, and whether the kind is known (unknown kinds get the generic class)."""
    c = _KIND_TO_CLASS.get(kind)
    if c is None:
        c = _KIND_TO_CLASS.get(kind.lower().replace("-", "_"))
    return (c, True) if c is not None else (_CLASSES["generic"], False)


def _winograd_eligible(op: Op) -> bool:
    """A 3×3, stride-1, undilated, ungrouped 2-D convolution with enough channels for cuDNN's Winograd."""
    kernel, stride, dilation = op.attr("kernel"), op.attr("stride", (1, 1)), op.attr("dilation", (1, 1))
    if tuple(kernel or ()) != (3, 3) or tuple(stride) != (1, 1) or tuple(dilation) != (1, 1) or op.attr("groups", 1) != 1:
        return False
    weight = op.params[0].view if op.params else ()
    return len(weight) == 4 and weight[0] >= 32 and weight[1] >= 32


def _sum_volumes(shapes) -> int:
    total = 0
    for s in shapes:
        n = 1
        for x in s:
            n *= x
        total += n
    return total


@dataclass(frozen=True)
class AnalyticModel:
    """Roofline estimate of one task, used for every key the profile cache does not hold.

    ``time = kernels × launch + max(flops / (peak × eff(kind) × saturation), bytes / (bandwidth × mem_eff))``

    * FLOPs: the op's `flops_fwd` (`flops_bwd`; if unset 2× forward for ops with parameters —
      data and weight gradients — and 1× otherwise) divided by the number of tasks: partitions are
      equal, so each task does its share of the work.
    * Bytes: what the task itself reads and writes — its input shards (halos included, so an
      attribute split of a convolution pays for the rows it re-reads), parameter shards (whole
      weights for a sample split) and output shards.  When the op's own ``bytes_fwd``/``bytes_bwd``
      (the importer's count) exceed this model's traffic for the whole op, the excess is added,
      split over the tasks: the importer's figure is a floor.
      Backward reads the output gradient and saved inputs, writes input gradients, reads
      weights and writes weight gradients.
    * Saturation: a device needs enough independent work to be busy.  Parallel work units are
      the output elements of the GEMM (forward: the op's outputs; data gradient: its inputs;
      weight gradient: its parameters) times a split-K factor: libraries cut long reductions into
      chunks of `split_k_chunk`, at most `split_k_max` of them (`split_k_max_wgrad` for weight
      gradients, which reduce over the whole batch and image).  Saturation is
      ``units / (units + half)`` with ``half = outputs_per_lane × lanes`` and
      ``lanes = peak / (2 × clock)`` (3.8k FP32 lanes on a P100, so ~121k units half-load it), times
      ``K / (K + k_half)`` for short reductions (K = FLOPs per output / 2).  Effect on P100: the
      3×3 convolution of ResNet's last stage at 4 samples per task (a 64-sample batch split 16
      ways) runs at 0.76 of its per-sample speed at 64 samples, at 1 sample at 0.42; a whole
      data-parallel ResNet-101 step drops to 0.80 (4 samples per GPU) and 0.50 (1 sample).

    Constants (why):
    * ``launch_gpu`` 6 µs — CUDA kernel launch plus the gap between back-to-back dependent
      kernels (5–10 µs measured on P100/V100 with PyTorch eager); ``launch_cpu`` 8 µs — one tiny
      op through `planner.ir.kernels.forward_task` on a CPU worker measured 8–17 µs here (eager
      dispatch 2–5 µs, plus autograd recording and the kernel wrapper the runtime also pays).
    * ``mem_eff_gpu`` 0.75 — STREAM-like kernels reach ~550 of 732 GB/s on a P100, ~85% on A100;
      ``mem_eff_cpu`` 0.8 — CPU entries (`planner.hardware.catalog`) give measured single-thread copy
      bandwidth, not a datasheet peak, so little is lost.
    * ``cpu_cache_bytes`` 2 MiB, ``cpu_cache_speedup`` 4 — on a CPU the first bytes of a task's
      traffic stay in the core's L2 (2 MiB here; 1–2 MiB on current server cores): a 512 KiB
      ReLU ran at ~60 GB/s on this machine, a 4 MiB one at the catalog's ~12 GB/s.  GPU caches
      are small next to training tensors and are ignored.
    * ``clock_gpu`` 1.4 GHz, ``clock_cpu`` 3.0 GHz — turn peak FLOP/s into lanes; ``outputs_per_lane``
      32 — an SGEMM thread block computes a 128×128 tile with 256 threads (64 outputs per thread)
      and a device needs a few resident blocks per SM to hide latency; 32 (a judgement, not a
      measurement) keeps large-batch throughput in the published range below while small shards
      lose a clear share of it.
    * ``split_k_chunk`` 512, ``split_k_max`` 4 — cuBLAS/cuDNN split-K heuristics;
      ``split_k_max_wgrad`` 32 — weight-gradient kernels accumulate partial sums over many
      batch/pixel tiles; ``k_half`` 8 — reductions of a few elements (depthwise, 1×1 over 3
      channels) cannot reuse operands.
    * ``winograd_speedup`` 2.0 — cuDNN runs 3×3 stride-1 convolutions with ≥32 channels as
      Winograd F(2×2,3×3)/F(4×4,3×3) (2.25–4× fewer multiplies, less the transforms); without it
      VGG-16, nearly all 3×3 layers, would need 135% of the P100's FP32 peak for its published
      154 img/s.  Winograd is a CUDA-core algorithm: it applies to float32 on GPUs whose float32
      rate is a CUDA-core rate (below ``winograd_max_flops`` 40 TFLOP/s: K80, P100, V100), not to
      TF32/FP16 tensor-core math (A100, H100 use implicit GEMM there) nor to CPUs (PyTorch's CPU
      convolutions use direct/GEMM algorithms).
    * Calibration (P100 SXM2, 10.6 TFLOP/s, 732 GB/s, 64 images per GPU, data parallel, zoo
      graphs): ResNet-50 ~213 img/s (published fp32 training ~219), ResNet-101 ~121 (100–130),
      Inception-v3 ~169 (142), VGG-16 ~119 (154), AlexNet at batch 256 ~1840 (~2990 at 512: its
      5×5 and 11×11 layers use FFT algorithms not modelled).  `tests/planner/cost/test_cost.py` keeps
      these in range.
    * Optimizer step: ``update_passes`` — SGD with momentum reads parameter, gradient and momentum
      and writes momentum and parameter (5 passes); Adam reads 4 and writes 3 (7).
      ``update_overhead_gpu`` 2 µs per parameter — PyTorch's multi-tensor (foreach) optimizers
      update many parameters per launch; ``update_overhead_cpu`` 10 µs — per-parameter eager ops.
    """

    launch_gpu: float = 6e-6
    launch_cpu: float = 8e-6
    mem_eff_gpu: float = 0.75
    mem_eff_cpu: float = 0.8
    clock_gpu: float = 1.4e9
    clock_cpu: float = 3.0e9
    outputs_per_lane: float = 32.0
    split_k_chunk: float = 512.0
    split_k_max: float = 4.0
    split_k_max_wgrad: float = 32.0
    k_half: float = 8.0
    optimizer: str = "sgd"
    update_passes: Mapping[str, int] = field(default_factory=lambda: {"sgd": 5, "adam": 7})
    update_overhead_gpu: float = 2e-6
    update_overhead_cpu: float = 10e-6
    winograd_speedup: float = 2.0
    winograd_max_flops: float = 40e12
    cpu_cache_bytes: float = float(2 << 20)
    cpu_cache_speedup: float = 4.0

    def estimate(self, op: Op, degrees: tuple[int, ...], device: Device, input_shapes: Shapes,
                 shard_shapes: tuple | None = None) -> Estimate:
        """Roofline forward/backward seconds; `shard_shapes` is `task_shapes(...)` if already known."""
        cls, _ = kind_class(op.kind)
        if cls.free:
            return Estimate(0.0, 0.0, "analytic")
        ins, outs, params = shard_shapes or task_shapes(op, degrees, input_shapes)
        tasks = 1
        for d in degrees:
            tasks *= d
        dtype = op_dtype(op)
        itemsize = DTYPE_BYTES[dtype]
        cpu = device.is_cpu
        launch = self.launch_cpu if cpu else self.launch_gpu
        bandwidth = device.mem_bandwidth * (self.mem_eff_cpu if cpu else self.mem_eff_gpu)
        peak = device.flops_for(dtype) * cls.efficiency
        half = self.outputs_per_lane * device.flops_for(dtype) / (2.0 * (self.clock_cpu if cpu else self.clock_gpu))

        n_in, n_out, n_par = _sum_volumes(ins), _sum_volumes(outs), _sum_volumes(params)
        whole_in = _sum_volumes(input_shapes)
        whole_out = _sum_volumes(o.shape for o in op.outputs)
        whole_par = _sum_volumes(p.view for p in op.params)

        io_f = self._io_fwd(cls, n_in, n_out, n_par)
        io_b = self._io_bwd(cls, n_in, n_out, n_par)
        bytes_f = itemsize * io_f + max(0.0, op.bytes_fwd - itemsize * self._io_fwd(cls, whole_in, whole_out, whole_par)) / tasks
        bytes_b = itemsize * io_b + max(0.0, op.bytes_bwd - itemsize * self._io_bwd(cls, whole_in, whole_out, whole_par)) / tasks

        flops_f = op.flops_fwd / tasks
        flops_b = (op.flops_bwd if op.flops_bwd > 0 else op.flops_fwd * (2.0 if op.params else 1.0)) / tasks
        if (not cpu and cls.name == "conv" and dtype in ("float32", "float64")
                and device.flops_for(dtype) < self.winograd_max_flops and _winograd_eligible(op)):
            peak *= self.winograd_speedup
        # A reduction (a loss, a mean) writes little but reads and works on its whole input.
        compute_f = self._compute(cls, flops_f, n_out if cls.gemm else max(n_in, n_out), peak, half)
        if cls.gemm and op.params and flops_b > 0:
            wgrad = min(flops_f, flops_b)
            compute_b = (self._compute(cls, wgrad, n_par, peak, half, self.split_k_max_wgrad)
                         + self._compute(cls, flops_b - wgrad, n_in, peak, half))
        else:
            compute_b = self._compute(cls, flops_b, n_in, peak, half)
        fwd = cls.kernels_fwd * launch + max(compute_f, self._memory(bytes_f, bandwidth, cpu))
        bwd = cls.kernels_bwd * launch + max(compute_b, self._memory(bytes_b, bandwidth, cpu))
        return Estimate(fwd, bwd, "analytic")

    def _memory(self, nbytes: float, bandwidth: float, cpu: bool) -> float:
        if not cpu:
            return nbytes / bandwidth
        cached = min(nbytes, self.cpu_cache_bytes)
        return cached / (bandwidth * self.cpu_cache_speedup) + (nbytes - cached) / bandwidth

    @staticmethod
    def _io_fwd(cls: KindClass, n_in: float, n_out: float, n_par: float) -> float:
        return cls.reads * n_in + cls.param_reads * n_par + (2 if cls.gather else 1) * n_out

    @staticmethod
    def _io_bwd(cls: KindClass, n_in: float, n_out: float, n_par: float) -> float:
        # grad_out read `reads` times, saved inputs read and input grads written, weights read and
        # weight grads written (a gather zero-fills its dense weight grad and scatter-adds rows).
        return (cls.reads * n_out + (cls.reads + 1) * n_in + (cls.param_reads + 1) * n_par
                + (2 * n_out if cls.gather else 0))

    def _compute(self, cls: KindClass, flops: float, units: float, peak: float, half: float,
                 split_max: float | None = None) -> float:
        if flops <= 0:
            return 0.0
        units = max(units, 1.0)
        if cls.gemm:
            k = flops / (2.0 * units)
            par = units * min(max(k / self.split_k_chunk, 1.0), split_max or self.split_k_max)
            sat = par / (par + half) * (k / (k + self.k_half))
        else:
            sat = units / (units + half)
        return flops / (peak * sat)

    def copy_time(self, nbytes: float, device: Device) -> float:
        """Seconds to copy `nbytes` within `device`'s memory: one kernel, a memory-bound pass that
        reads and writes them (`_memory`)."""
        if nbytes <= 0:
            return 0.0
        cpu = device.is_cpu
        bandwidth = device.mem_bandwidth * (self.mem_eff_cpu if cpu else self.mem_eff_gpu)
        return (self.launch_cpu if cpu else self.launch_gpu) + self._memory(2.0 * nbytes, bandwidth, cpu)

    def update_time(self, param_bytes: float, device: Device, optimizer: str | None = None) -> float:
        if param_bytes <= 0:
            return 0.0
        name = optimizer or self.optimizer
        passes = self.update_passes.get(name)
        if passes is None:
            raise CostModelError(f"unknown optimizer {name!r} for the update cost; known: {', '.join(self.update_passes)}")
        cpu = device.is_cpu
        bandwidth = device.mem_bandwidth * (self.mem_eff_cpu if cpu else self.mem_eff_gpu)
        overhead = self.update_overhead_cpu if cpu else self.update_overhead_gpu
        return overhead + passes * param_bytes / bandwidth


# -- the cost model ---------------------------------------------------------------------------

def graph_input_shapes(graph: OperatorGraph, op: Op) -> Shapes:
    """The full shapes of `op`'s inputs, as `CostModel.task_cost` wants them."""
    return tuple(graph.input_spec(op, i).shape for i in range(len(op.inputs)))


class CostModel:
    """Per-task forward/backward times: profile cache first, roofline fallback (module doc)."""

    def __init__(self, cache: ProfileCache | None = None, *, analytic: AnalyticModel | None = None,
                 cold: ProfileCache | None = None):
        """`cold`: op times measured with the last-level cache evicted, under the ordinary device
        products, where they are not in `cache` itself under `cold_kind` products (a kept
        benchmark run's diagnosis profile); see `cold_cost`."""
        self.cache = cache
        self.cold = cold
        self.analytic = analytic if analytic is not None else AnalyticModel()
        self._cold_memo: dict[tuple, Estimate | None] = {}
        self._hot_memo: dict[tuple, Estimate | None] = {}
        self._has_cold: bool | None = None
        self._memo: dict[tuple, tuple[Op, Estimate]] = {}
        self._counts = {"profile": 0, "analytic": 0}
        self._bound: dict[int, tuple[Op, Shapes]] = {}
        self._unknown: set[str] = set()
        self._attrs: dict[int, tuple[Op, str]] = {}

    def bind(self, graph: OperatorGraph) -> "CostModel":
        """Remember the input shapes of `graph`'s ops, so `task_cost` can be called without them."""
        for op in graph.ops:
            self._bound[id(op)] = (op, graph_input_shapes(graph, op))
        return self

    def task_cost(self, op: Op, degrees: tuple[int, ...], device: Device,
                  input_shapes: Shapes | None = None) -> Estimate:
        """Forward and backward seconds of one task of `op` split by `degrees`, on `device`."""
        key = (id(op), degrees, device.product, device.kind, device.host_workers, input_shapes)
        try:
            hit = self._memo.get(key)
        except TypeError:  # degrees or shapes given as lists
            degrees = tuple(degrees)
            input_shapes = None if input_shapes is None else tuple(tuple(s) for s in input_shapes)
            key = (id(op), degrees, device.product, device.kind, device.host_workers, input_shapes)
            hit = self._memo.get(key)
        if hit is not None:
            return hit[1]
        est = self._estimate(op, degrees, device, self._shapes(op, input_shapes))
        self._memo[key] = (op, est)
        self._counts[est.source] += 1
        return est

    def _shapes(self, op: Op, input_shapes: Shapes | None) -> Shapes:
        if input_shapes is not None:
            return input_shapes
        bound = self._bound.get(id(op))
        if bound is not None and bound[0] is op:
            return bound[1]
        if not op.inputs:
            return ()
        raise CostModelError(f"task_cost of {op.describe()} needs the shapes of its {len(op.inputs)} input(s): "
                             "pass graph_input_shapes(graph, op) or call CostModel.bind(graph) first")

    def _estimate(self, op: Op, degrees: tuple[int, ...], device: Device, shapes: Shapes) -> Estimate:
        shards = task_shapes(op, degrees, shapes)
        if self.cache is not None and len(self.cache):
            attrs = self._attrs.get(id(op))
            if attrs is None or attrs[0] is not op:
                attrs = self._attrs[id(op)] = (op, attrs_text(op))
            key = key_of_shapes(op, kind_of(device), shards, attrs[1])
            measured = self.cache.get(key)
            if measured is not None:
                return Estimate(measured[0], measured[1], "profile", self.cache.host(key))
        if not kind_class(op.kind)[1]:
            self._unknown.add(op.kind)
        return self.analytic.estimate(op, degrees, device, shapes, shards)

    def cold_cost(self, op: Op, degrees: tuple[int, ...], device: Device,
                  input_shapes: Shapes | None = None) -> Estimate | None:
        """The task's forward and backward seconds measured with the last-level cache evicted
        before every call (``autopar profile`` on the CPU measures both), or None where they were
        not measured; `planner.sim.reuse` prices a step's tasks between the two."""
        return self._measured_apart(op, degrees, device, input_shapes, cold_kind, self._cold_memo, self.cold)

    def hot_cost(self, op: Op, degrees: tuple[int, ...], device: Device,
                 input_shapes: Shapes | None = None) -> Estimate | None:
        """The task's forward and backward seconds measured back to back, each call right after the
        same task's with nothing evicted in between (``autopar profile`` on the CPU measures them
        with the others: `planner.cost.measure_task`), or None where they were not measured;
        `planner.sim.reuse` prices at them a task that a step runs right after the same task."""
        return self._measured_apart(op, degrees, device, input_shapes, hot_kind, self._hot_memo, None)

    def _measured_apart(self, op: Op, degrees: tuple[int, ...], device: Device, input_shapes: Shapes | None,
                        kind: Callable[[str], str], memo: dict[tuple, Estimate | None],
                        own: ProfileCache | None) -> Estimate | None:
        """The task's times that `cache` keeps under the `kind` of the device's product, or that
        `own` keeps under the product itself (`cold_cost`, `hot_cost`)."""
        if input_shapes is not None:
            input_shapes = tuple(tuple(s) for s in input_shapes)
        key = (id(op), tuple(degrees), device.product, device.kind, device.host_workers, input_shapes)
        if key in memo:
            return memo[key]
        shards = task_shapes(op, tuple(degrees), self._shapes(op, input_shapes))
        found = None
        if own is not None:
            found = own.get(key_of_shapes(op, kind_of(device), shards))
        if found is None and self.cache is not None:
            found = self.cache.get(key_of_shapes(op, kind(kind_of(device)), shards))
        est = None if found is None else Estimate(found[0], found[1], "profile")
        memo[key] = est
        return est

    @property
    def has_cold(self) -> bool:
        """Whether any op time measured with the last-level cache evicted is there (`cold_cost`)."""
        if self._has_cold is None:
            self._has_cold = bool(self.cold is not None and len(self.cold)) or (
                self.cache is not None and any(COLD_SUFFIX in k.split("|", 1)[0] for k in self.cache))
        return self._has_cold

    def copy_time(self, nbytes: float, device: Device) -> float:
        """Seconds to copy `nbytes` within `device`'s memory, by the analytic model."""
        return self.analytic.copy_time(nbytes, device)

    def update_time(self, param_bytes: float, device: Device, optimizer: str | None = None) -> float:
        """Seconds of one optimizer step on a parameter shard of `param_bytes` bytes (memory-bound)."""
        return self.analytic.update_time(param_bytes, device, optimizer)

    def stats(self) -> dict[str, int]:
        """How many distinct estimates came from each source: ``{"profile": n, "analytic": m}``."""
        return dict(self._counts)

    @property
    def unknown_kinds(self) -> frozenset[str]:
        """Op kinds the analytic model had no class for (estimated with its generic class)."""
        return frozenset(self._unknown)
