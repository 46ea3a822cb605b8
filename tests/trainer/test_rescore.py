"""Kept accuracy runs: what a folder must hold, and the errors that say what is wrong with one."""

from __future__ import annotations

import json

import pytest

from autopar.cli import main
from autopar.trainer.rescore import (PROFILE, RESULT, KeptRunError, _summary, keep_folder, plan_offsets, print_rescore,
                                     rescore, rescore_run)


def test_a_new_folder_is_created_to_keep_a_run_in(tmp_path):
    folder = keep_folder(tmp_path / "a" / "b")
    assert folder.is_dir() and not any(folder.iterdir())
    assert keep_folder(folder) == folder          # empty: still free


@pytest.mark.parametrize("name", [PROFILE, RESULT])
def test_a_kept_run_is_never_written_over(tmp_path, name):
    (tmp_path / name).write_text("{}")
    with pytest.raises(KeptRunError, match=f"already holds a kept run \\({name}\\); name a new folder"):
        keep_folder(tmp_path)
    assert (tmp_path / name).read_text() == "{}"


def test_a_file_is_not_a_folder_to_keep_in(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(KeptRunError, match="it is a file, not a folder"):
        keep_folder(tmp_path / "f")


def test_a_folder_without_a_run_says_how_to_keep_one(tmp_path):
    with pytest.raises(KeptRunError, match=f"not a kept accuracy run \\(no {RESULT} or {PROFILE}\\).*--keep"):
        rescore_run(tmp_path)


def test_a_damaged_result_is_named(tmp_path):
    (tmp_path / RESULT).write_text(json.dumps({"rows": [{"model": "m"}], "models": [], "calibration": {}}))
    (tmp_path / PROFILE).write_text("{}")
    with pytest.raises(KeptRunError, match=f"{RESULT}: not the JSON `autopar bench accuracy` writes"):
        rescore_run(tmp_path)


def test_a_profile_this_code_cannot_read_is_named(tmp_path):
    (tmp_path / RESULT).write_text(json.dumps({"rows": [], "models": [], "calibration": {}}))
    (tmp_path / PROFILE).write_text(json.dumps({"version": 999, "entries": {}}))
    with pytest.raises(KeptRunError, match="its profile cannot be read by this autopar.*format version 999"):
        rescore_run(tmp_path)


def test_a_profile_without_a_calibration_is_refused(tmp_path):
    from autopar.planner.cost.profile_cache import FORMAT_VERSION
    (tmp_path / RESULT).write_text(json.dumps({"rows": [], "models": [], "calibration": {}}))
    (tmp_path / PROFILE).write_text(json.dumps({"version": FORMAT_VERSION, "method": 0, "entries": {}}))
    with pytest.raises(KeptRunError, match="holds no runtime calibration"):
        rescore_run(tmp_path)


def test_a_kept_profile_is_read_as_measured_whatever_the_method(tmp_path):
    from autopar.planner.cost import ProfileCache
    from autopar.planner.cost.calibration import default_calibration
    old = default_calibration("cpu", "gloo", 2).to_json()
    old.update(source="measured", method=1)
    (tmp_path / PROFILE).write_text(json.dumps({"version": 1, "method": 1, "entries": {"k": {"forward": 1.0,
                                                                                            "backward": 2.0}},
                                                "calibrations": {"x": old}}))
    assert len(ProfileCache.load(tmp_path / PROFILE)) == 0          # to plan, measured again
    kept = ProfileCache.load(tmp_path / PROFILE, keep_stale=True)  # to replay, as measured
    assert kept.get("k") == (1.0, 2.0) and [c.method for c in kept.calibrations()] == [1]


def test_rescore_needs_a_folder():
    with pytest.raises(KeptRunError, match="name at least one folder"):
        rescore([])


def _row(model, strategy, sim, meas):
    return {"model": model, "strategy": strategy, "simulated_s": sim, "measured_s": meas, "cv": 0.01,
            "error": sim / meas - 1}


def test_the_summary_has_the_rms_error_and_counts_the_targets_met():
    rows = [_row("m", "data-parallel", 1.1, 1.0), _row("m", "searched", 0.9, 0.5), _row("m", "x", 2.0, 2.0)]
    s = _summary(rows)
    assert s["rms_error"] == pytest.approx(((0.1 ** 2 + 0.8 ** 2 + 0) / 3) ** 0.5)
    assert s["targets_met"] == sum(s["met"].values()) and s["met"]["searched_vs_best_measured"] is True
    # Each row at the level of the other two: the searched row at the median of 1/1.1 and 2/2 is
    # the furthest off, the data-parallel one at that of 0.5/0.9 and 2/2 the closest.
    held = [1.1 * (0.5 / 0.9 + 1.0) / 2 - 1, 0.9 * (1 / 1.1 + 1.0) / 2 / 0.5 - 1, (1 / 1.1 + 0.5 / 0.9) / 2 - 1]
    assert s["at_model_level"]["max_abs_error"] == pytest.approx(max(map(abs, held)))
    assert s["at_model_level"]["median_abs_error"] == pytest.approx(sorted(map(abs, held))[1])
    assert _summary(rows[:1])["at_model_level"] is None          # one row: no level to hold out


def test_a_plan_off_the_same_way_in_every_run_stands_out_from_its_models_level():
    # Two runs whose model level moved by 20 points; the model-parallel row sits 10 above the level
    # in both, the random one 10 below, data parallelism at it.
    runs = [{"rows": [{"model": "m", "strategy": "dp", "error": lvl},
                      {"model": "m", "strategy": "mp", "error": lvl + 0.1},
                      {"model": "m", "strategy": "random", "error": lvl - 0.1},
                      {"model": "n", "strategy": "dp", "error": 0.05}]} for lvl in (-0.1, 0.1)]
    off = plan_offsets(runs)
    assert off["levels"]["m"] == pytest.approx({"runs": 2, "mean_error": 0.0, "sd_error": 0.1})
    assert off["levels"]["n"]["sd_error"] == 0.0
    top = off["plans"][:2]
    assert {p["strategy"] for p in top} == {"mp", "random"}
    assert all(abs(p["mean_offset"]) == pytest.approx(0.1) and p["sd_offset"] == pytest.approx(0.0) for p in top)
    assert [p["mean_offset"] for p in off["plans"] if p["strategy"] == "dp"] == pytest.approx([0.0, 0.0])
    assert plan_offsets(runs[:1]) is None                        # one run: nothing to compare across


def test_the_rescore_table_lists_the_plans_offsets(capsys):
    rows = [_row("m", "data-parallel", 1.1, 1.0), _row("m", "searched", 0.9, 1.0)]
    runs = [{"folder": f"run{k}", "rows": rows, "now": _summary(rows), "recorded": _summary(rows)} for k in (1, 2)]
    print_rescore({"runs": runs, "pooled": {"rows": 4, "now": _summary(rows + rows), "recorded": _summary(rows + rows)},
                   "offsets": plan_offsets(runs)})
    out = capsys.readouterr().out
    assert "each model's level over the runs, now: m +0.0 % (sd 0.0 %)" in out
    assert "data-parallel" in out and "+10.0 %" in out and "-10.0 %" in out


def test_the_cli_refuses_keep_and_rescore_where_they_do_not_apply(tmp_path, capsys):
    assert main(["bench", "runtime", "--keep", str(tmp_path)]) == 2
    assert "--keep and --rescore are options of `autopar bench accuracy`" in capsys.readouterr().err
    assert main(["bench", "accuracy", "--rescore", str(tmp_path), "--quick"]) == 2
    assert "--rescore measures nothing" in capsys.readouterr().err
    assert main(["bench", "accuracy", "--rescore", str(tmp_path)]) == 2
    assert "not a kept accuracy run" in capsys.readouterr().err


def _kept_with_row_profile(tmp_path, row_profile):
    from autopar.planner.cost.calibration import default_calibration
    from autopar.planner.cost.profile_cache import FORMAT_VERSION, MEASUREMENT_METHOD
    cal = default_calibration("CPU-core", "gloo", 2).to_json()
    (tmp_path / PROFILE).write_text(json.dumps({"version": FORMAT_VERSION, "method": MEASUREMENT_METHOD,
                                                "entries": {}, "calibrations": {"c": cal}}))
    (tmp_path / RESULT).write_text(json.dumps({"rows": [], "models": [{"model": "lenet", "options": {"batch": 4}}],
                                               "calibration": {}, "row_profile": row_profile}))


def test_rows_priced_with_the_ops_timed_between_the_steps_need_them_kept(tmp_path):
    _kept_with_row_profile(tmp_path, "during_steps")
    with pytest.raises(KeptRunError, match="lenet-during_steps.json is missing; keep the run whole"):
        rescore_run(tmp_path)
    (tmp_path / "lenet-during_steps.json").write_text("{}")
    with pytest.raises(KeptRunError, match="lenet-during_steps.json cannot be read by this autopar"):
        rescore_run(tmp_path)


def test_the_ops_timed_between_the_steps_take_the_search_profiles_cold_times_where_they_have_none():
    from autopar.planner.cost import ProfileCache, cold_kind
    from autopar.trainer.retime import with_cold_of
    warm, cold = "CPU-core (2 per host)|relu|float32|in=4x8|out=4x8|par=|{}", \
        f"{cold_kind('CPU-core (2 per host)')}|relu|float32|in=4x8|out=4x8|par=|{{}}"
    other = f"{cold_kind('CPU-core (2 per host)')}|relu|float32|in=8x8|out=8x8|par=|{{}}"
    search = ProfileCache({warm: (1e-6, 2e-6), cold: (3e-6, 5e-6), other: (7e-6, 9e-6)})
    during = with_cold_of(ProfileCache({warm: (1.5e-6, 2.5e-6)}), search)
    assert during.get(warm) == (1.5e-6, 2.5e-6) and during.get(cold) == (3e-6, 5e-6)   # its warm times stay
    assert other not in during                                  # a task it did not time is not its to price
    own = ProfileCache({warm: (1.5e-6, 2.5e-6), cold: (4e-6, 6e-6)})
    assert with_cold_of(own, search).get(cold) == (4e-6, 6e-6)                         # its own cold times stay


def test_a_rescore_prices_with_a_row_profile_it_knows(tmp_path, capsys):
    with pytest.raises(KeptRunError, match="--row-profile 'after': choose one of search, during_steps"):
        rescore([tmp_path], progress=False, row_profile="after")
    _kept_with_row_profile(tmp_path, "search")
    with pytest.raises(KeptRunError, match="lenet-during_steps.json is missing"):
        rescore_run(tmp_path, row_profile="during_steps")
    assert main(["bench", "accuracy", "--row-profile", "search"]) == 2
    assert "--row-profile prices kept runs again" in capsys.readouterr().err


def test_rows_priced_some_unknown_way_are_not_replayed_another(tmp_path):
    _kept_with_row_profile(tmp_path, "the median of three")
    with pytest.raises(KeptRunError, match="priced with 'the median of three', which this autopar does not know"):
        rescore_run(tmp_path)
