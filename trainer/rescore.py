"""Kept accuracy runs, simulated again with the code as it is now.

    autopar bench accuracy --json --keep runs/a      # a full run, kept in runs/a
    autopar bench accuracy --rescore runs/*          # its rows (and others') simulated again

One run of `autopar bench accuracy` is one sample of a noisy machine: on the 2-vCPU VM its totals
moved by more between runs minutes apart (median 4.9-11.0 %, mean -6.4 to +0.5 %) than most
changes to the simulator move them (docs/simulation.md, "Nineteenth round").  A change judged on
the next run alone is judged on the noise.  So a run can be kept: its profile cache, with the
runtime calibration and the op times the search used (which priced the rows), each model's op
times taken between the blocks of its steps (which priced them instead in three runs whose JSON
says so, ``row_profile``), the two diagnosis profiles taken after them, and the benchmark's JSON
with every row's plan and measured step.
`rescore` rebuilds each kept row's strategy from its plan, simulates it from the kept profiles with
the code as it is now, and reports the errors against the same measured steps, run by run and
pooled over all the runs given.  A change to the simulator is then scored on every kept run at
once, in seconds, and a change that only moves the noise shows as such.

The measured side never changes: ``cv``, ``searched_vs_best_measured`` and Kendall's tau's pairs
are the runs' own.  Nor do the kept profiles: a run kept before a change to how the ops or the
runtime are measured (`planner.cost.profile_cache.MEASUREMENT_METHOD`, `CALIBRATION_METHOD`) is
simulated from what was measured then, and each run reports the methods it was measured by.  A
rescore replays the simulator, not the measurements: a change to what is measured is judged on
new runs.  One fit is replayed too: runs kept since the forty-ninth round keep the in-situ
workloads' records from between each model's blocks (``<model>-messages.json.gz``), and their
rows' messages and arrival noise are fitted again from them (``messages_refitted``), so that a
change to that fit (`trainer.calibrate.in_step_messages`) is scored on them at once.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from autopar.planner.errors import AutoparError

from .accuracy import (_EXAMPLES, _OPT, DURING_STEPS, LLC, MESSAGES, PROFILE, RESULT, ROW_PROFILES, WORLD, KeptRunError,
                       _message_fields, keep_folder, kept_messages, message_calibration, record, totals)
from .retime import with_cold_of


def _world(doc: dict[str, Any]) -> int:
    """The number of ranks a kept run trained and profiled with, side by side on one host."""
    return int(doc.get("world_size", WORLD))


def _load(folder: Path) -> tuple[dict[str, Any], Any, dict[str, int]]:
    """(the benchmark's JSON, the profile cache, the methods it was measured by) of a kept run, or a
    `KeptRunError` naming what is wrong."""
    from autopar.planner.cost import ProfileCache
    from autopar.planner.errors import CostModelError
    result, profile = folder / RESULT, folder / PROFILE
    missing = [p.name for p in (result, profile) if not p.is_file()]
    if missing:
        raise KeptRunError(f"{folder}: not a kept accuracy run (no {' or '.join(missing)}); keep one with "
                           f"`autopar bench accuracy --keep {folder}`")
    try:
        doc = json.loads(result.read_text(encoding="utf-8"))
        rows = doc["rows"]
        if not isinstance(rows, list) or not all({"model", "strategy", "plan", "measured_s"} <= set(r) for r in rows):
            raise KeyError("rows")
        doc["models"], doc["calibration"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KeptRunError(f"{result}: not the JSON `autopar bench accuracy` writes ({type(e).__name__}: {e}); "
                           "keep the run again") from e
    try:
        # as it was measured, whatever the method; an older file's CPU keys as its workers measured them
        cache = ProfileCache.load(profile, keep_stale=True, host_workers=_world(doc))
    except CostModelError as e:
        raise KeptRunError(f"{folder}: its profile cannot be read by this autopar ({e}); keep a new run") from e
    if not cache.calibrations():
        raise KeptRunError(f"{folder}: its profile ({profile}) holds no runtime calibration, so its rows cannot be "
                           "simulated as the trainer runs them; keep a new run")
    methods = {"profile": int(json.loads(profile.read_text(encoding="utf-8")).get("method", 1)),
               "calibration": min(c.method for c in cache.calibrations())}
    return doc, cache, methods


def _row_costs(folder: Path, doc: dict[str, Any], cache: Any, model: str, how: str) -> Any:
    """The op times `how` (`ROW_PROFILES`) prices `model`'s rows of a kept run with: the search's
    profile, or the ops timed between the steps' blocks with the search's profile's times with the
    last-level cache evicted (`with_cold_of`), with the run's calibration, or where the file holds
    one (`trainer.accuracy.message_calibration`, `own_calibration`, `own_overheads`), with its
    messages, optimizer and the runtime's own work per op timed between the blocks."""
    from autopar.planner.cost import ProfileCache
    from autopar.planner.errors import CostModelError
    if how not in ROW_PROFILES:
        raise KeptRunError(f"{folder / RESULT}: its rows were priced with {how!r}, which this autopar does not know "
                           f"(it knows {', '.join(map(repr, ROW_PROFILES))}); rescore it with the autopar that kept it")
    if how == "search":
        return cache
    path = folder / f"{model}-{DURING_STEPS}.json"
    if not path.is_file():
        raise KeptRunError(f"{folder}: its rows were priced with the ops timed between each model's steps, and "
                           f"{path.name} is missing; keep the run whole, or keep a new one")
    try:
        costs = ProfileCache.load(path, keep_stale=True, host_workers=_world(doc))
    except CostModelError as e:
        raise KeptRunError(f"{folder}: {path.name} cannot be read by this autopar ({e}); keep a new run") from e
    # the messages timed between the steps' blocks since the forty-sixth round, the optimizer and
    # the runtime's own work per op since the forty-seventh
    costs.put_runtime_of(cache, keep_own=True)
    return with_cold_of(costs, cache)


def _cold_costs(folder: Path, doc: dict[str, Any], costs: Any, model: str) -> Any:
    """The op times measured with the last-level cache evicted that a kept row is priced with
    besides its own (`planner.sim.reuse`): those of its profile (since the twenty-eighth round the
    benchmark measures them before the steps), or else the diagnosis's, taken right after the
    model's steps; None where neither is there."""
    from autopar.planner.cost import CostModel, ProfileCache
    from autopar.planner.errors import CostModelError
    if CostModel(costs).has_cold:
        return None
    path = folder / f"{model}-{LLC}.json"
    if not path.is_file():
        return None
    try:
        return ProfileCache.load(path, keep_stale=True, host_workers=_world(doc))
    except CostModelError as e:
        raise KeptRunError(f"{folder}: {path.name} cannot be read by this autopar ({e}); keep a new run") from e


def _kept_runtime(doc: dict[str, Any], runtime: Any) -> Any:
    """The kept run's runtime calibration, with the size of the machine's shared cache that its
    JSON records (``last_level_cache_bytes``) where the calibration itself predates it."""
    from dataclasses import replace
    llc = doc.get("last_level_cache_bytes")
    if runtime is None or runtime.shared_cache_bytes or not llc:
        return runtime
    return replace(runtime, shared_cache_bytes=int(llc))


def _refit_messages(folder: Path, model: str, how: str, runtime: Any) -> tuple[Any, bool]:
    """(`runtime` with its messages fitted again by this code from the in-situ records kept beside
    the model's rows (`trainer.accuracy.keep_messages`), whether they were): for rows priced with
    the ops timed between the blocks, whose messages were timed there too, in runs kept since the
    forty-ninth round.  A change to how the messages and the ranks' arrival noise are fitted
    (`trainer.calibrate.in_step_messages`) is then scored on those runs as a change to the
    simulator is; the records themselves, like every measurement, stay as taken."""
    from dataclasses import replace
    path = folder / f"{model}-{MESSAGES}.json.gz"
    if how != DURING_STEPS or runtime is None or not path.is_file():
        return runtime, False
    try:
        fitted = message_calibration(runtime, kept_messages(path))
    except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError) as e:
        raise KeptRunError(f"{path}: its in-situ records cannot be fitted by this autopar ({type(e).__name__}: {e}); "
                           "rescore without them by moving the file away, or keep a new run") from e
    return replace(runtime, **_message_fields(fitted)), True


def rescore_run(folder: str | os.PathLike, log: Callable[[str], None] = lambda _: None,
                row_profile: str | None = None) -> dict[str, Any]:
    """One kept run's rows simulated again from its profile with the code as it is now: per row
    the recorded and the new simulated step and error, and both sides' totals
    (`trainer.accuracy.totals`, over the same measured steps).  `row_profile` (`ROW_PROFILES`):
    price the rows with those op times instead of the ones the run priced them with."""
    from autopar.planner.cost import CostModel
    from autopar.planner.hardware import get_preset
    from autopar.planner.ir import ParallelConfig, Strategy, import_spec
    from autopar.planner.sim import TaskGraphBuilder, trainer_calibration
    from autopar.planner.zoo import load_model, with_dtype

    from .parts import furthest_off, simulate_parts
    folder = Path(folder).expanduser()
    doc, cache, methods = _load(folder)
    how = row_profile or doc.get("row_profile") or "search"      # as the run priced them, without one
    if str(_EXAMPLES) not in sys.path:
        sys.path.append(str(_EXAMPLES))        # the user's model, as the benchmark loads it
    topology = get_preset(f"local:{_world(doc)}")
    rows: list[dict[str, Any]] = []
    by_name: dict[str, tuple[Any, Any]] = {}
    refitted: list[str] = []
    try:
        for m in doc["models"]:
            spec = with_dtype(load_model(m["model"], **m["options"]), None)
            graph = import_spec(spec)
            costs = _row_costs(folder, doc, cache, graph.name, how)
            cost = CostModel(costs, cold=_cold_costs(folder, doc, costs, graph.name)).bind(graph)
            runtime, again = _refit_messages(folder, graph.name, how,
                                             _kept_runtime(doc, trainer_calibration(topology, cost, graph)))
            if again:
                refitted.append(graph.name)
            by_name[graph.name] = (graph, TaskGraphBuilder(graph, topology, cost, _OPT.name, runtime=runtime))
        for r in doc["rows"]:
            if r["model"] not in by_name:
                raise KeptRunError(f"{folder / RESULT}: row {r['model']}/{r['strategy']} names a model the run's "
                                   f"`models` does not list")
            graph, builder = by_name[r["model"]]
            configs = {op: ParallelConfig(tuple(deg), tuple(dev)) for op, (deg, dev) in r["plan"].items()}
            sim_s, sparts, _ = simulate_parts(builder, Strategy.from_mapping(graph, configs, r["strategy"]))
            new = {"model": r["model"], "strategy": r["strategy"], "measured_s": r["measured_s"], "cv": r["cv"],
                   "simulated_s": sim_s, "error": sim_s / r["measured_s"] - 1.0,
                   "recorded_simulated_s": r["simulated_s"], "recorded_error": r["error"]}
            if sparts is not None and r.get("measured_parts_s"):
                new["off"] = furthest_off(sparts, r["measured_parts_s"])
            rows.append(new)
    except KeptRunError:
        raise
    except AutoparError as e:
        raise KeptRunError(f"{folder}: a kept row cannot be simulated with this code ({e})") from e
    recorded = [{**r, "simulated_s": r["recorded_simulated_s"], "error": r["recorded_error"]} for r in rows]
    noise = doc["calibration"].get("arrival_noise") if isinstance(doc["calibration"], dict) else None
    out = {"folder": str(folder), "measured_by": methods, "jitter_sd_1ms_us": (noise or {}).get("jitter_sd_1ms_us"),
           "row_profile": how, "messages_refitted": refitted,
           "rows": rows, "now": _summary(rows), "recorded": _summary(recorded)}
    log(f"{folder}: {len(rows)} rows"
        + (f" (messages fitted again from the kept records: {', '.join(refitted)})" if refitted else "")
        + f"; median |error| {_pct(out['recorded']['median_abs_error'])} recorded, "
        f"{_pct(out['now']['median_abs_error'])} now; mean {_pct(out['recorded']['mean_error'], True)} recorded, "
        f"{_pct(out['now']['mean_error'], True)} now")
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`trainer.accuracy.totals` of `rows`, with the root mean square error, the targets met, and
    the errors with each row at the level of its model's other rows (``at_model_level``,
    `trainer.accuracy.model_levels`; pooled, a model of each run is a model of its own)."""
    t = totals(rows)
    keep = ("median_abs_error", "p90_abs_error", "max_abs_error", "mean_error", "kendall_tau", "kendall_pairs",
            "searched_vs_best_measured", "searched_vs_best_resolved", "met")
    levels = t["model_levels"]
    return {**{k: t[k] for k in keep}, "rms_error": math.sqrt(statistics.fmean(r["error"] ** 2 for r in rows)),
            "targets_met": sum(t["met"].values()), "at_model_level": levels["held_out"] if levels else None}


def rescore(folders: list[str | os.PathLike], progress: bool = True, row_profile: str | None = None) -> dict[str, Any]:
    """Every kept run in `folders` simulated again (`rescore_run`, its rows priced as the run priced
    them or with `row_profile`), and the totals of all their rows pooled, recorded and now;
    Kendall's tau pooled counts only pairs within one model of one run."""
    def log(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    if not folders:
        raise KeptRunError("--rescore: name at least one folder a run was kept in (`autopar bench accuracy --keep`)")
    if row_profile is not None and row_profile not in ROW_PROFILES:
        raise KeptRunError(f"--row-profile {row_profile!r}: choose one of {', '.join(ROW_PROFILES)}")
    runs = [rescore_run(f, log, row_profile) for f in folders]
    pooled_now, pooled_recorded = [], []
    for k, run in enumerate(runs):
        for r in run["rows"]:
            key = {"model": f"{k}:{r['model']}"}            # tau and the searched plan stay within a run
            pooled_now.append({**r, **key})
            pooled_recorded.append({**r, **key, "simulated_s": r["recorded_simulated_s"], "error": r["recorded_error"]})
    return {"runs": runs, "pooled": {"rows": len(pooled_now), "now": _summary(pooled_now),
                                     "recorded": _summary(pooled_recorded)},
            "offsets": plan_offsets(runs)}


def plan_offsets(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Which plans the simulator prices wrong against their model's other plans, the same way in
    every run: per model, its level in each run (the mean error of its rows there) over the runs
    (``levels``: mean and sd); per model and strategy, each row's error less its model's level in
    its run, over the runs (``plans``: mean and sd, largest mean first).

    A model's level moves with the machine's state between its profile and its steps; an offset
    is how the plans are spaced, which is what a search acts on.  An offset whose mean is large
    against its sd is a pricing error of that kind of plan, not the noise: over the sixteen AMD
    runs kept by 2026-11-29, rnnlm's level moved with an sd of 8 points while its model-parallel
    rows sat 10 points above it and its random plans 13 below, each within 3 points in every run
    (docs/simulation.md, "Thirtieth round").  None with fewer than two runs."""
    if len(runs) < 2:
        return None
    levels: dict[str, list[float]] = {}
    offsets: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        by: dict[str, list[dict[str, Any]]] = {}
        for r in run["rows"]:
            by.setdefault(r["model"], []).append(r)
        for model, rows in by.items():
            level = statistics.fmean(r["error"] for r in rows)
            levels.setdefault(model, []).append(level)
            for r in rows:
                offsets.setdefault((model, r["strategy"]), []).append(r["error"] - level)
    plans = [{"model": m, "strategy": s, "runs": len(v), "mean_offset": statistics.fmean(v),
              "sd_offset": statistics.pstdev(v)} for (m, s), v in offsets.items()]
    plans.sort(key=lambda p: -abs(p["mean_offset"]))
    return {"levels": {m: {"runs": len(v), "mean_error": statistics.fmean(v), "sd_error": statistics.pstdev(v)}
                       for m, v in levels.items()},
            "plans": plans}


def _pct(x: float | None, signed: bool = False) -> str:
    return "n/a" if x is None else f"{100 * x:{'+' if signed else ''}.1f} %"


def print_rescore(doc: dict[str, Any]) -> None:
    """A table: per kept run and pooled, each total recorded and now, and the targets met."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title="kept accuracy runs, simulated again with this code (the measured steps are the runs' own)")
    for col in ("run", "rows", "median |error|", "p90", "max", "mean", "rms", "tau (pairs)", "targets met",
                "at each model's level: median, p90"):
        table.add_column(col, justify="left" if col == "run" else "right")

    def line(name: str, n: int, s: dict[str, Any]) -> list[str]:
        tau = "n/a" if s["kendall_tau"] is None else f"{s['kendall_tau']:.2f}"
        level = s.get("at_model_level")
        return [name, str(n), _pct(s["median_abs_error"]), _pct(s["p90_abs_error"]), _pct(s["max_abs_error"]),
                _pct(s["mean_error"], True), _pct(s["rms_error"]), f"{tau} ({s['kendall_pairs']})",
                f"{s['targets_met']} of {len(s['met'])}",
                "n/a" if level is None else f"{_pct(level['median_abs_error'])}, {_pct(level['p90_abs_error'])}"]

    for run in doc["runs"]:
        for when in ("recorded", "now"):
            table.add_row(*line(f"{run['folder']} ({when})", len(run["rows"]), run[when]))
    for when in ("recorded", "now"):
        table.add_row(*line(f"pooled ({when})", doc["pooled"]["rows"], doc["pooled"][when]))
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    offsets = doc.get("offsets")
    if not offsets:
        return
    levels = ", ".join(f"{m} {_pct(v['mean_error'], True)} (sd {_pct(v['sd_error'])})"
                       for m, v in offsets["levels"].items())
    console.print(f"each model's level over the runs, now: {levels}")
    plans = Table(title="each plan's error less its model's level in its run, now (largest first)")
    for col in ("model", "strategy", "runs", "mean", "sd"):
        plans.add_column(col, justify="left" if col in ("model", "strategy") else "right")
    for p in offsets["plans"]:
        plans.add_row(p["model"], p["strategy"], str(p["runs"]), _pct(p["mean_offset"], True), _pct(p["sd_offset"]))
    console.print(plans)


__all__ = ["PROFILE", "RESULT", "KeptRunError", "keep_folder", "plan_offsets", "print_rescore", "record", "rescore",
           "rescore_run"]
