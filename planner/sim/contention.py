"""How fast a rank's ops run depends on what the other ranks on its machine do meanwhile.

`autopar profile` times every task on the CPU twice (`planner.cost.profiler`): with every worker
running it at once, in lockstep, as the ranks of a data-parallel step run each op, and with the
other workers idle (the entry's ``solo`` times).  On the ranks' machine the two differ: the cores
share the last-level cache and the memory bandwidth, and rnnlm's tasks ran 1.16x as fast alone,
summed (docs/simulation.md, "Fifteenth round").  Which of the two a step's task sees depends on
the plan: in a pipelined plan one rank often computes while the other waits for its message
(sleeping in gloo), and its ops run at their solo speed.  In rnnlm's expert plan, whose ranks
take turns, the forward ops ran at 0.6-0.8 of their all-busy profile inside steps (their solo
profile says 0.87-0.88; warm caches make the rest: consecutive cells share their weights).

So each forward and backward task whose profile has both times runs at
``busy - (busy - solo) * (1 - f)``, with ``f`` the share of its span during which another rank of
the machine runs one of its own ops, an optimizer step or (where communication runs on the
ranks' cores) gloo's part of an all-reduce (`BUSY_KINDS`).  ``f`` is read off the simulated
timeline, and the step is simulated again with the new durations until they settle
(`planner.sim.settle`), as the waits are (`planner.sim.waits`): full and delta simulation stay
exact and identical, the search's inner loop ranks plans on all-busy times, and every step the
simulator reports for the trainer (`planner.sim.simulate_strategy`) includes the solo speed.
The share is linear in the time overlapped, which assumes a task's slowdown is spread evenly over
its span.  GPUs have a device each and are not modelled here.
"""

from __future__ import annotations

import bisect

#: Task kinds during which a rank keeps its core busy (the ops' own work, the optimizer step,
#: gloo's all-reduce parts on the ranks' cores).
BUSY_KINDS = frozenset({"forward", "backward", "update", "comm"})


def shares_cores(builder) -> bool:
    """Whether `builder` models the trainer's CPU ranks sharing one machine (`contention_deltas`
    applies where the profile has solo times)."""
    rt = getattr(builder, "runtime", None)
    return rt is not None and not rt.launches_async and builder.num_devices > 1


def solo_gains(b, strategy) -> dict[tuple, float]:
    """Per forward and backward task of `strategy` whose profile has solo times: the seconds its
    kernels take less with the other ranks idle than with all of them running (never negative)."""
    if not shares_cores(b):
        return {}
    n = b.num_ops
    devices = b.topology.devices
    gains: dict[tuple, float] = {}
    for i, op in enumerate(b.graph.ops):
        if not op.inputs:
            continue
        cfg = strategy[op.name]
        shapes = b._in_shapes[op.name]
        grad = b._requires_grad[i]
        for t, dev in enumerate(cfg.devices):
            est = b.cost.task_cost(op, cfg.degrees, devices[dev], shapes)
            if est.solo is None:
                continue
            if est.forward > est.solo[0]:
                gains[(0, i, 0, t)] = est.forward - est.solo[0]
            if grad and est.backward > est.solo[1]:
                gains[(1, n - i, 0, t)] = est.backward - est.solo[1]
    return gains


def _merged(spans: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The union of `spans` as sorted disjoint intervals (starts, ends)."""
    starts: list[float] = []
    ends: list[float] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if ends and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    return starts, ends


def _covered(starts: list[float], ends: list[float], s: float, e: float) -> float:
    """Seconds of [s, e] inside the disjoint intervals (`_merged`)."""
    k = max(0, bisect.bisect_right(starts, s) - 1)
    got = 0.0
    while k < len(starts) and starts[k] < e:
        got += max(0.0, min(e, ends[k]) - max(s, starts[k]))
        k += 1
    return got


def contention_deltas(b, tg, tl, gains: dict[tuple, float]) -> dict[tuple, float]:
    """Per task of `gains` (`solo_gains`): the seconds (negative) it runs faster than its all-busy
    time on timeline `tl` of task graph `tg`, ``-gain * (1 - f)`` with ``f`` the share of its span
    during which another rank is busy (`BUSY_KINDS`)."""
    if not gains:
        return {}
    busy: dict[int, list[tuple[float, float]]] = {}
    for d in range(b.num_devices):
        busy[d] = [(s, e) for key, s, e in tl.spans(d) if tg.task(key).kind in BUSY_KINDS]
    others = {d: _merged([span for q, spans in busy.items() if q != d for span in spans]) for d in busy}
    out: dict[tuple, float] = {}
    for key, gain in gains.items():
        if key not in tg:
            continue
        d = tg.task(key).resource
        s, e = tl.start[key], tl.end[key]
        if e <= s or d not in others:
            continue
        alone = 1.0 - _covered(*others[d], s, e) / (e - s)
        if alone > 0.0:
            out[key] = -gain * alone
    return out
