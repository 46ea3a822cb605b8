"""Dropout and attention dropout with a seed draw the whole op's mask and take the task's region:
any partition of the model computes what one device computes, and a (seed, step) repeats."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.planner.ir import import_spec
from autopar.planner.ir.kernels import is_random, run_graph
from autopar.planner.zoo import ModelSpec, TensorSpec


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)
        self.att = nn.MultiheadAttention(16, 4, dropout=0.3, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = self.drop(torch.relu(self.fc(x)))
        y = F.dropout(y, 0.3, training=self.training)
        z = y.view(6, 1, 16).expand(6, 3, 16).contiguous()
        a, _ = self.att(z, z, z, need_weights=False)
        q = a.view(6, 3, 4, 4).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q, dropout_p=0.2)
        return self.head(o.transpose(1, 2).reshape(6, 3, 16).mean(1))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    spec = ModelSpec("dropping", Dropping(), (("x", TensorSpec((6, 8), ("n", "c"))),),
                     ("labels", TensorSpec((6,), ("n",), "int64")), "cross_entropy", "dropout everywhere")
    return spec, import_spec(spec)


def _degrees(graph, k: int, sample: bool):
    out = {}
    for op in graph.ops:
        d = [1] * len(op.pardims)
        for i, p in enumerate(op.pardims):
            if (p.kind.value == "sample") == sample and (p.size // p.granule) % k == 0:
                d[i] = k
                break
        out[op.name] = tuple(d)
    return out


def test_the_random_ops_are_known(model):
    _, graph = model
    assert {op.name for op in graph.ops if is_random(op)} == {"drop", "dropout", "att",
                                                               "scaled_dot_product_attention"}


@pytest.mark.parametrize("k, sample", [(2, True), (3, True), (6, True), (2, False)])
def test_split_ops_drop_what_one_device_drops(model, k, sample):
    spec, graph = model
    x, y = spec.example_inputs()[0], spec.example_target()
    whole = run_graph(graph, spec.module, [x], y, rng=(3, 7))
    split = run_graph(graph, spec.module, [x], y, degrees=_degrees(graph, k, sample), rng=(3, 7))
    for name, outs in whole.items():
        torch.testing.assert_close(split[name][0], outs[0], rtol=1e-5, atol=1e-6, msg=name)


def test_the_same_seed_and_step_repeat_and_another_step_differs(model):
    spec, graph = model
    x, y = spec.example_inputs()[0], spec.example_target()
    a = run_graph(graph, spec.module, [x], y, rng=(3, 7))["drop"][0]
    b = run_graph(graph, spec.module, [x], y, rng=(3, 7))["drop"][0]
    c = run_graph(graph, spec.module, [x], y, rng=(3, 8))["drop"][0]
    d = run_graph(graph, spec.module, [x], y, rng=(4, 7))["drop"][0]
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)
    kept = (a != 0).float().mean()
    assert 0.2 < kept < 0.8


def test_eval_mode_dropout_is_not_random():
    m = Dropping().eval()
    spec = ModelSpec("dropping", m, (("x", TensorSpec((6, 8), ("n", "c"))),),
                     ("labels", TensorSpec((6,), ("n",), "int64")), "cross_entropy", "eval")
    assert not any(is_random(op) for op in import_spec(spec).ops if op.kind != "sdpa")


def test_large_masks_drawn_in_blocks_still_match_across_partitions(model, monkeypatch):
    import autopar.planner.ir._kernels_nn as nn_kernels
    monkeypatch.setattr(nn_kernels, "_DRAW_BLOCK", 8)   # every mask here is drawn per leading index
    spec, graph = model
    x, y = spec.example_inputs()[0], spec.example_target()
    whole = run_graph(graph, spec.module, [x], y, rng=(3, 7))
    for k, sample in ((2, True), (3, True), (2, False)):
        split = run_graph(graph, spec.module, [x], y, degrees=_degrees(graph, k, sample), rng=(3, 7))
        for name, outs in whole.items():
            torch.testing.assert_close(split[name][0], outs[0], rtol=1e-5, atol=1e-6, msg=name)
