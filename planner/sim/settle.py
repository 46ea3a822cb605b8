"""A step whose task durations depend on its own timeline, simulated until they settle.

Two parts of the trainer's model read the simulated timeline to set durations: the mean of each
wait under the ranks' arrival noise (`planner.sim.waits`) and an op's speed with the other ranks
idle (`planner.sim.contention`).  Both are applied after Algorithm 1 rather than inside it, so that
full and delta simulation stay exact and identical: `settle` adds each part's seconds to the
durations the task graph was built with, simulates again, and repeats until no part moves by
more than `SETTLED_S` (at most `ROUNDS` times).
"""

from __future__ import annotations

from typing import Callable

from ._plans import MIN_TASK_SECONDS

#: At most this many times the adjustments are recomputed on the timeline they changed; it stops
#: once none moves by more than `SETTLED_S`.  Small models' steps settle in 4-6 rounds.
ROUNDS = 10
SETTLED_S = 1e-7


def settle(tg, tl, simulate: Callable, adjust: Callable) -> object:
    """The timeline of task graph `tg` with every task's duration its built duration plus what
    ``adjust(timeline)`` gives it (seconds by task key), recomputed on each new timeline
    (`simulate`: Algorithm 1) until it settles.  `tl` is the timeline of the durations as built;
    `tg` keeps the last durations applied."""
    base: dict[tuple, float] = {}
    last: dict[tuple, float] | None = None
    for _ in range(ROUNDS):
        extra = adjust(tl)
        if last is not None and extra.keys() == last.keys() and all(
                abs(e - last[k]) <= SETTLED_S for k, e in extra.items()):
            break
        if last is None and not extra:
            break
        for key in set(base) | set(extra):
            if key not in base:
                base[key] = tg.task(key).duration
            tg.set_duration(key, max(MIN_TASK_SECONDS, base[key] + extra.get(key, 0.0)))
        tl = simulate(tg)
        last = extra
    return tl
