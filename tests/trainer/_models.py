"""Small float64 models for the trainer's equivalence tests (built from a seed, like the zoo's).

`small_cnn` has every layer kind the issue names for a CNN — convolutions (with padding, so
attribute partitions need halos), batch norm with batch statistics, a max and an average pool and
a dense head; the LSTM language model and the transformer are the zoo's, scaled down.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from autopar.planner.zoo.registry import get_model
from autopar.planner.zoo.spec import ModelSpec, class_labels, images, seeded
from autopar.trainer.train import with_dtype


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 6) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool2 = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool2(torch.relu(self.bn2(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


def small_cnn(*, batch: int = 4, classes: int = 6, seed: int = 0) -> ModelSpec:
    return ModelSpec(name="small_cnn", module=seeded(seed, lambda: SmallCNN(classes)), inputs=images(batch, 3, 8),
                     target=class_labels(batch), loss="cross_entropy",
                     description="conv-bn-relu-maxpool, conv-bn-relu-avgpool, linear", options=(("classes", classes),))


def tiny_rnnlm() -> ModelSpec:
    return get_model("rnnlm", batch=4, steps=3, vocab=12, embed=4, hidden=4, layers=2)


def tiny_transformer() -> ModelSpec:
    return get_model("transformer", batch=2, seq=4, vocab=16, d=8, layers=1, heads=2)


BUILDERS = {"cnn": small_cnn, "lstm": tiny_rnnlm, "transformer": tiny_transformer}


def build(name: str) -> ModelSpec:
    """A fresh float64 instance of test model `name`."""
    return with_dtype(BUILDERS[name](), "float64")


def fresh(spec: ModelSpec) -> ModelSpec:
    """The same spec with an independent copy of its module (runs must not share state)."""
    import copy
    return dataclasses.replace(spec, module=copy.deepcopy(spec.module))
