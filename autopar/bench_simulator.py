"""`autopar bench simulator`: full against delta simulation (FlexFlow sec. 5.2–5.3, 8.3).

For each (model, topology) the benchmark starts from data parallelism and makes random one-op
changes — what an MCMC proposal does (sec. 6.2): a random op gets a random configuration drawn as
the search draws it (`search.mcmc.SoapSpace`: random degrees on a random aligned block of
devices, as FlexFlow's implementation draws them, or one task moved to another device; with
``--uniform-placements`` every task on a uniformly random device instead, which on 64 GPUs sends
almost every tensor across nodes) — and undoes each one afterwards, as MCMC does with a rejected proposal,
so every change is measured against a realistic strategy rather than an ever more random one.
A change MCMC would reject unbuilt (its edit would build more than `MAX_CHANGE_RATIO` times the
placements of the graph it starts from — tasks counted once per link they occupy, `placements` in
the JSON, `search.mcmc`) is redrawn, since no search ever delta-simulates
it; `redrawn_too_big` counts them, and ``--all-changes`` measures them too.
Every change and every undo is applied with delta simulation (`DeltaSession.change`: update the
task graph for that op, re-time incrementally) and timed.  `delta_ms` is the mean over changes and
undos — what a search pays per step; an undo that exactly reverses the previous edit restores the
old timeline without re-timing (see `planner.sim.simulator`).  `proposal_ms` and `proposal_speedup`
count the forward changes alone, the harder case.  At evenly spaced changes the changed
strategy is also simulated in full (build the whole task
graph and run Algorithm 1 — memory accounting, which both paths can skip, is not timed) and timed, and the two timelines are compared task by task; `agree` is true
only if every compared timeline was identical.

Each row runs in the garbage-collection regime of a search (`planner.sim.gc_regime.frozen_heap`: the
long-lived heap frozen, and what a build or a change allocates frozen after it), for both paths
alike: the full path's build and the delta path's changes are timed under the same collector.

Both paths share the builder's memos (per-configuration task groups, region overlaps, op costs)
of everything earlier changes computed, as a search does; what the change being measured
computed is dropped before its full simulation is timed, so each path pays for the new
configuration's groups once.  The full path still adds and times every task.

A second table gives data-parallel step times of the zoo models on `p100-4x4` with per-GPU
throughput, to check against the GPUs' specifications.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any

from autopar.planner.cost import CostModel
from autopar.planner.hardware import get_preset
from autopar.planner.ir import data_parallel, import_spec
from autopar.planner.search import MAX_CHANGE_RATIO, SoapSpace, change_tasks
from autopar.planner.sim import DeltaSession, TaskGraphBuilder, frozen_heap, simulate, simulate_strategy

from ._common import load_model_for_planning

ROWS = [("inception_v3", "p100-4x4"), ("nmt", "p100-4x4"), ("rnnlm", "p100-4x4"),
        ("inception_v3", "k80-16x4"), ("nmt", "k80-16x4"), ("rnnlm", "k80-16x4")]
MAX_REDRAWS = 100
DP_MODELS = ["lenet", "alexnet", "vgg16", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt", "transformer"]


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _memo_keys(builder: TaskGraphBuilder) -> tuple:
    return (builder._plans.keys(), set(builder._overlap_cache), set(builder._ranges_cache),
            set(builder._param_box_cache))


def _forget_since(builder: TaskGraphBuilder, before: tuple) -> None:
    """Drop what the builder memoized since `before` (the change just delta-simulated), so the
    timed full build computes the changed op's groups itself, as a search that simulates every
    proposal in full would; both paths keep what earlier proposals memoized."""
    plans, *caches = before
    builder._plans.forget(builder._plans.keys() - plans)
    for cache, old in zip((builder._overlap_cache, builder._ranges_cache, builder._param_box_cache), caches):
        for key in set(cache) - old:
            del cache[key]


def bench_row(model: str, topology: str, moves: int, fulls: int, seed: int, progress: bool = False,
              uniform: bool = False, all_changes: bool = False) -> dict[str, Any]:
    with frozen_heap():  # as in a search, for both paths (module docstring)
        return _bench_row(model, topology, moves, fulls, seed, progress, uniform, all_changes)


def _bench_row(model: str, topology: str, moves: int, fulls: int, seed: int, progress: bool,
               uniform: bool, all_changes: bool) -> dict[str, Any]:
    graph = import_spec(load_model_for_planning(model))
    topo = get_preset(topology)
    builder = TaskGraphBuilder(graph, topo, CostModel().bind(graph))
    rng = random.Random(seed)
    base = data_parallel(graph, topo.num_devices)
    space = SoapSpace(topo.num_devices, uniform=uniform)
    session = DeltaSession(builder, base)
    tasks = len(session.sim.graph)
    placements = session.sim.graph.placements()  # a transfer once per link (the search's units)
    every = max(1, moves // max(1, fulls))
    delta_s: list[float] = []
    proposal_s: list[float] = []
    full_s: list[float] = []
    agree = True
    ops = list(graph.ops)
    limit = MAX_CHANGE_RATIO * max(placements, 10_000) if not all_changes else None
    skipped = 0
    for m in range(1, moves + 1):
        for attempt in range(MAX_REDRAWS + 1):
            op = rng.choice(ops)
            old = session.strategy[op.name]
            cfg = space.random(op, rng, old)
            if (limit is None or attempt == MAX_REDRAWS  # after that many in a row, measure it anyway
                    or change_tasks(builder, session.strategy, {op.name: cfg}, limit) <= limit):
                break
            skipped += 1  # MCMC rejects this one unbuilt: no delta simulation to measure
        sampled = m % every == 0 and len(full_s) < fulls
        memo = _memo_keys(builder) if sampled else None
        t0 = time.perf_counter()
        session.change(op.name, cfg)
        delta_s.append(time.perf_counter() - t0)
        proposal_s.append(delta_s[-1])
        if sampled:
            _forget_since(builder, memo)
            t0 = time.perf_counter()
            tl = simulate(builder.build(session.strategy))
            full_s.append(time.perf_counter() - t0)
            agree = agree and session.timeline().same_as(tl) and tl.makespan == session.step_time
            _log(progress, f"  {model} on {topology}: move {m}/{moves}, full {full_s[-1] * 1e3:.0f} ms, "
                           f"delta {statistics.mean(delta_s) * 1e3:.1f} ms, agree={agree}")
        # Undo the change, as MCMC does with a rejected proposal; the undo is a one-op change too.
        t0 = time.perf_counter()
        session.change(op.name, old)
        delta_s.append(time.perf_counter() - t0)
    final = simulate(builder.build(session.strategy))
    agree = agree and session.timeline().same_as(final)
    full_ms = statistics.mean(full_s) * 1e3
    delta_ms = statistics.mean(delta_s) * 1e3
    proposal_ms = statistics.mean(proposal_s) * 1e3
    return {
        "model": model, "topology": topology, "devices": topo.num_devices, "tasks": tasks,
        "placements": placements,
        "full_ms": round(full_ms, 3), "delta_ms": round(delta_ms, 3), "speedup": round(full_ms / delta_ms, 2),
        "proposal_ms": round(proposal_ms, 3), "proposal_speedup": round(full_ms / proposal_ms, 2),
        "agree": agree, "changes": len(delta_s), "full_samples": len(full_s), "redrawn_too_big": skipped,
    }


def data_parallel_row(model: str, topology: str = "p100-4x4") -> dict[str, Any]:
    graph = import_spec(load_model_for_planning(model))
    topo = get_preset(topology)
    builder = TaskGraphBuilder(graph, topo, CostModel().bind(graph))
    res, _, _ = simulate_strategy(builder, data_parallel(graph, topo.num_devices))
    n = topo.num_devices
    compute = statistics.mean(res.compute_busy.values())
    return {
        "model": model, "topology": topology, "devices": n, "batch": graph.batch_size,
        "step_seconds": res.step_time, "samples_per_second": graph.batch_size / res.step_time,
        "samples_per_second_per_gpu": graph.batch_size / res.step_time / n,
        "compute_seconds_per_gpu": compute,
        "gflop_per_sample": graph.total_flops / graph.batch_size / 1e9,
        "gpu": topo.devices[0].product,
        "gpu_peak_tflops": topo.devices[0].peak_flops / 1e12,
    }


def run_simulator_bench(quick: bool = False, seed: int = 0, progress: bool = False,
                        uniform: bool = False, all_changes: bool = False) -> dict[str, Any]:
    moves, fulls = (30, 10) if quick else (200, 40)
    rows = []
    for model, topology in ROWS:
        _log(progress, f"{model} on {topology} …")
        rows.append(bench_row(model, topology, moves, fulls, seed, progress, uniform, all_changes))
    dp = []
    for model in DP_MODELS:
        _log(progress, f"data parallel {model} on p100-4x4 …")
        dp.append(data_parallel_row(model))
    return {"rows": rows, "data_parallel": dp, "settings": {
        "moves": moves, "full_samples": fulls, "seed": seed,
        "placements": "uniform" if uniform else "search proposals (aligned blocks, task moves)",
        "changes": "all" if all_changes else f"those MCMC builds (at most {MAX_CHANGE_RATIO:g}x the start's tasks)"}}


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=None if sys.stdout.isatty() else 120)
    t = Table(title="full vs delta simulation (random one-op changes)")
    for col in ("model", "topology", "devices", "tasks", "full ms", "delta ms", "speedup", "proposal ms",
                "proposal speedup", "agree"):
        t.add_column(col, justify="left" if col in ("model", "topology") else "right")
    for r in doc["rows"]:
        t.add_row(r["model"], r["topology"], str(r["devices"]), str(r["tasks"]), f"{r['full_ms']:.1f}",
                  f"{r['delta_ms']:.1f}", f"{r['speedup']:.1f}×", f"{r['proposal_ms']:.1f}",
                  f"{r['proposal_speedup']:.1f}×", "yes" if r["agree"] else "[red]NO[/red]")
    c.print(t)
    d = Table(title="data parallelism on p100-4x4 (simulated)")
    for col in ("model", "batch", "step", "samples/s", "per GPU", "GFLOP/sample"):
        d.add_column(col, justify="left" if col == "model" else "right")
    for r in doc["data_parallel"]:
        d.add_row(r["model"], str(r["batch"]), f"{r['step_seconds'] * 1e3:.1f} ms", f"{r['samples_per_second']:.0f}",
                  f"{r['samples_per_second_per_gpu']:.1f}", f"{r['gflop_per_sample']:.2f}")
    c.print(d)
