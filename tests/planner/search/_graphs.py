"""Tiny models for search tests, imported through the same torch.fx path as the zoo."""

from __future__ import annotations

import functools

import torch
from torch import nn

from autopar.planner.ir.fx_import import import_model
from autopar.planner.ir.graph import OperatorGraph, TensorSpec


class _MLP(nn.Module):
    def __init__(self, width: int = 8, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _Diamond(nn.Module):
    """Two branches that join: not a chain, so OptCNN needs node and edge eliminations."""

    def __init__(self, width: int = 8, classes: int = 4):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        return self.out(torch.relu(self.a(x)) + self.b(x))


class _RNN(nn.Module):
    """One LSTM layer unrolled `steps` times: its steps share parameters."""

    def __init__(self, width: int = 4, steps: int = 2, classes: int = 2):
        super().__init__()
        self.cell = nn.LSTMCell(width, width)
        self.out = nn.Linear(width, classes)
        self.steps = steps

    def forward(self, x):
        h = x.new_zeros(x.size(0), self.cell.hidden_size)
        c = x.new_zeros(x.size(0), self.cell.hidden_size)
        for t in range(self.steps):
            h, c = self.cell(x[:, t], (h, c))
        return self.out(h)


def _features(batch: int, width: int) -> list:
    return [("x", TensorSpec((batch, width), ("n", "f")))]


@functools.lru_cache(maxsize=None)
def mlp(batch: int = 4, width: int = 8) -> OperatorGraph:
    return import_model(_MLP(width), _features(batch, width), ("labels", TensorSpec((batch,), ("n",), "int64")),
                        name="mlp")


@functools.lru_cache(maxsize=None)
def diamond(batch: int = 4, width: int = 8) -> OperatorGraph:
    return import_model(_Diamond(width), _features(batch, width), ("labels", TensorSpec((batch,), ("n",), "int64")),
                        name="diamond")


@functools.lru_cache(maxsize=None)
def rnn(batch: int = 4, width: int = 4, steps: int = 2) -> OperatorGraph:
    return import_model(_RNN(width, steps), [("x", TensorSpec((batch, steps, width), ("n", "l", "f")))],
                        ("labels", TensorSpec((batch,), ("n",), "int64")), name="rnn")


@functools.lru_cache(maxsize=None)
def zoo(name: str, **options) -> OperatorGraph:
    from autopar.planner.ir.fx_import import import_spec
    from autopar.planner.zoo import get_model
    with torch.device("meta"):
        return import_spec(get_model(name, **options))
