"""Measure what the trainer costs beyond its ops' kernels on this machine: a `RuntimeCalibration`.

    autopar profile --model M --topology local:N              # op times, then this calibration
    autopar profile --model M --topology local:N --recalibrate   # measure the calibration again

The simulator models a step the way the trainer runs it on local gloo ranks
(`planner.sim.trainer_model`); everything in that model that a per-op profile cannot see comes
from here.  The simulators that predict distributed training best calibrate exactly these
numbers: a constant overhead per op measured as the intercept of the runtime's own timings
against kernel times (DistIR), and collectives measured on the real library per message size and
group size, interpolated monotonically between the measured sizes (DistSim, Proteus, Lumos).
Every measurement runs on `world` local ranks started by `trainer.launch.run_local` — gloo over
loopback, one torch thread per rank, as `autopar train` runs them.  It measures the machine as it
is: run it when nothing else competes for the cores.  `calibrate(world)` measures:

1. **Point to point** (`RuntimeCalibration.p2p`): for 4 B and every power of 4 from 1 KiB to
   16 MiB, the seconds rank 1 waits inside `trainer.comm.exchange_many` for one float32 message
   from rank 0.  Both ranks leave a barrier together; rank 0 issues its send through the same
   `exchange_many` and immediately computes (a loop of 128x128 matmuls, about 1 ms, one thread)
   before it waits for the send, as a rank does in a real step.  That matters: between idle ranks
   a small message takes 120-190 us, but with the sender computing, gloo's progress on the
   sender side competes with the compute for the core and the receiver's wait gets a heavy tail
   (median 150-250 us, 90th percentile 1-7 ms) — a real step's exchanges averaged about 0.8 ms
   before the runtime posted its receives ahead (`trainer.comm.RecvAhead`), 0.3-1.4 ms since.
   The curve is fitted (`Curve.fit`) to the **mean** wait of many repetitions (120 per size);
   the median curve and the 90th percentiles are kept in ``details``.  With two or more ranks,
   stage 6 replaces it: up to 1 MiB by the mean latencies measured on real steps' messages of
   five sizes, beyond by the *median* curve shifted to meet them (the tail belongs to the
   latency, not to the bytes).  The median curve less its 4-byte point is the ``wire`` curve:
   how long the bytes hold the link; the simulator queues only that part of a message on it.
2. **All-reduce** (`RuntimeCalibration.allreduce`): for every group size r in 2..world (the
   ranks 0..r-1; every rank creates every group, in the same order, before the first
   measurement), the same sizes, ``dist.all_reduce`` of a float32 tensor, with gloo's network
   threads yielding to the call as they do while the trainer waits for its buckets
   (`trainer.launch.own_gloo_call`, `trainer.sync.GradSync.finish`).  Each member times its
   own call after a world barrier; a repetition lasts as long as its slowest member, and the curve
   is fitted to the mean of those maxima.  Here and in 1., every repetition takes every size in
   turn (`_interleaved`), so that a slow spell of the machine lands on all sizes alike rather than
   on those timed during it (calibration method 10).
3. **Per-op overheads** (``fwd_task_s``, ``bwd_task_s``) as intercepts of the real runtime: small
   synthetic models — a chain of K elementwise ops (``tanh``) and a chain of K small linear
   layers, each at several K — are imported like a user's model (`planner.ir.import_spec`) and
   stepped by the trainer's own `Trainer` on one rank under the single-device strategy.  Their
   kernel times come from the profiler's own `planner.cost.measure_task` (the code `autopar
   profile` runs, with its engine start-up taken off the backward), measured warm — without the
   profiler's cache eviction — because the chains' tiny tensors stay in cache during the step
   too: the intercept is then the runtime's own cost, whatever the profiler assumes about caches
   in bigger models.  Per model, the median over steps of the wall time of the runtime's forward
   pass minus the sum of its ops' kernel times is regressed on the number of forward tasks (every
   op, graph inputs included, as the simulator counts them); the slope is ``fwd_task_s`` (the
   intercept, a constant per step, is kept in ``details``).  The same for the backward pass over
   the tasks that need a gradient gives ``bwd_task_s``.  Wall time, not only the ``fwd``/``bwd``
   phases (`Runtime.phases`): the phases time the kernel calls, while the runtime's per-op
   bookkeeping around them (input assembly, autograd leaves, the gradient accumulators) runs
   between spans — nearly all of the per-op overhead on this machine (forward: about 11 us per
   task, 2 us of it inside the phase) — and the simulator has nowhere else to charge it.  The
   phase-only intercepts are kept in ``details`` too.  The runtime fuses a chain of one-to-one
   local edges into one autograd call (`Runtime._fusable`), which is what a single-device or
   data-parallel plan runs; an op whose edges cross ranks runs its own ``autograd.backward`` and
   pays the engine's start-up each time.
   ``bwd_task_s`` is the fused cost (the single-device run); the same chains with fusion turned
   off give ``details["bwd_task_unfused_s"]``, and the difference, the engine's start-up of an
   op's own backward call, is ``bwd_call_s``: the simulator charges it to every task of an op the
   runtime does not fuse into its consumer (`planner.sim.trainer_model.fused`).

   **Cold bookkeeping.**  A real model's op passes over more memory than the core's L2 holds, so
   the runtime's own work after it finds its code and data evicted; the chains' tiny ops evict
   nothing.  With every op's span writing over the profiler's eviction buffer before it ends
   (inside the timed span, `_evicting_spans`), the work between the spans went from 8-9 to 29 us
   per forward task on this machine, what the zoo's models show in their steps (27-34 us
   single-device and data-parallel; the warm chains had given 10-11 us in all).  On a CPU each
   overhead is therefore the cold chains' work between the spans plus the warm chains' work
   inside them beyond the kernels (a span's own eviction would drown that part); the warm
   figures are kept in ``details`` (``warm_fwd_task_s``, ...).  The profiler times every op from
   evicted caches for the same reason (`planner.cost.profiler`, "Measurement conditions").  Since
   `CALIBRATION_METHOD` 4 the eviction also runs other ops' code first (the profiler's
   `_Interloper`), as a step's other ops do: 55-58 us per forward task and 42-43 us per backward
   one here, against 31 and 20 us with the data evicted alone.

   **In the model's own steps** (`model_overheads`, CPU ranks).  The cold chains' bookkeeping is
   not what a real model's steps show on every machine: on a 2-vCPU Xeon VM it came out at
   61-118 us per forward task and 39-116 us per backward one in twelve calibrations, where the
   zoo's models, each whole on both ranks at once, spent 22-36 and 16-42 us between their spans;
   and every kept run's data-parallel rows had their overhead part simulated too high
   (docs/simulation.md, "Twenty-third round").  So `autopar profile` also steps the model being
   planned, whole on each rank at once, and stores its work between the spans per task
   (`planner.cost.ProfileCache.put_overheads`); the simulator charges that for this model, plus
   the chains' work inside the spans (`planner.sim.trainer_model.trainer_calibration`).  The
   chains' figures remain for models never stepped, and on GPUs.  It also steps the model under
   data parallelism, in alternating blocks with its gradient buckets' all-reduces and without
   them (`model_sync`), and stores what they added to the step over what the all-reduce curve
   (2.) says for those buckets: an all-reduce timed alone is not what it costs while the backward
   pass runs on the same core (1.4-3.0x on the AMD VM, docs/simulation.md, "Thirtieth round").

4. **Exchange overhead** (``exchange_s``): two ranks step the same chains under a plan that puts
   op i on rank i mod 2, so every op exchanges its input forward and its gradient backward, with
   `exchange_many` wrapped by a timer inside the ranks.  ``exchange_s`` is the time the runtime
   spends in its ``exchange``/``grad exchange`` spans outside `exchange_many` — building the
   messages from the producers' outputs and assembling the received pieces into inputs or
   gradients — per exchange call.  The message itself (`exchange_many`: issuing, waiting,
   receiving) is what the p2p curve measures, so the simulator's message time ``p2p(bytes) +
   exchange_s`` counts every part once.  The alternative of subtracting the p2p curve from the
   exchange spans was not used: in a chain on alternating ranks a receiver's wait also holds its
   peer's compute, which the simulator models as a dependency and must not be counted twice, and
   the p2p tail would make the difference mostly noise; a direct measurement of `exchange_many`
   with tiny messages is the p2p curve's 4-byte point, not an overhead beyond it.
5. **Optimizer** (``optimizer``): the trainer's own ``optimizer step`` phase inside real
   training steps (`optimizer_job`: T/2 linear layers with weights of B bytes, data-parallel on
   the `world` ranks, so every rank steps every tensor after the gradients' all-reduce, all at
   once), for "sgd" (momentum 0.9) and "adam" as the trainer builds them
   (`trainer.optim.OptimizerConfig`; on CPU tensors torch steps them one at a time, its foreach
   kernels being for accelerators), for T in {4, 16, 32} and B from 16 KiB to 4 MiB.  Between a
   step's backward pass and its optimizer step every rank writes over a buffer the size of the
   last-level cache (at most `FLUSH_CAP_BYTES`): in a real model the activations, the other
   layers and the all-reduce pass over far more memory than the caches hold, and an optimizer
   measured on parameters still in cache predicted 6.0 ms for what took 9 ms in an RNN's steps.
   The median phase time is fitted as ``T * per_tensor + T * B * per_byte`` by non-negative
   least squares of the relative residuals (`fit_optimizer`): the small tensors pin the
   per-tensor cost (about 30 us for SGD here, cold), the large ones the per-byte cost (about
   0.5 ms per MiB), and neither drowns the other.  The same steps time every call that issues a
   bucket's all-reduce on a rank's own thread (`trainer.sync.GradSync._issue`): ``issue``, the
   mean per bucket size (`issue_curve`).  A gloo all-reduce started asynchronously still costs
   its caller 0.5-0.7 ms per bucket in the zoo's data-parallel steps.
   With it, on the same ranks at once, **the batch** (``draw``): every rank draws a step's
   whole synthetic global batch before its first op (`trainer.data.SyntheticData`), so the
   ranks time ``torch.randn`` and ``torch.randint`` of 16 Ki, 256 Ki and 1 Mi elements on their
   devices (`_draw_samples`), and the medians are fitted as ``per_tensor + elements *
   per_element`` (`fit_draw`).  The same steps time **the buckets' zeroing** (``zero``): every
   call of `trainer.sync.GradSync.zero_grad` as a step starts, right after the optimizer step that
   read those gradients, on every rank at once, fitted as ``tensors * per_tensor + bytes *
   per_byte`` (`fit_zero`): about 24 us a tensor (each ``.grad`` set to a view of its bucket)
   and 5.4-6.8 GB/s here, where the simulator had priced it at the local preset's 12 GB/s.

6. **Messages inside steps** (`fit_exchange_latency`): the trainer runs a model-parallel chain
   (`in_situ_job`) at batches of 2 to 2048 rows (messages of 1 KiB to 1 MiB, `IN_SITU_BATCHES`)
   and every exchange call of both ranks is timestamped; a message's latency runs from the
   moment the last rank enters the exchange to the moment the receiver's call returns
   (`message_latencies`).  Every layer all-gathers its split output, so the two ranks send to
   each other in every exchange, and each layer ends in `IN_SITU_BUSY_OPS` extra ``tanh`` ops so
   that the ranks compute between exchanges about as long as a small model's ops: such
   exchanges stall (2-3 ms, a third to a half of the time here), and the longer the ranks
   compute between them, the more often.  The mean at each size is a point of the
   point-to-point curve (on this machine 0.63 ms at 1 and 16 KiB, 0.88 ms at 64 KiB, 1.1 ms at
   256 KiB, 1.2 ms at 1 MiB; without the extra ops 0.27-0.35 ms up to 16 KiB); beyond 1 MiB the
   microbenchmark's median curve, shifted to meet it.  The same steps give the staging (8.).
   The same chain with its ops whole and on ranks 0 and 1 in turn (``one_way``) sends every
   message one way; its latencies, from the sender's entry to the receiver's return
   (`one_way_latencies`), give ``p2p_oneway`` (`in_step_curve`) at their **median** per size:
   0.15-0.23 ms at 2 KiB, 0.34-0.52 ms at 512 KiB and 0.9-1.2 ms at 2 MiB in ten calibrations on
   a Xeon VM, what a transformer's one-way messages took in its model-parallel steps (128 KiB
   0.18-0.24 ms, 256 KiB 0.24-0.36 ms).  Not at the mean, as the two-way curve: the one-way
   chain's messages stall for milliseconds in some calibrations and not in others (the mean at
   512 KiB moved from 0.36 to 1.36 ms), while that transformer's model-parallel steps spent
   27.5-34.7 ms a step in their exchanges in nine of the ten runs whatever the chain's mean said.
   Priced at the mean, its error followed the calibration (+0.1 to +25.6 %); at the median,
   -9.3 to +13.8 % (calibration method 11; docs/simulation.md, "Twenty-second round").  The
   sender's own calls of those messages, from entering to returning (`send_calls`), give
   ``send_call`` at their median per size: the sender's program pays it before it goes on (60-70
   us up to 32 KiB and 0.55 ms at 2 MiB on a 2-vCPU AMD VM; calibration method 12).  Both
   chains take their batches' steps in turn (`_interleaved`): batch after batch, two calibrations
   of one morning put 2 MiB one way at 8.3 and 8.9 ms (mean), and one between them at 0.94 ms.
   The two-way chain's timestamps also say how much the ranks' arrivals at an exchange vary
   from step to step (`arrival_noise`): the variance two ranks' offset gains per second each
   runs (``jitter``) and the variance it has as they leave an exchange (``leave_var``), by size;
   the one-way chain's, the variance of a one-way message's latency (``latency_var``); each the
   variance of the Gaussian with the samples' interquartile range (`spread`), so that a few
   stalls of the host do not set it (calibration method 16).  The simulator prices each wait as
   its mean under that noise (`planner.sim.waits`).

7. **Messages of one exchange** (``message_serial_s``, `message_serial`): ranks 0 and 1 compute
   for 1 ms, then exchange one piece each way, or two, in one `exchange_many` call, 600 times
   each, the two cases alternating.  Half the difference is what one more piece of an exchange
   costs.  `exchange_many` sends a pair's pieces as one message (gloo wrote a second message
   only from its communication thread, which on busy cores waited for a scheduler tick: an
   RNN's model-parallel steps waited 1.45 ms on average for two messages each way against 0.93
   ms for one, and separate messages measured 0.14-0.18 ms here); so this is now the cost of the
   piece's bytes and its packing.

8. **Staging** (``staging``, `staging_curves`): in the in-situ chain's steps of stage 6, the
   runtime's four staging functions are timed too: cutting and packing a forward message
   (`trainer.redistribute.forward_sends`), placing the received pieces into the consumer's input
   (`forward_inputs`), packing a gradient (`backward_sends`) and adding a received gradient into
   its producer's accumulator (`backward_accumulate`).  Seconds per call against bytes per call,
   one monotone curve each.  On this machine, for 1 KiB and 1 MiB: 4 and 13 us to send forward, 45 and 550 us to place,
   23 and 196 us to send a gradient, 62 and 392 us to add one.  Stage 4 timed the same functions
   on messages of a few hundred bytes, between ranks taking turns, at 15-20 us per call; the
   simulator charges that to a message's latency and the staging to the ranks' cores, so a
   small message may count up to ``exchange_s`` twice.  The same steps time the posting of
   receives ahead (``post_s``, `receive_posting`) and the wait for the step's send requests as
   it ends (``send_wait_s``, `send_waits`: a gloo request completes only inside its ``wait()``,
   14-16 us each on a 2-vCPU AMD VM; calibration method 14).

``comm_uses_cores`` is ``usable_cores() < 2 * world`` (`planner.cost.usable_cores`: the cores of
the process's affinity mask, at most its control groups' CPU quota): with fewer than two cores
per rank, gloo's threads copy, reduce and drive sockets on the cores the ranks compute on.  Overheads are clamped
at 0.  With ``world == 1`` nothing communicates: p2p, all-reduce and ``exchange_s`` are the
defaults' (`default_calibration`) and ``details["not_measured"]`` says so.

**On GPUs** (``calibrate(world, device="cuda")``, what `autopar profile` runs on a machine with
CUDA devices): NCCL ranks, one GPU each, and the key's backend is ``nccl``.  Stages 1 and 2 run as
above with the tensors on the ranks' GPUs, each timer ending when the device is done.  Stage 3
times the passes from an idle device to the end of its kernels, and the per-task overhead is the
runtime's host work beyond the host's issuing of the chain ops' kernels (the profiler's host
times): the simulator runs a GPU as a host stream and a kernel stream
(`planner.sim.trainer_model.op_plan`), and this is the host's extra part.  Stage 5 times the
optimizer step to the end of its kernels.  Stages 4, 6, 7 and 8 measure gloo on shared cores and
keep the defaults (``details["not_measured"]``).  Run on one NVIDIA H100 (world 1):
docs/simulation.md, "On a GPU"; the NCCL stages need two GPUs and have not run.

A full calibration of 2 ranks takes about 40 s on this machine (120 repetitions per p2p size and
60 per all-reduce size, because of the tail).  ``quick=True`` measures fewer sizes (4 B, 16 KiB,
1 MiB, 16 MiB), a dozen repetitions, two chain lengths and smaller optimizer runs, in about 15 s:
good enough for tests, too noisy for planning.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import statistics
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from autopar.planner.cost import (STAGING_PARTS, Curve, RuntimeCalibration, default_calibration, shared_cache_bytes,
                                  usable_cores)

from .errors import TrainerConfigError
from .launch import check_gpus, own_gloo_call, rank_device, run_local, track_gloo_loops

BACKEND = "gloo"
#: The backend of a calibration on CUDA devices (`calibrate(..., device="cuda")`).
GPU_BACKEND = "nccl"
FULL_SIZES = (4,) + tuple(1 << (10 + 2 * k) for k in range(8))     # 4 B, 1 KiB, 4 KiB, ..., 16 MiB
QUICK_SIZES = (4, 16 << 10, 1 << 20, 16 << 20)
#: Seconds the sender computes after issuing its send (module docstring, 1.).
BUSY_S = 1e-3
_CHAIN_WIDTH = 16
#: The most memory the optimizer's measurement writes between a step's backward pass and its
#: optimizer step to push the parameters out of the last-level cache (`_optimizer_in_steps`).
FLUSH_CAP_BYTES = 512 << 20
_CHAIN_BATCH = 8


@dataclass(frozen=True)
class Settings:
    sizes: tuple[int, ...]
    p2p_reps: int
    allreduce_reps: int
    warmup_reps: int
    chain_lengths: tuple[int, ...]        # K of the overhead chains
    exchange_lengths: tuple[int, ...]     # K of the alternating-rank chains
    steps: int
    warmup_steps: int
    profile_repeats: int
    optimizer_cases: tuple[tuple[int, int], ...]   # (tensors, bytes per tensor)
    optimizer_repeats: int
    in_situ_steps: int = 30                # timed steps of the in-situ latency workload
    batch_reps: int = 600                  # exchanges per case of the message-batch measurement


def settings(quick: bool) -> Settings:
    if quick:
        return Settings(QUICK_SIZES, p2p_reps=12, allreduce_reps=8, warmup_reps=2, chain_lengths=(4, 24),
                        exchange_lengths=(8,), steps=12, warmup_steps=3, profile_repeats=10,
                        optimizer_cases=((4, 16 << 10), (16, 16 << 10), (4, 1 << 20), (8, 4 << 20)),
                        optimizer_repeats=5, in_situ_steps=15, batch_reps=100)
    return Settings(FULL_SIZES, p2p_reps=120, allreduce_reps=60, warmup_reps=3, chain_lengths=(4, 16, 48),
                    exchange_lengths=(8, 24), steps=30, warmup_steps=5, profile_repeats=30,
                    optimizer_cases=((4, 16 << 10), (32, 16 << 10), (4, 1 << 20), (16, 1 << 20), (4, 4 << 20),
                                     (16, 4 << 20)),
                    optimizer_repeats=9)


# -- fits ------------------------------------------------------------------------------------------

def fit_optimizer(samples: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
    """(seconds per tensor, seconds per byte) from (tensors, total bytes, seconds) samples: least
    squares of ``seconds = tensors * per_tensor + bytes * per_byte`` in relative terms (each
    sample's residual divided by its seconds, so a 100 ms step does not drown a 100 us one), with
    both coefficients >= 0 (when the unconstrained solution has a negative one, that one is 0 and
    the other is refitted alone)."""
    rows = [(t / y, b / y) for t, b, y in samples if y > 0]
    if not rows:
        raise ValueError("fit_optimizer needs at least one (tensors, bytes, seconds) sample with seconds > 0")
    # Normal equations of min sum (t a + b c - 1)^2 over the scaled rows.
    tt = sum(t * t for t, _ in rows)
    bb = sum(b * b for _, b in rows)
    tb = sum(t * b for t, b in rows)
    t1 = sum(t for t, _ in rows)
    b1 = sum(b for _, b in rows)
    det = tt * bb - tb * tb
    if det > 1e-9 * tt * bb:
        a = (t1 * bb - b1 * tb) / det
        c = (tt * b1 - tb * t1) / det
        if a >= 0 and c >= 0:
            return a, c
    cands = [(0.0, 0.0)]
    if tt > 0:
        cands.append((max(0.0, t1 / tt), 0.0))
    if bb > 0:
        cands.append((0.0, max(0.0, b1 / bb)))
    return min(cands, key=lambda ac: sum((t * ac[0] + b * ac[1] - 1.0) ** 2 for t, b in rows))


def fit_intercept(rows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(per-task seconds, per-step seconds): least squares of ``residual = per_step + tasks *
    per_task`` over (tasks, residual) rows (through the origin when every row has the same task
    count); the per-task slope is clamped at 0."""
    xs = [float(x) for x, _ in rows]
    ys = [float(y) for _, y in rows]
    if len(set(xs)) < 2:
        xx = sum(x * x for x in xs)
        return (max(0.0, sum(x * y for x, y in zip(xs, ys)) / xx) if xx else 0.0), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, slope)
    return slope, my - slope * mx


# -- 1. and 2.: communication (runs in the ranks) --------------------------------------------------

def _busy(seconds: float, a: torch.Tensor) -> None:
    """Compute with torch ops (about 0.1-0.2 ms each) for `seconds`."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, a)


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA), so that a host timer spans them too."""
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        torch.cuda.synchronize(device)


T = TypeVar("T")


def _interleaved(cases: Sequence[T], reps: int) -> Iterator[tuple[int, T]]:
    """(repetition, case): every repetition takes every case once, starting one case further each
    time.  Timed one case after another, the cases timed first took whatever state the machine
    was in then: on a 2-vCPU Xeon VM (2026-11-28) the all-reduces of 4 B to 16 KiB, timed first,
    took 4.5-18 ms (median) and the rest 0.4-0.8 ms up to 1 MiB, and made monotone the curve
    charged 5.6 ms for every all-reduce up to 4 MiB.  Taken in turn, a slow spell of the machine
    lands on all of them alike (docs/simulation.md, "Twentieth round")."""
    for rep in range(reps):
        k = rep % len(cases)
        for case in cases[k:] + cases[:k]:
            yield rep, case


def _comm_rank(rank: int, world: int, cfg: Settings, kind: str = "cpu") -> dict | None:
    from .comm import exchange_many, wait_all

    device = rank_device(kind, rank)   # the CPU, or CUDA device `rank` made current
    a = torch.randn(128, 128)   # the sender's host work (CPU), whatever the device
    groups = {r: dist.new_group(list(range(r))) for r in range(2, world + 1)}   # same order on every rank
    track_gloo_loops()              # as the trainer's groups (`ProcessGroups.create`)
    dist.barrier()
    # Point to point, rank 0 -> rank 1; the others only join the barriers.  Every repetition passes
    # over all the sizes (`_interleaved`).
    p2p: dict[int, list[float]] = {size: [] for size in cfg.sizes}
    sends = {size: torch.randn(max(1, size // 4), device=device) for size in cfg.sizes} if rank == 0 else {}
    for rep, size in _interleaved(cfg.sizes, cfg.warmup_reps + cfg.p2p_reps):
        n = max(1, size // 4)
        dist.barrier()
        if rank == 0:
            pending: list = []
            exchange_many({(1, 0): sends[size]}, {}, device, pending)
            _busy(BUSY_S, a)
            wait_all(pending)
        elif rank == 1:
            t0 = time.perf_counter()
            exchange_many({}, {(0, 0): (n, torch.float32)}, device, [])
            _sync(device)
            if rep >= cfg.warmup_reps:
                p2p[size].append(time.perf_counter() - t0)
    # All-reduce among ranks 0..r-1 for every r, all the (r, size) cases in every repetition.
    mine: list[float] = []
    layout: list[tuple[int, int]] = []
    tensors = {size: torch.randn(max(1, size // 4), device=device) for size in cfg.sizes}
    cases = [(r, size) for r in groups for size in cfg.sizes]
    for rep, (r, size) in _interleaved(cases, cfg.warmup_reps + cfg.allreduce_reps):
        dist.barrier()
        if rank < r:
            t0 = time.perf_counter()
            with own_gloo_call():    # as the trainer waits for its buckets (`GradSync.finish`)
                dist.all_reduce(tensors[size], group=groups[r])
            _sync(device)
            dt = time.perf_counter() - t0
        else:
            dt = 0.0
        if rep >= cfg.warmup_reps:
            mine.append(dt)
            layout.append((r, size))
    every = [torch.zeros(len(mine), dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(every, torch.tensor(mine, dtype=torch.float64, device=device))
    p2p_all = [None] * world
    dist.all_gather_object(p2p_all, p2p)
    if rank != 0:
        return None
    worst = torch.stack(every).max(dim=0).values.cpu().tolist()
    allreduce: dict[int, dict[int, list[float]]] = {}
    for (r, size), s in zip(layout, worst):
        allreduce.setdefault(r, {}).setdefault(size, []).append(s)
    return {"p2p": p2p_all[1], "allreduce": allreduce}


# -- 3. and 4.: the runtime's overheads (run in the ranks) -----------------------------------------

class _Elementwise(nn.Module):
    """A scale then K ``tanh``: K + 1 tiny elementwise ops."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k
        self.scale = nn.Parameter(torch.ones(_CHAIN_WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale
        for _ in range(self.k):
            x = torch.tanh(x)
        return x


class _Linears(nn.Module):
    """K linear layers of `width` features in a row (a weight of ``width**2`` floats and a bias
    each): small ones for the overhead chains, wide ones for the optimizer (`optimizer_job`)."""

    def __init__(self, k: int, width: int = _CHAIN_WIDTH):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def chain_spec(kind: str, k: int):
    """The synthetic model `kind` ("elementwise" or "linear") of length `k`, as a user writes one."""
    from autopar.planner.zoo import ModelSpec, TensorSpec
    from autopar.planner.zoo import seeded
    module = seeded(0, lambda: _Elementwise(k) if kind == "elementwise" else _Linears(k))
    return ModelSpec(name=f"calibrate-{kind}-{k}", module=module,
                     inputs=(("x", TensorSpec((_CHAIN_BATCH, _CHAIN_WIDTH), ("n", "c"))),),
                     target=("labels", TensorSpec((_CHAIN_BATCH,), ("n",), "int64")), loss="cross_entropy",
                     description=f"calibration chain: {k} {kind} ops of {_CHAIN_BATCH}x{_CHAIN_WIDTH}")


def _job(kind: str, k: int, placement: Callable[[int], int] | None):
    from autopar.planner.ir import ParallelConfig, Strategy, import_spec, single_device

    from .optim import OptimizerConfig
    from .config import Job, TrainConfig
    spec = chain_spec(kind, k)
    graph = import_spec(spec)
    if placement is None:
        strategy = single_device(graph)
    else:
        strategy = Strategy.from_mapping(graph, {op.name: ParallelConfig((1,) * len(op.pardims), (placement(i),))
                                                 for i, op in enumerate(graph.ops)}, "alternating")
    cfg = TrainConfig(model=spec.name, optimizer=OptimizerConfig("sgd", lr=0.01, momentum=0.9), log=False)
    return Job(cfg, spec, graph, strategy)


def _timed_passes(rt, device: torch.device | None = None) -> list[float]:
    """Wrap the runtime's forward and backward passes with wall timers; returns [fwd, bwd] seconds
    of the last step, updated in place.  On a GPU each pass starts and ends with the device idle."""
    last = [0.0, 0.0]
    fwd, bwd = rt._forward, rt._backward
    device = device or torch.device("cpu")

    def timed_fwd(*a):
        _sync(device)
        t0 = time.perf_counter()
        out = fwd(*a)
        _sync(device)
        last[0] = time.perf_counter() - t0
        return out

    def timed_bwd(*a):
        _sync(device)
        t0 = time.perf_counter()
        out = bwd(*a)
        _sync(device)
        last[1] = time.perf_counter() - t0
        return out
    rt._forward, rt._backward = timed_fwd, timed_bwd
    return last


def _kernel_sums(job, repeats: int, memo: dict, device: torch.device | None = None) -> dict[str, float]:
    """The kernel times of the job's single-device tasks, measured warm by the profiler's own
    `measure_task` (its engine start-up taken off the backward, as `autopar profile` does), and
    the counts of forward and backward tasks the simulator charges (`planner.sim.trainer_model`).
    Ops without inputs (the graph's inputs) have no kernel: the data loader's slice is overhead."""
    from autopar.planner.cost import engine_overhead, graph_input_shapes, measure_task, task_key
    from autopar.planner.sim import requires_grad

    graph = job.graph
    device = device or torch.device("cpu")
    if "engine" not in memo:
        memo["engine"] = engine_overhead(device)
    warm = {"cold": False}   # the chains' tiny tensors stay in cache during their steps
    grads = requires_grad(graph)
    fwd = bwd = fwd_host = bwd_host = 0.0
    for op, grad in zip(graph.ops, grads):
        if not op.inputs:
            continue
        degrees = (1,) * len(op.pardims)
        key = task_key(op, degrees, "calibration", graph_input_shapes(graph, op))
        if key not in memo:
            host: list[float] = []
            f, b = measure_task(graph, op, degrees, device, repeats=repeats, warmup=5, module=job.spec.module,
                                overhead=memo["engine"], host=host, **warm)
            memo[key] = (f, b, *(host if len(host) == 2 else (0.0, 0.0)))
        f, b, hf, hb = memo[key]
        fwd += f
        bwd += b if grad else 0.0
        fwd_host += hf
        bwd_host += hb if grad else 0.0
    # On a GPU also the host's seconds issuing the kernels (`planner.cost.measure_task`); 0 on a CPU.
    return {"fwd_kernels": fwd, "bwd_kernels": bwd, "fwd_host": fwd_host, "bwd_host": bwd_host,
            "fwd_tasks": len(graph.ops), "bwd_tasks": sum(grads)}


@contextlib.contextmanager
def _patched(owner, name: str, value):
    """Within it, ``owner.name`` is `value` (a timer or a variant of a runtime function the stages
    measure in the ranks); the original is back afterwards, however the block ends."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield original
    finally:
        setattr(owner, name, original)


def _evicting_spans(rt_mod, device: torch.device):
    """Within it, every forward and backward span of the runtime runs other ops' code and evicts
    the core's private caches (the profiler's `cache_evictor`) just before it ends, inside its
    timed region.

    In a real model an op's kernels pass over more memory than the core's L2 holds, so the
    runtime's own bookkeeping after it (input assembly, autograd leaves, accumulators: what runs
    between the spans) finds its code and data evicted.  The profiler times every op from evicted
    caches for the same reason.  The chains' tiny ops evict nothing, and their bookkeeping ran
    warm: 8-9 us per forward task outside the spans here, against 22 us with a 4 MiB write inside
    each span and 27-34 us per forward task in the zoo's models' steps (docs/simulation.md)."""
    from autopar.planner.cost import cache_evictor
    evict = cache_evictor(device)
    original = rt_mod._Span.__exit__

    def exit_evicting(span, *exc):
        if span.phase in ("fwd", "bwd"):
            evict()
        return original(span, *exc)
    return _patched(rt_mod._Span, "__exit__", exit_evicting)


def _cold_fit(chains: list[dict], pass_: str, cold: str, warm: str = "") -> tuple[float, float]:
    """(seconds per task, per step) of the runtime's own work in the `pass_` ("fwd" or "bwd")
    pass: between its spans with evicting spans (the `cold` variant's wall less phase), plus
    inside them beyond the kernels (the `warm` variant's phase less the kernels)."""
    tasks = f"{pass_}_tasks"
    outside = fit_intercept([(c[tasks], c[f"{cold}{pass_}_wall"] - c[f"{cold}{pass_}_phase"]) for c in chains])
    inside = fit_intercept([(c[tasks], c[f"{warm}{pass_}_phase"] - c[f"{pass_}_kernels"]) for c in chains])
    return outside[0] + inside[0], outside[1] + inside[1]


def _overhead_rank(rank: int, world: int, cfg: Settings, device_kind: str = "cpu") -> dict:
    """One rank: the chains single-device (fused as the runtime fuses them, then unfused), and on
    a CPU both again with the core's private caches evicted at the end of every op's span
    (`_evicting_spans`).  On a GPU the passes' wall times end with the device done
    (`_timed_passes`)."""
    from . import runtime as rt_mod
    from .comm import ProcessGroups
    from .session import Trainer

    device = rank_device(device_kind, rank)
    rows = []
    memo: dict = {}
    variants = [("", True, False), ("unfused_", False, False)]
    if device.type == "cpu":
        variants += [("cold_", True, True), ("cold_unfused_", False, True)]
    for kind in ("elementwise", "linear"):
        for k in cfg.chain_lengths:
            job = _job(kind, k, None)
            row = {"model": job.graph.name, **_kernel_sums(job, cfg.profile_repeats, memo, device)}
            for tag, fused, cold in variants:
                with (contextlib.nullcontext() if fused else
                      _patched(rt_mod.Runtime, "_fusable", lambda self, rv, views: False)):
                    tr = Trainer(job, rank, world, ProcessGroups(), device)
                last = _timed_passes(tr.runtime, device)
                walls, phases = [], []
                with _evicting_spans(rt_mod, device) if cold else contextlib.nullcontext():
                    for s in range(cfg.warmup_steps + cfg.steps):
                        tr.forward_backward(s)
                        if s >= cfg.warmup_steps:
                            walls.append(list(last))
                            phases.append(dict(tr.runtime.phases))
                row[f"{tag}fwd_wall"] = statistics.median(w[0] for w in walls)
                row[f"{tag}bwd_wall"] = statistics.median(w[1] for w in walls)
                row[f"{tag}fwd_phase"] = statistics.median(p["fwd"] for p in phases)
                row[f"{tag}bwd_phase"] = statistics.median(p["bwd"] for p in phases)
            rows.append(row)
    return {"chains": rows}


#: Untimed and timed steps of `model_overheads` (full, quick).
MODEL_STEPS = {False: (3, 12), True: (2, 4)}
#: `model_overheads`' data-parallel steps with and without the buckets' all-reduces: untimed steps,
#: then blocks of each (at least how many, and timed steps per block), alternating (full, quick).
SYNC_STEPS = {False: (3, 4, 6), True: (2, 2, 2)}
#: Then two more blocks of each at a time while the timed steps have run fewer seconds than this,
#: up to `SYNC_MAX_BLOCKS` of each (full, quick): what the all-reduces add beyond their calibrated
#: time is a small difference of two noisy medians (the tagger's ratio 1.4-3.5 over the kept runs,
#: its steps 20-50 ms), so a model with short steps gets more of them (docs/simulation.md,
#: "Thirty-sixth round").
SYNC_SECONDS = {False: 12.0, True: 0.0}
SYNC_MAX_BLOCKS = 16


def _model_sync_rank(rank: int, world: int, model: str, options: dict[str, Any], quick: bool,
                     budget_s: float, max_blocks: int) -> dict[str, Any]:
    """One rank of `model` under data parallelism, stepped by the trainer's own `Trainer` in
    alternating blocks with its gradient buckets' all-reduces and without them (each issue a
    no-op: the step then never synchronizes), a barrier before every step; per timed step its
    seconds and whether the all-reduces ran, and the bytes of the buckets this rank reduces."""
    from autopar.planner.ir import data_parallel
    tr = _model_trainer(rank, world, model, options, lambda graph: data_parallel(graph, world))
    sync = tr.runtime.sync
    issue = sync._issue
    untimed, blocks, per_block = SYNC_STEPS[quick]
    steps: list[tuple[float, bool]] = []
    done = b = 0
    more = torch.zeros(1)
    while True:
        on = b % 2 == (b // 2) % 2           # on, off, off, on, on, off, ...: neither always goes first
        sync._issue = issue if on else (lambda k: None)
        for i in range((untimed if b == 0 else 1) + per_block):
            dist.barrier()
            t0 = time.perf_counter()
            tr.train_step(done)
            seconds = time.perf_counter() - t0
            done += 1
            if i >= (untimed if b == 0 else 1):
                steps.append((seconds, on))
        b += 1
        if b % 4 == 0 and b >= 2 * blocks:   # after each on, off, off, on: rank 0 says whether to go on
            more[0] = float(rank == 0 and b < 2 * max_blocks and sum(t for t, _ in steps) < budget_s)
            dist.broadcast(more, 0)
            if not more[0]:
                break
    sync._issue = issue
    return {"steps": steps, "buckets": [sum(e.numel * sync.shards[e.param].tensor.element_size() for e in bk.entries)
                                        for bk in sync.mine]}


def model_sync(model: str, options: Mapping[str, Any] | None, world: int, *, quick: bool = False,
               seconds: float | None = None, max_blocks: int = SYNC_MAX_BLOCKS) -> dict[str, Any] | None:
    """What the gradient buckets' all-reduces add to `model`'s own data-parallel step on `world`
    local gloo ranks, one thread each: the median step (the slower rank's) with them, less the
    median without them (`SYNC_STEPS`, alternating blocks), and the bytes of every bucket
    (``buckets``), for `ensure_model_overheads` to set against the calibration's all-reduce.
    After the least number of blocks, two more of each at a time while the timed steps have run
    under `seconds` (default `SYNC_SECONDS`), up to `max_blocks` of each.

    The calibration times an all-reduce with nothing else running; in a step it runs on gloo's
    threads while the backward pass goes on, on the same core.  On the AMD VM (2026-11-29) they
    added 19.4 ms to rnnlm's step where the calibration's all-reduces summed to 7.5 ms, 16.4 to
    alexnet's (10.8), 3.6 to the transformer's (2.1) and 4.4 to the tagger's (1.7)
    (docs/simulation.md, "Thirtieth round").  None with one rank, or for a model whose data
    parallelism reduces no bucket."""
    if world < 2:
        return None
    seconds = SYNC_SECONDS[quick] if seconds is None else seconds
    per_rank = run_local(_model_sync_rank, world, (model, dict(options or {}), quick, seconds, max_blocks))
    if not per_rank[0]["buckets"]:
        return None
    steps = [(max(s[0] for s in same), same[0][1]) for same in zip(*(r["steps"] for r in per_rank))]
    on = statistics.median(t for t, o in steps if o)
    off = statistics.median(t for t, o in steps if not o)
    return {"with_s": on, "without_s": off, "added_s": max(0.0, on - off), "buckets": per_rank[0]["buckets"],
            "steps": len(steps)}


def _model_trainer(rank: int, world: int, model: str, options: dict[str, Any], plan: Callable[[Any], Any]):
    """The trainer's own `Trainer` for `model` (built with `options`) under `plan(graph)` on this
    CPU rank, with the optimizer the benchmarks step (sgd with momentum)."""
    from autopar.planner.ir import import_spec
    from autopar.planner.zoo import load_model

    from .comm import ProcessGroups
    from .optim import OptimizerConfig
    from .session import Trainer
    from .config import Job, TrainConfig
    spec = load_model(model, **options)
    graph = import_spec(spec)
    cfg = TrainConfig(model=spec.name, optimizer=OptimizerConfig("sgd", lr=0.01, momentum=0.9), log=False)
    return Trainer(Job(cfg, spec, graph, plan(graph)), rank, world, ProcessGroups(), torch.device("cpu"))


class ModelOverheadSteps:
    """`trainer` (a model whole on this rank: every op on one device, so no rank waits for
    another), stepped one step at a time (`step`); per timed step, the wall time of the runtime's
    forward and backward passes less their spans (`_timed_passes`), and its exchange spans, every
    one a call that moves nothing between ranks (`runtime.exchange_calls`).  `result` gives their
    medians, as `model_overheads` takes them from each rank."""

    def __init__(self, trainer):
        self.trainer = trainer
        self._last = _timed_passes(trainer.runtime)
        self.fwd: list[float] = []
        self.bwd: list[float] = []
        self.fwd_x: list[float] = []
        self.bwd_x: list[float] = []

    def step(self, s: int, timed: bool = True) -> None:
        self.trainer.train_step(s)
        if timed:
            ph, last = self.trainer.runtime.phases, self._last
            self.fwd.append(max(0.0, last[0] - ph["fwd"] - ph["exchange"]))
            self.bwd.append(max(0.0, last[1] - ph["bwd"] - ph["grad exchange"]))
            self.fwd_x.append(ph["exchange"])
            self.bwd_x.append(ph["grad exchange"])

    def result(self) -> dict[str, Any]:
        from .runtime import exchange_calls
        from autopar.planner.sim import requires_grad
        graph = self.trainer.job.graph
        calls = exchange_calls(self.trainer.runtime.views)
        return {"fingerprint": graph.fingerprint, "fwd_tasks": len(graph.ops), "bwd_tasks": sum(requires_grad(graph)),
                "fwd_between_s": statistics.median(self.fwd), "bwd_between_s": statistics.median(self.bwd),
                "steps": len(self.fwd), "fwd_calls": len(calls[0]), "bwd_calls": len(calls[1]),
                "fwd_exchange_s": statistics.median(self.fwd_x), "bwd_exchange_s": statistics.median(self.bwd_x)}


def _model_overhead_rank(rank: int, world: int, model: str, options: dict[str, Any], quick: bool) -> dict[str, Any]:
    """One rank: `model` whole on this rank, stepped by the trainer's own `Trainer`
    (`ModelOverheadSteps`), `MODEL_STEPS` untimed and timed steps."""
    from autopar.planner.ir import single_device
    steps = ModelOverheadSteps(_model_trainer(rank, world, model, options, lambda graph: single_device(graph, rank)))
    untimed, timed = MODEL_STEPS[quick]
    for s in range(untimed + timed):
        steps.step(s, timed=s >= untimed)
    return steps.result()


def overheads_of(per_rank: Sequence[Mapping[str, Any]]) -> tuple[float, float, tuple[float, float]]:
    """(seconds per forward task, per backward task, (forward, backward) seconds per exchange call)
    from every rank's `ModelOverheadSteps.result`: per rank its medians divided by the tasks (the
    calls), then the median over the ranks."""
    fwd = statistics.median(r["fwd_between_s"] / max(1, r["fwd_tasks"]) for r in per_rank)
    bwd = statistics.median(r["bwd_between_s"] / max(1, r["bwd_tasks"]) for r in per_rank)
    calls = tuple(statistics.median(r[f"{d}_exchange_s"] / r[f"{d}_calls"] if r[f"{d}_calls"] else 0.0
                                    for r in per_rank) for d in ("fwd", "bwd"))
    return fwd, bwd, calls


def own_calibration(calibration: Any, timed: Any, name: str) -> Any:
    """`calibration` with optimizer `name` fitted (`fit_optimizer`) to what its cases measured in a
    model's steps' minutes (`timed`, per rank: ``optimizer``, `OptimizerSteps.samples`: each case's
    median; per case the median over the ranks, as the calibration takes them), the other
    optimizers as they were; `calibration` itself where nothing was timed.  The accuracy benchmark
    times them between the blocks of a model's steps (`trainer.accuracy._measure`), ``autopar train
    --retime`` in its passes (`trainer.retime.RuntimeSteps`).

    Why: the optimizer step is memory-bound, as much the machine's as the ops are, and it was
    timed once, before the first model: over 16 kept runs its part came out 0.64-1.41x of the
    measured, the same way for every model of a run (docs/simulation.md, "Forty-seventh round")."""
    per_rank = [t["optimizer"] for t in timed if t.get("optimizer")]
    if not per_rank:
        return calibration
    samples = [(t, b, statistics.median(r[k][2] for r in per_rank)) for k, (t, b, _) in enumerate(per_rank[0])]
    per_tensor, per_byte = fit_optimizer(samples)
    optimizer = [o for o in calibration.optimizer if o[0] != name] + [(name, per_tensor, per_byte)]
    details = {**dict(calibration.details), "optimizer_between_blocks": [list(x) for x in samples]}
    return replace(calibration, optimizer=tuple(sorted(optimizer)), details=tuple(sorted(details.items())))


def own_overheads(costs: Any, calibration: Any, fingerprint: str, timed: Any) -> dict[str, float] | None:
    """Put into `costs` (a `ProfileCache` holding `calibration`) the runtime's own work per forward
    and backward task, and per exchange call that moves nothing, as the model's whole steps on each
    rank measured them in the steps' minutes (`timed`, per rank: ``overheads``,
    `ModelOverheadSteps.result`; `overheads_of`), in place of `model_overheads`' before the search;
    what its all-reduces add stays.  Returns them in microseconds, or None where nothing
    was timed."""
    per_rank = [t["overheads"] for t in timed if t.get("overheads")]
    if not per_rank:
        return None
    fwd, bwd, calls = overheads_of(per_rank)
    costs.put_overheads(calibration, fingerprint, fwd, bwd, per_rank[0]["steps"], exchange=calls,
                        allreduce_in_step=costs.allreduce_in_step(calibration, fingerprint))
    return {"fwd_task_us": round(fwd * 1e6, 1), "bwd_task_us": round(bwd * 1e6, 1),
            "exchange_call_us": [round(t * 1e6, 1) for t in calls]}


def own_line(cal: Any, name: str) -> str:
    """Optimizer `name`'s coefficients in `cal`, for the benchmark's log and ``--retime``'s summary."""
    per_tensor, per_byte = next((t, b) for n, t, b in cal.optimizer if n == name)
    return f"{per_tensor * 1e6:.0f} us per tensor and {per_byte * 1e6 * (1 << 20):.0f} us per MiB"


def model_overheads(model: str, options: Mapping[str, Any] | None, world: int, *,
                    quick: bool = False) -> dict[str, Any]:
    """The runtime's own work per forward and per backward task between its spans, and what its
    data-parallel all-reduces add to a step (``sync``, `model_sync`), in `model`'s
    own steps (module docstring, 3.): `world` local gloo ranks, one thread each, each stepping
    the whole model at once, as busy as a data-parallel step keeps them; per rank the median
    over the timed steps (`MODEL_STEPS`) divided by the tasks the simulator counts, then the
    median over the ranks.  Likewise ``exchange_call_s``, (forward, backward) seconds per exchange
    call, every one of which moves nothing between ranks there: its exchange spans divided by the
    calls (`runtime.exchange_calls`; 0 where the model makes none), which is what a rank pays for
    an op's exchange beside any message (`planner.sim.trainer_model._local_calls`: 0.2-0.9 ms of a
    data-parallel step on the AMD VM of 2026-11-29).  `model` and `options` as `autopar profile`
    takes them (each rank imports the model itself).  About as long as 15 single-device steps and
    58 data-parallel ones, or more where they fit in `SYNC_SECONDS` (226 at most)."""
    if world < 1:
        raise ValueError(f"model_overheads needs at least one rank, got world={world}")
    per_rank = run_local(_model_overhead_rank, world, (model, dict(options or {}), quick))
    fwd, bwd, calls = overheads_of(per_rank)
    return {"fingerprint": per_rank[0]["fingerprint"], "fwd_task_s": fwd, "bwd_task_s": bwd,
            "exchange_call_s": calls, "steps": per_rank[0]["steps"], "fwd_tasks": per_rank[0]["fwd_tasks"],
            "bwd_tasks": per_rank[0]["bwd_tasks"], "ranks": world,
            "sync": model_sync(model, options, world, quick=quick)}


def allreduce_in_step(sync: Mapping[str, Any] | None, calibration: RuntimeCalibration) -> float | None:
    """What `model_sync`'s all-reduces added to the model's step, over what `calibration`'s
    all-reduce says for its buckets (`RuntimeCalibration.allreduce_in_step`); None without a
    measurement or a calibrated all-reduce."""
    if not sync or not calibration.allreduce:
        return None
    charged = sum(calibration.allreduce_time(b, calibration.world) for b in sync["buckets"])
    return sync["added_s"] / charged if charged > 0 else None


def ensure_model_overheads(cache, model: str, options: Mapping[str, Any] | None, workers: int, *,
                           remeasure: bool = False, progress: Callable[[str], None] | None = None,
                           quick: bool = False, fingerprint: str | None = None) -> dict[str, Any]:
    """The runtime's own work per task in `model`'s own steps on `workers` local CPU ranks
    (`model_overheads`, a few seconds), which the simulator charges for this model in place of
    the calibration's chains: kept when the cache has it for the cache's calibration of
    ``local:<workers>`` (with its exchange calls and, on more than one rank, what its all-reduces
    add to a data-parallel step: an older autopar did not time them), measured
    and saved otherwise, or with `remeasure` (what `autopar
    profile` and `autopar run` do after `autopar.job.pipeline.ensure_calibration`); a new
    measurement on more than one rank also answers `model_sync`'s median steps with the buckets'
    all-reduces and without them (``sync_steps``: ``with_s``, ``without_s``, ``steps``).  Skipped (the
    chains' figures stay) where the cache has no such calibration, and ``failed``, with the
    error, where the ranks could not step the model whole; the profile is kept either way.
    Stored under `fingerprint` (default: the graph of `model` built with `options`), e.g. the
    graph a job plans in another dtype: the runtime's work per op does not depend on it, and the
    steps timed are float32."""
    from autopar.planner.errors import AutoparError
    from autopar.planner.ir import import_spec
    from autopar.planner.zoo import load_model

    product, backend = calibration_target(workers, "cpu")
    cal = cache.calibration(product, backend, workers)
    if cal is None:
        return {"status": "skipped", "line": f"no runtime calibration of local:{workers} to go with"}
    fingerprint = fingerprint or import_spec(load_model(model, **dict(options or {}))).fingerprint
    have, calls = cache.overheads(cal, fingerprint), cache.exchange_overheads(cal, fingerprint)
    in_step = cache.allreduce_in_step(cal, fingerprint)
    # Without `calls` or `in_step` (on more than one rank): an older autopar's measurement.
    if have is not None and calls is not None and (in_step is not None or workers < 2) and not remeasure:
        return _overheads_result("kept", model, have[0], have[1], calls, in_step)
    if progress is not None:
        progress(f"the runtime's own work per op, and what its all-reduces add, in {model}'s steps")
    t0 = time.perf_counter()
    try:
        res = model_overheads(model, options, workers, quick=quick)
    except AutoparError as e:       # a rank that cannot step the model whole: the chains' figures serve
        return {"status": "failed", "line": f"not measured ({e}); the calibration's per-op figures are used"}
    ratio = allreduce_in_step(res.get("sync"), cal)
    cache.put_overheads(cal, fingerprint, res["fwd_task_s"], res["bwd_task_s"], res["steps"],
                        exchange=res["exchange_call_s"], allreduce_in_step=ratio)
    cache.save()
    out = {**_overheads_result("measured", model, res["fwd_task_s"], res["bwd_task_s"], res["exchange_call_s"],
                               ratio), "seconds": round(time.perf_counter() - t0, 1)}
    if res.get("sync"):
        out["sync_steps"] = {k: res["sync"][k] for k in ("with_s", "without_s", "steps")}
    return out


def _overheads_result(status: str, model: str, fwd: float, bwd: float,
                      exchange: tuple[float, float] | None = None, in_step: float | None = None) -> dict[str, Any]:
    """`ensure_model_overheads`' answer for seconds per forward and per backward task (and per
    exchange call that moves nothing, and what the all-reduces add to a step, where measured)."""
    out = {"status": status, "fwd_task_us": round(fwd * 1e6, 1), "bwd_task_us": round(bwd * 1e6, 1),
           "line": f"{model}'s steps: {fwd * 1e6:.0f} us per forward task and {bwd * 1e6:.0f} us per backward "
                   "one between spans"}
    if exchange is not None:
        out["exchange_call_us"] = [round(t * 1e6, 1) for t in exchange]
        out["line"] += f"; {exchange[0] * 1e6:.0f} and {exchange[1] * 1e6:.0f} us per exchange call"
    if in_step is not None:
        out["allreduce_in_step"] = round(in_step, 3)
        out["line"] += f"; its data-parallel all-reduces add {in_step:.2f}x what the calibration says to a step"
    return out


def _optimizer_rank(rank: int, world: int, cfg: Settings, kind: str = "cpu") -> dict[str, Any]:
    """One rank's optimizer samples (`_optimizer_in_steps`, ``optimizer``), the (bytes,
    seconds) of every bucket's all-reduce it issued in those steps (``issues``): the call that
    starts it, on the rank's own thread (`trainer.sync.GradSync._issue`), and the (tensors, bytes,
    seconds) of every zeroing of its buckets as a step started, after each job's first
    `ZERO_WARMUP` (``zero``, `trainer.sync.GradSync.zero_grad`)."""
    from . import sync as sync_mod
    issues: list[tuple[int, float]] = []
    zeroed: list[tuple[int, int, float]] = []
    calls: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()   # per GradSync: ids get reused
    issue, zero_grad = sync_mod.GradSync._issue, sync_mod.GradSync.zero_grad
    device = rank_device(kind, rank)

    def timed_zero(gs):
        _sync(device)
        t0 = time.perf_counter()
        zero_grad(gs)
        _sync(device)
        seconds = time.perf_counter() - t0
        calls[gs] = n = calls.get(gs, 0) + 1
        if n > ZERO_WARMUP and gs._flat:
            tensors = sum(len(spans) for _, spans in gs._flat.values())
            zeroed.append((tensors, sum(buf.numel() * buf.element_size() for buf, _ in gs._flat.values()), seconds))

    def timed_issue(gs, k):
        t0 = time.perf_counter()
        issue(gs, k)
        bucket = gs.mine[k]
        itemsize = gs.shards[bucket.entries[0].param].tensor.element_size()
        issues.append((bucket.numel * itemsize, time.perf_counter() - t0))
    with _patched(sync_mod.GradSync, "_issue", timed_issue), _patched(sync_mod.GradSync, "zero_grad", timed_zero):
        samples = _optimizer_in_steps(rank, world, cfg, device)
    return {"optimizer": samples, "issues": issues, "zero": zeroed, "draw": _draw_samples(device)}


#: Zeroings of a job's buckets `_optimizer_rank` leaves out: the first step's, whose buffers are
#: new, and the second's.
ZERO_WARMUP = 2


def fit_zero(per_rank: Sequence[Sequence[tuple[int, int, float]]]) -> tuple[float, float] | None:
    """(seconds per tensor, seconds per byte) of zeroing a step's gradient buckets, from every
    rank's (tensors, bytes, seconds) (`_optimizer_rank`): the median per (tensors, bytes) over
    the ranks' calls, fitted as the optimizer is (`fit_optimizer`); None without a sample (one
    rank: no buckets)."""
    by_case: dict[tuple[int, int], list[float]] = {}
    for rank in per_rank:
        for tensors, nbytes, seconds in rank:
            by_case.setdefault((tensors, nbytes), []).append(seconds)
    if not by_case:
        return None
    return fit_optimizer([(t, b, statistics.median(v)) for (t, b), v in sorted(by_case.items())])


#: Elements of the synthetic tensors `_draw_samples` draws, and how often it draws each.
DRAW_SIZES = (1 << 14, 1 << 18, 1 << 20)
DRAW_REPEATS = 9


def _draw_samples(device: torch.device) -> dict[str, list[tuple[int, float]]]:
    """(elements, median seconds) of drawing a synthetic input tensor on `device` as
    `planner.zoo.ModelSpec.example_inputs` draws one, per kind: ``float`` (``torch.randn``) and
    ``int`` (``torch.randint``, token ids)."""
    gen = torch.Generator(device=device).manual_seed(0)
    draws = {"float": lambda n: torch.randn((n,), generator=gen, device=device),
             "int": lambda n: torch.randint(0, 8192, (n,), generator=gen, dtype=torch.int64, device=device)}
    out: dict[str, list[tuple[int, float]]] = {}
    for kind, draw in draws.items():
        out[kind] = []
        for n in DRAW_SIZES:
            draw(n)
            times = []
            for _ in range(DRAW_REPEATS):
                _sync(device)
                t0 = time.perf_counter()
                draw(n)
                _sync(device)
                times.append(time.perf_counter() - t0)
            out[kind].append((n, statistics.median(times)))
    return out


def fit_draw(per_rank: Sequence[Mapping[str, Sequence[tuple[int, float]]]]) -> tuple[tuple[str, float, float], ...]:
    """(kind, seconds per tensor, seconds per element) per kind of `_draw_samples`: for each size
    the median over the ranks, then least squares of ``per_tensor + elements * per_element``
    (`fit_intercept`), the per-tensor part clamped at 0."""
    out = []
    for kind in sorted(per_rank[0]):
        sizes = [n for n, _ in per_rank[0][kind]]
        rows = [(n, statistics.median(dict(r[kind])[n] for r in per_rank)) for n in sizes]
        per_element, per_tensor = fit_intercept(rows)
        out.append((kind, max(0.0, per_tensor), per_element))
    return tuple(out)


def issue_curve(per_rank: list[list[tuple[int, float]]]) -> tuple[Curve | None, dict]:
    """Seconds a rank's thread spends issuing one bucket's all-reduce, against the bucket's bytes:
    the mean over every rank's issues per power of two of the bucket's size (a step pays the slow
    ones too; buckets a few bytes apart are one size), monotone, and constant beyond the largest
    bucket measured (`Curve.flat_after_last`: the call hands the tensor over, it does not copy
    it).  None where nothing was issued."""
    by_size: dict[int, list[float]] = {}
    for issues in per_rank:
        for nbytes, seconds in issues:
            size = 1 << max(0, round(math.log2(max(1, nbytes))))
            by_size.setdefault(size, []).append(seconds)
    if not by_size:
        return None, {}
    means = {size: statistics.fmean(v) for size, v in sorted(by_size.items())}
    return Curve.fit(means.items()).flat_after_last(), {"issues": sum(map(len, by_size.values())),
                                                        "mean_s": {str(size): m for size, m in means.items()}}


def optimizer_job(name: str, tensors: int, nbytes: int, world: int):
    """The workload of one optimizer case: ``tensors / 2`` linear layers whose weights hold
    `nbytes` bytes each, data-parallel on `world` ranks (every rank steps every tensor after the
    gradients' all-reduce), trained with optimizer `name`."""
    from autopar.planner.ir import data_parallel, import_spec, single_device
    from autopar.planner.zoo import ModelSpec, TensorSpec, seeded

    from .optim import OptimizerConfig
    from .config import Job, TrainConfig
    layers, width = max(1, tensors // 2), max(2, math.isqrt(nbytes // 4))
    module = seeded(0, lambda: _Linears(layers, width))
    spec = ModelSpec(name=f"calibrate-optimizer-{layers}x{width}", module=module,
                     inputs=(("x", TensorSpec((_CHAIN_BATCH, width), ("n", "c"))),),
                     target=("labels", TensorSpec((_CHAIN_BATCH,), ("n",), "int64")), loss="cross_entropy",
                     description=f"optimizer calibration: {layers} linear layers of {width}")
    graph = import_spec(spec)
    strategy = data_parallel(graph, world) if world > 1 else single_device(graph)
    cfg = TrainConfig(model=spec.name, optimizer=OptimizerConfig(name, lr=1e-3, momentum=0.9), log=False)
    return Job(cfg, spec, graph, strategy)


class OptimizerSteps:
    """Optimizer `name`'s workloads (`optimizer_job`) of `cases` ((tensors, bytes per tensor)) on
    this rank, stepped one step at a time (`step`); `out` holds, per case, the timed steps' seconds
    of the trainer's ``optimizer step`` phase, and `samples` their (tensors, bytes, median seconds).

    Stepped on its own over tensors a test has just made, an optimizer finds them in the core's
    caches; in a training step it comes after the backward pass and the gradients' all-reduce have
    passed over far more memory, on every rank at once.  On this machine that made SGD's step
    over 20 MiB of an RNN's parameters 6.9 ms alone (caches evicted) and 8.8-9.1 ms in its steps,
    and 10 MiB of a model-parallel shard 3.8 ms against 5.0-5.3 ms; the calibration measured
    alone predicted 6.0 and 3.1 ms.  So the optimizer is timed where it runs: in the steps of the
    trainer itself, after a pass over more memory than the last-level cache holds.  On a GPU the
    step is timed from an idle device to the end of its kernels (the phase timer sees only their
    launches)."""

    def __init__(self, rank: int, world: int, cases: Sequence[tuple[int, int]], name: str = "sgd",
                 device: torch.device | None = None):
        from .comm import ProcessGroups
        from .session import Trainer

        from autopar.planner.cost import last_level_cache_bytes
        self.world, self.device = world, device or torch.device("cpu")
        # what the rest of a step does to the caches: more traffic than the last level holds
        self._flush = torch.zeros(min(FLUSH_CAP_BYTES, max(64 << 20, last_level_cache_bytes())) // 4,
                                  device=self.device)
        self.trainers = [Trainer(optimizer_job(name, tensors, nbytes, world), rank, world, ProcessGroups(),
                                 self.device) for tensors, nbytes in cases]
        self.sizes = [(len(mine), float(_nbytes(mine))) for mine in (tr.runtime.parameters() for tr in self.trainers)]
        self.out: list[list[float]] = [[] for _ in self.trainers]

    def step(self, case: int, s: int, timed: bool = True) -> None:
        """Step case `case`'s trainer (its step `s`): forward and backward, the pass over memory, then
        the optimizer step from a barrier of all ranks, recorded in `out` when `timed`."""
        tr = self.trainers[case]
        if self.world > 1:
            dist.barrier()
        tr.forward_backward(s)
        self._flush.add_(1.0)
        if self.world > 1:
            dist.barrier()
        _sync(self.device)
        t0 = time.perf_counter()
        tr.optimizer_step()
        _sync(self.device)
        if timed:
            self.out[case].append(tr.runtime.phases["optimizer step"] if self.device.type == "cpu"
                                  else time.perf_counter() - t0)

    def samples(self) -> list[tuple[int, float, float]]:
        """(tensors, bytes, median seconds) of every case with a timed step."""
        return [(tensors, nbytes, statistics.median(times)) for (tensors, nbytes), times in zip(self.sizes, self.out)
                if times]


def _optimizer_in_steps(rank: int, world: int, cfg: Settings,
                        device: torch.device | None = None) -> dict[str, list[tuple[int, float, float]]]:
    """(tensors, bytes, median seconds) of the trainer's ``optimizer step`` phase inside real
    training steps (`OptimizerSteps`), per optimizer and case: each case's steps one after another,
    the first two untimed."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for name in ("sgd", "adam"):
        steps = OptimizerSteps(rank, world, cfg.optimizer_cases, name, device)
        for case in range(len(cfg.optimizer_cases)):
            for s in range(2 + cfg.optimizer_repeats):
                steps.step(case, s, timed=s >= 2)
        out[name] = steps.samples()
        del steps
    return out


def _exchange_rank(rank: int, world: int, cfg: Settings) -> list[dict]:
    """Two ranks step the chains with op i on rank i mod 2; per step, time in the exchange spans,
    time inside `exchange_many`, and the number of exchange calls."""
    from . import runtime as rt_mod
    from .comm import ProcessGroups
    from .session import Trainer

    inner = rt_mod.exchange_many
    acc = [0, 0.0]

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            acc[0] += 1
            acc[1] += time.perf_counter() - t0
    out = []
    with _patched(rt_mod, "exchange_many", timed):
        for kind in ("elementwise", "linear"):
            for k in cfg.exchange_lengths:
                job = _job(kind, k, lambda i: i % 2)
                tr = Trainer(job, rank, world, ProcessGroups())
                steps = []
                for s in range(cfg.warmup_steps + cfg.steps):
                    dist.barrier()
                    acc[:] = [0, 0.0]
                    tr.forward_backward(s)
                    if s >= cfg.warmup_steps:
                        ph = tr.runtime.phases
                        steps.append((acc[0], ph["exchange"] + ph["grad exchange"], acc[1]))
                out.append({"model": job.graph.name, "steps": steps})
    return out


# -- the calibration -------------------------------------------------------------------------------

def _stats(xs: Sequence[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"mean": statistics.fmean(s), "median": statistics.median(s),
            "p90": s[min(len(s) - 1, int(math.ceil(0.9 * len(s))) - 1)], "n": len(s)}


def calibration_target(world: int, device: str = "cpu") -> tuple[str, str]:
    """(device product, backend) that `calibrate(world, device=device)` measures and keys its
    result by: the ``local`` preset's CPU product and gloo, or this machine's GPU product
    (`planner.cost.device_kind_of`) and NCCL.  Raises `TrainerConfigError` where this machine
    cannot run it."""
    kind = torch.device(device).type
    if kind == "cpu":
        from autopar.planner.hardware import get_preset
        return get_preset(f"local:{world}").devices[0].product, BACKEND
    if kind != "cuda":
        raise TrainerConfigError(f"calibrate measures cpu or cuda ranks, not {device!r}")
    check_gpus(world, fix="calibrate fewer ranks (--topology local:N, N at most the GPUs), or on the CPU")
    from autopar.planner.cost import device_kind_of   # pragma: no cover - needs a GPU
    return device_kind_of(torch.device("cuda", 0)), GPU_BACKEND   # pragma: no cover - needs a GPU


def calibrate(world: int, *, quick: bool = False, progress: Callable[[str], None] | None = None,
              device: str = "cpu") -> RuntimeCalibration:
    """Measure the `RuntimeCalibration` of `world` local ranks (module docstring): gloo ranks on
    the CPU, or with ``device="cuda"`` NCCL ranks on this machine's GPUs, one each.

    `progress(message)` is called before each stage.  About 40 s on 2 CPU ranks of this machine
    (``quick``: about 15 s).  On GPUs, stages 1, 2, 3 and 5 run the same code on the ranks'
    devices; the per-op overheads are the runtime's host work beyond the host's issuing of the
    kernels (`planner.sim.trainer_model.op_plan`).  The exchange, in-situ and message-batch
    stages measure gloo's behaviour on shared cores and keep the defaults there
    (``details["not_measured"]``)."""
    if world < 1:
        raise ValueError(f"calibrate needs at least one rank, got world={world}")
    product, backend = calibration_target(world, device)
    kind = torch.device(device).type
    gpu = kind == "cuda"
    cfg = settings(quick)
    say = progress or (lambda _m: None)
    fallback = default_calibration(product, backend, world)
    t_all = time.perf_counter()
    details: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                               "torch": torch.__version__, "cpu_count": os.cpu_count(),
                               "usable_cores": usable_cores(), "quick": quick,
                               "sizes": list(cfg.sizes), "threads_per_rank": None if gpu else 1,
                               "sender_busy_s": BUSY_S, "device": kind}
    not_measured = []

    # 1. and 2.
    if world >= 2:
        say(f"point to point and all-reduce on {world} {backend} ranks ({len(cfg.sizes)} sizes)")
        comm = run_local(_comm_rank, world, (cfg, kind), backend=backend)[0]
        p2p_stats = {size: _stats(w) for size, w in sorted(comm["p2p"].items())}
        p2p = Curve.fit((size, st["mean"]) for size, st in p2p_stats.items())
        details["p2p_repetitions"] = cfg.p2p_reps
        details["p2p_stats_s"] = {str(size): st for size, st in p2p_stats.items()}
        p2p_median = Curve.fit((size, st["median"]) for size, st in p2p_stats.items())
        details["p2p_median"] = p2p_median.to_json()
        empty = p2p_median(min(p2p_stats))
        wire = Curve.fit((size, p2p_median(size) - empty) for size in p2p_stats)
        allreduce = []
        ar_stats = {}
        for r, by_size in sorted(comm["allreduce"].items()):
            st = {size: _stats(v) for size, v in sorted(by_size.items())}
            ar_stats[str(r)] = {str(size): s for size, s in st.items()}
            allreduce.append((r, Curve.fit((size, s["mean"]) for size, s in st.items())))
        details["allreduce_repetitions"] = cfg.allreduce_reps
        details["allreduce_stats_s"] = ar_stats
        details["allreduce_median"] = {str(r): Curve.fit((int(size), s["median"]) for size, s in st.items()).to_json()
                                       for r, st in ar_stats.items()}
    else:
        p2p, allreduce, wire = fallback.p2p, list(fallback.allreduce), fallback.wire
        not_measured += ["p2p", "allreduce"]

    # 3. and 5.
    say("per-op overheads of the runtime on one rank")
    res = run_local(_overhead_rank, 1, (cfg, kind), backend=backend)[0]
    say(f"optimizer steps on {world} rank(s) at once")
    per_rank = run_local(_optimizer_rank, world, (cfg, kind), backend=backend)
    res["optimizer"] = {name: [(t, b, statistics.median(r["optimizer"][name][k][2] for r in per_rank))
                               for k, (t, b, _) in enumerate(samples)]
                        for name, samples in per_rank[0]["optimizer"].items()}
    issue, issued = issue_curve([r["issues"] for r in per_rank]) if world >= 2 else (None, {})
    details["allreduce_issue"] = issued
    draw = fit_draw([r["draw"] for r in per_rank])
    details["draw_samples"] = [r["draw"] for r in per_rank]
    zero = fit_zero([r["zero"] for r in per_rank])
    details["zero_samples"] = [r["zero"] for r in per_rank]
    chains = res["chains"]
    # On a CPU rank the runtime's cost adds to the kernels it runs.  On a GPU the host issues
    # kernels that run behind it, and a chain of tiny ops is paced by the host alone: the runtime's
    # cost adds to the host's issuing (`planner.sim.trainer_model.op_plan`).
    part = "host" if gpu else "kernels"
    fwd_task_s, fwd_step_s = fit_intercept([(c["fwd_tasks"], c["fwd_wall"] - c[f"fwd_{part}"]) for c in chains])
    bwd_task_s, bwd_step_s = fit_intercept([(c["bwd_tasks"], c["bwd_wall"] - c[f"bwd_{part}"]) for c in chains])
    unfused_s, _ = fit_intercept([(c["bwd_tasks"], c["unfused_bwd_wall"] - c[f"bwd_{part}"]) for c in chains])
    fwd_phase_s, _ = fit_intercept([(c["fwd_tasks"], c["fwd_phase"] - c["fwd_kernels"]) for c in chains])
    bwd_phase_s, _ = fit_intercept([(c["bwd_tasks"], c["bwd_phase"] - c["bwd_kernels"]) for c in chains])
    details["overhead_chains"] = chains
    details.update(warm_fwd_task_s=fwd_task_s, warm_bwd_task_s=bwd_task_s, warm_bwd_task_unfused_s=unfused_s,
                   fwd_task_phase_only_s=fwd_phase_s, bwd_task_phase_only_s=bwd_phase_s)
    if not gpu:
        # The runtime's work between the spans, timed with the caches evicted by every op as a
        # real model's ops evict them (`_evicting_spans`), plus its work inside the spans beyond
        # the kernels, timed warm (a span's eviction would drown it).
        fwd_task_s, fwd_step_s = _cold_fit(chains, "fwd", "cold_")
        bwd_task_s, bwd_step_s = _cold_fit(chains, "bwd", "cold_")
        unfused_s, _ = _cold_fit(chains, "bwd", "cold_unfused_", "unfused_")
    details.update(fwd_step_s=fwd_step_s, bwd_step_s=bwd_step_s, bwd_task_unfused_s=unfused_s)
    optimizer = []
    for name, samples in sorted(res["optimizer"].items()):
        per_tensor, per_byte = fit_optimizer(samples)
        optimizer.append((name, per_tensor, per_byte))
    details["optimizer_samples"] = {name: [list(s) for s in samples] for name, samples in res["optimizer"].items()}

    # 4.
    if world >= 2 and not gpu:
        say("exchange overhead on 2 ranks (chains on alternating ranks)")
        per_rank = run_local(_exchange_rank, 2, (cfg,))
        per_call = []
        for rank_rows in per_rank:
            for row in rank_rows:
                per_call.append(statistics.median((span - inside) / calls for calls, span, inside in row["steps"]
                                                  if calls))
        exchange_s = max(0.0, statistics.fmean(per_call))
        details["exchange_per_call_s"] = per_call
    else:
        exchange_s = fallback.exchange_s
        not_measured.append("exchange_s")
    cal = RuntimeCalibration(product=product, backend=backend, world=world, fwd_task_s=fwd_task_s,
                             bwd_task_s=bwd_task_s, bwd_call_s=max(0.0, unfused_s - bwd_task_s),
                             exchange_s=exchange_s, p2p=p2p, allreduce=tuple(allreduce),
                             optimizer=tuple(optimizer),
                             comm_uses_cores=not gpu and usable_cores() < 2 * world, issue=issue,
                             source="measured", wire=wire, draw=draw, zero=zero, details=(),
                             shared_cache_bytes=None if gpu else shared_cache_bytes())

    # 6. and 8.
    if world >= 2 and gpu:  # pragma: no cover - needs GPUs
        not_measured += ["staging", "in_situ", "message_serial_s"]
    elif world >= 2:
        say(f"messages inside training steps (a model-parallel chain on {world} ranks, "
            f"{len(IN_SITU_BATCHES)} message sizes)")
        in_situ = run_local(_in_situ_rank, world, (cfg,))
        say(f"one-way messages inside training steps (the chain's ops on ranks 0 and 1 in turn, "
            f"{len(IN_SITU_BATCHES)} message sizes)")
        one_way = run_local(_in_situ_rank, world, (cfg, True))
        microbenchmark = cal
        cal, measured = in_step_messages(cal, in_situ, one_way, wire=p2p_median)
        details.update(measured)
        details["in_situ"] = exchange_latency_check(cal, microbenchmark, world, cfg, in_situ, measured["in_situ"])
        say(f"messages of one exchange on {world} ranks (one and two each way)")
        serial, means = message_serial(run_local(_batch_rank, world, (cfg,)))
        cal = replace(cal, message_serial_s=serial)
        details["message_batches"] = {**means, "message_serial_s": serial, "busy_s": BATCH_BUSY_S,
                                      "message_bytes": BATCH_FLOATS * 4, "repetitions": cfg.batch_reps}
    if not_measured:
        details["not_measured"] = not_measured
    details["seconds"] = time.perf_counter() - t_all
    return replace(cal, details=tuple(sorted(details.items())))


#: Seconds each rank computes between two exchanges of the message-batch measurement: about an
#: op of the zoo's small models on one core (an rnnlm cell takes 0.5-1.1 ms in steps; `_batch_rank`).
BATCH_BUSY_S = 1e-3
#: Floats in each message of the message-batch measurement (16 KiB, a hidden state of 16 x 256).
BATCH_FLOATS = 4096


def _batch_rank(rank: int, world: int, cfg: "Settings") -> dict[int, list[tuple[float, float]]]:
    """Ranks 0 and 1 compute for `BATCH_BUSY_S`, then exchange k pieces each way in one
    `exchange_many` call (as an op with k inputs to gather does), for k = 1 and 2; per k, when
    this rank entered each call and when it returned.  Other ranks take no part."""
    from .comm import exchange_many, wait_all

    if rank > 1:
        return {}
    out: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    a = torch.randn(128, 128)
    peer = 1 - rank
    device = torch.device("cpu")
    pending: list = []
    # The two cases alternate, exchange by exchange: run one block after the other and the
    # machine's speed, which drifts over seconds, differs between them.  The latencies' mean is
    # that of a long tail (medians 0.35 ms, means 1.1-1.8 ms), so it takes many exchanges: runs
    # back to back on this machine, computing 0.3 ms between exchanges, gave 75-452 us in blocks
    # of 300, 29-204 us alternating 300, 85-114 us alternating 1,200; computing 1 ms and
    # alternating 600, 139-180 us (about 5 s).
    for rep in range(cfg.warmup_reps + cfg.batch_reps):
        for k in (1, 2):
            _busy(BATCH_BUSY_S, a)
            sends = {(peer, m): torch.randn(BATCH_FLOATS) for m in range(k)}
            recvs = {(peer, m): (BATCH_FLOATS, torch.float32) for m in range(k)}
            t0 = time.perf_counter()
            exchange_many(sends, recvs, device, pending)
            if rep >= cfg.warmup_reps:
                out[k].append((t0, time.perf_counter()))
    wait_all(pending)
    return out


def message_serial(per_rank: list[dict[int, list[tuple[float, float]]]]) -> tuple[float, dict[str, float]]:
    """``message_serial_s`` from `_batch_rank`'s timestamps: an exchange of two messages each way
    (four between the pair) against one each way (two): the mean latency (from the later rank's
    entry to each rank's return) grows by two serial turns.  Clamped to [0, half the one-message
    latency]; (seconds, the two mean latencies)."""
    means = {}
    for k in (1, 2):
        lat: list[float] = []
        for (p0, d0), (p1, d1) in zip(per_rank[0][k], per_rank[1][k]):
            posted = max(p0, p1)
            lat += [max(0.0, d0 - posted), max(0.0, d1 - posted)]
        means[k] = statistics.fmean(lat)
    serial = min(max(0.0, (means[2] - means[1]) / 2), means[1] / 2)
    return serial, {"one_each_way_s": means[1], "two_each_way_s": means[2]}


IN_SITU_LAYERS = 12
IN_SITU_WIDTH = 256
IN_SITU_BATCH = 32
#: Extra ``tanh`` ops after each layer of the two-way chain: the ranks compute about 0.7 ms between
#: exchanges, as long as a small model's ops do (an RNN's cells: 0.5-1.1 ms), without changing
#: the messages.  An exchange in which two ranks send to each other stalls more often the longer
#: they compute between exchanges: at 16 KiB its messages took 0.36 ms on average in the plain
#: chain, 0.59 ms with 8 of these, 0.71 ms with 16, and 0.9-1.0 ms in an RNN's model-parallel steps.
IN_SITU_BUSY_OPS = 16
#: The one-way workload's strategy (`in_situ_job` with ``one_way``): the chain's ops whole, on ranks 0 and 1 in turn.
ONE_WAY_STRATEGY = "alternating"


def in_situ_job(world: int, batch: int = IN_SITU_BATCH, one_way: bool = False):
    """The in-situ workload: a chain of linear layers with every layer's output features split
    over the `world` ranks (model parallelism), so that every op exchanges its input among busy
    ranks, both ways, as model-parallel and mixed plans do; `batch` rows.  With `one_way`, the
    chain's ops whole and on ranks 0 and 1 in turn instead: every op's input comes from the other
    rank, and nothing goes back in the same exchange."""
    from autopar.planner.hardware import get_preset
    from autopar.planner.ir import ParallelConfig, Strategy, import_spec
    from autopar.planner.search import named_strategy
    from autopar.planner.zoo import ModelSpec, TensorSpec, seeded

    from .optim import OptimizerConfig
    from .config import Job, TrainConfig
    busy = 0 if one_way else IN_SITU_BUSY_OPS
    module = seeded(0, lambda: nn.Sequential(*[m for _ in range(IN_SITU_LAYERS)
                                               for m in [nn.Linear(IN_SITU_WIDTH, IN_SITU_WIDTH)]
                                               + [nn.Tanh() for _ in range(1 + busy)]]))
    spec = ModelSpec(name="calibrate-in-situ", module=module,
                     inputs=(("x", TensorSpec((batch, IN_SITU_WIDTH), ("n", "c"))),),
                     target=("labels", TensorSpec((batch,), ("n",), "int64")), loss="cross_entropy",
                     description=f"{IN_SITU_LAYERS} layers of {IN_SITU_WIDTH} (linear, {1 + busy} tanh), batch {batch}"
                                 + (", on ranks 0 and 1 in turn" if one_way else ""))
    graph = import_spec(spec)
    if one_way:
        strategy = Strategy.from_mapping(graph, {op.name: ParallelConfig((1,) * len(op.pardims), (k % 2,))
                                                 for k, op in enumerate(graph.ops)}, ONE_WAY_STRATEGY)
    else:
        strategy = named_strategy("model-parallel", graph, get_preset(f"local:{world}"))
    cfg = TrainConfig(model=spec.name, optimizer=OptimizerConfig("sgd", lr=0.01, momentum=0.9), log=False)
    return Job(cfg, spec, graph, strategy)


#: The in-situ workload's batch sizes (`_in_situ_rank`): messages of 1, 16, 64, 256 KiB and 1 MiB.
#: `IN_SITU_BATCH` is among them: its steps are the check of `fit_exchange_latency`.
IN_SITU_BATCHES = (2, IN_SITU_BATCH, 128, 512, 2048)
#: The functions of `trainer.redistribute` the runtime stages messages with, by `STAGING_PARTS`
#: index, and how the bytes of one call are counted: (args, result) -> bytes.
_STAGING_FUNCTIONS = (
    ("forward_sends", STAGING_PARTS.index("forward_send"), lambda a, out: _nbytes(out.values())),
    ("forward_inputs", STAGING_PARTS.index("forward_receive"), lambda a, out: _nbytes(a[2].values())),
    ("backward_sends", STAGING_PARTS.index("gradient_send"), lambda a, out: _nbytes(out.values())),
    ("backward_accumulate", STAGING_PARTS.index("gradient_receive"), lambda a, out: _nbytes(a[1].values())),
)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class InSituSteps:
    """The in-situ workload (`in_situ_job`) on this rank at each of `batches`, stepped one step at
    a time (`step`), every step instrumented as `_in_situ_rank` describes; `out` holds the
    timed steps' records per batch.  The runtime's functions are wrapped only inside `step`, so
    that other trainers in the same process (`trainer.accuracy._measure`) step unwrapped."""

    def __init__(self, rank: int, world: int, one_way: bool = False,
                 batches: Sequence[int] = IN_SITU_BATCHES):
        from . import runtime as rt_mod
        from .comm import ProcessGroups, RecvAhead
        from .session import Trainer
        self._rt, self._ahead = rt_mod, RecvAhead
        names = ["exchange_many", "wait_all"] + [name for name, _, _ in _STAGING_FUNCTIONS]
        self._inner = {name: getattr(rt_mod, name) for name in names}
        self._post = RecvAhead._post
        self._calls: list[tuple[float, float, int]] = []
        self._acc = [[0.0, 0, 0] for _ in STAGING_PARTS]
        self._posting = [0.0, 0]
        self._waiting = [0.0, 0]
        self.trainers = {batch: Trainer(in_situ_job(world, batch, one_way), rank, world, ProcessGroups())
                         for batch in batches}
        self.out: dict[int, dict[str, list]] = {batch: {"times": [], "calls": [], "staging": [], "posting": [],
                                                        "send_waits": []} for batch in batches}

    def _timed_post(self, ahead, through=-1):
        before = sum(map(len, ahead._posted.values()))
        t0 = time.perf_counter()
        self._post(ahead, through)
        self._posting[0] += time.perf_counter() - t0
        self._posting[1] += sum(map(len, ahead._posted.values())) - before

    def _timed_wait_all(self, pending):
        sends = len(pending)
        t0 = time.perf_counter()
        self._inner["wait_all"](pending)
        self._waiting[0] += time.perf_counter() - t0
        self._waiting[1] += sends

    def _exchange(self, sends, recvs, device, pending, ahead=None):
        t0 = time.perf_counter()
        got = self._inner["exchange_many"](sends, recvs, device, pending, ahead)
        self._calls.append((t0, time.perf_counter(), _nbytes(got.values())))
        return got

    def _staged(self, name: str, part: int, count: Callable):
        fn = self._inner[name]

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            seconds = time.perf_counter() - t0
            nbytes = count(args, out)
            if nbytes:
                a = self._acc[part]
                a[0] += seconds
                a[1] += nbytes
                a[2] += 1
            return out
        return wrapper

    def step(self, batch: int, s: int, timed: bool = True) -> None:
        """Step `batch`'s trainer (its step `s`) from a barrier of all ranks, and record the step
        in `out` when `timed`."""
        self._calls.clear()
        for a in self._acc:
            a[:] = [0.0, 0, 0]
        self._posting[:] = [0.0, 0]
        self._waiting[:] = [0.0, 0]
        with contextlib.ExitStack() as patches:
            patches.enter_context(_patched(self._rt, "exchange_many", self._exchange))
            # a plain function on the class, so that a `RecvAhead` calls it as its method
            patches.enter_context(_patched(self._ahead, "_post", lambda ahead, through=-1: self._timed_post(ahead,
                                                                                                          through)))
            patches.enter_context(_patched(self._rt, "wait_all", self._timed_wait_all))
            for name, part, count in _STAGING_FUNCTIONS:
                patches.enter_context(_patched(self._rt, name, self._staged(name, part, count)))
            dist.barrier()
            t0 = time.perf_counter()
            self.trainers[batch].train_step(s)
            seconds = time.perf_counter() - t0
        if timed:
            rows = self.out[batch]
            rows["times"].append(seconds)
            rows["calls"].append(list(self._calls))
            rows["staging"].append([tuple(a) for a in self._acc])
            rows["posting"].append(tuple(self._posting))
            rows["send_waits"].append(tuple(self._waiting))


def _in_situ_rank(rank: int, world: int, cfg: "Settings", one_way: bool = False) -> dict[int, dict[str, list]]:
    """The in-situ workload (`in_situ_job`) at each of `IN_SITU_BATCHES` on this rank; per batch,
    per timed step: its seconds (``times``); every `exchange_many` call, when it was entered and
    when it returned (``time.perf_counter``, one system-wide clock on one machine) and how many
    bytes it received (``calls``); (seconds, bytes, calls) of each `STAGING_PARTS` part, calls
    that staged no byte not counted (``staging``); (seconds, receives) the runtime spent
    posting receives ahead (`trainer.comm.RecvAhead`, ``posting``); and (seconds, sends) it spent
    waiting for the step's send requests as the step ends (`trainer.comm.wait_all`, ``send_waits``)."""
    steps = InSituSteps(rank, world, one_way)
    # The batches' steps in turn (`_interleaved`, stage 6 of the module docstring).
    for s, batch in _interleaved(IN_SITU_BATCHES, cfg.warmup_steps + cfg.in_situ_steps):
        steps.step(batch, s, timed=s >= cfg.warmup_steps)
    return steps.out


def _per_item(per_rank: list[dict[int, dict[str, list]]], column: str) -> tuple[float, int]:
    """(seconds, items) summed over `column`'s (seconds, items) pairs of every timed step of the
    in-situ workload (`_in_situ_rank`) on every rank."""
    seconds = items = 0
    for rows in per_rank:
        for row in rows.values():
            for t, n in row.get(column, ()):
                seconds += t
                items += n
    return seconds, items


def receive_posting(per_rank: list[dict[int, dict[str, list]]]) -> tuple[float, dict]:
    """Seconds per receive the runtime spends posting receives ahead (`trainer.comm.RecvAhead`:
    a buffer and an ``irecv`` each, mostly as a step begins), over every timed step of the
    in-situ workload on every rank: the mean, since a step pays the slow posts too."""
    seconds, receives = _per_item(per_rank, "posting")
    if not receives:
        raise ValueError("the in-situ workload posted no receive ahead")
    return seconds / receives, {"receives": receives, "seconds": seconds, "per_receive_s": seconds / receives}


def send_waits(per_rank: list[dict[int, dict[str, list]]]) -> tuple[float, dict]:
    """Seconds per send request the runtime spends waiting for a step's sends as the step ends
    (`trainer.comm.wait_all`: the requests stay pending until then, so that their buffers live),
    over every timed step of the in-situ workload on every rank: the mean, as for posting.  A
    gloo request completes only inside its ``wait()``, so each costs a call however long ago its
    bytes left: 14-16 us per send in rnnlm's and a user's tagger's steps (0.8-0.9 ms a step for
    the 54-56 sends of a random rnnlm plan; AMD EPYC VM, 2026-11-30), which the simulator did not
    charge (docs/simulation.md, "Thirty-ninth round")."""
    seconds, sends = _per_item(per_rank, "send_waits")
    if not sends:
        raise ValueError("the in-situ workload left no send request to wait for at a step's end")
    return seconds / sends, {"sends": sends, "seconds": seconds, "per_send_s": seconds / sends}


def staging_curves(per_rank: list[dict[int, dict[str, list]]]) -> tuple[tuple[Curve, ...], dict]:
    """One `Curve` per `STAGING_PARTS` part from `_in_situ_rank`'s results: seconds per call (the
    median over steps, the mean over ranks) at each batch's bytes per call, made monotone.  A call
    stages one message here (every op of the chain exchanges with the one other rank), and a
    smaller message costs what the smallest measured one does: placing 1 KiB took 45 us, most of
    it fixed."""
    curves, details = [], {}
    for part, name in enumerate(STAGING_PARTS):
        points = []
        for batch in sorted(per_rank[0]):
            per_call, sizes = [], []
            for r in per_rank:
                rows = [step[part] for step in r[batch]["staging"] if step[part][2]]
                if rows:
                    per_call.append(statistics.median(t / c for t, _, c in rows))
                    sizes.append(statistics.median(b / c for _, b, c in rows))
            if per_call:
                points.append((statistics.fmean(sizes), statistics.fmean(per_call)))
        if not points:
            raise ValueError(f"the in-situ workload staged no {name.replace('_', ' ')} message")
        curve = Curve.fit(points)
        curves.append(curve)
        details[name] = {"per_call_s": [[b, t] for b, t in points], "curve": curve.to_json()}
    return tuple(curves), details


def message_latencies(per_rank: list[dict[str, list]]) -> tuple[list[float], float]:
    """Latencies of the in-situ workload's messages, and the bytes of one message.

    Every rank makes the same exchange calls in the same order (every op of the chain exchanges
    its input among all ranks), so call k of one rank meets call k of the others.  A message to
    rank r can arrive once every rank has entered the call; its latency is how long after the
    last of them r's call returned.  Raises `ValueError` when the ranks' calls do not pair up."""
    samples: list[float] = []
    sizes: list[float] = []
    world = len(per_rank)
    steps = [r["calls"] for r in per_rank]
    if len({len(s) for s in steps}) != 1:
        raise ValueError("the ranks timed different numbers of steps")
    for step in zip(*steps):
        if len({len(c) for c in step}) != 1:
            raise ValueError(f"the ranks made {sorted(len(c) for c in step)} exchange calls in one step")
        for k in range(len(step[0])):
            posted = max(c[k][0] for c in step)
            for c in step:
                if c[k][2]:          # a call that only sends waits for nothing
                    samples.append(max(0.0, c[k][1] - posted))
                    sizes.append(c[k][2] / max(1, world - 1))
    if not samples:
        raise ValueError("the in-situ workload made no exchange")
    return samples, statistics.median(sizes)


def spread(xs: Sequence[float]) -> float:
    """The variance of the Gaussian with the interquartile range of `xs` (``(IQR / 1.349)^2``); 0
    for fewer than two values.  The latencies' variances in the arrival noise are measured this
    way: their tails (stalls of 2-3 ms) are already in the mean latencies the simulator adds, and
    a Gaussian with their variance overprices the typical wait.  (The same holds of a model's
    own arrivals: given each exchange's measured arrivals, the tagger's model-parallel steps
    waited 5.6 ms a step, the two ranks together, beyond the waits between mean arrivals;
    Gaussians with the arrivals' variances say 8.3 ms, with their interquartile ranges' 4.6 ms.)"""
    if len(xs) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return ((q3 - q1) / 1.349) ** 2


def arrival_noise(runs: list[dict[int, dict[str, list]]],
                  one_way: list[dict[int, dict[str, list]]]) -> tuple[float, Curve, Curve, dict]:
    """How ranks' arrivals at an exchange vary, from the in-situ workloads' runs (per rank, per
    batch; `_in_situ_rank`): ``(jitter, latency_var, leave_var, details)`` for
    `RuntimeCalibration`.

    In the two-way chain (`runs`) ranks 0 and 1 make the same exchange calls in the same order.
    Only the calls in which both ranks receive bytes are two-way exchanges: the chain's ops whose
    input is already where it is needed call `exchange_many` with nothing to move and return at
    once, and in a call that moves bytes one way the sender does not wait for the receiver.  For
    each two-way exchange k after a step's first, D is the moment rank 1 entered it less the moment
    rank 0 did, X the same for leaving the exchange before it, and T the seconds both ranks ran
    between the two.  (Taking every call as an exchange made X of a call that moved nothing the
    offset the ranks had drifted to, and put ``leave_var`` at 0.1-0.5 ms (sd) where the exchanges'
    own was 0.01-0.1 ms; calibration method 8.)  Across steps, D varies more than X by what the
    ranks' programs added in between: ``jitter`` is the sum of those variances' differences over the
    sum of T (seconds squared per second of a program; 0 where the differences sum below 0).
    ``leave_var`` is X's variance at each batch's message size (the mean over the calls),
    ``latency_var`` the variance of the one-way chain's latencies (`one_way`, `one_way_latencies`)
    at each of its sizes; both made monotone.  All three are the interquartile ranges' variances
    (`spread`).  The latencies' tails are in the mean two-way latencies already (and the one-way
    curve's medians leave them out on purpose: module doc, stage 6).  D's tails are stalls of a
    rank's program, the longest of them (30-100 ms, a few a minute on a 2-vCPU KVM guest) where the
    hypervisor took the CPUs: a stall that hits a step in fifty leaves the median step that
    `autopar train` and the accuracy benchmark report alone, while D's plain variance let a few of
    them set the rate (262-932 us (sd) per ms run over eleven benchmark runs' calibrations,
    interquartile ranges 42-104 over six runs of the chain alone; calibration method 16,
    docs/simulation.md, "Forty-ninth round").  The chain's two-way exchanges are 0.6-13 ms of each
    rank's run apart, from its smallest batch to its largest."""
    extra = spent = 0.0
    leave, per_batch = [], []
    for batch in sorted(runs[0]):
        steps = [r[batch]["calls"] for r in runs[:2]]
        enter, left, ran = defaultdict(list), defaultdict(list), defaultdict(list)
        for a, b in zip(*steps):
            moved = [k for k in range(min(len(a), len(b))) if a[k][2] and b[k][2]]
            for p, k in zip(moved, moved[1:]):
                enter[k].append(b[k][0] - a[k][0])
                left[k].append(b[p][1] - a[p][1])
                ran[k].append(a[k][0] - a[p][1] + b[k][0] - b[p][1])
        calls = [k for k in enter if len(enter[k]) > 1]
        y = sum(spread(enter[k]) - spread(left[k]) for k in calls)
        t = sum(statistics.fmean(ran[k]) for k in calls)
        extra, spent = extra + y, spent + t
        _, size = message_latencies([r[batch] for r in runs])
        x = statistics.fmean(spread(left[k]) for k in calls) if calls else 0.0
        leave.append((size, x))
        per_batch.append({"batch": batch, "message_bytes": size, "leave_sd_s": x ** 0.5,
                          "between_s": t / max(1, len(calls)), "jitter": y / t if t > 0 else 0.0})
    latency = []
    for batch in sorted(one_way[0]):
        samples, size = one_way_latencies([r[batch] for r in one_way])
        latency.append((size, spread(samples)))
    jitter = max(0.0, extra / spent) if spent > 0 else 0.0
    details = {"jitter": jitter, "per_batch": per_batch,
               "one_way_latency_sd_s": [[size, var ** 0.5] for size, var in latency]}
    return jitter, Curve.fit(latency), Curve.fit(leave), details


def one_way_latencies(per_rank: list[dict[str, list]]) -> tuple[list[float], float]:
    """Latencies of the one-way in-situ workload's messages (`in_situ_job` with ``one_way``), and
    the bytes of one message: ranks 0 and 1 make the same exchange calls in the same order, and in
    each either one of them receives or neither does; a message's latency runs from the moment
    its sender entered the call to the moment its receiver's call returned.  Raises `ValueError`
    when the calls do not pair up."""
    return _one_way_pairs(per_rank, lambda recv, send: recv[1] - send[0])


def send_calls(per_rank: list[dict[str, list]]) -> tuple[list[float], float]:
    """The sender's own calls of the one-way in-situ workload's messages, from entering to
    returning (gloo's ``isend`` and the call around it; the message leaves meanwhile), and the
    bytes of one message; paired as `one_way_latencies` pairs them."""
    return _one_way_pairs(per_rank, lambda recv, send: send[1] - send[0])


def _one_way_pairs(per_rank: list[dict[str, list]], seconds: Callable) -> tuple[list[float], float]:
    """``seconds(receiver's call, sender's call)`` of every one-way message of the one-way
    workload, and the bytes of one message (`one_way_latencies`)."""
    samples: list[float] = []
    sizes: list[float] = []
    steps = [r["calls"] for r in per_rank[:2]]
    if len(steps) < 2 or len({len(s) for s in steps}) != 1:
        raise ValueError("the one-way workload needs ranks 0 and 1 timing the same number of steps")
    for a, b in zip(*steps):
        if len(a) != len(b):
            raise ValueError(f"ranks 0 and 1 made {len(a)} and {len(b)} exchange calls in one step")
        for ca, cb in zip(a, b):
            for recv, send in ((ca, cb), (cb, ca)):
                if recv[2] and not send[2]:
                    samples.append(max(0.0, seconds(recv, send)))
                    sizes.append(recv[2])
    if not samples:
        raise ValueError("the one-way workload sent no message")
    return samples, statistics.median(sizes)


def in_step_curve(runs: list[dict[int, dict[str, list]]], latencies: Callable,
                  shape: Curve | None, stat: str = "mean_s") -> tuple[Curve, list[dict]]:
    """A latency curve from an in-situ workload's runs (per rank, per batch): the mean of
    `latencies` (`message_latencies`, `one_way_latencies` or `send_calls`) at each batch's message
    size (`stat` ``"median_s"``: the median), made monotone, and beyond the largest the `shape`
    curve shifted to meet it (the tail belongs to the latency, not to the bytes; without a shape,
    the line through the last two sizes).  Also the statistics per size."""
    if stat not in ("mean_s", "median_s"):
        raise ValueError(f"an in-step latency curve follows the mean_s or the median_s per size, not {stat!r}")
    per_size = []
    for batch in sorted(runs[0]):
        samples, size = latencies([r[batch] for r in runs])
        st = _stats(samples)
        per_size.append({"batch": batch, "message_bytes": size, "messages": len(samples), "mean_s": st["mean"],
                         "median_s": st["median"], "p90_s": st["p90"]})
    last = per_size[-1]
    points = [(p["message_bytes"], p[stat]) for p in per_size]
    if shape is not None:
        shift = last[stat] - shape(last["message_bytes"])
        points += [(x, max(0.0, y + shift)) for x, y in shape.points if x > last["message_bytes"]]
    return Curve.fit(points), per_size


def in_step_messages(cal: RuntimeCalibration, in_situ: list[dict[int, dict[str, list]]],
                     one_way: list[dict[int, dict[str, list]]],
                     wire: Curve | None = None) -> tuple[RuntimeCalibration, dict[str, Any]]:
    """`cal` with all that the in-situ workloads' runs measure (`_in_situ_rank`, per rank, per
    batch: `in_situ` of the two-way chain, `one_way` of the one-way one) in place of its own:
    the staging (`staging_curves`), the posting of receives (`receive_posting`), the waits for
    sends (`send_waits`), the arrival noise (`arrival_noise`) and the message latencies
    (`fit_exchange_latency`; beyond the largest size they follow `wire`, or else `cal`'s p2p
    curve).  Also the details, by the names `calibrate` keeps them under (``in_situ``: the
    latencies per size).  `calibrate` runs them in processes of their own; the accuracy benchmark
    also between the blocks of a model's steps (`trainer.accuracy._measure`)."""
    staging, staged = staging_curves(in_situ)
    post_s, posted = receive_posting(in_situ)
    send_wait_s, waited = send_waits(in_situ)
    jitter, latency_var, leave_var, noise = arrival_noise(in_situ, one_way)
    cal = replace(cal, staging=staging, post_s=post_s, send_wait_s=send_wait_s, jitter=jitter,
                  latency_var=latency_var, leave_var=leave_var)
    cal, latencies = fit_exchange_latency(cal, in_situ, wire=wire, one_way=one_way)
    return cal, {"staging": staged, "posting": posted, "send_waits": waited, "arrival_noise": noise,
                 "in_situ": latencies}


def fit_exchange_latency(cal: RuntimeCalibration, in_situ: list[dict[int, dict[str, list]]],
                         wire: Curve | None = None,
                         one_way: list[dict[int, dict[str, list]]] | None = None) -> tuple[RuntimeCalibration, dict]:
    """`cal` with its point-to-point curve set to what messages take inside real steps.

    The microbenchmark times one message at a time; inside a step, messages leave ranks that are
    busy with other ops, and their threads wait for a core on a loaded machine (on this machine a
    message between idle ranks takes 120-190 us, one inside a step 0.3-1.4 ms, with a heavy tail).
    So the trainer runs a model-parallel chain (`in_situ_job`, `_in_situ_rank`: the ranks'
    results are `in_situ`) at several batch sizes, and every message's latency is measured where
    it happens (`message_latencies`: from the moment both ranks are in the exchange to the moment
    the receiver has the data).  At each size, their mean -- the simulator adds latencies, so the
    tail counts in full -- is a point of the curve; the curve is made monotone, and beyond the
    largest size it follows the microbenchmark's `wire` curve (the median wait per size; without
    it, the microbenchmark's mean curve), shifted to meet the last point.  The one-way
    workload's curve (``p2p_oneway``) is built the same way from its median latencies (module
    doc, stage 6), and ``send_call`` from its senders' own calls.  Inside steps the bytes cost
    more than between idle ranks too: on this machine 1 MiB took 0.83 ms (median) in the chain
    and 0.33 ms in the microbenchmark.

    The curves' statistics per size are the details (``per_size``, and ``one_way`` where
    measured); `exchange_latency_check` adds the check `calibrate` keeps beside them."""
    shape = wire if wire is not None else cal.p2p
    p2p, per_size = in_step_curve(in_situ, message_latencies, shape)
    tuned = replace(cal, p2p=p2p)
    latencies: dict[str, Any] = {"batches": list(IN_SITU_BATCHES), "per_size": per_size}
    if one_way is not None:     # ``p2p_oneway``, from the one-way workload's runs, at the median
        oneway, one_way_sizes = in_step_curve(one_way, one_way_latencies, shape, "median_s")
        # and the sender's own call (``send_call``), which grows with the bytes past the last size
        sending, send_sizes = in_step_curve(one_way, send_calls, None, "median_s")
        tuned = replace(tuned, p2p_oneway=oneway, send_call=sending)
        latencies["one_way"] = {"strategy": ONE_WAY_STRATEGY, "per_size": one_way_sizes,
                                "send_call_per_size": send_sizes}
    return tuned, latencies


def exchange_latency_check(tuned: RuntimeCalibration, microbenchmark: RuntimeCalibration, world: int,
                           cfg: "Settings", in_situ: list[dict[int, dict[str, list]]],
                           latencies: dict[str, Any]) -> dict[str, Any]:
    """`latencies` (`fit_exchange_latency`'s details) with a check beside them: the step time the
    simulator predicts for the two-way workload at `IN_SITU_BATCH` with the `tuned` calibration
    (its ops profiled as `autopar profile` does) and with the `microbenchmark`'s message curves,
    and the measured one.  A measurement, not a fit: an earlier version chose the latency that
    made that prediction equal to the measured step; it absorbed every error of the ops' profile
    into the latency, which moved from 0.08 to 1.3 ms between calibrations of the same machine."""
    from autopar.planner.cost import CostModel, ProfileCache, kind_of, profile_ops
    from autopar.planner.hardware import get_preset
    from autopar.planner.sim import TaskGraphBuilder, simulate_strategy

    job = in_situ_job(world)
    check = [r[IN_SITU_BATCH] for r in in_situ]
    steps = [max(ts) for ts in zip(*(r["times"] for r in check))]
    graph, strategy = job.graph, job.strategy
    topology = get_preset(f"local:{world}")
    cache = ProfileCache()
    choices = [(op.name, strategy[op.name].degrees) for op in graph.ops]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profile_ops(graph, choices, torch.device("cpu"), cache, repeats=cfg.profile_repeats, warmup=5,
                    device_kind=kind_of(topology.devices[0]), module=job.spec.module)
    finally:
        torch.set_num_threads(threads)
    cost = CostModel(cache).bind(graph)

    def predicted(c: RuntimeCalibration) -> float:
        return simulate_strategy(TaskGraphBuilder(graph, topology, cost, "sgd", runtime=c), strategy)[0].step_time

    untuned = replace(tuned, p2p=microbenchmark.p2p, p2p_oneway=microbenchmark.p2p_oneway,
                      send_call=microbenchmark.send_call)
    at = next(p for p in latencies["per_size"] if p["batch"] == IN_SITU_BATCH)
    return {"workload": job.spec.description, "strategy": strategy.name, **latencies,
            "measured_step_s": statistics.median(steps), "steps": len(steps),
            "messages": at["messages"], "message_bytes": at["message_bytes"], "latency_mean_s": at["mean_s"],
            "latency_median_s": at["median_s"], "latency_p90_s": at["p90_s"],
            "microbenchmark_s": microbenchmark.p2p(at["message_bytes"]), "predicted_step_s": predicted(tuned),
            "predicted_at_microbenchmark_s": predicted(untuned)}


def summary(cal: RuntimeCalibration) -> dict[str, Any]:
    """The numbers `autopar profile` prints: p2p at 4 B and 1 MiB (and one way at 1 MiB, with its
    sender's own call at 64 KiB where measured), all-reduce at 1 MiB among all ranks, the
    overheads (microseconds; ``bwd_call_us``: an unfused op's own backward call; posting a
    receive; waiting for a send as the step ends; issuing a 4 MiB all-reduce), the optimizer
    coefficients, the staging of a 1 MiB message, zeroing 16 MiB of gradient buckets (four
    tensors), and the arrival noise (the standard deviation ``jitter`` gives a program over 1 ms,
    and those of the noise curves at 64 KiB; None where not measured)."""
    us = 1e6
    return {"world": cal.world, "source": cal.source,
            "p2p_4B_us": cal.p2p(4) * us, "p2p_1MiB_us": cal.p2p(1 << 20) * us,
            "p2p_oneway_1MiB_us": cal.message_time(1 << 20, two_way=False) * us,
            "send_call_64KiB_us": cal.send_call(64 << 10) * us if cal.send_call is not None else None,
            "allreduce_1MiB_us": cal.allreduce_time(1 << 20, cal.world) * us,
            "fwd_task_us": cal.fwd_task_s * us, "bwd_task_us": cal.bwd_task_s * us, "bwd_call_us": cal.bwd_call_s * us,
            "exchange_us": cal.exchange_s * us, "post_us": cal.post_s * us,
            "send_wait_us": cal.send_wait_s * us,
            "allreduce_issue_4MiB_us": cal.issue_time(4 << 20) * us,
            "optimizer": {name: {"tensor_us": t * us, "MiB_us": b * (1 << 20) * us}
                          for name, t, b in cal.optimizer},
            "staging_1MiB_us": {name: cal.staging_time(k, 1 << 20) * us for k, name in enumerate(STAGING_PARTS)}
                               if cal.staging else None,
            "draw_1Mi_elements_us": {name: (t + e * (1 << 20)) * us for name, t, e in cal.draw} or None,
            "zero_16MiB_us": cal.zero_time(4, 16 << 20) * us if cal.zero is not None else None,
            "arrival_noise": ({"jitter_sd_1ms_us": (cal.jitter * 1e-3) ** 0.5 * us,
                               "oneway_latency_sd_64KiB_us": (cal.latency_var(64 << 10) ** 0.5 * us
                                                              if cal.latency_var is not None else None),
                               "leave_sd_64KiB_us": (cal.leave_var(64 << 10) ** 0.5 * us
                                                     if cal.leave_var is not None else None)}
                              if cal.measures_arrival_noise else None),
            "not_measured": list(dict(cal.details).get("not_measured", [])),
            "date": dict(cal.details).get("date")}


def summary_line(cal: RuntimeCalibration) -> str:
    """One line of `summary` for people.  What a calibration could not measure (one rank has no peer
    for messages or all-reduces) is said to be not measured rather than printed as its default."""
    s = summary(cal)
    missing = set(s["not_measured"])
    opt = ", ".join(f"{name} {t * 1e6:.0f} us/tensor + {b * (1 << 20) * 1e6:.0f} us/MiB"
                    for name, t, b in cal.optimizer)
    comm = ("p2p and all-reduce not measured (one rank: no peer)" if {"p2p", "allreduce"} <= missing else
            f"p2p {s['p2p_4B_us']:.0f} us at 4 B, {s['p2p_1MiB_us']:.0f} us at 1 MiB "
            f"({s['p2p_oneway_1MiB_us']:.0f} us one way"
            + (f", its sender's call {s['send_call_64KiB_us']:.0f} us at 64 KiB" if s["send_call_64KiB_us"] else "")
            + f"); all-reduce {s['allreduce_1MiB_us']:.0f} us at 1 MiB ({max(2, cal.world)} ranks)")
    exchange = "exchange not measured" if "exchange_s" in missing else f"exchange {s['exchange_us']:.0f} us"
    return (f"{comm}; overheads fwd "
            f"{s['fwd_task_us']:.0f} us, bwd {s['bwd_task_us']:.0f} us per task (+{s['bwd_call_us']:.0f} us per own "
            f"backward call), {exchange}, {s['post_us']:.0f} us per receive posted, "
            f"{s['send_wait_us']:.0f} us per send waited for, "
            f"{s['allreduce_issue_4MiB_us']:.0f} us to issue a 4 MiB all-reduce; "
            f"optimizer {opt}"
            + ("; staging of 1 MiB " + ", ".join(f"{name.replace('_', ' ')} {v:.0f} us"
                                                   for name, v in s["staging_1MiB_us"].items())
               if s["staging_1MiB_us"] else "")
            + ("; drawing a batch of 1 Mi elements " + ", ".join(f"{name} {v:.0f} us"
                                                                for name, v in s["draw_1Mi_elements_us"].items())
               if s["draw_1Mi_elements_us"] else "")
            + (f"; zeroing 16 MiB of gradient buckets {s['zero_16MiB_us']:.0f} us" if s["zero_16MiB_us"] else "")
            + (_noise_words(s["arrival_noise"]) if s["arrival_noise"] else ""))


def _noise_words(noise: dict[str, Any]) -> str:
    words = [f"a rank's arrival drifts {noise['jitter_sd_1ms_us']:.0f} us (sd) per ms it runs"]
    if noise["oneway_latency_sd_64KiB_us"] is not None:
        words.append(f"one-way latency sd {noise['oneway_latency_sd_64KiB_us']:.0f} us at 64 KiB")
    if noise["leave_sd_64KiB_us"] is not None:
        words.append(f"ranks leaving an exchange {noise['leave_sd_64KiB_us']:.0f} us apart (sd) at 64 KiB")
    return "; arrival noise: " + ", ".join(words)
