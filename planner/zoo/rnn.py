"""Recurrent models of FlexFlow sec. 8.1: RNNTC (text classification) and RNNLM (language model).

Every LSTM layer is one ``nn.LSTMCell`` called once per time step in a Python loop whose length
is a constructor argument, so ``torch.fx.symbolic_trace`` unrolls it: the operator graph has one
op per layer per step (FlexFlow unrolls 40 steps), and the ops of a layer call the same module,
so they share its parameters — the "grey boxes" of FlexFlow's Figure 14.  Initial states are
zeros made in ``forward`` from the batch size of the input (``new_zeros``), which traces.

Loss convention.  RNNTC classifies from the last step's hidden state of the top layer and returns
``(N, classes)``.  RNNLM predicts the next token at every step with one shared output Linear called
per step (one softmax op per step, as in the paper) and returns the steps stacked,
``torch.stack(per_step_logits, dim=1)`` of shape ``(N, L, vocab)``; its loss is
``F.cross_entropy(logits.flatten(0, 1), labels.flatten())`` against labels ``(N, L)``.

Inputs: ``tokens`` ``(N, L)`` int64 token ids, L = `steps`.
"""

from __future__ import annotations

import torch
from torch import nn

from .spec import ModelSpec, check_sizes, class_labels, seeded, token_ids


def unroll(cell: nn.LSTMCell, xs: list[torch.Tensor],
           state: tuple[torch.Tensor, torch.Tensor]) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Run one LSTM layer over the steps `xs`; returns every step's hidden state and the final state."""
    h, c = state
    outs = []
    for x in xs:
        h, c = cell(x, (h, c))
        outs.append(h)
    return outs, (h, c)


def zero_state(like: torch.Tensor, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero (h, c) for the batch of `like` (N, ...), with its dtype and device."""
    n = like.size(0)
    return like.new_zeros(n, hidden), like.new_zeros(n, hidden)


def lstm_stack(embed: int, hidden: int, layers: int) -> nn.ModuleList:
    return nn.ModuleList(nn.LSTMCell(embed if i == 0 else hidden, hidden) for i in range(layers))


class RNNTC(nn.Module):
    """Embedding, `layers` LSTM layers unrolled `steps` times, Linear classifier on the last hidden state."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, steps: int, classes: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.steps = steps
        self.embedding = nn.Embedding(vocab, embed)
        self.cells = lstm_stack(embed, hidden, layers)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.embedding(tokens)  # N x L x E
        xs = [emb[:, t] for t in range(self.steps)]
        for cell in self.cells:
            xs, _ = unroll(cell, xs, zero_state(emb, self.hidden))
        return self.classifier(xs[-1])


class RNNLM(nn.Module):
    """Embedding, `layers` LSTM layers unrolled `steps` times, a shared per-step Linear to the vocabulary."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, steps: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.steps = steps
        self.embedding = nn.Embedding(vocab, embed)
        self.cells = lstm_stack(embed, hidden, layers)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.embedding(tokens)  # N x L x E
        xs = [emb[:, t] for t in range(self.steps)]
        for cell in self.cells:
            xs, _ = unroll(cell, xs, zero_state(emb, self.hidden))
        return torch.stack([self.decoder(h) for h in xs], dim=1)  # N x L x vocab


def rnntc(*, batch: int = 64, steps: int = 40, vocab: int = 20000, embed: int = 1024, hidden: int = 1024,
          layers: int = 4, classes: int = 2, seed: int = 0) -> ModelSpec:
    check_sizes("rnntc", batch=batch, steps=steps, vocab=vocab, embed=embed, hidden=hidden,
                layers=layers, classes=classes)
    return ModelSpec(
        name="rnntc",
        module=seeded(seed, lambda: RNNTC(vocab, embed, hidden, layers, steps, classes)),
        inputs=(token_ids("tokens", batch, steps),),
        target=class_labels(batch),
        loss="cross_entropy",
        description=f"RNNTC (FlexFlow sec. 8.1): {layers} LSTM layers of {hidden} unrolled {steps} steps, "
                    f"classifier over {classes} classes",
    )


def rnnlm(*, batch: int = 64, steps: int = 40, vocab: int = 10000, embed: int = 2048, hidden: int = 2048,
          layers: int = 2, seed: int = 0) -> ModelSpec:
    check_sizes("rnnlm", batch=batch, steps=steps, vocab=vocab, embed=embed, hidden=hidden, layers=layers)
    return ModelSpec(
        name="rnnlm",
        module=seeded(seed, lambda: RNNLM(vocab, embed, hidden, layers, steps)),
        inputs=(token_ids("tokens", batch, steps),),
        target=token_ids("labels", batch, steps),
        loss="cross_entropy",
        description=f"RNNLM (FlexFlow sec. 8.1): {layers} LSTM layers of {hidden} unrolled {steps} steps, "
                    f"per-step softmax over {vocab} words",
    )

