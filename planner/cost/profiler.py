"""Measure op tasks on a local device and store the medians in the profile cache.

    autopar profile        # the CLI calls profile_local(["resnet101"], workers=4, options={...})

FlexFlow (sec. 5.1) sets a task's execution time by "running the task multiple times on the
device and measuring the average execution time", once per distinct operation type and size;
OptCNN (sec. 5.1) measures each layer under each configuration.  This module does that for
autopar: for every distinct task key (`planner.cost.profile_cache.task_key`) of the requested
(op, degrees) pairs that the cache does not hold yet, it

1. builds random local shards of the representative task's inputs and parameters, with the
   graph's dtypes (integer inputs — token ids, class labels — are drawn below the smallest axis
   of the op's float tensors, so they are valid indices whatever they index);
2. runs the op's task kernel (`planner.ir.kernels.forward_task`, the same code the trainer runs)
   `warmup` times (at least once), then `repeats` timed times, and takes the median; a task so
   slow that the repeats would exceed `budget` seconds is repeated fewer times;
3. times the backward pass the same way: ``torch.autograd.grad`` of the outputs with a fixed
   random output gradient, with respect to the parameters and to the inputs a real step needs
   gradients for (float inputs not produced by a graph input), reusing one forward graph
   (``retain_graph``) so every repeat measures the same work.  A standalone
   ``autograd.grad`` call pays a fixed engine start-up (20–45 µs on this machine's CPU, against
   3–5 µs per node) that a training step pays once for its whole backward pass, not once per
   op; `engine_overhead` measures it (chains of 1 and 9 trivial nodes) and it is subtracted,
   keeping at least one trivial node's time;
4. stores the two medians under the device's product name.

Timing: ``time.perf_counter`` around each call on CPU (PyTorch CPU ops are synchronous); on CUDA,
``torch.cuda.Event`` pairs recorded on the current stream around the call, with a synchronize
before reading them, so launch queuing is not mistaken for execution (untested here: this
machine has no GPU).  The local CPU workers of the `local` preset run one thread each, so
`profile_local` pins torch to one thread while it measures.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from ..errors import CostModelError, TopologyError
from ..hardware.catalog import LOCAL_CPU, lookup
from ..ir.graph import Op, OperatorGraph
from .model import graph_input_shapes
from .profile_cache import ProfileCache, representative_ranges, task_key, task_shapes

ForwardTask = Callable[[Op, dict, list, list], Any]

@dataclass(frozen=True)
class ProfileRecord:
    key: str
    op: str  # the first op (by graph order) that has this key
    degrees: tuple[int, ...]
    forward: float
    backward: float


@dataclass
class ProfileReport:
    """What one profiling run measured, found already cached, and could not run."""

    device_kind: str
    measured: list[ProfileRecord] = field(default_factory=list)
    cached: int = 0
    skipped: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    seconds: float = 0.0
    engine_overhead: float = 0.0  # seconds taken off every backward median (see module doc)
    remaining: int = 0  # new task keys left unmeasured because of `max_tasks`

    def merge(self, other: "ProfileReport") -> "ProfileReport":
        return ProfileReport(self.device_kind, self.measured + other.measured, self.cached + other.cached,
                             self.skipped + other.skipped, self.seconds + other.seconds,
                             max(self.engine_overhead, other.engine_overhead), self.remaining + other.remaining)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_kind": self.device_kind, "measured": len(self.measured), "cached": self.cached,
            "skipped": [{"op": o, "degrees": list(d), "reason": r} for o, d, r in self.skipped],
            "remaining": self.remaining, "seconds": round(self.seconds, 3), "engine_overhead": self.engine_overhead,
            "entries": [{"op": r.op, "degrees": list(r.degrees), "forward": r.forward, "backward": r.backward,
                         "key": r.key} for r in self.measured],
        }


def device_kind_of(device: torch.device) -> str:
    """The product name task keys use for `device`, matching the names topologies give devices.

    CPU: the `local` preset's worker product (`planner.hardware.catalog.LOCAL_CPU`).  CUDA: the driver's
    name with spaces as dashes, as GPU feature discovery writes the `nvidia.com/gpu.product` node
    label ("Tesla-P100-SXM2-16GB"), resolved to the device catalog's product when it knows it.
    """
    if device.type == "cpu":
        return LOCAL_CPU.product
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        label = torch.cuda.get_device_name(device).replace(" ", "-")
        try:
            return lookup(label).product
        except TopologyError:  # not in the catalog: a topology file names it the same way
            return label
    raise CostModelError(f"cannot profile on device {device}: only cpu and cuda devices are supported")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        torch.cuda.synchronize(device)


def _median_seconds(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int,
                    budget: float | None = None) -> float:
    """Median of `repeats` timed calls after `warmup` (at least one) untimed ones.

    With a `budget` (seconds), a call so slow that `repeats` of them would exceed it is repeated
    fewer times (at least once): the spread of such calls is small next to their length.
    """
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        fn()
    if budget is not None:
        repeats = max(1, min(repeats, int(budget / max(first, 1e-9))))
    _sync(device)
    times = []
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        with torch.cuda.device(device):
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)  # ms -> s
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


_TORCH_DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}


def _task_tensors(graph: OperatorGraph, op: Op, degrees: tuple[int, ...], device: torch.device,
                  gen: torch.Generator) -> tuple[dict, list[torch.Tensor], list[torch.Tensor]]:
    ranges = representative_ranges(op, degrees)
    in_shapes, _, par_shapes = task_shapes(op, degrees, graph_input_shapes(graph, op), ranges)
    in_dtypes = [graph.input_spec(op, i).dtype for i in range(len(op.inputs))]
    float_sizes = [s for shape, dt in zip(in_shapes, in_dtypes) if _TORCH_DTYPES[dt].is_floating_point
                   for s in shape] + [s for shape in par_shapes for s in shape]
    index_high = max(1, min(float_sizes, default=1))
    inputs = []
    for i, (shape, dt) in enumerate(zip(in_shapes, in_dtypes)):
        tdt = _TORCH_DTYPES[dt]
        if tdt.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=tdt)
            producer = graph[op.inputs[i].op]
            t.requires_grad_(bool(producer.inputs))  # graph inputs (data) need no gradient
        elif tdt is torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).to(device=device, dtype=tdt)
        else:
            t = torch.randint(0, index_high, shape, generator=gen).to(device=device, dtype=tdt)
        inputs.append(t)
    params = [torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=_TORCH_DTYPES[p.dtype])
              .requires_grad_(True) for shape, p in zip(par_shapes, op.params)]
    return ranges, inputs, params


def engine_overhead(device: torch.device, repeats: int = 50) -> tuple[float, float]:
    """(fixed seconds per ``autograd.grad`` call, seconds per trivial node) on `device`.

    From the medians of backward passes through chains of 1 and 9 scalar multiplications:
    per node = difference / 8, fixed = 1-node time - per node.
    """
    x = torch.randn(4, device=device, requires_grad=True)
    g = torch.ones(4, device=device)

    def chain(k: int) -> float:
        y = x
        for _ in range(k):
            y = y * 1.5
        return _median_seconds(lambda: torch.autograd.grad(y, [x], g, retain_graph=True), device, 5, repeats)

    one, nine = chain(1), chain(9)
    # Timer noise can make the difference tiny or negative; a node costs at least 0.1 µs.
    per_node = max(1e-7, (nine - one) / 8)
    return max(0.0, one - per_node), per_node


def _outputs(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for t in result if isinstance(t, torch.Tensor)]


def measure_task(graph: OperatorGraph, op: Op, degrees: tuple[int, ...], device: torch.device, *,
                 repeats: int = 10, warmup: int = 3, forward_task: ForwardTask | None = None,
                 module: nn.Module | None = None, budget: float | None = None, seed: int = 0,
                 overhead: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """Median forward and backward seconds of the representative task of `op` split by `degrees`.

    `module` (the model the graph was imported from) is passed on to the kernel for ops that call
    a submodule.  `overhead` is `engine_overhead(device)`: its fixed part is taken off the
    backward median.
    """
    if forward_task is None:
        from ..ir.kernels import forward_task
    extra: dict[str, Any] = {"module": module} if module is not None else {}
    if device.type != "cpu":  # pragma: no cover - needs a GPU; where kernels create tensors
        extra["device"] = device
    gen = torch.Generator().manual_seed(seed)
    ranges, inputs, params = _task_tensors(graph, op, degrees, device, gen)

    def fwd():
        return forward_task(op, ranges, inputs, params, **extra)

    fwd_s = _median_seconds(fwd, device, warmup, repeats, budget)
    outs = [o for o in _outputs(fwd()) if o.requires_grad]
    leaves = [t for t in inputs + params if t.requires_grad]
    if not outs or not leaves:
        return fwd_s, 0.0
    grads = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(device=device, dtype=o.dtype) for o in outs]

    def bwd():
        return torch.autograd.grad(outs, leaves, grads, retain_graph=True, allow_unused=True)

    fixed, per_node = overhead
    return fwd_s, max(_median_seconds(bwd, device, warmup, repeats, budget) - fixed, per_node)


def profile_ops(graph: OperatorGraph, degree_choices: Iterable[tuple[str, Sequence[int]]] | None,
                device: torch.device, cache: ProfileCache, *, repeats: int = 10, warmup: int = 3,
                device_kind: str | None = None, forward_task: ForwardTask | None = None,
                module: nn.Module | None = None, budget: float | None = 2.0, max_tasks: int | None = None,
                progress: Callable[[int, int, str], None] | None = None) -> ProfileReport:
    """Measure every distinct task key of `degree_choices` the cache lacks; store the medians.

    `degree_choices` lists (op name, degrees) pairs; None means every op unpartitioned.  Ops
    without inputs (graph inputs, constants) are not measured.  An op whose kernel fails is skipped
    and listed in the report with the error, so one unsupported op does not stop a run.  `budget`
    caps the seconds spent timing one direction of one task (slow tasks get fewer repeats);
    `max_tasks` caps how many new keys are measured (the rest are counted in ``remaining``).
    """
    if repeats < 1 or warmup < 0:
        raise CostModelError(f"profiling needs repeats >= 1 and warmup >= 0, got repeats={repeats} warmup={warmup}")
    kind = device_kind or device_kind_of(device)
    report = ProfileReport(kind)
    t0 = time.perf_counter()
    if degree_choices is None:
        degree_choices = [(op.name, (1,) * len(op.pardims)) for op in graph.ops]
    seen: set[str] = set()
    work: list[tuple[str, Op, tuple[int, ...]]] = []
    for name, degrees in degree_choices:
        op = graph[name]
        if not op.inputs:
            continue
        degrees = tuple(degrees)
        key = task_key(op, degrees, kind, graph_input_shapes(graph, op))
        if key in seen:
            continue
        seen.add(key)
        if key in cache:
            report.cached += 1
        else:
            work.append((key, op, degrees))
    if max_tasks is not None and len(work) > max(0, max_tasks):
        report.remaining = len(work) - max(0, max_tasks)
        work = work[:max(0, max_tasks)]
    overhead = engine_overhead(device) if work else (0.0, 0.0)
    report.engine_overhead = overhead[0]
    for n, (key, op, degrees) in enumerate(work):
        if progress is not None:
            progress(n, len(work), op.name)
        try:
            fwd, bwd = measure_task(graph, op, degrees, device, repeats=repeats, warmup=warmup,
                                    forward_task=forward_task, module=module, budget=budget, overhead=overhead)
        except Exception as e:  # an op the kernels cannot run yet; keep going, report it
            report.skipped.append((op.name, degrees, f"{type(e).__name__}: {e}"))
            continue
        cache.put(key, fwd, bwd)
        report.measured.append(ProfileRecord(key, op.name, degrees, fwd, bwd))
    if progress is not None:
        progress(len(work), len(work), "")
    report.seconds = time.perf_counter() - t0
    return report


def profile_local(models: Sequence[str], *, workers: int = 2, options: Mapping[str, object] | None = None,
                  cache: ProfileCache | None = None, repeats: int = 10, warmup: int = 3, budget: float | None = 2.0,
                  max_tasks: int | None = None, device: torch.device | None = None,
                  progress: Callable[[str, int, int, str], None] | None = None) -> ProfileReport:
    """`autopar profile`: measure what a plan for the ``local:<workers>`` preset can use.

    For every model (a zoo name or ``package.module:factory``, built with `options` — use the
    options the plan will use, e.g. the same ``batch``, or the keys will not match) every op is
    measured under every degree vector with at most `workers` tasks
    (`planner.ir.strategy.degree_choices`), each distinct task key once.  On the CPU (the default
    `device`) torch runs one thread (a `local` worker's share) and times are stored under the
    preset's device product; on a CUDA `device` under its product (`device_kind_of`).  The cache
    (default: `ProfileCache.load()` of the default path) is saved after each model, so an
    interrupted run keeps what it measured.  `max_tasks` caps the new keys measured over all
    models.  `progress(model, i, n, op)` is called per task.
    """
    from ..hardware.presets import get_preset
    from ..ir.fx_import import import_spec
    from ..ir.strategy import degree_choices
    from ..zoo import load_model

    device = device if device is not None else torch.device("cpu")
    kind = get_preset(f"local:{workers}").devices[0].product if device.type == "cpu" else device_kind_of(device)
    cache = cache if cache is not None else ProfileCache.load()
    total = ProfileReport(kind)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        for name in models:
            spec = load_model(name, **dict(options or {}))
            graph = import_spec(spec)
            choices = [(op.name, d) for op in graph.ops for d in degree_choices(op, workers)]
            step = None if progress is None else (lambda i, n, op, _m=name: progress(_m, i, n, op))
            left = None if max_tasks is None else max(0, max_tasks - len(total.measured) - len(total.skipped))
            report = profile_ops(graph, choices, device, cache, repeats=repeats, warmup=warmup, device_kind=kind,
                                 module=spec.module.to(device), budget=budget, max_tasks=left, progress=step)
            total = total.merge(report)
            cache.save()
    finally:
        torch.set_num_threads(threads)
    return total
