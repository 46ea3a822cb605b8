"""NMT: the attentional LSTM encoder-decoder of FlexFlow sec. 8.1 (Figure 14, after Wu et al. 2016).

An encoder of `layers` LSTM layers reads the source sentence; a decoder of `layers` LSTM layers,
started from the encoder's final states, reads the (teacher-forced) target sentence; on top of the
last decoder layer, every step attends over the stacked encoder outputs with Luong et al.'s
*dot* attention — ``bmm`` scores, ``softmax``, ``bmm`` context, ``concat`` with the decoder state,
``Linear + tanh`` — and a shared Linear projects to the target vocabulary (the per-step softmax of
the paper).  No input feeding: the paper's graph (Figure 14) has none, and without it the decoder
layers do not wait on the attention of the previous step.

As in `rnn.py`, every layer is one ``nn.LSTMCell`` called once per step in a loop of constructor
length, so tracing unrolls it into one op per step and the steps of a layer share parameters.

Inputs: ``source`` ``(N, Ls)`` and ``target`` ``(N, Lt)`` int64 token ids.  Output: per-step
logits stacked, ``(N, Lt, tgt_vocab)``; the loss is ``F.cross_entropy(logits.flatten(0, 1),
labels.flatten())`` against ``labels`` ``(N, Lt)`` (the target shifted by one, prepared by the
data pipeline).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .rnn import lstm_stack, unroll, zero_state
from .spec import ModelSpec, check_sizes, seeded, token_ids


class LuongAttention(nn.Module):
    """Dot-product attention of one decoder state over all encoder outputs (Luong et al. 2015)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.combine = nn.Linear(2 * hidden, hidden)

    def forward(self, h: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        # h: N x H (decoder state), memory: N x Ls x H (encoder outputs)
        scores = torch.bmm(memory, h.unsqueeze(2))  # N x Ls x 1
        weights = F.softmax(scores, dim=1)
        context = torch.bmm(weights.transpose(1, 2), memory).squeeze(1)  # N x H
        return torch.tanh(self.combine(torch.cat([context, h], dim=1)))


class NMT(nn.Module):
    def __init__(self, src_vocab: int, tgt_vocab: int, embed: int, hidden: int, layers: int,
                 src_len: int, tgt_len: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.src_len = src_len
        self.tgt_len = tgt_len
        self.src_embedding = nn.Embedding(src_vocab, embed)
        self.tgt_embedding = nn.Embedding(tgt_vocab, embed)
        self.encoder = lstm_stack(embed, hidden, layers)
        self.decoder = lstm_stack(embed, hidden, layers)
        self.attention = LuongAttention(hidden)
        self.generator = nn.Linear(hidden, tgt_vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        src = self.src_embedding(source)  # N x Ls x E
        xs = [src[:, t] for t in range(self.src_len)]
        final_states = []
        for cell in self.encoder:
            xs, state = unroll(cell, xs, zero_state(src, self.hidden))
            final_states.append(state)
        memory = torch.stack(xs, dim=1)  # N x Ls x H

        tgt = self.tgt_embedding(target)  # N x Lt x E
        ys = [tgt[:, t] for t in range(self.tgt_len)]
        for cell, state in zip(self.decoder, final_states):
            ys, _ = unroll(cell, ys, state)
        return torch.stack([self.generator(self.attention(h, memory)) for h in ys], dim=1)  # N x Lt x V


def nmt(*, batch: int = 64, src_len: int = 40, tgt_len: int = 40, src_vocab: int = 32000,
        tgt_vocab: int = 32000, embed: int = 1024, hidden: int = 1024, layers: int = 2, seed: int = 0) -> ModelSpec:
    check_sizes("nmt", batch=batch, src_len=src_len, tgt_len=tgt_len, src_vocab=src_vocab,
                tgt_vocab=tgt_vocab, embed=embed, hidden=hidden, layers=layers)
    return ModelSpec(
        name="nmt",
        module=seeded(seed, lambda: NMT(src_vocab, tgt_vocab, embed, hidden, layers, src_len, tgt_len)),
        inputs=(token_ids("source", batch, src_len), token_ids("target", batch, tgt_len)),
        target=token_ids("labels", batch, tgt_len),
        loss="cross_entropy",
        description=f"NMT (FlexFlow sec. 8.1): {layers}+{layers} LSTM layers of {hidden}, "
                    f"{src_len}/{tgt_len} steps, dot attention, per-step softmax over {tgt_vocab} words",
    )
