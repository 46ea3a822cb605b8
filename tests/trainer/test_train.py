"""`train_main`, what `autopar train` calls: N local ranks, per-step numbers, a JSON summary."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from autopar.planner.errors import PlanFileError
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.fx_import import import_spec
from autopar.planner.ir.strategy import model_parallel
from autopar.planner.plan_file import save_plan
from autopar.planner.sim import STEP_PARTS
from autopar.planner.zoo.registry import get_model
from autopar.trainer.train import add_train_args, config_from, format_summary, train_main


LENET = {"batch": 8, "image": 12}


def _plan_file(tmp_path, topology: str):
    graph = import_spec(get_model("lenet", **LENET))
    path = tmp_path / "plan.yaml"
    save_plan(model_parallel(graph, 2).renamed("mine"), path, graph, get_preset(topology), predicted_step_s=0.0123)
    return path


def test_training_a_plan_file_reports_losses_and_predicted_beside_measured_time(tmp_path):
    summary = train_main(model="lenet", model_options=LENET, strategy=str(_plan_file(tmp_path, "local:2")),
                         nproc=2, steps=3, optimizer="adam", lr=0.001, metrics_port=0,
                         checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=3, log=False)
    json.dumps(summary)   # the CLI prints it as JSON
    assert summary["nproc"] == 2 and summary["strategy"] == "mine" and summary["backend"] == "gloo"
    assert len(summary["losses"]) == len(summary["step_seconds"]) == 3
    assert summary["measured_step_s"] > 0 and summary["samples_per_second"] > 0
    assert summary["predicted_step_s"] == 0.0123 and "plan file" in summary["prediction"]
    assert summary["prediction_error"] == pytest.approx(0.0123 / summary["measured_step_s"] - 1)
    assert summary["checkpoints"] == [str(tmp_path / "ck" / "step-00000003.pt")]
    assert summary["metrics_port"] > 0
    assert summary["optimizer"]["name"] == "adam"
    text = format_summary(summary)
    assert "measured step" in text and f"prediction error {100 * summary['prediction_error']:+.1f} %" in text
    # A plan file records a step time, not its parts: the measured parts alone, nothing to compare.
    assert summary["predicted_parts_s"] is None and summary["furthest_off"] is None
    assert set(summary["measured_parts_s"]) == set(STEP_PARTS) and "furthest off" not in text


def test_a_simulated_plan_reports_its_parts_beside_the_measured_ones():
    """`autopar train` splits the predicted and the measured step into the same parts (compute,
    transfer, synchronization, optimizer, overhead) on the busiest rank, and names the part
    furthest off, so a user sees where a prediction went wrong."""
    summary = train_main(model="lenet", model_options=LENET, strategy="model-parallel", nproc=2, steps=4, log=False)
    json.dumps(summary)
    sim, meas = summary["predicted_parts_s"], summary["measured_parts_s"]
    assert set(sim) == set(meas) == set(STEP_PARTS) and min(meas.values()) >= 0
    assert sum(sim.values()) == pytest.approx(summary["predicted_step_s"], rel=1e-9)
    assert meas["compute"] > 0 and meas["transfer"] > 0 and summary["measured_parts_rank"] in (0, 1)
    assert sum(meas.values()) <= max(summary["step_seconds"])
    assert re.fullmatch(r"(compute|transfer|synchronization|optimizer|overhead) (over|under) by \d+\.\d ms",
                        summary["furthest_off"])
    text = format_summary(summary)
    assert f"parts of the step on rank {summary['measured_parts_rank']}" in text
    assert f"furthest off: {summary['furthest_off']}" in text


def test_a_step_lasts_until_the_slowest_rank_is_done(tmp_path):
    """Every op on rank 1: rank 0 has nothing to do but wait for the step's loss.  Its steps, which
    the summary reports, last at least as long as rank 1's work.  Timed
    without the wait they were rank 0's own share (a plan with rnnlm's later layers on rank 1 timed
    at 46.4 ms a step, 68.6 ms from one step's start to the next; docs/simulation.md, "Forty-fourth
    round")."""
    from autopar.planner.ir import ParallelConfig, Strategy
    graph = import_spec(get_model("lenet", **LENET))
    on_one = Strategy.from_mapping(graph, {op.name: ParallelConfig((1,) * len(op.pardims), (1,)) for op in graph.ops},
                                   "all on rank 1")
    path = tmp_path / "plan.yaml"
    save_plan(on_one, path, graph, get_preset("local:2"))
    summary = train_main(model="lenet", model_options=LENET, strategy=str(path), nproc=2, steps=6, log=False)
    assert summary["measured_parts_rank"] == 1
    work = summary["measured_parts_s"]["compute"] + summary["measured_parts_s"]["optimizer"]
    assert work > 0 and summary["measured_step_s"] >= work


def test_a_plan_files_recorded_step_gets_its_parts_where_simulating_it_again_agrees(tmp_path):
    """A plan file records its predicted step, not its parts: they are simulated again for the
    run, and reported where that gives the recorded step (the same profile cache), so the README's
    round trip through `autopar plan --out` shows where its prediction was off."""
    from autopar.trainer import train as train_mod
    from autopar.trainer.optim import OptimizerConfig
    graph = import_spec(get_model("lenet", **LENET))
    plan = model_parallel(graph, 2).renamed("mine")
    cfg = train_mod.TrainConfig(model="lenet", optimizer=OptimizerConfig("sgd", lr=0.01), log=False)
    simulated, _, parts = train_mod.predict(graph, get_preset("local:2"), plan, cfg)
    path = tmp_path / "plan.yaml"
    save_plan(plan, path, graph, get_preset("local:2"), predicted_step_s=simulated)
    summary = train_main(model="lenet", model_options=LENET, strategy=str(path), nproc=2, steps=3, log=False)
    assert summary["predicted_step_s"] == simulated and "plan file" in summary["prediction"]
    assert summary["predicted_parts_s"] == parts and summary["furthest_off"]
    assert "furthest off" in format_summary(summary)


def test_a_plan_file_for_another_topology_is_refused_before_training(tmp_path):
    with pytest.raises(PlanFileError, match="topology fingerprint differs"):
        train_main(model="lenet", model_options=LENET, strategy=str(_plan_file(tmp_path, "local:4")), nproc=2,
                   steps=1, log=False)


def test_the_cli_options_become_a_config():
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--model-opt", "-o", action="append", default=[])
    p.add_argument("--json", action="store_true")
    add_train_args(p)
    args = p.parse_args(["--model", "rnnlm", "-o", "vocab=100", "--model-opt", "steps=3", "--strategy", "plan.yaml",
                         "--nproc", "4", "--steps", "7", "--dtype", "float64", "--optimizer", "adam", "--lr", "0.5",
                         "--checkpoint-dir", "ck", "--checkpoint-every", "2", "--resume", "--metrics-port", "9100"])
    cfg = config_from(args)
    assert cfg.model == "rnnlm" and cfg.model_options == {"vocab": 100, "steps": 3}
    assert (cfg.strategy, cfg.nproc, cfg.steps, cfg.dtype) == ("plan.yaml", 4, 7, "float64")
    assert (cfg.optimizer.name, cfg.optimizer.lr) == ("adam", 0.5)
    assert (cfg.checkpoint_dir, cfg.checkpoint_every, cfg.resume, cfg.metrics_port) == ("ck", 2, True, 9100)


def test_training_on_cuda_without_a_gpu_topology_predicts_nothing_rather_than_a_cpu_step(monkeypatch):
    """local:N describes CPU ranks; on CUDA the prediction needs a topology that names the GPUs."""
    from autopar.planner.ir import single_device
    from autopar.trainer import train as train_mod
    from autopar.trainer.optim import OptimizerConfig
    monkeypatch.setattr(train_mod, "pick_backend", lambda device=None: ("nccl", "cuda"))
    graph = import_spec(get_model("lenet", **LENET))
    cfg = train_mod.TrainConfig(model="lenet", device="cuda", optimizer=OptimizerConfig("sgd", lr=0.01), log=False)
    predicted, note, parts = train_mod.predict(graph, get_preset("local:1"), single_device(graph), cfg)
    assert predicted is None and parts is None and "--topology" in note and "GPUs" in note
    # With --topology (a file naming the GPU product) it simulates as usual.
    cfg = train_mod.TrainConfig(model="lenet", device="cuda", topology="p100-1x4",
                                optimizer=OptimizerConfig("sgd", lr=0.01), log=False)
    predicted, note, parts = train_mod.predict(graph, get_preset("p100-1x4"), single_device(graph), cfg)
    assert predicted and predicted > 0 and note == "simulated on p100-1x4"
