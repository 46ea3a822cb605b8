"""Checkpoint files are whole or absent, found by `latest`, and checked against the model."""

from __future__ import annotations

import os

import pytest
import torch

from autopar.planner.ir.fx_import import import_spec
from autopar.planner.zoo.registry import get_model
from autopar.trainer import checkpoint as ckpt
from autopar.trainer.errors import CheckpointError


def _state(step: int, **params) -> dict:
    return {"format": ckpt.FORMAT, "model": "m", "step": step, "params": params, "buffers": {},
            "optimizer": {"name": "sgd", "step": 0, "state": {}}}


def test_latest_points_at_the_newest_written_checkpoint(tmp_path):
    ckpt.write(tmp_path, _state(2, w=torch.zeros(2)))
    ckpt.write(tmp_path, _state(4, w=torch.ones(2)))
    assert ckpt.latest(tmp_path).name == "step-00000004.pt"
    assert ckpt.load(tmp_path)["params"]["w"].tolist() == [1.0, 1.0]
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-00000002.pt", "step-00000004.pt"]


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    ckpt.write(tmp_path, _state(2, w=torch.zeros(2)))

    def broken(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        ckpt.write(tmp_path, _state(4, w=torch.ones(2)))
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-00000002.pt"]
    assert ckpt.latest(tmp_path).name == "step-00000002.pt"


def test_loading_from_an_empty_directory_says_what_to_do(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint in .*start without --resume"):
        ckpt.load(tmp_path)


def test_a_file_that_is_not_a_checkpoint_is_rejected(tmp_path):
    torch.save({"weights": 1}, tmp_path / "step-00000001.pt")
    with pytest.raises(CheckpointError, match="not an autopar checkpoint"):
        ckpt.load(tmp_path)


def test_a_checkpoint_of_another_model_is_rejected(tmp_path):
    graph = import_spec(get_model("lenet", batch=4, image=12))
    state = _state(1, **{n: torch.zeros(s.shape) for n, s in graph.param_specs.items()})
    ckpt.check_compatible(state, graph, "sgd")
    state["params"]["features.0.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"different shapes \['features.0.weight'\]"):
        ckpt.check_compatible(state, graph, "sgd")
    with pytest.raises(CheckpointError, match="resume with --optimizer sgd"):
        ckpt.check_compatible(_state(1, **{n: torch.zeros(s.shape) for n, s in graph.param_specs.items()}),
                              graph, "adam")
