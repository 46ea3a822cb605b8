"""Task kernels: run one partition of an op on local shards (FlexFlow sec. 4: a task computes a
disjoint box of the op's output from the boxes of its inputs that the op's `AxisMap`s name).

    outs = forward_task(op, ranges, inputs, params)

`inputs[i]` is exactly the region ``op.input_box(i, ranges, full_shape)`` of input i (halos
included, clipped at the tensor's borders; an empty box means the task does not read that input,
pass the empty slice), `params[j]` the region ``op.param_box(j, ranges)`` of parameter j viewed as
``op.params[j].view``.  The result is one tensor per output: the region ``op.output_box(k, ranges)``.
The loss returns its partial sum divided by the global count, so the partials of all tasks add up
to the mean.  Everything is differentiable: the trainer runs autograd through these calls, and the
profiler times them.

Keyword arguments, used by the few kinds that need state outside their operands:

- ``module``: the model (the one the graph was imported from).  Opaque module calls run its
  submodule with the given parameter shards (``torch.func.functional_call``); ``source`` ops of
  buffers slice its buffers; batch norm in eval mode reads its running statistics.
- ``bn_stats``: ``(mean, var)`` for the task's channel slice, for ``batch_norm`` ops with batch
  statistics (``op.attr("cross_partition_stats")``).  The tasks that share a channel slice must
  normalize with the statistics of all of them: each computes
  ``batch_norm_partial_stats(op, x)`` = (per-channel sum, sum of squares, count) of its shard,
  the trainer all-reduces them (autograd-aware) over those tasks and passes
  ``batch_norm_stats(total)`` (sums and sums of squares, as TensorFlow's SyncBatchNormalization
  all-reduces: one collective; it loses precision only when |mean| >> std).  Without ``bn_stats``
  the task uses its own shard's two-pass statistics, which is exactly the module in train mode when
  the op is not split along n/h/w.
  `batch_norm_update_running` updates the module's running buffers from the global statistics.
- ``device``: where ``source`` ops create their tensors (default: CPU).
- ``seed``: the seed of the op's random draws in this step (`op_seed` of the data seed, the step
  and the op's index in the graph).  Dropout (``F.dropout``, ``nn.Dropout``, attention dropout) and
  random factories then draw the *whole* op's mask or values from it and take the task's region,
  so every partition of the op computes exactly what one device computes, and a run is
  reproducible from its seed.  Without it they use torch's global generator.

`run_graph` executes a whole graph on one process, each op split into its tasks and the task
outputs stitched back together: the reference that proves the graph and the kernels faithful.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import hashlib

import torch
import torch.func
import torch.nn as nn
import torch.nn.functional as F

from ._kernels_nn import (NN_KERNELS, Ctx, batch_norm_partial_stats, batch_norm_stats,
                          batch_norm_update_running, dropout, local_shape, seeded_region)
from .graph import Op, OperatorGraph
from .opkinds._base import FrozenDict, FrozenSlice, Slot
from .regions import Box, grid_coords

__all__ = ["forward_task", "run_graph", "batch_norm_partial_stats", "batch_norm_stats", "batch_norm_update_running",
           "KERNEL_KINDS", "is_random", "op_seed"]

_TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                 "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
                 "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def forward_task(op: Op, ranges: Mapping[str, tuple[int, int]], inputs: Sequence[torch.Tensor],
                 params: Sequence[torch.Tensor], *, module: nn.Module | None = None,
                 bn_stats: tuple[torch.Tensor, torch.Tensor] | None = None,
                 device: torch.device | str | None = None, seed: int | None = None) -> list[torch.Tensor]:
    """Compute the output regions of the task of `op` that covers `ranges` (see the module docstring)."""
    ctx = Ctx(module=module, bn_stats=bn_stats, device=torch.device(device) if device is not None else None,
              seed=seed)
    if op.kind == "input":
        # The data loader's shard; without one (profiling) a zero stand-in of the right shape.
        return [inputs[0] if inputs else torch.zeros(local_shape(op, 0, ranges), dtype=_dtype(op), device=ctx.device)]
    kernel = _KERNELS.get(op.kind)
    if kernel is None:
        raise ValueError(f"{op.describe()}: no task kernel for kind {op.kind!r}; known kinds: {', '.join(_KERNELS)}")
    return kernel(op, dict(ranges), _operands(op, inputs, params), ctx)


def op_seed(seed: int, step: int, op_index: int) -> int:
    """The seed of op `op_index`'s random draws at `step` of a run seeded with `seed`."""
    digest = hashlib.blake2b(f"autopar:{seed}:{step}:{op_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def is_random(op: Op) -> bool:
    """Whether the op draws random numbers when it runs (dropout in training mode, random factories)."""
    if op.kind == "elementwise":
        return _dropout_p(op) is not None
    if op.kind == "attention":
        return bool(op.attr("training")) and (op.attr("dropout") or 0) > 0
    if op.kind == "sdpa":
        return (op.attr("dropout_p") or 0) > 0
    return op.kind == "source" and op.attr("fill") in ("rand", "randn")


def _dropout_p(op: Op) -> float | None:
    """p of an elementwise dropout op that drops (``nn.Dropout`` in training mode, ``F.dropout`` with
    training=True); None for any other op."""
    fn, how = op.attr("fn"), op.attr("how")
    if how == "module" and type(fn) is nn.Dropout:
        return float(fn.p) if fn.training and fn.p > 0 else None
    if how == "function" and fn is F.dropout:
        args, kwargs = op.attr("call")
        kw = dict(kwargs.items) if isinstance(kwargs, FrozenDict) else dict(kwargs or ())
        p = args[1] if len(args) > 1 else kw.get("p", 0.5)
        training = args[2] if len(args) > 2 else kw.get("training", True)
        if isinstance(p, (int, float)) and isinstance(training, bool) and training and p > 0:
            return float(p)
    return None


def _operands(op: Op, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> list[Any]:
    out = []
    for key in op.attr("operands", ()):
        out.append(None if key is None else (inputs if key[0] == "i" else params)[int(key[1:])])
    return out


def _dtype(op: Op, k: int = 0) -> torch.dtype:
    return _TORCH_DTYPES[op.outputs[k].dtype]


# -- template kinds: re-issue the traced call on the shards ------------------------------------------

def _thaw(v: Any, operands: Sequence[Any]) -> Any:
    if isinstance(v, Slot):
        return operands[v.index]
    if isinstance(v, tuple):
        return tuple(_thaw(x, operands) for x in v)
    if isinstance(v, FrozenDict):
        return {k: _thaw(x, operands) for k, x in v.items}
    if isinstance(v, FrozenSlice):
        return slice(_thaw(v.start, operands), _thaw(v.stop, operands), _thaw(v.step, operands))
    return v


def _template(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    if ctx.seed is not None and op.kind == "elementwise":
        p = _dropout_p(op)
        if p is not None:
            x = next(o for o in operands if isinstance(o, torch.Tensor))
            return [dropout(x, p, ctx, op.outputs[0].shape, op.output_box(0, ranges))]
    if op.attr("mutates"):
        # An in-place call the importer could not rewrite: let it mutate a copy, not the producer's shard.
        operands = [o.clone() if isinstance(o, torch.Tensor) else o for o in operands]
    fn, how = op.attr("fn"), op.attr("how")
    args_t, kwargs_t = op.attr("call")
    args, kwargs = _thaw(args_t, operands), _thaw(kwargs_t, operands)
    if op.attr("module") is not None:
        if ctx.module is None:
            raise ValueError(f"{op.describe()} calls submodule {op.attr('module')}: pass module= (the model)")
        keys = op.attr("param_keys", ())
        sub = ctx.module.get_submodule(op.attr("module"))
        shards = dict(zip(keys, operands[len(operands) - len(keys):]))
        result = torch.func.functional_call(sub, shards, args, kwargs, strict=False)
    elif how == "method":
        result = getattr(args[0], fn)(*args[1:], **kwargs)
    else:
        result = fn(*args, **kwargs)
    return [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]


# -- structural kinds ------------------------------------------------------------------------------

def _source(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    box = op.output_box(0, ranges)
    shape = tuple(hi - lo for lo, hi in box)
    dtype, fill = _dtype(op), op.attr("fill")
    kw = {"dtype": dtype, "device": ctx.device}
    if fill == "zeros":
        return [torch.zeros(shape, **kw)]
    if fill == "ones":
        return [torch.ones(shape, **kw)]
    if fill == "full":
        return [torch.full(shape, op.attr("value"), **kw)]
    if fill in ("rand", "randn") and ctx.seed is not None:
        like = torch.empty(0, device=ctx.device)
        return [seeded_region(ctx.seed, op.outputs[0].shape, box, like, fill).to(dtype)]
    if fill == "rand":
        return [torch.rand(shape, **kw)]
    if fill == "randn":
        return [torch.randn(shape, **kw)]
    if fill == "arange":
        start, step = op.attr("start"), op.attr("step")
        (a, b), = box
        return [torch.arange(start + a * step, start + b * step, step, **kw)[: b - a]]
    if op.attr("buffer") is not None:
        if ctx.module is None:
            raise ValueError(f"{op.describe()} reads buffer {op.attr('buffer')}: pass module= (the model)")
        value = ctx.module.get_buffer(op.attr("buffer"))
    else:
        value = op.attr("value")
    return [value[_slices(box)].to(ctx.device or value.device)]


def _concat(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    axis = op.attr("axis")
    if op.attr("stack"):
        return [torch.stack(operands, axis)]
    dim = op.outputs[0].dims[axis]
    used = []
    for k, (t, size) in enumerate(zip(operands, op.attr("sizes"))):
        lo, hi = _maps_of(op, k)[axis].map(ranges.get(dim), size)
        if hi > lo:
            used.append(t)
    return [torch.cat(used, axis) if len(used) > 1 else used[0]]


def _maps_of(op: Op, k: int):
    key = op.attr("operands")[k]
    return op.input_maps[int(key[1:])] if key[0] == "i" else op.params[int(key[1:])].maps


def _slice(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    index = []
    for it in op.attr("items"):
        if it[0] == "new":
            index.append(None)
        elif it[0] == "sel":
            index.append(0)
        else:
            index.append(slice(0, None, it[3]))
    return [operands[0][tuple(index)]]


def _reshape(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    return [operands[0].reshape(local_shape(op, 0, ranges))]


def _permute(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    return [operands[0].permute(op.attr("perm"))]


def _expand(op: Op, ranges: dict, operands: list, ctx: Ctx) -> list[torch.Tensor]:
    return [operands[0].expand(local_shape(op, 0, ranges))]


_KERNELS: dict[str, Callable] = {
    "input": None, "source": _source, "concat": _concat, "slice": _slice, "reshape": _reshape,
    "permute": _permute, "expand": _expand,
    **{k: _template for k in ("elementwise", "reduce", "matmul", "linear", "layer_norm", "embedding", "softmax",
                              "log_softmax", "opaque")},
    **NN_KERNELS,
}
KERNEL_KINDS = tuple(_KERNELS)


# -- reference executor ----------------------------------------------------------------------------

def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def run_graph(graph: OperatorGraph, module: nn.Module, inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
              target: torch.Tensor | None = None,
              degrees: Mapping[str, tuple[int, ...]] | None = None,
              rng: tuple[int, int] | None = None) -> dict[str, list[torch.Tensor]]:
    """Run `graph` op by op on this process, every op split into the tasks of `degrees` (op name ->
    degree per parallel dim; all 1 by default), and return every op's outputs stitched together.
    `rng` = (seed, step) seeds the random ops as the trainer does (`op_seed`)."""
    meta = dict(graph.meta)
    names = meta.get("inputs") or tuple(op.name for op in graph.ops if op.kind == "input")
    data = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(names, inputs))
    if target is not None and meta.get("target"):
        data[meta["target"]] = target
    params = dict(module.named_parameters())
    values: dict[str, list[torch.Tensor]] = {}
    for index, op in enumerate(graph.ops):
        seed = op_seed(rng[0], rng[1], index) if rng is not None and is_random(op) else None
        deg = tuple((degrees or {}).get(op.name, (1,) * len(op.pardims)))
        full = [values[r.op][r.index] for r in op.inputs]
        views = [params[p.name].reshape(p.view) for p in op.params]
        tasks = []
        for coord in grid_coords(deg):
            ranges = op.task_ranges(deg, coord)
            if op.kind == "input":
                if op.name not in data:
                    raise ValueError(f"run_graph: no data for input {op.name}; give inputs {list(names)} and the target")
                loc = [data[op.name][_slices(op.output_box(0, ranges))]]
            else:
                loc = [t[_slices(op.input_box(i, ranges, t.shape))] for i, t in enumerate(full)]
            tasks.append((ranges, loc, [v[_slices(op.param_box(j, ranges))] for j, v in enumerate(views)]))
        stats = _bn_stats(op, tasks, module) if op.kind == "batch_norm" else {}
        pieces = []
        for ranges, loc, ps in tasks:
            bn = stats.get(_channel_key(op, ranges)) if stats else None
            outs = forward_task(op, ranges, loc, ps, module=module, bn_stats=bn, seed=seed)
            pieces += [(k, op.output_box(k, ranges), t) for k, t in enumerate(outs)]
        values[op.name] = _stitch(op, pieces)
    return values


def _channel_key(op: Op, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    out = op.outputs[0]
    return tuple(ranges.get(out.dims[1], (0, out.shape[1])))


def _bn_stats(op: Op, tasks: list, module: nn.Module) -> dict:
    """What the trainer's all-reduce computes: global statistics per channel slice, from task partials."""
    if not op.attr("batch_stats"):
        m = module.get_submodule(op.attr("module"))
        return {key: (m.running_mean[key[0]:key[1]], m.running_var[key[0]:key[1]])
                for key in {_channel_key(op, r) for r, _, _ in tasks}}
    groups: dict[tuple[int, int], list] = {}
    for ranges, loc, _ in tasks:
        groups.setdefault(_channel_key(op, ranges), []).append(batch_norm_partial_stats(op, loc[0]))
    # A channel slice computed by one task needs no shared statistics (the kernel's own are exact).
    return {key: batch_norm_stats(parts) for key, parts in groups.items() if len(parts) > 1}


def _stitch(op: Op, pieces: list) -> list[torch.Tensor]:
    outs = []
    for k, spec in enumerate(op.outputs):
        acc: dict[Box, torch.Tensor] = {}
        for kk, box, t in pieces:
            if kk == k:
                acc[box] = acc[box] + t if box in acc else t   # reduction dims: partial sums add up
        if not spec.shape:
            outs.append(next(iter(acc.values())))
            continue
        first = next(iter(acc.values()))
        full = torch.zeros(spec.shape, dtype=first.dtype, device=first.device)
        for box, t in acc.items():
            full[_slices(box)] = t
        outs.append(full)
    return outs
