"""Execution simulation: the task graph of a strategy and how long its training step takes.

* `taskgraph` — `TaskGraphBuilder`: forward and backward tasks per partition, a transfer for
  every region that crosses devices (over every link of its route), ring all-reduces of the
  replicated parameter cells, the updates (FlexFlow sec. 5.1, Table 2); `DeltaSession` edits it
  one op at a time for the search;
* `simulator` — full simulation (Algorithm 1, a compiled pass with the Python loop as the tested
  reference) and `DeltaSimulator` (Algorithm 2), which re-times only what a change touches and
  gives exactly the timeline full simulation gives (sec. 5.2, 5.3);
* `evaluate` — `simulate_strategy`: build, time and sum up one strategy;
* `waits` — each wait of the trainer's step at its mean when the ranks' arrivals vary;
* `memory` — peak memory per device;
* `gc_regime` — keeping Python's cyclic collector off the 10^5 containers a search holds;
* `trace` — a simulated step as Chrome trace-event JSON (Perfetto), beside the trainer's.

The modules with a leading underscore are the simulator's machinery (task store, batched edits,
passes, timelines); nothing outside this package imports them.
"""

from ._plans import MIN_TASK_SECONDS
from .buckets import DEFAULT_BUCKET_BYTES, SyncBucket, plan_buckets
from .evaluate import SimulationResult, simulate_strategy, summarize
from .gc_regime import frozen_heap, gc_paused, refreeze
from .memory import check_fits, peak_memory
from .simulator import DeltaSimulator, TaskGraph, TaskInfo, Timeline, simulate
from .taskgraph import OPTIMIZER_STATES, DeltaSession, TaskGraphBuilder, Transfer
from .trace import device_process_name, simulated_trace
from .trainer_model import (COALESCE_BYTES, STEP_PARTS, loss_allreduce_s, requires_grad, step_parts,
                            trainer_calibration)
from .waits import has_arrival_noise

__all__ = ["COALESCE_BYTES", "DEFAULT_BUCKET_BYTES", "MIN_TASK_SECONDS", "OPTIMIZER_STATES", "STEP_PARTS", "SyncBucket", "plan_buckets", "DeltaSession", "DeltaSimulator", "SimulationResult", "TaskGraph",
           "TaskGraphBuilder", "TaskInfo", "Timeline", "Transfer", "check_fits", "device_process_name", "frozen_heap",
           "gc_paused", "has_arrival_noise", "loss_allreduce_s", "peak_memory", "refreeze", "requires_grad",
           "simulate", "simulate_strategy", "simulated_trace",
           "step_parts", "summarize", "trainer_calibration"]
