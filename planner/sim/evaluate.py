"""What one strategy costs: build its task graph, time it (Algorithm 1) and sum up the step.

`simulate_strategy` is the full simulation every command reports (FlexFlow sec. 5.2): the task
graph of `taskgraph`, timed by `simulator`, with the peak memory of `memory`.  It sits above all
three, so that peak memory can read the builder's holdings and transfers without the builder
depending on it.  Where the builder models the trainer with a calibration that measured how the
ranks' arrivals vary, each wait is then priced at its mean (`waits`); where the ops were also
profiled with the last-level cache evicted, each op at what the ranks' shared cache holds of its
data in the step (`reuse`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StrategyError
from ..ir.strategy import Strategy
from . import reuse
from .memory import peak_memory
from .simulator import TaskGraph, Timeline, simulate
from .taskgraph import TaskGraphBuilder
from .waits import has_arrival_noise, with_mean_waits


@dataclass(frozen=True)
class SimulationResult:
    """What a simulation reports: step time, per-device busy time, bytes moved, peak memory."""

    step_time: float
    compute_busy: dict[int, float]
    link_busy: dict[str, float]
    bytes_moved: float
    num_tasks: int
    peak_memory: dict[int, int]


def simulate_strategy(builder: TaskGraphBuilder, strategy: Strategy) -> tuple[SimulationResult, Timeline, TaskGraph]:
    """Full simulation (Algorithm 1): build the task graph and time it from scratch; with the
    trainer's arrival noise calibrated, every wait at its mean (`waits.with_mean_waits`); where the
    ops were profiled cold too and the calibration knows the ranks' shared cache, each op task
    priced by what that cache holds in the step simulated, and the step simulated again with them
    (`reuse`)."""
    tg, tl = _timed(builder, strategy)
    if reuse.applies(builder):
        tg, tl = _timed(reuse.in_cache_builder(builder, strategy, tg, tl), strategy)
    return summarize(builder, strategy, tg, tl, peak_memory(builder, strategy)), tl, tg


def _timed(builder: TaskGraphBuilder, strategy: Strategy) -> tuple[TaskGraph, Timeline]:
    tg = builder.build(strategy)
    tl = simulate(tg)
    if has_arrival_noise(builder):
        tl = with_mean_waits(builder, tg, tl, simulate)
    return tg, tl


def summarize(builder: TaskGraphBuilder, strategy: Strategy, tg: TaskGraph, tl: Timeline,
              peak: dict[int, int]) -> SimulationResult:
    n = builder.num_devices
    busy = tl.busy()
    compute = {d: busy.get(d, 0.0) for d in range(n)}
    links = {}
    for li, link in enumerate(builder.topology.links):
        v = busy.get(n + li, 0.0)
        if v > 0:
            links[link.label] = v
    nb = tg._nbytes
    moved = sum(nb[i] for i in tg._id.values())
    if not strategy.devices_used():
        raise StrategyError("strategy places no task on any device")
    return SimulationResult(tl.makespan, compute, links, moved, len(tg), peak)
