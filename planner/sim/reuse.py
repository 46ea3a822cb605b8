"""How much of an op's data the shared cache still holds when a step runs it.

A profile times each op task over and over on the same tensors.  `autopar profile` leaves the
core's own L2 cold before every call, so the task finds its data in the last-level cache, where
its previous call left it: a *warm* price.  On the CPU it profiles every task again with the
last-level cache evicted: a *cold* price, the data from memory.  (The accuracy benchmark's
diagnosis has done that since the twelfth round.)  A real step lies in between,
and where depends on the plan: between two uses of an op's weights, or between the forward pass
that saved an activation and the backward pass that reads it, both ranks touch other tensors, and
on the 2-vCPU AMD VM the 32 MiB last-level cache they share (with other guests) holds what was
used a few MiB of other data ago and not what was used a whole step ago (docs/simulation.md,
"Twenty-eighth round": the benchmark's profile with the last-level cache evicted put alexnet's,
the tagger's and the transformer's rows within a few per cent on average over ten kept runs, where
the L2 profile had them 4-13 % fast, and rnnlm's, whose cells reuse their weights every few
hundred microseconds, up to 35 % slow).

This module prices each compute task between its two profiles by that reuse.  Mattson et al.'s
stack distance ("Evaluation techniques for storage hierarchies", 1970) gives, for each read, the
distinct bytes touched since the tensor's last use; here it is counted over both ranks' tensors in
the order the simulated step touches them, since the ranks share the cache:

* a task reads its inputs and its parameter shards when it starts, and a backward task also the
  gradient of its outputs; a forward task writes its outputs when it ends, a backward task its
  parameters' gradients and the gradients of the inputs it passes gradients to; the optimizer
  step reads and writes every parameter its rank holds, its gradient and its momentum;
* an input that arrives from another rank, and an output's gradient, are fresh: the runtime
  wrote them just before (they count as held);
* a write is an access too: the core fetches a line before it writes to it (write-allocate).  A
  step writes each activation and each gradient into the block the allocator gave the same
  tensor a step before (every step allocates in the same order), so a write's stack distance is
  that of the tensor's last touch in the step before.  A GELU over 2 MiB here took 0.13 ms
  writing into a block it had just used, 0.25 ms writing into one a 96 MiB stream had evicted
  (its input held both times), and 0.18 ms as the profile times it (2026-11-29, "Twenty-ninth
  round" in docs/simulation.md);
* the step repeats, so a tensor first read in a step was last touched in the step before: the
  distances are taken over two steps back to back, the second one's accesses.

An access whose stack distance is ``D`` finds its tensor in the cache with probability
``exp(-D / C)``, ``C`` the last-level cache's size (a cache that replaces at random, as a
victim cache shared with other tenants roughly does); a task's cold share ``f`` is the
byte-weighted miss probability of its reads and writes, and its time ``warm + f (cold - warm)``,
separately for the forward and the backward task: the cold profile has every line of the task's
inputs, parameters and outputs come from memory.

A task that a rank runs right after the same task (the same task key, on the same parameters, in
the same direction) starts from a third price, measured back to back: `autopar profile` follows
every timed call with calls of the same task with nothing evicted in between
(`planner.cost.measure_task`, `CostModel.hot_cost`).  Under data or model parallelism rnnlm's
ranks run their eight unrolled cells, then their eight decoders, one after another on the same
weights, and those calls take 0.6-0.8 of the warm price after the first (in its data-parallel
steps of 2026-11-29 the decoders' forward took 1.12, 0.87, 0.67, 0.57, 0.56, 0.59, 0.54 and 0.54 ms
in turn against 1.05 ms warm); a random plan's, whose consecutive tasks change split, rank or
weights, do not (docs/simulation.md, "Thirty-third round").  Such a task costs
``hot + f (cold - warm)``.

A task that its rank runs right after another of its own op tasks pays no cold share
(`after_own_op`).  What the profile with the last-level cache evicted adds is mostly not its
data coming from memory: a linear layer of 256 tokens from 128 to 512 features touches 0.9 MiB
and took 0.77 ms warm, 1.93 ms cold, where a pass over 0.9 MiB from memory takes 0.13-0.17 ms on
the AMD VM (the accuracy benchmark's speed probe).  The eviction takes the op's code and the
runtime's with it, and a rank that goes from one of its ops to the next keeps those, and the data
it just used, in the cache.  The transformer under data parallelism, traced in its own steps
(`autopar train --trace`, 2026-11-30, docs/simulation.md "Thirty-seventh round"): its 24 forward
op tasks took 19.6 ms a step against 21.1 warm and 18.0 back to back, 20 of them at or below
their warm time and the others 0.1-0.2 of the way to their cold time, where their cold shares
(0.24-0.77) had priced them at 27.1 ms.  A task after the runtime's exchange work (packing,
posting a receive, unpacking: gloo's threads and the kernel's socket code run on the same core)
or after an all-reduce's issue starts as cold as its share says: rnnlm's cells in its random
plans, most of them after an exchange, take 1.5-2x their warm time in its steps.

It needs a first simulation, for the order of the touches, and a second with the repriced tasks;
the search's own simulations (MCMC, delta simulation) keep the warm profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..cost import CostModel, Estimate
from ..cost.profile_cache import key_of_shapes, task_shapes
from ..ir.graph import DTYPE_BYTES
from ..ir.strategy import Strategy
from .simulator import TaskGraph, Timeline
from .taskgraph import OPTIMIZER_STATES
from .trainer_model import _FLOAT, is_strided_copy, optimizer_step, requires_grad

__all__ = ["CacheShares", "InCacheCost", "access_misses", "after_own_op", "applies", "back_to_back", "cache_shares",
           "in_cache_builder"]


@dataclass(frozen=True)
class CacheShares:
    """Per (op name, device id): the cold share of its forward and of its backward task."""

    shares: Mapping[tuple[str, int], tuple[float, float]]
    capacity: int

    def of(self, op: str, device: int) -> tuple[float, float]:
        return self.shares.get((op, device), (0.0, 0.0))


class _Fenwick:
    """Prefix sums over touch positions (the bytes of the tensors whose last touch is there)."""

    def __init__(self, n: int):
        self.t = [0.0] * (n + 1)

    def add(self, i: int, v: float) -> None:
        i += 1
        while i < len(self.t):
            self.t[i] += v
            i += i & -i

    def prefix(self, i: int) -> float:
        """Sum over positions < i."""
        s = 0.0
        while i > 0:
            s += self.t[i]
            i -= i & -i
        return s


def _nbytes(shape, dtype: str) -> float:
    return float(math.prod(shape) * DTYPE_BYTES.get(dtype, 4))


Touch = tuple[float, int, tuple, float, "tuple | None"]


def _touches(builder, strategy: Strategy, tg: TaskGraph, tl: Timeline) -> list[Touch]:
    """Every touch of the step: (time, order, tensor, bytes, task), `task` (op name, 0 forward or
    1 backward, device) for an access a task pays for, a read or a write, and None for one no op
    task pays for (the optimizer's).  A tensor ``("fresh", task)`` is what `task` reads right
    after the runtime wrote it (an input received from another rank, an output's gradient)."""
    g = builder.graph
    n = len(g.ops)
    grads = requires_grad(g)
    out: list = []
    held: dict[int, dict[str, float]] = {}
    for d in range(builder.num_devices):
        for key, s, e in tl.spans(d):
            info = tg.task(key)
            if info.kind not in ("forward", "backward") or len(key) != 4 or key[2] != 0:
                continue
            fwd = info.kind == "forward"
            i = key[1] if fwd else n - key[1]
            op = g.ops[i]
            cfg = strategy[op.name]
            ins, outs, pars = task_shapes(op, cfg.degrees, builder._in_shapes[op.name])
            who = (op.name, 0 if fwd else 1, d)
            for j, ref in enumerate(op.inputs):
                spec = g[ref.op].outputs[ref.index]
                here = d in strategy[ref.op].devices
                # an input received from another rank was unpacked just before: fresh
                nbytes = _nbytes(ins[j], spec.dtype)
                out.append((s, len(out), ("a", ref.op, ref.index, d), nbytes, who if here else None))
                if not here:
                    out.append((s, len(out), ("fresh", who), nbytes, who))
            for j, p in enumerate(op.params):
                b = _nbytes(pars[j], p.dtype)
                out.append((s, len(out), ("p", p.name, d), b, who))
                mine = held.setdefault(d, {})
                mine[p.name] = max(mine.get(p.name, 0.0), b)
                if not fwd:
                    out.append((e, len(out), ("g", p.name, d), b, who))
            if fwd:
                for k, o in enumerate(outs):
                    out.append((e, len(out), ("a", op.name, k, d), _nbytes(o, op.outputs[k].dtype), who))
                continue
            for k, o in enumerate(outs):         # the gradient of its outputs: just computed
                out.append((s, len(out), ("fresh", who), _nbytes(o, op.outputs[k].dtype), who))
            for j, ref in enumerate(op.inputs):  # the gradients it passes back, into last step's blocks
                spec = g[ref.op].outputs[ref.index]
                if grads[g.index[ref.op]] and spec.dtype in _FLOAT:
                    out.append((e, len(out), ("da", ref.op, ref.index, d), _nbytes(ins[j], spec.dtype), who))
    # the parameter, its gradient and the optimizer's states (`OPTIMIZER_STATES`: sgd's momentum)
    kinds = ("p", "g") + tuple(f"s{k}" for k in range(OPTIMIZER_STATES.get(builder.optimizer, 0)))
    for d, params in held.items():
        k = optimizer_step(d)
        if k not in tl.start:
            continue
        s = tl.start[k]
        for name, b in params.items():
            for kind in kinds:
                out.append((s, len(out), (kind, name, d), b, None))
    return out


def cache_shares(builder, strategy: Strategy, tg: TaskGraph, tl: Timeline, capacity: int) -> CacheShares:
    """Each compute task's cold share on the simulated step `tl` of `strategy` (module docstring),
    with a shared cache of `capacity` bytes; none for a task its rank runs right after one of its
    own op tasks (`after_own_op`)."""
    missed = access_misses(_touches(builder, strategy, tg, tl), tl.makespan, capacity)
    warm = after_own_op(builder, tg, tl)
    shares: dict[tuple[str, int], list[float]] = {}
    for (name, phase, d), (miss, total) in missed.items():
        cold = miss / total if total and (name, phase, d) not in warm else 0.0
        shares.setdefault((name, d), [0.0, 0.0])[phase] = cold
    return CacheShares({k: (v[0], v[1]) for k, v in shares.items()}, capacity)


def _op_task(builder, tg: TaskGraph, key) -> tuple[str, int] | None:
    """(op name, 0 forward or 1 backward) of an op's own compute task, None for any other task."""
    info = tg.task(key)
    if info.kind not in ("forward", "backward") or len(key) != 4 or key[2] != 0:
        return None
    fwd = info.kind == "forward"
    return builder.graph.ops[key[1] if fwd else len(builder.graph.ops) - key[1]].name, 0 if fwd else 1


def after_own_op(builder, tg: TaskGraph, tl: Timeline) -> frozenset[tuple[str, int, int]]:
    """(op name, 0 forward or 1 backward, device) of every op task that its device runs right after
    another of its op tasks: the span before it on that device (in `tl`) is an op's compute, not
    the runtime's exchange work (packing, posting a receive, unpacking) or an all-reduce's issue
    (module docstring).  A strided input's copy between them (`trainer_model.strided_copy`), one
    small torch op on data the rank just wrote, does not count as exchange work."""
    out = set()
    for d in range(builder.num_devices):
        before = None
        for key, _, _ in tl.spans(d):
            if is_strided_copy(key):
                continue
            this = _op_task(builder, tg, key)
            if this is not None and before is not None:
                out.add((*this, d))
            before = this
    return frozenset(out)


def access_misses(touches, period: float, capacity: float) -> dict[tuple, tuple[float, float]]:
    """Per task, (expected bytes missed, bytes accessed) over one step in steady state.

    `touches`: (time, order, tensor, bytes, task) of one step, `task` None for an access no task
    pays for (see `_touches`); a tensor named ``("fresh", ...)`` is read where it was just written
    and always hits.  An access misses with probability ``1 - exp(-D / capacity)``, ``D`` the
    distinct bytes touched since the tensor's last touch (its stack distance), found with a
    Fenwick tree over the touches' positions holding each tensor's bytes at its last touch.  The
    step is laid twice end to end, `period` apart, and the second one's accesses are counted."""
    one = sorted(touches, key=lambda x: (x[0], x[1]))
    seq = one + [(t + period, o, tensor, b, who) for t, o, tensor, b, who in one]
    tree = _Fenwick(len(seq))
    last: dict[tuple, tuple[int, float]] = {}       # tensor -> (position of its last touch, its bytes there)
    acc: dict[tuple, list[float]] = {}
    for pos, (_, _, tensor, b, who) in enumerate(seq):
        fresh = tensor[0] == "fresh"
        prev = None if fresh else last.get(tensor)
        if who is not None and pos >= len(one):
            miss = 0.0
            if prev is not None:
                distance = tree.prefix(pos) - tree.prefix(prev[0] + 1)
                miss = 1.0 - math.exp(-distance / capacity)
            a = acc.setdefault(who, [0.0, 0.0])
            a[0] += b * miss
            a[1] += b
        if fresh:
            continue
        if prev is not None:
            tree.add(prev[0], -prev[1])
        tree.add(pos, b)
        last[tensor] = (pos, b)
    return {k: (v[0], v[1]) for k, v in acc.items()}


def back_to_back(builder, strategy: Strategy, tg: TaskGraph, tl: Timeline) -> frozenset[tuple[str, int, int]]:
    """(op name, 0 forward or 1 backward, device) of every op task that its device runs right after
    the same task: the op task before it on that device (in `tl`, whatever else ran in between)
    has the same task key (`planner.cost.profile_cache.task_key`), the same parameters and the
    same direction (module docstring)."""
    g = builder.graph
    out = set()
    for d in range(builder.num_devices):
        before = None
        for key, _, _ in tl.spans(d):
            task = _op_task(builder, tg, key)
            if task is None:
                continue
            op = g[task[0]]
            shapes = task_shapes(op, strategy[op.name].degrees, builder._in_shapes[op.name])
            this = (task[1], key_of_shapes(op, "", shapes), tuple(p.name for p in op.params))
            if this == before:
                out.add((*task, d))
            before = this
    return frozenset(out)


class InCacheCost(CostModel):
    """`warm`'s op times, each task priced between them and `warm.cold_cost` by its cold share, from
    `warm.hot_cost` instead of them where its device runs it right after the same task (`hot`, as
    `back_to_back` gives them)."""

    def __init__(self, warm: CostModel, shares: CacheShares, hot: frozenset[tuple[str, int, int]] = frozenset()):
        super().__init__(warm.cache, analytic=warm.analytic, cold=warm.cold)
        self.warm, self.shares, self.hot = warm, shares, hot

    def task_cost(self, op, degrees, device, input_shapes=None) -> Estimate:
        w = self.warm.task_cost(op, degrees, device, input_shapes)
        if w.source != "profile":
            return w
        c = self.warm.cold_cost(op, degrees, device, input_shapes)
        if c is None:
            return w
        ff, fb = self.shares.of(op.name, device.id)
        base_f, base_b = w.forward, w.backward
        if (op.name, 0, device.id) in self.hot or (op.name, 1, device.id) in self.hot:
            h = self.warm.hot_cost(op, degrees, device, input_shapes)
            if h is not None:
                base_f = h.forward if (op.name, 0, device.id) in self.hot else base_f
                base_b = h.backward if (op.name, 1, device.id) in self.hot else base_b
        return Estimate(base_f + ff * (c.forward - w.forward), base_b + fb * (c.backward - w.backward),
                        w.source, w.host)

    def update_time(self, param_bytes, device, optimizer=None) -> float:
        return self.warm.update_time(param_bytes, device, optimizer)

    def stats(self) -> dict[str, int]:
        return self.warm.stats()

    @property
    def unknown_kinds(self) -> frozenset[str]:
        return self.warm.unknown_kinds


def applies(builder) -> bool:
    """Whether `builder`'s steps are priced by what the shared cache holds: a CPU trainer whose
    calibration knows the shared cache (`RuntimeCalibration.shared_cache_bytes`), with op times
    measured cold too (`CostModel.has_cold`)."""
    rt = getattr(builder, "runtime", None)
    return (rt is not None and not rt.launches_async and bool(rt.shared_cache_bytes)
            and not isinstance(builder.cost, InCacheCost) and getattr(builder.cost, "has_cold", False))


def in_cache_builder(builder, strategy: Strategy, tg: TaskGraph, tl: Timeline):
    """A builder like `builder` whose op tasks are priced by what the shared cache holds in the
    step `tl` of `strategy` (module docstring), the timeline `builder` simulated (`applies`)."""
    shares = cache_shares(builder, strategy, tg, tl, builder.runtime.shared_cache_bytes)
    cost = InCacheCost(builder.cost, shares, back_to_back(builder, strategy, tg, tl)).bind(builder.graph)
    return type(builder)(builder.graph, builder.topology, cost, builder.optimizer, runtime=builder.runtime,
                            bucket_bytes=builder.bucket_bytes)
