"""A step split into the parts the simulator predicts (`planner.sim.STEP_PARTS`), measured.

The runtime times its phases in every step (`autopar.trainer.runtime.PHASES`: each op's forward
and backward spans, its exchanges, the wait for the gradients' all-reduces, the optimizer step).
Summed into the simulator's parts — compute, transfer, synchronization, optimizer, and overhead
(the rest of the step: the runtime's own work between the spans, drawing the batch, posting
receives) — they say which part of a prediction was off (`furthest_off`), in `autopar train`'s
summary and in every row of `autopar bench accuracy`.
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

#: The trainer's phases each measured part of a step sums; the overhead is the rest of the step.
PHASES_OF = {"compute": ("fwd", "bwd"), "transfer": ("exchange", "grad exchange"), "synchronization": ("sync",),
             "optimizer": ("optimizer step",)}

#: One rank's steps: (seconds, the runtime's phase seconds) per step.
RankSteps = Sequence[tuple[float, Mapping[str, float]]]


def rank_parts(steps: RankSteps) -> dict[str, float]:
    """One rank's parts: each the median over its steps of the phases it sums.  The overhead is
    the median over steps of the rest of each step (the step less its spans): the median step
    less the parts' medians would count the parts' spread as overhead, since the medians of
    skewed parts do not add up to the median of their sum (a user's tagger under model
    parallelism: 2.6-2.9 ms that way, 1.0-1.1 ms between the spans of its steps, 2026-11-27)."""
    if not steps:
        raise ValueError("rank_parts: no steps to split")
    out = {p: statistics.median(sum(ph[n] for n in names) for _, ph in steps) for p, names in PHASES_OF.items()}
    out["overhead"] = statistics.median(max(0.0, t - sum(ph[n] for names in PHASES_OF.values() for n in names))
                                        for t, ph in steps)
    return out


def measured_parts(per_rank: Sequence[RankSteps]) -> tuple[int, dict[str, float]]:
    """(rank, parts) of the rank with the most compute and optimizer time: the rule the simulated
    side picks its device by (`planner.sim.step_parts`), since the slowest rank of a pipeline is
    often the one that waits."""
    parts = dict(enumerate(rank_parts(r) for r in per_rank))
    rank = busiest_device(parts)
    return rank, parts[rank]


def busiest_device(per_device: Mapping[int, Mapping[str, float]]) -> int:
    """The device (or rank) with the most compute and optimizer time, of parts per device."""
    return max(per_device, key=lambda d: per_device[d]["compute"] + per_device[d]["optimizer"])


def simulate_parts(builder, strategy, barrier: bool = True) -> tuple[float, dict[str, float] | None, int]:
    """The simulated step of `strategy` (`builder`: a `planner.sim.TaskGraphBuilder`), its parts
    (`planner.sim.step_parts`) on its busiest device, and that device's simulated peak memory in
    bytes.  `barrier`: the measured steps each start at a barrier (`autopar bench accuracy`), so
    a rank's parts end with its own step; without one (`autopar train`), every rank ends its step
    in the all-reduce of the step's loss, which waits for the slowest rank and then lasts its
    calibrated time (`planner.sim.loss_allreduce_s`): the step is the makespan and that, as the
    search reports it.  Where the builder does not model the trainer (no runtime calibration, as
    for the paper's GPU topologies) there are no parts: None, and the largest device's peak."""
    from autopar.planner.sim import loss_allreduce_s, simulate_strategy, step_parts
    res, tl, tg = simulate_strategy(builder, strategy)
    if builder.runtime is None:
        return res.step_time, None, max(res.peak_memory.values(), default=0)
    per_device = step_parts(builder, tg, tl, barrier)
    dev = busiest_device(per_device)
    seconds = res.step_time + (0.0 if barrier else loss_allreduce_s(builder))
    return seconds, per_device[dev], res.peak_memory.get(dev, 0)


def furthest_off(simulated: Mapping[str, float], measured: Mapping[str, float]) -> str:
    """The part whose simulated seconds are furthest from the measured ones, e.g. ``"transfer
    under by 2.2 ms"``."""
    gaps = {k: simulated[k] - measured[k] for k in simulated}
    k = max(gaps, key=lambda p: abs(gaps[p]))
    return f"{k} {'over' if gaps[k] > 0 else 'under'} by {abs(gaps[k]) * 1e3:.1f} ms"
