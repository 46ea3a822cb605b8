"""In float64, training under any plan equals single-process training within 1e-9: the loss and
every parameter gradient at each of three steps, and the parameters (and batch-norm running
statistics) after three optimizer steps."""

from __future__ import annotations

import functools

import pytest

from ._harness import ADAM, SGD, TOL, distributed, max_diffs

FAMILIES = ("data-parallel", "model-parallel", "attribute", "hybrid", "disjoint", "stacked", "random", "searched")
MODELS = ("cnn", "lstm", "transformer")

# The representative subset CI runs: every model, every family at least once, 2 ranks, one job.
FAST = [("cnn", "data-parallel", SGD), ("cnn", "attribute", SGD), ("cnn", "hybrid", ADAM), ("cnn", "stacked", SGD),
        ("lstm", "model-parallel", SGD), ("lstm", "disjoint", ADAM), ("lstm", "random", SGD),
        ("transformer", "hybrid", SGD), ("transformer", "searched", SGD)]
FULL = [(m, f, opt) for m in MODELS for f in FAMILIES for opt in (SGD, ADAM)]


@functools.cache
def _results(world: int, which: str) -> dict:
    return distributed(world, FAST if which == "fast" else FULL)


def _check(world: int, which: str, model: str, family: str, opt: str) -> None:
    results = _results(world, which)
    if (model, family, opt) not in results:
        pytest.skip(f"no {family} plan available for {model}")
    ref, got = results[(model, family, opt)]
    diffs = max_diffs(ref, got)
    assert all(v <= TOL for v in diffs.values()), f"{model} under {family} ({opt}) on {world} ranks: {diffs}"


@pytest.mark.parametrize("model,family,opt", [(m, f, o.name) for m, f, o in FAST],
                         ids=[f"{m}-{f}-{o.name}" for m, f, o in FAST])
def test_two_ranks_train_like_one_device(model, family, opt):
    _check(2, "fast", model, family, opt)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("model,family,opt", [(m, f, o.name) for m, f, o in FULL],
                         ids=[f"{m}-{f}-{o.name}" for m, f, o in FULL])
def test_every_plan_family_trains_like_one_device(world, model, family, opt):
    _check(world, "full", model, family, opt)
