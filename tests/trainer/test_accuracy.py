"""`autopar bench accuracy`: its totals are the ones the issue defines, and a small run end to end."""

from __future__ import annotations

import itertools
import json

import pytest

from autopar.planner.cost import CostModel, ProfileCache
from autopar.planner.ir import import_spec
from autopar.planner.sim import STEP_PARTS
from autopar.planner.zoo import load_model
from autopar.trainer.accuracy import (PROBE_PARTS, _measured_row, kendall_tau, own_calibration, run_accuracy_bench,
                                      speed_probe, totals)
from autopar.trainer.rescore import PROFILE, RESULT, KeptRunError, rescore


def _row(model, strategy, sim, meas, cv=0.01):
    return {"model": model, "strategy": strategy, "simulated_s": sim, "measured_s": meas, "cv": cv,
            "error": sim / meas - 1}


def test_kendall_tau_counts_only_pairs_of_one_model_that_differ_beyond_twice_their_cv():
    rows = [_row("a", "x", 1.0, 1.0), _row("a", "y", 2.0, 2.0), _row("a", "z", 3.5, 3.0),
            _row("a", "w", 9.0, 1.01),             # within 2 CV of x: that pair is not counted
            _row("b", "x", 5.0, 1.0)]              # another model: never paired with model a
    tau, pairs = kendall_tau(rows)
    # Counted: x-y, x-z, y-z (concordant), w-y, w-z (discordant); x-w is within the noise.
    assert pairs == 5 and tau == pytest.approx((3 - 2) / 5)


def test_totals_are_the_issues_figures():
    rows = [_row("m", "data-parallel", 1.1, 1.0), _row("m", "searched", 0.9, 1.0), _row("m", "other", 2.0, 2.0),
            _row("n", "searched", 1.0, 1.2), _row("n", "data-parallel", 1.0, 1.0)]
    t = totals(rows)
    errors = sorted(abs(r["error"]) for r in rows)
    assert t["median_abs_error"] == pytest.approx(errors[2])
    assert t["max_abs_error"] == pytest.approx(errors[-1])
    assert t["mean_error"] == pytest.approx(sum(r["error"] for r in rows) / len(rows))
    assert t["searched_vs_best_measured_by_model"] == {"m": 1.0, "n": pytest.approx(1.2)}
    assert t["searched_vs_best_measured"] == pytest.approx(1.2)
    assert t["met"]["searched_vs_best_measured"] is False and t["met"]["median_abs_error"] is False
    # n's searched plan measured 20 % slower than its data-parallel row, far beyond their 1 % CVs.
    assert t["searched_vs_best_resolved_by_model"] == {"m": 1.0, "n": pytest.approx(1.2)}


def test_searched_vs_best_resolved_leaves_out_the_rows_within_the_noise_of_the_searched_plan():
    rows = [_row("m", "searched", 1.0, 1.04, cv=0.05), _row("m", "optcnn", 1.0, 1.0, cv=0.05),   # 4 % < 2 CV
            _row("m", "random-1", 2.0, 2.0),
            _row("n", "searched", 1.0, 1.1, cv=0.02), _row("n", "expert", 1.1, 1.05, cv=0.02),     # 4.8 % > 2 CV
            _row("n", "model-parallel", 1.1, 1.0, cv=0.2)]                                       # 10 % < 2 CV
    t = totals(rows)
    assert t["searched_vs_best_measured_by_model"] == {"m": pytest.approx(1.04), "n": pytest.approx(1.1)}
    assert t["searched_vs_best_resolved_by_model"] == {"m": 1.0, "n": pytest.approx(1.1 / 1.05)}
    assert t["searched_vs_best_resolved"] == pytest.approx(1.1 / 1.05)
    assert totals([_row("m", "data-parallel", 1.0, 1.0)])["searched_vs_best_resolved"] is None


def test_a_step_lasts_as_long_as_its_slowest_rank():
    phases = {"fwd": 0.01, "bwd": 0.02, "exchange": 0.0, "grad exchange": 0.0, "sync": 0.001, "optimizer step": 0.003}
    rank0 = [(0.05, phases), (0.07, phases), (0.06, phases)]
    rank1 = [(0.06, phases), (0.05, phases), (0.08, phases)]
    med, cv, parts, times = _measured_row([rank0, rank1])
    assert med == pytest.approx(0.07) and times == [0.06, 0.07, 0.08]     # in the order taken
    assert parts["compute"] == pytest.approx(0.03) and parts["optimizer"] == pytest.approx(0.003)
    assert parts["synchronization"] == pytest.approx(0.001) and parts["transfer"] == 0.0
    assert parts["overhead"] == pytest.approx(0.06 - 0.034) and cv > 0     # the rank's own median step


def test_the_measured_overhead_is_the_median_of_each_steps_rest():
    """A stall now in the exchanges and now in the compute moves both parts' medians below their
    typical sum; the overhead is each step's time outside the spans, not the median step less the
    parts' medians (which would call the parts' spread overhead)."""
    def step(fwd, exchange):
        return (fwd + exchange + 0.001, {"fwd": fwd, "bwd": 0.0, "exchange": exchange, "grad exchange": 0.0,
                                         "sync": 0.0, "optimizer step": 0.0})
    rank = [step(0.010, 0.010), step(0.013, 0.010), step(0.010, 0.013), step(0.013, 0.010), step(0.010, 0.013)]
    med, _, parts, _ = _measured_row([rank])
    assert med == pytest.approx(0.024) and parts["compute"] == pytest.approx(0.010)
    assert parts["transfer"] == pytest.approx(0.010)
    assert parts["overhead"] == pytest.approx(0.001)          # not 0.024 - 0.020


def test_the_measured_parts_are_the_busiest_ranks_as_on_the_simulated_side():
    """In a pipeline the slowest rank is often the one that waits; both sides take the rank with
    the most compute and optimizer time."""
    waits = {"fwd": 0.01, "bwd": 0.01, "exchange": 0.05, "grad exchange": 0.0, "sync": 0.0, "optimizer step": 0.001}
    works = {"fwd": 0.03, "bwd": 0.03, "exchange": 0.01, "grad exchange": 0.0, "sync": 0.0, "optimizer step": 0.002}
    med, _, parts, _ = _measured_row([[(0.075, waits)] * 3, [(0.074, works)] * 3])
    assert med == pytest.approx(0.075)
    assert parts["compute"] == pytest.approx(0.06) and parts["transfer"] == pytest.approx(0.01)
    assert parts["overhead"] == pytest.approx(0.074 - 0.072)


@pytest.mark.timeout(600)
def test_a_small_accuracy_run_reports_every_row_and_the_totals(tmp_path):
    kept = tmp_path / "run"
    doc = run_accuracy_bench(models=(("lenet", {"batch": 16, "image": 20}),), progress=False,
                             warmup=1, steps=3, search_budget_s=1.0, quick_calibration=True, keep=kept,
                             message_steps=3, optimizer_steps=2, own_steps=2)
    assert len(doc["rows"]) >= 6 and {r["strategy"] for r in doc["rows"]} >= {"data-parallel", "searched"}
    for r in doc["rows"]:
        assert r["simulated_s"] > 0 and r["measured_s"] > 0 and r["error"] == pytest.approx(
            r["simulated_s"] / r["measured_s"] - 1)
        assert set(r["simulated_parts_s"]) == set(r["measured_parts_s"]) == set(STEP_PARTS)
        # the busiest rank's parts end with its own step, at the step's end or before (`step_parts`)
        assert 0 < sum(r["simulated_parts_s"].values()) <= r["simulated_s"] * (1 + 1e-9)
        assert r["off"].split()[0] in STEP_PARTS
    # A plan two strategies share trained once: the later row names the first and has its numbers.
    seen: dict = {}
    for r in doc["rows"]:
        key = json.dumps(r["plan"], sort_keys=True)
        if key in seen:
            assert r["same_plan_as"] == seen[key]["strategy"] and r["measured_s"] == seen[key]["measured_s"]
        else:
            assert "same_plan_as" not in r
            seen[key] = r
    assert {"median_abs_error", "p90_abs_error", "max_abs_error", "mean_error", "kendall_tau",
            "searched_vs_best_measured"} <= set(doc)
    # The rows are priced with the ops the training ranks timed between the steps' blocks, with the
    # search's cold times; with the search's profile they are reported beside.
    assert doc["row_profile"] == "during_steps"
    for r in doc["rows"]:
        assert r["error_search_profile"] == pytest.approx(r["simulated_search_profile_s"] / r["measured_s"] - 1)
        assert r["simulated_search_profile_s"] > 0
    assert doc["search_profile"]["max_abs_error"] >= doc["search_profile"]["median_abs_error"] >= 0
    during = ProfileCache.load(kept / "lenet-during_steps.json", keep_stale=True, host_workers=2)
    cold = {k.split("|", 1)[1] for k in during if "cold" in k.split("|", 1)[0]}
    assert CostModel(during).has_cold and cold <= {k.split("|", 1)[1] for k in during if "cold" not in k}
    # ... and with the messages the ranks timed between the blocks; the calibration's beside.
    (in_steps,) = during.calibrations()
    assert dict(in_steps.details)["messages_between_blocks"] and in_steps.p2p_oneway is not None
    assert doc["message_steps"] == 3 and doc["calibration_messages"]["max_abs_error"] >= 0
    assert all(r["simulated_calibration_messages_s"] > 0 for r in doc["rows"])
    # ... and with the optimizer and the runtime's own work per op timed there too; as timed before, beside.
    fitted = dict(in_steps.details)["optimizer_between_blocks"]
    assert len(fitted) == 6 and all(seconds > 0 for _, _, seconds in fitted)
    assert in_steps.optimizer_time("sgd", 4, 4 << 20) > 0 and in_steps.optimizer_time("adam", 4, 4 << 20) > 0
    own = doc["model_overheads"]["lenet"]["between_blocks"]
    lenet = import_spec(load_model("lenet", batch=16, image=20)).fingerprint
    assert during.overheads(in_steps, lenet)[:2] == pytest.approx(
        (own["fwd_task_us"] * 1e-6, own["bwd_task_us"] * 1e-6), abs=1e-7)
    assert doc["optimizer_steps"] == doc["own_steps"] == 2 and doc["calibration_own"]["max_abs_error"] >= 0
    assert all(r["simulated_calibration_own_s"] > 0 for r in doc["rows"])
    for r in doc["rows"]:   # profiled again after the steps, both ways, and simulated with each
        d = r["diagnosis"]
        assert r["peak_memory_bytes"] > 0
        assert d["simulated_after_steps_s"] > 0 and d["simulated_llc_s"] > 0
        assert d["error_llc"] == pytest.approx(d["simulated_llc_s"] / r["measured_s"] - 1)
    # The quick calibration measured the arrival noise: every row is reported with its waits
    # priced between mean arrivals too, never longer than with the noise.
    assert doc["mean_arrivals"]["max_abs_error"] >= doc["mean_arrivals"]["median_abs_error"] >= 0
    for r in doc["rows"]:
        assert 0 < r["simulated_mean_arrivals_s"] <= r["simulated_s"] * (1 + 1e-9)
    diag = doc["diagnosis"]
    assert diag["llc_evicted"]["max_abs_error"] >= diag["llc_evicted"]["median_abs_error"] >= 0
    assert diag["profile_after_steps"]["max_change"] >= diag["profile_after_steps"]["median_change"] >= 0
    # The model's data-parallel steps before the search, with its all-reduces and without, beside
    # the same plan simulated both ways: the simulated step with them is the data-parallel row's.
    sync = doc["model_overheads"]["lenet"]["sync_steps"]
    dp = next(r for r in doc["rows"] if r["strategy"] == "data-parallel")
    assert sync["simulated_with_s"] == dp["simulated_search_profile_s"] and sync["steps"] > 0
    # Where the model's steps showed its all-reduces adding nothing (a tiny model on a noisy machine:
    # `model_sync` clamps what they add at 0), its all-reduces cost nothing in the simulated step either.
    added = doc["model_overheads"]["lenet"].get("allreduce_in_step", 1.0) > 0
    assert 0 < sync["simulated_without_s"] and (sync["simulated_without_s"] < sync["simulated_with_s"] if added else
                                                sync["simulated_without_s"] == sync["simulated_with_s"])
    for how in ("with", "without"):
        assert sync[f"error_{how}"] == pytest.approx(sync[f"simulated_{how}_s"] / sync[f"measured_{how}_s"] - 1)
    speed = doc["machine_speed"]["per_model"]["lenet"]   # the probe around the profile and the steps
    assert len(speed["probes"]) == 4 and all(p["compute_s"] > 0 and p["memory_s"] > 0 for p in speed["probes"])
    assert all(p["cache_over_memory"] > 0 and p["pair_over_memory"] > 0 for p in speed["probes"])
    for part in PROBE_PARTS:
        assert speed[part]["steps_over_profile"] == pytest.approx(speed[part]["steps_s"] / speed[part]["profile_s"])
    # Kept, the run simulates again from its own profile to the same steps, row by row.
    assert json.loads((kept / RESULT).read_text()) == json.loads(json.dumps(doc))
    assert {p.name for p in kept.iterdir()} >= {PROFILE, RESULT, "lenet-during_steps.json", "lenet-after_steps.json",
                                                "lenet-llc.json", "lenet-messages.json.gz"}
    again = rescore([kept], progress=False)
    (run,) = again["runs"]
    assert run["messages_refitted"] == ["lenet"]     # its messages fitted again from the kept records, alike
    assert [(r["strategy"], r["measured_s"]) for r in run["rows"]] == [(r["strategy"], r["measured_s"])
                                                                      for r in doc["rows"]]
    for new, old in zip(run["rows"], doc["rows"]):
        assert new["simulated_s"] == pytest.approx(old["simulated_s"], rel=1e-12) == new["recorded_simulated_s"]
    assert run["now"]["median_abs_error"] == pytest.approx(doc["median_abs_error"])
    assert again["pooled"]["now"]["mean_error"] == pytest.approx(doc["mean_error"])
    with pytest.raises(KeptRunError, match="already holds a kept run"):
        run_accuracy_bench(models=(("lenet", {"batch": 16, "image": 20}),), progress=False, keep=kept)


def _parts(compute):
    return {"compute": compute, "transfer": 0.0, "synchronization": 0.0, "optimizer": 0.0, "overhead": 0.0}


def test_a_rows_diagnosis_places_its_measured_compute_between_the_two_profiles():
    from autopar.trainer.accuracy import _row_diagnosis
    sims = {"after_steps": (0.09, _parts(0.06), 1), "llc": (0.12, _parts(0.10), 1)}
    d = _row_diagnosis(0.1, _parts(0.07), sims)
    assert d["compute_cache_share"] == pytest.approx(0.25)          # 0.07 is a quarter of the way
    assert d["error_after_steps"] == pytest.approx(-0.1) and d["error_llc"] == pytest.approx(0.2)
    flat = {"after_steps": (0.09, _parts(0.06), 1), "llc": (0.09, _parts(0.0604), 1)}
    assert _row_diagnosis(0.1, _parts(0.07), flat)["compute_cache_share"] is None   # < 1 % apart: no share


def test_the_diagnosis_totals_are_the_rows_errors_under_each_profile():
    from autopar.trainer.accuracy import diagnosis_totals
    rows = []
    for sim, after, llc, share in ((1.0, 1.1, 1.3, 0.5), (2.0, 2.0, 2.2, None), (3.0, 2.7, 3.6, 1.5)):
        r = _row("a", f"s{sim}", sim, 2.0)
        r["diagnosis"] = {"simulated_after_steps_s": after, "error_after_steps": after / 2.0 - 1,
                          "simulated_llc_s": llc, "error_llc": llc / 2.0 - 1, "compute_cache_share": share}
        rows.append(r)
    d = diagnosis_totals(rows + [_row("b", "x", 1.0, 1.0)])       # a row without one is left out
    assert d["profile_after_steps"]["median_change"] == pytest.approx(0.1)
    assert d["profile_after_steps"]["max_change"] == pytest.approx(0.1)
    assert d["llc_evicted"]["median_abs_error"] == pytest.approx(0.35)
    assert d["llc_evicted"]["mean_error"] == pytest.approx((-0.35 + 0.1 + 0.8) / 3)
    assert d["compute_cache_share"] == {"median": 1.0, "min": 0.5, "max": 1.5}
    assert diagnosis_totals([_row("a", "x", 1.0, 1.0)]) is None


def _diagnosed(model, strategy, measured, after, llc):
    r = _row(model, strategy, after, measured)
    r["diagnosis"] = {"simulated_after_steps_s": after, "error_after_steps": after / measured - 1,
                      "simulated_llc_s": llc, "error_llc": llc / measured - 1, "compute_cache_share": None}
    return r


def test_one_cache_share_is_fitted_on_the_first_models_and_scored_on_the_others():
    from autopar.trainer.accuracy import cache_share_held_out
    rows = [_diagnosed("a", "x", 1.5, 1.0, 2.0), _diagnosed("a", "y", 2.0, 1.0, 2.0),      # shares 0.5, 1.0
            _diagnosed("a", "flat", 1.0, 1.0, 1.001),                                      # < 1 %: not fitted
            _diagnosed("b", "x", 1.25, 1.0, 1.5),                                          # share 0.5
            _diagnosed("c", "x", 2.0, 1.0, 3.0), _diagnosed("c", "y", 1.0, 1.0, 1.0)]
    got = cache_share_held_out(rows)
    assert got["share"] == pytest.approx(0.5) and got["fitted_on"] == ["a", "b"] and got["scored_on"] == ["c"]
    # c/x: 1 + 0.5 * 2 = 2.0 against 2.0; c/y: 1.0 against 1.0
    assert got["held_out"]["max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    rows[-2] = _diagnosed("c", "x", 1.6, 1.0, 3.0)                                      # 2.0 against 1.6
    assert cache_share_held_out(rows)["held_out"]["max_abs_error"] == pytest.approx(0.25)
    assert cache_share_held_out([r for r in rows if r["model"] == "a"]) is None          # nothing held out


def test_the_drift_is_each_parts_mean_around_the_steps_over_its_mean_around_the_profile():
    from autopar.trainer.accuracy import _drift
    probes = [{"compute_s": 1.0, "memory_s": 2.0, "cache_s": 0.1, "pair_s": 4.0},
              {"compute_s": 3.0, "memory_s": 2.0, "cache_s": 0.1, "pair_s": 4.0},
              {"compute_s": 3.0, "memory_s": 1.0, "cache_s": 0.3, "pair_s": 1.0},
              {"compute_s": 5.0, "memory_s": 1.0, "cache_s": 0.3, "pair_s": 1.0}]
    d = _drift(probes)
    assert d["compute"] == {"profile_s": 2.0, "steps_s": 4.0, "steps_over_profile": 2.0}
    assert d["memory"]["steps_over_profile"] == 0.5 and d["probes"] == probes
    assert d["cache"]["steps_over_profile"] == pytest.approx(3.0)
    assert d["pair"]["steps_over_profile"] == 0.25
    assert "steal" not in d                   # no CPU clock read (not Linux): no steal reported
    clocks = [(0.0, 0.0), (100.0, 2.0), (150.0, 2.0), (350.0, 12.0)]
    d = _drift([{**p, "cpu_s": c, "steal_s": st} for p, (c, st) in zip(probes, clocks)])
    assert d["steal"] == {"profile": pytest.approx(0.02), "steps": pytest.approx(0.05)}


def test_the_cpu_clock_reads_the_steal_column_of_linuxs_stat(tmp_path):
    import os

    from autopar.trainer.accuracy import cpu_clock
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {6 * hz} 0 {2 * hz} {10 * hz} 0 0 0 {2 * hz} {hz} 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert cpu_clock(str(stat)) == {"cpu_s": pytest.approx(20.0), "steal_s": pytest.approx(2.0)}   # guest is in user
    stat.write_text("intr 1 2 3\n")
    assert cpu_clock(str(stat)) == {} and cpu_clock(str(tmp_path / "none")) == {}


def test_the_speed_probe_times_one_thread_and_gives_the_threads_back():
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        probe = speed_probe(repeats=3)
        timed = {"compute_s", "memory_s", "cache_s", "cache_over_memory", "pair_s", "pair_over_memory"}
        assert set(probe) - timed <= {"cpu_s", "steal_s"} and timed <= set(probe)
        assert probe["pair_over_memory"] == pytest.approx(probe["pair_s"] / probe["memory_s"])
        assert all(probe[k] > 0 for k in timed) and probe.get("steal_s", 0.0) >= 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_pair_pass_runs_the_peer_on_another_core_each_repeat_and_gives_the_mask_back():
    import os
    import threading
    from autopar.trainer.accuracy import _pair_pass
    mask = os.sched_getaffinity(0)
    cpus = sorted(mask)
    where, calls = [], []

    def peer():
        calls.append(threading.get_ident())
        where.append(os.sched_getaffinity(0))

    def work():
        where.append(("work", os.sched_getaffinity(0)))
    assert _pair_pass(work, peer, repeats=4) >= 0
    assert len(calls) == 5 and threading.get_ident() not in calls        # one warm-up, 4 timed
    assert all(w == {cpus[1 % len(cpus)]} for w in where if not isinstance(w, tuple))
    assert all(w[1] == {cpus[0]} for w in where if isinstance(w, tuple))
    assert os.sched_getaffinity(0) == mask


def test_a_pair_pass_whose_peer_fails_raises_its_error_instead_of_waiting():
    import os
    from autopar.trainer.accuracy import _pair_pass
    mask = os.sched_getaffinity(0)

    def peer():
        raise MemoryError("no room for the peer's buffer")
    with pytest.raises(MemoryError, match="peer's buffer"):
        _pair_pass(lambda: None, peer, repeats=3)
    assert os.sched_getaffinity(0) == mask


def _logging_trainer(log: list, entry):
    """A stand-in for `Trainer` whose steps append ``entry(job, step)`` to `log`."""
    class LoggingTrainer:
        def __init__(self, job, rank, world, groups):
            self.job = job
            self.runtime = type("R", (), {"phases": {}})()

        def train_step(self, step):
            log.append(entry(self.job, step))
    return LoggingTrainer


def test_strategies_train_in_blocks_of_consecutive_steps(monkeypatch):
    """Each strategy's timed steps come in `ROUNDS` blocks of consecutive steps (a user's run
    steps one strategy after another), each block after its warm-up, in reverse order every
    other round; every job gets `steps` timed steps and its step numbers run on."""
    from autopar.trainer import accuracy
    log = []
    monkeypatch.setattr(accuracy, "Trainer", _logging_trainer(log, lambda job, step: (job, step)))
    monkeypatch.setattr(accuracy.dist, "barrier", lambda: None)
    out = accuracy._measure(0, 2, ["a", "b"], warmup=5, steps=30)
    assert [len(o) for o in out] == [30, 30]
    jobs = [j for j, _ in log]
    block = 5 + 10
    assert jobs[:block] == ["a"] * block and jobs[block:2 * block] == ["b"] * block
    assert jobs[2 * block:2 * block + 2 + 10] == ["b"] * 12          # round 2 reversed, 2 re-warm steps
    for name in "ab":
        assert [s for j, s in log if j == name] == list(range(5 + 30 + 2 * accuracy.REWARM))


def test_more_steps_come_in_more_blocks_of_about_ten(monkeypatch):
    """90 timed steps come in 9 blocks of 10 per strategy, not 3 of 30: a longer measurement
    spreads over more of the machine's spells, and the ops get a pass per block round."""
    from autopar.trainer import accuracy
    assert [accuracy.rounds(n) for n in (3, 30, 45, 90)] == [3, 3, 4, 9]
    log = []
    monkeypatch.setattr(accuracy, "Trainer", _logging_trainer(log, lambda job, step: job))
    monkeypatch.setattr(accuracy.dist, "barrier", lambda: None)
    out = accuracy._measure(0, 2, ["a", "b"], warmup=5, steps=90)
    assert [len(o) for o in out] == [90, 90]
    runs = [len(list(g)) for _, g in itertools.groupby(log)]
    assert runs == [15, 27] + [24] * 7 + [12]          # 5 + 10, then 2 + 10 a block; rounds alternate order
    assert [len(list(g)) for k, g in itertools.groupby(log) if k == "a"] == [15, 24, 24, 24, 24]


def test_the_ops_are_timed_between_the_blocks_one_pass_a_round(monkeypatch):
    """With a profile to take, each round passes over the model's task shapes once, a share of
    them before each block, in lockstep with the other ranks (`lockstep_task` at the barrier)."""
    from autopar.planner import cost
    from autopar.trainer import accuracy
    log = []

    def fake_task(graph, module, kind, item, sync, **kw):
        assert (graph, module, kind, sync) == ("graph", "module", "CPU-core", accuracy.dist.barrier)
        log.append(("op", item))
        return (1.0, 2.0, None)

    job = type("J", (), {"graph": "graph", "spec": type("S", (), {"module": "module"})()})
    jobs = [type("J", (job,), {"name": n}) for n in "ab"]
    monkeypatch.setattr(accuracy, "Trainer", _logging_trainer(log, lambda job, step: ("step", job.name)))
    monkeypatch.setattr(accuracy.dist, "barrier", lambda: None)
    monkeypatch.setattr(cost, "lockstep_task", fake_task)
    monkeypatch.setattr(cost, "engine_overhead", lambda device: (0.0, 0.0))
    items = ["i0", "i1", "i2"]
    steps, passes, chains, own = accuracy._measure(0, 2, jobs, warmup=1, steps=3, profile=(items, "CPU-core", 5))
    assert [len(o) for o in steps] == [3, 3] and passes == [[(1.0, 2.0, None)] * accuracy.rounds(3)] * 3
    assert chains == [] and own == {}
    # Round 1: i0 before a's block, i1 and i2 before b's; round 2 (reversed): i0 before b's block.
    assert log[:4] == [("op", "i0"), ("step", "a"), ("step", "a"), ("op", "i1")]
    assert log[4:7] == [("op", "i2"), ("step", "b"), ("step", "b")]
    assert log[7:9] == [("op", "i0"), ("step", "b")]


def test_the_messages_are_timed_between_the_blocks_a_share_of_their_steps_each_round(monkeypatch):
    """With `messages`, each round steps both in-situ workloads at every batch, a share of them
    before each block, each batch's timed steps after one untimed step; over the rounds every
    batch gets `messages` timed steps, and its step numbers run on."""
    from autopar.trainer import accuracy, calibrate
    log = []

    class FakeChain:
        def __init__(self, rank, world, one_way=False):
            self.one_way, self.out = one_way, {}

        def step(self, batch, s, timed=True):
            log.append(("msg", self.one_way, batch, s, timed))
            self.out.setdefault(batch, []).append(s) if timed else None

    monkeypatch.setattr(accuracy, "Trainer", _logging_trainer(log, lambda job, step: ("step", job)))
    monkeypatch.setattr(accuracy.dist, "barrier", lambda: None)
    monkeypatch.setattr(calibrate, "InSituSteps", FakeChain)
    monkeypatch.setattr(calibrate, "IN_SITU_BATCHES", (2, 8))
    steps, passes, chains, own = accuracy._measure(0, 2, ["a", "b"], warmup=1, steps=3, messages=7)
    assert [len(o) for o in steps] == [3, 3] and passes == [] and own == {}
    # 7 timed steps in 3 rounds: 3, 2, 2, each batch's after one untimed step; numbers run on.
    assert chains == [{2: [1, 2, 3, 5, 6, 8, 9], 8: [1, 2, 3, 5, 6, 8, 9]}] * 2
    # Round 1: two-way 2 and 8 before a's block, one-way 2 and 8 before b's.
    first = [(e[1], e[2]) for e in log[:20] if e[0] == "msg"]
    assert first == [(False, 2)] * 4 + [(False, 8)] * 4 + [(True, 2)] * 4 + [(True, 8)] * 4
    assert log[8] == ("step", "a") and log[8 + 2 + 8] == ("step", "b")


def test_the_optimizer_and_the_whole_model_are_timed_between_the_blocks_too(monkeypatch):
    """With `optimizer` and `own`, each round steps every optimizer case and the model whole on
    the rank, each a share of its timed steps after one untimed step, spread over the blocks."""
    from autopar.trainer import accuracy, calibrate
    log = []

    class FakeOptimizer:
        def __init__(self, rank, world, cases, name):
            assert name == "sgd" and len(cases) == 6
            self.trainers, self.out = [None] * 2, [[], []]

        def step(self, case, s, timed=True):
            log.append(("opt", case, s, timed))
            self.out[case] += [s] if timed else []

        def samples(self):
            return self.out

    class FakeWhole:
        def __init__(self, trainer):
            assert trainer.job.strategy.name == "single-device" and trainer.job.graph is graph
            self.timed = []

        def step(self, s, timed=True):
            log.append(("own", s, timed))
            self.timed += [s] if timed else []

        def result(self):
            return {"steps": self.timed}

    from autopar.planner.ir import data_parallel
    from autopar.trainer.optim import OptimizerConfig
    from autopar.trainer.train import Job, TrainConfig
    spec = load_model("lenet", batch=4, image=12)
    graph = import_spec(spec)
    jobs = [Job(TrainConfig(model="lenet", optimizer=OptimizerConfig("sgd"), log=False), spec, graph,
                data_parallel(graph, 2)) for _ in "ab"]
    monkeypatch.setattr(accuracy, "Trainer", _logging_trainer(log, lambda job, step: ("step", job.strategy.name)))
    monkeypatch.setattr(accuracy.dist, "barrier", lambda: None)
    monkeypatch.setattr(calibrate, "OptimizerSteps", FakeOptimizer)
    monkeypatch.setattr(calibrate, "ModelOverheadSteps", FakeWhole)
    steps, passes, chains, own = accuracy._measure(0, 2, jobs, warmup=1, steps=3, optimizer=4, own=3)
    assert [len(o) for o in steps] == [3, 3] and passes == [] and chains == []
    # 4 timed steps in 3 rounds: 2, 1, 1, each share after an untimed step; the numbers run on.
    assert own == {"optimizer": [[1, 2, 4, 6]] * 2, "overheads": {"steps": [1, 3, 5]}}
    # Round 1: the first optimizer case before the first block, the second and the whole model before
    # the second block.
    assert [e[0] for e in log[:12]] == ["opt"] * 3 + ["step"] * 2 + ["opt"] * 3 + ["own"] * 2 + ["step"] * 2


def _records(slow, one_way, rank):
    """Rank `rank`'s in-situ records, 4 steps a batch: every message takes `slow` or twice that
    (odd steps); two-way, both ranks receive in both calls that move bytes, rank 1 entering the
    first 0.1 ms late, and between them a call that moves nothing; one way, rank 0 sends in the
    first call and rank 1 in the second."""
    from autopar.trainer.calibrate import IN_SITU_BATCHES
    out = {}
    for k, batch in enumerate(IN_SITU_BATCHES):
        size, steps = 1024 * (k + 1), []
        for s in range(4):
            t, lat = 10.0 * s + k, slow * (1 + s % 2)
            if one_way:
                calls = ([(t, t + 1e-5, 0), (t + 0.01 + 1e-5, t + 0.01 + lat, size)] if rank == 0 else
                         [(t + 1e-5, t + lat, size), (t + 0.01, t + 0.01 + 1e-5, 0)])
            else:
                calls = [(t + 1e-4 * rank, t + lat, size), (t + 0.005, t + 0.005 + 1e-6, 0),
                         (t + 0.01, t + 0.01 + slow, size)]
            steps.append(calls)
        out[batch] = {"times": [0.01] * 4, "calls": steps, "staging": [[(1e-5, size, 1)] * 4] * 4,
                      "posting": [(1e-5, 2)] * 4, "send_waits": [(2e-5, 1)] * 4}
    return out


def test_the_messages_timed_between_the_blocks_replace_the_calibrations_own():
    """`message_calibration` puts what the in-situ workloads measured in place of the
    calibration's messages (latencies, staging, arrival noise) and keeps the rest."""
    from autopar.planner.cost import Curve, default_calibration
    from autopar.trainer import accuracy
    records = _records

    cal = default_calibration("CPU-core", "gloo", 2)
    chains = [[records(1e-3, False, r), records(2e-3, True, r)] for r in (0, 1)]
    got = accuracy.message_calibration(cal, chains)
    assert got.optimizer == cal.optimizer and got.allreduce == cal.allreduce and got.fwd_task_s == cal.fwd_task_s
    assert got.p2p != cal.p2p and got.p2p_oneway is not None and got.send_call is not None
    assert got.post_s == pytest.approx(5e-6) and got.send_wait_s == pytest.approx(2e-5)
    assert got.latency_var is not None and got.leave_var is not None
    assert dict(got.details)["messages_between_blocks"] is True
    # Two-way: from the later entry to the return, the mean (1.4 ms in the first calls, 1 ms in the
    # second); one way: from the sender's entry to the receiver's return, the median (1.5 x 2 ms).
    assert got.p2p(1024) == pytest.approx(1.2e-3) and got.p2p(3072) == pytest.approx(1.2e-3)
    assert got.p2p_oneway(2048) == pytest.approx(3e-3)
    assert got.p2p(64 << 20) > got.p2p(4 << 20) > got.p2p(1 << 20)     # beyond, the microbenchmark's shape
    assert "one-way" in accuracy.message_line(got) and isinstance(got.p2p, Curve)


def test_kept_in_situ_records_fit_the_same_messages_without_the_calls_that_moved_nothing(tmp_path):
    """`keep_messages` drops the calls in which no rank received a byte and nothing else: the
    messages fitted from what `kept_messages` reads back are the ones fitted from the records."""
    import gzip

    from autopar.planner.cost import default_calibration
    from autopar.trainer import accuracy
    cal = default_calibration("CPU-core", "gloo", 2)
    chains = [[_records(1e-3, False, r), _records(2e-3, True, r)] for r in (0, 1)]
    path = tmp_path / "m-messages.json.gz"
    accuracy.keep_messages(path, chains)
    back = accuracy.kept_messages(path)
    batch = min(back[0][0])
    assert [len(step) for step in back[0][0][batch]["calls"]] == [2] * 4      # the call that moved nothing is gone
    assert [len(step) for step in back[1][1][batch]["calls"]] == [2] * 4      # one-way: each call moves bytes one way
    assert back[0][0][batch]["times"] == chains[0][0][batch]["times"]
    fitted, again = accuracy.message_calibration(cal, chains), accuracy.message_calibration(cal, back)
    for field in accuracy.MESSAGE_FIELDS:
        assert getattr(again, field) == getattr(fitted, field), field
    path.write_bytes(gzip.compress(b'{"version": 2, "ranks": []}'))
    with pytest.raises(accuracy.KeptRunError, match="m-messages.json.gz: not the in-situ records .*version 2"):
        accuracy.kept_messages(path)
    path.write_text("not gzip")
    with pytest.raises(accuracy.KeptRunError, match="BadGzipFile.*moving it away, or keep a new run"):
        accuracy.kept_messages(path)


def test_the_residual_factor_is_fitted_on_some_models_and_scored_on_the_others():
    from autopar.trainer.accuracy import residual
    rows = [{"model": m, "simulated_s": sim, "measured_s": meas}
            for m, sim, meas in [("a", 1.0, 1.2), ("a", 2.0, 2.4), ("b", 1.0, 1.2), ("c", 1.0, 1.2), ("d", 1.0, 1.32)]]
    res = residual(rows)
    assert res["factor"] == pytest.approx(1.2) and res["fitted_on"] == ["a", "b"] and res["scored_on"] == ["c", "d"]
    assert res["held_out"]["max_abs_error"] == pytest.approx(1 - 1.2 / 1.32)
    assert res["held_out"]["median_abs_error"] == pytest.approx((1 - 1.2 / 1.32) / 2)
    assert residual(rows[:2]) is None


def test_each_models_level_is_fitted_on_its_other_rows_and_scored_on_the_row():
    from autopar.trainer.accuracy import model_levels
    # Model a: every row simulated 20 % low, so its level prices each row from the others exactly.
    # Model b: its rows off by 0 %, +10 % and -10 %.
    rows = [{"model": m, "simulated_s": sim, "measured_s": meas, "error": sim / meas - 1.0}
            for m, sim, meas in [("a", 1.0, 1.25), ("a", 2.0, 2.5), ("a", 3.0, 3.75),
                                 ("b", 1.0, 1.0), ("b", 1.1, 1.0), ("b", 0.9, 1.0)]]
    levels = model_levels(rows)
    a, b = levels["per_model"]["a"], levels["per_model"]["b"]
    assert a["factor"] == pytest.approx(1.25) and a["mean_error"] == pytest.approx(-0.2) and a["sd_error"] < 1e-12
    assert b["factor"] == pytest.approx(1.0) and b["rows"] == 3 and b["sd_error"] == pytest.approx(0.0816, abs=1e-4)
    # Held out, a's rows are exact; each of b's is priced at the median of measured / simulated over
    # the other two (its own measurement never prices it): 1.0 at (1/1.1 + 1/0.9) / 2, 1.1 at
    # (1 + 1/0.9) / 2, 0.9 at (1 + 1/1.1) / 2.
    held = [0.0, 0.0, 0.0, (1 / 1.1 + 1 / 0.9) / 2 - 1, 1.1 * (1 + 1 / 0.9) / 2 - 1, 0.9 * (1 + 1 / 1.1) / 2 - 1]
    assert levels["held_out"]["max_abs_error"] == pytest.approx(max(map(abs, held)))
    assert levels["held_out"]["mean_error"] == pytest.approx(sum(held) / 6)
    assert model_levels([rows[0], rows[3]]) is None        # one row per model: nothing to hold out


def test_the_table_prints_every_row_the_totals_and_the_fits_held_out(capsys):
    from autopar.trainer.accuracy import diagnosis_totals, print_table
    rows = []
    for model, k in (("a", 1.0), ("b", 1.1), ("c", 1.2)):
        for strategy, sim in (("data-parallel", 1.0), ("searched", 0.8)):
            r = _diagnosed(model, strategy, sim * k * 1.1, sim * k, sim * k * 1.2)
            r.update(off="compute under by 1.0 ms", simulated_s=sim * k)
            rows.append(r)
    doc = {"world_size": 2, "measured_steps": 30, "warmup_steps": 5, "rows": rows, **totals(rows),
           "diagnosis": diagnosis_totals(rows)}
    print_table(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("compute under by 1.0 ms") == len(rows) and "Kendall tau" in out
    assert "residual factor" in out and "one cache share for the machine" in out
    assert "fitted on a, b (not applied above): on c it would leave median |error|" in out
    assert "each model's level, measured / simulated over its rows (not applied above): a " in out
    assert "each row at the level of its model's other rows: median |error|" in out


def test_the_one_gpu_script_runs_the_benchmarks_models_at_its_sizes():
    """benchmarks/gpu/one-gpu.sh is the benchmark's counterpart on one GPU: its models' options must stay
    the benchmark's (`MODELS`), so that a GPU run compares with the CPU rows."""
    import re
    import subprocess
    from pathlib import Path

    from autopar.trainer.accuracy import MODELS

    script = Path(__file__).parents[2] / "benchmarks" / "gpu" / "one-gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    variables = {"rnnlm": "RNN", "alexnet": "ALEX", "transformer": "TRF", "tagger:tagger": "TAG"}
    for model, options in MODELS:
        line = re.search(rf'^{variables[model]}="([^"]*)"$', text, re.M)
        assert line, f"{script.name} sets no {variables[model]} for {model}"
        given = dict(o.split("=", 1) for o in line.group(1).replace("-o ", "").split())
        assert given == {k: str(v) for k, v in options.items()}, model


def test_the_optimizer_timed_between_the_blocks_replaces_the_benchmarks_own_and_keeps_the_others():
    import dataclasses

    from autopar.planner.cost import default_calibration
    cal = default_calibration("CPU-core", "gloo", 2)
    # each rank's (tensors, bytes, median seconds) per case: 10 us per tensor, 1 ns per byte
    per_rank = [{"optimizer": [(t, float(b), f * (10e-6 * t + 1e-9 * b)) for t, b in ((4, 1 << 14), (16, 1 << 22))]}
                for f in (1.0, 1.2, 0.8)]
    tuned = own_calibration(cal, per_rank + [{}], "sgd")
    assert tuned.optimizer_time("sgd", 8, 1 << 20) == pytest.approx(8 * 10e-6 + (1 << 20) * 1e-9, rel=1e-9)
    assert tuned.optimizer_time("adam", 8, 1 << 20) == cal.optimizer_time("adam", 8, 1 << 20)
    assert dict(tuned.details)["optimizer_between_blocks"][1][:2] == [16, float(1 << 22)]
    assert dataclasses.replace(tuned, optimizer=cal.optimizer) == cal          # nothing else moved
    assert own_calibration(cal, [{}, {}], "sgd") is cal
