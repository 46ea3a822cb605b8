"""The steps of a job: validate → describe the topology → profile → plan → train → report.

Each step is a function of explicit inputs, so the two drivers share them: `job.local` calls them
in one process on this machine's worker processes (`autopar run JOB.yaml --local`); the operator
calls `validate` when a job arrives, `make_plan` in its planner pod with the topology it
discovered from node labels, `train_config` for its trainer pods, and `report` for the job's status.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from autopar.planner.errors import AutoparError
from autopar.planner.hardware import DeviceTopology

if TYPE_CHECKING:   # planner.ir imports torch; the operator builds trainer pods' arguments without it
    from autopar.planner.ir import OperatorGraph, Strategy

from .spec import JobSpecError, ParallelTrainingJob


@dataclass
class Prepared:
    """A validated job: its model built on the meta device and imported as an operator graph."""

    job: ParallelTrainingJob
    base_dir: Path                       # relative paths of the manifest resolve here
    options: dict[str, Any]              # the model factory's keyword arguments, batch included
    graph: OperatorGraph

    @property
    def world(self) -> int:
        return self.job.spec.devices.count

    def path(self, value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.base_dir / p


@dataclass
class PlanOutcome:
    """The plan a job trains, and what the simulator predicts for it and for data parallelism."""

    strategy: Strategy
    algorithm: str
    predicted_step_s: float
    data_parallel_step_s: float | None
    search_seconds: float
    result: Any = None                   # planner.search.PlanResult when the search ran
    notes: list[str] = field(default_factory=list)

    @property
    def predicted_speedup(self) -> float | None:
        if not self.data_parallel_step_s or not self.predicted_step_s:
            return None
        return self.data_parallel_step_s / self.predicted_step_s


# -- validate ------------------------------------------------------------------------------------

def model_options(job: ParallelTrainingJob) -> dict[str, Any]:
    """The factory's keyword arguments: ``spec.model.options`` plus ``batch`` from ``training.batchSize``."""
    opts = dict(job.spec.model.options)
    batch = job.spec.training.batch_size
    if batch is not None:
        if "batch" in opts and opts["batch"] != batch:
            raise JobSpecError(f"spec.training.batchSize is {batch} but spec.model.options.batch is {opts['batch']}; "
                               "give the batch size once (training.batchSize)")
        opts["batch"] = batch
    return opts


def validate(job: ParallelTrainingJob, base_dir: str | Path = ".", *, local: bool = True) -> Prepared:
    """What the schema cannot check: the model exists, takes these options and traces; with `local`,
    the files the spec names exist.  Raises `JobSpecError` naming the field."""
    base = Path(base_dir).resolve()
    spec = job.spec
    opts = checked_model_options(job)
    name = spec.model.name
    if ":" in name and local:
        _make_importable(base)
    if local:
        if spec.data.source == "file" and not (base / spec.data.path).expanduser().is_file():
            raise JobSpecError(f"spec.data.path: {spec.data.path!r} is not a file (relative paths are read from "
                               f"{base}); give the torch.save'd dict of input and label tensors")
        ref = spec.planner.plan_ref
        if spec.planner.algorithm == "pinned" and ref is not None:
            if ref.path is None:
                raise JobSpecError("spec.planner.planRef.configMap: a ConfigMap is only read in a cluster; "
                                   "with --local give planRef.path, the plan file")
            if not (base / ref.path).expanduser().is_file():
                raise JobSpecError(f"spec.planner.planRef.path: {ref.path!r} is not a file (relative paths are "
                                   f"read from {base}); write one with `autopar plan`")
    graph = _import_graph(name, opts, spec.training.dtype)
    return Prepared(job, base, opts, graph)


def checked_model_options(job: ParallelTrainingJob) -> dict[str, Any]:
    """`model_options`, checked against the zoo model's options (a ``package.module:factory`` model
    is checked when it is imported: locally by `validate`, in a cluster by its planner pod)."""
    opts = model_options(job)
    if ":" not in job.spec.model.name:
        _check_zoo_options(job.spec.model.name, opts)
    return opts


def _check_zoo_options(name: str, opts: dict[str, Any]) -> None:
    from .zoo_options import ZOO_OPTIONS     # the zoo's options without importing it (and torch)
    if name not in ZOO_OPTIONS:
        raise JobSpecError(f"spec.model.name: unknown model {name!r}; zoo models: {', '.join(ZOO_OPTIONS)}, "
                           "or 'package.module:factory' for your own")
    known = ZOO_OPTIONS[name]
    for key in opts:
        if key not in known:
            field_name = "spec.training.batchSize" if key == "batch" else f"spec.model.options.{key}"
            raise JobSpecError(f"{field_name}: model {name!r} has no option {key!r}; its options: "
                               + ", ".join(f"{k} (default {v!r})" for k, v in known.items()))


def _make_importable(base: Path) -> None:
    """A ``package.module:factory`` model is imported relative to the manifest's directory.  It is
    appended to sys.path, after the standard library and the installed packages (a directory
    holding e.g. an ``operator`` package must not shadow the standard library's); the worker
    processes this run starts inherit sys.path (multiprocessing passes it to a fork server or a
    spawned interpreter), so they import the model the same way."""
    if str(base) not in sys.path:
        sys.path.append(str(base))


def _import_graph(name: str, opts: dict[str, Any], dtype: str | None) -> OperatorGraph:
    import torch

    from autopar.planner.ir import import_spec
    from autopar.planner.zoo import load_model
    from autopar.planner.zoo import with_dtype
    try:
        with torch.device("meta"):
            spec = load_model(name, **opts)
        return import_spec(with_dtype(spec, dtype))
    except AutoparError as e:
        raise JobSpecError(f"spec.model: {e}") from e
    except TypeError as e:
        raise JobSpecError(f"spec.model.options: the factory of {name!r} does not take them ({e}); "
                           "give only the keyword arguments it accepts") from e


# -- topology and costs --------------------------------------------------------------------------

def local_topology(prepared: Prepared) -> DeviceTopology:
    """This machine as a topology: one device per worker process (`local:N`, planner.hardware)."""
    from autopar.planner.hardware import get_preset
    return get_preset(f"local:{prepared.world}")


def profile(prepared: Prepared, cache, *, recalibrate: bool = False, repeats: int = 5, warmup: int = 5,
            on_task: Callable[[int, int, str], None] | None = None,
            on_message: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure, on this machine, what the plans of this job need and the cache lacks: op times for
    every degree choice on the local devices, and the runtime calibration of ``local:N``
    (skipped when the cache has both).  Returns what was done.

    On the CPU even where the machine has a GPU: ``--local`` trains on gloo worker ranks, and
    ``local:N`` keys its op times by the CPU product (a GPU's times would be stored under the GPU's
    product and never read by this plan)."""
    import torch

    from autopar.planner.cost import profile_local
    t0 = time.perf_counter()

    def passes(first: bool):
        """`on_task` over both passes, each half of one bar."""
        return None if on_task is None else (lambda _m, i, n, op: on_task(i if first else n + i, 2 * n, op))

    report = profile_local([prepared.job.spec.model.name], workers=prepared.world, options=prepared.options,
                           cache=cache, repeats=repeats, warmup=warmup, device=torch.device("cpu"),
                           progress=passes(True))
    # the same tasks with the last-level cache evicted: each op is priced between the two (planner.sim.reuse)
    cold = profile_local([prepared.job.spec.model.name], workers=prepared.world, options=prepared.options,
                         cache=cache, repeats=repeats, warmup=warmup, device=torch.device("cpu"),
                         progress=passes(False), cache_level="llc", cold_keys=True)
    calibration = ensure_calibration(cache, prepared.world, recalibrate=recalibrate, progress=on_message)
    from autopar.trainer.calibrate import ensure_model_overheads
    overheads = ensure_model_overheads(cache, prepared.job.spec.model.name, prepared.options, prepared.world,
                                       remeasure=recalibrate, progress=on_message,
                                       fingerprint=prepared.graph.fingerprint)
    return {"measured": len(report.measured), "cached": report.cached, "skipped": len(report.skipped),
            "measured_cold": len(cold.measured),
            "device": report.device_kind, "seconds": round(time.perf_counter() - t0, 1),
            "calibration": calibration, "overheads": overheads}


def ensure_calibration(cache, workers: int, *, recalibrate: bool = False,
                       progress: Callable[[str], None] | None = None, device: str = "cpu") -> dict[str, Any]:
    """The runtime calibration of `workers` local ranks on `device` (trainer.calibrate; ``cpu``:
    the ``local:<workers>`` preset's gloo ranks, ``cuda``: NCCL ranks on this machine's GPUs): kept
    when the cache has it, measured (about 30 s) and saved otherwise, or with `recalibrate`."""
    from autopar.trainer.calibrate import calibrate, calibration_target, summary, summary_line

    product, backend = calibration_target(workers, device)
    existing = cache.calibration(product, backend, workers)
    if existing is not None and not recalibrate:
        when = dict(existing.details).get("date", "?")
        return {"status": "kept", "line": f"{summary_line(existing)} (measured {when}; --recalibrate to measure again)",
                **summary(existing)}
    t0 = time.perf_counter()
    cal = calibrate(workers, progress=progress, device=device)
    cache.put_calibration(cal)
    cache.save()
    return {"status": "measured", "line": summary_line(cal), **summary(cal),
            "seconds": round(time.perf_counter() - t0, 1)}


# -- plan ----------------------------------------------------------------------------------------

def make_plan(prepared: Prepared, topology: DeviceTopology, cost, *, progress: bool = False,
              plan_text: str | None = None) -> PlanOutcome:
    """The plan of ``spec.planner``: the search (`auto`, `mcmc`), OptCNN, a named baseline, or the
    pinned plan file (`plan_text`, or ``planRef.path``), simulated beside data parallelism."""
    from autopar.planner.search import named_strategy, plan
    from autopar.planner.sim import TaskGraphBuilder, loss_allreduce_s, simulate_strategy

    settings = prepared.job.spec.planner
    optimizer = prepared.job.spec.training.optimizer
    graph = prepared.graph
    t0 = time.perf_counter()
    if settings.algorithm in ("auto", "mcmc"):
        result = plan(graph, topology, cost, budget_s=settings.budget_seconds, seed=settings.seed,
                      max_proposals=settings.max_proposals, use_optcnn=settings.algorithm == "auto",
                      progress=progress)
        dp = result.candidates.get("data-parallel")
        notes = ([result.note] if result.note else []) + list(getattr(getattr(dp, "strategy", None), "notes", ()))
        return PlanOutcome(result.strategy, settings.algorithm, result.step_time, dp.step_time if dp else None,
                           time.perf_counter() - t0, result, notes)
    builder = TaskGraphBuilder(graph, topology, cost, optimizer)
    if settings.algorithm == "pinned":
        strategy = _pinned(prepared, topology, plan_text)
    else:
        strategy = named_strategy(settings.algorithm, graph, topology)
    res, _, _ = simulate_strategy(builder, strategy)
    dp_res, _, _ = simulate_strategy(builder, named_strategy("data-parallel", graph, topology))
    loss = loss_allreduce_s(builder)     # each trained step ends in it, as the search's steps hold it
    return PlanOutcome(strategy, settings.algorithm, res.step_time + loss, dp_res.step_time + loss,
                       time.perf_counter() - t0, notes=list(strategy.notes))


def recorded_plan(prepared: Prepared, topology: DeviceTopology, path: str | Path) -> PlanOutcome:
    """The plan of a plan file with the predictions recorded in it (a resumed run trains it on)."""
    from autopar.planner.plan_file import load_plan, read_plan
    try:
        strategy = load_plan(path, prepared.graph, topology)
    except AutoparError as e:
        raise JobSpecError(f"{path}: {e}") from e
    predicted = read_plan(path).predicted
    baselines = predicted.get("baselines") or {}
    return PlanOutcome(strategy, prepared.job.spec.planner.algorithm, float(predicted.get("stepSeconds") or 0.0),
                       baselines.get("data-parallel"), 0.0)


def _pinned(prepared: Prepared, topology: DeviceTopology, plan_text: str | None) -> Strategy:
    import tempfile

    from autopar.planner.plan_file import load_plan
    ref = prepared.job.spec.planner.plan_ref
    try:
        if plan_text is None:
            return load_plan(prepared.path(ref.path), prepared.graph, topology)
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / Path(ref.key).name
            p.write_text(plan_text)
            return load_plan(p, prepared.graph, topology)
    except AutoparError as e:
        raise JobSpecError(f"spec.planner.planRef: {e}") from e


def write_plan(outcome: PlanOutcome, path: str | Path, prepared: Prepared, topology: DeviceTopology) -> Path:
    """The plan file the trainer reads (planner.plan_file), with the prediction it was chosen on."""
    from autopar.planner.plan_file import save_plan
    what = outcome.result if outcome.result is not None else outcome.strategy
    baselines = None if outcome.result is not None else {"data-parallel": outcome.data_parallel_step_s}
    return save_plan(what, path, prepared.graph, topology,
                     predicted_step_s=None if outcome.result is not None else outcome.predicted_step_s,
                     baselines=baselines, model_options=prepared.options)


def simulated_artifacts(prepared: Prepared, topology: DeviceTopology, cost, strategy: Strategy, *,
                        trace: str | Path | None = None, picture: str | Path | None = None) -> None:
    """The plan's simulated step as Chrome trace-event JSON (`trace`) and as a picture (`picture`)."""
    import json

    from autopar.planner.fileio import atomic_write
    from autopar.planner.sim import TaskGraphBuilder, simulate_strategy, simulated_trace
    builder = TaskGraphBuilder(prepared.graph, topology, cost, prepared.job.spec.training.optimizer)
    _, tl, tg = simulate_strategy(builder, strategy)
    if trace is not None:
        doc = simulated_trace(prepared.graph, topology, tl, tg, name=strategy.name)
        atomic_write(trace, lambda f: json.dump(doc, f))
    if picture is not None:
        from autopar.planner.plot import plot_strategy
        plot_strategy(str(picture), prepared.graph, topology, strategy, tl, tg, builder=builder)


# -- train ---------------------------------------------------------------------------------------

def train_config(prepared: Prepared, strategy: str, *, topology: str, checkpoint_dir: str | None,
                 profile_cache: str | None = None, trace: str | None = None, progress: bool = False,
                 metrics_port: int | None = None, resume: bool = False, retime: bool = False) -> dict[str, Any]:
    """Keyword arguments of `autopar.trainer.train_main` for this job under `strategy` (a plan file
    or a named strategy): the same fields a trainer pod gets as `autopar train` options."""
    t = prepared.job.spec.training
    ckpt = prepared.job.spec.checkpoint
    data = prepared.path(prepared.job.spec.data.path) if prepared.job.spec.data.source == "file" else None
    return {
        "model": prepared.job.spec.model.name, "model_options": dict(prepared.options), "strategy": strategy,
        "nproc": prepared.world, "steps": t.steps, "dtype": t.dtype, "optimizer": t.optimizer,
        "lr": t.learning_rate, "momentum": t.momentum, "seed": t.seed, "data": str(data) if data else None,
        "checkpoint_dir": checkpoint_dir, "checkpoint_every": ckpt.every_steps if checkpoint_dir else 0,
        "checkpoint_final": checkpoint_dir is not None,
        "resume": resume, "topology": topology, "profile_cache": profile_cache, "trace": trace,
        "graceful_stop": True, "progress": progress, "log": not progress, "metrics_port": metrics_port,
        "retime": retime,
    }


# -- report --------------------------------------------------------------------------------------

def report(prepared: Prepared, topology: DeviceTopology, outcome: PlanOutcome, trained: dict | None, *,
           compare: dict | None = None, phase: str = "Succeeded", message: str | None = None,
           files: dict[str, str] | None = None, seconds: dict[str, float] | None = None,
           calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's report (what `autopar run --json` prints and the job's status carries)."""
    measured = trained.get("measured_step_s") if trained else None
    predicted, dp_predicted = outcome.predicted_step_s, outcome.data_parallel_step_s
    retime = trained.get("retime") if trained else None
    if retime and trained.get("predicted_step_s"):      # `autopar run --retime`: the ranks' price of the plan
        predicted = trained["predicted_step_s"]
    if compare is not None and compare.get("retime") and compare.get("predicted_step_s"):
        dp_predicted = compare["predicted_step_s"]
    doc: dict[str, Any] = {
        "job": prepared.job.name, "namespace": prepared.job.metadata.namespace, "phase": phase,
        "message": message,
        "model": prepared.graph.name, "model_ref": prepared.job.spec.model.name,
        "topology": topology.name, "devices": topology.num_devices,
        "algorithm": outcome.algorithm, "strategy": outcome.strategy.name,
        "found_by": outcome.result.source if outcome.result is not None else outcome.algorithm,
        "predicted_step_s": predicted,
        "data_parallel_predicted_step_s": outcome.data_parallel_step_s,
        "predicted_speedup": outcome.predicted_speedup,
        "measured_step_s": measured,
        "measured_cv": trained.get("measured_cv") if trained else None,
        "measured_p10_s": _quantile(trained, 0.1), "measured_p90_s": _quantile(trained, 0.9),
        "prediction_error": (predicted / measured - 1.0) if measured and predicted else None,
        # the search's own price of the plan, and the passes that priced it again (`autopar run --retime`)
        "planned_step_s": outcome.predicted_step_s, "retime": retime,
        # where the prediction was off: the step's parts on the busiest rank (`autopar train`)
        "predicted_parts_s": trained.get("predicted_parts_s") if trained else None,
        "measured_parts_s": trained.get("measured_parts_s") if trained else None,
        "furthest_off": trained.get("furthest_off") if trained else None,
        "steps": trained.get("steps") if trained else None,
        "stopped_at_step": trained.get("stopped_at_step") if trained else None,
        "resumed_from_step": trained.get("resumed_from_step") if trained else None,
        "final_loss": trained.get("final_loss") if trained else None,
        "samples_per_second": trained.get("samples_per_second") if trained else None,
        "checkpoints": trained.get("checkpoints", []) if trained else [],
        "notes": list(outcome.notes),
        "calibration": calibration,
    }
    if compare is not None:
        dp = compare.get("measured_step_s")
        doc["data_parallel_measured_step_s"] = dp
        doc["data_parallel_prediction_error"] = (dp_predicted / dp - 1.0 if dp and dp_predicted else None)
        if dp_predicted is not outcome.data_parallel_step_s:
            doc["data_parallel_retimed_step_s"] = dp_predicted
            doc["data_parallel_retime"] = compare.get("retime")
        doc["measured_speedup"] = dp / measured if dp and measured else None
        doc["data_parallel_furthest_off"] = compare.get("furthest_off")
    doc["files"] = dict(files or {})
    doc["seconds"] = dict(seconds or {})
    return doc


def _quantile(trained: dict | None, q: float) -> float | None:
    """A quantile of the measured steps, over the steps the median is taken on (neither traced nor right
    after a retiming pass, without the run's first step; `trainer.metrics.median_step`)."""
    if not trained or not trained.get("step_seconds"):
        return None
    retimed = (trained.get("retime") or {}).get("settling_steps") or []
    traced = set(trained.get("traced_steps") or []) | set(retimed)
    first = (trained.get("resumed_from_step") or 0) + 1
    xs = [t for i, t in enumerate(trained["step_seconds"], start=first) if i not in traced] or trained["step_seconds"]
    xs = sorted(xs[1:] if len(xs) > 1 else xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]
