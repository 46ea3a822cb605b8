"""Builders of the image kinds: conv1d/conv2d, pool and batch_norm (FlexFlow Table 1).

Convolutions and pools are partitionable by sample, by length / height and width (attribute
dims: a task reads its output rows' receptive field, the *halo*, through an `AxisMap` window
with the layer's kernel, stride, padding and dilation) and, for convolutions, by output channel
(a parameter dim: each task holds its rows of the weight).  OptCNN (sec. 3) counts the halo as
the extra input a spatial partition transfers; FlexFlow's Table 1 lists the same dims.

Grouped convolutions: channel partitioning needs every task's input channels to be one box, which
holds for ``groups == 1`` (all input channels) and for ``groups == out_channels`` (depthwise and
"one output per group": output channel o reads input channels [o·I/g, (o+1)·I/g), a block map).
Other group counts keep the channel axis whole.

Batch norm with batch statistics couples the tasks that share a channel slice: they must agree on
the mean and variance over all samples and positions.  The op records it (``cross_partition_stats``)
and `planner.ir.kernels` takes the statistics from the caller (`kernels.batch_norm_partial_stats`).
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from ._base import (Built, Call, Namer, NotThisKind, Operand, Use, default_pardims, ident, make_op, numel,
                    out_tensor, register, single, spec)
from ..graph import WHOLE, AxisMap


def _tup(v, nd: int) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return tuple(int(v[0]) for _ in range(nd))
        return tuple(int(x) for x in v)
    return tuple(int(v) for _ in range(nd))


# -- convolution -----------------------------------------------------------------------------------

_CONV_FUNCS = {F.conv1d: 1, F.conv2d: 2}


@register(modules=[nn.Conv1d, nn.Conv2d], functions=list(_CONV_FUNCS))
def build_conv(c: Call) -> Built:
    out = out_tensor(c)
    if c.how == "module":
        m = c.fn
        nd = 1 if isinstance(m, nn.Conv1d) else 2
        x, w = c.args[0] if c.args else None, c.module_param("weight")
        b = c.module_param("bias") if m.bias is not None else None
        stride, padding, dilation, groups, mode = m.stride, m.padding, m.dilation, m.groups, m.padding_mode
    else:
        nd = _CONV_FUNCS[c.fn]
        x, w, b = c.arg(0, "input"), c.arg(1, "weight"), c.arg(2, "bias")
        stride, padding, dilation, groups = (c.arg(3, "stride", 1), c.arg(4, "padding", 0),
                                             c.arg(5, "dilation", 1), c.arg(6, "groups", 1))
        mode = "zeros"
    if not isinstance(x, Operand) or not isinstance(w, Operand) or len(x.spec.shape) != nd + 2 or \
            not (b is None or isinstance(b, Operand)):
        raise NotThisKind("unbatched or unusual convolution")
    kernel = tuple(w.spec.shape[2:])
    stride, dilation = _tup(stride, nd), _tup(dilation, nd)
    if padding == "valid":
        pad = (0,) * nd
    elif padding == "same":
        pad = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))
    else:
        pad = _tup(padding, nd)
    out_ch, in_ch = w.spec.shape[0], x.spec.shape[1]
    per_group = in_ch // groups
    channel_ok = groups == 1 or groups == out_ch
    namer = Namer()
    names = [namer(d, k) for k, d in enumerate(x.spec.dims)]
    n, ch, spatial = names[0], names[1], names[2:]
    windows = tuple(AxisMap(dim=s, kernel=k, stride=st, pad=p, dilation=d)
                    for s, k, st, p, d in zip(spatial, kernel, stride, pad, dilation))
    chan_in = WHOLE if groups == 1 or not channel_ok else AxisMap(dim=ch, kernel=per_group, stride=per_group)
    uses = [Use(x, (ident(n), chan_in) + windows),
            Use(w, (ident(ch) if channel_ok else WHOLE,) + (WHOLE,) * (nd + 1)),
            Use(b, (ident(ch),)) if b is not None else None]
    o_spec = spec(out, names)
    exclude = ([] if channel_ok else [ch]) + ([] if mode == "zeros" else spatial)
    flops = 2 * numel(out.shape) * per_group * numel(kernel) + (numel(out.shape) if b is not None else 0)
    attrs = {"nd": nd, "kernel": kernel, "stride": stride, "padding": pad, "dilation": dilation, "groups": groups,
             "padding_mode": mode}
    return single(make_op(c, f"conv{nd}d", uses, [o_spec], default_pardims(o_spec, c.batch, exclude), flops=flops,
                          attrs=attrs))


# -- pooling ---------------------------------------------------------------------------------------

# type or function -> (mode, spatial rank, adaptive)
_POOLS = {
    nn.MaxPool1d: ("max", 1, False), nn.MaxPool2d: ("max", 2, False),
    nn.AvgPool1d: ("avg", 1, False), nn.AvgPool2d: ("avg", 2, False),
    nn.AdaptiveAvgPool1d: ("avg", 1, True), nn.AdaptiveAvgPool2d: ("avg", 2, True),
    nn.AdaptiveMaxPool1d: ("max", 1, True), nn.AdaptiveMaxPool2d: ("max", 2, True),
}
_POOL_FUNCS = {
    F.max_pool1d: ("max", 1, False), F.max_pool2d: ("max", 2, False),
    F.avg_pool1d: ("avg", 1, False), F.avg_pool2d: ("avg", 2, False),
    F.adaptive_avg_pool1d: ("avg", 1, True), F.adaptive_avg_pool2d: ("avg", 2, True),
    F.adaptive_max_pool1d: ("max", 1, True), F.adaptive_max_pool2d: ("max", 2, True),
}
_ADAPTIVE_FN = {("avg", 1): F.adaptive_avg_pool1d, ("avg", 2): F.adaptive_avg_pool2d,
                ("max", 1): F.adaptive_max_pool1d, ("max", 2): F.adaptive_max_pool2d}


def _pool_config(c: Call) -> tuple[str, int, bool, dict]:
    if c.how == "module":
        mode, nd, adaptive = next(v for t, v in _POOLS.items() if isinstance(c.fn, t))
        m = c.fn
        cfg = {k: getattr(m, k, None) for k in ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                                 "count_include_pad", "divisor_override", "return_indices",
                                                 "output_size")}
    else:
        mode, nd, adaptive = _POOL_FUNCS[c.fn]
        if adaptive:
            keys = ("output_size", "return_indices")
        elif mode == "max":
            keys = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        else:
            keys = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
        cfg = {k: c.arg(i + 1, k) for i, k in enumerate(keys)}
    if cfg.get("return_indices"):
        raise NotThisKind("pool returning indices")
    return mode, nd, adaptive, cfg


@register(modules=list(_POOLS), functions=list(_POOL_FUNCS))
def build_pool(c: Call) -> Built:
    """Max/avg pools: sample, channel (attribute) and spatial windows; adaptive pools are windows when exact."""
    out = out_tensor(c)
    mode, nd, adaptive, cfg = _pool_config(c)
    x = c.args[0] if c.args else c.kwargs.get("input")
    if not isinstance(x, Operand) or len(x.spec.shape) != nd + 2:
        raise NotThisKind("unbatched pool")
    in_size, out_size = tuple(x.spec.shape[2:]), tuple(out.shape[2:])
    namer = Namer()
    names = [namer(d, k) for k, d in enumerate(x.spec.dims)]
    spatial = names[2:]
    attrs = {"mode": mode, "nd": nd, "in_size": in_size}
    if adaptive and all(i % o == 0 for i, o in zip(in_size, out_size)):
        kernel = tuple(i // o for i, o in zip(in_size, out_size))
        attrs.update(kernel=kernel, stride=kernel, padding=(0,) * nd, dilation=(1,) * nd, ceil_mode=False,
                     count_include_pad=True, divisor_override=None)
    elif adaptive:
        attrs.update(adaptive=out_size, fn=_ADAPTIVE_FN[(mode, nd)])
    else:
        kernel = _tup(cfg["kernel_size"], nd)
        stride = kernel if cfg.get("stride") in (None, (), []) else _tup(cfg["stride"], nd)
        attrs.update(kernel=kernel, stride=stride, padding=_tup(cfg.get("padding") or 0, nd),
                     dilation=_tup(cfg.get("dilation") or 1, nd), ceil_mode=bool(cfg.get("ceil_mode")),
                     count_include_pad=cfg.get("count_include_pad", True) is not False,
                     divisor_override=cfg.get("divisor_override"))
    if "kernel" in attrs:
        windows = tuple(AxisMap(dim=s, kernel=k, stride=st, pad=p, dilation=d) for s, k, st, p, d in
                        zip(spatial, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"]))
        flops = numel(out.shape) * numel(attrs["kernel"])
        exclude = []
    else:
        windows = (WHOLE,) * nd
        flops = numel(x.spec.shape)
        exclude = spatial
    o_spec = spec(out, names)
    uses = [Use(x, (ident(names[0]), ident(names[1])) + windows)]
    return single(make_op(c, "pool", uses, [o_spec], default_pardims(o_spec, c.batch, exclude), flops=flops,
                          attrs=attrs))


# -- batch norm ------------------------------------------------------------------------------------

@register(modules=[nn.BatchNorm1d, nn.BatchNorm2d])
def build_batch_norm(c: Call) -> Built:
    """Batch norm: sample, spatial (attribute) and channel (parameter when affine) dims."""
    out = out_tensor(c)
    m = c.fn
    x = c.args[0] if c.args else None
    rank_ok = (2, 3) if isinstance(m, nn.BatchNorm1d) else (4,)
    if not isinstance(x, Operand) or len(x.spec.shape) not in rank_ok:
        raise NotThisKind("unbatched batch norm")
    namer = Namer()
    names = [namer(d, k) for k, d in enumerate(x.spec.dims)]
    batch_stats = m.training or not m.track_running_stats or m.running_mean is None
    w = c.module_param("weight") if m.affine else None
    b = c.module_param("bias") if m.affine else None
    uses = [Use(x, tuple(ident(n) for n in names)),
            Use(w, (ident(names[1]),)) if w is not None else None,
            Use(b, (ident(names[1]),)) if b is not None else None]
    o_spec = spec(out, names)
    attrs = {"eps": m.eps, "momentum": m.momentum, "batch_stats": bool(batch_stats),
             "cross_partition_stats": bool(batch_stats), "module": c.qualname}
    return single(make_op(c, "batch_norm", uses, [o_spec], default_pardims(o_spec, c.batch),
                          flops=8 * numel(out.shape), attrs=attrs))
