"""Turn any ``nn.Module`` into an `OperatorGraph`: torch.fx tracing plus shape propagation with fake tensors.

    graph = import_model(model, [("images", TensorSpec((64, 3, 299, 299), ("n", "c", "h", "w")))],
                         target=("labels", TensorSpec((64,), ("n",), "int64")))

1. **Trace** with `torch.fx` (a custom tracer: ``torch.nn`` modules are leaves, as are the
   `leaf_modules` a user names; torch factory calls with traced sizes, ``torch.zeros(x.size(0), h)``,
   are recorded instead of failing).  Python loops unroll, so an RNN written as a cell loop becomes
   one op per step, and ops that call the same module share its parameters (FlexFlow sec. 8.1).
2. **Propagate shapes** with `FakeTensorProp` under a `FakeTensorMode`, with fake parameters swapped
   in, so no activation or weight memory is touched even at paper scale and modules built on the
   ``meta`` device import as well.
3. **Build ops** node by node with `planner.ir.opkinds` (FlexFlow sec. 4's parallelizable dims per op).
   Metadata nodes (``size``, ``shape``, arithmetic on sizes) are not ops; tuples and ``getitem``
   are resolved; pure copies and identities (``contiguous``, ``clone``, same-dtype ``to``,
   ``nn.Identity``, dropout with p = 0) are elided; the loss is appended as a ``cross_entropy`` op.

Op names are the fx node names (stable across runs, so the trainer can re-trace and match);
ops derived from one node get ``<node>.<suffix>`` names, which fx never produces.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from . import opkinds
from ._fx_trace import (ELIDE_METHODS, INPLACE_OPERATOR, LEAF_ROOT, has_tensor, mutating, propagate, readable_target,
                        source_line, trace_module)
from ..errors import GraphImportError
from .graph import Op, OperatorGraph, TensorRef, TensorSpec
from .opkinds import Call, Operand, Pieces
from .opkinds._base import dtype_name


def import_model(module: nn.Module, inputs: Sequence[tuple[str, TensorSpec]],
                 target: tuple[str, TensorSpec] | None = None, loss: str | None = "cross_entropy",
                 name: str = "model", leaf_modules: tuple[type, ...] = ()) -> OperatorGraph:
    """Trace `module` called with tensors shaped like `inputs` (its positional forward arguments, in
    order) and return its operator graph, ending in a ``cross_entropy`` op named ``loss`` against
    `target` unless ``loss=None``."""
    inputs = tuple(inputs)
    if not inputs:
        raise GraphImportError(f"model {name}: no inputs given; pass [(name, TensorSpec(shape, dims)), ...]")
    if loss not in (None, "cross_entropy"):
        raise GraphImportError(f"model {name}: unknown loss {loss!r}; supported: 'cross_entropy' or None")
    if loss is not None and target is None:
        raise GraphImportError(f"model {name}: loss {loss!r} needs a target (name, TensorSpec); "
                               "pass target=... or loss=None")
    named = inputs + ((target,) if target is not None and loss else ())
    for iname, s in named:
        if not isinstance(s, TensorSpec):
            raise GraphImportError(f"model {name}: input {iname!r} needs a TensorSpec, got {type(s).__name__}")
        if len(set(s.dims)) != len(s.dims):
            raise GraphImportError(f"model {name}: input {iname} has repeated dim names {s.dims}; name every axis once")
    if len({n for n, _ in named}) != len(named):
        raise GraphImportError(f"model {name}: input names {[n for n, _ in named]} repeat; give each a unique name")
    gm = trace_module(module, len(inputs), tuple(leaf_modules), name)
    values = propagate(gm, inputs, name)
    return _Importer(gm, module, values, inputs, target if loss else None, name).run()


def import_spec(spec: Any) -> OperatorGraph:
    """`import_model` for a zoo `ModelSpec` (``.module``, ``.inputs``, ``.target``, ``.loss``, ``.name``)."""
    return import_model(spec.module, spec.inputs, spec.target, spec.loss, name=getattr(spec, "name", "model"))


class _Importer:
    """Walks the traced graph once, turning every call node into ops (or a value: metadata, tuples)."""

    def __init__(self, gm: fx.GraphModule, module: nn.Module, values: dict[fx.Node, Any],
                 inputs: tuple[tuple[str, TensorSpec], ...], target: tuple[str, TensorSpec] | None, name: str):
        self.gm, self.values, self.inputs, self.target, self.name = gm, values, inputs, target, name
        self.ops: list[Op] = []
        self.env: dict[fx.Node, Any] = {}
        self.size_names: dict[fx.Node, Any] = {}
        self.canon = {id(p): n for n, p in module.named_parameters()}
        self.canon_buffers = {id(b): n for n, b in module.named_buffers()}
        self.buffers: dict[int, Operand] = {}
        self.leaf_root = isinstance(getattr(gm, LEAF_ROOT, None), nn.Module) and getattr(gm, LEAF_ROOT) is module
        self.nodes = list(gm.graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        # The sample dim: "n" when an input names it (the zoo's convention), else the first input's first axis.
        self.batch = "n" if any("n" in s.dims for _, s in inputs) else (inputs[0][1].dims or ("n",))[0]

    # -- walk ------------------------------------------------------------------------------------
    def run(self) -> OperatorGraph:
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        taken = {n.name for n in self.nodes if n.op != "placeholder"}
        result = None
        for node in self.nodes:
            if node.op == "placeholder":
                k = placeholders.index(node)
                if k >= len(self.inputs):
                    self.env[node] = self.values.get(node)
                    continue
                iname, s = self.inputs[k]
                if iname in taken:
                    raise GraphImportError(f"model {self.name}: input name {iname!r} is also the name of a traced "
                                           "node; rename the input")
                self.ops.append(opkinds.build_input(iname, s, self.batch))
                self.env[node] = Operand(s, TensorRef(iname, 0))
            elif node.op == "get_attr":
                self._get_attr(node)
            elif node.op == "output":
                result = self._resolve(node.args[0])
            else:
                self._call(node)
        meta: dict[str, Any] = {"batch_dim": self.batch, "inputs": tuple(n for n, _ in self.inputs)}
        if self.target is not None:
            meta.update(self._loss(result, taken))
        else:
            leaves = [v for v in torch.utils._pytree.tree_leaves(result) if isinstance(v, Operand)]
            meta["outputs"] = tuple((o.ref.op, o.ref.index) for o in leaves if o.ref is not None)
        spec0 = self.inputs[0][1]
        batch_size = next((s.shape[s.dims.index(self.batch)] for _, s in self.inputs if self.batch in s.dims),
                          spec0.shape[0] if spec0.shape else 1)
        return OperatorGraph(self.name, tuple(self.ops), batch_size, tuple(meta.items()))

    def _loss(self, result: Any, taken: set[str]) -> dict[str, Any]:
        if not isinstance(result, Operand):
            raise GraphImportError(
                f"model {self.name}: forward returns {type(result).__name__}, but the cross_entropy loss needs the "
                "logits tensor (N, C) or (N, L, C); return only the logits, or import with loss=None")
        tname, tspec = self.target
        if tname in taken:
            raise GraphImportError(f"model {self.name}: target name {tname!r} is also the name of a traced node; "
                                   "rename the target")
        self.ops.append(opkinds.build_input(tname, tspec, self.batch))
        loss_name, k = "loss", 1
        while loss_name in taken or loss_name in {n for n, _ in self.inputs} or loss_name == tname:
            loss_name, k = f"loss_{k}", k + 1
        c = Call(node=None, name=loss_name, target="F.cross_entropy", source="", how="function", fn=F.cross_entropy,
                 qualname="", args=(), kwargs={}, out=None, batch=self.batch)
        try:
            self.ops.append(opkinds.build_cross_entropy(c, result, Operand(tspec, TensorRef(tname, 0))))
        except opkinds.NotThisKind as e:
            raise GraphImportError(f"model {self.name}: {e}; the labels must have the logits' shape without the "
                                   "class axis") from None
        return {"target": tname, "loss": loss_name}

    # -- nodes -----------------------------------------------------------------------------------
    def _get_attr(self, node: fx.Node) -> None:
        obj = self.gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            self.env[node] = obj
            return
        if id(obj) in self.canon:
            self.env[node] = self._param_operand(obj)
            return
        if id(obj) in self.buffers:        # every read of one buffer is the same source op
            self.env[node] = self.buffers[id(obj)]
            return
        c = self._make_call(node, "buffer", None, (), {}, obj)
        built = opkinds.build_buffer(c, obj, self.canon_buffers.get(id(obj)))
        self.ops.extend(built.ops)
        self.env[node] = self.buffers[id(obj)] = built.value

    def _call(self, node: fx.Node) -> None:
        out = self.values[node]
        if not has_tensor(out):
            self.env[node] = out
            self._record_size_name(node)
            return
        if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            base = self.env[node.args[0]]
            if isinstance(base, Pieces):
                index = self._resolve(node.args[1])
                if isinstance(index, int):
                    ops, self.env[node] = base.piece(index % len(base), node.name)
                    self.ops.extend(ops)
                else:                               # a slice of the pieces: all of them, then Python slicing
                    self.env[node] = self._resolve(node.args[0])[index]
                return
            if isinstance(base, (tuple, list, dict)):
                self.env[node] = base[self._resolve(node.args[1])]
                return
        how = {"call_function": "function", "call_method": "method", "call_module": "module"}[node.op]
        fn = self.gm.get_submodule(node.target) if how == "module" else node.target
        args, kwargs = self._resolve(tuple(node.args)), self._resolve(dict(node.kwargs))
        mutates, rewritable = mutating(node, self.gm)
        if mutates:
            self._check_mutation(node)
            if rewritable:
                fn, kwargs = self._out_of_place(how, fn, kwargs)
                mutates = False
        if self._elide(node, how, fn, args, out):
            return
        c = self._make_call(node, how, fn, args, kwargs, out)
        c.mutates = mutates
        built = opkinds.build(c)
        self.ops.extend(built.ops)
        self.env[node] = built.value

    def _make_call(self, node: fx.Node, how: str, fn: Any, args: tuple, kwargs: dict, out: Any) -> Call:
        prefix = node.target if how == "module" else ""
        # Module paths are relative to the user's model, which a leaf model was wrapped in.
        qualname = "" if self.leaf_root and prefix == LEAF_ROOT else prefix
        metadata = [n for n in node.all_input_nodes if not _holds_operand(self.env.get(n))]
        return Call(node=node, name=node.name, target=readable_target(node, self.gm) if how != "buffer" else "",
                    source=source_line(node), how=how, fn=fn, qualname=qualname if how == "module" else (node.target if how == "buffer" else ""),
                    args=args, kwargs=kwargs, out=out, batch=self.batch,
                    module_param=lambda local: self._module_param(prefix, local),
                    size_name=lambda raw: self.size_names.get(raw) if isinstance(raw, fx.Node) else None,
                    size_derived=bool(metadata))

    def _module_param(self, prefix: str, local: str) -> Operand | None:
        obj = self.gm.get_submodule(prefix) if prefix else self.gm
        for part in local.split("."):
            obj = getattr(obj, part, None)
        if not isinstance(obj, torch.Tensor) or id(obj) not in self.canon:
            return None
        return self._param_operand(obj)

    def _param_operand(self, p: torch.Tensor) -> Operand:
        """A parameter as an operand; its axes are named after it (``w0``, ``w1`` for ``self.w``)."""
        name = self.canon[id(p)]
        leaf = name.rsplit(".", 1)[-1]
        s = TensorSpec(tuple(p.shape), tuple(f"{leaf}{k}" for k in range(p.dim())), dtype_name(p.dtype))
        return Operand(s, param=name)

    def _resolve(self, a: Any) -> Any:
        if isinstance(a, fx.Node):
            v = self.env[a]
            if isinstance(v, Pieces):
                pieces = []
                for k in range(len(v)):
                    ops, o = v.piece(k, f"{a.name}.{k}")
                    self.ops.extend(ops)
                    pieces.append(o)
                return tuple(pieces)
            return v
        if isinstance(a, (list, tuple)):
            items = [self._resolve(x) for x in a]
            return items if isinstance(a, list) else tuple(items)
        if isinstance(a, dict):
            return {k: self._resolve(v) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(self._resolve(a.start), self._resolve(a.stop), self._resolve(a.step))
        return a

    def _record_size_name(self, node: fx.Node) -> None:
        """Remember which dim a size value came from (``x.size(0)`` is n), for factory calls' dim names."""
        args = node.args
        if node.op == "call_method" and node.target == "size" and isinstance(self.env.get(args[0]), Operand):
            dims = self.env[args[0]].spec.dims
            i = self._resolve(args[1]) if len(args) > 1 else node.kwargs.get("dim")
            self.size_names[node] = tuple(dims) if i is None else dims[i]
        elif node.op == "call_function" and node.target is getattr and args[1] == "shape" \
                and isinstance(self.env.get(args[0]), Operand):
            self.size_names[node] = tuple(self.env[args[0]].spec.dims)
        elif node.op == "call_function" and node.target is operator.getitem and \
                isinstance(self.size_names.get(args[0]), tuple) and isinstance(args[1], int):
            self.size_names[node] = self.size_names[args[0]][args[1]]

    def _check_mutation(self, node: fx.Node) -> None:
        x = node.args[0] if node.args else None
        if not isinstance(x, fx.Node):
            return
        later = [u for u in x.users if u is not node and self.order[u] > self.order[node]]
        if later:
            raise GraphImportError(
                f"model {self.name}: {readable_target(node, self.gm)} at {source_line(node) or 'an unknown line'} "
                f"modifies {x.name} in place, and {later[0].name} ({readable_target(later[0], self.gm)}) reads "
                f"{x.name} afterwards.  autopar's graph is functional: every op makes a new tensor.  What to do: "
                "write the out-of-place form (y = x + z instead of x += z; nn.ReLU() without inplace=True).")

    @staticmethod
    def _out_of_place(how: str, fn: Any, kwargs: dict) -> tuple[Any, dict]:
        if how == "method":
            return fn[:-1], kwargs
        if fn in INPLACE_OPERATOR:
            return INPLACE_OPERATOR[fn], kwargs
        return fn, {**kwargs, "inplace": False}

    def _elide(self, node: fx.Node, how: str, fn: Any, args: tuple, out: Any) -> bool:
        """Identities and copies carry their input through unchanged (no op)."""
        x = args[0] if args else None
        if not isinstance(x, Operand) or not isinstance(out, torch.Tensor):
            return False
        if tuple(out.shape) != tuple(x.spec.shape) or dtype_name(out.dtype) != x.spec.dtype:
            return False
        if how == "method":
            ok = fn in ELIDE_METHODS
        elif how == "module":
            ok = type(fn) is nn.Identity or (type(fn) is nn.Dropout and fn.p == 0)
        else:
            p = args[1] if len(args) > 1 else node.kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else node.kwargs.get("training", True)
            ok = fn is torch.clone or (fn is F.dropout and (p == 0 or training is False))
        if ok:
            self.env[node] = x
        return ok


def _holds_operand(v: Any) -> bool:
    if isinstance(v, (Operand, Pieces)):
        return True
    if isinstance(v, (list, tuple)):
        return any(_holds_operand(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_operand(x) for x in v.values())
    return False
