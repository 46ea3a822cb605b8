"""Builders of the view kinds: slice (indexing, narrow, select, pieces of split/chunk/unbind), reshape,
permute and expand.

These ops move no arithmetic, but they decide which part of their input each task needs.  The
rule (FlexFlow sec. 4 only partitions along output axes, equal parts): an output axis is
partitionable when the input region a part of it needs is a box — an axis that carries through
(identity), a strided or shifted range (slices), the outermost axis of a split axis (a block of
whole rows), an axis broadcast from size 1.  An axis that merges several input axes is read whole,
since equal parts of the merged axis are not boxes of the input in general.  The sample axis thus
stays partitionable whenever the batch axis survives as an axis of its own.
"""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ._base import (Built, Call, Namer, NotThisKind, Operand, Use, default_pardims, dtype_name, ident, make_op,
                    norm_axis, numel, out_tensor, register, spec)
from ..graph import WHOLE, AxisMap, Op, TensorRef

# -- slice -----------------------------------------------------------------------------------------
# An item per index position: ("new",) inserts a size-1 axis, ("sel", axis, i) picks index i of an
# input axis (the axis disappears), ("rng", axis, start, step, length) keeps a strided range.


def make_slice(c: Call, x: Operand, items: list[tuple], out: torch.Tensor, name: str | None = None) -> Op:
    namer = Namer()
    names = []
    for it in items:
        if it[0] == "rng":
            names.append(namer(x.spec.dims[it[1]], it[1]))
        elif it[0] == "new":
            names.append(namer("u", len(names)))
    o_spec = spec(out, names)
    pardims = default_pardims(o_spec, c.batch)
    maps: list[AxisMap] = [WHOLE] * len(x.spec.shape)
    k = 0
    for it in items:
        if it[0] == "sel":
            maps[it[1]] = AxisMap(lo=it[2], hi=it[2] + 1)
        elif it[0] == "rng":
            _, axis, start, step, length = it
            if names[k] in pardims:
                maps[axis] = AxisMap(dim=names[k], stride=step, shift=start)
            else:
                maps[axis] = AxisMap(lo=start, hi=start + (length - 1) * step + 1 if length else start)
            k += 1
        else:
            k += 1
    return make_op(c, "slice", [Use(x, tuple(maps))], [o_spec], pardims, flops=0, attrs={"items": tuple(items)},
                   name=name, bytes_fwd=o_spec.nbytes)


def _index_items(x: Operand, index) -> list[tuple]:
    shape = x.spec.shape
    idx = index if isinstance(index, tuple) else (index,)
    for e in idx:
        if not (e is None or e is Ellipsis or isinstance(e, slice) or (isinstance(e, int) and not isinstance(e, bool))):
            raise NotThisKind(f"advanced indexing with {type(e).__name__}")
        if isinstance(e, slice) and not all(v is None or isinstance(v, int) for v in (e.start, e.stop, e.step)):
            raise NotThisKind("slice bounds are not integers")
    consuming = sum(1 for e in idx if e is not None and e is not Ellipsis)
    if consuming > len(shape) or sum(1 for e in idx if e is Ellipsis) > 1:
        raise NotThisKind("too many indices")
    items, axis = [], 0
    for e in idx:
        if e is None:
            items.append(("new",))
        elif e is Ellipsis:
            for _ in range(len(shape) - consuming):
                items.append(("rng", axis, 0, 1, shape[axis]))
                axis += 1
        elif isinstance(e, int):
            if not -shape[axis] <= e < shape[axis]:
                raise NotThisKind("index out of range")
            items.append(("sel", axis, e % shape[axis]))
            axis += 1
        else:
            start, stop, step = e.indices(shape[axis])
            items.append(("rng", axis, start, step, len(range(start, stop, step))))
            axis += 1
    while axis < len(shape):
        items.append(("rng", axis, 0, 1, shape[axis]))
        axis += 1
    return items


def _check_shape(items: list[tuple], out: torch.Tensor) -> None:
    shape = tuple(1 if it[0] == "new" else it[4] for it in items if it[0] != "sel")
    if shape != tuple(out.shape):
        raise NotThisKind(f"index gives {shape}, trace says {tuple(out.shape)}")


@register(functions=[operator.getitem])
def build_getitem(c: Call) -> Built:
    x, out = c.args[0], out_tensor(c)
    if not isinstance(x, Operand):
        raise NotThisKind("indexing a non-tensor")
    items = _index_items(x, c.args[1])
    _check_shape(items, out)
    op = make_slice(c, x, items, out)
    return Built([op], Operand(op.outputs[0], TensorRef(op.name, 0)))


@register(functions=[torch.narrow, torch.select], methods=["narrow", "select"])
def build_narrow_select(c: Call) -> Built:
    x, out = c.args[0], out_tensor(c)
    if not isinstance(x, Operand):
        raise NotThisKind("not a tensor")
    rank = len(x.spec.shape)
    axis = norm_axis(c.arg(1, "dim"), rank)
    items = [("rng", k, 0, 1, s) for k, s in enumerate(x.spec.shape)]
    if c.fn in (torch.select, "select"):
        i = c.arg(2, "index")
        items[axis] = ("sel", axis, i % x.spec.shape[axis])
    else:
        start, length = c.arg(2, "start"), c.arg(3, "length")
        start %= max(x.spec.shape[axis], 1)
        items[axis] = ("rng", axis, start, 1, length)
    _check_shape(items, out)
    op = make_slice(c, x, items, out)
    return Built([op], Operand(op.outputs[0], TensorRef(op.name, 0)))


@dataclass
class Pieces:
    """The tuple returned by split/chunk/unbind: each piece becomes a slice op when it is used.

    A piece used through ``getitem`` is named after that node; a piece used as part of the whole
    tuple (``torch.cat(x.chunk(2))``) is named ``<split node>.<k>``.
    """

    call: Call
    x: Operand
    items: list[list[tuple]]
    outs: list[torch.Tensor]
    made: dict[int, Operand] = field(default_factory=dict)

    def piece(self, k: int, name: str, call: Call | None = None) -> tuple[list[Op], Operand]:
        if k in self.made:
            return [], self.made[k]
        op = make_slice(call or self.call, self.x, self.items[k], self.outs[k], name=name)
        self.made[k] = Operand(op.outputs[0], TensorRef(op.name, 0))
        return [op], self.made[k]

    def __len__(self) -> int:
        return len(self.items)


@register(functions=[torch.split, torch.chunk, torch.unbind], methods=["split", "chunk", "unbind"])
def build_pieces(c: Call) -> Built:
    x = c.args[0]
    if not isinstance(x, Operand) or not isinstance(c.out, (tuple, list)):
        raise NotThisKind("not a tensor split")
    outs = list(c.out)
    rank = len(x.spec.shape)
    unbind = c.fn in (torch.unbind, "unbind")
    axis = norm_axis(c.arg(1 if unbind else 2, "dim", 0), rank)
    base = [("rng", k, 0, 1, s) for k, s in enumerate(x.spec.shape)]
    items, off = [], 0
    for k, t in enumerate(outs):
        it = list(base)
        if unbind:
            it[axis] = ("sel", axis, k)
        else:
            it[axis] = ("rng", axis, off, 1, int(t.shape[axis]))
            off += int(t.shape[axis])
        _check_shape(it, t)
        items.append(it)
    return Built([], Pieces(c, x, items, outs))


# -- reshape ----------------------------------------------------------------------------------------

def _groups(ishape, oshape) -> list[tuple[list[int], list[int]]]:
    """Pair runs of non-1 input and output axes with equal products (the axes a reshape regroups)."""
    ia = [k for k, s in enumerate(ishape) if s != 1]
    oa = [k for k, s in enumerate(oshape) if s != 1]
    groups, i, j = [], 0, 0
    while i < len(ia) and j < len(oa):
        gi, gj = [ia[i]], [oa[j]]
        pi, pj = ishape[ia[i]], oshape[oa[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(ia[i])
                pi *= ishape[ia[i]]
                i += 1
            else:
                gj.append(oa[j])
                pj *= oshape[oa[j]]
                j += 1
        groups.append((gi, gj))
    return groups


_RESHAPE_FUNCS = [torch.reshape, torch.flatten, torch.squeeze, torch.unsqueeze, torch.unflatten]
_RESHAPE_METHODS = ["view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as"]


@register(functions=_RESHAPE_FUNCS, methods=_RESHAPE_METHODS, modules=[nn.Flatten, nn.Unflatten])
def build_reshape(c: Call) -> Built:
    x, out = c.args[0], out_tensor(c)
    if not isinstance(x, Operand) or numel(x.spec.shape) != out.numel() or x.spec.dtype != dtype_name(out.dtype):
        raise NotThisKind("not a reshape")
    ishape, oshape = tuple(x.spec.shape), tuple(out.shape)
    namer = Namer()
    names: list[str | None] = [None] * len(oshape)
    maps: list[AxisMap] = [WHOLE] * len(ishape)
    heads: list[tuple[str, list[int], int]] = []
    if 0 not in ishape:
        for gi, gj in _groups(ishape, oshape):
            if len(gi) == 1:
                names[gj[0]] = namer(x.spec.dims[gi[0]], gj[0])
                block = numel(oshape[k] for k in gj[1:])
                heads.append((names[gj[0]], gi, block))
                for k in gj[1:]:
                    names[k] = namer(x.spec.dims[gi[0]], k)
            elif len(gj) == 1:
                names[gj[0]] = namer(x.spec.dims[gi[0]], gj[0])   # a merged axis is named for its outer part
            else:
                for k in gj:
                    names[k] = namer(None, k)
    for k in range(len(oshape)):
        if names[k] is None:
            names[k] = namer("u" if oshape[k] == 1 else None, k)
    o_spec = spec(out, names)
    whole = {n for n in names if n not in {h[0] for h in heads}}
    pardims = default_pardims(o_spec, c.batch, exclude=sorted(whole))
    for name, gi, block in heads:
        maps[gi[0]] = ident(name) if block == 1 else AxisMap(dim=name, kernel=block, stride=block)
    op = make_op(c, "reshape", [Use(x, tuple(maps))], [o_spec], pardims, flops=0, bytes_fwd=o_spec.nbytes)
    return Built([op], Operand(op.outputs[0], TensorRef(op.name, 0)))


# -- permute ----------------------------------------------------------------------------------------

def _perm(c: Call, rank: int) -> list[int]:
    fn = c.fn
    if fn in (torch.permute, "permute"):
        dims = c.args[1:] if len(c.args) > 1 else c.kwargs.get("dims")
        dims = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else list(dims)
        return [norm_axis(d, rank) for d in dims]
    if fn in (torch.t, "t"):
        return [1, 0] if rank == 2 else list(range(rank))
    if fn == "T":
        return list(range(rank))[::-1]
    if fn == "mT":
        return list(range(rank - 2)) + [rank - 1, rank - 2]
    a, b = norm_axis(c.arg(1, "dim0"), rank), norm_axis(c.arg(2, "dim1"), rank)
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return perm


def build_permute(c: Call) -> Built:
    x, out = c.args[0], out_tensor(c)
    if not isinstance(x, Operand):
        raise NotThisKind("not a tensor")
    rank = len(x.spec.shape)
    perm = _perm(c, rank)
    if sorted(perm) != list(range(rank)) or tuple(x.spec.shape[p] for p in perm) != tuple(out.shape):
        raise NotThisKind("not a permutation")
    namer = Namer()
    names = [namer(x.spec.dims[p], j) for j, p in enumerate(perm)]
    inv = {p: j for j, p in enumerate(perm)}
    maps = tuple(ident(names[inv[k]]) for k in range(rank))
    o_spec = spec(out, names)
    op = make_op(c, "permute", [Use(x, maps)], [o_spec], default_pardims(o_spec, c.batch), flops=0,
                 attrs={"perm": tuple(perm)}, bytes_fwd=o_spec.nbytes)
    return Built([op], Operand(op.outputs[0], TensorRef(op.name, 0)))


register(functions=[torch.permute, torch.transpose, torch.t, torch.swapaxes, torch.swapdims],
         methods=["permute", "transpose", "t", "swapaxes", "swapdims"])(build_permute)


@register(functions=[builtins.getattr])
def build_getattr(c: Call) -> Built:
    """``x.T`` and ``x.mT`` are permutations; other tensor attributes go opaque."""
    attr = c.args[1]
    if attr not in ("T", "mT"):
        raise NotThisKind(f"tensor attribute {attr}")
    c.fn = attr
    return build_permute(c)


# -- expand -----------------------------------------------------------------------------------------

@register(functions=[torch.broadcast_to], methods=["expand", "expand_as", "broadcast_to"])
def build_expand(c: Call) -> Built:
    x, out = c.args[0], out_tensor(c)
    if not isinstance(x, Operand) or len(out.shape) < len(x.spec.shape):
        raise NotThisKind("not an expand")
    oshape = tuple(out.shape)
    off = len(oshape) - len(x.spec.shape)
    # Names of the target sizes when they come from a tensor: expand_as(y), expand(y.size(0), -1).
    other = c.args[1] if len(c.args) > 1 and isinstance(c.args[1], Operand) else None
    if other is not None:
        hints = list(other.spec.dims)
    else:
        raw = c.node.args[1:]
        raw = list(raw[0]) if len(raw) == 1 and isinstance(raw[0], (list, tuple)) else list(raw)
        hints = [c.size_name(r) for r in raw] if len(raw) == len(oshape) else [None] * len(oshape)
        hints = [h if isinstance(h, str) else None for h in hints]
    namer = Namer()
    names = [namer(hints[k], k) for k in range(off)]
    maps = []
    for k, s in enumerate(x.spec.shape):
        if s == oshape[off + k]:
            maps.append(ident(namer(x.spec.dims[k], off + k)))
            names.append(maps[-1].dim)
        elif s == 1:
            maps.append(WHOLE)
            names.append(namer(hints[off + k] or x.spec.dims[k], off + k))
        else:
            raise NotThisKind("not an expand")
    o_spec = spec(out, names)
    op = make_op(c, "expand", [Use(x, tuple(maps))], [o_spec], default_pardims(o_spec, c.batch), flops=0,
                 bytes_fwd=o_spec.nbytes)
    return Built([op], Operand(op.outputs[0], TensorRef(op.name, 0)))
