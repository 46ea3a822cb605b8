"""Execution simulation of a task graph: full (FlexFlow sec. 5.2, Algorithm 1) and delta
(sec. 5.3, Algorithm 2), pure and deterministic, with delta giving *exactly* full's timeline.

What is simulated
-----------------
A task has a unique key (a tuple of ints), a resource (a device or a link — links are the
paper's "communication devices") and a duration > 0; an edge ``a -> b`` says b cannot start
before a ends.  The timeline is the fixed point of

* ``ready(t) = max(end(p) for p in preds(t))``, 0 with no predecessors;
* every resource runs its tasks one at a time in FIFO order of ``(ready, key)`` — the key
  breaks ties — so ``start(t) = max(ready(t), end(previous task on t's resource))``;
* ``end(t) = start(t) + duration(t)``  (assumptions A1–A4 of sec. 5).

**Algorithm 1 computes exactly this.**  Tasks enter a heap ordered by ``(ready, key)`` once all
their predecessors have run.  A task pushed while `t` is processed has ``ready >= end(t) =
start(t) + duration(t) > start(t) >= ready(t)``: strictly later than `t`.  So the sequence of
popped ``(ready, key)`` is strictly increasing, every task is popped after everything with a
smaller ``(ready, key)``, and each resource receives its tasks sorted by ``(ready, key)`` — the
FIFO order above; ``d.last.endTime`` in line 13 is then the end of the previous task in that
order.  The fixed point is also *unique*: in any solution a predecessor has a strictly smaller
ready time (``ready(p) < end(p) <= ready(t)``) and a resource predecessor a smaller
``(ready, key)``, so if two solutions differed, the differing task with the smallest
``min(ready_A, ready_B), key`` would have identical inputs in both — a contradiction.  Uniqueness
is what lets a cleverer algorithm promise bit-identical times: any method that produces a fixed
point produces *the* fixed point, computed with the same floating-point operations.  All this
needs ``start + duration > start`` in floating point; `check_resolution` verifies it
(durations at least ``ulp(makespan)``).

Delta simulation
----------------
Algorithm 2 re-times only what an edit touches: it seeds an update queue with the modified
tasks and propagates new ready/start times to successors and to the next task on the device,
Bellman-Ford style, stopping where times do not change.  Its weak spot is line 19 ("swap t with
other tasks on the device to maintain FIFO"): a task whose ready time moves must be re-ordered
among tasks whose own times may still be stale.  We keep the idea — change flows along edges
and resources and stops where nothing changes — but order the work so that every task is
timed once, from final inputs, as Algorithm 1 would:

1. **Cut.**  ``C = min (ready, key)`` over the old times of every *seed* (old task with new
   inputs or a new duration) and removed task, lowered to ``(max end of preds, key)`` for every
   seed or new task whose predecessors all lie before C.  Every old task before C keeps its
   times: its inputs and resource predecessors lie before C too, and everything after C stays
   after C — a task with a predecessor after C is ready after that predecessor's ready time
   (``end > start >= ready``), and a task whose predecessors all lie before C is either an
   unmodified old task (ready as before, hence after C) or a seed or new task, which the
   lowering put after C.  Lowering only shrinks the prefix, which only removes such cases, so
   one pass over the seeds suffices.  Tasks that started before C but end after it are in the
   prefix; their end is what the replay's resources start from.
2. **Replay** Algorithm 1 from C, seeded with every resource's last end before C (a checkpoint
   vector every ~256 tasks plus a short scan).  Instead of pushing every later task through the
   heap, the replay walks the *old* order as a stream beside a heap of *pending* tasks (the
   update queue): a task nobody touched still has final, unchanged inputs when the stream reaches
   it, so it is ready exactly when it was and is timed right there, merged in ``(ready, key)``
   order; only tasks downstream of a change (a changed end, a new or moved input) become
   pending, count their unfinished inputs and go through the heap.  This is Algorithm 2's
   pruning, with line 19 replaced by the merge.
3. **Convergence.**  The replay stops when the new simulation's state equals the old one's at the
   same point P of ``(ready, key)``: both have finished the same tasks (``sym == 0``), every
   resource's last end agrees (``mism == 0``), no finished task with a different end has an
   unfinished successor (``pend == 0``) and every seed, new and removed task is behind
   (``left == 0``).  Then everything after P is the old timeline, unchanged, by determinism.
4. **Commit** the re-timed tasks, splice the order, shift later checkpoints.

The replay is Algorithm 1 restricted to the tasks after C with the same tie-break, so each time
is the same floating-point expression as in a full simulation; the tests check bit equality
(`Timeline.same_as` with ``tol=0``) on random graphs and random edit batches.

Cost: a change early in a training step shifts everything after it, and no exact method with
absolute float times can avoid re-timing those tasks; delta then costs about a replay of the
suffix.  Changes that do not propagate (slack absorbs them, or other devices are unaffected)
cost only the touched tasks.  Delta's large win over a rebuild comes from editing one op's tasks
instead of rebuilding the task graph (`planner.taskgraph.DeltaSession`).
"""

from __future__ import annotations

from itertools import repeat

from ._delta import delta_pass
from ._replay import checkpoints, full_pass
from ._taskstore import TaskGraph, TaskInfo
from ._timeline import Timeline, _Data

__all__ = ["TaskGraph", "TaskInfo", "Timeline", "simulate", "DeltaSimulator"]

#: A replay re-times a task at about 1.35x the cost of a full simulation per task (its
#: bookkeeping outweighs what pulling inputs saves), so when more than this fraction of the
#: graph lies after the cut, it only goes on while it has re-timed at most _REPLAY_BUDGET of the
#: graph (and at least _REPLAY_MIN tasks) — enough to find a change absorbed nearby — and a full
#: simulation takes over.
_REPLAY_FRACTION = 0.7
_REPLAY_BUDGET = 0.1
_REPLAY_MIN = 256


def simulate(graph: TaskGraph) -> Timeline:
    """Algorithm 1: time `graph` from scratch.  The timeline is a snapshot (later edits of the
    graph do not affect it)."""
    rdy, st, en, _, seq, last = full_pass(graph)
    data = _Data(dict(graph._id), list(graph._key), list(graph._res), list(graph._dur), rdy, st, en, seq)
    return Timeline._of(data, max(last, default=0.0))


class DeltaSimulator:
    """A task graph with its timeline, re-timed incrementally after each batch of edits.

    Edit through the simulator (same signatures as `TaskGraph`), then call `resimulate()`.  The
    graph passed in becomes the simulator's; editing it directly still works but costs a full
    simulation at the next `resimulate()`.
    """

    def __init__(self, graph: TaskGraph):
        self._g = graph
        graph._hold = True  # removed tasks stay readable until the replay has passed them
        self._seeds: set[int] = set()
        self._new: set[int] = set()
        self._removed: list[int] = []
        self._seen = graph._version      # version after our last tracked edit
        self._done = -1                  # version the current timeline belongs to
        self._untracked = False
        self.epoch = 0
        # delta_pass marks seeds, new and removed tasks with the epoch, and keeps per task the
        # list of tasks that watch it (None when none).
        self.sm: list[int] = []
        self.watch: list = []
        self._broken = False             # a failed delta pass left partial times behind
        self.stats: dict = {}
        self._full()

    # -- edits -------------------------------------------------------------------------------
    @property
    def graph(self) -> TaskGraph:
        return self._g

    def __len__(self) -> int:
        return len(self._g)

    def __contains__(self, key) -> bool:
        return key in self._g

    def _track(self) -> None:
        if self._g._version != self._seen:
            self._untracked = True  # someone edited the graph behind our back

    def add_task(self, key, resource: int, duration: float, kind: str = "compute",
                 nbytes: float = 0.0, label: str = "") -> None:
        self._track()
        self._new.add(self._g._add(key, resource, duration, kind, nbytes, label))
        self._seen = self._g._version

    def remove_task(self, key) -> None:
        self._track()
        g = self._g
        i = g._ix(key)
        succ = list(g._succ[i])
        g._remove(i)
        if i in self._new:
            self._new.discard(i)
        else:
            self._removed.append(i)
            self._seeds.discard(i)
        new = self._new
        self._seeds.update(s for s in succ if s not in new)
        self._seen = g._version

    def add_edge(self, src, dst) -> None:
        self._track()
        g = self._g
        b = g._ix(dst)
        if g._add_edge(g._ix(src), b) and b not in self._new:
            self._seeds.add(b)
        self._seen = g._version

    def remove_edge(self, src, dst) -> None:
        self._track()
        g = self._g
        b = g._ix(dst)
        g._remove_edge(g._ix(src), b)
        if b not in self._new:
            self._seeds.add(b)
        self._seen = g._version

    def set_duration(self, key, duration) -> None:
        self._track()
        g = self._g
        i = g._ix(key)
        if g._set_duration(i, duration) and i not in self._new:
            self._seeds.add(i)
        self._seen = g._version

    # -- simulation --------------------------------------------------------------------------
    def resimulate(self) -> Timeline:
        """Re-time after the edits since the last call; returns the current timeline (a view)."""
        g = self._g
        self._track()
        if g._version == self._done:
            return self.timeline()
        limit = _REPLAY_FRACTION * len(g)
        if self._untracked or self._broken or len(self._new) > limit:
            self._full()
            return self.timeline()
        self._grow()
        stats = delta_pass(g, self, self._seeds, self._new, self._removed, limit,
                           max(_REPLAY_MIN, _REPLAY_BUDGET * len(g)))
        if stats is None:
            self._full()
        else:
            self.stats = stats
            self._settle()
        return self.timeline()

    @property
    def makespan(self) -> float:
        if self._g._version != self._done:
            self.resimulate()
        return self._makespan

    def timeline(self) -> Timeline:
        """The current timeline, re-simulating pending edits first.  A cheap live view: it
        becomes unreadable after the next edit (`Timeline.detached()` keeps a copy)."""
        g = self._g
        if g._version != self._done:
            self.resimulate()
        data = _Data(g._id, g._key, g._res, g._dur, self.rdy, self.st, self.en, self.seq, owner=g)
        return Timeline._of(data, self._makespan)

    def _full(self) -> None:
        g = self._g
        rdy, st, en, bind, seq, last = full_pass(g)
        self.rdy, self.st, self.en, self.bind, self.seq = rdy, st, en, bind, seq
        sim = [False] * len(g._key)
        any(map(sim.__setitem__, g._id.values(), repeat(True)))
        self.sim = sim
        nres = len(g._rlist)
        self.every = max(256, 4 * nres)
        self.ck_pos, self.ck_vec = checkpoints(seq, en, g._rix, nres, self.every)
        self.final = last
        self._makespan = max(last, default=0.0)
        self._broken = False
        self.watch = [None] * len(self.watch)
        self._grow()
        self.stats = {"mode": "full", "tasks": len(g), "retimed": len(seq)}
        self._settle()

    def _settle(self) -> None:
        self._seeds.clear()
        self._new.clear()
        self._removed.clear()
        self._g._release_held()
        self._untracked = False
        self._done = self._seen = self._g._version

    def _grow(self) -> None:
        """Size the per-id lists to the graph's id capacity."""
        n = len(self._g._key) - len(self.rdy)
        if n > 0:
            z = [0.0] * n
            self.rdy += z
            self.st += z
            self.en += z
            self.bind += [-1] * n
            self.sim += [False] * n
        n = len(self._g._key) - len(self.sm)
        if n > 0:
            self.sm += [0] * n
            self.watch += [None] * n
