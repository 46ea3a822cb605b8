"""Builders of the tensor-algebra kinds: input, source, elementwise, reduce, matmul, concat, opaque.

These ops have no parameters of their own (a parameter may still be an operand, e.g. ``x + pos``
with a learned ``pos``, or ``x @ W``; partitioning the axes such an operand follows then splits the
parameter, which makes them parameter dims, FlexFlow sec. 4).  Every output axis that carries
through is partitionable; an axis an op reduces or contracts is read whole.
"""

from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._base import (Built, Call, Namer, NotThisKind, Operand, Use, broadcast_maps,
                    broadcast_names, broadcastable, default_pardims, ident, make_op, norm_axis,
                    numel, out_tensor, register, single, spec, template_attrs, templatize)
from ..graph import WHOLE, AxisMap, DimKind, Op, ParDim, TensorRef, TensorSpec


# -- input ---------------------------------------------------------------------------------------

def build_input(name: str, tensor: TensorSpec, batch: str) -> Op:
    """A graph input (or the labels): no inputs; sample dim plus every other axis as an attribute."""
    pardims = tuple(ParDim(d, DimKind.SAMPLE if d == batch else DimKind.ATTRIBUTE, s)
                    for d, s in zip(tensor.dims, tensor.shape) if d == batch or s > 1)
    return Op(name=name, kind="input", inputs=(), input_maps=(), outputs=(tensor,), pardims=pardims,
              bytes_fwd=float(tensor.nbytes), target="input")


# -- elementwise ----------------------------------------------------------------------------------

def _fns(namespace, names):
    return [getattr(namespace, n) for n in names if hasattr(namespace, n)]


_EW_OPERATOR = _fns(operator, "add sub mul truediv floordiv mod pow neg pos abs and_ or_ xor invert "
                              "eq ne lt le gt ge".split())
_EW_NAMES = ("add sub subtract mul multiply div divide true_divide floor_divide neg negative abs exp exp2 expm1 "
             "log log1p log2 log10 sqrt rsqrt sin cos tan sinh cosh tanh asin acos atan atan2 sigmoid relu erf "
             "erfc erfinv floor ceil round trunc frac sign sgn clamp clip clamp_min clamp_max pow square "
             "reciprocal maximum minimum fmax fmin where masked_fill lerp addcmul addcdiv logical_and logical_or "
             "logical_not logical_xor eq ne lt gt le ge isnan isinf isfinite nan_to_num fmod remainder hypot "
             "logit float_power bitwise_and bitwise_or bitwise_xor bitwise_not rsub").split()
_EW_F = ("relu relu6 elu selu celu gelu silu mish leaky_relu hardtanh hardsigmoid hardswish softplus softsign "
         "tanhshrink threshold logsigmoid sigmoid tanh dropout alpha_dropout hardshrink softshrink").split()
_EW_METHODS = _EW_NAMES + ("float double half bfloat16 long int bool to type type_as detach "
                           "__radd__ __rsub__ __rmul__ __rtruediv__").split()
EW_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Sigmoid,
              nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Softplus, nn.Softsign, nn.Tanhshrink,
              nn.LogSigmoid, nn.Threshold, nn.Dropout, nn.AlphaDropout, nn.Hardshrink, nn.Softshrink)


@register(functions=_EW_OPERATOR + _fns(torch, _EW_NAMES) + _fns(F, _EW_F), methods=_EW_METHODS, modules=EW_MODULES)
def build_elementwise(c: Call) -> Built:
    """Unary/binary ops with broadcasting: every output axis partitionable; size-1 broadcast axes read whole."""
    out = out_tensor(c)
    operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
    shape = tuple(out.shape)
    if not all(broadcastable(o.spec.shape, shape) for o in operands):
        raise NotThisKind("operands do not broadcast to the output")
    names = broadcast_names(shape, operands, Namer())
    uses = [Use(o, broadcast_maps(o, shape, names)) for o in operands]
    o_spec = spec(out, names)
    fn = c.fn
    attrs = template_attrs(fn, c.how, args_t, kwargs_t)
    attrs["mutates"] = c.mutates
    return single(make_op(c, "elementwise", uses, [o_spec], default_pardims(o_spec, c.batch),
                          flops=numel(shape), attrs=attrs))


# -- reduce ----------------------------------------------------------------------------------------

_REDUCE = "sum mean amax amin prod var std logsumexp argmax argmin all any nansum nanmean count_nonzero".split()


@register(functions=_fns(torch, _REDUCE), methods=_REDUCE)
def build_reduce(c: Call) -> Built:
    """Reductions over some axes: kept axes partitionable, reduced axes read whole."""
    out = out_tensor(c)
    x = c.args[0] if c.args else None
    if not isinstance(x, Operand):
        raise NotThisKind("first argument is not a tensor")
    rank = len(x.spec.shape)
    dim = c.arg(1, "dim")
    if isinstance(dim, bool) or dim is None:
        axes = set(range(rank))
    elif isinstance(dim, int):
        axes = {norm_axis(dim, rank)}
    elif isinstance(dim, (tuple, list)) and all(isinstance(d, int) for d in dim):
        axes = {norm_axis(d, rank) for d in dim} if dim else set(range(rank))
    else:
        raise NotThisKind(f"reduction dim {dim!r}")
    shape = tuple(out.shape)
    kept = [k for k in range(rank) if k not in axes]
    if shape == tuple(x.spec.shape[k] for k in kept):
        keepdim = False
    elif shape == tuple(1 if k in axes else s for k, s in enumerate(x.spec.shape)):
        keepdim = True
    else:
        raise NotThisKind(f"output shape {shape} is not a reduction of {x.spec.shape} over {sorted(axes)}")
    namer = Namer()
    names = {k: namer(x.spec.dims[k], k) for k in range(rank) if keepdim or k not in axes}
    o_spec = spec(out, [names[k] for k in sorted(names)])
    maps = tuple(WHOLE if k in axes else ident(names[k]) for k in range(rank))
    operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
    uses = [Use(o, maps if o is x else tuple(WHOLE for _ in o.spec.shape)) for o in operands]
    return single(make_op(c, "reduce", uses, [o_spec], default_pardims(o_spec, c.batch), flops=numel(x.spec.shape),
                          attrs={**template_attrs(c.fn, c.how, args_t, kwargs_t), "axes": tuple(sorted(axes))}))


@register(functions=[torch.max, torch.min], methods=["max", "min"])
def build_max_min(c: Call) -> Built:
    """``torch.max(a, b)`` is elementwise; ``torch.max(x)`` a full reduction (with a dim it is opaque)."""
    if len(c.args) > 1 and isinstance(c.args[1], Operand) or isinstance(c.kwargs.get("other"), Operand):
        return build_elementwise(c)
    if len(c.args) > 1 or c.kwargs:
        raise NotThisKind("max/min along a dim returns (values, indices)")
    return build_reduce(c)


# -- matmul ---------------------------------------------------------------------------------------

@register(functions=[torch.matmul, torch.bmm, torch.mm, operator.matmul], methods=["matmul", "bmm", "mm", "__matmul__"])
def build_matmul(c: Call) -> Built:
    """(…, m, k) @ (…, k, p): batch axes and m, p partitionable, k (contracted) whole."""
    out = out_tensor(c)
    a, b = c.arg(0, "input"), c.arg(1, "mat2", c.kwargs.get("other"))
    if not (isinstance(a, Operand) and isinstance(b, Operand)) or min(len(a.spec.shape), len(b.spec.shape)) < 2:
        raise NotThisKind("matmul of vectors")
    shape = tuple(out.shape)
    rank = len(shape)
    namer = Namer()
    names = []
    for axis in range(rank - 2):
        hint = None
        for o in (a, b):
            k = axis - (rank - len(o.spec.shape))
            if k >= 0 and o.spec.shape[k] == shape[axis]:
                hint = o.spec.dims[k]
                break
        names.append(namer(hint, axis))
    names += [namer(a.spec.dims[-2], rank - 2), namer(b.spec.dims[-1], rank - 1)]

    def maps(o: Operand, keep: int) -> tuple:
        off = rank - len(o.spec.shape)
        ms = [ident(names[off + k]) if s == shape[off + k] else WHOLE for k, s in enumerate(o.spec.shape[:-2])]
        last2 = [ident(names[-2]), WHOLE] if keep == 0 else [WHOLE, ident(names[-1])]
        return tuple(ms + last2)
    o_spec = spec(out, names)
    operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
    if operands != [a, b]:
        raise NotThisKind("unexpected matmul operands")
    uses = [Use(a, maps(a, 0)), Use(b, maps(b, 1))]
    k = a.spec.shape[-1]
    return single(make_op(c, "matmul", uses, [o_spec], default_pardims(o_spec, c.batch), flops=2 * numel(shape) * k,
                          attrs=template_attrs(c.fn, c.how, args_t, kwargs_t)))


# -- concat / stack -------------------------------------------------------------------------------

@register(functions=_fns(torch, ["cat", "concat", "concatenate"]))
def build_concat(c: Call) -> Built:
    """Concatenation: the joined axis is partitionable, each input shifted by its offset."""
    out = out_tensor(c)
    tensors = c.arg(0, "tensors")
    dim = c.arg(1, "dim", c.kwargs.get("axis", 0))
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Operand) for t in tensors):
        raise NotThisKind("cat of a non-list")
    shape = tuple(out.shape)
    axis = norm_axis(dim, len(shape))
    parts = [t for t in tensors if numel(t.spec.shape) > 0]   # torch.cat skips empty pieces
    if not parts or any(len(t.spec.shape) != len(shape) for t in parts):
        raise NotThisKind("cat of tensors of another rank")
    namer = Namer()
    largest = max(parts, key=lambda t: numel(t.spec.shape))     # name the axes after the main input
    names = [namer(largest.spec.dims[k], k) for k in range(len(shape))]
    uses, off = [], 0
    for t in parts:
        maps = tuple(AxisMap(dim=names[k], shift=-off) if k == axis else ident(names[k]) for k in range(len(shape)))
        uses.append(Use(t, maps))
        off += t.spec.shape[axis]
    o_spec = spec(out, names)
    sizes = tuple(t.spec.shape[axis] for t in parts)
    return single(make_op(c, "concat", uses, [o_spec], default_pardims(o_spec, c.batch), flops=0,
                          attrs={"axis": axis, "sizes": sizes, "stack": False}))


@register(functions=[torch.stack])
def build_stack(c: Call) -> Built:
    """``torch.stack``: a concat along a new axis, which is kept whole (an input is one index of it)."""
    out = out_tensor(c)
    tensors = c.arg(0, "tensors")
    if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, Operand) for t in tensors):
        raise NotThisKind("stack of a non-list")
    shape = tuple(out.shape)
    axis = norm_axis(c.arg(1, "dim", 0), len(shape))
    namer = Namer()
    first = tensors[0].spec.dims
    in_axes = [k for k in range(len(shape)) if k != axis]
    names = [None] * len(shape)
    for j, k in enumerate(in_axes):
        names[k] = namer(first[j], k)
    names[axis] = namer("s", axis)
    uses = [Use(t, tuple(ident(names[k]) for k in in_axes)) for t in tensors]
    o_spec = spec(out, names)
    return single(make_op(c, "concat", uses, [o_spec], default_pardims(o_spec, c.batch, exclude=[names[axis]]),
                          flops=0, attrs={"axis": axis, "stack": True}))


# -- source (factories and buffers) ---------------------------------------------------------------

_FILL = {"zeros": "zeros", "ones": "ones", "empty": "zeros", "full": "full", "rand": "rand", "randn": "randn"}
_SOURCE_FUNCS = {getattr(torch, n): n for n in ("zeros", "ones", "empty", "full", "rand", "randn", "arange")}
_LIKE_FUNCS = {getattr(torch, f"{n}_like"): n for n in ("zeros", "ones", "empty", "full", "rand", "randn")}
_NEW_METHODS = {f"new_{n}": n for n in ("zeros", "ones", "empty", "full")}


@register(functions=list(_SOURCE_FUNCS) + list(_LIKE_FUNCS), methods=list(_NEW_METHODS))
def build_source(c: Call) -> Built:
    """Factory calls: no inputs, every axis partitionable; a size taken from a tensor keeps its dim name."""
    out = out_tensor(c)
    shape = tuple(out.shape)
    # sizes: the raw size arguments (fx nodes keep where a size came from); rest: what follows them
    first = 1 if c.how == "method" else 0          # x.new_zeros(*size): the sizes follow the tensor
    if c.fn in _LIKE_FUNCS:
        fill, sizes, rest = _LIKE_FUNCS[c.fn], None, c.args[1:]
    else:
        fill = _NEW_METHODS[c.fn] if c.how == "method" else _SOURCE_FUNCS[c.fn]
        if fill == "full":                          # full(size, fill_value): one size argument
            sizes, rest = c.node.args[first:first + 1], c.args[first + 1:]
        else:
            sizes, rest = c.node.args[first:], ()
    names: list[str | None] = [None] * len(shape)
    if fill == "arange":
        names = ["l"]
    elif sizes is None:
        names = list(c.args[0].spec.dims)
    else:
        whole = c.size_name(sizes[0]) if len(sizes) == 1 else None     # torch.ones(x.shape)
        flat = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else list(sizes)
        if isinstance(whole, tuple) and len(whole) == len(shape):
            names = list(whole)
        elif len(flat) == len(shape):
            names = [c.size_name(s) for s in flat]
            names = [n if isinstance(n, str) else None for n in names]
    namer = Namer()
    o_spec = spec(out, [namer(n, k) for k, n in enumerate(names)])
    attrs = {"fill": _FILL.get(fill, fill), "dtype": o_spec.dtype}
    if fill == "full":
        value = c.kwargs.get("fill_value", rest[0] if rest else None)
        if not isinstance(value, (int, float, bool)):
            raise NotThisKind("fill value is not a number")
        attrs["value"] = value
    if fill == "arange":
        nums = [a for a in c.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        start, step = (0, 1) if len(nums) < 2 else (nums[0], nums[2] if len(nums) > 2 else 1)
        attrs.update(start=c.kwargs.get("start", start), step=c.kwargs.get("step", step))
    return single(make_op(c, "source", [], [o_spec], default_pardims(o_spec, c.batch), flops=0, attrs=attrs))


def build_buffer(c: Call, value: torch.Tensor, qualname: str | None) -> Built:
    """A buffer (or a constant tensor the trace captured) read by the model: a source op slicing it."""
    namer = Namer()
    o_spec = spec(value, [namer(None, k) for k in range(value.dim())])
    attrs = {"fill": "buffer", "dtype": o_spec.dtype}
    if qualname is not None:
        attrs["buffer"] = qualname
    else:
        attrs["value"] = value.detach().clone()
    return single(make_op(c, "source", [], [o_spec], default_pardims(o_spec, c.batch), flops=0, attrs=attrs,
                          target=f"buffer {qualname or c.qualname}"))


# -- opaque ---------------------------------------------------------------------------------------

def build_opaque(c: Call) -> Built:
    """Anything else fake tensors can run: one op, split by samples only when that is safe, else whole.

    Sample partitioning needs every tensor input and output to carry the batch on axis 0 and no
    argument computed from tensor sizes (the op would be called with the global sizes on a shard).
    """
    leaves, treedef = torch.utils._pytree.tree_flatten(c.out)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
    param_keys: list[str] = []
    if c.how == "module":
        for local, _ in c.fn.named_parameters():
            p = c.module_param(local)
            if p is not None:
                operands.append(p)
                param_keys.append(local)
    inputs = [o for o in operands if o.param is None]
    n = inputs[0].spec.shape[0] if inputs and inputs[0].spec.shape else None
    sample = (bool(inputs) and not c.size_derived and n is not None
              and all(o.spec.dims and o.spec.dims[0] == c.batch for o in inputs)
              and all(t.dim() >= 1 and t.shape[0] == n for t in tensors))
    outs = []
    for t in tensors:
        # Names only (partitioning is decided above): an axis as long as the same axis of an input of
        # the same rank keeps that input's name, so the batch name survives an opaque op.
        ref = next((o for o in inputs if len(o.spec.shape) == t.dim()), None)
        namer = Namer()
        dims = []
        for k in range(t.dim()):
            hint = ref.spec.dims[k] if ref is not None and ref.spec.shape[k] == t.shape[k] else f"o{k}"
            dims.append(namer(c.batch if k == 0 and sample else hint))
        outs.append(spec(t, dims))
    uses = [Use(o, tuple(ident(c.batch) if (sample and k == 0 and o.param is None) else WHOLE
                         for k in range(len(o.spec.shape)))) for o in operands]
    attrs = template_attrs(c.fn if c.how != "module" else None, c.how, args_t, kwargs_t)
    attrs.update(module=c.qualname if c.how == "module" else None, param_keys=tuple(param_keys),
                 mutates=c.mutates)
    flops = sum(numel(t.shape) for t in tensors)
    op = make_op(c, "opaque", uses, outs, [c.batch] if sample else [], flops=flops, attrs=attrs)
    value_leaves, k = [], 0
    for x in leaves:
        if isinstance(x, torch.Tensor):
            value_leaves.append(Operand(op.outputs[k], TensorRef(op.name, k)))
            k += 1
        else:
            value_leaves.append(x)
    return Built([op], torch.utils._pytree.tree_unflatten(value_leaves, treedef))
