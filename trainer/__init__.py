"""autopar's trainer: a PyTorch runtime that executes any SOAP strategy and trains exactly like one device.

    autopar train --model lenet --strategy data-parallel --nproc 2 --steps 10 --json

FlexFlow (paper sec. 7) made its plans real with a Legion runtime; ours is `torch.distributed`.
Every rank executes the tasks the plan gives its device, in one global op order, moving exactly
the intersecting regions between differently partitioned ops and synchronizing parameter shards
among their replicas.  Modules, in the order data flows through them:

- `plan` — the static per-rank schedule (tasks, moves, parameter holdings), the same on every rank;
- `redistribute` — regions between partitionings, forward and backward (halos included);
- `batchnorm` — exact global statistics under sample and attribute partitioning;
- `sync` — gradient buckets all-reduced among the holders of each parameter cell;
- `runtime` — one rank's forward, backward and synchronization of a step;
- `shards`, `optim`, `checkpoint` — parameter shards, SGD/Adam on them, strategy-independent state;
- `session` — one rank's training session; `train` — `autopar train` (`train_main`);
- `launch` — N local ranks or torchrun; `metrics` — Prometheus; `data`; `validate` — refusals;
- `retime` — ``--retime``: the plan priced again with its ops, optimizer and per-op overheads
  timed in the ranks during the run;
- `bench` — `autopar bench runtime` (against DDP, and a searched plan against data parallelism).
"""

from .errors import CheckpointError, PlanRefusedError, RankFailedError, TrainerConfigError, TrainerError
from .train import TrainConfig, add_train_args, format_summary, train_main

__all__ = ["train_main", "add_train_args", "format_summary", "TrainConfig", "TrainerError", "TrainerConfigError", "PlanRefusedError",
           "CheckpointError", "RankFailedError"]
