"""Builders of the layer kinds: linear, layer_norm, embedding, softmax, lstm_cell, attention, sdpa and
the cross_entropy loss (FlexFlow Table 1 extended to the layers of FlexFlow's RNNs, sec. 8.1, and of
transformers).

Parameter dims (FlexFlow sec. 4) are the output axes whose partitioning splits a weight: output
features of a linear layer, the embedding dimension, the hidden units of an LSTM cell (all four
gates' rows for those units: the weights are viewed as (4, H, ·)), and the heads of an attention
layer (its in-projection viewed as (3, E, E), cut on whole heads: granule = head size).
"""

from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._base import (Built, Call, FrozenDict, Namer, NotThisKind, Operand, Slot, Use, broadcast_maps,
                    default_pardims, ident, make_op, norm_axis, numel, out_tensor, register, single, spec,
                    template_attrs, templatize)
from ..graph import WHOLE, AxisMap, Op, TensorRef, TensorSpec


def _whole(o: Operand) -> tuple:
    return tuple(WHOLE for _ in o.spec.shape)


def _slots(*operands: Operand | None) -> tuple:
    """Template arguments for explicit operand lists: a Slot per operand, None for absent ones."""
    out, k = [], 0
    for o in operands:
        if o is None:
            out.append(None)
        else:
            out.append(Slot(k))
            k += 1
    return tuple(out)


# -- linear ------------------------------------------------------------------------------------------

def linear_op(c: Call, x: Operand, w: Operand, b: Operand | None, out: torch.Tensor, *, name: str | None = None,
              target: str | None = None) -> Op:
    namer = Namer()
    names = [namer(d, k) for k, d in enumerate(x.spec.dims)]
    f = names[-1]
    uses = [Use(x, tuple(ident(n) for n in names[:-1]) + (WHOLE,)), Use(w, (ident(f), WHOLE)),
            Use(b, (ident(f),)) if b is not None else None]
    o_spec = spec(out, names)
    flops = 2 * numel(out.shape) * x.spec.shape[-1] + (numel(out.shape) if b is not None else 0)
    args = _slots(x, w, b)
    return make_op(c, "linear", uses, [o_spec], default_pardims(o_spec, c.batch), flops=flops,
                   attrs=template_attrs(F.linear, "function", args, FrozenDict(())), name=name, target=target)


@register(modules=[nn.Linear], functions=[F.linear])
def build_linear(c: Call) -> Built:
    """Linear: sample and middle axes (attribute), output features (parameter: the weight's rows)."""
    out = out_tensor(c)
    if c.how == "module":
        x, w = c.args[0] if c.args else None, c.module_param("weight")
        b = c.module_param("bias") if c.fn.bias is not None else None
    else:
        x, w, b = c.arg(0, "input"), c.arg(1, "weight"), c.arg(2, "bias")
    if not (isinstance(x, Operand) and isinstance(w, Operand) and (b is None or isinstance(b, Operand))) \
            or len(w.spec.shape) != 2 or not x.spec.shape:
        raise NotThisKind("unusual linear")
    return single(linear_op(c, x, w, b, out))


# -- normalization ---------------------------------------------------------------------------------

@register(modules=[nn.LayerNorm, nn.RMSNorm], functions=[F.layer_norm, F.rms_norm])
def build_layer_norm(c: Call) -> Built:
    """Layer/RMS norm: the normalized (trailing) axes whole, every leading axis partitionable."""
    out = out_tensor(c)
    x = c.args[0] if c.args else c.kwargs.get("input")
    if not isinstance(x, Operand):
        raise NotThisKind("not a tensor")
    rms = isinstance(c.fn, nn.RMSNorm) or c.fn is F.rms_norm
    if c.how == "module":
        m = c.fn
        shape = tuple(m.normalized_shape)
        w = c.module_param("weight") if getattr(m, "weight", None) is not None else None
        b = c.module_param("bias") if getattr(m, "bias", None) is not None else None
        operands = [x] + [o for o in (w, b) if o is not None]
        sx, sw, sb = _slots(x, w, b)
        args = (sx, shape, sw, m.eps) if rms else (sx, shape, sw, sb, m.eps)
        fn = F.rms_norm if rms else F.layer_norm
        attrs = template_attrs(fn, "function", args, FrozenDict(()))
    else:
        shape = c.arg(1, "normalized_shape")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
        attrs = template_attrs(c.fn, c.how, args_t, kwargs_t)
    k = len(shape)
    namer = Namer()
    names = [namer(d, i) for i, d in enumerate(x.spec.dims)]
    uses = [Use(o, tuple(ident(n) for n in names[:-k]) + (WHOLE,) * k) if o is x else Use(o, _whole(o))
            for o in operands]
    o_spec = spec(out, names)
    attrs["normalized"] = k
    return single(make_op(c, "layer_norm", uses, [o_spec], default_pardims(o_spec, c.batch, names[-k:]),
                          flops=8 * numel(out.shape), attrs=attrs))


# -- embedding -------------------------------------------------------------------------------------

@register(modules=[nn.Embedding], functions=[F.embedding])
def build_embedding(c: Call) -> Built:
    """Embedding: every index axis (sample, attribute) and the embedding dim (parameter: weight columns)."""
    out = out_tensor(c)
    if c.how == "module":
        m = c.fn
        if m.max_norm is not None:
            raise NotThisKind("max_norm renormalizes the table in place")
        x, w = c.args[0] if c.args else None, c.module_param("weight")
        args = _slots(x, w) + (m.padding_idx, None, m.norm_type, m.scale_grad_by_freq, m.sparse)
        attrs = template_attrs(F.embedding, "function", args, FrozenDict(()))
    else:
        x, w = c.arg(0, "input"), c.arg(1, "weight")
        if c.arg(3, "max_norm") is not None:
            raise NotThisKind("max_norm renormalizes the table in place")
        operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
        if operands != [x, w]:
            raise NotThisKind("unusual embedding operands")
        attrs = template_attrs(c.fn, c.how, args_t, kwargs_t)
    if not (isinstance(x, Operand) and isinstance(w, Operand)) or len(w.spec.shape) != 2:
        raise NotThisKind("unusual embedding")
    namer = Namer()
    names = [namer(d, k) for k, d in enumerate(x.spec.dims)] + [namer("e")]
    uses = [Use(x, tuple(ident(n) for n in names[:-1])), Use(w, (WHOLE, ident(names[-1])))]
    o_spec = spec(out, names)
    read = numel(x.spec.shape) * x.spec.itemsize + o_spec.nbytes
    return single(make_op(c, "embedding", uses, [o_spec], default_pardims(o_spec, c.batch), flops=0, attrs=attrs,
                          bytes_fwd=read + o_spec.nbytes))


# -- softmax ---------------------------------------------------------------------------------------

_SOFTMAX_FUNCS = {F.softmax: F.softmax, F.log_softmax: F.log_softmax, torch.softmax: F.softmax,
                  torch.log_softmax: F.log_softmax}


@register(modules=[nn.Softmax, nn.LogSoftmax], functions=list(_SOFTMAX_FUNCS), methods=["softmax", "log_softmax"])
def build_softmax(c: Call) -> Built:
    """Softmax/log-softmax: the softmax axis whole, every other axis partitionable."""
    out = out_tensor(c)
    x = c.args[0] if c.args else c.kwargs.get("input")
    if not isinstance(x, Operand):
        raise NotThisKind("not a tensor")
    if c.how == "module":
        dim = c.fn.dim
        fn = F.log_softmax if isinstance(c.fn, nn.LogSoftmax) else F.softmax
        operands, attrs = [x], template_attrs(fn, "function", (Slot(0), dim), FrozenDict(()))
    else:
        dim = c.arg(1, "dim")
        operands, args_t, kwargs_t = templatize(c.args, c.kwargs)
        attrs = template_attrs(c.fn, c.how, args_t, kwargs_t)
    if not isinstance(dim, int) or operands != [x]:
        raise NotThisKind("softmax without an explicit dim")
    axis = norm_axis(dim, len(x.spec.shape))
    namer = Namer()
    names = [namer(d, k) for k, d in enumerate(x.spec.dims)]
    uses = [Use(x, tuple(WHOLE if k == axis else ident(n) for k, n in enumerate(names)))]
    o_spec = spec(out, names)
    attrs["axis"] = axis
    kind = "log_softmax" if (c.fn in (F.log_softmax, torch.log_softmax, "log_softmax")
                             or isinstance(c.fn, nn.LogSoftmax)) else "softmax"
    return single(make_op(c, kind, uses, [o_spec], default_pardims(o_spec, c.batch, [names[axis]]),
                          flops=5 * numel(out.shape), attrs=attrs))


# -- LSTM cell -------------------------------------------------------------------------------------

@register(modules=[nn.LSTMCell])
def build_lstm_cell(c: Call) -> Built:
    """One LSTM step: sample and hidden units (parameter: every gate's rows for those units).

    The new h and c of a slice of units need the whole previous h (it multiplies W_hh) but only
    that slice of the previous c.
    """
    m = c.fn
    x = c.args[0] if c.args else None
    state = c.arg(1, "hx")
    if not isinstance(x, Operand) or len(x.spec.shape) != 2 or not isinstance(c.out, tuple):
        raise NotThisKind("unbatched LSTM cell")
    if state is None:
        h = cc = None
    elif isinstance(state, (tuple, list)) and len(state) == 2 and all(isinstance(s, Operand) for s in state):
        h, cc = state
    else:
        raise NotThisKind("unusual LSTM state")
    H, I = m.hidden_size, m.input_size
    namer = Namer()
    n, hid = namer(x.spec.dims[0]), namer("h")
    ps = {k: c.module_param(k) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    gates = (WHOLE, ident(hid))
    uses = [Use(x, (ident(n), WHOLE)),
            Use(h, (ident(n), WHOLE)) if h is not None else None,
            Use(cc, (ident(n), ident(hid))) if cc is not None else None,
            Use(ps["weight_ih"], gates + (WHOLE,), (4, H, I)),
            Use(ps["weight_hh"], gates + (WHOLE,), (4, H, H)),
            Use(ps["bias_ih"], gates, (4, H)) if ps["bias_ih"] is not None else None,
            Use(ps["bias_hh"], gates, (4, H)) if ps["bias_hh"] is not None else None]
    outs = [spec(t, (n, hid)) for t in c.out]
    N = x.spec.shape[0]
    flops = 2 * N * (I + H) * 4 * H + 2 * N * 4 * H + 10 * N * H
    op = make_op(c, "lstm_cell", uses, outs, default_pardims(outs[0], c.batch), flops=flops, attrs={"hidden": H})
    return Built([op], (Operand(outs[0], TensorRef(op.name, 0)), Operand(outs[1], TensorRef(op.name, 1))))


# -- attention -------------------------------------------------------------------------------------

_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
             "is_causal")


def _weights_used(c: Call) -> bool:
    for user in c.node.users:
        if user.target is not operator.getitem:
            return True
        if user.args[1] != 0 and len(user.users) > 0:
            return True
    return False


@register(modules=[nn.MultiheadAttention])
def build_attention(c: Call) -> Built:
    """``nn.MultiheadAttention`` as an ``attention`` op (in-projection + scaled dot-product core, output
    (n, l, E) before the out-projection) followed by a ``linear`` op for ``out_proj``.

    The core is partitionable by sample, by query length (attribute: keys and values are read
    whole) and by heads (parameter dim on the feature axis with granule = head size: a task holds
    its heads' rows of the q, k and v projections).
    """
    m = c.fn
    a = {k: c.arg(i, k) for i, k in enumerate(_MHA_ARGS)}
    q, k, v, kpm, mask = a["query"], a["key"], a["value"], a["key_padding_mask"], a["attn_mask"]
    if m.bias_k is not None or m.add_zero_attn or _weights_used(c) or not isinstance(c.out, tuple):
        raise NotThisKind("attention with bias_kv, zero attention or returned weights")
    if not all(isinstance(t, Operand) for t in (q, k, v)) or len(q.spec.shape) != 3 or \
            not all(t is None or isinstance(t, Operand) for t in (kpm, mask)):
        raise NotThisKind("unbatched attention")
    heads, E = m.num_heads, m.embed_dim
    hd = E // heads
    bf = m.batch_first
    namer = Namer()
    names = [namer(d, i) for i, d in enumerate(q.spec.dims)]
    nb, ln, d = (names[0], names[1], names[2]) if bf else (names[1], names[0], names[2])
    q_maps = (ident(nb), ident(ln), WHOLE) if bf else (ident(ln), ident(nb), WHOLE)
    kv_maps = (ident(nb), WHOLE, WHOLE) if bf else (WHOLE, ident(nb), WHOLE)
    uses: list[Use | None] = [Use(q, q_maps), Use(k, kv_maps), Use(v, kv_maps),
                              Use(kpm, (ident(nb), WHOLE)) if kpm is not None else None]
    if mask is None:
        uses.append(None)
    elif len(mask.spec.shape) == 2:
        uses.append(Use(mask, (ident(ln), WHOLE)))
    else:
        uses.append(Use(mask, (AxisMap(dim=nb, kernel=heads, stride=heads), ident(ln), WHOLE)))
    rows = (ident(d), WHOLE)
    if m._qkv_same_embed_dim:
        uses += [Use(c.module_param("in_proj_weight"), (WHOLE, ident(d), WHOLE), (3, E, E)), None, None, None]
    else:
        uses += [None] + [Use(c.module_param(f"{p}_proj_weight"), rows) for p in "qkv"]
    uses.append(Use(c.module_param("in_proj_bias"), (WHOLE, ident(d)), (3, E)) if m.in_proj_bias is not None else None)
    out = c.out[0]
    o_spec = TensorSpec(tuple(q.spec.shape), tuple(names), spec(out, names).dtype)
    N, L = (q.spec.shape[0], q.spec.shape[1]) if bf else (q.spec.shape[1], q.spec.shape[0])
    S = k.spec.shape[1] if bf else k.spec.shape[0]
    flops = (2 * N * L * E * q.spec.shape[2] + 2 * N * S * E * (k.spec.shape[2] + v.spec.shape[2])
             + 4 * N * L * S * E + 5 * N * heads * L * S)
    pardims = [nb, ln, (d, hd)]
    attrs = {"heads": heads, "head_dim": hd, "batch_first": bf, "dropout": m.dropout, "training": m.training,
             "mask_rank": len(mask.spec.shape) if mask is not None else 0}
    core = make_op(c, "attention", uses, [o_spec], [p for p in pardims if p == c.batch or isinstance(p, tuple)
                                                    or o_spec.shape[names.index(p)] > 1],
                   flops=flops, attrs=attrs, target=f"{c.target} (in-projection + attention)")
    x = Operand(o_spec, TensorRef(core.name, 0))
    b = c.module_param("out_proj.bias") if m.out_proj.bias is not None else None
    proj = linear_op(c, x, c.module_param("out_proj.weight"), b, out, name=f"{c.name}.out_proj",
                     target=f"nn.Linear {c.qualname}.out_proj")
    return Built([core, proj], (Operand(proj.outputs[0], TensorRef(proj.name, 0)), None))


@register(functions=[F.scaled_dot_product_attention])
def build_sdpa(c: Call) -> Built:
    """``F.scaled_dot_product_attention``: leading axes (sample, heads) and query length partitionable."""
    out = out_tensor(c)
    q, k, v = c.arg(0, "query"), c.arg(1, "key"), c.arg(2, "value")
    mask = c.arg(3, "attn_mask")
    if not all(isinstance(t, Operand) for t in (q, k, v)) or len(q.spec.shape) < 2 or \
            not (mask is None or isinstance(mask, Operand)):
        raise NotThisKind("unusual attention operands")
    shape = tuple(out.shape)
    namer = Namer()
    names = [namer(d, i) for i, d in enumerate(q.spec.dims[:-1])] + [namer(v.spec.dims[-1], len(shape) - 1)]
    lead, ln = names[:-2], names[-2]
    exclude = [names[-1]]
    if len(shape) >= 4 and k.spec.shape[-3] != q.spec.shape[-3]:
        exclude.append(names[-3])          # grouped-query attention: kv heads are shared by head groups
    pseudo = names[:-2] + [ln, "_s"]

    def lead_maps(o: Operand, tail: tuple) -> tuple:
        full = tuple(shape[:-2])
        off = len(full) - (len(o.spec.shape) - 2)
        return tuple(ident(lead[off + i]) if s == full[off + i] and lead[off + i] not in exclude else WHOLE
                     for i, s in enumerate(o.spec.shape[:-2])) + tail
    uses = [Use(q, lead_maps(q, (ident(ln), WHOLE))), Use(k, lead_maps(k, (WHOLE, WHOLE))),
            Use(v, lead_maps(v, (WHOLE, WHOLE)))]
    if mask is not None:
        L = q.spec.shape[-2]
        full = tuple(shape[:-2]) + (L, k.spec.shape[-2])
        ms = broadcast_maps(mask, full, pseudo)
        uses.append(Use(mask, tuple(WHOLE if m.dim in exclude or m.dim == "_s" else m for m in ms)))
    else:
        uses.append(None)
    o_spec = spec(out, names)
    L, S = q.spec.shape[-2], k.spec.shape[-2]
    lead_n = numel(shape[:-2])
    flops = 2 * lead_n * L * S * (q.spec.shape[-1] + v.spec.shape[-1]) + 5 * lead_n * L * S
    attrs = {"dropout_p": c.arg(4, "dropout_p", 0.0), "is_causal": bool(c.arg(5, "is_causal", False)),
             "scale": c.arg(6, "scale"), "enable_gqa": bool(c.kwargs.get("enable_gqa", False))}
    return single(make_op(c, "sdpa", uses, [o_spec], default_pardims(o_spec, c.batch, exclude), flops=flops,
                          attrs=attrs))


# -- loss ------------------------------------------------------------------------------------------

def build_cross_entropy(c: Call, logits: Operand, target: Operand) -> Op:
    """The loss: mean cross entropy over every position of (n, …, classes) logits against (n, …) labels.

    All leading dims are reduction dims (no output axis carries them): a task over a shard of
    samples/positions returns its partial sum divided by the global count, so partials add up to
    the mean.  The class axis is read whole.
    """
    lead = logits.spec.shape[:-1]
    if tuple(target.spec.shape) != tuple(lead):
        raise NotThisKind(f"labels of shape {target.spec.shape} do not match logits {logits.spec.shape}")
    namer = Namer()
    names = [namer(d, i) for i, d in enumerate(logits.spec.dims[:-1])]
    uses = [Use(logits, tuple(ident(n) for n in names) + (WHOLE,)), Use(target, tuple(ident(n) for n in names))]
    reductions = dict(zip(names, lead))
    pardims = [n for n, s in reductions.items() if n == c.batch or s > 1]
    out = TensorSpec((), (), logits.spec.dtype)
    return make_op(c, "cross_entropy", uses, [out], pardims, flops=5 * numel(logits.spec.shape),
                   attrs={"count": numel(lead)}, reductions=reductions)
