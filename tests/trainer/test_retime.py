"""`autopar train --retime` (`trainer.retime`): the plan priced again with its ops timed in the ranks."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
import urllib.request

import pytest

from autopar.planner.cost import ProfileCache, default_calibration, kind_of
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.fx_import import import_spec
from autopar.planner.ir.strategy import data_parallel, model_parallel
from autopar.planner.zoo.registry import get_model
from autopar.trainer.errors import TrainerConfigError
from autopar.trainer.retime import check_retime, plan_items, price, schedule, settling
from autopar.trainer.train import format_summary, train_main

LENET = {"batch": 8, "image": 12}


def test_passes_come_after_the_first_step_and_spread_over_the_rest():
    assert schedule(0, 30) == [1, 10, 20]
    assert schedule(0, 1000) == [1, 334, 667]
    assert schedule(20, 36) == [21, 26, 31]            # a resumed run times its own passes
    assert schedule(0, 11) == [1, 6]                   # a short one fewer, so that most of its steps count
    assert schedule(0, 8) == [1] and schedule(0, 2) == [1] and schedule(0, 1) == [] and schedule(5, 5) == []
    at = schedule(0, 30)
    assert [s for s in range(30) if settling(at, s)] == [1, 2, 10, 11, 20, 21]


def test_the_plan_items_are_its_own_tasks_once_each():
    graph = import_spec(get_model("lenet", **LENET))
    kind = kind_of(get_preset("local:2").devices[0])
    plan = model_parallel(graph, 2)
    items = plan_items(graph, plan, kind)
    assert len({k for k, _, _ in items}) == len(items) > 0
    assert all(tuple(plan[name].degrees) == degrees for _, name, degrees in items)
    assert {name for _, name, _ in items} <= {op.name for op in graph.ops if op.inputs}
    assert plan_items(graph, data_parallel(graph, 2), kind) != items


def test_retime_is_refused_where_the_ranks_cpus_are_not_what_the_plan_is_priced_on():
    with pytest.raises(TrainerConfigError, match="on the ranks' CPUs"):
        check_retime(get_preset("local:2"), 2, "cuda")
    with pytest.raises(TrainerConfigError, match="leave out --topology"):
        check_retime(get_preset("dgx-h100"), 8, "cpu")
    with pytest.raises(TrainerConfigError, match="leave out --topology"):
        check_retime(get_preset("local:4"), 2, "cpu")
    check_retime(get_preset("local:2"), 2, "cpu")


def test_the_price_follows_the_times_the_passes_took_and_keeps_the_profiles_for_the_rest():
    graph = import_spec(get_model("lenet", **LENET))
    topology = get_preset("local:2")
    kind = kind_of(topology.devices[0])
    plan = data_parallel(graph, 2)
    items = plan_items(graph, plan, kind)

    def passes(seconds: float, failing: int | None = None) -> list:
        one = [(seconds, 2 * seconds, None) if n != failing else (0.0, 0.0, "RuntimeError: boom")
               for n in range(len(items))]
        return [[[t, t] for t in one] for _ in range(2)]      # 2 ranks, 2 passes each

    profile = ProfileCache()
    fast, _, report, runtime = price(graph, topology, plan, "sgd", profile, items, passes(1e-4), kind)
    slow, parts, _, _ = price(graph, topology, plan, "sgd", profile, items, passes(1e-3), kind)
    assert runtime is None
    assert len(report.measured) == len(items) and not report.skipped
    assert slow > fast and parts["compute"] > 0
    key = items[0][0]
    profile.put(key, 5e-2, 1e-1)
    skipped_own, _, report, _ = price(graph, topology, plan, "sgd", profile, items, passes(1e-4, failing=0), kind)
    assert report.skipped and skipped_own > fast + 0.1             # the failed task kept the profile's 50 + 100 ms


def _runtime_timed(optimizer_s: float, overheads: bool = False) -> list:
    """Per rank, what its `RuntimeSteps` measured: the optimizer's four cases at `optimizer_s` per
    MiB, and (`overheads`) the model whole's steps with 50 us per forward task and 80 us per
    backward one between their spans."""
    mib = float(1 << 20)
    out = []
    for r in (0, 1):
        own = None
        if overheads:
            own = {"fingerprint": "x", "fwd_tasks": 10, "bwd_tasks": 10, "fwd_between_s": 5e-4, "bwd_between_s": 8e-4,
                   "fwd_exchange_s": 0.0, "bwd_exchange_s": 0.0, "fwd_calls": 0, "bwd_calls": 0, "steps": 4}
        out.append({"optimizer": [(4, 4 * mib, 4 * optimizer_s), (8, 16 * mib, 16 * optimizer_s),
                                  (4, mib / 16, optimizer_s / 16), (16, mib, optimizer_s)],
                    "overheads": own})
    return out


def test_the_price_takes_the_optimizer_and_own_work_the_ranks_timed():
    """With a runtime calibration in the profile, the passes' optimizer and per-op overheads price
    the plan in place of the calibration's; without one, neither."""
    graph = import_spec(get_model("lenet", **LENET))
    topology = get_preset("local:2")
    kind = kind_of(topology.devices[0])
    plan = model_parallel(graph, 2)
    items = plan_items(graph, plan, kind)
    passes = [[[(1e-4, 2e-4, None)] * 2 for _ in items] for _ in range(2)]
    profile = ProfileCache()
    profile.put_calibration(default_calibration(topology.devices[0].product, "gloo", 2))
    plain, _, _, none = price(graph, topology, plan, "sgd", profile, items, passes, kind)
    fast, _, _, runtime = price(graph, topology, plan, "sgd", profile, items, passes, kind, _runtime_timed(1e-4))
    slow, _, _, _ = price(graph, topology, plan, "sgd", profile, items, passes, kind, _runtime_timed(5e-3))
    assert none is None and set(runtime) == {"optimizer"} and runtime["optimizer"].startswith("sgd ")
    assert slow > fast + 1e-4 and fast != plain      # lenet: 0.06 MiB of weights
    # the per-op overheads as the whole model's steps measured them (lenet's tasks, not the fake's 10)
    with_own, _, _, runtime = price(graph, topology, plan, "sgd", profile, items, passes, kind,
                                    _runtime_timed(1e-4, overheads=True))
    assert set(runtime) == {"optimizer", "overheads"} and with_own != fast
    # ... and none of it without a calibration: the runtime's costs stay the defaults
    bare = ProfileCache()
    assert price(graph, topology, plan, "sgd", bare, items, passes, kind, _runtime_timed(5e-3))[3] is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int, seen: list, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            time.sleep(0.05)
            continue
        values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("autopar_trainer_predicted_step_seconds", "autopar_trainer_steps_total"))}
        seen.append(values)
        time.sleep(0.05)


def test_a_retimed_run_reports_the_new_price_on_its_gauge_and_trains_the_same_numbers(tmp_path):
    """The passes time every rank in lockstep before steps 2, 7 and 12; the summary's prediction,
    and the gauge the operator's status reads, take the price of the ops timed in the ranks, and
    of the optimizer and per-op overheads timed there too (the profile has a runtime
    calibration); the plan's own stays beside; the steps after each pass are left out of the
    median; and the losses are those of the same run without --retime (the passes leave the run's
    random stream alone)."""
    cache = ProfileCache(path=tmp_path / "profile.json")
    cache.put_calibration(default_calibration(get_preset("local:2").devices[0].product, "gloo", 2))
    cache.save()
    port = _free_port()
    seen: list = []
    stop = threading.Event()
    poller = threading.Thread(target=_scrape, args=(port, seen, stop), daemon=True)
    poller.start()
    try:
        summary = train_main(model="lenet", model_options=LENET, strategy="model-parallel", nproc=2, steps=16,
                             retime=True, metrics_port=port, metrics_linger=20, log=False,
                             profile_cache=str(cache.path))
    finally:
        stop.set()
        poller.join(5)
    json.dumps(summary)
    retime = summary["retime"]
    assert retime["passes_before_steps"] == [2, 7, 12] and retime["timed"] == retime["tasks"] > 0
    assert retime["settling_steps"] == [2, 3, 7, 8, 12, 13]
    assert not retime["not_timed"] and retime["seconds"] > 0
    assert "timed in these ranks before step(s) 2, 7, 12, and their optimizer and own work per op" in (
        summary["prediction"])
    assert set(retime["runtime"]) == {"optimizer", "overheads", "ops_only_step_s"}
    assert retime["runtime"]["ops_only_step_s"] > 0 and retime["runtime"]["ops_only_step_s"] != summary[
        "predicted_step_s"]
    assert summary["predicted_step_s"] > 0 and summary["planned_step_s"] > 0
    assert summary["predicted_step_s"] != summary["planned_step_s"]
    assert summary["prediction_error"] == pytest.approx(summary["predicted_step_s"] / summary["measured_step_s"] - 1)
    assert sum(summary["predicted_parts_s"].values()) == pytest.approx(summary["predicted_step_s"], rel=1e-9)
    # the median leaves out the steps that settle after the passes, and the first (warm-up)
    counted = [t for s, t in enumerate(summary["step_seconds"], 1) if s not in retime["settling_steps"]]
    assert summary["measured_step_s"] == statistics.median(counted[1:])
    last = [v for v in seen if v.get("autopar_trainer_steps_total") == 16]
    assert last and last[-1]["autopar_trainer_predicted_step_seconds"] == pytest.approx(summary["predicted_step_s"])
    assert any(v.get("autopar_trainer_predicted_step_seconds") == pytest.approx(summary["planned_step_s"])
               for v in seen if v.get("autopar_trainer_steps_total", 0) <= 1)
    text = format_summary(summary)
    assert "the plan's own prediction" in text and "retimed: " in text and "retimed runtime: optimizer sgd " in text
    assert "; with the ops alone timed in the ranks " in text
    plain = train_main(model="lenet", model_options=LENET, strategy="model-parallel", nproc=2, steps=16, log=False,
                       profile_cache=str(cache.path))
    assert plain["losses"] == summary["losses"] and plain["retime"] is None
    assert plain["predicted_step_s"] == plain["planned_step_s"] == summary["planned_step_s"]
