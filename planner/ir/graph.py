"""The operator graph: autopar's intermediate representation of a model.

An `OperatorGraph` is a DAG of `Op`s in topological order; edges are tensors (`TensorRef`
points at one output of a producer).  Everything is a frozen dataclass: "editing" a graph means
building a new one.

How an op can be parallelized (FlexFlow sec. 4, Table 1) is data, not code: every op names its
*parallelizable dimensions* (`ParDim`) — always a sample dimension when the op has a batch, plus
attribute dimensions (partitioning them does not split parameters: length, height, width, heads
of a parameter-free attention) and parameter dimensions (partitioning them splits the
parameters: output channels of a convolution, output features of a linear layer).  A
parallelization configuration gives each a degree, which cuts the op's iteration space into equal
boxes, one per task.

Which part of every input and parameter a task needs follows from per-axis `AxisMap`s: an input
axis either follows one of the op's dimensions (identity, or a convolution/pool window with
kernel, stride, padding and dilation, which produces the halo of attribute partitioning) or is
needed whole.  The simulator (communication volume) and the trainer (what each rank slices and
receives) both read the same maps, so what is simulated is what runs.

A dimension that names no output axis is a *reduction* dimension: tasks split along it produce
partial sums of the whole output (the loss summed over a sample shard is the one built-in case).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, Iterable, Mapping, Sequence

from ..errors import GraphImportError
from .regions import Box, Range, split_range

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


class DimKind(str, Enum):
    """The three kinds of parallelizable dimension of FlexFlow's Table 1."""

    SAMPLE = "sample"
    ATTRIBUTE = "attribute"
    PARAMETER = "parameter"


@dataclass(frozen=True)
class TensorSpec:
    """Shape, per-axis dimension names and dtype of one tensor."""

    shape: tuple[int, ...]
    dims: tuple[str, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.dims):
            raise ValueError(f"tensor shape {self.shape} has {len(self.shape)} axes but dims {self.dims}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {sorted(DTYPE_BYTES)}")

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class AxisMap:
    """How one axis of an input (or parameter) depends on the op's dimensions.

    ``dim=None``: the task needs the fixed range ``[lo, hi)`` of the axis (the whole axis by
    default; one step of a sequence for a ``select``).  Otherwise the task whose range of
    dimension `dim` is ``[a, b)`` reads
    ``[a*stride - pad + shift, (b-1)*stride - pad + shift + (kernel-1)*dilation + 1)`` clipped to
    the axis: identity for the defaults, a sliding window (with halo) for convolutions and pools,
    a block of `stride` elements per index for reshapes that split an axis (kernel = stride =
    block), and a shifted range for concatenation and chunking (`shift` = where the piece starts
    in the input minus where it starts in the output).  A range that clips to nothing means the
    task does not read that input at all.
    """

    dim: str | None = None
    kernel: int = 1
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    shift: int = 0
    lo: int | None = None
    hi: int | None = None

    def map(self, rng: Range | None, size: int) -> Range:
        if self.dim is None or rng is None:
            lo = 0 if self.lo is None else self.lo
            hi = size if self.hi is None else self.hi
            return (lo, hi)
        a0, b0 = rng
        a = a0 * self.stride - self.pad + self.shift
        b = (b0 - 1) * self.stride - self.pad + self.shift + (self.kernel - 1) * self.dilation + 1
        a, b = max(0, a), min(size, b)
        return (a, b) if b > a else (a, a)

    @property
    def is_identity(self) -> bool:
        return (self.kernel == 1 and self.stride == 1 and self.pad == 0 and self.dilation == 1
                and self.shift == 0)


WHOLE = AxisMap()


def same(dim: str) -> AxisMap:
    return AxisMap(dim=dim)


@dataclass(frozen=True)
class TensorRef:
    """An edge of the graph: output `index` of op `op`."""

    op: str
    index: int = 0


@dataclass(frozen=True)
class ParamSpec:
    """A parameter tensor an op reads.

    `name` is the parameter's key in the model's ``named_parameters()``; ops that name the same
    parameter share it (unrolled recurrent steps) and their gradients accumulate before
    synchronization.  `view` is the logical shape partitioning works on (an LSTM cell's
    ``weight_ih`` of shape (4H, I) is viewed as (4, H, I) so that a slice of hidden units takes
    its rows of all four gates); it must have as many elements as `shape`.  `maps` has one
    `AxisMap` per axis of `view`.
    """

    name: str
    shape: tuple[int, ...]
    view: tuple[int, ...]
    maps: tuple[AxisMap, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if _prod(self.shape) != _prod(self.view):
            raise ValueError(f"parameter {self.name}: view {self.view} does not have the elements of shape {self.shape}")
        if len(self.maps) != len(self.view):
            raise ValueError(f"parameter {self.name}: {len(self.maps)} axis maps for view of rank {len(self.view)}")

    @property
    def nbytes(self) -> int:
        return _prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class ParDim:
    """A parallelizable dimension: its name, kind and extent.

    Degrees must divide `size`, and each part must be a whole number of `granule`s (attention
    heads: granule = head size on the feature axis).
    """

    name: str
    kind: DimKind
    size: int
    granule: int = 1

    def allowed_degrees(self, limit: int | None = None) -> tuple[int, ...]:
        units = self.size // self.granule
        return tuple(d for d in range(1, units + 1) if units % d == 0 and (limit is None or d <= limit))


@dataclass(frozen=True)
class Op:
    """One operator of the graph.

    `kind` is one of the kinds listed in `planner/README.md`.  `input_maps[i]` has one `AxisMap`
    per axis of input i.  `flops_fwd`/`flops_bwd` count the whole op (all tasks together);
    `bytes_fwd`/`bytes_bwd` are the memory traffic of the whole op, for roofline estimates.
    `attrs` holds kind-specific settings (stride, padding, softmax axis, …) as sorted pairs.
    `source` is "file:line" of the model code that created the op, for error messages.
    """

    name: str
    kind: str
    inputs: tuple[TensorRef, ...]
    input_maps: tuple[tuple[AxisMap, ...], ...]
    outputs: tuple[TensorSpec, ...]
    pardims: tuple[ParDim, ...] = ()
    params: tuple[ParamSpec, ...] = ()
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    bytes_fwd: float = 0.0
    bytes_bwd: float = 0.0
    attrs: tuple[tuple[str, Any], ...] = ()
    source: str = ""
    target: str = ""

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.input_maps):
            raise ValueError(f"op {self.name}: {len(self.inputs)} inputs but {len(self.input_maps)} input maps")
        names = [p.name for p in self.pardims]
        if len(set(names)) != len(names):
            raise ValueError(f"op {self.name}: duplicate parallel dims {names}")
        known = set(names)
        for k, out in enumerate(self.outputs):
            for axis, d in enumerate(out.dims):
                pd = self.pardim(d)
                if pd is not None and pd.size != out.shape[axis]:
                    raise ValueError(
                        f"op {self.name}: dim {d} has size {pd.size} but output {k} axis {axis} has {out.shape[axis]}")
        for i, maps in enumerate(self.input_maps):
            for m in maps:
                if m.dim is not None and m.dim not in known:
                    raise ValueError(f"op {self.name}: input {i} maps an axis to unknown dim {m.dim!r}")
        for p in self.params:
            for m in p.maps:
                if m.dim is not None and m.dim not in known:
                    raise ValueError(f"op {self.name}: parameter {p.name} maps an axis to unknown dim {m.dim!r}")

    # -- lookups ---------------------------------------------------------------------------
    def pardim(self, name: str) -> ParDim | None:
        for p in self.pardims:
            if p.name == name:
                return p
        return None

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def output(self) -> TensorSpec:
        return self.outputs[0]

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        """Dims that no output axis carries: tasks split along them produce partial sums."""
        out_dims = {d for o in self.outputs for d in o.dims}
        return tuple(p.name for p in self.pardims if p.name not in out_dims)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    # -- regions -----------------------------------------------------------------------------
    def task_ranges(self, degrees: Sequence[int], coord: Sequence[int]) -> dict[str, Range]:
        """The range of every parallel dim that task `coord` of a ``degrees`` grid covers."""
        return {p.name: split_range(p.size, d, c) for p, d, c in zip(self.pardims, degrees, coord)}

    def output_box(self, k: int, ranges: Mapping[str, Range]) -> Box:
        out = self.outputs[k]
        return tuple(ranges.get(d, (0, s)) for d, s in zip(out.dims, out.shape))

    def input_box(self, i: int, ranges: Mapping[str, Range], shape: Sequence[int]) -> Box:
        return tuple(m.map(ranges.get(m.dim) if m.dim else None, s) for m, s in zip(self.input_maps[i], shape))

    def param_box(self, j: int, ranges: Mapping[str, Range]) -> Box:
        p = self.params[j]
        return tuple(m.map(ranges.get(m.dim) if m.dim else None, s) for m, s in zip(p.maps, p.view))

    def describe(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"op {self.name} [{self.kind}]{where}"


@dataclass(frozen=True)
class OperatorGraph:
    """A model as a DAG of ops in topological order.

    `inputs` name the ops that feed data (kind ``input``); `batch_size` is the global batch the
    shapes were propagated with.
    """

    name: str
    ops: tuple[Op, ...]
    batch_size: int
    meta: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        seen: dict[str, Op] = {}
        for op in self.ops:
            if op.name in seen:
                raise GraphImportError(f"graph {self.name}: two ops are named {op.name!r}")
            for i, ref in enumerate(op.inputs):
                src = seen.get(ref.op)
                if src is None:
                    raise GraphImportError(
                        f"graph {self.name}: {op.describe()} input {i} comes from {ref.op!r}, "
                        "which is not an earlier op (the ops must be in topological order)")
                if ref.index >= len(src.outputs):
                    raise GraphImportError(
                        f"graph {self.name}: {op.describe()} reads output {ref.index} of {ref.op}, which has {len(src.outputs)}")
                spec = src.outputs[ref.index]
                if len(op.input_maps[i]) != len(spec.shape):
                    raise GraphImportError(
                        f"graph {self.name}: {op.describe()} has {len(op.input_maps[i])} axis maps for input {i} "
                        f"of rank {len(spec.shape)} {spec.shape}")
            seen[op.name] = op
        shapes: dict[str, tuple[int, ...]] = {}
        for op in self.ops:
            for p in op.params:
                prev = shapes.setdefault(p.name, p.shape)
                if prev != p.shape:
                    raise GraphImportError(f"graph {self.name}: parameter {p.name} used with shapes {prev} and {p.shape}")

    # -- lookups -----------------------------------------------------------------------------
    @cached_property
    def by_name(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    def __getitem__(self, name: str) -> Op:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"graph {self.name} has no op {name!r}") from None

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    @cached_property
    def index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    @cached_property
    def consumers(self) -> dict[str, tuple[tuple[str, int, int], ...]]:
        """op name -> ((consumer op, consumer input index, producer output index), ...)."""
        acc: dict[str, list[tuple[str, int, int]]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for i, ref in enumerate(op.inputs):
                acc[ref.op].append((op.name, i, ref.index))
        return {k: tuple(v) for k, v in acc.items()}

    def input_spec(self, op: Op, i: int) -> TensorSpec:
        ref = op.inputs[i]
        return self.by_name[ref.op].outputs[ref.index]

    @cached_property
    def param_users(self) -> dict[str, tuple[str, ...]]:
        """parameter name -> names of the ops that read it (more than one: shared)."""
        acc: dict[str, list[str]] = {}
        for op in self.ops:
            for p in op.params:
                acc.setdefault(p.name, []).append(op.name)
        return {k: tuple(v) for k, v in acc.items()}

    @cached_property
    def param_specs(self) -> dict[str, ParamSpec]:
        acc: dict[str, ParamSpec] = {}
        for op in self.ops:
            for p in op.params:
                acc.setdefault(p.name, p)
        return acc

    @property
    def num_params(self) -> int:
        return sum(_prod(p.shape) for p in self.param_specs.values())

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.param_specs.values())

    @property
    def dtype(self) -> str:
        """The float dtype the model computes in: that of most parameter elements, else of the float
        tensors its ops produce (a model without parameters), else ``float32``."""
        counts: dict[str, int] = {}
        for p in self.param_specs.values():
            if p.dtype in _FLOAT_DTYPES:
                counts[p.dtype] = counts.get(p.dtype, 0) + _prod(p.shape)
        if not counts:
            for op in self.ops:
                for o in op.outputs:
                    if o.dtype in _FLOAT_DTYPES:
                        counts[o.dtype] = counts.get(o.dtype, 0) + o.numel
        return max(counts, key=lambda k: counts[k]) if counts else "float32"

    @property
    def total_flops(self) -> float:
        return sum(op.flops_fwd + op.flops_bwd for op in self.ops)

    # -- identity ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "batch_size": self.batch_size, "ops": [_op_to_dict(op) for op in self.ops]}

    @cached_property
    def fingerprint(self) -> str:
        """A hash of everything that decides which strategies fit: ops, shapes, dims, edges, params.

        Costs (FLOPs, bytes) and source lines are left out so that a plan stays valid when only
        the cost model or a comment changes.
        """
        doc = [
            [op.name, op.kind, [[r.op, r.index] for r in op.inputs],
             [[list(o.shape), list(o.dims), o.dtype] for o in op.outputs],
             [[p.name, p.kind.value, p.size, p.granule] for p in op.pardims],
             [[p.name, list(p.shape)] for p in op.params]]
            for op in self.ops
        ]
        blob = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()[:16]

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for op in self.ops:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        shared = sum(1 for users in self.param_users.values() if len(users) > 1)
        ks = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        return (f"{self.name}: {len(self.ops)} ops ({ks}); {fmt_count(self.num_params)} parameters"
                f" ({shared} shared); {_fmt_flops(self.total_flops)} per step at batch {self.batch_size}")


def _op_to_dict(op: Op) -> dict[str, Any]:
    return {
        "name": op.name, "kind": op.kind, "source": op.source, "target": op.target,
        "inputs": [[r.op, r.index] for r in op.inputs],
        "outputs": [{"shape": list(o.shape), "dims": list(o.dims), "dtype": o.dtype} for o in op.outputs],
        "pardims": [{"name": p.name, "kind": p.kind.value, "size": p.size, "granule": p.granule} for p in op.pardims],
        "params": [{"name": p.name, "shape": list(p.shape)} for p in op.params],
        "flops_fwd": op.flops_fwd, "flops_bwd": op.flops_bwd,
    }


_FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")


def fmt_count(n: float) -> str:
    """A count for people: ``950``, ``22.4k``, ``1.2M``, ``134.0M``, ``1.5B``."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale * 0.9995 or (suffix == "k" and abs(n) >= 1000):
            return f"{n / scale:.1f}{suffix}"
    return f"{n:.0f}"


def _fmt_flops(f: float) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if f >= scale:
            return f"{f / scale:.1f} {prefix}FLOP"
    return f"{f:.0f} FLOP"


def _prod(xs: Iterable[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def freeze_attrs(attrs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attrs as sorted pairs with lists turned into tuples, so ops stay hashable."""
    def fz(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return tuple(fz(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, fz(x)) for k, x in v.items()))
        return v
    return tuple(sorted((k, fz(v)) for k, v in attrs.items()))
