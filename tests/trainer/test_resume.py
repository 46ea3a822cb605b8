"""Checkpoints are strategy-independent: 4 steps under plan A (checkpoint at step 2), resumed at
step 2 under plan B, end with the parameters and optimizer state of 4 uninterrupted steps."""

from __future__ import annotations

import shutil

import pytest
import torch

from autopar.planner.ir.fx_import import import_spec
from autopar.trainer import checkpoint as ckpt
from autopar.trainer.optim import OptimizerConfig
from autopar.trainer.train import train_main

from . import _models, _plans
from ._harness import TOL, reference

MODELS = {"cnn": "tests.trainer._models:small_cnn", "lstm": "tests.trainer._models:tiny_rnnlm"}


def _run(model: str, strategy, nproc: int, directory, opt: OptimizerConfig, resume: bool = False) -> None:
    train_main(model=MODELS[model], strategy=strategy, nproc=nproc, steps=4, dtype="float64", optimizer=opt,
               checkpoint_dir=str(directory), checkpoint_every=2, resume=resume, log=False)


def _resume_case(tmp_path, model, plan_a, world_a, plan_b, world_b, opt):
    graph = import_spec(_models.build(model))
    a, b = tmp_path / "a", tmp_path / "b"
    _run(model, _plans.FAMILIES[plan_a](graph, world_a), world_a, a, opt)
    b.mkdir()
    shutil.copy(ckpt.checkpoint_path(a, 2), ckpt.checkpoint_path(b, 2))   # stop after step 2 ...
    _run(model, _plans.FAMILIES[plan_b](graph, world_b), world_b, b, opt, resume=True)  # ... go on under B
    straight, resumed = ckpt.load(ckpt.checkpoint_path(a, 4)), ckpt.load(ckpt.checkpoint_path(b, 4))
    ref = reference(_models.build(model), opt, steps=4)
    for name, p in ref.params.items():
        assert (resumed["params"][name] - straight["params"][name]).abs().max() <= TOL, name
        assert (resumed["params"][name] - p).abs().max() <= TOL, name
    for key, per_param in straight["optimizer"]["state"].items():
        for name, t in per_param.items():
            assert (resumed["optimizer"]["state"][key][name] - t).abs().max() <= TOL, (key, name)
    assert resumed["optimizer"]["step"] == straight["optimizer"]["step"]
    for name, t in straight["buffers"].items():
        assert torch.allclose(resumed["buffers"][name].double(), t.double(), rtol=0, atol=TOL), name


def test_resume_under_another_plan_continues_exactly(tmp_path):
    # Hybrid plan (sample × parameter × attribute) → attribute plan with halos; SGD momentum state.
    _resume_case(tmp_path, "cnn", "hybrid", 2, "attribute", 2, OptimizerConfig("sgd", lr=0.1, momentum=0.9))


@pytest.mark.slow
@pytest.mark.distributed
def test_resume_on_more_ranks_with_adam_continues_exactly(tmp_path):
    _resume_case(tmp_path, "lstm", "model-parallel", 2, "random", 4, OptimizerConfig("adam", lr=0.01))
