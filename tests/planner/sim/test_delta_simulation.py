"""Delta simulation (FlexFlow Algorithm 2, exact replay form) gives bit-identical timelines to full
simulation after any batch of edits."""

from __future__ import annotations

import contextlib
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar.planner.sim._delta as delta_module
import autopar.planner.sim.simulator as simulator_module
from autopar.planner.errors import SimulationError, TaskGraphCycleError
from autopar.planner.sim.simulator import DeltaSimulator, TaskGraph, simulate

DURATIONS = [0.5, 1.0, 1.5, 2.0]  # few values, so equal ready times (ties) actually happen


@contextlib.contextmanager
def replay_always(quiet: int = 1):
    """Take the replay path for every batch (not a full pass) and test convergence eagerly."""
    saved = simulator_module._REPLAY_FRACTION, delta_module.QUIET
    simulator_module._REPLAY_FRACTION, delta_module.QUIET = math.inf, quiet
    try:
        yield
    finally:
        simulator_module._REPLAY_FRACTION, delta_module.QUIET = saved


@contextlib.contextmanager
def resume_always(quiet: int = 1):
    """Re-time every batch with the compiled pass from the cut (never the Python replay), and
    test eagerly whether it rejoins the old timeline (0: never)."""
    saved = simulator_module._REPLAY_FRACTION_COMPILED, delta_module.QUIET
    simulator_module._REPLAY_FRACTION_COMPILED, delta_module.QUIET = -1.0, quiet
    try:
        yield
    finally:
        simulator_module._REPLAY_FRACTION_COMPILED, delta_module.QUIET = saved


def assert_same(sim: DeltaSimulator) -> None:
    got = sim.resimulate()
    want = simulate(sim.graph)
    assert got.same_as(want), (sim.stats, got.differences(want))
    assert sim.makespan == want.makespan
    # What the next replay relies on: each task's `bind` is the input a full pass runs last.
    g, rdy = sim.graph, sim._rdy
    for x in g._id.values():
        ps = g._pred[x]
        last = max(ps, key=lambda p: (rdy[p], g._key[p])) if ps else -1
        assert sim._bind[x] == last, (sim.stats, g._key[x])


class World:
    """A task graph with a hidden topological rank per task, so random edits stay acyclic."""

    def __init__(self, data, max_tasks: int = 25):
        self.data = data
        self.fresh = itertools.count(1000)
        n = data.draw(st.integers(1, max_tasks), label="tasks")
        self.nres = data.draw(st.integers(1, 4), label="resources")
        self.rank: dict[tuple, float] = {}
        g = TaskGraph()
        for j in range(n):
            k = data.draw(st.tuples(st.integers(0, 40), st.integers(0, 2)).filter(lambda k: k not in self.rank))
            self.rank[k] = float(j)
            g.add_task(k, self._res(), self._dur())
        keys = list(self.rank)
        for j in range(1, n):
            for i in data.draw(st.sets(st.integers(0, j - 1), max_size=3)):
                g.add_edge(keys[i], keys[j])
        self.sim = DeltaSimulator(g)

    def _res(self) -> int:
        return self.data.draw(st.integers(0, self.nres - 1))

    def _dur(self) -> float:
        return self.data.draw(st.sampled_from(DURATIONS))

    def _pick(self):
        return self.data.draw(st.sampled_from(sorted(self.rank)))

    def _ordered(self, a, b):
        """The edge between a and b that respects the hidden order (ties broken by key)."""
        return (a, b) if (self.rank[a], a) < (self.rank[b], b) else (b, a)

    def edit(self) -> None:
        sim, g = self.sim, self.sim.graph
        op = self.data.draw(st.sampled_from(["remove", "add", "duration", "edge", "unedge", "replace"]))
        if op == "add" or not self.rank:
            k = (next(self.fresh), 0)
            self.rank[k] = self.data.draw(st.floats(-1.0, 30.0))
            sim.add_task(k, self._res(), self._dur())
            others = sorted(self.rank)
            for o in self.data.draw(st.lists(st.sampled_from(others), max_size=4)):
                if o != k:
                    sim.add_edge(*self._ordered(o, k))
        elif op == "remove":
            k = self._pick()
            del self.rank[k]
            sim.remove_task(k)
        elif op == "replace":  # what DeltaSession does: remove a task, add it back changed
            k = self._pick()
            preds, succs = g.preds(k), g.succs(k)
            sim.remove_task(k)
            sim.add_task(k, self._res(), self._dur())
            for p in self.data.draw(st.lists(st.sampled_from(preds), max_size=2)) if preds else ():
                sim.add_edge(p, k)
            for s in succs:
                sim.add_edge(k, s)
        elif op == "duration":
            sim.set_duration(self._pick(), self._dur())
        elif op == "edge" and len(self.rank) > 1:
            a, b = self._pick(), self._pick()
            if a != b:
                sim.add_edge(*self._ordered(a, b))
        elif op == "unedge":
            k = self._pick()
            if g.preds(k):
                sim.remove_edge(self.data.draw(st.sampled_from(sorted(g.preds(k)))), k)


@settings(max_examples=250, deadline=None)
@given(st.data())
def test_delta_equals_full_after_every_batch_of_random_edits(data):
    with replay_always():
        w = World(data)
        assert_same(w.sim)
        for _ in range(data.draw(st.integers(1, 4), label="batches")):
            for _ in range(data.draw(st.integers(1, 5), label="edits")):
                w.edit()
            assert_same(w.sim)


@settings(max_examples=250, deadline=None)
@given(st.data())
def test_the_compiled_pass_from_the_cut_equals_full_after_every_batch_of_random_edits(data):
    with resume_always(quiet=data.draw(st.sampled_from([0, 1, 2, 16]), label="quiet")):
        w = World(data)
        for _ in range(data.draw(st.integers(1, 4), label="batches")):
            for _ in range(data.draw(st.integers(1, 5), label="edits")):
                w.edit()
            assert_same(w.sim)
            assert w.sim.stats.get("reason") in (None, "first simulation")  # never a full pass


def content(g: TaskGraph) -> dict:
    return {k: (g.task(k).resource, g.task(k).duration, frozenset(g.preds(k))) for k in g.keys()}


def restore(sim: DeltaSimulator, want: dict) -> None:
    """Edit `sim` back to the graph `want` (as `content` gives it), in one batch."""
    g = sim.graph
    for k in list(g.keys()):
        if k not in want or g.task(k).resource != want[k][0]:
            sim.remove_task(k)
    for k, (r, d, _) in want.items():
        if k not in g:
            sim.add_task(k, r, d)
        sim.set_duration(k, d)
    for k, (_, _, preds) in want.items():
        have = set(g.preds(k))
        for p in have - preds:
            sim.remove_edge(p, k)
        for p in preds - have:
            sim.add_edge(p, k)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_undoing_a_random_batch_restores_the_timeline_without_simulating(data):
    with replay_always():
        w = World(data)
        for _ in range(data.draw(st.integers(1, 3), label="rounds")):
            start, ranks = content(w.sim.graph), dict(w.rank)
            for _ in range(data.draw(st.integers(1, 5), label="edits")):
                w.edit()
            assert_same(w.sim)
            if content(w.sim.graph) == start:
                continue
            restore(w.sim, start)
            assert_same(w.sim)
            assert w.sim.stats["mode"] == "undo"
            w.rank = ranks


def ids_and_edges(g: TaskGraph) -> tuple:
    return dict(g._id), {k: frozenset(g.preds(k)) for k in g.keys()}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_rollback_restores_the_graph_under_the_same_ids_and_its_timeline(data):
    w = World(data)
    for _ in range(data.draw(st.integers(1, 3), label="rounds")):
        g = w.sim.graph
        before, tl, ranks = ids_and_edges(g), w.sim.timeline().detached(), dict(w.rank)
        content_before = content(g)
        version = g._version
        for _ in range(data.draw(st.integers(1, 6), label="edits")):
            w.edit()
        assert_same(w.sim)
        if g._version == version:
            continue  # the edits were no-ops (an existing edge): no batch to take back
        w.sim.rollback()
        assert w.sim.stats["mode"] == "rollback"
        assert ids_and_edges(g) == before, (ids_and_edges(g), before)
        assert content(g) == content_before
        assert w.sim.timeline().same_as(tl) and w.sim.timeline().same_as(simulate(g))
        assert not w.sim.can_rollback()
        w.rank = ranks
        for _ in range(data.draw(st.integers(0, 3), label="edits after")):
            w.edit()  # ids freed by the rollback are reused exactly
        assert_same(w.sim)


def test_a_rollback_is_refused_once_the_edge_pool_was_compacted_behind_the_simulator():
    sim = DeltaSimulator(absorbed_change_graph())
    sim.remove_task((50,))
    sim.resimulate()
    assert sim.can_rollback()
    simulator_module.compact_edges(sim.graph)  # renumbers the records the journal names
    assert not sim.can_rollback()
    with pytest.raises(SimulationError, match="nothing to roll back"):
        sim.rollback()


def test_a_rollback_is_refused_with_edits_pending_or_twice():
    sim = DeltaSimulator(absorbed_change_graph())
    with pytest.raises(SimulationError, match="nothing to roll back"):
        sim.rollback()  # no batch yet
    sim.set_duration((1,), 7.0)
    sim.resimulate()
    sim.set_duration((0,), 3.0)
    with pytest.raises(SimulationError, match="before new edits"):
        sim.rollback()
    sim.resimulate()
    sim.rollback()
    assert sim.graph.task((0,)).duration == 1.0 and sim.graph.task((1,)).duration == 7.0
    with pytest.raises(SimulationError, match="once"):
        sim.rollback()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_dead_edges_are_compacted_between_batches_so_a_rollback_stays_possible(data):
    # Compaction renumbers the edge pool a batch's journal names: it waits for the next batch.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulator_module, "compaction_due", lambda g: True)
        _compacting_rounds(data)


def _compacting_rounds(data) -> None:
    w = World(data)
    g = w.sim.graph
    for _ in range(data.draw(st.integers(1, 3), label="rounds")):
        before, tl, ranks, compactions = ids_and_edges(g), w.sim.timeline().detached(), dict(w.rank), g._compactions
        version = g._version
        for _ in range(data.draw(st.integers(1, 4), label="edits")):
            w.edit()
        assert_same(w.sim)
        if g._version == version:
            continue  # the edits were no-ops: no batch to take back
        assert g._compactions > compactions  # at the first edit of the batch, not in its pass
        assert w.sim.can_rollback()
        w.sim.rollback()
        assert ids_and_edges(g) == before and w.sim.timeline().same_as(tl)
        w.rank = ranks


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_delta_equals_full_with_the_default_replay_policy(data):
    w = World(data, max_tasks=40)
    for _ in range(3):
        w.edit()
        assert_same(w.sim)


@pytest.mark.slow
@pytest.mark.parametrize("policy", [replay_always, resume_always])
@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_delta_equals_full_on_thousands_of_random_edit_batches(policy, data):
    with policy(quiet=data.draw(st.sampled_from([1, 2, 16]))):
        w = World(data, max_tasks=40)
        for _ in range(data.draw(st.integers(1, 6))):
            for _ in range(data.draw(st.integers(1, 8))):
                w.edit()
            assert_same(w.sim)


# -- a training step: forward, backward, transfers on shared links, gradient rings ------------

class TrainingStep:
    """Layers split over devices; a change re-partitions one layer, like one MCMC move."""

    def __init__(self, devices: int, layers: int, seed: int):
        self.D, self.L = devices, layers
        self.rng = random.Random(seed)
        self.work = [self.rng.choice([1.0, 2.0, 3.0]) for _ in range(layers)]
        self.cfg = [self.config() for _ in range(layers)]
        self.owned: dict = {}

    def config(self) -> tuple[int, int]:
        degree = self.rng.choice([d for d in (1, 2, 4, 8) if d <= self.D])
        return degree, self.rng.randrange(self.D // degree) * degree

    def link(self, a: int, b: int) -> int:  # one link per node pair of 2 devices, both ways shared
        return 100 + min(a // 2, b // 2) * 16 + max(a // 2, b // 2)

    def devices(self, layer: int) -> list[int]:
        degree, first = self.cfg[layer]
        return list(range(first, first + degree))

    def add_layer(self, g, l):
        keys = []
        devs = self.devices(l)
        for t, d in enumerate(devs):
            f, b = (0, l, 0, t), (1, self.L - l, 0, t)
            g.add_task(f, d, self.work[l] / len(devs))
            g.add_task(b, d, 2 * self.work[l] / len(devs))
            g.add_edge(f, b)
            keys += [f, b]
        return keys

    def add_edges(self, g, l):
        keys = []
        if l == 0:
            return keys
        P, C = self.devices(l - 1), self.devices(l)
        for a, da in enumerate(P):
            for c, dc in enumerate(C):
                if max(a / len(P), c / len(C)) >= min((a + 1) / len(P), (c + 1) / len(C)):
                    continue  # no overlap of the two sample ranges
                f0, f1 = (0, l - 1, 0, a), (0, l, 0, c)
                b1, b0 = (1, self.L - l, 0, c), (1, self.L - l + 1, 0, a)
                if da == dc:
                    g.add_edge(f0, f1)
                    g.add_edge(b1, b0)
                    continue
                for k, src, dst, (u, v) in (((0, l, 1, a, c), f0, f1, (da, dc)), ((1, self.L - l, 1, a, c), b1, b0, (dc, da))):
                    g.add_task(k, self.link(u, v), 0.5, "comm", 1.0)
                    g.add_edge(src, k)
                    g.add_edge(k, dst)
                    keys.append(k)
        return keys

    def add_sync(self, g, l):
        devs = self.devices(l)
        keys = []
        for e, d in enumerate(devs if len(devs) > 1 else []):
            k = (2, l, e)
            g.add_task(k, self.link(d, devs[(e + 1) % len(devs)]), 0.25, "comm", 1.0)
            for t in range(len(devs)):
                g.add_edge((1, self.L - l, 0, t), k)
            keys.append(k)
        return keys

    def build(self, g):
        for l in range(self.L):
            self.owned[("op", l)] = self.add_layer(g, l)
        for l in range(self.L):
            self.owned[("edge", l)] = self.add_edges(g, l)
            self.owned[("sync", l)] = self.add_sync(g, l)

    def change(self, sim, l, cfg=None):
        """Re-partition layer `l` (randomly unless `cfg` is given); returns its old config."""
        old = self.cfg[l]
        groups = [("op", l), ("edge", l), ("sync", l)] + ([("edge", l + 1)] if l + 1 < self.L else [])
        for grp in groups:
            for k in self.owned.pop(grp):
                sim.remove_task(k)
        self.cfg[l] = cfg if cfg is not None else self.config()
        self.owned[("op", l)] = self.add_layer(sim, l)
        self.owned[("edge", l)] = self.add_edges(sim, l)
        if l + 1 < self.L:
            self.owned[("edge", l + 1)] = self.add_edges(sim, l + 1)
        self.owned[("sync", l)] = self.add_sync(sim, l)
        return old


@pytest.mark.parametrize("policy", [lambda: replay_always(quiet=4), resume_always])
@pytest.mark.parametrize("devices,layers,seed", [(4, 8, 0), (8, 12, 1)])
def test_delta_equals_full_on_training_step_moves(devices, layers, seed, policy):
    step = TrainingStep(devices, layers, seed)
    g = TaskGraph()
    step.build(g)
    sim = DeltaSimulator(g)
    with policy():
        for _ in range(12):
            step.change(sim, step.rng.randrange(layers))
            assert_same(sim)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_delta_equals_full_on_long_chains_of_training_step_moves(seed):
    step = TrainingStep(16, 24, seed)
    g = TaskGraph()
    step.build(g)
    sim = DeltaSimulator(g)
    for _ in range(60):
        step.change(sim, step.rng.randrange(24))
        assert_same(sim)


# -- what the replay does ----------------------------------------------------------------------

def absorbed_change_graph() -> TaskGraph:
    """(0,) feeds (2,) but (1,) decides when (2,) is ready; 100 tasks follow (2,)."""
    g = TaskGraph()
    g.add_task((0,), 0, 1.0)
    g.add_task((1,), 1, 5.0)
    g.add_task((2,), 2, 1.0)
    g.add_edge((0,), (2,))
    g.add_edge((1,), (2,))
    prev = (2,)
    for k in range(3, 103):
        g.add_task((k,), 3, 1.0)
        g.add_edge(prev, (k,))
        prev = (k,)
    return g


def test_a_change_absorbed_by_slack_stops_the_replay_early():
    sim = DeltaSimulator(absorbed_change_graph())
    sim.set_duration((0,), 2.0)
    assert_same(sim)
    assert sim.stats["mode"] == "delta" and sim.stats["converged"]
    assert sim.stats["retimed"] < 40  # of 103: it stopped once the states agreed again


def test_a_change_that_propagates_retimes_everything_after_it():
    sim = DeltaSimulator(absorbed_change_graph())
    with replay_always(quiet=1):
        sim.set_duration((1,), 6.0)
        assert_same(sim)
    assert not sim.stats["converged"] and sim.stats["retimed"] == 102  # all but (0,)
    assert sim.makespan == 107.0


@pytest.mark.parametrize("policy", [lambda: replay_always(quiet=1), resume_always])
def test_a_resource_left_idle_by_a_converged_replay_is_idle_in_later_checkpoints(policy, monkeypatch):
    # (0, 0) alone on resource 1 is removed; the replay converges right after it.  Checkpoints
    # further on must not keep resource 1 busy until the removed task's end: a task added there
    # later would wait for it.
    monkeypatch.setattr(simulator_module, "_CHECKPOINT_MIN", 1)
    g = TaskGraph()
    for k in range(100):
        g.add_task((1, k), 0, 1.0)
        if k:
            g.add_edge((1, k - 1), (1, k))
    g.add_task((0, 0), 1, 50.0)
    sim = DeltaSimulator(g)
    with policy():
        sim.remove_task((0, 0))
        assert_same(sim)
        sim.add_task((2, 0), 1, 1.0)
        sim.add_edge((1, 10), (2, 0))
        assert_same(sim)
    assert sim.timeline().end[(2, 0)] == 12.0


def test_a_late_change_replays_only_the_end_of_the_step():
    sim = DeltaSimulator(absorbed_change_graph())
    sim.set_duration((95,), 3.0)
    assert_same(sim)
    assert sim.stats["mode"] == "delta" and sim.stats["retimed"] == 8


@pytest.mark.parametrize("policy", [contextlib.nullcontext, resume_always])
def test_a_cycle_added_by_an_edit_is_reported_and_can_be_undone(policy):
    sim = DeltaSimulator(absorbed_change_graph())
    with policy():
        sim.add_edge((50,), (10,))
        with pytest.raises(TaskGraphCycleError, match=r"\(50,\) -> \(10,\)"):
            sim.resimulate()
        sim.remove_edge((50,), (10,))
        assert_same(sim)


def test_edits_made_on_the_graph_directly_are_still_simulated_exactly():
    sim = DeltaSimulator(absorbed_change_graph())
    sim.graph.set_duration((1,), 7.0)  # behind the simulator's back
    sim.graph.remove_task((60,))
    assert_same(sim)
    assert sim.stats["mode"] == "full"


def test_removing_and_re_adding_a_key_in_one_batch_is_exact():
    sim = DeltaSimulator(absorbed_change_graph())
    with replay_always():
        sim.remove_task((2,))
        sim.add_task((2,), 0, 3.0)  # same key, other resource and duration
        sim.add_edge((1,), (2,))
        sim.add_edge((2,), (3,))
        sim.add_task((500,), 4, 1.0)
        sim.set_duration((500,), 2.0)  # edit a task added in the same batch
        sim.add_task((501,), 4, 1.0)
        sim.remove_task((501,))        # and remove one
        assert_same(sim)


# -- batches that need no simulation -----------------------------------------------------------

def test_taking_back_a_change_restores_the_timeline_without_simulating():
    step = TrainingStep(8, 10, 3)
    g = TaskGraph()
    step.build(g)
    sim = DeltaSimulator(g)
    for _ in range(10):
        l = step.rng.randrange(10)
        before = sim.timeline().detached()
        old = step.change(sim, l)
        assert_same(sim)
        if step.cfg[l] == old:
            assert sim.stats["mode"] == "unchanged"
            continue
        step.change(sim, l, old)  # a rejected proposal, taken back
        assert_same(sim)
        assert sim.stats["mode"] == "undo" and sim.timeline().same_as(before)


def test_redoing_an_undone_change_and_moving_on_stay_exact():
    step = TrainingStep(8, 10, 4)
    g = TaskGraph()
    step.build(g)
    sim = DeltaSimulator(g)
    l = 2
    old = step.change(sim, l, (8, 0) if step.cfg[l] != (8, 0) else (2, 4))
    new = step.cfg[l]
    assert_same(sim)
    step.change(sim, l, old)
    assert_same(sim)
    assert sim.stats["mode"] == "undo"
    step.change(sim, l, new)   # redo
    assert_same(sim)
    assert sim.stats["mode"] == "undo"
    for m in (5, 7, 5):        # then ordinary moves on top of the restored state
        step.change(sim, m)
        assert_same(sim)
        assert sim.stats["mode"] in ("delta", "full", "unchanged")


def test_a_batch_with_no_net_effect_is_not_simulated():
    sim = DeltaSimulator(absorbed_change_graph())
    sim.remove_task((2,))
    sim.add_task((2,), 2, 1.0)
    sim.add_edge((0,), (2,))
    sim.add_edge((1,), (2,))
    sim.add_edge((2,), (3,))
    sim.set_duration((40,), 2.0)
    sim.set_duration((40,), 1.0)
    assert_same(sim)
    assert sim.stats["mode"] == "unchanged"


def test_a_different_change_of_the_same_tasks_is_not_taken_for_an_undo():
    sim = DeltaSimulator(absorbed_change_graph())
    sim.set_duration((40,), 2.0)
    assert_same(sim)
    sim.set_duration((40,), 3.0)  # touches the same task, but does not restore it
    assert_same(sim)
    assert sim.stats["mode"] == "delta"
    sim.set_duration((40,), 2.0)  # undoes only the last batch
    assert_same(sim)
    assert sim.stats["mode"] == "undo"
