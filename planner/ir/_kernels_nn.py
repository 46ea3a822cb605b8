"""Task kernels of the layer kinds (conv, pool, batch_norm, lstm_cell, attention, sdpa, cross_entropy).

Spatial partitions of convolutions and pools (FlexFlow sec. 4 attribute dims; OptCNN sec. 3's
halo) receive their input window clipped at the image border; the kernel pads the clipped part
itself — zeros for convolutions and average pools, -inf for max pools — and runs the layer with
no padding, so every task computes exactly its rows of the full layer.  Average pools divide the
window sums by the divisor PyTorch uses at each global output position (count_include_pad,
ceil_mode and divisor_override included).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .graph import Op


@dataclass(frozen=True)
class Ctx:
    module: nn.Module | None = None
    bn_stats: tuple[torch.Tensor, torch.Tensor] | None = None
    device: torch.device | None = None
    seed: int | None = None      # of the op's random draws this step (`kernels.op_seed`); None: torch's RNG


# -- random draws that do not depend on the partition ------------------------------------------------

def seeded_region(seed: int, full_shape: Sequence[int], box: Sequence[tuple[int, int]], like: torch.Tensor,
                  draw: str = "bernoulli", p: float = 0.5) -> torch.Tensor:
    """Region `box` of a tensor of `full_shape` drawn whole from a generator seeded with `seed`:
    every task of an op, however the op is split, sees the numbers one device would draw.
    `draw`: ``bernoulli`` (ones with probability `p`, as float32), ``rand`` or ``randn``."""
    full_shape, box = tuple(full_shape), tuple(box)
    # A large tensor is drawn in blocks, one generator per index of its leading axes, so that a task
    # draws only the blocks it covers (a data-parallel rank does not draw the whole batch's mask).
    # The layout depends on the full shape alone, never on the partition.
    lead = 0
    while lead < len(full_shape) - 1 and math.prod(full_shape[lead:]) > _DRAW_BLOCK:
        lead += 1
    inner = tuple(slice(lo, hi) for lo, hi in box[lead:])
    if lead == 0:
        return _draw(seed, full_shape, like.device, draw, p)[inner]
    strides = [math.prod(full_shape[i + 1:lead]) for i in range(lead)]
    blocks = []
    for idx in itertools.product(*(range(lo, hi) for lo, hi in box[:lead])):
        flat = sum(i * st for i, st in zip(idx, strides))
        blocks.append(_draw(_block_seed(seed, flat), full_shape[lead:], like.device, draw, p)[inner])
    sizes = tuple(hi - lo for lo, hi in box)
    if not blocks:
        return torch.empty(sizes, dtype=torch.float32, device=like.device)
    return torch.stack(blocks).reshape(sizes)


_DRAW_BLOCK = 1 << 22      # elements drawn by one generator at most (unless one innermost row is longer)


def _block_seed(seed: int, index: int) -> int:
    return (seed ^ ((index + 1) * 0x9E3779B97F4A7C15)) & ((1 << 63) - 1)


def _draw(seed: int, shape: tuple[int, ...], device, draw: str, p: float) -> torch.Tensor:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    full = torch.empty(shape, dtype=torch.float32, device=device)
    if draw == "bernoulli":
        return full.bernoulli_(p, generator=gen)
    if draw == "rand":
        return full.uniform_(0.0, 1.0, generator=gen)
    return full.normal_(0.0, 1.0, generator=gen)


def dropout(x: torch.Tensor, p: float, ctx: Ctx, full_shape: Sequence[int], box: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Dropout of region `box` of a tensor of `full_shape` (training mode): with ``ctx.seed`` the mask
    is the region of the whole tensor's mask, so a split op drops exactly what one device drops."""
    if p <= 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    if ctx.seed is None:
        return F.dropout(x, p)
    keep = seeded_region(ctx.seed, full_shape, box, x, "bernoulli", 1.0 - p)
    return x * (keep * (1.0 / (1.0 - p))).to(x.dtype)


def local_shape(op: Op, k: int, ranges) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in op.output_box(k, ranges))


def _window_pads(op: Op, ranges, x: torch.Tensor, nd: int) -> list[tuple[int, int]]:
    """Per spatial axis, what to add (or, negative, cut) at each end of the received input to get the
    task's input window: the window was clipped at the border, or the whole axis was sent (an axis
    that is not partitioned, e.g. of output size 1, reads its input whole)."""
    out = op.outputs[0]
    pads = []
    for i in range(nd):
        a, b = ranges.get(out.dims[2 + i], (0, out.shape[2 + i]))
        k, s, p, d = (op.attr(key)[i] for key in ("kernel", "stride", "padding", "dilation"))
        want_lo, want_len = a * s - p, (b - 1 - a) * s + (k - 1) * d + 1
        got_lo = 0 if op.input_maps[0][2 + i].dim is None else max(0, want_lo)
        pads.append((got_lo - want_lo, want_lo + want_len - got_lo - x.shape[2 + i]))
    return pads


def _flat(pads: Sequence[tuple[int, int]]) -> list[int]:
    return [v for lo_hi in reversed(pads) for v in lo_hi]    # F.pad lists the last axis first


def _conv(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    x, w, b = operands
    nd = op.attr("nd")
    pads = _flat(_window_pads(op, ranges, x, nd))
    mode = op.attr("padding_mode")
    if any(pads):
        x = F.pad(x, pads) if mode == "zeros" else F.pad(x, pads, mode=mode)
    groups = op.attr("groups")
    if groups > 1 and groups == op.outputs[0].shape[1]:
        groups = w.shape[0]                 # one group per output channel: the shard's channels
    conv = F.conv1d if nd == 1 else F.conv2d
    return [conv(x, w, b, op.attr("stride"), 0, op.attr("dilation"), groups)]


def _pool(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    (x,) = operands
    nd, mode = op.attr("nd"), op.attr("mode")
    if op.attr("adaptive") is not None:
        return [op.attr("fn")(x, op.attr("adaptive"))]
    pads = _window_pads(op, ranges, x, nd)
    kernel, stride, dilation = op.attr("kernel"), op.attr("stride"), op.attr("dilation")
    if mode == "max":
        if any(_flat(pads)):
            x = F.pad(x, _flat(pads), value=-math.inf)
        pool = F.max_pool1d if nd == 1 else F.max_pool2d
        return [pool(x, kernel, stride, 0, dilation)]
    if any(_flat(pads)):
        x = F.pad(x, _flat(pads))
    if nd == 1:
        sums = F.avg_pool2d(x.unsqueeze(-2), (1, kernel[0]), (1, stride[0]), 0, divisor_override=1).squeeze(-2)
    else:
        sums = F.avg_pool2d(x, kernel, stride, 0, divisor_override=1)
    if op.attr("divisor_override"):
        return [sums / op.attr("divisor_override")]
    out = op.outputs[0]
    div = None
    for i in range(nd):
        a, b = ranges.get(out.dims[2 + i], (0, out.shape[2 + i]))
        k, s, p, size = kernel[i], stride[i], op.attr("padding")[i], op.attr("in_size")[i]
        starts = torch.arange(a, b) * s - p
        ends = torch.clamp(starts + k, max=size + p)
        if op.attr("count_include_pad"):
            d = ends - starts
        else:
            d = torch.clamp(ends, max=size) - torch.clamp(starts, min=0)
        d = d.to(sums.dtype).to(sums.device)
        shape = [1] * sums.dim()
        shape[2 + i] = -1
        d = d.view(shape)
        div = d if div is None else div * d
    return [sums / div]


# -- batch norm ------------------------------------------------------------------------------------

def batch_norm_partial_stats(op: Op, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-channel (sum, sum of squares, element count) of one task's input shard (differentiable)."""
    dims = [d for d in range(x.dim()) if d != 1]
    return x.sum(dims), (x * x).sum(dims), x.numel() // max(x.shape[1], 1)


def batch_norm_stats(partials: Sequence[tuple[torch.Tensor, torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, biased variance) from the partial statistics of the tasks that share a channel slice."""
    total = sum(p[0] for p in partials)
    squares = sum(p[1] for p in partials)
    count = sum(p[2] for p in partials)
    mean = total / count
    return mean, squares / count - mean * mean


@torch.no_grad()
def batch_norm_update_running(op: Op, module: nn.Module, mean: torch.Tensor, var: torch.Tensor, count: int,
                              channels: tuple[int, int] | None = None) -> None:
    """Update the running statistics of the op's module (its `channels` slice) as train-mode BatchNorm does."""
    m = module.get_submodule(op.attr("module"))
    if not m.track_running_stats or m.running_mean is None:
        return
    lo, hi = channels or (0, m.num_features)
    if lo == 0:     # one call per channel slice and step: the slice holding channel 0 counts the step
        m.num_batches_tracked.add_(1)
    momentum = m.momentum if m.momentum is not None else 1.0 / float(m.num_batches_tracked)
    unbiased = var * count / max(count - 1, 1)
    m.running_mean[lo:hi].mul_(1 - momentum).add_(momentum * mean.detach())
    m.running_var[lo:hi].mul_(1 - momentum).add_(momentum * unbiased.detach())


def _batch_norm(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    x, w, b = operands
    if ctx.bn_stats is not None:
        mean, var = ctx.bn_stats
    elif op.attr("batch_stats"):
        # The task sees the whole batch of its channels: two-pass statistics, as nn.BatchNorm computes them.
        var, mean = torch.var_mean(x, dim=[d for d in range(x.dim()) if d != 1], correction=0)
    else:
        if ctx.module is None:
            raise ValueError(f"{op.describe()} in eval mode needs its running statistics: pass module= or bn_stats=")
        m = ctx.module.get_submodule(op.attr("module"))
        lo, hi = ranges.get(op.outputs[0].dims[1], (0, op.outputs[0].shape[1]))
        mean, var = m.running_mean[lo:hi], m.running_var[lo:hi]
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + op.attr("eps"))
    if w is not None:
        y = y * w.view(shape) + b.view(shape)
    return [y]


# -- recurrent and attention -----------------------------------------------------------------------

def _lstm_cell(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    """Gates for the task's hidden units: W_ih, W_hh viewed (4, h, ·), rows of i, f, g, o for those units."""
    x, h, c, w_ih, w_hh, b_ih, b_hh = operands
    units = w_ih.shape[1]
    gates = F.linear(x, w_ih.reshape(4 * units, -1), None if b_ih is None else b_ih.reshape(-1))
    if h is not None:
        gates = gates + F.linear(h, w_hh.reshape(4 * units, -1))
    if b_hh is not None:
        gates = gates + b_hh.reshape(-1)
    i, f, g, o = gates.view(x.shape[0], 4, units).unbind(1)
    c_new = torch.sigmoid(i) * torch.tanh(g)
    if c is not None:
        c_new = c_new + torch.sigmoid(f) * c
    return [torch.sigmoid(o) * torch.tanh(c_new), c_new]


def _heads(t: torch.Tensor, hd: int) -> torch.Tensor:
    n, length, width = t.shape
    return t.view(n, length, width // hd, hd).transpose(1, 2)


def _mask_into(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return scores.masked_fill(mask, float("-inf"))
    return scores + mask


def _attention(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    """The task's heads of nn.MultiheadAttention before out_proj, for its samples and query rows."""
    q, k, v, kpm, mask, w_in, wq, wk, wv, b_in = operands
    bf, hd, heads = op.attr("batch_first"), op.attr("head_dim"), op.attr("heads")
    if not bf:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if w_in is not None:
        wq, wk, wv = w_in.unbind(0)
    bq, bk, bv = b_in.unbind(0) if b_in is not None else (None, None, None)
    lo, _ = ranges.get(op.outputs[0].dims[2], (0, op.outputs[0].shape[2]))
    h0 = lo // hd
    qh, kh, vh = _heads(F.linear(q, wq, bq), hd), _heads(F.linear(k, wk, bk), hd), _heads(F.linear(v, wv, bv), hd)
    scores = (qh * (1.0 / hd) ** 0.5) @ kh.transpose(-2, -1)
    if mask is not None:
        if mask.dim() == 3:
            mask = mask.view(qh.shape[0], heads, *mask.shape[1:])[:, h0:h0 + qh.shape[1]]
        scores = _mask_into(scores, mask)
    if kpm is not None:
        scores = _mask_into(scores, kpm[:, None, None, :])
    attn = torch.softmax(scores, dim=-1)
    if op.attr("training") and op.attr("dropout") > 0:
        # The whole op's weights are (N, heads, L, S); the task holds its samples, heads and query rows.
        out_spec = op.outputs[0]
        n_ax, l_ax = (0, 1) if bf else (1, 0)
        n_rng = ranges.get(out_spec.dims[n_ax], (0, out_spec.shape[n_ax]))
        l_rng = ranges.get(out_spec.dims[l_ax], (0, out_spec.shape[l_ax]))
        full = (out_spec.shape[n_ax], heads, out_spec.shape[l_ax], kh.shape[2])
        box = (n_rng, (h0, h0 + qh.shape[1]), l_rng, (0, kh.shape[2]))
        attn = dropout(attn, op.attr("dropout"), ctx, full, box)
    out = (attn @ vh).transpose(1, 2).reshape(qh.shape[0], qh.shape[2], -1)
    return [out if bf else out.transpose(0, 1)]


def _sdpa(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    q, k, v, mask = operands
    if op.attr("is_causal"):
        # The causal mask of a block of query rows starts at its global row, not at 0.
        out = op.outputs[0]
        a, _ = ranges.get(out.dims[-2], (0, out.shape[-2]))
        rows = torch.arange(a, a + q.shape[-2], device=q.device)[:, None]
        allowed = torch.arange(k.shape[-2], device=q.device)[None, :] <= rows
        mask = allowed if mask is None else (allowed & mask if mask.dtype == torch.bool
                                             else mask.masked_fill(~allowed, float("-inf")))
    kw = {"enable_gqa": True} if op.attr("enable_gqa") else {}
    p = op.attr("dropout_p") or 0.0
    if p > 0 and ctx.seed is not None:
        return [_sdpa_seeded_dropout(op, ranges, q, k, v, mask, p, ctx)]
    return [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                           is_causal=False, scale=op.attr("scale"), **kw)]


def _sdpa_seeded_dropout(op: Op, ranges, q, k, v, mask, p: float, ctx: Ctx) -> torch.Tensor:
    """Attention written out, its weights dropped with the region of the whole op's seeded mask."""
    if op.attr("enable_gqa") and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    scale = op.attr("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    attn = torch.softmax(scores, dim=-1)
    out = op.outputs[0]
    S = k.shape[-2]
    box = tuple(op.output_box(0, ranges))[:-1] + ((0, S),)
    attn = dropout(attn, p, ctx, tuple(out.shape[:-1]) + (S,), box)
    return attn @ v


def _cross_entropy(op: Op, ranges, operands, ctx: Ctx) -> list[torch.Tensor]:
    logits, target = operands
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
    return [loss / op.attr("count")]


NN_KERNELS = {"conv1d": _conv, "conv2d": _conv, "pool": _pool, "batch_norm": _batch_norm, "lstm_cell": _lstm_cell,
              "attention": _attention, "sdpa": _sdpa, "cross_entropy": _cross_entropy}
