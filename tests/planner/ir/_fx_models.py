"""Small models that between them use every op kind the importer knows, for the importer and kernel tests.

Each entry of `MODELS` builds ``(module, inputs, target)`` in float64; sizes are chosen with many
divisors so random partitions (including spatial halos and head splits) are plentiful.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.planner.ir.graph import TensorSpec


class ConvNet2d(nn.Module):
    """Strided, dilated, depthwise, grouped and reflect-padded convolutions; every kind of 2-D pool."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.gc = nn.Conv2d(8, 8, 3, padding="same", groups=2)
        self.rc = nn.Conv2d(8, 6, 3, padding=1, padding_mode="reflect")
        self.mp = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.ap = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.ad = nn.AdaptiveAvgPool2d((3, 3))         # exact: a 2x2 window
        self.ad2 = nn.AdaptiveAvgPool2d(4)             # not exact: spatial axes whole
        self.fc = nn.Linear(6 * 3 * 3 + 6 + 6 * 16, 10)

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))                 # 12x12
        y = self.c2(y) + self.dw(y)
        y = torch.tanh(self.gc(y))
        y = self.rc(y)
        y = self.ap(self.mp(y))                         # 6x6
        z = F.avg_pool2d(y, 2, divisor_override=3)      # 3x3
        g = y.mean((2, 3))
        w = self.ad2(y)
        y = self.ad(y) + z
        return self.fc(torch.cat([torch.flatten(y, 1), g, w.flatten(1)], dim=1))


class ConvNet1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 5, padding=2)
        self.bn = nn.BatchNorm1d(6)
        self.mp = nn.MaxPool1d(2)
        self.c2 = nn.Conv1d(6, 6, 3, stride=2, padding=1, groups=6)
        self.ap = nn.AvgPool1d(3, stride=1, padding=1)
        self.gap = nn.AdaptiveAvgPool1d(1)
        self.gn = nn.GroupNorm(2, 6)                     # no builder: opaque with parameters
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        y = self.mp(F.gelu(self.bn(self.c1(x))))        # 12
        y = self.ap(self.c2(y))                         # 6
        y = self.gn(y)
        return self.fc(self.gap(y).squeeze(-1))


class Recurrent(nn.Module):
    """Embedding, LSTM cells (one started without state), chunk/unbind/stack, a GRU cell (opaque)."""

    def __init__(self, vocab: int = 20, hidden: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 2 * hidden)
        self.cell = nn.LSTMCell(hidden, hidden)
        self.gru = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, hidden))

    def forward(self, tokens):
        e = self.emb(tokens)                             # N x L x 2H
        a, b = e.chunk(2, dim=-1)
        x0, x1, x2, x3 = (a * b.sigmoid()).unbind(1)
        h, c = self.cell(x0)
        outs = [h]
        for x in (x1, x2, x3):
            h, c = self.cell(x, (h, c))
            outs.append(h)
        g = self.gru(outs[-1], torch.zeros(tokens.size(0), h.shape[1], dtype=h.dtype))
        y = torch.stack(outs, dim=1) * self.scale + g.unsqueeze(1)
        y = F.layer_norm(y, (y.shape[-1],))
        return F.log_softmax(self.out(y), dim=-1)


class Attentions(nn.Module):
    """nn.MultiheadAttention (sequence-first with padding and 3-D masks; separate k/v widths) and a
    hand-written causal attention with F.scaled_dot_product_attention, plus views and reductions."""

    def __init__(self, d: int = 8, heads: int = 2, seq: int = 6, vocab: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, 2 * seq, d) * 0.1)
        self.mha = nn.MultiheadAttention(d, heads)
        self.cross = nn.MultiheadAttention(d, heads, kdim=4, vdim=6, batch_first=True)
        self.mem_k = nn.Linear(d, 4)
        self.mem_v = nn.Linear(d, 6)
        self.c_attn = nn.Linear(d, 3 * d)
        self.ln = nn.LayerNorm(d)
        self.w = nn.Parameter(torch.randn(d, vocab) * 0.3)
        i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
        hs = torch.arange(4 * heads)[:, None, None]
        self.register_buffer("mask3", (i + j + hs) % 3 == 0)   # True = may not attend; never a whole row

    def forward(self, tokens, pad):
        n, length = tokens.shape
        x = self.emb(tokens) + self.pos[:, :length]
        s = x.transpose(0, 1)                            # L x N x d
        y, _ = self.mha(s, s, s, key_padding_mask=pad, attn_mask=self.mask3)
        x = x + y.permute(1, 0, 2).contiguous()
        z = self.cross(x, self.mem_k(x), self.mem_v(x), need_weights=False)[0]
        q, k, v = self.c_attn(self.ln(x + z)).split(x.shape[-1], dim=2)
        q = q.view(n, length, self.heads, -1).transpose(1, 2)
        k = k.view(n, length, self.heads, -1).transpose(1, 2)
        v = v.reshape(n, length, self.heads, -1).permute(0, 2, 1, 3)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(n, length, -1)
        o = o[:, :, None, :].expand(n, length, 2, o.shape[-1]).sum(2, keepdim=False) * 0.5
        logits = o @ self.w
        return torch.where(logits > 0, logits, 0.5 * logits) - logits.amax(-1, keepdim=True).detach() * 0


class Scores(nn.Module):
    """Manual attention scores with matmul, masked_fill, softmax along dim 1, slicing and narrow."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        att = q @ k.transpose(-2, -1) / math.sqrt(x.size(-1))
        causal = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = att @ x
        y = y + torch.cumsum(y, dim=1) * 0.1              # no builder: opaque, batch-first
        first = y[:, ::2]                                   # strided slice
        second = y.narrow(1, 1, y.shape[1] // 2)
        head = y[..., 0:2].select(1, 0)
        r = (first + second).relu_() * 2.0                 # in place, result used
        r += 1.0
        return self.out(r) + head.sum(-1)[:, None, None]


class Misc(nn.Module):
    """Tied weights, a learned token concatenated in front, views of parameters, pieces of a chunk,
    binary max, F.pad (opaque), grouped-query attention, RMSNorm, a 'same' Conv1d, a full reduction."""

    def __init__(self, vocab: int = 12, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.w = nn.Parameter(torch.randn(d, d) * 0.3)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.rms = nn.RMSNorm(d)
        self.conv = nn.Conv1d(d, d, 3, padding="same")

    def forward(self, tokens):
        x = self.emb(tokens)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1)
        x = x @ self.w.t() + x.mT.transpose(1, 2)
        rest = x.chunk(3, dim=-1)[1:]
        y = torch.cat([torch.max(x.chunk(3, dim=-1)[0], rest[0]), rest[1]], -1)
        y = F.pad(y, (0, 8 - y.shape[-1]))
        q = y.view(y.size(0), y.size(1), 4, 2).transpose(1, 2)
        kv = q[:, :2]
        o = F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True).transpose(1, 2).reshape(y.shape)
        o = self.rms(o + y)
        o = self.conv(o.transpose(1, 2)).transpose(1, 2)
        return self.head(o[:, 1:]) + o.max() * 0


MODELS = {
    "convnet2d": lambda: (ConvNet2d(), [("images", TensorSpec((4, 3, 24, 24), ("n", "c", "h", "w"), "float64"))],
                          ("labels", TensorSpec((4,), ("n",), "int64"))),
    "convnet1d": lambda: (ConvNet1d(), [("signal", TensorSpec((4, 4, 24), ("n", "c", "l"), "float64"))],
                          ("labels", TensorSpec((4,), ("n",), "int64"))),
    "recurrent": lambda: (Recurrent(), [("tokens", TensorSpec((4, 4), ("n", "l"), "int64"))],
                          ("labels", TensorSpec((4, 4), ("n", "l"), "int64"))),
    "attentions": lambda: (Attentions(), [("tokens", TensorSpec((4, 6), ("n", "l"), "int64")),
                                          ("pad", TensorSpec((4, 6), ("n", "s"), "bool"))],
                           ("labels", TensorSpec((4, 6), ("n", "l"), "int64"))),
    "scores": lambda: (Scores(), [("x", TensorSpec((4, 8, 6), ("n", "l", "c"), "float64"))],
                       ("labels", TensorSpec((4, 4), ("n", "l"), "int64"))),
    "misc": lambda: (Misc(), [("tokens", TensorSpec((4, 6), ("n", "l"), "int64"))],
                     ("labels", TensorSpec((4, 6), ("n", "l"), "int64"))),
}


def example(name: str, seed: int = 0):
    """(module in float64, input specs, target spec, input tensors, target tensor)."""
    torch.manual_seed(seed)
    module, inputs, target = MODELS[name]()
    module = module.double()
    gen = torch.Generator().manual_seed(seed)
    xs = []
    for _, s in inputs:
        if s.dtype == "float64":
            xs.append(torch.randn(s.shape, generator=gen, dtype=torch.float64))
        elif s.dtype == "bool":
            t = torch.zeros(s.shape, dtype=torch.bool)
            t[:, -1] = True                               # pad the last key of every sample
            xs.append(t)
        else:
            xs.append(torch.randint(0, 12, s.shape, generator=gen))
    classes = {"convnet2d": 10, "convnet1d": 5, "recurrent": 20, "attentions": 12, "scores": 3, "misc": 12}[name]
    y = torch.randint(0, classes, target[1].shape, generator=gen)
    return module, inputs, target, xs, y


def reference_loss(module: nn.Module, xs, y) -> torch.Tensor:
    logits = module(*xs)
    return F.cross_entropy(logits.flatten(0, -2), y.flatten())
