"""`autopar run JOB.yaml --local`: the whole job on this machine, no cluster.

    autopar run examples/quickstart.yaml --local             # plan, train, report
    autopar run examples/quickstart.yaml --local --compare   # also measure data parallelism
    autopar run examples/quickstart.yaml --local --json      # the report as JSON on stdout

The local driver of `job.pipeline`: the manifest is validated first (a bad one writes nothing);
the job's devices become ``local:N``, N worker processes with the calibrated links between them;
what the plans need and the profile cache lacks is measured; the plan is found with the job's
planner settings and trained for the job's steps with checkpoints.  Everything goes to a run
directory::

    job.yaml               the manifest with every default written out
    topology.yaml          this machine as the planner saw it (one device per worker process)
    plan.yaml              the plan file (autopar train --strategy reads it)
    plan.png               the plan and its simulated timeline
    simulated-trace.json   the simulated step, Chrome trace-event JSON (ui.perfetto.dev)
    measured-trace.json    two measured steps of the plan (torch.profiler), the same format
    metrics.prom           the job's gauges (autopar_job_*) in Prometheus' text format
    metrics.json           every step's time and loss
    report.json            what `--json` prints
    checkpoints/           strategy-independent checkpoints (any plan resumes from them)

Ctrl-C while training stops the ranks after their current step and writes a checkpoint there;
``autopar run JOB.yaml --local --resume RUN_DIR`` trains the same plan on from it.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from autopar.planner.fileio import atomic_write

from . import pipeline
from .spec import JobSpecError, load_job

RUNS_DIR = "autopar-runs"


class _Ui:
    """Progress on stderr: rich bars on a terminal, plain lines elsewhere (logs, CI)."""

    def __init__(self, enabled: bool = True) -> None:
        from rich.console import Console
        self.console = Console(stderr=True, highlight=False)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal

    def step(self, text: str) -> None:
        if self.enabled:
            self.console.print(f"[bold]▸ {text}[/bold]" if self.live else f"autopar: {text}", soft_wrap=not self.live)

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(f"  [dim]{text}[/dim]" if self.live else f"  {text}", soft_wrap=not self.live)

    def bar(self, label: str):
        """A context manager yielding ``update(done, total, what)``."""
        from contextlib import contextmanager

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        @contextmanager
        def cm():
            if not self.live:
                last = [0.0]

                def update(done: int, total: int, what: str) -> None:
                    if self.enabled and (time.monotonic() - last[0] > 10 or done == total):
                        last[0] = time.monotonic()
                        print(f"  {label}: {done}/{total}", file=sys.stderr, flush=True)
                yield update
                return
            with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[what]}"),
                          TimeElapsedColumn(), console=self.console, transient=False) as progress:
                task = progress.add_task(label, total=None, what="")

                def update(done: int, total: int, what: str) -> None:
                    progress.update(task, completed=done, total=total, what=what[:40])
                yield update
        return cm()


def run_job(path: str | Path, *, run_dir: str | Path | None = None, compare: bool = False,
            profile_cache: str | Path | None = None, recalibrate: bool = False, profile: bool = True,
            metrics_port: int | None = None, progress: bool = True,
            resume: str | Path | None = None, retime: bool = False) -> tuple[dict[str, Any], int]:
    """Run the job of manifest `path` here; returns (report, exit status: 0, or 130/143 when Ctrl-C
    or SIGTERM stopped it).

    `retime`: the trainings price their plans again with their ops timed in the ranks
    (`autopar.trainer.retime`), and the report's predictions are those prices.

    `resume`: the run directory of an earlier run of this job that stopped; its plan is trained
    on from its latest checkpoint (no profiling, no search) and its report is rewritten."""
    from autopar.planner.cost import CostModel, ProfileCache, default_cache_path

    ui = _Ui(progress)
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    job = load_job(path)
    try:
        prepared = pipeline.validate(job, Path(path).parent)
    except JobSpecError as e:
        raise JobSpecError(f"{path}: {e}") from e
    topology = pipeline.local_topology(prepared)
    ui.step(f"{job.name}: {prepared.graph.summary().splitlines()[0]}")
    ui.note(f"devices: {prepared.world} worker processes on this machine ({topology.name})")
    if resume is not None:
        run = _resumable_run(Path(resume), job, prepared, topology)
        files: dict[str, str] = {"run_dir": str(run), "job": "job.yaml", "topology": "topology.yaml"}
    else:
        run = _new_run_dir(run_dir, job.name)
        files = {"run_dir": str(run)}
        atomic_write(run / "job.yaml", lambda f: yaml.safe_dump(job.to_manifest(), f, sort_keys=False))
        files["job"] = "job.yaml"
        from autopar.planner.hardware import save_topology
        save_topology(topology, run / "topology.yaml")
        files["topology"] = "topology.yaml"

    cache_path = Path(profile_cache) if profile_cache else default_cache_path()
    cache = ProfileCache.load(cache_path)
    if cache.notice:
        print(f"autopar: {cache.notice}", file=sys.stderr)
    outcome = None
    trained = None
    calibration = None
    try:
        if profile and resume is None:
            t0 = time.perf_counter()
            ui.step(f"profiling {job.spec.model.name} for {topology.name} (cache {cache_path})")
            with ui.bar("profiling ops") as update:
                done = pipeline.profile(prepared, cache, recalibrate=recalibrate,
                                        on_task=lambda i, n, op: update(i, n, op),
                                        on_message=lambda m: ui.note(f"calibrating: {m}"))
            seconds["profile"] = round(time.perf_counter() - t0, 1)
            calibration = done["calibration"]
            ui.note(f"{done['measured']} task shapes measured ({done['measured_cold']} again with the last-level cache "
                    f"evicted), {done['cached']} already cached; calibration "
                    f"{done['calibration']['status']}")
        cost = CostModel(cache).bind(prepared.graph)

        t0 = time.perf_counter()
        settings = job.spec.planner
        if resume is not None:
            ui.step(f"resuming {run} from its latest checkpoint")
            outcome = pipeline.recorded_plan(prepared, topology, run / "plan.yaml")
            plan_path = run / "plan.yaml"
        else:
            ui.step(f"planning ({settings.algorithm}" + (f", budget {settings.budget_seconds:g} s)"
                                                         if settings.algorithm in ("auto", "mcmc") else ")"))
            outcome = pipeline.make_plan(prepared, topology, cost, progress=ui.live)
            plan_path = pipeline.write_plan(outcome, run / "plan.yaml", prepared, topology)
            pipeline.simulated_artifacts(prepared, topology, cost, outcome.strategy,
                                         trace=run / "simulated-trace.json", picture=run / "plan.png")
            seconds["plan"] = round(time.perf_counter() - t0, 1)
        files.update(plan=plan_path.name, simulated_trace="simulated-trace.json", picture="plan.png")
        ui.note(_plan_line(outcome))

        from autopar.trainer import train_main
        t0 = time.perf_counter()
        ui.step(f"training {outcome.strategy.name!r} for {job.spec.training.steps} steps on {prepared.world} ranks")
        ckpt_dir = _checkpoint_dir(prepared, run)
        trace = run / "measured-trace.json" if job.spec.training.steps > 2 and resume is None else None
        trained = train_main(**pipeline.train_config(
            prepared, str(plan_path), topology=topology.name, checkpoint_dir=str(ckpt_dir),
            profile_cache=str(cache_path), trace=str(trace) if trace else None, progress=ui.live,
            metrics_port=metrics_port, resume=resume is not None, retime=retime))
        seconds["train"] = round(time.perf_counter() - t0, 1)
        if trained.get("trace") or (run / "measured-trace.json").exists():
            files["measured_trace"] = "measured-trace.json"
        files["checkpoints"] = str(ckpt_dir)
        stopped = bool(trained.get("stopped_at_step"))

        dp = None
        if compare and not stopped:
            t0 = time.perf_counter()
            ui.step(f"training data-parallel for {job.spec.training.steps} steps (--compare)")
            dp = train_main(**pipeline.train_config(prepared, "data-parallel", topology=topology.name,
                                                    checkpoint_dir=None, profile_cache=str(cache_path),
                                                    progress=ui.live, retime=retime))
            seconds["compare"] = round(time.perf_counter() - t0, 1)
            stopped = bool(dp.get("stopped_at_step"))
        seconds["total"] = round(time.perf_counter() - started, 1)
        phase = "Stopped" if stopped else "Succeeded"
        last = dp if dp is not None and dp.get("stopped_at_step") else trained
        how = "Ctrl-C" if (last.get("stop_signal") or "SIGINT") == "SIGINT" else last["stop_signal"]
        doc = pipeline.report(prepared, topology, outcome, trained, compare=dp, phase=phase, files=files,
                              seconds=seconds, calibration=calibration,
                              message=f"stopped by {how}; `autopar run {path} --local --resume {run}` continues "
                                      "from the checkpoint" if stopped else None)
        _write_outputs(run, doc, trained, files)
        from autopar.trainer.train import exit_status
        return doc, exit_status(last)
    except BaseException as e:
        phase = "Stopped" if isinstance(e, KeyboardInterrupt) else "Failed"
        message = "stopped by Ctrl-C" if phase == "Stopped" else f"{type(e).__name__}: {e}".splitlines()[0]
        if outcome is not None:
            doc = pipeline.report(prepared, topology, outcome, trained, phase=phase, message=message, files=files,
                                  seconds=seconds)
        else:
            doc = {"job": job.name, "namespace": job.metadata.namespace, "phase": phase, "message": message,
                   "files": files, "seconds": seconds}
        atomic_write(run / "report.json", lambda f: json.dump(doc, f, indent=2))
        raise


def _checkpoint_dir(prepared: pipeline.Prepared, run: Path) -> Path:
    path = prepared.job.spec.checkpoint.path
    return prepared.path(path) if path else run / "checkpoints"


def _resumable_run(run: Path, job, prepared: pipeline.Prepared, topology) -> Path:
    """`run` when it is a run directory of this very job spec with a plan and a checkpoint."""
    from .spec import parse_job
    if not (run / "job.yaml").is_file() or not (run / "plan.yaml").is_file():
        raise JobSpecError(f"--resume {run}: not a run directory of `autopar run` (no job.yaml and plan.yaml)")
    earlier = parse_job(yaml.safe_load((run / "job.yaml").read_text()), source=str(run / "job.yaml"))
    if earlier.spec != job.spec:
        raise JobSpecError(f"--resume {run}: that run was made for another spec of the job (compare "
                           f"{run / 'job.yaml'} with the manifest); start a new run instead")
    from autopar.trainer.checkpoint import latest
    ckpt = _checkpoint_dir(prepared, run)
    if latest(ckpt) is None:
        raise JobSpecError(f"--resume {run}: no checkpoint in {ckpt} to continue from; start a new run instead")
    return run


def _new_run_dir(run_dir: str | Path | None, name: str) -> Path:
    """`run_dir` (refused when it holds files), or a fresh ``autopar-runs/<job>-<UTC time>``."""
    if run_dir is not None:
        p = Path(run_dir)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise JobSpecError(f"--run-dir {p}: exists and is not an empty directory; give a new one "
                               f"(or leave it out for {RUNS_DIR}/<job>-<time>)")
        p.mkdir(parents=True, exist_ok=True)
        return p
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(RUNS_DIR) / f"{name}-{stamp}"
    p, i = base, 1
    while p.exists():
        i += 1
        p = base.with_name(f"{base.name}-{i}")
    p.mkdir(parents=True)
    return p


def _write_outputs(run: Path, doc: dict[str, Any], trained: dict[str, Any], files: dict[str, str]) -> None:
    """metrics.prom, metrics.json and report.json, each written whole."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    from .metrics import JOB_GAUGES, SPEEDUP_GAUGE

    registry = CollectorRegistry()
    labels = {"namespace": doc["namespace"], "job": doc["job"]}
    values = {"simulatedStepSeconds": doc["predicted_step_s"], "actualStepSeconds": doc["measured_step_s"],
              "predictionError": doc["prediction_error"],
              "dataParallelStepSeconds": doc["data_parallel_predicted_step_s"]}
    gauges = [(*JOB_GAUGES[field], value) for field, value in values.items()]
    gauges.append((*SPEEDUP_GAUGE, doc["predicted_speedup"]))
    for name, help_text, value in gauges:
        if value is not None:
            Gauge(name, help_text, list(labels), registry=registry).labels(**labels).set(value)
    run.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(run / "metrics.prom"), registry)
    files["metrics"] = "metrics.prom"
    steps = {"step_seconds": trained.get("step_seconds"), "losses": trained.get("losses"),
             "traced_steps": trained.get("traced_steps"), "resumed_from_step": trained.get("resumed_from_step")}
    atomic_write(run / "metrics.json", lambda f: json.dump(steps, f))
    files["step_metrics"] = "metrics.json"
    files["report"] = "report.json"
    doc["files"] = dict(files)
    atomic_write(run / "report.json", lambda f: json.dump(doc, f, indent=2))


def _plan_line(outcome: pipeline.PlanOutcome) -> str:
    line = f"plan {outcome.strategy.name!r}: simulated {_ms(outcome.predicted_step_s)} per step"
    if outcome.data_parallel_step_s:
        line += f", data parallelism {_ms(outcome.data_parallel_step_s)} ({outcome.predicted_speedup:.2f}×)"
    return line + f"; found in {outcome.search_seconds:.1f} s"


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.1f} ms"


def format_report(doc: dict[str, Any]) -> str:
    """The short human report `autopar run` prints (the JSON has the same numbers)."""
    lines = [f"{doc['job']}: {doc['model']} on {doc['topology']} ({doc['devices']} worker processes) — {doc['phase']}"]
    how = doc["algorithm"] if doc.get("found_by") in (None, doc["algorithm"]) else f"{doc['algorithm']}: {doc['found_by']}"
    planned = doc.get("planned_step_s") or doc["predicted_step_s"]     # the search's price (--retime: not the ranks')
    lines.append(f"  plan        {doc['strategy']!r} ({how}): simulated {_ms(planned)}"
                 + (f" vs data parallelism {_ms(doc['data_parallel_predicted_step_s'])}: "
                    + (f"{doc['predicted_speedup']:.2f}× faster (simulated)" if doc["predicted_speedup"] >= 1.005
                       else f"{doc['predicted_speedup']:.2f}×")
                    if doc.get("predicted_speedup") else ""))
    if doc.get("measured_step_s"):
        spread = (f"p10 {_ms(doc['measured_p10_s'])}, p90 {_ms(doc['measured_p90_s'])}"
                  + (f", ±{100 * doc['measured_cv']:.1f} %" if doc.get("measured_cv") is not None else ""))
        lines.append(f"  measured    {_ms(doc['measured_step_s'])} per step (median; {spread}); "
                     f"final loss {doc['final_loss']:.4f}")
        lines.append(f"  prediction  error {100 * doc['prediction_error']:+.1f} % (simulated / measured - 1)"
                     + (f"; furthest off: {doc['furthest_off']}" if doc.get("furthest_off") else ""))
        if doc.get("planned_step_s") and doc.get("retime"):
            runtime = doc["retime"].get("runtime") or {}
            from autopar.trainer.retime import runtime_words
            timed = ["the plan's ops"] + runtime_words(runtime)
            what = timed[0] if len(timed) == 1 else ", ".join(timed[:-1]) + " and " + timed[-1]
            alone = runtime.get("ops_only_step_s")
            lines.append(f"  retimed     {what} timed in the ranks price it at {_ms(doc['predicted_step_s'])}; "
                         + (f"the ops alone at {_ms(alone)} ({100 * (alone / doc['measured_step_s'] - 1):+.1f} %); "
                            if alone else "")
                         + f"the search's profile at {_ms(doc['planned_step_s'])} "
                         f"({100 * (doc['planned_step_s'] / doc['measured_step_s'] - 1):+.1f} %)")
    if doc.get("data_parallel_measured_step_s"):
        err, off = doc.get("data_parallel_prediction_error"), doc.get("data_parallel_furthest_off")
        retimed, dp = doc.get("data_parallel_retimed_step_s"), doc["data_parallel_measured_step_s"]
        searched = doc.get("data_parallel_predicted_step_s")
        priced = (f"priced {_ms(retimed)} by its ranks: " if retimed else "")
        alone = ((doc.get("data_parallel_retime") or {}).get("runtime") or {}).get("ops_only_step_s")
        beside = ((f", the ops alone {100 * (alone / dp - 1):+.1f} %" if retimed and alone else "")
                  + (f", the search's profile {100 * (searched / dp - 1):+.1f} %" if retimed and searched else ""))
        why = "" if err is None else (f" ({priced}prediction error {100 * err:+.1f} %{beside}"
                                      + (f"; furthest off: {off}" if off else "") + ")")
        lines.append(f"  compare     data parallelism measured {_ms(doc['data_parallel_measured_step_s'])}{why}"
                     f": the plan is {doc['measured_speedup']:.2f}× faster, measured")
    for note in doc.get("notes") or []:
        lines.append(f"  note        {note}")
    if doc.get("stopped_at_step"):
        lines.append(f"  stopped     after step {doc['stopped_at_step']} (Ctrl-C)")
    files = doc.get("files", {})
    if files.get("run_dir"):
        lines.append(f"  run         {files['run_dir']}/")
        shown = [files[k] for k in ("plan", "picture", "simulated_trace", "measured_trace", "metrics", "report")
                 if files.get(k)]
        lines.append(f"              {'  '.join(shown)}")
    if doc.get("checkpoints"):
        lines.append(f"  checkpoint  {doc['checkpoints'][-1]}")
    return "\n".join(lines)
