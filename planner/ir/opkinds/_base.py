"""Shared machinery of the op-kind builders (see `planner/ir/opkinds/__init__.py` for the kinds themselves).

A builder sees one traced torch call as a `Call`: its tensor arguments are `Operand`s (the output
of an earlier op, or a model parameter), everything else is a concrete Python value, and the
fake output tells the shapes.  It returns the `Op`(s) it stands for and the value the call has in
the rest of the trace (`Built`).  `make_op` turns the builder's description — the operands with
one `AxisMap` per axis, the outputs with dimension names, the partitionable dims — into an `Op`:
it classifies every parallel dim as sample / attribute / parameter by FlexFlow's definition
(sec. 4: a dim is a *parameter* dim when partitioning it splits a parameter), splits operands into
graph inputs and `ParamSpec`s, and fills in costs.

Kernels (`planner/ir/kernels.py`) see the operands again in their original order through the
``operands`` attr (``"i0"`` = input 0, ``"p1"`` = parameter 1, ``None`` = absent optional operand),
and template kinds re-issue the recorded call with local shards in place of the `Slot`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx

from ...errors import GraphImportError
from ..graph import DTYPE_BYTES, WHOLE, AxisMap, DimKind, Op, ParamSpec, ParDim, TensorRef, TensorSpec, freeze_attrs


@dataclass(frozen=True)
class Operand:
    """A tensor a call reads: output `ref` of an earlier op, or the model parameter `param`."""

    spec: TensorSpec
    ref: TensorRef | None = None
    param: str | None = None


@dataclass(frozen=True)
class Use:
    """One operand of an op with the `AxisMap` of each of its axes (`view`: a parameter's logical shape)."""

    operand: Operand
    maps: tuple[AxisMap, ...]
    view: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Slot:
    """Where logical operand `index` goes in a recorded call template."""

    index: int


@dataclass(frozen=True)
class FrozenSlice:
    start: Any
    stop: Any
    step: Any


@dataclass(frozen=True)
class FrozenDict:
    items: tuple[tuple[str, Any], ...]


@dataclass
class Call:
    """One traced call, resolved for the builders."""

    node: fx.Node
    name: str
    target: str                 # readable: "nn.Conv2d features.0", "torch.relu", "Tensor.view"
    source: str                 # "file:line" of the model code
    how: str                    # "function" | "method" | "module"
    fn: Any                     # the function, the method name, or the module instance
    qualname: str               # module path for call_module ("" for the model itself), attribute for buffers
    args: tuple
    kwargs: dict
    out: Any                    # the fake output (a tensor or a pytree of them)
    batch: str                  # the graph's sample dim name
    module_param: Callable[[str], Operand | None] = field(repr=False, default=lambda _: None)
    size_name: Callable[[Any], Any] = field(repr=False, default=lambda _: None)
    size_derived: bool = False  # some argument is computed from tensor sizes
    mutates: bool = False       # an in-place call the importer could not rewrite: kernels copy first

    def arg(self, i: int, key: str, default: Any = None) -> Any:
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(key, default)

    def raw_arg(self, i: int, key: str, default: Any = None) -> Any:
        if i < len(self.node.args):
            return self.node.args[i]
        return self.node.kwargs.get(key, default)


@dataclass
class Built:
    """What a builder returns: the new ops and the call's value for later nodes."""

    ops: list[Op]
    value: Any


class NotThisKind(Exception):
    """Raised by a builder when the call does not fit its kind; the importer falls back to opaque."""


# -- names and specs ---------------------------------------------------------------------------

class Namer:
    """Unique dimension names within one op: repeated hints get a numeric suffix (l, l2, l3, …)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, hint: str | None, axis: int = 0) -> str:
        base = hint or f"d{axis}"
        name, k = base, 2
        while name in self.used:
            name, k = f"{base}{k}", k + 1
        self.used.add(name)
        return name


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise GraphImportError(f"tensors of dtype {name} are not supported; supported dtypes: {', '.join(DTYPE_BYTES)}")
    return name


def spec(t: torch.Tensor, dims: Sequence[str]) -> TensorSpec:
    return TensorSpec(tuple(int(s) for s in t.shape), tuple(dims), dtype_name(t.dtype))


def out_tensor(c: Call) -> torch.Tensor:
    if not isinstance(c.out, torch.Tensor):
        raise NotThisKind(f"{c.target} returns {type(c.out).__name__}, not one tensor")
    return c.out


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def norm_axis(axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise NotThisKind(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def ident(name: str) -> AxisMap:
    return AxisMap(dim=name)


def templatize(args: tuple, kwargs: Mapping[str, Any]) -> tuple[list[Operand], tuple, FrozenDict]:
    """Replace every `Operand` of a call by a `Slot`, freezing containers so attrs stay hashable."""
    operands: list[Operand] = []

    def conv(v: Any) -> Any:
        if isinstance(v, Operand):
            operands.append(v)
            return Slot(len(operands) - 1)
        if isinstance(v, (list, tuple)):
            return tuple(conv(x) for x in v)
        if isinstance(v, dict):
            return FrozenDict(tuple((k, conv(x)) for k, x in v.items()))
        if isinstance(v, slice):
            return FrozenSlice(conv(v.start), conv(v.stop), conv(v.step))
        return v
    a = conv(tuple(args))
    k = FrozenDict(tuple((key, conv(v)) for key, v in kwargs.items()))
    return operands, a, k


def template_attrs(fn: Any, how: str, args: tuple, kwargs: FrozenDict) -> dict[str, Any]:
    return {"fn": fn, "how": how, "call": (args, kwargs)}


# -- building ops -------------------------------------------------------------------------------

def make_op(c: Call, kind: str, uses: Sequence[Use | None], outputs: Sequence[TensorSpec],
            pardims: Sequence[str | tuple[str, int]], *, flops: float, attrs: Mapping[str, Any] | None = None,
            reductions: Mapping[str, int] | None = None, name: str | None = None, target: str | None = None,
            bytes_fwd: float | None = None) -> Op:
    """Build an `Op` from operand uses, outputs and the names of its partitionable dims.

    `pardims` name output axes (or keys of `reductions`, dims no output carries); an entry
    ``(name, granule)`` sets a granule.  Maps to a dim that is not partitionable become WHOLE
    (the whole axis is read), so builders can write identity maps without checking sizes.
    """
    reductions = dict(reductions or {})
    sizes: dict[str, int] = dict(reductions)
    for out in outputs:
        for d, s in zip(out.dims, out.shape):
            sizes.setdefault(d, s)
    entries = [(p, 1) if isinstance(p, str) else p for p in pardims]
    names = {p for p, _ in entries}

    def fix(m: AxisMap) -> AxisMap:
        return m if m.dim is None or m.dim in names else WHOLE

    param_dims: set[str] = set()
    inputs, input_maps, params, layout = [], [], [], []
    for u in uses:
        if u is None:
            layout.append(None)
            continue
        maps = tuple(fix(m) for m in u.maps)
        if u.operand.param is not None:
            param_dims.update(m.dim for m in maps if m.dim is not None)
            view = u.view or u.operand.spec.shape
            params.append(ParamSpec(u.operand.param, u.operand.spec.shape, tuple(view), maps, u.operand.spec.dtype))
            layout.append(f"p{len(params) - 1}")
        else:
            if len(maps) != len(u.operand.spec.shape):
                raise GraphImportError(f"{c.name}: {len(maps)} axis maps for an operand of shape {u.operand.spec.shape}")
            inputs.append(u.operand.ref)
            input_maps.append(maps)
            layout.append(f"i{len(inputs) - 1}")
    pds = []
    for p, granule in entries:
        if p == c.batch:
            k = DimKind.SAMPLE
        elif p in param_dims:
            k = DimKind.PARAMETER
        else:
            k = DimKind.ATTRIBUTE
        pds.append(ParDim(p, k, sizes[p], granule))
    read = sum(numel(u.operand.spec.shape) * u.operand.spec.itemsize for u in uses if u is not None)
    written = sum(o.nbytes for o in outputs)
    bf = float(read + written) if bytes_fwd is None else float(bytes_fwd)
    all_attrs = {"operands": tuple(layout), **(attrs or {})}
    return Op(
        name=name or c.name, kind=kind, inputs=tuple(inputs), input_maps=tuple(input_maps),
        outputs=tuple(outputs), pardims=tuple(pds), params=tuple(params),
        flops_fwd=float(flops), flops_bwd=float(2 * flops if params else flops),
        bytes_fwd=bf, bytes_bwd=2.0 * bf, attrs=freeze_attrs(all_attrs),
        source=c.source, target=target or c.target)


def default_pardims(out: TensorSpec, batch: str, exclude: Sequence[str] = ()) -> list[str]:
    """Every axis of `out` that can be cut: the sample axis always, others when longer than 1."""
    return [d for d, s in zip(out.dims, out.shape) if d not in exclude and (d == batch or s > 1)]


def single(op: Op) -> Built:
    return Built([op], Operand(op.outputs[0], TensorRef(op.name, 0)))


def broadcast_names(shape: Sequence[int], operands: Sequence[Operand], namer: Namer) -> list[str]:
    """Output axis names of a broadcasting op: from the first operand that has the full axis."""
    rank = len(shape)
    names = []
    for axis in range(rank):
        hint = None
        for full_only in (True, False):
            for o in operands:
                k = axis - (rank - len(o.spec.shape))
                if k >= 0 and (o.spec.shape[k] == shape[axis] or not full_only):
                    hint = o.spec.dims[k]
                    break
            if hint is not None:
                break
        names.append(namer(hint, axis))
    return names


def broadcast_maps(o: Operand, shape: Sequence[int], names: Sequence[str]) -> tuple[AxisMap, ...]:
    """Right-aligned broadcasting: an axis of the full size follows the output, a size-1 axis is read whole."""
    off = len(shape) - len(o.spec.shape)
    return tuple(ident(names[off + k]) if s == shape[off + k] else WHOLE for k, s in enumerate(o.spec.shape))


def broadcastable(small: Sequence[int], shape: Sequence[int]) -> bool:
    if len(small) > len(shape):
        return False
    off = len(shape) - len(small)
    return all(s == shape[off + k] or s == 1 for k, s in enumerate(small))


# -- registry ------------------------------------------------------------------------------------

Builder = Callable[[Call], Built]
FUNCTIONS: dict[Any, Builder] = {}
METHODS: dict[str, Builder] = {}
MODULES: list[tuple[type, Builder]] = []


def register(*, functions: Sequence[Any] = (), methods: Sequence[str] = (), modules: Sequence[type] = ()):
    """Decorator: `fn` builds ops for these torch functions, Tensor methods and module types."""
    def deco(fn: Builder) -> Builder:
        for f in functions:
            FUNCTIONS[f] = fn
        for m in methods:
            METHODS[m] = fn
        for t in modules:
            MODULES.append((t, fn))
        return fn
    return deco
