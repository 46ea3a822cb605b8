"""A training run's configuration (`TrainConfig`, what `autopar train`'s options say) and the job
each rank prepares from it (`Job`: the model, its graph and the plan).

Apart from `trainer.train` so that the modules that build jobs of their own (the calibration's
workloads in `trainer.calibrate`, the benchmarks, `trainer.retime`'s passes) need not import the
training loop, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autopar.planner.ir import OperatorGraph, Strategy

from .errors import TrainerConfigError
from .launch import DEFAULT_TIMEOUT
from .optim import OptimizerConfig
from .sync import DEFAULT_BUCKET_BYTES

_FLOATS = ("float64", "float32", "float16", "bfloat16")


@dataclass
class TrainConfig:
    model: str = "lenet"
    model_options: dict[str, Any] = field(default_factory=dict)
    strategy: Any = "data-parallel"      # a named strategy, a plan file path, or a Strategy
    nproc: int = 1
    steps: int = 10
    dtype: str | None = None             # convert the model and float inputs (e.g. "float64")
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    seed: int = 0                        # data seed (the model's seed is a model option)
    data: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    resume_if_present: bool = False      # resume when checkpoint_dir holds a checkpoint, else start fresh
    metrics_port: int | None = None
    metrics_addr: str | None = None      # the metrics server's address; None: $AUTOPAR_METRICS_ADDR or 127.0.0.1
    metrics_linger: float | None = None  # seconds to wait for a scrape after the last step; None: $AUTOPAR_METRICS_LINGER
    topology: str | None = None          # for plan files and the prediction; default local:<nproc>
    timeout: float = DEFAULT_TIMEOUT
    device: str = "cpu"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    log: bool = True
    profile_cache: str | None = None
    trace: str | None = None             # write the traced steps as Chrome trace-event JSON here
    trace_steps: int = 2                 # how many steps to trace
    trace_from: int = 2                  # the first traced step (1-based); step 1 is the warm-up
    checkpoint_final: bool = False       # also checkpoint after the last step (with checkpoint_dir)
    graceful_stop: bool = False          # SIGINT/SIGTERM: finish the step, checkpoint, stop (one all-reduce per step)
    progress: bool = False               # rank 0 draws a progress bar on stderr instead of a line per step
    retime: bool = False                 # price the plan again with its ops timed in the ranks (trainer.retime)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise TrainerConfigError(f"--steps must be at least 1, got {self.steps}")
        if self.checkpoint_every < 0 or (self.checkpoint_every and not self.checkpoint_dir):
            raise TrainerConfigError("--checkpoint-every needs --checkpoint-dir (and a positive step count)")
        if self.resume and not self.checkpoint_dir:
            raise TrainerConfigError("--resume needs --checkpoint-dir to find the checkpoint in")
        if self.resume_if_present and not self.checkpoint_dir:
            raise TrainerConfigError("--resume-if-present needs --checkpoint-dir to look for a checkpoint in")
        if self.resume and self.resume_if_present:
            raise TrainerConfigError("--resume and --resume-if-present: choose one (--resume fails when "
                                     "--checkpoint-dir holds no checkpoint, --resume-if-present starts fresh)")
        if self.checkpoint_final and not self.checkpoint_dir:
            raise TrainerConfigError("--checkpoint-final needs --checkpoint-dir to write the checkpoint to")
        if self.dtype is not None and self.dtype not in _FLOATS:
            raise TrainerConfigError(f"--dtype {self.dtype!r}: choose one of {', '.join(_FLOATS)}")
        if self.trace is not None and self.trace_steps < 1:
            raise TrainerConfigError(f"--trace-steps must be at least 1, got {self.trace_steps}")


@dataclass
class Job:
    """Everything a rank needs, prepared once: the model from its seed, its graph and the plan."""

    config: TrainConfig
    spec: Any                    # planner.zoo.ModelSpec, already in the run's dtype
    graph: OperatorGraph
    strategy: Strategy
    predicted: float | None = None
    predicted_note: str = ""
    #: The simulated step's parts on its busiest device (`planner.sim.step_parts`); for a plan
    #: file, only where simulating it again gives the step it records (`PLAN_FILE_PARTS_TOLERANCE`).
    predicted_parts: dict[str, float] | None = None
    #: The topology the plan is simulated on (`--topology`, default ``local:<world>``).
    topology: Any = None
