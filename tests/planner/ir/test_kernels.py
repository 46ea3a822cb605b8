"""Task kernels: running a graph task by task, under any legal partition, computes the module.

`run_graph` splits every op into the tasks of the given degrees, runs `forward_task` on the shards
the op's axis maps name and stitches the outputs; equality with the eager module (float64, 1e-10)
in values and gradients proves the importer's maps and the kernels faithful.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn as nn
import torch.nn.functional as F

from autopar.planner.ir.fx_import import import_model, import_spec
from autopar.planner.ir.graph import TensorSpec
from autopar.planner.ir.kernels import (KERNEL_KINDS, batch_norm_partial_stats, batch_norm_stats,
                                        batch_norm_update_running, forward_task, run_graph)
from autopar.planner.ir.opkinds import KINDS
from autopar.planner.ir.strategy import degree_choices
from autopar.planner.zoo import get_model, model_options

from ..zoo.test_zoo import TINY
from ._fx_models import MODELS, example, reference_loss

torch.set_num_threads(1)
TOL = 1e-10


def random_degrees(graph, seed: int, limit: int = 8) -> dict[str, tuple[int, ...]]:
    rng = random.Random(seed)
    return {op.name: rng.choice(degree_choices(op, limit)) for op in graph.ops}


def one_dim_degrees(graph, index: int, limit: int = 4) -> dict[str, tuple[int, ...]]:
    """Every op split along its `index`-th parallel dim only, as finely as `limit` allows."""
    out = {}
    for op in graph.ops:
        deg = [1] * len(op.pardims)
        if index < len(op.pardims):
            deg[index] = max(op.pardims[index].allowed_degrees(limit))
        out[op.name] = tuple(deg)
    return out


def _float64_spec(spec):
    inputs = tuple((n, dataclasses.replace(s, dtype="float64") if s.dtype.startswith("float") else s)
                   for n, s in spec.inputs)
    return dataclasses.replace(spec, module=spec.module.double(), inputs=inputs)


# Train-mode batch norm over TINY's 1x1 maps at batch 2 normalizes 2 values per channel: ill-conditioned
# (a 1e-15 change of the input moves ResNet's loss by 1e-8), so no two implementations agree to 1e-10.
# These sizes keep several values per channel.
TRAIN_SIZES = {"resnet101": dict(batch=4, image=32, width=8, blocks=(2, 2, 2, 2), classes=7),
               "inception_v3": dict(batch=4, image=75, classes=7)}


def _zoo_spec(name: str, mode: str = "eval"):
    opts = dict(TRAIN_SIZES.get(name, TINY[name][0]) if mode == "train" else TINY[name][0])
    if "dropout" in model_options(name):
        opts["dropout"] = 0.0              # deterministic in train mode too (p = 0 dropout is elided)
    spec = _float64_spec(get_model(name, **opts))
    getattr(spec.module, mode)()
    return spec


def test_every_kind_has_a_kernel():
    assert set(KINDS) <= set(KERNEL_KINDS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "inception_v3" else n for n in TINY])
@pytest.mark.parametrize("mode", ["eval", "train"])     # batch norm: running statistics / batch statistics
def test_zoo_graph_equals_module_whole_and_under_random_partitions(name, mode):
    spec = _zoo_spec(name, mode)
    graph = import_spec(spec)               # the graph records the mode (batch norm statistics)
    xs = tuple(x.double() if x.is_floating_point() else x for x in spec.example_inputs())
    y = spec.example_target()
    with torch.no_grad():
        ref = spec.compute_loss(spec.module(*xs), y)
        for degrees in (None, random_degrees(graph, 1), random_degrees(graph, 2)):
            got = run_graph(graph, spec.module, xs, y, degrees)["loss"][0]
            assert abs(got - ref).item() < TOL * max(1.0, abs(ref).item()), degrees


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_small_models_equal_module_under_every_single_dim_split_and_random_splits(name, mode):
    module, inputs, target, xs, y = example(name)
    getattr(module, mode)()
    graph = import_model(module, inputs, target, name=name)
    with torch.no_grad():
        ref = reference_loss(module, xs, y)
        splits = [one_dim_degrees(graph, i) for i in range(max(len(op.pardims) for op in graph.ops))]
        for degrees in [None] + splits + [random_degrees(graph, s) for s in range(3)]:
            assert abs(run_graph(graph, module, xs, y, degrees)["loss"][0] - ref).item() < TOL


@pytest.mark.parametrize("name", sorted(MODELS) + ["rnnlm", "transformer", "nmt"])
def test_gradients_through_partitioned_tasks_equal_module_gradients(name):
    if name in MODELS:
        module, inputs, target, xs, y = example(name)
        module.train()
        graph = import_model(module, inputs, target, name=name)
        loss_fn = lambda: reference_loss(module, xs, y)  # noqa: E731
    else:
        spec = _zoo_spec(name, "train")
        module, graph = spec.module, import_spec(spec)
        xs, y = spec.example_inputs(), spec.example_target()
        loss_fn = lambda: spec.compute_loss(module(*xs), y)  # noqa: E731
    params = dict(module.named_parameters())
    want = torch.autograd.grad(loss_fn(), list(params.values()))
    for seed in (5, 6):
        loss = run_graph(graph, module, xs, y, random_degrees(graph, seed))["loss"][0]
        got = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (pname, _), g, w in zip(params.items(), got, want):
            assert g is not None, pname
            assert (g - w).abs().max().item() < TOL, pname


def _ops_of(graph, kind):
    return [op for op in graph.ops if op.kind == kind]


def test_attention_split_by_heads_samples_and_query_rows_equals_module():
    spec = _zoo_spec("transformer")
    graph = import_spec(spec)
    xs, y = spec.example_inputs(), spec.example_target()
    attn = _ops_of(graph, "attention")
    assert attn and all(op.pardims[-1].granule == 8 for op in attn)   # d=16, heads=2
    with torch.no_grad():
        ref = spec.compute_loss(spec.module(*xs), y)
        for degrees in [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2)]:
            got = run_graph(graph, spec.module, xs, y, {op.name: degrees for op in attn})["loss"][0]
            assert abs(got - ref).item() < TOL


def test_lstm_hidden_split_equals_module():
    spec = _zoo_spec("nmt")
    graph = import_spec(spec)
    xs, y = spec.example_inputs(), spec.example_target()
    cells = _ops_of(graph, "lstm_cell")
    with torch.no_grad():
        ref = spec.compute_loss(spec.module(*xs), y)
        for degrees in [(1, 4), (2, 2), (1, 16)]:
            got = run_graph(graph, spec.module, xs, y, {op.name: degrees for op in cells})["loss"][0]
            assert abs(got - ref).item() < TOL


# -- single tasks --------------------------------------------------------------------------------

def _single_op_graph(module, shape, dims=("n", "c", "h", "w")):
    return import_model(module, [("x", TensorSpec(shape, dims, "float64"))], loss=None)


CONVS = [
    nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Conv2d(3, 4, 5, padding=4, dilation=2),
    nn.Conv2d(3, 4, (1, 3), padding=(0, 1)), nn.Conv2d(3, 4, 2, stride=2), nn.Conv2d(4, 4, 3, groups=4, padding=1),
    nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(3, 2, ceil_mode=True), nn.AvgPool2d(3, 2, 1),
    nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), nn.AvgPool2d(2, divisor_override=3),
]


@pytest.mark.parametrize("layer", CONVS, ids=repr)
def test_spatial_tasks_pad_their_clipped_windows_like_the_full_layer(layer):
    layer = layer.double()
    cin = 4 if getattr(layer, "groups", 1) == 4 or isinstance(layer, (nn.MaxPool2d, nn.AvgPool2d)) else 3
    x = torch.randn(2, cin, 12, 12, dtype=torch.float64)
    graph = _single_op_graph(nn.Sequential(layer), tuple(x.shape))
    op = graph.ops[1]
    full = layer(x)
    h, w = op.outputs[0].dims[2:]
    for ranges in ({h: (0, 2), w: (0, 3)}, {h: (2, 4)}, {w: (full.shape[3] - 2, full.shape[3])}, {}):
        box = op.input_box(0, ranges, x.shape)
        params = [dict(layer.named_parameters())[p.name.split(".", 1)[1]].reshape(p.view)[
            tuple(slice(a, b) for a, b in op.param_box(j, ranges))] for j, p in enumerate(op.params)]
        (out,) = forward_task(op, ranges, [x[tuple(slice(a, b) for a, b in box)]], params)
        want = full[tuple(slice(a, b) for a, b in op.output_box(0, ranges))]
        assert out.shape == want.shape and (out - want).abs().max().item() < TOL


def test_loss_partials_over_samples_add_up_to_the_mean():
    logits, labels = torch.randn(8, 5, 7, dtype=torch.float64), torch.randint(0, 7, (8, 5))
    graph = import_model(nn.Identity(), [("x", TensorSpec((8, 5, 7), ("n", "l", "c"), "float64"))],
                         ("y", TensorSpec((8, 5), ("n", "l"), "int64")))
    loss = graph["loss"]
    assert loss.reduction_dims == ("n", "l")
    parts = [forward_task(loss, {"n": (a, a + 2), "l": (b, b + 1)}, [logits[a:a + 2, b:b + 1], labels[a:a + 2, b:b + 1]],
                          [])[0] for a in range(0, 8, 2) for b in range(5)]
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert abs(sum(parts) - want).item() < TOL


def test_batch_norm_with_global_statistics_from_partials_equals_train_mode_module():
    bn = nn.BatchNorm2d(4).double().train()
    x = torch.randn(4, 4, 6, 6, dtype=torch.float64)
    op = _single_op_graph(nn.Sequential(bn), (4, 4, 6, 6)).ops[1]
    assert op.attr("cross_partition_stats") is True
    shards = [{"n": (a, a + 2), "h": (b, b + 3), "c": (1, 3)} for a in (0, 2) for b in (0, 3)]
    parts = [batch_norm_partial_stats(op, x[r["n"][0]:r["n"][1], 1:3, r["h"][0]:r["h"][1]]) for r in shards]
    stats = batch_norm_stats(parts)
    full = bn(x)
    for r in shards:
        (a0, a1), (b0, b1) = r["n"], r["h"]
        xs = x[a0:a1, 1:3, b0:b1]
        (out,) = forward_task(op, r, [xs], [bn.weight[1:3], bn.bias[1:3]], bn_stats=stats)
        assert (out - full[a0:a1, 1:3, b0:b1]).abs().max().item() < TOL
    # a single partition needs no statistics: it is the module in train mode
    (whole,) = forward_task(op, {}, [x], [bn.weight, bn.bias])
    assert (whole - full).abs().max().item() < TOL


def test_batch_norm_running_update_matches_the_module():
    ref = nn.BatchNorm2d(3, momentum=0.3).double().train()
    mine = nn.BatchNorm2d(3, momentum=0.3).double().train()
    x = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    op = _single_op_graph(nn.Sequential(ref), (5, 3, 4, 4)).ops[1]
    ref(x)
    mean, var = batch_norm_stats([batch_norm_partial_stats(op, x)])
    batch_norm_update_running(op, nn.Sequential(mine), mean, var, count=5 * 16)
    assert torch.allclose(mine.running_mean, ref.running_mean, atol=TOL)
    assert torch.allclose(mine.running_var, ref.running_var, atol=TOL)
    assert int(mine.num_batches_tracked) == int(ref.num_batches_tracked)


def test_buffer_sources_and_opaque_modules_ask_for_the_module():
    spec = get_model("transformer", **TINY["transformer"][0])
    graph = import_spec(spec)
    src = next(op for op in graph.ops if op.kind == "source" and op.attr("buffer"))
    with pytest.raises(ValueError, match="pass module="):
        forward_task(src, {}, [], [])
    (mask,) = forward_task(src, {}, [], [], module=spec.module)
    assert torch.equal(mask, spec.module.get_buffer(src.attr("buffer")))


def test_input_task_without_data_is_a_zero_standin_of_its_shard():
    graph = _single_op_graph(nn.Sequential(nn.ReLU()), (4, 3, 2, 2))
    (x,) = forward_task(graph.ops[0], {"n": (0, 2)}, [], [])
    assert x.shape == (2, 3, 2, 2) and x.dtype == torch.float64 and not x.any()


@settings(max_examples=60, deadline=None)
@given(size=st.integers(4, 16), kernel=st.integers(1, 4), stride=st.integers(1, 3), pad=st.integers(0, 2),
       dilation=st.integers(1, 2), kind=st.sampled_from(["conv", "max", "avg", "avg_exclusive"]), data=st.data())
def test_any_window_of_a_1d_layer_equals_the_full_layer(size, kernel, stride, pad, dilation, kind, data):
    if kind != "max":
        dilation = 1                       # average pools have no dilation
    pad = min(pad, kernel // 2)            # PyTorch pools allow padding up to half the kernel
    if (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1 < 1:
        return
    layer = {"conv": lambda: nn.Conv1d(2, 3, kernel, stride, pad, dilation),
             "max": lambda: nn.MaxPool1d(kernel, stride, pad, dilation),
             "avg": lambda: nn.AvgPool1d(kernel, stride, pad),
             "avg_exclusive": lambda: nn.AvgPool1d(kernel, stride, pad, count_include_pad=False)}[kind]().double()
    x = torch.randn(2, 2, size, dtype=torch.float64)
    op = _single_op_graph(nn.Sequential(layer), tuple(x.shape), ("n", "c", "l")).ops[1]
    full = layer(x)
    a = data.draw(st.integers(0, full.shape[2] - 1))
    b = data.draw(st.integers(a + 1, full.shape[2]))
    ranges = {"l": (a, b)}
    (lo, hi) = op.input_box(0, ranges, x.shape)[2]
    params = [p.reshape(ps.view) for p, ps in zip(layer.parameters(), op.params)]
    (out,) = forward_task(op, ranges, [x[:, :, lo:hi]], params)
    assert (out - full[:, :, a:b]).abs().max().item() < TOL
