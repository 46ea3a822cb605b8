"""`autopar simulate`: simulate strategies of a model on a topology and compare them."""

from __future__ import annotations

import sys
import time
from typing import Any

from autopar.planner.sim import (SimulationResult, TaskGraphBuilder, check_fits, loss_allreduce_s, simulate_strategy,
                                 simulated_trace)

from ._common import Problem, emit_json, fmt_bytes, fmt_seconds, load_problem, resolve_strategy, warn


def simulate_one(problem: Problem, builder: TaskGraphBuilder, name: str) -> dict[str, Any]:
    strategy = resolve_strategy(name, problem)
    t0 = time.perf_counter()
    res, tl, tg = simulate_strategy(builder, strategy)
    wall = time.perf_counter() - t0
    return _row(problem, builder, name, strategy, res, wall)


def _row(problem: Problem, builder, name, strategy, res: SimulationResult, wall: float) -> dict[str, Any]:
    topo = problem.topology
    batch = problem.graph.batch_size
    used = sorted(strategy.devices_used())
    busy = [res.compute_busy[d] for d in used]
    step = res.step_time + loss_allreduce_s(builder)     # a trained step ends in its loss's all-reduce, as planned
    return {
        "strategy": name,
        "step_seconds": step,
        "samples_per_second": batch / step,
        "samples_per_second_per_device": batch / step / max(1, len(used)),
        "devices_used": len(used),
        "mean_compute_utilization": (sum(busy) / len(busy) / step) if busy else 0.0,
        "bytes_moved": res.bytes_moved,
        "tasks": res.num_tasks,
        "peak_memory_bytes": {topo.devices[d].name: res.peak_memory[d] for d in used},
        "max_peak_memory_bytes": max(res.peak_memory[d] for d in used),
        "memory_problems": check_fits(builder, strategy, res.peak_memory),
        "simulation_wall_seconds": wall,
        "warnings": list(strategy.notes),
    }


def run_simulate(args) -> int:
    problem = load_problem(args)
    builder = TaskGraphBuilder(problem.graph, problem.topology, problem.cost)
    names = args.strategy or ["data-parallel", "model-parallel", "single-device"]
    rows = [simulate_one(problem, builder, n) for n in names]
    base = next((r for r in rows if r["strategy"] == "data-parallel"), rows[0])
    for r in rows:
        r["speedup_vs_" + base["strategy"].replace("-", "_")] = base["step_seconds"] / r["step_seconds"]
    doc = {
        "model": problem.graph.name,
        "graph": {"ops": len(problem.graph), "parameters": problem.graph.num_params, "dtype": problem.graph.dtype,
                  "batch_size": problem.graph.batch_size, "fingerprint": problem.graph.fingerprint},
        "topology": {"name": problem.topology.name, "devices": problem.topology.num_devices,
                     "fingerprint": problem.topology.fingerprint},
        "cost_sources": problem.cost.stats(),
        "results": rows,
    }
    for r in rows:
        for note in r["warnings"]:
            warn(note)
    if getattr(args, "plot", None):
        _plot(args.plot, problem, builder, names[0])
        doc["plot"] = args.plot
    if getattr(args, "trace", None):
        _trace(args.trace, problem, builder, names[0])
        doc["trace"] = args.trace
    if args.json:
        emit_json(doc)
    else:
        _print(doc, problem, base["strategy"])
    return 0


def _plot(path: str, problem: Problem, builder, name: str) -> None:
    from autopar.planner.plot import plot_strategy  # written with the search (issue 3)
    strategy = resolve_strategy(name, problem)
    res, tl, tg = simulate_strategy(builder, strategy)
    plot_strategy(path, problem.graph, problem.topology, strategy, tl, tg)


def _trace(path: str, problem: Problem, builder, name: str) -> None:
    import json

    from autopar.planner.fileio import atomic_write
    strategy = resolve_strategy(name, problem)
    _, tl, tg = simulate_strategy(builder, strategy)
    doc = simulated_trace(problem.graph, problem.topology, tl, tg, name=strategy.name)
    atomic_write(path, lambda f: json.dump(doc, f))


def _print(doc: dict[str, Any], problem: Problem, base: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(f"[bold]{problem.graph.summary()}[/bold]")
    console.print(f"[bold]{problem.topology.summary()}[/bold]")
    src = doc["cost_sources"]
    console.print(f"op costs: {src.get('profile', 0)} measured (profile cache), {src.get('analytic', 0)} analytic (roofline)")
    table = Table(title=f"one training step, batch {problem.graph.batch_size}; speedup vs {base}; "
                        "util = mean compute busy time / step")
    for col in ("strategy", "step", "speedup", "samples/s", "/device", "devices", "util",
                "moved", "peak mem"):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for r in doc["results"]:
        speed = r["speedup_vs_" + base.replace("-", "_")]
        mem = fmt_bytes(r["max_peak_memory_bytes"]) + (" [red](OOM)[/red]" if r["memory_problems"] else "")
        table.add_row(r["strategy"], fmt_seconds(r["step_seconds"]), f"{speed:.2f}×",
                      f"{r['samples_per_second']:.1f}", f"{r['samples_per_second_per_device']:.1f}",
                      str(r["devices_used"]), f"{100 * r['mean_compute_utilization']:.0f}%",
                      fmt_bytes(r["bytes_moved"]), mem)
    console.print(table)
    for r in doc["results"]:
        for msg in r["memory_problems"]:
            console.print(f"[red]{r['strategy']}: {msg}[/red]")
