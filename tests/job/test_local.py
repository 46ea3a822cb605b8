"""`autopar run JOB.yaml --local` end to end, as a user runs it: a report with the prediction
beside the measurement, a complete run directory, one-line errors that write nothing, and Ctrl-C
that stops after a step and leaves a checkpoint to resume from."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from autopar.planner.sim import STEP_PARTS

ROOT = Path(__file__).resolve().parents[2]
AUTOPAR = [sys.executable, "-m", "autopar.cli"]


def _manifest(tmp_path: Path, name: str = "tiny", steps: int = 4, **spec) -> Path:
    doc = {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob", "metadata": {"name": name},
           "spec": {"model": {"name": "lenet", "options": {"image": 12}},
                    "training": {"steps": steps, "batchSize": 8},
                    "devices": {"gpusPerNode": 2},
                    "planner": {"algorithm": "auto", "budgetSeconds": 1, "maxProposals": 20}, **spec}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "AUTOPAR_CACHE_DIR": str(tmp_path / "cache")}


def _run(tmp_path, *args, timeout=300):
    return subprocess.run([*AUTOPAR, "run", *map(str, args)], cwd=tmp_path, env=_env(tmp_path), text=True,
                          capture_output=True, timeout=timeout)


def test_run_local_json_report_and_run_directory(tmp_path):
    job = _manifest(tmp_path)
    out = _run(tmp_path, job, "--local", "--json", "--no-profile", "--run-dir", "run")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["phase"] == "Succeeded" and doc["job"] == "tiny" and doc["devices"] == 2
    for key in ("predicted_step_s", "measured_step_s", "prediction_error", "data_parallel_predicted_step_s"):
        assert isinstance(doc[key], float), key
    assert doc["prediction_error"] == pytest.approx(doc["predicted_step_s"] / doc["measured_step_s"] - 1)
    assert doc["predicted_speedup"] >= 1.0
    run = tmp_path / "run"
    assert doc["files"]["run_dir"] == "run"
    for name in ("job.yaml", "plan.yaml", "plan.png", "simulated-trace.json", "measured-trace.json", "metrics.prom",
                 "metrics.json", "report.json"):
        assert (run / name).is_file(), name
    assert json.loads((run / "report.json").read_text()) == doc
    prom = (run / "metrics.prom").read_text()
    assert 'autopar_job_simulated_step_seconds{job="tiny",namespace="default"}' in prom
    assert "autopar_job_actual_step_seconds" in prom and "autopar_job_prediction_error" in prom
    assert len(json.loads((run / "metrics.json").read_text())["step_seconds"]) == 4
    assert (run / "checkpoints" / "latest").is_file()
    written = yaml.safe_load((run / "job.yaml").read_text())
    assert written["spec"]["training"]["optimizer"] == "sgd"     # defaults written out
    assert "traceEvents" in json.loads((run / "simulated-trace.json").read_text())


def test_the_human_report(tmp_path):
    job = _manifest(tmp_path, steps=3, planner={"algorithm": "data-parallel"})
    out = _run(tmp_path, job, "--local", "--no-profile", "--run-dir", "run")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("tiny: lenet on local:2 (2 worker processes) — Succeeded")
    assert "simulated" in text and "measured" in text and "prediction  error" in text
    assert "run         run/" in text and "plan.yaml" in text
    # where the prediction was off: the trainer simulated the plan file again and split both steps
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert set(doc["predicted_parts_s"]) == set(doc["measured_parts_s"]) == set(STEP_PARTS)
    assert doc["furthest_off"] and f"; furthest off: {doc['furthest_off']}" in text


def test_a_retimed_run_reports_the_price_of_the_ops_its_ranks_timed(tmp_path):
    job = _manifest(tmp_path, steps=4, planner={"algorithm": "data-parallel"})
    out = _run(tmp_path, job, "--local", "--no-profile", "--run-dir", "run", "--retime", "--compare", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["retime"]["passes_before_steps"] == [2] and doc["retime"]["timed"] == doc["retime"]["tasks"]
    assert doc["predicted_step_s"] != doc["planned_step_s"]
    assert doc["prediction_error"] == pytest.approx(doc["predicted_step_s"] / doc["measured_step_s"] - 1)
    assert doc["data_parallel_retimed_step_s"] > 0 and "retimed     the plan's ops timed in the ranks" in out.stderr
    prom = (tmp_path / "run" / "metrics.prom").read_text()
    assert f'autopar_job_simulated_step_seconds{{job="tiny",namespace="default"}} {doc["predicted_step_s"]!r}' in prom


@pytest.mark.parametrize("edit,message", [
    ({"training": {"steps": 0}}, "spec.training.steps: must be at least 1, got 0"),
    ({"planner": {"algorithm": "fastest"}}, "spec.planner.algorithm: 'fastest' is not allowed"),
    ({"model": {"name": "lenet", "options": {"imge": 12}}}, "spec.model.options.imge: model 'lenet' has no option"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, edit, message):
    job = _manifest(tmp_path, **edit)
    out = _run(tmp_path, job, "--local")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: ") and message in lines[0], out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [job.name]


def test_without_local_it_says_how_to_run_on_a_cluster(tmp_path):
    out = _run(tmp_path, _manifest(tmp_path), timeout=60)
    assert out.returncode == 2 and "kubectl apply -f" in out.stderr and "--local" in out.stderr


def test_an_existing_run_directory_is_not_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    out = _run(tmp_path, _manifest(tmp_path), "--local", "--run-dir", "run", timeout=60)
    assert out.returncode == 2 and "--run-dir run: exists and is not an empty directory" in out.stderr
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["keep.txt"]


def test_ctrl_c_stops_after_a_step_and_leaves_a_checkpoint_to_resume_from(tmp_path):
    job = _manifest(tmp_path, name="long", steps=400, planner={"algorithm": "data-parallel"})
    proc = subprocess.Popen([*AUTOPAR, "run", str(job), "--local", "--no-profile", "--run-dir", "run", "--json"],
                            cwd=tmp_path, env=_env(tmp_path), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    seen = []
    deadline = time.monotonic() + 240
    for line in proc.stderr:           # per-step lines on stderr (no terminal: no progress bar)
        seen.append(line)
        if line.startswith("step 5/"):
            break
        assert time.monotonic() < deadline, "".join(seen)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: every process of the group
    stdout, rest = proc.communicate(timeout=180)
    assert proc.returncode == 130, "".join(seen) + rest
    doc = json.loads(stdout)
    assert doc["phase"] == "Stopped" and 5 <= doc["stopped_at_step"] < 400
    ckpt = Path(doc["checkpoints"][-1])
    assert ckpt.is_absolute() or (tmp_path / ckpt).exists()
    state = torch.load(ckpt if ckpt.is_absolute() else tmp_path / ckpt, weights_only=False)
    assert state["step"] == doc["stopped_at_step"]
    assert json.loads((tmp_path / "run" / "report.json").read_text())["phase"] == "Stopped"
    assert f"--resume {Path('run')}" in doc["message"] or "--resume run" in doc["message"]
    # `autopar run --resume RUN_DIR` trains the same plan on from that checkpoint
    resumed = subprocess.run([*AUTOPAR, "run", str(job), "--local", "--no-profile", "--resume", "run", "--json"],
                             cwd=tmp_path, env=_env(tmp_path), text=True, capture_output=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr
    again = json.loads(resumed.stdout)
    assert again["phase"] == "Succeeded" and again["resumed_from_step"] == doc["stopped_at_step"]
    assert again["strategy"] == doc["strategy"] and again["predicted_step_s"] == pytest.approx(doc["predicted_step_s"])
    assert torch.load(tmp_path / again["checkpoints"][-1], weights_only=False)["step"] == 400


def test_resume_refuses_a_run_of_another_spec(tmp_path):
    job = _manifest(tmp_path, steps=2, planner={"algorithm": "data-parallel"})
    assert _run(tmp_path, job, "--local", "--no-profile", "--run-dir", "run").returncode == 0
    other = _manifest(tmp_path, steps=3, planner={"algorithm": "data-parallel"})
    out = _run(tmp_path, other, "--local", "--no-profile", "--resume", "run", timeout=60)
    assert out.returncode == 2 and "that run was made for another spec of the job" in out.stderr
