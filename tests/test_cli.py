"""The `autopar` command: JSON output that other tools read, and one-line errors with status 2."""

from __future__ import annotations

import json

import pytest

from autopar.cli import main


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_json_compares_the_named_strategies(capsys):
    rc, out, _ = _run(capsys, "simulate", "--model", "lenet", "-o", "batch=16", "--topology", "p100-1x4", "--json")
    assert rc == 0
    doc = json.loads(out)
    rows = {r["strategy"]: r for r in doc["results"]}
    assert set(rows) == {"data-parallel", "model-parallel", "single-device"}
    assert doc["topology"]["devices"] == 4 and doc["graph"]["batch_size"] == 16
    dp = rows["data-parallel"]
    assert dp["step_seconds"] > 0 and dp["devices_used"] == 4
    assert dp["speedup_vs_data_parallel"] == 1.0
    assert rows["single-device"]["bytes_moved"] == 0
    assert sum(doc["cost_sources"].values()) > 0


def test_simulate_prints_a_table_without_json(capsys):
    rc, out, _ = _run(capsys, "simulate", "--model", "lenet", "-o", "batch=16", "--topology", "local:2",
                      "--strategy", "data-parallel")
    assert rc == 0
    assert "data-parallel" in out and "samples/s" in out


@pytest.mark.parametrize("argv, words", [
    (["simulate", "--model", "nosuch", "--topology", "p100-4x4"], ["unknown model 'nosuch'", "lenet"]),
    (["simulate", "--model", "lenet", "--topology", "nosuch"], ["unknown topology 'nosuch'", "p100-4x4"]),
    (["simulate", "--model", "lenet", "-o", "batch=7x", "--topology", "local"], ["batch", "int"]),
    (["simulate", "--model", "lenet", "--topology", "local", "--strategy", "nosuch"], ["nosuch", "data-parallel"]),
    (["profile", "--model", "lenet", "--topology", "p100-4x4"], ["local"]),
])
def test_user_errors_are_one_line_with_status_2(capsys, argv, words):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    assert err.startswith("autopar: error:") and err.count("\n") == 1
    for w in words:
        assert w in err


def test_models_and_topologies_list_what_can_be_named(capsys):
    rc, out, _ = _run(capsys, "models", "--json")
    assert rc == 0 and "nmt" in [m["name"] for m in json.loads(out)["models"]]
    rc, out, _ = _run(capsys, "topologies", "--json")
    assert rc == 0 and {"p100-4x4", "k80-16x4", "local"} <= {t["name"] for t in json.loads(out)["topologies"]}


def test_simulate_trace_writes_the_first_strategys_step_as_trace_events(capsys, tmp_path):
    path = tmp_path / "sim.json"
    rc, out, _ = _run(capsys, "simulate", "--model", "lenet", "-o", "batch=16", "--topology", "local:2",
                      "--strategy", "model-parallel", "--strategy", "data-parallel", "--trace", str(path), "--json")
    assert rc == 0 and json.loads(out)["trace"] == str(path)
    doc = json.loads(path.read_text())
    assert doc["otherData"]["strategy"] == "model-parallel"
    assert any(e.get("ph") == "X" and e["name"].startswith("fwd ") for e in doc["traceEvents"])


def test_profile_no_calibrate_measures_op_times_only(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path))
    rc, out, _ = _run(capsys, "profile", "--model", "lenet", "-o", "batch=8", "-o", "image=12", "--topology", "local:2",
                      "--max-tasks", "3", "--no-calibrate", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["calibration"]["status"] == "skipped" and doc["measured"] > 0
    assert doc["cold"]["measured"] == doc["measured"]     # the same tasks with the last-level cache evicted
    from autopar.planner.cost import CostModel, ProfileCache
    cache = ProfileCache.load(doc["cache"])
    assert len(cache) == 3 * doc["measured"] and cache.calibrations() == []   # warm, back to back and cold
    assert CostModel(cache).has_cold
    assert sum(" (back to back)|" in k for k in cache) == doc["measured"]
    assert doc["cache"].startswith(str(tmp_path))


def test_plan_and_simulate_take_dtype_and_a_plan_for_another_dtype_is_refused_saying_so(capsys, tmp_path):
    plan = tmp_path / "plan.yaml"
    model = ["--model", "lenet", "-o", "batch=8", "-o", "image=12", "--topology", "local:2"]
    rc, _, _ = _run(capsys, "plan", *model, "--dtype", "float64", "--budget", "1", "--max-proposals", "20",
                    "--out", str(plan), "--json")
    assert rc == 0 and "dtype: float64" in plan.read_text()
    rc, out, _ = _run(capsys, "simulate", *model, "--dtype", "float64", "--strategy", str(plan), "--json")
    assert rc == 0 and json.loads(out)["graph"]["dtype"] == "float64"
    rc, _, err = _run(capsys, "simulate", *model, "--strategy", str(plan))
    assert rc == 2
    assert "was made for lenet in float64; this run is float32" in err
    assert "autopar plan --dtype float32" in err


def test_simulate_warns_when_the_batch_does_not_divide_over_the_devices(capsys):
    rc, out, err = _run(capsys, "simulate", "--model", "lenet", "-o", "batch=15", "-o", "image=12",
                        "--topology", "local:2", "--strategy", "data-parallel", "--json")
    assert rc == 0
    assert ("autopar: warning: batch 15 does not divide over 2 devices: data-parallel runs on 1 device; "
            "use a batch divisible by 2") in err
    assert json.loads(out)["results"][0]["warnings"]


def test_profile_on_a_gpu_refuses_more_ranks_than_gpus_before_measuring(capsys, monkeypatch, tmp_path):
    import torch

    import autopar.planner.cost as cost
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    measured = []
    monkeypatch.setattr(cost, "profile_local", lambda *a, **k: measured.append(a))
    rc, _, err = _run(capsys, "profile", "--model", "lenet", "--topology", "local:2",
                      "--profile-cache", str(tmp_path / "p.json"))
    assert rc == 2 and not measured
    assert "2 CUDA rank(s) need one GPU each, and torch sees 1" in err and "calibrate fewer ranks" in err
