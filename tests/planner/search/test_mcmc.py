"""MCMC (FlexFlow sec. 6): Metropolis–Hastings acceptance, seeded chains, delta simulation."""

import math
import random

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import ParallelConfig, data_parallel, random_config, single_device
from autopar.planner.search._memtrack import MemoryTracker
from autopar.planner.search.experts import PlacementSpace
from autopar.planner.search.mcmc import accept, run_chain
from autopar.planner.sim.evaluate import simulate_strategy
from autopar.planner.sim.memory import peak_memory
from autopar.planner.sim.taskgraph import TaskGraphBuilder

from ._graphs import diamond, mlp, rnn, zoo


class _Fixed(random.Random):
    """A random source that always draws `u`."""

    def __init__(self, u: float):
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize("old,new,beta,u,expected", [
    (2.0, 1.0, 1.0, 0.999, True),                        # better: always accepted
    (1.0, 1.0, 1.0, 0.999, True),                        # equal: always accepted
    (1.0, 2.0, 1.0, math.exp(-1.0) - 1e-9, True),        # worse by 1 at beta 1: probability e^-1
    (1.0, 2.0, 1.0, math.exp(-1.0) + 1e-9, False),
    (1.0, 1.5, 4.0, math.exp(-2.0) - 1e-9, True),        # exp(beta * (old - new)) = e^-2
    (1.0, 1.5, 4.0, math.exp(-2.0) + 1e-9, False),
])
def test_acceptance_is_min_one_exp_beta_times_cost_drop(old, new, beta, u, expected):
    assert accept(old, new, beta, _Fixed(u)) is expected


def test_acceptance_frequency_matches_the_metropolis_probability():
    rng = random.Random(3)
    n = 20000
    hits = sum(accept(1.0, 1.25, 4.0, rng) for _ in range(n))
    assert hits / n == pytest.approx(math.exp(-1.0), abs=0.015)


@pytest.fixture(scope="module")
def builder():
    graph = diamond()
    return TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())


def test_a_seeded_chain_is_reproducible(builder):
    start = data_parallel(builder.graph, 4)
    runs = [run_chain(builder, start, budget_s=math.inf, rng=random.Random(7), max_proposals=150) for _ in range(2)]
    assert runs[0].best.configs == runs[1].best.configs
    assert runs[0].best_time == runs[1].best_time and runs[0].accepted == runs[1].accepted


def test_the_chain_best_is_what_full_simulation_says(builder):
    res = run_chain(builder, single_device(builder.graph), budget_s=math.inf, rng=random.Random(1), max_proposals=200)
    full, _, _ = simulate_strategy(builder, res.best)
    assert full.step_time == res.best_time
    assert res.best_time <= res.start_time and res.proposals == 200


def test_placement_chains_stay_in_the_placement_space(builder):
    space = PlacementSpace(4)
    res = run_chain(builder, single_device(builder.graph), budget_s=math.inf, rng=random.Random(2), space=space,
                    max_proposals=100)
    assert all(space.contains(op, res.best[op.name]) for op in builder.graph.ops)


def test_a_chain_stops_after_half_its_budget_without_improvement(builder):
    ticks = iter(range(10**6))
    res = run_chain(builder, data_parallel(builder.graph, 4), budget_s=40.0, rng=random.Random(0),
                    clock=lambda: float(next(ticks)))
    assert res.stopped == "no improvement for half the budget" or res.stopped == "time budget spent"
    assert res.seconds <= 41


def test_a_chain_whose_leftover_nobody_could_use_runs_to_the_end_of_its_budget(builder):
    """The planner hands what a chain leaves to the next chain; with nothing to hand over to
    (leftover under `min_handover_s`), stopping early would only waste the budget."""
    for handover, stops_early in ((0.0, True), (40.0, False)):
        ticks = iter(range(10**6))
        res = run_chain(builder, single_device(builder.graph, 0), budget_s=40.0, rng=random.Random(0),
                        space=PlacementSpace(4), clock=lambda: float(next(ticks)), min_handover_s=handover)
        last_improvement = res.trace[-1][0]
        if stops_early:
            assert res.stopped == "no improvement for half the budget" and res.seconds - last_improvement <= 22
        else:
            assert res.stopped == "time budget spent" and res.seconds >= 40


@pytest.mark.parametrize("make", [mlp, rnn])
@pytest.mark.parametrize("preset, n", [("p100-1x4", 4), ("local:2", 2)])   # local: receives posted ahead count
def test_incremental_peak_memory_equals_full_count_on_random_moves(make, preset, n):
    graph = make()
    topo = get_preset(preset)
    b = TaskGraphBuilder(graph, topo, CostModel())
    tracker = MemoryTracker(b, data_parallel(graph, n))
    rng = random.Random(5)
    for _ in range(60):
        op = rng.choice(graph.ops)
        tracker.change(op.name, random_config(op, n, rng))
        assert tracker.peak() == peak_memory(b, tracker.strategy)


def test_memory_tracked_over_multi_op_changes_and_rollbacks_equals_a_full_recount():
    graph = rnn(steps=3)
    b = TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())
    tracker = MemoryTracker(b, data_parallel(graph, 4))
    rng = random.Random(6)
    for _ in range(40):
        ops = rng.sample(graph.ops, rng.randrange(1, 4))
        before = tracker.peak()
        tracker.change_many({op.name: random_config(op, 4, rng) for op in ops})
        assert tracker.peak() == peak_memory(b, tracker.strategy)
        if rng.random() < 0.5:
            tracker.rollback()
            assert tracker.peak() == before == peak_memory(b, tracker.strategy)


def test_a_strategy_that_does_not_fit_is_never_reported_as_best():
    graph = mlp()
    topo = get_preset("p100-1x4")
    from dataclasses import replace
    tiny = replace(topo, devices=tuple(replace(d, memory=64) for d in topo.devices))  # 64 bytes: nothing fits
    b = TaskGraphBuilder(graph, tiny, CostModel())
    res = run_chain(b, data_parallel(graph, 4), budget_s=math.inf, rng=random.Random(0), max_proposals=50)
    assert res.best is None and res.best_time == math.inf and res.proposals == 50


def test_a_layer_move_re_simulates_to_what_full_simulation_says():
    graph = rnn(steps=3)
    b = TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())
    from autopar.planner.search.mcmc import layers_of
    from autopar.planner.sim.taskgraph import DeltaSession
    session = DeltaSession(b, data_parallel(graph, 4))
    cells = layers_of(graph)[next(op.name for op in graph.ops if op.kind == "lstm_cell")]
    assert len(cells) == 3
    rng = random.Random(4)
    for _ in range(5):
        cfg = random_config(graph[cells[0]], 4, rng)
        step = session.change_many({c: cfg for c in cells})
        full, _, _ = simulate_strategy(b, session.strategy)
        assert step == full.step_time and all(session.strategy[c] == cfg for c in cells)


def test_segments_are_unbranched_runs_of_ops_with_the_same_dims():
    from autopar.planner.search.mcmc import segments_of
    graph = zoo("lenet")
    segs = segments_of(graph)
    features = tuple(f"features_{i}" for i in range(6))
    classifier = tuple(f"classifier_{i}" for i in range(5))
    assert set(segs.values()) == {features, classifier}
    assert all(segs[m] == features for m in features)
    # the input, flatten (other dims) and the loss (two producers) are in no segment
    assert not {"images", "flatten", "labels", "loss"} & set(segs)
    # a diamond's branches fork and join: no op of the fork or the join is in the middle of a run
    for run in segments_of(diamond()).values():
        for a, b in zip(run, run[1:]):
            assert [c for c, _, _ in diamond().consumers[a]] == [b]


def test_a_segment_move_covers_a_run_around_the_op_and_stops_where_the_degrees_do_not_fit():
    from autopar.planner.search.mcmc import segment_move, segments_of
    graph = zoo("lenet")
    seg = segments_of(graph)["features_1"]
    cfg = ParallelConfig((2, 2, 1, 1), (0, 1, 2, 3))
    seen = set()
    for seed in range(200):
        changes = segment_move(graph, seg, "features_1", cfg, 4, random.Random(seed))
        names = [m for m in seg if m in changes]
        lo, hi = seg.index(names[0]), seg.index(names[-1])
        assert "features_1" in changes and names == list(seg[lo:hi + 1])
        assert all(c == cfg for c in changes.values())
        seen.add((lo, hi))
    assert (0, 2) in seen and (1, 1) in seen and (0, 5) in seen
    # h = w = 5 after the second pool: degree 2 on h stops a run before features_5
    tall = ParallelConfig((1, 1, 2, 1), (0, 1))
    for seed in range(100):
        assert "features_5" not in segment_move(graph, seg, "features_1", tall, 4, random.Random(seed))


@pytest.mark.slow
def test_mcmc_finds_lenets_proven_optimum_on_four_p100s():
    """FlexFlow sec. 8.4: exhaustive search (the sorted space, `test_exhaustive`) proves
    0.331291 ms; three ops away from data parallelism, each of them alone slower."""
    graph = zoo("lenet")
    b = TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())
    best = min(run_chain(b, data_parallel(graph, 4), budget_s=math.inf, rng=random.Random(k), max_proposals=4000,
                         beta_rel=400).best_time for k in range(2))
    assert best == pytest.approx(0.331291e-3, abs=1e-9)


def test_a_proposal_too_big_to_build_is_rejected_unbuilt_and_counted():
    graph = mlp()
    b = TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())
    start = data_parallel(graph, 4)
    res = run_chain(b, start, budget_s=math.inf, rng=random.Random(0), max_proposals=40, max_change_ratio=1e-9)
    assert res.too_big >= 20 and res.accepted == 0  # the rest drew the configuration the op has and res.best.configs == start.configs
    free = run_chain(b, start, budget_s=math.inf, rng=random.Random(0), max_proposals=40, max_change_ratio=None)
    assert free.too_big == 0 and free.accepted > 0
