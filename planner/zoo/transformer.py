"""A GPT-2 small style decoder-only transformer (Radford et al. 2019, in the style of nanoGPT).

Not one of the papers' benchmarks; it is here because it is what people train today, and its
attention and MLP blocks are where FlexFlow's parameter-dimension (sec. 4) partitioning pays.

- pre-LayerNorm blocks: ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))``; final ``ln_f``;
- learned positional embedding over a `seq`-long ``positions`` buffer;
- causal self-attention with ``nn.MultiheadAttention(batch_first=True)``, the causal mask passed
  as ``attn_mask`` (a boolean buffer, True = may not attend) and ``need_weights=False``;
- MLP ``Linear(d, 4d)``, GELU (tanh approximation, as GPT-2), ``Linear(4d, d)``;
- no dropout (0 in the defaults of modern pretraining, and it keeps forward deterministic);
- an **untied** LM head: tying would make the embedding and the head one parameter used by two
  ops, which the planner and the sharded runtime would have to keep on one layout; untied is the
  simpler graph (it costs 38.6M more parameters: 163.1M in all at the defaults).

The vocabulary defaults to 50304, GPT-2's 50257 padded up to a multiple of 128 (as nanoGPT does):
the LM head's output features then split into equal parts for every power-of-two degree up to 128,
which both tensor cores and SOAP's equal-size partitions (FlexFlow sec. 4) want.

Inputs: ``tokens`` ``(N, seq)`` int64 — the length must equal the `seq` option, since mask and
positions are sized by it.  Output: logits ``(N, seq, vocab)``; loss
``F.cross_entropy(logits.flatten(0, 1), labels.flatten())`` against ``labels`` ``(N, seq)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import AutoparError
from .spec import ModelSpec, check_sizes, seeded, token_ids


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("positions", torch.arange(seq), persistent=False)
        self.register_buffer("causal_mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)
        # GPT-2's initialization: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("out_proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(self.positions)  # N x L x d
        for block in self.blocks:
            x = block(x, self.causal_mask)
        return self.lm_head(self.ln_f(x))  # N x L x vocab


def transformer(*, batch: int = 64, seq: int = 1024, vocab: int = 50304, d: int = 768, layers: int = 12,
                heads: int = 12, seed: int = 0) -> ModelSpec:
    check_sizes("transformer", batch=batch, seq=seq, vocab=vocab, d=d, layers=layers, heads=heads)
    if d % heads:
        raise AutoparError(f"model 'transformer': d={d} is not divisible by heads={heads}; "
                           f"choose heads dividing d (e.g. heads={next(h for h in range(min(heads, d), 0, -1) if d % h == 0)})")
    return ModelSpec(
        name="transformer",
        module=seeded(seed, lambda: GPT(vocab, seq, d, layers, heads)),
        inputs=(token_ids("tokens", batch, seq),),
        target=token_ids("labels", batch, seq),
        loss="cross_entropy",
        description=f"GPT-2 small style decoder: {layers} layers, d={d}, {heads} heads, seq {seq}, "
                    f"vocab {vocab}, untied LM head",
    )
