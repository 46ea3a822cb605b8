"""Op kinds: what each traced torch call becomes in the operator graph (FlexFlow sec. 4, Table 1, extended).

FlexFlow describes how an operation can be parallelized by its *parallelizable dimensions*:
sample, attribute (partitioning does not split parameters) and parameter (it does).  Table 1 of
the paper lists them for pooling, convolution and matrix multiplication; autopar extends the table
to every layer its models use.  `KINDS` is the list; ``planner/README.md`` is the one-page table
with the torch calls of each kind, its dims and how inputs and parameters map.

`build` picks the builder registered for a call (by function, Tensor method name or module type)
and falls back to an ``opaque`` op when there is none or when the call does not fit its kind (a
builder raises `NotThisKind`): any call fake tensors can run still becomes an op that plans,
partitioned by samples when that is safe and otherwise not at all.
"""

from __future__ import annotations

from ._base import FUNCTIONS, METHODS, MODULES, Built, Call, NotThisKind, Operand, Use, make_op
from . import _conv, _nn, _tensor, _views  # noqa: F401  (register builders)
from ._nn import build_cross_entropy
from ._tensor import build_buffer, build_input, build_opaque
from ._views import Pieces

# kind -> one line: its parallelizable dims (sample / attribute / parameter).
KINDS: dict[str, str] = {
    "input": "model inputs and labels; sample n, every other axis an attribute",
    "source": "factories (zeros, ones, full, arange, rand…) and buffers; every axis",
    "linear": "sample n, middle axes (attribute), output features (parameter)",
    "matmul": "batch axes (sample/attribute), m and p of the output; contracted k whole",
    "conv1d": "sample n, length (attribute, halo windows), output channels (parameter)",
    "conv2d": "sample n, height and width (attribute, halo windows), output channels (parameter)",
    "pool": "sample n, channels (attribute), length/height/width (attribute, windows)",
    "batch_norm": "sample n, spatial (attribute), channels (parameter); batch statistics are cross-partition",
    "layer_norm": "leading axes (sample/attribute); normalized axes whole",
    "embedding": "index axes (sample/attribute), embedding dim (parameter)",
    "lstm_cell": "sample n, hidden units (parameter; all four gates' rows of those units)",
    "attention": "nn.MultiheadAttention core: sample n, query length (attribute), heads (parameter, granule head_dim)",
    "sdpa": "scaled dot-product attention: sample n, heads and query length (attribute)",
    "softmax": "every axis but the softmax axis",
    "log_softmax": "every axis but the softmax axis",
    "cross_entropy": "the loss: sample n and positions as reduction dims (partial sums); classes whole",
    "elementwise": "every output axis; broadcast size-1 axes read whole",
    "reduce": "kept axes; reduced axes whole",
    "concat": "every axis (the joined one with shifted maps); a stacking axis whole",
    "slice": "every kept axis (strided/shifted maps); selected indices fixed",
    "reshape": "axes that carry through or are the outer part of a split axis; merged axes whole",
    "permute": "every axis",
    "expand": "every axis (expanded size-1 axes read whole)",
    "opaque": "sample n when every input and output is batch-first, else nothing",
}

__all__ = ["KINDS", "Built", "Call", "NotThisKind", "Operand", "Pieces", "Use", "build", "build_buffer",
           "build_cross_entropy", "build_input", "build_opaque", "make_op"]


def _builder(c: Call):
    if c.how == "function":
        try:
            return FUNCTIONS.get(c.fn)
        except TypeError:          # an unhashable callable object
            return None
    if c.how == "method":
        return METHODS.get(c.fn)
    for t, b in MODULES:
        # A subclass that overrides forward computes something else: leave it opaque.
        if isinstance(c.fn, t) and type(c.fn).forward is t.forward:
            return b
    return None


def build(c: Call) -> Built:
    """The op(s) for one traced call, and the value the call has for the rest of the trace."""
    builder = _builder(c)
    if builder is not None:
        try:
            return builder(c)
        except NotThisKind:
            pass
    return build_opaque(c)
