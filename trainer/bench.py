"""`autopar bench runtime`: what the runtime costs, and what a searched plan gains, measured.

    autopar bench runtime --json            # full settings
    autopar bench runtime --quick --json    # smaller models and fewer steps

(a) **Overhead against DDP.**  One model, data parallelism, 2 gloo ranks with one thread each:
    our runtime (plan = `data_parallel`) against `torch.nn.parallel.DistributedDataParallel` on
    the same module, batch, optimizer and data.  Reports both median step times and
    ``ratio_vs_ddp`` = ours / DDP (target ≤ 1.15).
(b) **Searched plan against data parallelism.**  A parameter-heavy model — RNNLM scaled to this
    machine, with a large-vocabulary softmax whose weights dominate — trained through our
    runtime under data parallelism and under the plan the search finds for ``local:2``
    (`planner.search.plan`: MCMC from several starts, OptCNN's result among them) with op costs
    measured on this machine first (`planner.cost.profiler`, a private cache), measured.
    ``searched_speedup`` = DP / searched (target ≥ 1.2), beside the simulator's prediction for
    both plans.

Medians leave out warm-up steps.  The two runs of each comparison live in the same ranks and take
steps in turn, so both see the same load on a machine that other work shares.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from autopar.planner.zoo import with_dtype

from .comm import ProcessGroups
from .launch import run_local
from .optim import OptimizerConfig
from .session import Trainer
from .train import Job, TrainConfig

_OPT = OptimizerConfig("sgd", lr=0.01, momentum=0.9)


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"ddp_model": ("lenet", {"batch": 64, "image": 28}), "warmup": 3, "steps": 15, "budget_s": 4.0,
                "profile_repeats": 3,
                "heavy_model": ("rnnlm", {"batch": 8, "steps": 4, "vocab": 32768, "embed": 128,
                                          "hidden": 128, "layers": 1})}
    return {"ddp_model": ("alexnet", {"batch": 32, "image": 63, "classes": 100, "fc": 512, "dropout": 0.0}),
            "warmup": 3, "steps": 20, "budget_s": 20.0, "profile_repeats": 5,
            "heavy_model": ("rnnlm", {"batch": 8, "steps": 4, "vocab": 32768, "embed": 256,
                                      "hidden": 256, "layers": 1})}


def _spec(model: str, options: dict):
    from autopar.planner.zoo import load_model
    return with_dtype(load_model(model, **options), None)


# -- workers (run in the ranks) --------------------------------------------------------------------

class _DDPRun:
    """The reference: DistributedDataParallel on the module, each rank its slice of the global batch."""

    def __init__(self, rank: int, world: int, spec):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from .data import SyntheticData
        self.rank, self.world, self.spec = rank, world, spec
        self.model = DDP(copy.deepcopy(spec.module))
        self.opt = _OPT.build(list(self.model.parameters()))
        self.data = SyntheticData(spec)
        self.names = [n for n, _ in spec.inputs]
        self.per = spec.batch_size // world

    def train_step(self, step: int) -> None:
        full = self.data.batch(step)
        local = {k: v[self.rank * self.per:(self.rank + 1) * self.per] for k, v in full.items()}
        self.opt.zero_grad(set_to_none=True)
        loss = self.spec.compute_loss(self.model(*(local[n] for n in self.names)), local[self.spec.target[0]])
        loss.backward()
        self.opt.step()


def _interleaved(rank: int, world: int, runs: list, warmup: int, steps: int) -> list[list[float]]:
    """Step every run in turn, `warmup + steps` times; per run, the measured step times.

    Alternating the runs step by step inside the same processes exposes them to the same machine
    load, which on a shared 2-core machine matters more than any difference between them.
    """
    built = [r(rank, world) for r in runs]
    times: list[list[float]] = [[] for _ in built]
    for s in range(warmup + steps):
        for k, run in enumerate(built):
            dist.barrier()
            t0 = time.perf_counter()
            run.train_step(s)
            if s >= warmup:
                times[k].append(time.perf_counter() - t0)
    return times


class _Ours:
    def __init__(self, job: Job):
        self.job = job

    def __call__(self, rank: int, world: int) -> Trainer:
        return Trainer(self.job, rank, world, ProcessGroups())


class _Reference:
    def __init__(self, spec):
        self.spec = spec

    def __call__(self, rank: int, world: int) -> _DDPRun:
        return _DDPRun(rank, world, self.spec)


def _medians(per_rank: list[list[list[float]]]) -> list[float]:
    """Per run: the median over steps of the slowest rank's time (a step ends when all ranks end)."""
    return [statistics.median(max(ts) for ts in zip(*(r[k] for r in per_rank))) for k in range(len(per_rank[0]))]


def _job(spec, graph, strategy) -> Job:
    return Job(TrainConfig(model=graph.name, optimizer=_OPT, log=False), spec, graph, strategy)


def _measured_cost(model: str, options: dict, graph, repeats: int):
    """A cost model with this machine's measured op times and runtime calibration for ``local:2``
    (FlexFlow sec. 5.1 measures each op once per configuration), kept in a private cache so the
    benchmark has no side effects."""
    from autopar.planner.cost import CostModel, ProfileCache, profile_local

    from .calibrate import calibrate, ensure_model_overheads
    with tempfile.TemporaryDirectory(prefix="autopar-bench-") as d:
        cache = ProfileCache.load(Path(d) / "profile.json")
        report = profile_local([model], workers=2, options=options, cache=cache, repeats=repeats, warmup=5)
        profile_local([model], workers=2, options=options, cache=cache, repeats=repeats, warmup=5,
                      cache_level="llc", cold_keys=True)         # as `autopar profile` measures them too
        cache.put_calibration(calibrate(2, quick=repeats < 5))   # what `autopar profile --topology local:2` adds
        ensure_model_overheads(cache, model, options, 2, quick=repeats < 5)    # and this, for the model
    return CostModel(cache).bind(graph), report


def _searched(graph, topology, cost, budget_s: float):
    """The plan `autopar plan` would write: FlexFlow's search (MCMC from several starts, OptCNN's
    result among them), never slower in simulation than the baselines it evaluated."""
    from autopar.planner.search import plan
    result = plan(graph, topology, cost, budget_s=budget_s, seed=0)
    return result.strategy, f"planner.search.plan ({result.source})"


def _simulated(graph, topology, cost, strategy) -> float:
    from autopar.planner.sim import TaskGraphBuilder, simulate_strategy
    return simulate_strategy(TaskGraphBuilder(graph, topology, cost, _OPT.name), strategy)[0].step_time


def run_runtime_bench(quick: bool = False) -> dict[str, Any]:
    """Both measurements; the returned dict is the JSON of `autopar bench runtime`."""
    from autopar.planner.hardware import get_preset
    from autopar.planner.ir import data_parallel, import_spec

    cfg = _settings(quick)
    world = 2
    topology = get_preset(f"local:{world}")
    out: dict[str, Any] = {"world_size": world, "backend": "gloo", "threads_per_rank": 1, "quick": quick,
                           "warmup_steps": cfg["warmup"], "measured_steps": cfg["steps"]}

    # (a) our runtime vs DDP, data parallelism
    name, opts = cfg["ddp_model"]
    spec = _spec(name, opts)
    graph = import_spec(spec)
    dp = data_parallel(graph, world)
    ours, ddp = _medians(run_local(_interleaved, world, ([_Ours(_job(spec, graph, dp)), _Reference(spec)],
                                                         cfg["warmup"], cfg["steps"])))
    out["ddp"] = {"model": name, "options": opts, "global_batch": graph.batch_size,
                  "ours_median_step_seconds": ours, "ddp_median_step_seconds": ddp}
    out["ratio_vs_ddp"] = out["ddp"]["ours_median_step_seconds"] / out["ddp"]["ddp_median_step_seconds"]

    # (b) data parallelism vs the searched plan, parameter-heavy model
    name, opts = cfg["heavy_model"]
    spec = _spec(name, opts)
    graph = import_spec(spec)
    dp = data_parallel(graph, world)
    t0 = time.perf_counter()
    cost, report = _measured_cost(name, opts, graph, cfg["profile_repeats"])
    profile_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    searched, how = _searched(graph, topology, cost, cfg["budget_s"])
    search_seconds = time.perf_counter() - t0
    t_dp, t_searched = _medians(run_local(_interleaved, world, (
        [_Ours(_job(spec, graph, dp)), _Ours(_job(spec, graph, searched))], cfg["warmup"], cfg["steps"])))
    out["searched"] = {
        "model": name, "options": opts, "global_batch": graph.batch_size, "parameters": graph.num_params,
        "profiled_tasks": len(report.measured), "profile_seconds": profile_seconds,
        "search": how, "search_seconds": search_seconds, "topology": topology.name,
        "data_parallel_median_step_seconds": t_dp,
        "searched_median_step_seconds": t_searched,
        "data_parallel_predicted_step_seconds": _simulated(graph, topology, cost, dp),
        "searched_predicted_step_seconds": _simulated(graph, topology, cost, searched),
        "searched_plan": {op.name: searched[op.name].describe(op) for op in graph.ops},
    }
    times = {"data_parallel": t_dp, "searched": t_searched}
    out["searched_speedup"] = times["data_parallel"] / times["searched"]
    out["targets"] = {"ratio_vs_ddp": "<= 1.15", "searched_speedup": ">= 1.2"}
    return out


def print_table(doc: dict[str, Any]) -> None:
    a, b = doc["ddp"], doc["searched"]
    print(f"(a) {a['model']} data-parallel on {doc['world_size']} gloo ranks: ours "
          f"{a['ours_median_step_seconds'] * 1e3:.1f} ms, DDP {a['ddp_median_step_seconds'] * 1e3:.1f} ms, "
          f"ratio {doc['ratio_vs_ddp']:.3f} (target <= 1.15)")
    print(f"(b) {b['model']} ({b['parameters'] / 1e6:.1f}M parameters): data-parallel "
          f"{b['data_parallel_median_step_seconds'] * 1e3:.1f} ms, searched ({b['search']}) "
          f"{b['searched_median_step_seconds'] * 1e3:.1f} ms, speedup {doc['searched_speedup']:.2f}x (target >= 1.2)")
