"""Full simulation (FlexFlow Algorithm 1) and the task graph container: hand-computed timelines,
the fixed-point semantics on random graphs, and the errors a builder can run into."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.errors import SimulationError, TaskGraphCycleError, UnknownTaskError
from autopar.planner.sim.simulator import DeltaSimulator, TaskGraph, TaskInfo, simulate


def graph(tasks, edges=()) -> TaskGraph:
    """tasks: {key: (resource, duration)}; edges: [(src, dst)]."""
    g = TaskGraph()
    for k, (r, d) in tasks.items():
        g.add_task(k, r, d)
    for a, b in edges:
        g.add_edge(a, b)
    return g


def times(tl, k):
    return tl.ready[k], tl.start[k], tl.end[k]


# -- hand-computed timelines -------------------------------------------------------------------

def test_equal_ready_times_run_in_key_order_on_a_resource():
    # Added in reverse key order on purpose: insertion order must not matter, only the key.
    tl = simulate(graph({(2,): (0, 1.0), (1,): (0, 2.0), (0,): (0, 3.0)}))
    assert tl.order(0) == [(0,), (1,), (2,)]
    assert [times(tl, (k,)) for k in range(3)] == [(0.0, 0.0, 3.0), (0.0, 3.0, 5.0), (0.0, 5.0, 6.0)]
    assert tl.makespan == 6.0


def test_earlier_ready_time_beats_smaller_key():
    # (0,) is ready only at 1 (after its predecessor); (5,) is ready at 0 and goes first.
    tl = simulate(graph({(9,): (1, 1.0), (0,): (0, 1.0), (5,): (0, 4.0)}, [((9,), (0,))]))
    assert tl.order(0) == [(5,), (0,)]
    assert times(tl, (0,)) == (1.0, 4.0, 5.0)  # ready at 1, waits for the resource until 4


def test_task_waits_for_its_input_not_its_resource():
    # Resource 0 is free at 1, but (2,) needs (1,) which ends at 3 on another resource.
    tl = simulate(graph({(0,): (0, 1.0), (1,): (1, 3.0), (2,): (0, 1.0)}, [((1,), (2,))]))
    assert times(tl, (2,)) == (3.0, 3.0, 4.0)


def test_ready_time_is_the_latest_predecessor_end():
    tl = simulate(graph({(0,): (0, 1.0), (1,): (1, 2.5), (2,): (2, 1.0), (3,): (3, 1.0)},
                        [((0,), (3,)), ((1,), (3,)), ((2,), (3,))]))
    assert times(tl, (3,)) == (2.5, 2.5, 3.5)


def test_transfers_contend_fifo_on_a_shared_link():
    # Two producers on devices 0 and 1 send over link 10 to device 2; the link serializes them
    # in order of ready time, and the later transfer delays its consumer.
    tasks = {(0, 0): (0, 1.0), (0, 1): (1, 2.0),      # producers
             (1, 0): (10, 3.0), (1, 1): (10, 3.0),    # transfers on the shared link
             (2, 0): (2, 1.0), (2, 1): (2, 1.0)}      # consumers
    edges = [((0, 0), (1, 0)), ((0, 1), (1, 1)), ((1, 0), (2, 0)), ((1, 1), (2, 1))]
    tl = simulate(graph(tasks, edges))
    assert times(tl, (1, 0)) == (1.0, 1.0, 4.0)
    assert times(tl, (1, 1)) == (2.0, 4.0, 7.0)  # ready at 2, link busy until 4
    assert times(tl, (2, 1)) == (7.0, 7.0, 8.0)
    assert tl.order(10) == [(1, 0), (1, 1)]
    assert tl.busy() == {0: 1.0, 1: 2.0, 10: 6.0, 2: 2.0}
    assert tl.makespan == 8.0


def test_a_task_that_ends_after_a_later_ready_time_still_holds_its_resource():
    # (0,) runs 0-5; (1,) is ready at 2 (after (2,) on another resource) and must queue.
    tl = simulate(graph({(0,): (0, 5.0), (2,): (1, 2.0), (1,): (0, 1.0)}, [((2,), (1,))]))
    assert times(tl, (1,)) == (2.0, 5.0, 6.0)


def test_empty_graph_has_zero_makespan():
    tl = simulate(TaskGraph())
    assert tl.makespan == 0.0 and len(tl) == 0 and tl.order(0) == []


# -- the fixed point, on random graphs ---------------------------------------------------------

DURATIONS = [0.5, 1.0, 1.5, 2.0]  # few values, so equal ready times (ties) actually happen


@st.composite
def random_graphs(draw, max_tasks=30):
    n = draw(st.integers(1, max_tasks))
    nres = draw(st.integers(1, 4))
    keys = draw(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), min_size=n, max_size=n, unique=True))
    g = TaskGraph()
    for k in keys:  # list position is the topological rank; keys are unrelated to it
        g.add_task(k, draw(st.integers(0, nres - 1)), draw(st.sampled_from(DURATIONS)))
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            g.add_edge(keys[i], keys[j])
    return g


def assert_is_the_fixed_point(g: TaskGraph, tl) -> None:
    """The definition in planner.sim.simulator, checked directly, independently of Algorithm 1."""
    by_res: dict[int, list] = {}
    for k in g.keys():
        ends = [tl.end[p] for p in g.preds(k)]
        assert tl.ready[k] == max(ends, default=0.0)
        assert tl.end[k] == tl.start[k] + g.task(k).duration
        by_res.setdefault(g.task(k).resource, []).append(k)
    for r, ks in by_res.items():
        fifo = sorted(ks, key=lambda k: (tl.ready[k], k))
        assert tl.order(r) == fifo
        prev_end = 0.0
        for k in fifo:
            assert tl.start[k] == max(tl.ready[k], prev_end)
            prev_end = tl.end[k]
    assert tl.makespan == max((tl.end[k] for k in g.keys()), default=0.0)


@settings(max_examples=300, deadline=None)
@given(random_graphs())
def test_full_simulation_is_the_fifo_fixed_point(g):
    assert_is_the_fixed_point(g, simulate(g))


@settings(max_examples=100, deadline=None)
@given(random_graphs())
def test_full_simulation_is_deterministic(g):
    assert simulate(g).same_as(simulate(g))


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("duration", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_duration_is_rejected(duration):
    g = TaskGraph()
    with pytest.raises(SimulationError, match="must be positive and finite"):
        g.add_task((0,), 0, duration)
    g.add_task((0,), 0, 1.0)
    with pytest.raises(SimulationError, match="must be positive and finite"):
        g.set_duration((0,), duration)


@pytest.mark.parametrize("key", [[0, 1], (0, "a"), (0.5,), "t0"])
def test_key_must_be_a_tuple_of_ints(key):
    with pytest.raises(SimulationError, match="tuple of ints"):
        TaskGraph().add_task(key, 0, 1.0)


def test_duplicate_key_is_rejected():
    g = graph({(0,): (0, 1.0)})
    with pytest.raises(SimulationError, match="already in the task graph"):
        g.add_task((0,), 1, 2.0)


def test_cycle_is_reported_with_the_tasks_on_it():
    g = graph({(k,): (0, 1.0) for k in range(5)}, [((0,), (1,)), ((1,), (2,)), ((2,), (3,)), ((3,), (1,))])
    with pytest.raises(TaskGraphCycleError) as err:
        simulate(g)
    msg = str(err.value)
    assert all(repr((k,)) in msg for k in (1, 2, 3)) and "(4,)" not in msg


def test_self_loop_is_rejected_when_added():
    g = graph({(0,): (0, 1.0)})
    with pytest.raises(TaskGraphCycleError, match="itself"):
        g.add_edge((0,), (0,))


def test_unknown_key_is_a_key_error_naming_it():
    g = graph({(0,): (0, 1.0)})
    with pytest.raises(UnknownTaskError, match=r"\(7,\)"):
        g.add_edge((0,), (7,))
    with pytest.raises(KeyError):
        g.task((7,))


def test_removing_a_missing_edge_is_an_error():
    g = graph({(0,): (0, 1.0), (1,): (0, 1.0)})
    with pytest.raises(SimulationError, match="no edge"):
        g.remove_edge((0,), (1,))


def test_durations_below_float_resolution_are_rejected():
    g = graph({(0,): (0, 1e6), (1,): (0, 1e-12)}, [((0,), (1,))])
    with pytest.raises(SimulationError, match="floating-point resolution"):
        simulate(g)


# -- the container -----------------------------------------------------------------------------

def test_add_edge_is_idempotent_and_remove_task_drops_its_edges():
    g = graph({(0,): (0, 1.0), (1,): (1, 1.0), (2,): (2, 1.0)})
    g.add_edge((0,), (1,))
    g.add_edge((0,), (1,))
    g.add_edge((1,), (2,))
    assert g.succs((0,)) == ((1,),) and g.num_edges() == 2
    g.remove_task((1,))
    assert (1,) not in g and len(g) == 2 and g.succs((0,)) == () and g.preds((2,)) == ()
    # The freed id is reused without leftover edges.
    g.add_task((3,), 0, 1.0)
    assert g.preds((3,)) == () and g.succs((3,)) == ()


def test_task_info_is_a_frozen_view():
    g = TaskGraph()
    g.add_task((4, 2), 7, 0.25, "comm", 1024.0, "gpu0->gpu1")
    assert g.task((4, 2)) == TaskInfo((4, 2), 7, 0.25, "comm", 1024.0, "gpu0->gpu1")
    g.set_duration((4, 2), 0.5)
    assert g.task((4, 2)).duration == 0.5


# -- timelines ---------------------------------------------------------------------------------

def test_same_as_is_exact_by_default_and_tolerant_on_request():
    a = simulate(graph({(0,): (0, 1.0), (1,): (0, 2.0)}))
    b = simulate(graph({(0,): (0, 1.0 + 1e-12), (1,): (0, 2.0)}))
    assert a.same_as(a) and not a.same_as(b) and a.same_as(b, tol=1e-9)
    c = simulate(graph({(0,): (0, 1.0)}))
    assert not a.same_as(c) and not c.same_as(a)


def test_a_full_simulation_timeline_is_a_snapshot():
    g = graph({(0,): (0, 1.0), (1,): (0, 2.0)})
    tl = simulate(g)
    g.set_duration((0,), 5.0)
    g.remove_task((1,))
    assert tl.end[(1,)] == 3.0 and tl.makespan == 3.0


def test_a_delta_timeline_goes_stale_after_an_edit_unless_detached():
    sim = DeltaSimulator(graph({(0,): (0, 1.0), (1,): (0, 2.0)}))
    live = sim.timeline()
    kept = live.detached()
    sim.set_duration((0,), 5.0)
    with pytest.raises(SimulationError, match="edited since"):
        live.end[(1,)]
    assert kept.end[(1,)] == 3.0
    assert sim.resimulate().end[(1,)] == 7.0
