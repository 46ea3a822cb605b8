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

A task may instead have *parts* — several resources, a duration on each (a transfer occupies
every link of its route): each part runs as a task of its own with the task's ready time and
key would, on its resource in that FIFO order; the task starts with its first part to start
and ends with its last part to end.  That is exactly k single-resource tasks keyed
``key + (h,)`` with the task's inputs and outputs (ready together, adjacent in ``(ready, key)``
order, so each resource sees them where it would see the parts), in one task instead of k:
every argument below holds part by part, and a change that re-routes 10^4 transfers over
8-link routes edits 10^4 tasks, not 8 * 10^4.

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
2. **Replay** Algorithm 1 from C — same heap order ``(ready, key)``, same floating-point
   expressions — seeded with every resource's last end before C (a checkpoint vector every few
   hundred tasks plus a short scan).  Tasks become ready by *pulling* rather than by being
   pushed: each waits on the input that finished last in the old timeline (``bind``, recorded by
   both algorithms) and, when that one is done, reads all its inputs at once; an input still
   unfinished sends it to wait on that one (`planner.sim._delta`).  This is Algorithm 2's update
   queue without its line 19 ("swap t with other tasks on the device to maintain FIFO"): the
   heap puts every re-timed task in its FIFO place the way Algorithm 1 does.
3. **Convergence**, Algorithm 2's "stop where times do not change", made exact.  Walking the old
   order alongside, the replay stops at a point P of ``(ready, key)`` where the new simulation's
   state is the old one's: the same tasks done, every seed and new task done and every removed
   one passed, no task with a moved end still has a successor to run, and every resource has the
   same last end — or no old task left to run.  Everything after P then runs exactly as before:
   Algorithm 1's future depends only on that state.  The test runs only after a stretch of
   re-timed tasks that kept their ends, and backs off after each failure, so it costs little.
4. **Commit**: splice the re-timed order into the old one, shift later checkpoints.

Why the replay's times are bit-identical to a full simulation's: they satisfy the fixed point
(prefix by step 1, the rest by Algorithm 1's argument), which is unique.  The tests check
`Timeline.same_as` with ``tol=0`` on random graphs and random edit batches.

Cost, and where each step runs
------------------------------
A change early in a training step usually moves everything after it (in the zoo's task graphs
85-95 % of the tasks after one random op change, many of them re-ordered on their device or
link), and with absolute floating-point times no exact method avoids re-timing them.  So the
steps above run compiled (`_fastpass.resume_pass_arrays`, some 20x cheaper per task than this
module's Python replay): the cut, the state at the cut, Algorithm 1 from there and the
convergence test, the old order kept from the stop on.  The Python replay (`planner.sim._delta`)
runs only for a late or local change — at most 5 % of the graph after the cut — where setting
up the compiled pass (a few scans of the edge pool) would cost more.  (Without the compiled pass
— keys it cannot compare, or ``AUTOPAR_PURE_PYTHON=1`` — the replay runs in full when at most
70 % of the graph lies after the cut, otherwise on a budget of 10 % before a Python full pass
takes over: it costs about 1.35x a full pass per task.)  Either way the graph is edited, not
rebuilt.

A search rejects most proposals and takes them back.  `DeltaSimulator` keeps the timeline from
before the last batch, and the graph journals its edits: `rollback()` undoes the last batch from
the journal (every task back under its old id) and brings the kept timeline back, with no build
and no simulation.  Without a rollback, a batch that exactly inverts the previous one is
recognized — every task a batch touches is recorded, resource, duration and neighbours, before
and after, or the caller vouches for it (`resimulate(restores=True)`) — and brings that timeline
back too (a re-added task gets its old id back, so the kept lists still fit); a batch with no net
effect keeps the current one.  All are exact: the graph is then identical to one whose timeline
is known.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from itertools import compress, filterfalse, repeat
from operator import is_not

from ..errors import SimulationError
from . import _bulk, _delta
from ._batches import Batch, undoes
from ._delta import delta_pass
from ._layout import MAX_PARTS
from ._replay import check_resolution, compact_edges, compaction_due, compiled, resume_pass, row, timed_pass
from ._taskstore import TaskGraph, TaskInfo
from ._timeline import Timeline, _Data

__all__ = ["TaskGraph", "TaskInfo", "Timeline", "simulate", "DeltaSimulator"]

#: Without the compiled pass: a replay re-times a task at about 1.35x the cost of a full
#: simulation per task (its bookkeeping outweighs what pulling inputs saves), so when more than
#: this fraction of the graph lies after the cut, it only goes on while it has re-timed at most
#: _REPLAY_BUDGET of the graph (and at least _REPLAY_MIN tasks) — enough to find a change
#: absorbed nearby — and a full simulation takes over.
_REPLAY_FRACTION = 0.7
_REPLAY_BUDGET = 0.1
_REPLAY_MIN = 256
#: With the compiled pass (`_fastpass`, some 20x cheaper per task than the Python replay) the
#: Python replay runs only when at most this fraction of the graph lies after the cut — a late
#: or local change, where setting up the compiled pass would cost more — and otherwise the
#: compiled pass re-times from the cut, up to where the timeline rejoins the old one.
_REPLAY_FRACTION_COMPILED = 0.05
#: Checkpoints of every resource's last end are kept every max(this, 4 * resources) tasks of the
#: order, so a re-timing finds the state at its cut with a short scan.
_CHECKPOINT_MIN = 256


def simulate(graph: TaskGraph) -> Timeline:
    """Algorithm 1: time `graph` from scratch.  The timeline is a snapshot (later edits of the
    graph do not affect it)."""
    rdy, st, en, _, seq, last, _, _, pen = timed_pass(graph)
    data = _Data(dict(graph._id), list(graph._key), list(graph._res), list(graph._dur), rdy, st, en, seq, pen=pen)
    return Timeline._of(data, max(last, default=0.0))


def _hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


class DeltaSimulator:
    """A task graph with its timeline, re-timed incrementally after each batch of edits.

    Edit through the simulator (same signatures as `TaskGraph`), then call `resimulate()`.  The
    graph passed in becomes the simulator's; editing it directly still works but costs a full
    simulation at the next `resimulate()`.  `stats` describes the last re-simulation: ``mode``
    ("delta", "full" with its ``reason``, "unchanged" or "undo"), ``retimed`` tasks, and for a
    delta the ``cut`` and ``stop`` positions in the global order and whether it ``converged``.

    Two batches cost no simulation at all, which matters to a search that rejects most of its
    proposals: a batch whose net effect is nothing (an op set to the configuration it has), and
    a batch that exactly undoes the previous one (a rejected proposal taken back) — the timeline
    before that batch is kept and comes back.  Both are recognized exactly (`planner.sim._batches`):
    every task a batch touches is compared, resource and duration, before and after, and every
    edge it adds or removes is counted, by keys.

    That recognition costs a little per edited edge.  A caller that knows when its batch restores
    the graph from before the previous batch — `DeltaSession`, whose task graph is a function of
    its strategy — passes ``track=False`` and says so with ``resimulate(restores=True)``; the
    simulator then only checks that every task came back under its old id and that the task and
    edge counts are those from before the previous batch.
    """

    def __init__(self, graph: TaskGraph, track: bool = True):
        self._g = graph
        self._tracking = track
        self._grave_hits = 0             # tasks of this batch that took back an id of the previous one
        self._counts = (len(graph), graph._nedges)  # tasks and edges when the last batch began
        graph._journal = []              # the graph records every edit, so a batch can be rolled back
        self._last_journal = None        # the edits of the last simulated batch
        self._compactions = graph._compactions
        graph._hold = True  # removed tasks stay readable until the replay has passed them
        self._seeds: set[int] = set()
        self._new: set[int] = set()
        self._removed: dict[int, None] = {}  # ordered set: re-adding a key takes its id out in O(1)
        self._batch = Batch()            # net effect of the edits since the last simulation
        self._revive: dict = {}          # key -> id of an old task removed in this batch
        self._grave: dict = {}           # the same for the previous batch: ids kept for an undo
        self._prev = None                # (lists, net effect) from before the last batch
        self._seen = graph._version      # version after our last tracked edit
        self._done = -1                  # version the current timeline belongs to
        self._untracked = False
        self._batches = 0
        self._misses = 0                 # budgeted replays in a row that ran out of budget
        self._epoch = 0
        # delta_pass marks seeds, new and removed tasks with the epoch.
        self._sm = array("q")
        self._broken = False             # a failed delta pass left partial times behind
        self._rdy = array("d")
        self._pen = array("d")           # part ends: MAX_PARTS slots per id (`_replay.timed_pass`)
        self.stats: dict = {}
        self._full()
        self._settle()

    # -- edits -------------------------------------------------------------------------------
    @property
    def graph(self) -> TaskGraph:
        return self._g

    def __len__(self) -> int:
        return len(self._g)

    def __contains__(self, key) -> bool:
        return key in self._g

    def _track(self) -> None:
        """Called first by every edit."""
        g = self._g
        if g._version != self._seen:
            self._untracked = True  # someone edited the graph behind our back
        elif g._version == self._done and compaction_due(g) and compiled(g):
            # The first edit of a batch: the last batch's journal, which names edge-pool
            # records, is no longer needed, so this is when dead records can go.
            compact_edges(g)
            self._compactions = g._compactions

    def add_task(self, key, resource: int, duration: float, kind: str = "compute",
                 nbytes: float = 0.0, label: str = "") -> None:
        self._track()
        g = self._g
        # A key removed in this batch or the previous one gets its id back when it stays on its
        # resource: a modified old task, or a task an undo brings back, keeps its place.
        i = self._revive.get(key, -1)
        j = self._grave.get(key, -1)
        at = -1
        if key not in g._id:
            if i >= 0 and g._res[i] == resource:
                at = i
            elif j >= 0 and g._res[j] == resource:
                at = j
        self._book_added(key, at, g._add(key, resource, duration, kind, nbytes, label, at))
        self._seen = g._version

    def _book_added(self, key, at: int, n: int) -> None:
        """Book task `n` just added under `key`, which took back id `at` (-1: none): a task of
        the last batch revived keeps its place; otherwise it is new to this batch."""
        if at >= 0 and self._revive.get(key, -1) == at:
            del self._revive[key]
            del self._g._held[at]
            del self._removed[at]
            self._seeds.add(at)
        else:
            if at >= 0:
                del self._grave[key]
                self._grave_hits += 1
            self._new.add(n)
        if self._tracking:
            self._batch.absent(key)

    def add_tasks(self, tasks) -> None:
        """`add_task` on each ``(key, resource, duration, kind, nbytes, label)`` in order, in one
        call (what the task-graph builder uses)."""
        self._track()
        g = self._g
        revive, grave = self._revive, self._grave
        if type(tasks) is not list:
            tasks = list(tasks)
        K = [t[0] for t in tasks]
        try:
            rv = list(map(revive.get, K))
            gv = list(map(grave.get, K))
        except TypeError:  # an unhashable key: `add_task` fails on it, after adding those before
            p = next((p for p, k in enumerate(K) if not _hashable(k)), None)
            if p is None:
                raise
            self.add_tasks(tasks[:p])
            revive.get(K[p], -1)
            raise
        ats = None
        m = len(K)
        if rv.count(None) < m or gv.count(None) < m:
            # Which id each task takes back, decided as `add_task` decides it: the tasks of one
            # batch cannot change the answer for each other (distinct keys map to distinct held
            # ids, and a repeated key fails before its id is used).
            ids, res = g._id, g._res
            ats = [-1] * m
            hit = set(compress(range(m), map(is_not, rv, repeat(None))))
            hit.update(compress(range(m), map(is_not, gv, repeat(None))))
            for p in hit:
                key, r = K[p], tasks[p][1]
                if key not in ids:
                    i, j = rv[p], gv[p]
                    if i is not None and res[i] == r:
                        ats[p] = i
                    elif j is not None and res[j] == r:
                        ats[p] = j
        out: list[int] = []
        try:
            _bulk.add_tasks(g, tasks, ats, out)
        finally:
            if ats is None:
                self._new.update(out)
                if self._tracking:
                    absent = self._batch.absent
                    for t, _ in zip(tasks, out):
                        absent(t[0])
            else:
                for t, at, n in zip(tasks, ats, out):
                    self._book_added(t[0], at, n)
            self._seen = g._version

    def add_edges(self, edges) -> None:
        """`add_edge` on each ``(src, dst)`` in order, in one call."""
        self._track()
        g = self._g
        A, B, bad = _bulk.resolve(g, edges)
        added: list[int] = []
        try:
            _bulk.add_edges(g, A, B, added)
        finally:
            if added:
                if self._tracking:
                    edges_, k = self._batch.edges, g._key
                    for n in added:
                        e = (k[A[n]], k[B[n]])
                        c = edges_.get(e, 0) + 1
                        if c:
                            edges_[e] = c
                        else:
                            del edges_[e]
                self._seeds.update(filterfalse(self._new.__contains__, map(B.__getitem__, added)))
            self._seen = g._version
        if bad is not None:
            _bulk.unknown(g, bad)

    def remove_task(self, key) -> None:
        self._track()
        g = self._g
        i = g._ix(key)
        succ = list(g._succ[i])
        if self._tracking:
            batch, k = self._batch, g._key
            batch.touch(g, i)
            for j in g._pred[i]:
                batch.edge(k[j], key, -1)
            for j in succ:
                batch.edge(key, k[j], -1)
        g._remove(i)
        if i in self._new:
            self._new.discard(i)
        else:
            self._removed[i] = None
            self._seeds.discard(i)
            self._revive[key] = i
        new = self._new
        self._seeds.update(s for s in succ if s not in new)
        self._seen = g._version

    def remove_tasks(self, keys) -> None:
        """`remove_task` on each key in order, in one call (what `DeltaSession` uses)."""
        if self._tracking:
            for key in keys:
                self.remove_task(key)
            return
        self._track()
        g = self._g
        ids, succs, remove = g._id, g._succ, g._remove
        new, removed, seeds, revive = self._new, self._removed, self._seeds, self._revive
        try:
            for key in keys:
                try:
                    i = ids[key]
                except (KeyError, TypeError):
                    i = g._ix(key)  # raises the error `remove_task` gives
                succ = succs[i]  # `_remove` gives the id a fresh set and leaves this one as it is
                remove(i)
                if i in new:
                    new.discard(i)
                else:
                    removed[i] = None
                    seeds.discard(i)
                    revive[key] = i
                seeds.update(filterfalse(new.__contains__, succ))
        finally:
            self._seen = g._version

    def add_edge(self, src, dst) -> None:
        self._track()
        g = self._g
        ids = g._id
        try:
            a, b = ids[src], ids[dst]
        except (KeyError, TypeError):
            a, b = g._ix(src), g._ix(dst)
        if g._add_edge(a, b):
            if self._tracking:
                edges = self._batch.edges
                e = (g._key[a], g._key[b])
                n = edges.get(e, 0) + 1
                if n:
                    edges[e] = n
                else:
                    del edges[e]
            if b not in self._new:
                self._seeds.add(b)
        self._seen = g._version

    def remove_edge(self, src, dst) -> None:
        self._track()
        g = self._g
        a, b = g._ix(src), g._ix(dst)
        g._remove_edge(a, b)
        if self._tracking:
            self._batch.edge(g._key[a], g._key[b], -1)
        if b not in self._new:
            self._seeds.add(b)
        self._seen = g._version

    def set_duration(self, key, duration) -> None:
        self._track()
        g = self._g
        i = g._ix(key)
        if self._tracking:
            self._batch.touch(g, i)
        if g._set_duration(i, duration) and i not in self._new:
            self._seeds.add(i)
        self._seen = g._version

    # -- simulation --------------------------------------------------------------------------
    def resimulate(self, restores: bool = False) -> Timeline:
        """Re-time after the edits since the last call; returns the current timeline (a view).

        ``restores=True`` (only without tracking): the caller vouches that the edits rebuilt the
        graph from before the previous batch, key for key, duration for duration, edge for edge."""
        g = self._g
        if g._version != self._seen:
            self._untracked = True
        if g._version == self._done:
            return self.timeline()
        if self._untracked or self._broken:
            self._prev = None
            self._full("graph edited directly" if self._untracked else "a previous pass failed")
            self._settle()
            return self.timeline()
        if not self._tracking:
            diff = None
            undo = restores and self._vouched_undo()
        else:
            diff = self._batch.net(g)
            undo = bool(diff[0] or diff[1]) and self._is_undo(diff)
        if diff is not None and not (diff[0] or diff[1]):
            self._prev = (self._state(), diff, self._counts)  # a rollback keeps this timeline
            self.stats = {"mode": "unchanged", "tasks": len(g), "retimed": 0}
        elif undo:
            state, self._prev = self._prev[0], (self._state(), diff, self._counts)
            self._restore(state)
            self.stats = {"mode": "undo", "tasks": len(g), "retimed": 0}
        else:
            self._step(diff)
        self._settle()
        return self.timeline()

    def _step(self, diff: tuple) -> None:
        g = self._g
        self._batches += 1
        fast = compiled(g) and _REPLAY_FRACTION < math.inf
        if fast:
            limit, budget = _REPLAY_FRACTION_COMPILED * len(g), 0
        else:
            limit = _REPLAY_FRACTION * len(g)
            budget = max(_REPLAY_MIN, _REPLAY_BUDGET * len(g))
        # A replay on a budget that keeps running out is skipped, save for every 16th batch.
        if self._misses >= 4 and self._batches % 16:
            budget = 0
        if len(self._new) > limit:
            prev = self._state()
            self._resume() if fast else self._full("mostly new tasks")
        else:
            prev = self._state(copy=True)  # the replay rewrites the lists in place
            self._grow()
            stats = delta_pass(g, self, self._seeds, self._new, self._removed, limit, budget)
            if stats is None:
                self._misses += self._broken  # broken: it ran, and the budget ran out
                if fast:
                    self._restore(prev)
                    prev = self._state(copy=True)
                    self._resume()
                else:
                    self._full("the change moves most of the step")
            else:
                if stats["budgeted"]:
                    self._misses = 0
                self.stats = stats
        self._prev = (prev, diff, self._counts)

    def _resume(self) -> None:
        """Re-time from the cut with the compiled pass (`_replay.resume_pass`), up to where the
        timeline rejoins the old one; the old timeline's lists stay as they are (`_prev` keeps
        them)."""
        g = self._g
        self._grow()
        mod = bytearray(len(g._key))
        any(map(mod.__setitem__, self._seeds, repeat(1)))
        any(map(mod.__setitem__, self._new, repeat(2)))
        any(map(mod.__setitem__, self._removed, repeat(3)))
        rdy, st, en, bind, pen = self._rdy[:], self._st[:], self._en[:], self._bind[:], self._pen[:]
        old = self._seq
        out = resume_pass(g, self._every, old, self._sim, mod, rdy, st, en, bind, self._rdy, self._en,
                          self._final, _delta.QUIET, pen, self._pen)
        if out is None:
            self._full("edits the simulator was not told of")
            return
        seq, cut, stop, last, olast, mid_pos, mid_vec = out
        converged = stop < len(old)
        pos, vecs = self._ck_pos, self._ck_vec
        lo = bisect_right(pos, cut)
        hi = bisect_left(pos, stop) if converged else len(pos)
        later = vecs[hi:]
        final = last
        if converged:
            # Resources with old tasks still to come end as before; the others where the pass
            # left them, in the final state and in the checkpoints after the stop (which held
            # their old last end).
            final = [f if f != b else a for a, b, f in zip(last, olast, self._final + [0.0] * len(last))]
            moved = [R for R, (a, b) in enumerate(zip(last, olast)) if a != b]
            if moved and later:
                later = [row(v, len(last)) for v in later]
                for v in later:
                    for R in moved:
                        v[R] = last[R]
        shift = len(seq) - len(old)
        self._ck_pos = pos[:lo] + mid_pos + [p + shift for p in pos[hi:]]
        self._ck_vec = vecs[:lo] + mid_vec + later
        self._rdy, self._st, self._en, self._bind, self._seq, self._pen = rdy, st, en, bind, seq, pen
        self._sim = bytearray(g._a_alive)
        self._final = final
        self._makespan = max(final, default=0.0)
        check_resolution(g, self._makespan)
        self._broken = False
        self.stats = {"mode": "delta", "tasks": len(g), "seeds": len(self._seeds), "new": len(self._new),
                      "removed": len(self._removed), "cut": cut, "stop": stop, "converged": converged,
                      "retimed": len(seq) - cut - (len(old) - stop), "budgeted": False, "compiled": True}

    def _is_undo(self, diff: tuple) -> bool:
        return self._prev is not None and undoes(self._g, diff, self._prev[1])

    def can_rollback(self) -> bool:
        """Can `rollback()` take back the last simulated batch?"""
        return (self._last_journal is not None and self._prev is not None
                and self._g._version == self._done and self._g._compactions == self._compactions)

    def rollback(self) -> Timeline:
        """Take back the last simulated batch: the graph's edits are undone from its journal
        (every task back under its old id) and the timeline from before the batch returns — no
        task-graph building, no simulation.  A search calls this for a rejected proposal."""
        if not self.can_rollback():
            raise SimulationError(
                "nothing to roll back: rollback() takes back the last simulated batch, once, and only "
                "before new edits (and not after the graph was edited behind the simulator's back)")
        g = self._g
        g._rollback(self._last_journal)
        g._free_dead()
        self._restore(self._prev[0])
        self._prev = self._last_journal = None
        self._grave, self._revive = {}, {}
        self._settle()
        self.stats = {"mode": "rollback", "tasks": len(g), "retimed": 0}
        return self.timeline()

    def _vouched_undo(self) -> bool:
        """The cheap checks behind ``resimulate(restores=True)``: every task added in this batch
        took back its id from the previous batch, and the counts are those from before it."""
        g = self._g
        return (self._prev is not None and len(self._new) == self._grave_hits
                and (len(g), g._nedges) == self._prev[2])

    _FIELDS = ("_rdy", "_st", "_en", "_bind", "_sim", "_seq", "_pen", "_ck_pos", "_ck_vec", "_final",
               "_makespan", "_every")

    def _state(self, copy: bool = False) -> tuple:
        vals = tuple(getattr(self, f) for f in self._FIELDS)
        return tuple(v[:] for v in vals[:7]) + vals[7:] if copy else vals

    def _restore(self, state: tuple) -> None:
        for f, v in zip(self._FIELDS, state):
            setattr(self, f, v)
        self._grow()

    @property
    def makespan(self) -> float:
        """Step time of the current timeline (re-simulating pending edits first)."""
        if self._g._version != self._done:
            self.resimulate()
        return self._makespan

    def timeline(self) -> Timeline:
        """The current timeline, re-simulating pending edits first.  A cheap live view: it
        becomes unreadable after the next edit (`Timeline.detached()` keeps a copy)."""
        g = self._g
        if g._version != self._done:
            self.resimulate()
        data = _Data(g._id, g._key, g._res, g._dur, self._rdy, self._st, self._en, self._seq, owner=g,
                     pen=self._pen)
        return Timeline._of(data, self._makespan)

    def _full(self, reason: str = "first simulation") -> None:
        g = self._g
        nres = len(g._rlist)
        self._every = max(_CHECKPOINT_MIN, 4 * nres)
        rdy, st, en, bind, seq, last, self._ck_pos, self._ck_vec, self._pen = timed_pass(g, self._every, compact=False)
        self._rdy, self._st, self._en, self._bind, self._seq = rdy, st, en, bind, seq
        self._sim = bytearray(g._a_alive)  # simulated: the tasks alive now
        self._final = last
        self._makespan = max(last, default=0.0)
        self._broken = False
        self._grow()
        self.stats = {"mode": "full", "reason": reason, "tasks": len(g), "retimed": len(seq)}

    def _settle(self) -> None:
        """The batch is simulated: forget it, keep its removed old tasks' ids for one batch."""
        g = self._g
        g._free.extend(self._grave.values())
        kept = set(self._revive.values())
        g._free.extend(i for i in g._held if i not in kept)
        g._held.clear()
        self._grave, self._revive = self._revive, {}
        # The journal of this batch is kept for a rollback while the timeline from before it is
        # kept and the edge pool was not renumbered meanwhile.
        ok = self._prev is not None and g._compactions == self._compactions and g._journal is not None
        self._last_journal = g._journal if ok else None
        g._journal = []
        self._compactions = g._compactions
        self._grave_hits = 0
        self._counts = (len(g), g._nedges)
        self._batch = Batch()
        self._seeds.clear()
        self._new.clear()
        self._removed.clear()
        self._untracked = False
        self._done = self._seen = g._version

    def _grow(self) -> None:
        """Size the per-id lists to the graph's id capacity."""
        n = len(self._g._key) - len(self._rdy)
        if n > 0:
            z = bytes(8 * n)
            self._rdy.frombytes(z)
            self._st.frombytes(z)
            self._en.frombytes(z)
            self._bind.extend(repeat(-1, n))
            self._sim.extend(bytes(n))
            self._pen.frombytes(z * MAX_PARTS)
        n = len(self._g._key) - len(self._sm)
        if n > 0:
            self._sm.frombytes(bytes(8 * n))
