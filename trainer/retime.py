"""`autopar train --retime`: the plan's step priced again with its ops timed in the training ranks.

A plan's prediction comes from the profile cache `autopar profile` filled, minutes or days before
the run, in other processes.  How fast a machine runs an op moves in between: on the 2-vCPU VM of
the accuracy benchmark, the ops the two training ranks timed between the blocks of their own
steps priced 459 rows at a median error of 5.1 % against 6.3 % with the search's profile, and
each model's level (its rows' mean error in one run) moved from run to run with an sd of
4.2-5.1 points against 6.9-10.6 (docs/simulation.md, "Forty-second round").

``--retime`` does the same in a user's run.  `PASSES` times (`schedule`: after the first step,
then spread over the rest of the run) every rank stops before a step and times the plan's own
tasks (`plan_items`) in lockstep with the others (`planner.cost.lockstep_task`, as `autopar
profile`'s workers time them).  Rank 0 gathers the passes and stores them as `autopar profile`
stores its workers' (`planner.cost.store_lockstep_passes`: per pass the median over the ranks,
per task the median of its passes), into a cache with the profile cache's runtime calibration
and its op times with the last-level cache evicted (`with_cold_of`); a task no pass could time
keeps the profile's time.  Then it simulates the plan again (`price`).  After every pass the
summary's ``predicted_step_s`` and the ``autopar_trainer_predicted_step_seconds`` gauge (which
the operator's status and dashboard show) take the new price; the plan's own stays in
``planned_step_s``.  The `SETTLE` steps after a pass start in caches the pass filled with other
data, so they are left out of the measured median, as traced steps are.

Each pass also steps two of the workloads the runtime calibration measures, as the accuracy
benchmark steps them between the blocks of a model's steps (docs/simulation.md, "Forty-seventh
round"; `RuntimeSteps`): the calibration's optimizer cases with the run's optimizer
(`trainer.calibrate.OptimizerSteps`), and the model whole on each rank
(`trainer.calibrate.ModelOverheadSteps`: the runtime's own work per op).  The price then takes the
optimizer step and the per-op overheads from them too (`retimed_runtime`), in place of the profile
cache's calibration, taken whenever `autopar profile` ran; the price with only the ops timed in
the ranks is reported beside (``ops_only_step_s``).  A rank that cannot hold the model whole
leaves the per-op overheads as the profile cache has them; a run without a runtime calibration in
its profile cache (`autopar profile` not run) leaves its runtime costs at their defaults.  The
messages are not timed in the passes: stepped there as the benchmark steps them (its in-situ
workloads, 4 steps of each batch a pass), they made the quickstart's plan 4-12 ms slower than
with the ops alone, over by transfer, in 3 runs of 3 (the 2048-row batch's arrival noise in such
short bursts came out at 1.5-1.8 ms (sd) per ms run, the other batches' at 0.06-0.13:
docs/simulation.md, "Forty-eighth round"), and cost 5 s a pass.

The times are the plan's ops', one op at a time, and the calibration's own workloads', composed
into a step by the simulator as before: nothing is fitted to the measured steps.  The passes time
the CPU (`lockstep_task`), so ``--retime`` is for CPU ranks on their ``local:N`` topology; on a
GPU, `autopar profile` times the kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .errors import TrainerConfigError
from .parts import simulate_parts

#: Passes over the plan's tasks in one run (`schedule`); the accuracy benchmark times three.
PASSES = 3
#: Steps after a pass left out of the measured median: their caches hold the pass's data.
SETTLE = 2
#: How each pass times a task: as the accuracy benchmark's ranks do between their blocks.
REPEATS, WARMUP, BUDGET_S = 5, 2, 2.0
#: Timed steps per pass (each workload's after one untimed step) of each optimizer case and of the
#: model whole: the accuracy benchmark's over its three rounds (`trainer.accuracy.OPTIMIZER_STEPS`,
#: `OWN_STEPS`).
OPTIMIZER_STEPS, OWN_STEPS = 3, 4


def schedule(start: int, steps: int, passes: int = PASSES) -> list[int]:
    """The steps (0-based, counted from the start of training) before which a pass runs, in a run
    from step `start` to `steps`: after the run's first step (allocation and warm-up), then spread
    evenly over the rest.  A short run times fewer passes, so that most of its steps still count:
    one per `SETTLE` + 3 steps after the first, at least one; none in a run of fewer than two."""
    n = steps - start
    if n < 2:
        return []
    passes = max(1, min(passes, (n - 1) // (SETTLE + 3)))
    return sorted({start + 1 + k * (n - 1) // passes for k in range(passes)})


def settling(at: list[int], step: int) -> bool:
    """Whether `step` is one of the `SETTLE` steps right after a pass."""
    return any(p <= step < p + SETTLE for p in at)


def plan_items(graph: Any, strategy: Any, kind: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(task key, op name, degrees) of every distinct task of `strategy`'s ops, as
    `planner.cost.profile_items` lists a model's; ops without inputs (the data) have none."""
    from autopar.planner.cost import graph_input_shapes, task_key
    seen: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    for op in graph.ops:
        if not op.inputs:
            continue
        degrees = tuple(strategy[op.name].degrees)
        key = task_key(op, degrees, kind, graph_input_shapes(graph, op))
        seen.setdefault(key, (key, op.name, degrees))
    return list(seen.values())


def with_cold_of(costs: Any, profile: Any) -> Any:
    """`costs` (a `ProfileCache`) given, for each task it holds, the times that `profile` measured
    of the same task with the last-level cache evicted (under the `cold_kind` product), where it
    has none of its own: `planner.sim.reuse` prices a step's tasks between their warm time and
    that cold one, and the ops timed between a model's steps are timed warm only."""
    from autopar.planner.cost import cold_kind
    timed = {rest for head, _, rest in (key.partition("|") for key in costs) if cold_kind(head) != head}
    for key, (forward, backward) in list(profile.items()):
        head, _, rest = key.partition("|")
        if cold_kind(head) == head and rest in timed and key not in costs:
            costs.put(key, forward, backward, profile.host(key))
    return costs


def lockstep_costs(costs: Any, profile: Any, graph: Any, items: list[tuple[str, str, tuple[int, ...]]],
                   per_rank: Any, kind: str, keep_profiled: bool = False) -> Any:
    """Fill `costs` (a `ProfileCache`) with what the ranks timed of `items` in lockstep (`per_rank[r][n]`:
    rank r's timings of item n, one per pass; `planner.cost.store_lockstep_passes`), `profile`'s runtime
    calibration, and its times with the last-level cache evicted (`with_cold_of`); `keep_profiled`: a task
    no pass timed keeps `profile`'s time.  Returns the passes' `ProfileReport`.  The accuracy benchmark
    prices its rows so, and `price` a retimed run."""
    from autopar.planner.cost import store_lockstep_passes
    costs.put_runtime_of(profile)
    report = store_lockstep_passes(graph, items, per_rank, costs, kind)
    if keep_profiled:
        for key, _, _ in items:
            if key not in costs and (known := profile.get(key)) is not None:
                costs.put(key, *known, profile.host(key))
    with_cold_of(costs, profile)
    return report


def runtime_words(runtime: dict[str, Any]) -> list[str]:
    """What of the runtime a retime's ``runtime`` (`retimed_runtime`) says the passes timed, in
    words for a summary: ``optimizer``, ``own work per op``."""
    return [w for k, w in (("optimizer", "optimizer"), ("overheads", "own work per op")) if k in runtime]


class RuntimeSteps:
    """Two of the runtime calibration's workloads on this rank, stepped by every rank in each pass
    (module docstring): `OPTIMIZER_STEPS` timed steps of each optimizer case with the run's
    optimizer, and `OWN_STEPS` of the model whole (where this rank can hold it), each after one
    untimed step.  `result` is what `retimed_runtime` prices with."""

    def __init__(self, job: Any, rank: int, world: int):
        from functools import partial

        from autopar.planner.errors import AutoparError
        from autopar.planner.ir import single_device

        from .calibrate import ModelOverheadSteps, OptimizerSteps, settings
        from .comm import ProcessGroups
        from .session import Trainer
        from .config import Job
        self.optimizer = OptimizerSteps(rank, world, settings(False).optimizer_cases, job.config.optimizer.name)
        self.own = self.why_not_own = None
        try:
            whole = Job(job.config, job.spec, job.graph, single_device(job.graph, rank))
            self.own = ModelOverheadSteps(Trainer(whole, rank, world, ProcessGroups()))
        except AutoparError as e:     # the per-op overheads stay as the profile cache has them
            self.why_not_own = f"the model whole could not be set up on one rank ({e})"
        self.units = ([(partial(self.optimizer.step, n), OPTIMIZER_STEPS) for n in range(len(self.optimizer.trainers))]
                      + ([(self.own.step, OWN_STEPS)] if self.own is not None else []))
        self.stepped = [0] * len(self.units)

    def run(self) -> None:
        """One pass's share: every workload's untimed step, then its timed ones."""
        for n, (step, timed) in enumerate(self.units):
            for i in range(1 + timed):
                step(self.stepped[n], i > 0)
                self.stepped[n] += 1

    def result(self) -> dict[str, Any]:
        """This rank's records so far: ``optimizer`` (`OptimizerSteps.samples`) and ``overheads``
        (`ModelOverheadSteps.result`, or None), as `trainer.accuracy._measure` returns them."""
        return {"optimizer": self.optimizer.samples(),
                "overheads": self.own.result() if self.own is not None else None}


def retimed_runtime(costs: Any, graph: Any, topology: Any, optimizer: str, timed: list) -> dict[str, Any] | None:
    """Put into `costs` (a `ProfileCache` holding the run's profile's runtime calibration) that
    calibration with what the ranks' `RuntimeSteps` measured (`timed`: per rank its `result`):
    optimizer `optimizer` (`trainer.calibrate.own_calibration`) and the runtime's own work per op
    (`trainer.calibrate.own_overheads`), as the accuracy benchmark prices its rows.  Returns what
    they measured in a few words (``optimizer``, ``overheads``), or None where the profile has no
    runtime calibration for these ranks."""
    from .calibrate import own_calibration, own_line, own_overheads
    cal = costs.calibration(topology.devices[0].product, "gloo", topology.num_devices)
    if cal is None:
        return None
    out: dict[str, Any] = {}
    cal = own_calibration(cal, timed, optimizer)
    if any(t["optimizer"] for t in timed):
        out["optimizer"] = f"{optimizer} {own_line(cal, optimizer)}"
    costs.put_calibration(cal)
    own = own_overheads(costs, cal, graph.fingerprint, timed)
    if own is not None:
        out["overheads"] = (f"{own['fwd_task_us']:.0f} us per forward task and {own['bwd_task_us']:.0f} us per "
                            f"backward one")
    return out


def price(graph: Any, topology: Any, strategy: Any, optimizer: str, profile: Any,
          items: list[tuple[str, str, tuple[int, ...]]], per_rank: list, kind: str,
          timed: list | None = None) -> tuple[float, Any, Any, dict[str, Any] | None]:
    """(simulated step, its parts on the busiest device, the `ProfileReport` of the passes, what the
    runtime's workloads measured or None) of `strategy`, its tasks priced with the passes the ranks
    timed (`per_rank[r][n]`: rank r's timings of item n, one per pass), the optimizer and per-op
    overheads with what the ranks' `RuntimeSteps` measured (`timed`, `retimed_runtime`), the rest
    as `profile` (the run's profile cache) has them."""
    from autopar.planner.cost import CostModel, ProfileCache
    from autopar.planner.sim import TaskGraphBuilder
    costs = ProfileCache()
    report = lockstep_costs(costs, profile, graph, items, per_rank, kind, keep_profiled=True)
    runtime = retimed_runtime(costs, graph, topology, optimizer, timed) if timed else None
    builder = TaskGraphBuilder(graph, topology, CostModel(costs).bind(graph), optimizer)
    seconds, parts, _ = simulate_parts(builder, strategy, barrier=False)   # its steps run back to back
    return seconds, parts, report, runtime


def check_retime(topology: Any, world: int, device_kind: str) -> None:
    """Refuse ``--retime`` where it cannot price the plan, before any rank starts: on CUDA ranks, or
    on a topology that does not describe this machine's CPU ranks."""
    if device_kind != "cpu":
        raise TrainerConfigError("--retime times the plan's ops on the ranks' CPUs; on a GPU, leave it out and "
                                 "let `autopar profile` time the kernels")
    if not all(d.is_cpu for d in topology.devices) or topology.num_devices != world:
        raise TrainerConfigError(f"--retime prices the plan on this machine's {world} CPU rank(s), and the topology "
                                 f"{topology.name!r} describes other devices; leave out --topology (local:{world})")


@dataclass
class Retimer:
    """One rank's part of ``--retime`` (module docstring); rank 0 also prices the plan."""

    job: Any                        # trainer.train.Job, with its topology
    rank: int
    world: int
    group: Any                      # the world's process group
    start: int                      # the run's first step
    at: list[int] = field(init=False)
    items: list = field(init=False)
    kind: str = field(init=False)
    per_rank: list = field(init=False)   # rank 0: per rank, per item, its passes
    passes: list[int] = field(init=False, default_factory=list)  # the steps (0-based) passes ran before
    seconds: float = 0.0            # this rank's time in the passes
    predicted: float | None = None  # rank 0: the latest price
    parts: dict | None = None
    timed: int = 0                  # rank 0: tasks the passes timed
    failed: dict = field(init=False, default_factory=dict)   # rank 0: "op (degrees)" -> why no pass timed it

    def __post_init__(self) -> None:
        from autopar.planner.cost import kind_of
        self.at = schedule(self.start, self.job.config.steps)
        self.kind = kind_of(self.job.topology.devices[0])
        self.items = plan_items(self.job.graph, self.job.strategy, self.kind)
        self.per_rank = [[[] for _ in self.items] for _ in range(self.world)]
        self._overhead = None
        self._profile = None
        self._runtime: RuntimeSteps | None = None
        self.runtime_timed: dict[str, Any] | None = None   # rank 0: what the runtime's workloads measured
        self.ops_only: float | None = None  # rank 0: the latest price with only the ops timed in the ranks

    def settling(self, step: int) -> bool:
        return settling(self.passes, step)

    def due(self, step: int) -> bool:
        return step in self.at

    def run(self, step: int) -> float | None:
        """Time one pass before `step` on every rank (all must call it); rank 0 prices the plan and
        returns the new step time (None elsewhere, or where it could not be simulated)."""
        from autopar.planner.cost import engine_overhead, lockstep_task
        t0 = time.perf_counter()
        sync = (lambda: dist.barrier(group=self.group)) if self.world > 1 else (lambda: None)
        with torch.random.fork_rng(devices=[]):     # the run's own random stream goes on as without a pass
            if self._overhead is None:
                self._overhead = engine_overhead(torch.device("cpu"))
            mine = []
            for item in self.items:
                hot: list[float] = []
                mine.append((*lockstep_task(self.job.graph, self.job.spec.module, self.kind, item, sync,
                                            repeats=REPEATS, warmup=WARMUP, budget=BUDGET_S,
                                            overhead=self._overhead, hot=hot), *hot))
            if self._runtime is None:
                self._runtime = RuntimeSteps(self.job, self.rank, self.world)
            self._runtime.run()
            sync()
        got: list = [None] * self.world if self.rank == 0 else None
        if self.world > 1:
            dist.gather_object((mine, self._runtime.result()), got, dst=0, group=self.group)
        else:
            got = [(mine, self._runtime.result())]
        self.passes.append(step)
        self.seconds += time.perf_counter() - t0
        if self.rank != 0:
            return None
        for r, (timings, _) in enumerate(got):
            for n, t in enumerate(timings):
                self.per_rank[r][n].append(t)
        return self._price([runtime for _, runtime in got])

    def _price(self, timed: list) -> float | None:
        from autopar.planner.cost import ProfileCache, default_cache_path
        cfg = self.job.config
        try:
            if self._profile is None:
                self._profile = ProfileCache.load(cfg.profile_cache or default_cache_path())
            args = (self.job.graph, self.job.topology, self.job.strategy, cfg.optimizer.name, self._profile,
                    self.items, self.per_rank, self.kind)
            seconds, parts, report, runtime = price(*args, timed)
            if runtime:     # beside: the ops alone timed here, the runtime's costs as the profile has them
                self.ops_only = price(*args)[0]
        except Exception as e:  # noqa: BLE001 - the run goes on with the plan's prediction, and says why
            self.failed = {"*": f"{type(e).__name__}: {e}"}
            return None
        self.predicted, self.parts, self.runtime_timed = seconds, parts, runtime
        self.timed = len(report.measured)
        self.failed = {f"{op} {tuple(degrees)}": why for op, degrees, why in report.skipped}
        return seconds

    def note(self) -> str:
        """How the latest price was made, for the summary's ``prediction``."""
        steps = ", ".join(str(s + 1) for s in self.passes)
        head = (f"simulated on {self.job.topology.name} with the plan's {len(self.items)} task(s) timed in these "
                f"ranks before step(s) {steps}")
        if self.runtime_timed:
            head += ", and their " + " and ".join(runtime_words(self.runtime_timed))
        if self.failed:
            head += (f"; {len(self.failed)} not timed, priced from the profile cache ("
                     + "; ".join(f"{k}: {v}" for k, v in list(self.failed.items())[:2]) + ")")
        if self._profile is not None and self._profile.calibration(self.job.topology.devices[0].product, "gloo",
                                                                   self.world) is None:
            head += (f"; the runtime's own costs are defaults, not measured: `autopar profile --model "
                     f"{self.job.config.model} --topology local:{self.world}` measures them")
        return head

    def summary(self) -> dict[str, Any]:
        """The JSON summary's ``retime``: steps are 1-based, as the summary's ``traced_steps``."""
        last = self.job.config.steps
        runtime = dict(self.runtime_timed or {})
        if self._runtime is not None and self._runtime.why_not_own:
            runtime["overheads_not_timed"] = self._runtime.why_not_own
        if runtime and self.ops_only is not None:
            runtime["ops_only_step_s"] = self.ops_only
        return {"passes_before_steps": [s + 1 for s in self.passes], "tasks": len(self.items), "timed": self.timed,
                "not_timed": self.failed, "runtime": runtime, "seconds": self.seconds, "settle_steps": SETTLE,
                "settling_steps": [s + 1 for s in range(self.start, last) if self.settling(s)]}
