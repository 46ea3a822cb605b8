"""The model zoo: every model runs, traces with torch.fx, and has the papers' sizes."""

from __future__ import annotations

import functools
import sys
import textwrap
from collections import Counter

import pytest
import torch
import torch.fx

from autopar.planner.errors import AutoparError
from autopar.planner.ir.graph import TensorSpec
from autopar.planner.zoo import ModelSpec, get_model, list_models, load_model, model_options, parse_options

torch.set_num_threads(1)

# Small instances of every model and the logits shape each must return.
TINY = {
    "lenet": (dict(batch=2), (2, 10)),
    "alexnet": (dict(batch=2, image=63, fc=32, classes=7), (2, 7)),
    "vgg16": (dict(batch=2, image=32, fc=32, classes=7), (2, 7)),
    "inception_v3": (dict(batch=2, image=75, classes=7), (2, 7)),
    "resnet101": (dict(batch=2, image=32, width=16, classes=7), (2, 7)),
    "rnntc": (dict(batch=2, steps=3, vocab=50, embed=16, hidden=16, layers=2), (2, 2)),
    "rnnlm": (dict(batch=2, steps=3, vocab=50, embed=12, hidden=16, layers=2), (2, 3, 50)),
    "nmt": (dict(batch=2, src_len=3, tgt_len=4, src_vocab=50, tgt_vocab=60, embed=12, hidden=16, layers=2),
            (2, 4, 60)),
    "transformer": (dict(batch=2, seq=8, vocab=50, d=16, layers=2, heads=2), (2, 8, 50)),
}


@functools.cache
def _tiny(name: str) -> ModelSpec:
    return get_model(name, **TINY[name][0])


def _full(name: str) -> ModelSpec:
    with torch.device("meta"):
        return get_model(name)


def _lstm(inputs: int, hidden: int) -> int:
    return 4 * hidden * (inputs + hidden) + 8 * hidden


def _gpt(vocab: int, seq: int, d: int, layers: int) -> int:
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return vocab * d + seq * d + layers * block + 2 * d + d * vocab


# Published counts (torchvision; Inception-v3 without its 3,326,696-parameter aux head) and,
# for models with no published number, the count from the layer sizes.
FULL_PARAMS = {
    "lenet": 61_706,
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "inception_v3": 27_161_264 - 3_326_696,
    "resnet101": 44_549_160,
    "rnntc": 20000 * 1024 + 4 * _lstm(1024, 1024) + 1024 * 2 + 2,
    "rnnlm": 10000 * 2048 + 2 * _lstm(2048, 2048) + 2048 * 10000 + 10000,
    "nmt": 2 * 32000 * 1024 + 4 * _lstm(1024, 1024) + (2048 * 1024 + 1024) + 1024 * 32000 + 32000,
    "transformer": _gpt(50304, 1024, 768, 12),
}

# The papers' input shapes: batch 64 (256 for AlexNet), 40 unrolled steps for the RNNs.
FULL_INPUTS = {
    "lenet": {"images": (64, 1, 28, 28)},
    "alexnet": {"images": (256, 3, 224, 224)},
    "vgg16": {"images": (64, 3, 224, 224)},
    "inception_v3": {"images": (64, 3, 299, 299)},
    "resnet101": {"images": (64, 3, 224, 224)},
    "rnntc": {"tokens": (64, 40)},
    "rnnlm": {"tokens": (64, 40)},
    "nmt": {"source": (64, 40), "target": (64, 40)},
    "transformer": {"tokens": (64, 1024)},
}


def test_tables_cover_every_zoo_model():
    assert set(TINY) == set(FULL_PARAMS) == set(FULL_INPUTS) == set(list_models())


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_model_returns_logits_of_declared_shape(name):
    spec = _tiny(name)
    spec.module.eval()
    inputs = spec.example_inputs()
    assert [tuple(x.shape) for x in inputs] == [s.shape for _, s in spec.inputs]
    logits = spec.module(*inputs)
    assert tuple(logits.shape) == TINY[name][1]
    target = spec.example_target()
    assert tuple(target.shape) == spec.target[1].shape
    assert torch.isfinite(spec.compute_loss(logits, target))


@pytest.mark.parametrize("name", list(TINY))
def test_symbolic_trace_gives_the_same_output(name):
    spec = _tiny(name)
    spec.module.eval()
    inputs = spec.example_inputs()
    traced = torch.fx.symbolic_trace(spec.module)
    with torch.no_grad():
        torch.testing.assert_close(traced(*inputs), spec.module(*inputs), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(TINY))
def test_every_parameter_receives_a_gradient(name):
    spec = _tiny(name)
    spec.module.train()
    spec.module.zero_grad(set_to_none=True)
    spec.compute_loss(spec.module(*spec.example_inputs()), spec.example_target()).backward()
    missing = [n for n, p in spec.module.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []


@pytest.mark.parametrize("name", list(FULL_PARAMS))
def test_full_size_parameter_count(name):
    assert sum(p.numel() for p in _full(name).module.parameters()) == FULL_PARAMS[name]


@pytest.mark.parametrize("name", list(FULL_INPUTS))
def test_full_size_inputs_and_options_are_the_papers_defaults(name):
    spec = _full(name)
    assert {k: s.shape for k, s in spec.inputs} == FULL_INPUTS[name]
    assert dict(spec.options) == model_options(name)
    for _, s in (*spec.inputs, spec.target):
        assert s.dims[0] == "n"


@pytest.mark.parametrize(
    "name, calls",
    [
        ("rnntc", {"cells.0": 40, "cells.3": 40, "classifier": 1}),
        ("rnnlm", {"cells.0": 40, "cells.1": 40, "decoder": 40}),
        ("nmt", {"encoder.0": 40, "encoder.1": 40, "decoder.0": 40, "decoder.1": 40,
                 "attention.combine": 40, "generator": 40, "src_embedding": 1}),
    ],
)
def test_recurrent_models_unroll_into_one_shared_module_call_per_step(name, calls):
    traced = torch.fx.symbolic_trace(_full(name).module)
    counts = Counter(n.target for n in traced.graph.nodes if n.op == "call_module")
    assert {k: counts[k] for k in calls} == calls


def test_transformer_attention_is_causal():
    spec = _tiny("transformer")
    spec.module.eval()
    (tokens,) = spec.example_inputs()
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 50
    with torch.no_grad():
        a, b = spec.module(tokens), spec.module(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5], b[:, 5])


def test_same_seed_builds_the_same_model_and_keeps_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = get_model("lenet", seed=3).module.state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    b = get_model("lenet", seed=3).module.state_dict()
    c = get_model("lenet", seed=4).module.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["features.0.weight"], c["features.0.weight"])


def test_effective_options_are_recorded():
    spec = get_model("lenet", batch=3, image=32)
    assert dict(spec.options) == {**model_options("lenet"), "batch": 3, "image": 32}
    assert spec.inputs == (("images", TensorSpec((3, 1, 32, 32), ("n", "c", "h", "w"))),)


@pytest.mark.parametrize(
    "name, options, words",
    [
        ("lenet5", {}, ["lenet5", *list_models()]),
        ("lenet", {"hidden": 3}, ["hidden", "batch", "image", "classes"]),
        ("lenet", {"batch": 2.5}, ["batch", "int"]),
        ("lenet", {"batch": 0}, ["batch"]),
        ("lenet", {"image": 11}, ["image=11", "12"]),
        ("alexnet", {"image": 62}, ["image=62", "63"]),
        ("inception_v3", {"image": 74}, ["image=74", "75"]),
        ("vgg16", {"dropout": 1.0}, ["dropout"]),
        ("resnet101", {"blocks": (3, 0)}, ["blocks"]),
        ("transformer", {"d": 10, "heads": 4}, ["d=10", "heads=4"]),
    ],
)
def test_get_model_errors_name_the_problem_and_valid_choices(name, options, words):
    with pytest.raises(AutoparError) as e:
        get_model(name, **options)
    for word in words:
        assert word in str(e.value)


@pytest.mark.parametrize(
    "pairs, expected",
    [
        (["hidden=512", "batch=8"], {"hidden": 512, "batch": 8}),
        (["dropout=0.1", "tied=false", "fast=True"], {"dropout": 0.1, "tied": False, "fast": True}),
        (["blocks=3,4,6,3", "name=big"], {"blocks": (3, 4, 6, 3), "name": "big"}),
        ([" seq = 16 "], {"seq": 16}),
        ([], {}),
    ],
)
def test_parse_options_types_values(pairs, expected):
    assert parse_options(pairs) == expected


@pytest.mark.parametrize("pairs", [["batch"], ["=3"], ["batch=1", "batch=2"]])
def test_parse_options_rejects_malformed_pairs(pairs):
    with pytest.raises(AutoparError):
        parse_options(pairs)


def test_parsed_options_build_a_model():
    spec = get_model("resnet101", **parse_options(["blocks=1,1", "width=4", "batch=1", "image=16"]))
    assert dict(spec.options)["blocks"] == (1, 1)
    assert tuple(spec.module(*spec.example_inputs()).shape) == (1, 1000)


_USER_MODULE = '''
import torch
from torch import nn
from autopar.planner.zoo import ModelSpec, TensorSpec  # the two names a user's factory needs

def mlp(*, batch=4, hidden=8):
    return ModelSpec(
        name="mlp", module=nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 2)),
        inputs=(("x", TensorSpec((batch, 3), ("n", "c"))),),
        target=("labels", TensorSpec((batch,), ("n",), "int64")),
        loss="cross_entropy", description="a user's MLP")

def not_a_spec(**options):
    return nn.Linear(3, 2)

def broken(*, batch=4):
    return ModelSpec(name="broken")       # the other fields forgotten: TypeError

class Models:
    small = staticmethod(lambda: mlp(hidden=2))

NUMBER = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "zoo_user_models.py").write_text(textwrap.dedent(_USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zoo_user_models"
    sys.modules.pop("zoo_user_models", None)


def test_load_model_builds_a_user_factory_with_options(user_module):
    spec = load_model(f"{user_module}:mlp", hidden=5)
    assert spec.name == "mlp"
    assert dict(spec.options) == {"batch": 4, "hidden": 5}
    assert tuple(spec.module(*spec.example_inputs()).shape) == (4, 2)
    assert load_model(f"{user_module}:Models.small").module[0].out_features == 2


def test_load_model_accepts_a_zoo_name():
    assert load_model("lenet", batch=2).inputs[0][1].shape == (2, 1, 28, 28)


@pytest.mark.parametrize(
    "target, options, words",
    [
        ("no_such_pkg_xyz:mlp", {}, ["no_such_pkg_xyz", "PYTHONPATH"]),
        ("{m}:missing", {}, ["missing", "mlp"]),
        ("{m}:NUMBER", {}, ["NUMBER", "not a callable"]),
        ("{m}:not_a_spec", {}, ["Linear", "not a ModelSpec"]),
        ("{m}:broken", {"batch": 2}, ["the factory raised TypeError", "batch=2", "fix the factory"]),
        ("{m}:mlp", {"depth": 3}, ["depth"]),
        ("{m}:", {}, ["package.module:factory"]),
    ],
)
def test_load_model_errors_say_what_is_wrong(user_module, target, options, words):
    with pytest.raises(AutoparError) as e:
        load_model(target.format(m=user_module), **options)
    for word in words:
        assert word in str(e.value)
