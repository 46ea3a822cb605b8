"""Tracing, fake-tensor shape propagation and node naming for `planner.ir.fx_import`.

The tracer is ``torch.fx``'s with three changes: ``torch.nn`` modules and the user's `leaf_modules`
are leaves; torch factories called with traced sizes record a node; Python control flow on a traced
value raises `GraphImportError` naming the node, the model line and what to do.  Shapes come from
`FakeTensorProp` (torch/fx/passes/fake_tensor_prop.py) run with fake parameters swapped in by
``torch.nn.utils.stateless._reparametrize_module`` (what ``torch.func.functional_call`` uses), so no
real memory is touched and ``meta``-device models import too.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import itertools
import logging
import math
import operator
import os
import re
import sys
import traceback
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.nn.utils.stateless import _reparametrize_module

from ..errors import GraphImportError

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(__file__) + os.sep  # the importer and the op kinds: never a user's frame
_FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "arange")
INPLACE_OPERATOR = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                     operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                     operator.imod: operator.mod, operator.ipow: operator.pow, operator.iand: operator.and_,
                     operator.ior: operator.or_, operator.ixor: operator.xor}
ELIDE_METHODS = {"contiguous", "clone", "to", "type", "type_as", "float", "double", "half", "bfloat16", "long",
                  "int", "bool"}
_LEAF_ADVICE = ("mark the module that contains it as a leaf, import_model(..., leaf_modules=({cls},)), so it "
                "is imported as one opaque op")


# -- tracing --------------------------------------------------------------------------------------

def _user_frame(frames: Sequence[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    user = [f for f in frames if not f.filename.startswith(_TORCH_DIR) and not f.filename.startswith(_OWN_DIR)
            and not f.filename.startswith("<")]
    return user[-1] if user else None


def _where(frame: traceback.FrameSummary | None) -> str:
    if frame is None:
        return "an unknown line"
    code = f" (`{frame.line.strip()}`)" if frame.line else ""
    return f"{frame.filename}:{frame.lineno}{code}"


def _module_in_frames(frame=None) -> str:
    """Class of the innermost model-code method's receiver that is an nn.Module (for leaf_modules advice)."""
    f = frame if frame is not None else sys._getframe()
    while f is not None:
        code = f.f_code
        if not code.co_filename.startswith(_TORCH_DIR) and not code.co_filename.startswith(_OWN_DIR) and code.co_argcount:
            obj = f.f_locals.get(code.co_varnames[0])
            if isinstance(obj, nn.Module):
                return type(obj).__name__
        f = f.f_back
    return "YourModule"


def _innermost_frame(tb):
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame


class _Tracer(fx.Tracer):
    def __init__(self, leaves: tuple[type, ...], model: str) -> None:
        super().__init__()
        self.record_stack_traces = True
        self._leaves = leaves
        self._model = model

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self._leaves) or super().is_leaf_module(m, qualname)

    def _data_dependent(self, obj: fx.Proxy, what: str, advice: str):
        frame = _user_frame(traceback.extract_stack())
        node = obj.node
        raise GraphImportError(
            f"cannot trace model {self._model}: {what} traced tensor {node.name} "
            f"({readable_target(node, self.root)}) at {_where(frame)}.  A symbolic trace follows shapes, "
            f"not values.  What to do: {advice}.")

    def to_bool(self, obj: fx.Proxy) -> bool:
        self._data_dependent(
            obj, "Python control flow (if/while/assert) depends on the value of",
            "remove the data-dependent control flow: compute both branches and select with torch.where(cond, a, b) "
            "(a branch on tensor values cannot be planned from shapes)")

    def iter(self, obj: fx.Proxy):
        self._data_dependent(
            obj, "a loop or unpacking iterates over",
            "loop over range(k) with a Python int, unpack a known number of pieces (a, b = x.chunk(2)), or "
            + _LEAF_ADVICE.format(cls=_module_in_frames()))


@contextlib.contextmanager
def _traceable_factories(tracer: fx.Tracer):
    """Let ``torch.zeros(x.size(0), h)`` and friends record a node when a size is traced."""
    originals = {n: getattr(torch, n) for n in _FACTORIES}

    def wrap(orig):
        @functools.wraps(orig)
        def call(*args, **kwargs):
            if any(isinstance(v, fx.Proxy) for v in torch.utils._pytree.tree_leaves((args, kwargs))):
                return tracer.create_proxy("call_function", orig, args, kwargs)
            return orig(*args, **kwargs)
        return call
    try:
        for n, f in originals.items():
            setattr(torch, n, wrap(f))
        yield
    finally:
        for n, f in originals.items():
            setattr(torch, n, f)


LEAF_ROOT = "model"


def _leaf_root(module: nn.Module, n_inputs: int) -> nn.Module:
    """A module whose forward(x0, …) calls `module` as its submodule ``model`` (fx needs a fixed arity)."""
    args = ", ".join(f"x{i}" for i in range(n_inputs))
    scope: dict[str, Any] = {}
    exec(f"def forward(self, {args}):\n    return self.{LEAF_ROOT}({args})\n", scope)
    wrapper = type(f"{type(module).__name__}Root", (nn.Module,), {"forward": scope["forward"]})()
    wrapper.add_module(LEAF_ROOT, module)
    return wrapper


def trace_module(module: nn.Module, n_inputs: int, leaves: tuple[type, ...], model: str) -> fx.GraphModule:
    """Trace `module`; a leaf model is wrapped so that it is called as submodule `LEAF_ROOT`."""
    positional = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < n_inputs:
        raise GraphImportError(f"model {model}: {n_inputs} inputs given but {type(module).__name__}.forward takes "
                               f"{len(positional)} positional arguments ({', '.join(p.name for p in positional)})")
    concrete = {}
    for p in positional[n_inputs:]:
        if p.default is p.empty:
            raise GraphImportError(f"model {model}: forward argument {p.name!r} has no default and no input spec; "
                                   f"add it to inputs")
        concrete[p.name] = p.default
    tracer = _Tracer(leaves, model)
    root = module
    if tracer.is_leaf_module(module, ""):
        # A leaf as the whole model (a bare nn.Conv2d, a leaf_modules class) is one op, not its insides.
        root, concrete = _leaf_root(module, n_inputs), {}
    try:
        with _traceable_factories(tracer):
            graph = tracer.trace(root, concrete_args=concrete or None)
    except GraphImportError:
        raise
    except Exception as e:
        frame = _user_frame(traceback.extract_tb(e.__traceback__))
        nodes = list(tracer.graph.nodes) if getattr(tracer, "graph", None) is not None else []
        after = f" (after node {nodes[-1].name}, {readable_target(nodes[-1], root)})" if nodes else ""
        raise GraphImportError(
            f"cannot trace model {model}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} at "
            f"{_where(frame)}{after}.  What to do: make that code traceable (no len(), iteration or Python control "
            f"flow on tensors), or {_LEAF_ADVICE.format(cls=_module_in_frames(_innermost_frame(e.__traceback__)))}.") from e
    gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
    for node in reversed(list(gm.graph.nodes)):   # drop unused results, but never a mutation
        if node.op.startswith("call") and not node.users and not mutating(node, gm)[0]:
            gm.graph.erase_node(node)
    return gm


# -- shape propagation ----------------------------------------------------------------------------

class _Prop(FakeTensorProp):
    def __init__(self, gm: fx.GraphModule, mode: FakeTensorMode, model: str) -> None:
        super().__init__(gm, mode)
        self.extra_traceback = False      # our message names the node and the model line already
        self.values: dict[fx.Node, Any] = {}
        self._model = model

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except GraphImportError:
            raise
        except Exception as e:
            msg = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else ""
            raise GraphImportError(
                f"model {self._model}: shape propagation failed at node {n.name} ({readable_target(n, self.module)}) "
                f"at {source_line(n) or 'an unknown line'}: {type(e).__name__}: {msg}.  What to do: check that the "
                f"input specs (shapes, dtypes) are what the model expects; an op whose output shape depends on "
                f"tensor values (.item(), nonzero, boolean masks) cannot be planned and must be rewritten.") from e
        self.values[n] = result
        return result


def propagate(gm: fx.GraphModule, inputs, model: str) -> dict[fx.Node, Any]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    state, fakes = {}, {}
    with mode:
        args = [torch.empty(s.shape, dtype=getattr(torch, s.dtype)) for _, s in inputs]
        for n, t in itertools.chain(gm.named_parameters(remove_duplicate=False),
                                    gm.named_buffers(remove_duplicate=False)):
            if id(t) not in fakes:
                f = torch.empty(t.shape, dtype=t.dtype)
                fakes[id(t)] = f.requires_grad_(True) if t.requires_grad and t.dtype.is_floating_point else f
            state[n] = fakes[id(t)]
    prop = _Prop(gm, mode, model)
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)      # failures are reported as GraphImportError, not logged twice
    try:
        with _reparametrize_module(gm, state):
            prop.propagate_dont_convert_inputs(*args)
    finally:
        quiet.setLevel(level)
    return prop.values


# -- naming and source lines ----------------------------------------------------------------------

@functools.cache
def _fn_names() -> dict[int, str]:
    out: dict[int, str] = {}
    for ns, prefix in ((operator, "operator."), (F, "F."), (torch, "torch."), (math, "math."), (builtins, "")):
        for n in dir(ns):
            if not n.startswith("_"):
                out.setdefault(id(getattr(ns, n)), prefix + n)
    return out


def readable_target(node: fx.Node, root: nn.Module) -> str:
    if node.op == "call_module":
        cls = type(root.get_submodule(node.target))
        return f"{'nn.' if cls.__module__.startswith('torch.nn') else ''}{cls.__name__} {node.target}"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_function":
        return _fn_names().get(id(node.target)) or fx.node._get_qualified_name(node.target)
    return f"{node.op} {node.target}"


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)(?:\n[ \t]+([^\n]*))?')


def source_line(node: fx.Node) -> str:
    if not node.stack_trace:
        return ""
    frames = [traceback.FrameSummary(f, int(ln), fn, line=code or None)
              for f, ln, fn, code in _FRAME.findall(node.stack_trace)]
    frame = _user_frame(frames)
    return f"{frame.filename}:{frame.lineno}" if frame else ""


def mutating(node: fx.Node, root: nn.Module) -> tuple[bool, bool]:
    """(mutates its first argument, can be rewritten to the out-of-place call)."""
    t = node.target
    if node.op == "call_method":
        if t.endswith("_") and not t.endswith("__"):
            return True, hasattr(torch.Tensor, t[:-1])
        return False, False
    if node.op == "call_module":
        return bool(getattr(root.get_submodule(t), "inplace", False)), False
    if node.op == "call_function":
        if t in INPLACE_OPERATOR:
            return True, True
        if node.kwargs.get("inplace") is True:
            return True, True
        try:
            bound = inspect.signature(t).bind(*node.args, **node.kwargs)
            return bound.arguments.get("inplace") is True, False
        except (TypeError, ValueError):
            return False, False
    return False, False


def has_tensor(v: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in torch.utils._pytree.tree_leaves(v))
