"""A model written the way a user writes their own: a plain `nn.Module` and a factory that returns
a `ModelSpec` (its inputs, labels and loss), outside autopar's zoo.

    autopar simulate --model tagger:tagger --topology local:2          # with examples/models on PYTHONPATH
    autopar plan --model tagger:tagger -o batch=32 --topology local:2 --budget 20 --out plan.yaml

A token tagger: embeddings, a convolution over the sequence, a residual MLP block with layer norm,
and a per-token classifier.  Nothing in it knows about parallelism; autopar traces it with
torch.fx and decides how to split each op.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.planner.zoo import ModelSpec, TensorSpec


class Tagger(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, kernel_size=3, padding=1)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)                                   # N x L x dim
        x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)     # mix neighbouring tokens
        x = x + self.mlp(self.norm(x))
        return self.head(x)                                      # N x L x classes


def tagger(*, batch: int = 32, length: int = 64, vocab: int = 8192, dim: int = 128, hidden: int = 512,
           classes: int = 32, seed: int = 0) -> ModelSpec:
    """The model with its inputs: token ids (N, L) and one label per token (N, L)."""
    torch.manual_seed(seed)
    return ModelSpec(
        name="tagger",
        module=Tagger(vocab, dim, hidden, classes),
        inputs=(("tokens", TensorSpec((batch, length), ("n", "l"), "int64")),),
        target=("labels", TensorSpec((batch, length), ("n", "l"), "int64")),
        loss="cross_entropy",
        description=f"token tagger: embedding {vocab}x{dim}, conv1d, MLP {dim}-{hidden}-{dim}, {classes} classes",
        options=(("batch", batch), ("length", length), ("vocab", vocab), ("dim", dim), ("hidden", hidden),
                 ("classes", classes), ("seed", seed)),
    )
