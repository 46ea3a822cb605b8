"""`autopar train`: train a model under a plan on N local ranks or under torchrun.

    autopar train --model lenet --strategy data-parallel --nproc 2 --steps 10 --json
    autopar train --model rnnlm -o vocab=8192 --strategy plan.yaml --nproc 2 --steps 50 \\
        --checkpoint-dir ckpt --checkpoint-every 10 --metrics-port 9100
    torchrun --nproc-per-node 2 -m autopar.cli train --model lenet --strategy data-parallel --steps 10
    torchrun ... -m autopar.cli train ... --checkpoint-dir /ckpt --resume-if-present --checkpoint-final \
        --metrics-port 9090 --metrics-addr 0.0.0.0          # what a trainer pod runs (operator.resources)

The parent process prepares the job once — builds the model from its seed, imports its operator
graph, resolves the plan and refuses it before any rank starts when it does not fit
(`trainer.validate`), and simulates its step time — then starts the ranks (`trainer.launch`).
Each rank runs a `Trainer`: the plan's share of the model (`trainer.runtime`), the optimizer on
its shards (`trainer.optim`), the data of every step (`trainer.data`), checkpoints
(`trainer.checkpoint`) and, on rank 0, the metrics (`trainer.metrics`) and the JSON summary.

A graceful stop (`TrainConfig.graceful_stop`, on by default in the CLI) turns SIGINT (Ctrl-C) and
SIGTERM (what Kubernetes sends a pod, and torchrun forwards to its workers) into "finish this step,
agree on it with one all-reduce, checkpoint, stop": the summary's ``stopped_at_step`` and
``stop_signal`` say so, and `exit_status` gives the conventional status of such a run (128 + the
signal: 130 after Ctrl-C, 143 after SIGTERM).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from autopar.planner.fileio import atomic_write
from autopar.planner.ir import OperatorGraph, Strategy
from autopar.planner.zoo import with_dtype

from . import checkpoint as ckpt
from .comm import ProcessGroups
from .config import _FLOATS, Job, TrainConfig  # noqa: F401 - Job and TrainConfig are train's API too
from .errors import TrainerConfigError
from .launch import (DEFAULT_TIMEOUT, check_gpus, init_from_env, pick_backend, rank_device, run_local,
                     under_torchrun)
from .metrics import StepMetrics, default_linger, median_step, parse_seconds
from .optim import STATE_KEYS, OptimizerConfig
from .parts import furthest_off, measured_parts, simulate_parts
from .session import Trainer
from .sync import DEFAULT_BUCKET_BYTES
from .trace import StepTracer
from .validate import check_plan

#: ``rank:step`` — that rank exits abruptly at the start of that step (fault injection for tests
#: and drills of the failure path; never set in normal runs).
FAULT_ENV = "AUTOPAR_FAULT_INJECT"
#: A plan file records its predicted step and not its parts; they are simulated again for the
#: run and reported where that simulation gives the recorded step within this relative tolerance
#: (the same profile cache: the simulation is deterministic).
PLAN_FILE_PARTS_TOLERANCE = 0.005


def prepare(cfg: TrainConfig, world: int, check: bool = True) -> Job:
    """Build the model, import its graph, resolve and check the plan, predict its step time."""
    from autopar.planner.hardware import resolve_topology
    from autopar.planner.ir import import_spec
    from autopar.planner.zoo import load_model

    spec = with_dtype(load_model(cfg.model, **cfg.model_options), cfg.dtype)
    graph = import_spec(spec)
    topology = resolve_topology(cfg.topology or f"local:{world}")
    strategy = resolve_strategy(cfg.strategy, graph, topology, spec.options)
    if check:
        check_plan(graph, strategy, world, spec.module)
    if cfg.retime:
        from .retime import check_retime
        check_retime(topology, world, pick_backend(cfg.device)[1])
    predicted, note = _plan_file_prediction(cfg.strategy)
    simulated, sim_note, parts = predict(graph, topology, strategy, cfg)
    if predicted is None:
        predicted, note = simulated, sim_note
    elif simulated is None or abs(simulated / predicted - 1.0) > PLAN_FILE_PARTS_TOLERANCE:
        # The plan file's number came from another profile: these parts would not add up to it.
        parts = None
    return Job(cfg, spec, graph, strategy, predicted, note, parts, topology)



def _plan_file_prediction(strategy: Any) -> tuple[float | None, str]:
    """The step time a plan file records (what the search predicted when it wrote the plan)."""
    from pathlib import Path
    if isinstance(strategy, Strategy) or not Path(str(strategy)).is_file():
        return None, ""
    from autopar.planner.plan_file import read_plan
    seconds = read_plan(strategy).predicted.get("stepSeconds")
    return (float(seconds), f"recorded in plan file {strategy}") if seconds else (None, "")


def resolve_strategy(strategy: Any, graph: OperatorGraph, topology, model_options=None) -> Strategy:
    """A `Strategy`, a named strategy (planner.search.named) or a plan file (planner.plan_file)."""
    from pathlib import Path

    from autopar.planner.search import list_named, named_strategy
    if isinstance(strategy, Strategy):
        return strategy
    if strategy in list_named():
        return named_strategy(strategy, graph, topology)
    if not Path(strategy).exists():
        raise TrainerConfigError(f"--strategy {strategy!r} is neither a named strategy ({', '.join(list_named())}) "
                                 "nor an existing plan file")
    try:
        from autopar.planner.plan_file import load_plan
    except ImportError as e:
        raise TrainerConfigError(f"plan file {strategy}: this installation cannot read plan files yet "
                                 f"(planner.plan_file is missing); use a named strategy") from e
    return load_plan(strategy, graph, topology, model_options=model_options)


def predict(graph: OperatorGraph, topology, strategy: Strategy,
            cfg: TrainConfig) -> tuple[float | None, str, dict[str, float] | None]:
    """The simulator's step time for the plan (profile cache where measured, roofline elsewhere),
    how it was obtained, and the simulated step's parts on its busiest device
    (`trainer.parts.simulate_parts`)."""
    if (cfg.topology is None and any(d.is_cpu for d in topology.devices)
            and pick_backend(cfg.device)[1] == "cuda"):
        # local:N describes CPU worker ranks; a prediction for it says nothing about these GPUs
        return None, ("no prediction: training on CUDA, and local:N describes CPU ranks; pass --topology with a "
                      "topology file naming this machine's GPUs (examples/topologies), after `autopar profile` "
                      "measured them"), None
    try:
        from pathlib import Path

        from autopar.planner.cost import CostModel, ProfileCache, default_cache_path
        from autopar.planner.sim import TaskGraphBuilder
        path = Path(cfg.profile_cache) if cfg.profile_cache else default_cache_path()
        cost = CostModel(ProfileCache.load(path)).bind(graph)
        builder = TaskGraphBuilder(graph, topology, cost, cfg.optimizer.name)
        seconds, parts, _ = simulate_parts(builder, strategy, barrier=False)   # its steps run back to back
        return seconds, f"simulated on {topology.name}", parts
    except Exception as e:  # noqa: BLE001 - a prediction is informative; training does not need it
        return None, f"no prediction: {type(e).__name__}: {e}", None


def _model_dtype(graph: OperatorGraph) -> str:
    specs = list(graph.param_specs.values())
    return specs[0].dtype if specs else "float32"


def _maybe_fault(rank: int, step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec:
        r, _, s = spec.partition(":")
        if int(r) == rank and int(s) == step:
            os._exit(17)


def resolve_resume(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with ``--resume-if-present`` decided: resume when `checkpoint.latest` finds a checkpoint
    in the directory, start fresh otherwise (the summary's ``resumed_from_step`` is None then).

    Decided once, before any rank starts, in the parent of local ranks; under torchrun every rank
    decides for itself before its first step (`rank_main` then checks that all start at the same step)."""
    if not cfg.resume_if_present:
        return cfg
    found = ckpt.latest(cfg.checkpoint_dir) is not None
    return dataclasses.replace(cfg, resume=found, resume_if_present=False)


def rank_main(rank: int, world: int, job: Job, device_kind: str = "cpu") -> dict | None:
    """The training loop of one rank; rank 0 returns the run's summary."""
    cfg = job.config
    device = rank_device(device_kind, int(os.environ.get("LOCAL_RANK", rank)) if device_kind == "cuda" else rank)
    groups = ProcessGroups()
    resume_state = None
    if cfg.resume:
        resume_state = ckpt.load(cfg.checkpoint_dir)
    trainer = Trainer(job, rank, world, groups, device, resume_state)
    if world > 1 and cfg.checkpoint_dir:
        _check_same_start(trainer, rank)
    metrics = None
    linger = 0.0
    if rank == 0:
        linger = resolve_linger(cfg).metrics_linger or 0.0
        metrics = StepMetrics(job.graph.name, job.strategy.name, job.predicted, cfg.metrics_port, cfg.metrics_addr)
    start = trainer.step
    tracer = _tracer(cfg, start, device_kind)
    saved = []
    batch = job.graph.batch_size
    stop = _StopRequest(trainer.world_group, trainer.device) if cfg.graceful_stop else None
    bar = _ProgressBar(cfg.steps, start) if cfg.progress and rank == 0 else None
    stopped_at = stop_signal = None
    phased: list[tuple[float, dict]] = []     # counted steps: (seconds, the runtime's phases)
    retimer = None
    if cfg.retime:
        from .retime import Retimer
        retimer = Retimer(job, rank, world, trainer.world_group, start)
    try:
        for step in range(start, cfg.steps):
            _maybe_fault(rank, step)
            if retimer is not None and retimer.due(step):
                priced = retimer.run(step)
                if metrics is not None and priced is not None:
                    metrics.predicted.set(priced)
            settling = retimer is not None and retimer.settling(step)
            traced = tracer is not None and tracer.traced(step)
            trainer.runtime.annotate = traced
            with tracer.step(step) if traced else _NO_TRACE:
                t0 = time.perf_counter()
                local = trainer.train_step(step)
                if trainer.device.type == "cuda":   # pragma: no cover - needs a GPU
                    # kernels run behind the host: the step ends when the device is done, else a
                    # GPU-bound step would count only the host's launches
                    torch.cuda.synchronize(trainer.device)
                # The step ends when every rank has its part of the loss: rank 0 done early waits
                # here for the slowest, and a step timed without it was rank 0's share alone (a
                # plan with rnnlm's later layers on rank 1: 46.4 ms timed so, 68.6 ms a step).
                loss = trainer.global_loss(local)
                seconds = time.perf_counter() - t0
            if not (traced or settling):
                phased.append((seconds, dict(trainer.runtime.phases)))
            if metrics is not None:
                metrics.record(seconds, loss, batch, traced=traced, step=step + 1, settling=settling)
                if bar is not None:
                    bar.advance(loss, seconds)
                elif cfg.log:
                    print(f"step {step + 1}/{cfg.steps}  loss {loss:.6f}  {seconds * 1e3:.1f} ms  "
                          f"{batch / seconds:.1f} samples/s" + ("  (traced)" if traced else "")
                          + ("  (after retiming)" if settling else ""),
                          file=sys.stderr, flush=True)
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                path = trainer.save(cfg.checkpoint_dir)
                if path:
                    saved.append(path)
            if stop is not None and step + 1 < cfg.steps and (signum := stop.agreed()):
                stopped_at, stop_signal = step + 1, _signal_name(signum)
                if cfg.checkpoint_dir and not (cfg.checkpoint_every and stopped_at % cfg.checkpoint_every == 0):
                    path = trainer.save(cfg.checkpoint_dir)
                    if path:
                        saved.append(path)
                break
        else:
            last = cfg.steps
            if cfg.checkpoint_final and cfg.checkpoint_dir and last > start and not (
                    cfg.checkpoint_every and last % cfg.checkpoint_every == 0):
                path = trainer.save(cfg.checkpoint_dir)
                if path:
                    saved.append(path)
        if bar is not None:
            bar.close()
        predicted, note, predicted_parts = job.predicted, job.predicted_note, job.predicted_parts
        if retimer is not None and retimer.predicted is not None:     # rank 0's price (module trainer.retime)
            predicted, note, predicted_parts = retimer.predicted, retimer.note(), retimer.parts
        elif retimer is not None and retimer.failed:
            note += f"; --retime could not price the plan ({'; '.join(retimer.failed.values())})"
        trace_file = _write_trace(cfg, job, tracer, rank, world, trainer.world_group, predicted)
        parts = _measured_parts(phased, rank, world, trainer)
        if metrics is None:
            return None
        if linger > 0 and not metrics.wait_scraped(linger):
            print(f"autopar train: the metrics on port {metrics.port} were not scraped within {linger:g} s after "
                  f"the last step; whoever scrapes them missed the last steps", file=sys.stderr, flush=True)
        med = median_step(metrics.counted_times() or metrics.times)
        error = (predicted / med - 1.0) if predicted and med else None
        return {
            "model": job.graph.name, "strategy": job.strategy.name, "nproc": world, "backend": dist.get_backend(),
            "steps": cfg.steps, "resumed_from_step": start if cfg.resume else None,
            "global_batch": batch, "dtype": cfg.dtype or _model_dtype(job.graph),
            "optimizer": cfg.optimizer.to_dict(),
            "step_seconds": metrics.times, "losses": metrics.losses,
            "measured_step_s": med, "measured_cv": metrics.cv(), "predicted_step_s": predicted,
            "prediction_error": error, "prediction": note,
            "planned_step_s": job.predicted,
            "planned_prediction_error": (job.predicted / med - 1.0) if job.predicted and med else None,
            "retime": retimer.summary() if retimer is not None else None,
            "predicted_parts_s": predicted_parts, "measured_parts_s": parts[1] if parts else None,
            "measured_parts_rank": parts[0] if parts else None,
            "furthest_off": furthest_off(predicted_parts, parts[1]) if parts and predicted_parts else None,
            "traced_steps": [s + 1 for s in range(start, cfg.steps) if tracer is not None and tracer.traced(s)],
            "trace": trace_file,
            "samples_per_second": batch / med if med else None,
            "final_loss": metrics.losses[-1] if metrics.losses else None,
            "checkpoints": saved, "metrics_port": metrics.port, "metrics_addr": metrics.addr,
            "stopped_at_step": stopped_at, "stop_signal": stop_signal, "warnings": list(job.strategy.notes),
        }
    finally:
        if bar is not None:
            bar.close()
        if stop is not None:
            stop.restore()
        if metrics is not None:
            metrics.close()


def _check_same_start(trainer: Trainer, rank: int) -> None:
    """Every rank must start at the same step: under torchrun each rank finds its checkpoint (or
    none) itself, and a node that does not see the checkpoint directory the others see would
    otherwise train on from other weights.  One all-reduce (max of the step and of its negation)."""
    steps = torch.tensor([trainer.step, -trainer.step], dtype=torch.int64, device=trainer.device)
    dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=trainer.world_group)
    high, low = int(steps[0]), -int(steps[1])
    if high != low:
        raise TrainerConfigError(
            f"the ranks start at different steps ({low} to {high}; rank {rank} at {trainer.step}): they do not "
            f"all see the same checkpoint in {trainer.job.config.checkpoint_dir} (a directory every node must share "
            f"to resume)")


#: The signals a graceful stop handles: Ctrl-C, and what Kubernetes sends a pod (torchrun forwards both).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(summary: dict | None) -> int:
    """The exit status of `autopar train` for this summary: 0 when the run finished (or this rank
    has no summary), else 128 + the number of the signal that stopped it — 130 after Ctrl-C
    (SIGINT), 143 after SIGTERM — as a shell reports a process killed by that signal."""
    if not summary or not summary.get("stopped_at_step"):
        return 0
    name = summary.get("stop_signal") or "SIGINT"
    try:
        return 128 + int(signal.Signals[name])
    except KeyError:
        return 128 + int(signal.SIGINT)


class _StopRequest:
    """SIGINT or SIGTERM in a rank: note it instead of dying, and let all ranks agree to stop after a step.

    Every rank installs the handler for both signals; at the end of every step the ranks all-reduce
    (max) the signal any of them got — the terminal sends SIGINT to every process of its foreground
    group, torchrun forwards the SIGTERM (or SIGINT) it gets to its workers, and
    `trainer.launch.run_local` forwards either to its ranks when only the parent got it — so all stop
    after the same step, with the same state, and rank 0 writes the checkpoint.  The flag is noted
    on the CPU (a handler must not touch a GPU) and all-reduced on the rank's device (NCCL needs it)."""

    def __init__(self, group, device: torch.device | str = "cpu") -> None:
        self.group, self.device, self.flag = group, torch.device(device), torch.zeros(1)
        self.stopped = 0      # the signal the ranks agreed on, once they did
        self._old = {s: signal.signal(s, self._note) for s in STOP_SIGNALS}

    def _note(self, signum, frame) -> None:
        if signum > self.flag.item():      # SIGTERM (15) outranks SIGINT (2) when both came
            self.flag.fill_(float(signum))

    def agreed(self) -> int:
        """The signal that stops the run after this step (its number), or 0 to go on; a collective."""
        total = self.flag.to(self.device, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self.group)
        self.stopped = int(total.item())
        return self.stopped

    def restore(self) -> None:
        """After the loop a late signal (the parent forwards one) must not turn a finished run into
        a failed one: ignore both from here on when a stop was ours to handle (this rank got the
        signal, or the ranks agreed to stop: the signal may still be on its way to this one)."""
        stopped = bool(self.flag.item() or self.stopped)
        for s, old in self._old.items():
            signal.signal(s, signal.SIG_IGN if stopped else signal.SIG_DFL if old is None else old)


class _ProgressBar:
    """Rank 0's bar of `autopar run`: steps done, loss and the last step time (rich, on stderr)."""

    def __init__(self, steps: int, start: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        self.progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=False)
        self.task = self.progress.add_task("training", total=steps, completed=start, info="")
        self.progress.start()
        self.closed = False

    def advance(self, loss: float, seconds: float) -> None:
        self.progress.update(self.task, advance=1, info=f"loss {loss:.4f}  {seconds * 1e3:.1f} ms/step")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.progress.stop()


_NO_TRACE = nullcontext()


def _tracer(cfg: TrainConfig, start: int, device_kind: str) -> StepTracer | None:
    """The tracer of `--trace`: `trace_steps` steps from step `trace_from` on, never the first of
    this run (its warm-up) when there are others."""
    if cfg.trace is None:
        return None
    first = max(cfg.trace_from - 1, start + 1 if cfg.steps - start > 1 else start)
    if first >= cfg.steps:
        raise TrainerConfigError(f"--trace-from {cfg.trace_from}: the run ends at step {cfg.steps}; "
                                 f"trace an earlier step or train longer")
    return StepTracer(first, min(cfg.trace_steps, cfg.steps - first), device_kind)


def _write_trace(cfg: TrainConfig, job: Job, tracer: StepTracer | None, rank: int, world: int, group,
                 predicted: float | None) -> str | None:
    """Gather every rank's traced events on rank 0 and write them as one file, with the `predicted`
    step; every rank calls it."""
    if tracer is None:
        return None
    from autopar.planner.hardware import resolve_topology
    from autopar.planner.sim import device_process_name

    from .trace import gather_traces, merge_traces
    per_rank = gather_traces(tracer, rank, world, group)
    if rank != 0:
        return None
    try:
        topology = resolve_topology(cfg.topology or f"local:{world}")
        names = [device_process_name(topology, r) if r < topology.num_devices else f"rank {r}" for r in range(world)]
    except Exception:  # noqa: BLE001 - names are cosmetic; the trace itself matters
        names = [f"rank {r}" for r in range(world)]
    doc = merge_traces(per_rank, names, {"model": job.graph.name, "strategy": job.strategy.name,
                                         "predicted_step_seconds": predicted})
    atomic_write(cfg.trace, lambda f: json.dump(doc, f))
    return cfg.trace


# -- entry point ---------------------------------------------------------------------------------

def config_from(args: Any = None, **overrides: Any) -> TrainConfig:
    """A `TrainConfig` from an argparse namespace (the CLI's) and/or keyword overrides."""
    raw: dict[str, Any] = {}
    if args is not None:
        raw.update({k: v for k, v in vars(args).items() if v is not None})
    raw.update(overrides)
    opts = raw.pop("model_options", None) or {}
    if raw.get("model_opt"):
        from autopar.planner.zoo import parse_options
        opts = {**parse_options(raw.pop("model_opt")), **opts}
    raw.pop("model_opt", None)
    opt = raw.pop("optimizer", "sgd")
    if not isinstance(opt, OptimizerConfig):
        okw = {"name": opt}
        for key in ("lr", "momentum", "eps", "weight_decay"):
            if key in raw:
                okw[key] = raw.pop(key)
        if "betas" in raw:
            okw["betas"] = tuple(raw.pop("betas"))
        opt = OptimizerConfig(**okw)
    if "bucket_mb" in raw:
        raw["bucket_bytes"] = int(float(raw.pop("bucket_mb")) * (1 << 20))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(optimizer=opt, model_options=opts, **{k: v for k, v in raw.items() if k in known})


def resolve_linger(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with ``metrics_linger`` from ``$AUTOPAR_METRICS_LINGER`` where the option left it
    unset (`metrics.default_linger`), checked before any rank starts; a bad value is a
    `TrainerConfigError` that names the variable."""
    if cfg.metrics_linger is not None:
        return cfg
    try:
        return dataclasses.replace(cfg, metrics_linger=default_linger())
    except ValueError as e:
        raise TrainerConfigError(str(e)) from None


def train_main(args: Any = None, **overrides: Any) -> dict | None:
    """Run `autopar train`; returns the JSON summary (None on ranks other than 0 under torchrun)."""
    cfg = resolve_linger(config_from(args, **overrides))
    backend, kind = pick_backend(cfg.device)
    if under_torchrun():
        rank, world, _ = init_from_env(backend, cfg.timeout)
        cfg = resolve_resume(cfg)
        try:
            if args is not None and getattr(args, "nproc", None) not in (None, world):
                raise TrainerConfigError(f"--nproc {args.nproc} but torchrun started {world} ranks; omit --nproc")
            job = prepare(cfg, world)
            if rank == 0:
                _warn(job)
            return rank_main(rank, world, job, kind)
        finally:
            dist.destroy_process_group()
    cfg = resolve_resume(cfg)
    if kind == "cuda":
        check_gpus(cfg.nproc)
    job = prepare(cfg, cfg.nproc)
    _warn(job)
    if cfg.log:
        predicted = f"predicted step {job.predicted * 1e3:.1f} ms" if job.predicted else job.predicted_note
        print(f"training {job.graph.name} under {job.strategy.name!r} on {cfg.nproc} rank(s) ({backend}); {predicted}",
              file=sys.stderr, flush=True)
    return run_local(rank_main, cfg.nproc, (job, kind), backend=backend, timeout=cfg.timeout,
                     graceful=cfg.graceful_stop)[0]


def _measured_parts(phased: list[tuple[float, dict]], rank: int, world: int,
                    trainer: Trainer) -> tuple[int, dict[str, float]] | None:
    """On rank 0, (rank, parts) of the measured step (`trainer.parts.measured_parts`) over every
    rank's untraced steps but the first (allocation and warm-up, as `median_step` leaves it out);
    None elsewhere, and on CUDA, where the phases time the host issuing kernels rather than the
    kernels.  Every rank must call it."""
    if trainer.device.type != "cpu":
        return None
    per_rank: list = [None] * world if rank == 0 else None
    if world > 1:
        dist.gather_object(phased, per_rank, dst=0, group=trainer.world_group)
    elif per_rank is not None:
        per_rank[0] = phased
    if rank != 0:
        return None
    n = min(len(r) for r in per_rank)
    first = 1 if n > 1 else 0
    return measured_parts([r[first:n] for r in per_rank]) if n else None


def _warn(job: Job) -> None:
    """What the plan notes about itself (e.g. a batch that does not divide over the devices)."""
    for note in job.strategy.notes:
        print(f"autopar: warning: {note}", file=sys.stderr, flush=True)


def format_summary(summary: dict) -> str:
    """The human-readable end of `autopar train` (the JSON has the same numbers)."""
    med, pred, err = summary["measured_step_s"], summary["predicted_step_s"], summary["prediction_error"]
    head = f"{summary['model']} under {summary['strategy']!r} on {summary['nproc']} rank(s): {summary['steps']} steps"
    if med is None:
        return head + f"; nothing to do (resumed at step {summary['resumed_from_step']})"
    cv = summary.get("measured_cv")
    spread = f" ± {100 * cv:.1f} %" if cv is not None else ""
    lines = [head + f", final loss {summary['final_loss']:.6f}",
             f"measured step {med * 1e3:.1f} ms{spread} (median; {summary['samples_per_second']:.1f} samples/s)",
             (f"predicted step {pred * 1e3:.1f} ms ({summary['prediction']}); prediction error {100 * err:+.1f} %"
              if pred and err is not None else summary["prediction"])]
    planned, retime = summary.get("planned_step_s"), summary.get("retime")
    if retime:
        own = summary.get("planned_prediction_error")
        lines.append(f"the plan's own prediction {planned * 1e3:.1f} ms ({100 * own:+.1f} %)"
                     if planned and own is not None else "the plan had no prediction of its own")
        lines.append(f"retimed: {retime['timed']} of {retime['tasks']} task(s) timed in "
                     f"{len(retime['passes_before_steps'])} pass(es), {retime['seconds']:.1f} s; the "
                     f"{retime['settle_steps']} step(s) after each pass are left out of the median")
        runtime = retime.get("runtime") or {}
        timed = {k: runtime[k] for k in ("optimizer", "overheads") if k in runtime}
        if timed:
            lines.append("retimed runtime: " + "; ".join(f"{k} {v}" for k, v in timed.items())
                         + (f"; with the ops alone timed in the ranks {runtime['ops_only_step_s'] * 1e3:.1f} ms"
                            if runtime.get("ops_only_step_s") else ""))
    sim, meas = summary.get("predicted_parts_s"), summary.get("measured_parts_s")
    if sim and meas:
        lines.append(f"parts of the step on rank {summary['measured_parts_rank']}, predicted / measured (ms): "
                     + ", ".join(f"{k} {sim[k] * 1e3:.1f} / {meas[k] * 1e3:.1f}" for k in meas)
                     + f"; furthest off: {summary['furthest_off']}")
    if summary.get("trace"):
        lines.append(f"trace of steps {', '.join(map(str, summary['traced_steps']))}: {summary['trace']} "
                     f"(open in ui.perfetto.dev; `autopar simulate --trace` writes the simulated one)")
    if summary["checkpoints"]:
        lines.append(f"checkpoints: {', '.join(summary['checkpoints'])}")
    if summary.get("stopped_at_step"):
        by = "SIGTERM" if summary.get("stop_signal") == "SIGTERM" else "Ctrl-C"
        lines.append(f"stopped by {by} after step {summary['stopped_at_step']}"
                     + ("; continue with --resume" if summary["checkpoints"] else ""))
    return "\n".join(lines)


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0 (`metrics.parse_seconds`)."""
    try:
        return parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_train_args(p) -> None:
    """The options of ``autopar train`` (the CLI adds --model/--model-opt/--json with its shared helper)."""
    p.add_argument("--strategy", "-s", default="data-parallel",
                   help="named strategy (data-parallel, model-parallel, single-device, …) or a plan file")
    p.add_argument("--nproc", type=int, default=None,
                   help="local ranks to start (default 1; under torchrun the job's world size)")
    p.add_argument("--steps", type=int, default=10, help="total training steps (a resumed run continues to it)")
    p.add_argument("--dtype", choices=_FLOATS, default=None, help="train in this float dtype (default: the model's)")
    p.add_argument("--optimizer", choices=tuple(STATE_KEYS), default="sgd")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    p.add_argument("--data", metavar="PATH", help="torch.save'd dict of input and label tensors (default: synthetic)")
    p.add_argument("--checkpoint-dir", metavar="DIR")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="write a checkpoint every N steps")
    p.add_argument("--checkpoint-final", action="store_true",
                   help="also write a checkpoint after the last step (needs --checkpoint-dir)")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    resume.add_argument("--resume-if-present", action="store_true",
                        help="continue from the latest checkpoint in --checkpoint-dir when there is one, else start "
                             "at step 0 (the summary's resumed_from_step says which; what a restarted job runs)")
    p.add_argument("--metrics-port", type=int, metavar="P", help="serve Prometheus metrics on ADDR:P (rank 0)")
    p.add_argument("--metrics-addr", metavar="ADDR",
                   help="the address --metrics-port binds (default: $AUTOPAR_METRICS_ADDR, else 127.0.0.1; "
                        "0.0.0.0 serves every interface, e.g. to a pod's Service)")
    p.add_argument("--metrics-linger", type=_seconds, metavar="S",
                   help="after the last step, keep --metrics-port up until a scrape has seen it, at most S seconds "
                        "(default: $AUTOPAR_METRICS_LINGER, else 0; a trainer pod with a progress sidecar sets it)")
    p.add_argument("--topology", "-t", help="topology the plan was made for (default: local:NPROC)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds a rank waits for a peer before giving up (process-group timeout)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    p.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_BYTES / (1 << 20),
                   help="gradient all-reduce bucket size")
    p.add_argument("--retime", action="store_true",
                   help="CPU ranks: time the plan's ops in the ranks themselves, after the first step and up to "
                        "twice more during the run, and price the predicted step with those times (the profile "
                        "cache's were taken earlier, in other processes); where the profile cache has a runtime "
                        "calibration, the optimizer and the runtime's per-op overheads are timed in the passes too; "
                        "the two steps after each pass are left out of the median")
    p.add_argument("--trace", metavar="FILE.json",
                   help="profile steps on every rank (torch.profiler) and write them as one Chrome trace-event "
                        "file (ui.perfetto.dev); traced steps are left out of the measured median")
    p.add_argument("--trace-steps", type=int, default=2, metavar="N", help="how many steps --trace profiles")
    p.add_argument("--trace-from", type=int, default=2, metavar="STEP",
                   help="the first step --trace profiles (1-based; later steps show the steady state, "
                        "the first few still fault in memory)")
