"""The compiled Algorithm 1 (`planner.sim._fastpass`) gives the Python reference loop's timeline, bit
for bit, on any task graph — including graphs edited in place, whose edge pool holds dead
records — and falls back to the Python loop for keys it cannot compare."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.errors import TaskGraphCycleError
from autopar.planner.sim import _replay
from autopar.planner.sim._layout import KEY_FIELDS
from autopar.planner.sim.simulator import DeltaSimulator, TaskGraph, simulate

DURATIONS = [0.5, 1.0, 1.5, 2.0]  # few values, so equal ready times (ties) happen


def random_dag(rng: random.Random, n: int, resources: int, key_len: int = 3) -> TaskGraph:
    g = TaskGraph()
    keys = []
    for t in range(n):
        key = tuple(rng.randrange(-3, 4) for _ in range(key_len - 1)) + (t,)
        keys.append(key)
        g.add_task(key, rng.randrange(resources), rng.choice(DURATIONS))
    for b in range(n):
        for a in rng.sample(range(b), min(b, rng.randrange(4))):
            g.add_edge(keys[a], keys[b])
    return g


def assert_passes_agree(g: TaskGraph) -> None:
    assert _replay.compiled(g)
    fast = _replay.timed_pass(g, every=7)
    ref = _replay.timed_pass(g, every=7, python=True)
    names = ("ready", "start", "end", "bind", "order", "last", "checkpoint positions", "checkpoints")
    for name, a, b in zip(names, fast, ref):
        if name == "checkpoints":  # rows: numpy rows from the compiled pass, lists from Python
            a, b = [list(v) for v in a], [list(v) for v in b]
        assert a == b, name


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(0, 80), resources=st.integers(1, 6),
       key_len=st.integers(1, KEY_FIELDS))
def test_compiled_pass_equals_python_pass_on_random_graphs(seed, n, resources, key_len):
    assert_passes_agree(random_dag(random.Random(seed), n, resources, key_len))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_compiled_pass_equals_python_pass_after_removals_and_re_adds(seed):
    rng = random.Random(seed)
    g = random_dag(rng, 60, 4)
    for _ in range(40):
        keys = list(g.keys())
        k = rng.choice(keys)
        if rng.random() < 0.4:
            g.remove_task(k)
            g.add_task(k, rng.randrange(4), rng.choice(DURATIONS))  # same key, new id or old id
            for p in rng.sample(keys, 2):
                if p < k and p in g:
                    g.add_edge(p, k)
        elif rng.random() < 0.5 and g.succs(k):
            g.remove_edge(k, rng.choice(g.succs(k)))
        else:
            g.set_duration(k, rng.choice(DURATIONS))
        assert_passes_agree(g)


def test_shorter_keys_sort_first_on_a_tie_as_python_tuples_do():
    g = TaskGraph()
    g.add_task((1, 2, 0), 0, 1.0)
    g.add_task((1, 2), 0, 1.0)
    g.add_task((1, -5, 9), 0, 1.0)
    order = [g._key[i] for i in _replay.timed_pass(g)[4]]
    assert order == sorted(order) == [(1, -5, 9), (1, 2), (1, 2, 0)]


def test_a_cycle_is_named_by_the_compiled_pass_too():
    g = TaskGraph()
    for k in range(3):
        g.add_task((k,), 0, 1.0)
    g.add_edge((0,), (1,))
    g.add_edge((1,), (2,))
    g.add_edge((2,), (1,))
    with pytest.raises(TaskGraphCycleError, match=r"\(1,\) -> \(2,\) -> \(1,\)"):
        simulate(g)


@pytest.mark.parametrize("key", [(0,) * (KEY_FIELDS + 1), (1 << 63,), (-(1 << 62),)])
def test_keys_the_compiled_pass_cannot_compare_fall_back_to_the_python_pass(key):
    g = TaskGraph()
    g.add_task(key, 0, 1.0)
    g.add_task((5,), 0, 1.0)
    assert not _replay.compiled(g)
    tl = simulate(g)
    assert tl.makespan == 2.0


def test_dead_edges_are_compacted_away_without_changing_the_timeline():
    rng = random.Random(3)
    g = random_dag(rng, 50, 3)
    sim = DeltaSimulator(g)
    for _ in range(300):  # churn: every round removes and re-adds a task with fresh edges
        k = rng.choice(list(g.keys()))
        preds = [p for p in g.preds(k)]
        sim.remove_task(k)
        sim.add_task(k, rng.randrange(3), rng.choice(DURATIONS))
        for p in preds:
            sim.add_edge(p, k)
        sim.resimulate()
    before = len(g._e_alive)
    _replay.compact_edges(g)
    assert len(g._e_alive) == g._nedges == g.num_edges() <= before
    assert sim.timeline().same_as(simulate(g))


class _Compiling:
    """Stands in for a Numba dispatcher whose first call compiles: that call leaves a reference
    cycle holding its arguments behind, as Numba's compile path does."""

    def __init__(self):
        self.signatures = []

    def __call__(self, *args):
        if not self.signatures:
            self.signatures.append("first argument types")
            cycle = [args]
            cycle.append(cycle)
        return len(args)


def test_a_pass_that_compiles_leaves_no_view_of_the_graph_alive():
    import gc

    import numpy as np

    from autopar.planner.sim import frozen_heap, gc_paused

    arr = array("q", range(4))
    with frozen_heap(), gc_paused():  # the regime of a search
        _replay._run(_Compiling(), np.frombuffer(arr, np.int64))
        arr.append(4)  # BufferError while a view of `arr` is alive
        _Compiling()(np.frombuffer(arr, np.int64))  # the same call, not through _run: its view lingers
        with pytest.raises(BufferError):
            arr.append(5)
    gc.collect()
    arr.append(5)
