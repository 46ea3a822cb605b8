"""FlexFlow's execution optimizer: Markov chain Monte Carlo over the SOAP space (FlexFlow sec. 6).

Cost.  The simulated step time of a strategy, from delta simulation: a `DeltaSession` holds the
current strategy's task graph and timeline, and a proposal re-times only what one op's new
configuration touches (sec. 5.3).  A strategy whose peak memory exceeds some device's capacity
is infeasible: its cost is inflated by the overflow (``cost = time * (1 + OVERFLOW_WEIGHT *
overflow / capacity)``) so a chain can walk out of an infeasible start, and it is never recorded
as the best.  Peak memory is kept incrementally (`_memtrack`).

Proposal (sec. 6.2).  Pick an op uniformly at random and replace its configuration by a random
one from the space: `SoapSpace` (FlexFlow's random configuration — random degrees on a random
aligned block of devices, as FlexFlow's implementation draws it — or a placement move of one
task; see `SoapSpace`) or `experts.PlacementSpace` (REINFORCE's placement-only space).
Placement moves are symmetric; a fresh random configuration is drawn independently of the
current one, with a probability that depends on its degrees, so like FlexFlow we accept with the
symmetric-proposal rule below and the chain is a search guided by eq. 1, not an exact sampler.

Acceptance (sec. 6.1, eq. 2, Metropolis–Hastings with a symmetric proposal): accept with
probability ``min(1, exp(beta * (cost_old - cost_new)))``.  ``beta`` is set per chain as
``beta_rel / cost(start)``: with the default ``beta_rel = 400`` a proposal 0.25% slower than
the start's step time is accepted with probability 1/e, 1% slower with 1.8%.  A warmer chain
(100) wanders off good starts within the short budgets a plan has: on LeNet it found the proven
optimum from data parallelism in 3 of 6 seeds in 10,000 proposals, at 400 in 5 of 6 in 6,000.

Stopping (sec. 6.2): when the chain's time budget is spent, or when it has not improved its best
strategy for half of the budget — and would leave at least ``min_handover_s`` of it (the planner
passes what a chain leaves to the next; a chain whose leftover nobody could use runs on).  The
best strategy seen is kept at every moment (anytime).

Layer moves (an extension).  In an unrolled RNN the steps of a layer share parameters, and a
change to one step alone rarely pays: the shared weights stay replicated as long as any step
keeps its old configuration.  So, when the picked op shares parameters with others of the same
shape, with probability `layer_move_prob` the random configuration is given to all of them at
once (FlexFlow's Figure 14 shows exactly such per-layer choices).  Such a move is not reversible
in one step when the steps had different configurations, so the chain no longer samples eq. 1
exactly; as a search it only adds moves.  The edits of a layer move are re-simulated together
(`DeltaSession.change_many`), one delta simulation per proposal.

Segment moves (an extension).  A configuration that pays off for a conv often pays off only
when the batch norm, ReLU and pool after it follow: changed alone, each op puts transfers on both
sides of itself and is rejected.  So with probability `segment_move_prob` the random
configuration goes to a random run of the op's segment (`segments_of`: ops that pass one tensor
along without branching and have the same dims).  On LeNet and four P100s the optimum that
exhaustive search proves is three ops away from data parallelism in a direction where each op
alone is slower; single-op proposals do not find it in 30 s, segment moves do.

Proposals too big to try (an extension).  A proposal whose task graph edit would build more
than `max_change_ratio` times the tasks of the chain's start (`_estimate.change_tasks`, before
anything is built), or more than could be built in what is left of the chain's time budget, is
rejected unbuilt and counted in `ChainResult.too_big`.  Such a proposal leaves the chain where a
rejected one would, so the sequence of proposals does not change; under a time budget the chain
may differ from an unbounded one where a skipped proposal would have been accepted.  At 64 GPUs a layer
move that splits all 40 steps of an LSTM 32 ways adds 10^5 transfers to a 25k-task graph and
took 10-20 s, a whole quick-bench budget several times over, for one rejected proposal.

Reproducibility: all randomness comes from the `random.Random` passed in, so the sequence of
proposals and decisions is a function of the seed; a time budget only decides how far along it a
chain gets.  ``max_proposals`` bounds a chain by count instead, which makes results identical run
to run.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import SimulationError, StrategyError
from ..ir.graph import Op, OperatorGraph
from ..ir.strategy import (ParallelConfig, Strategy, block_config, block_shift, check_config, placement_move,
                           random_config)
from ..sim.taskgraph import DeltaSession, TaskGraphBuilder
from ._estimate import change_tasks
from ._memtrack import MemoryTracker

DEFAULT_BETA_REL = 400.0
OVERFLOW_WEIGHT = 10.0
DEFAULT_LAYER_MOVE_PROB = 0.5
DEFAULT_SEGMENT_MOVE_PROB = 0.25
#: A proposal whose estimated new tasks exceed this many times the task graph a chain starts
#: with (at least 10,000) is rejected without being built or simulated.
MAX_CHANGE_RATIO = 2.0
#: A lower bound on the time to build one task (measured: 5-20 us): a proposal that could not be
#: built in what is left of the chain's budget at this rate is rejected unbuilt as well.
BUILD_SECONDS_PER_TASK = 2e-6


def layers_of(graph: OperatorGraph) -> dict[str, tuple[str, ...]]:
    """op -> the ops that share a parameter with it and have the same parallel dims (itself
    included); only ops with such partners appear."""
    parent = {op.name: op.name for op in graph.ops}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for users in graph.param_users.values():
        for u in users[1:]:
            if graph[u].pardims == graph[users[0]].pardims:
                parent[find(u)] = find(users[0])
    groups: dict[str, list[str]] = {}
    for op in graph.ops:
        groups.setdefault(find(op.name), []).append(op.name)
    return {m: tuple(g) for g in groups.values() if len(g) > 1 for m in g}


def segments_of(graph: OperatorGraph) -> dict[str, tuple[str, ...]]:
    """op -> its segment: the maximal run of ops, in graph order, that pass one tensor along
    without branching (each op's output feeds exactly the next op, which reads nothing else from
    other ops) and whose parallel dims have the same names — conv, batch norm, ReLU, pool in a
    CNN.  One configuration fits all of them (when the degrees divide their sizes), and then no
    transfer separates them.  Only ops in a segment of two or more appear."""
    consumers = graph.consumers
    nxt: dict[str, str] = {}
    has_prev: set[str] = set()
    for op in graph.ops:
        users = consumers.get(op.name, ())
        if len(users) != 1:
            continue
        c = graph[users[0][0]]
        producers = {t.op for t in c.inputs}
        if producers == {op.name} and [p.name for p in c.pardims] == [p.name for p in op.pardims] and op.pardims:
            nxt[op.name] = c.name
            has_prev.add(c.name)
    out: dict[str, tuple[str, ...]] = {}
    for op in graph.ops:
        if op.name in has_prev or op.name not in nxt:
            continue
        run = [op.name]
        while run[-1] in nxt:
            run.append(nxt[run[-1]])
        for m in run:
            out[m] = tuple(run)
    return out


def segment_move(graph: OperatorGraph, segment: tuple[str, ...], op_name: str, cfg: ParallelConfig,
                 num_devices: int, rng: random.Random) -> dict[str, ParallelConfig]:
    """`cfg` for a random run of `segment` around `op_name` (ends drawn uniformly on each side),
    cut short at the first op on either side whose dims the degrees do not divide."""
    pos = segment.index(op_name)
    lo, hi = rng.randint(0, pos), rng.randint(pos, len(segment) - 1)

    def fits(name: str) -> bool:
        try:
            check_config(graph[name], cfg, num_devices)
        except StrategyError:
            return False
        return True

    changes = {op_name: cfg}
    for k in range(pos - 1, lo - 1, -1):
        if not fits(segment[k]):
            break
        changes[segment[k]] = cfg
    for k in range(pos + 1, hi + 1):
        if not fits(segment[k]):
            break
        changes[segment[k]] = cfg
    return changes


class SoapSpace:
    """The whole SOAP space: any degrees, any distinct devices (FlexFlow sec. 4).

    A proposal is, with probability `move_prob`, a placement move of the op's current
    configuration (half the time one task to another device, `strategy.placement_move`, half the
    time all its tasks to another aligned block, `strategy.block_shift`; with a layer move the
    whole layer moves) and otherwise a FlexFlow random configuration
    (random degrees on a random aligned block of devices, `strategy.block_config`); together they
    reach every configuration.  Uniformly
    random placements (`uniform=True`, `strategy.random_config`) scatter
    an op's tasks over the machine: on 64 GPUs almost every proposal then sends its tensors
    across nodes and is rejected, after costing a simulation of ten thousand transfer tasks."""

    name = "soap"

    def __init__(self, num_devices: int, move_prob: float = 1 / 3, uniform: bool = False):
        self.num_devices = num_devices
        self.move_prob = move_prob
        self.uniform = uniform

    def random(self, op: Op, rng: random.Random, current: ParallelConfig | None = None) -> ParallelConfig:
        if self.uniform:
            return random_config(op, self.num_devices, rng)
        if current is not None:
            u = rng.random()
            if u < self.move_prob / 2:
                return placement_move(current, self.num_devices, rng)
            if u < self.move_prob:
                return block_shift(op, current, self.num_devices, rng)
        return block_config(op, self.num_devices, rng)


def accept(cost_old: float, cost_new: float, beta: float, rng: random.Random) -> bool:
    """Metropolis–Hastings acceptance for a symmetric proposal (FlexFlow eq. 2).

    Always draws one random number, so a chain's random stream does not depend on outcomes.
    """
    u = rng.random()
    if cost_new <= cost_old:
        return True
    return u < math.exp(beta * (cost_old - cost_new))


@dataclass
class ChainResult:
    """One chain's outcome.  `best` is None when the chain never saw a strategy that fits."""

    start: str
    space: str
    start_time: float            # simulated step time of the start (s)
    best: Strategy | None
    best_time: float             # simulated step time of `best` (inf if none)
    proposals: int = 0
    accepted: int = 0
    seconds: float = 0.0
    stopped: str = ""
    trace: list[tuple[float, float]] = field(default_factory=list)  # (wall seconds, best time) at each improvement
    simulator_errors: list[str] = field(default_factory=list)  # delta simulations that failed and were redone
    too_big: int = 0             # proposals rejected unbuilt: over MAX_CHANGE_RATIO x the start's tasks


def run_chain(builder: TaskGraphBuilder, start: Strategy, *, budget_s: float, rng: random.Random,
              space=None, beta_rel: float = DEFAULT_BETA_REL, max_proposals: int | None = None,
              layer_move_prob: float = DEFAULT_LAYER_MOVE_PROB,
              segment_move_prob: float = DEFAULT_SEGMENT_MOVE_PROB,
              max_change_ratio: float | None = MAX_CHANGE_RATIO,
              session: DeltaSession | None = None, memory: MemoryTracker | None = None,
              on_progress: Callable[[float, float], None] | None = None,
              min_handover_s: float = 0.0,
              clock: Callable[[], float] = time.perf_counter) -> ChainResult:
    """Run one Metropolis–Hastings chain from `start` (see the module docstring).

    A `session` and `memory` tracker already holding `start` (the planner's evaluation of it)
    are used as they are, saving a task-graph build.  The chain stops for going half its budget
    without improving only while at least `min_handover_s` of the budget is left."""
    t0 = clock()
    space = space if space is not None else SoapSpace(builder.num_devices)
    if session is None or session.strategy.configs != start.configs:
        session = DeltaSession(builder, start)
    if memory is None or memory.strategy.configs != start.configs:
        memory = MemoryTracker(builder, start)
    cap = min(memory.capacity)
    max_new_tasks = (max_change_ratio * max(session.sim.graph.placements(), 10_000)
                     if max_change_ratio else math.inf)
    ops = builder.graph.ops
    layers = layers_of(builder.graph) if layer_move_prob > 0 else {}
    segments = segments_of(builder.graph) if segment_move_prob > 0 else {}

    def cost_of(step: float) -> float:
        over = memory.overflow()
        return step if over == 0 else step * (1.0 + OVERFLOW_WEIGHT * over / cap)

    current = cost_of(session.step_time)
    fits = memory.fits()
    res = ChainResult(start.name, space.name, session.step_time,
                      start if fits else None, session.step_time if fits else math.inf)
    beta = beta_rel / max(current, 1e-12)
    last_improvement = 0.0
    last_report = -1.0
    if fits:
        res.trace.append((0.0, res.best_time))
    while True:
        elapsed = clock() - t0
        if max_proposals is not None:
            if res.proposals >= max_proposals:
                res.stopped = f"{max_proposals} proposals"
                break
        elif elapsed >= budget_s:
            res.stopped = "time budget spent"
            break
        elif elapsed - last_improvement >= budget_s / 2 and budget_s - elapsed >= min_handover_s:
            res.stopped = "no improvement for half the budget"
            break
        if on_progress is not None and elapsed - last_report >= 0.2:
            on_progress(elapsed, res.best_time)
            last_report = elapsed
        op = ops[rng.randrange(len(ops))]
        new_cfg = space.random(op, rng, session.strategy[op.name])
        members = layers.get(op.name)
        segment = segments.get(op.name)
        if members is not None and rng.random() < layer_move_prob:
            changes = {m: new_cfg for m in members}
        elif segment is not None and rng.random() < segment_move_prob:
            changes = segment_move(builder.graph, segment, op.name, new_cfg, builder.num_devices, rng)
        else:
            changes = {op.name: new_cfg}
        old = {m: session.strategy[m] for m in changes}
        res.proposals += 1
        if all(old[m] == c for m, c in changes.items()):
            rng.random()  # keep the random stream aligned with accept()
            continue
        limit = min(max_new_tasks, (budget_s - elapsed) / BUILD_SECONDS_PER_TASK)
        if limit < math.inf and change_tasks(builder, session.strategy, changes, limit) > limit:
            res.too_big += 1
            rng.random()
            continue
        edits = changes
        try:
            step = session.change_many(edits)
        except (SimulationError, StopIteration) as e:
            # Delta simulation failed on this edit: rebuild the timeline from scratch (counted,
            # and reported by the planner, so the failure is not hidden).
            res.simulator_errors.append(f"{type(e).__name__}: {e}"[:200])
            target = session.strategy
            for m, c in edits.items():
                target = target.with_config(m, c)
            session = DeltaSession(builder, target)
            step = session.step_time
        memory.change_many(edits)
        new = cost_of(step)
        if accept(current, new, beta, rng):
            res.accepted += 1
            current = new
            if memory.fits() and step < res.best_time:
                res.best_time = step
                res.best = session.strategy
                last_improvement = clock() - t0
                res.trace.append((last_improvement, step))
        else:
            # Rejected: taken back at once — a rollback of the session's last batch, which costs
            # neither a task-graph build nor a simulation.
            session.change_many(old)
            memory.rollback()
    res.seconds = clock() - t0
    if on_progress is not None:
        on_progress(res.seconds, res.best_time)
    return res
