"""Exhaustive search with lower-bound pruning finds the brute-force optimum (FlexFlow sec. 8.4).

The pruning is only as safe as its bounds, so besides brute force on tiny graphs these tests check
each bound against simulated timelines of random strategies: every prefix's bound is at most the
simulated step, every FIFO window's claims hold on the timeline, and the memoized round trips are
at most the real ones.
"""

import itertools
import math
import random
import time

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import Strategy, data_parallel, single_device
from autopar.planner.search._exhaustive_windows import window
from autopar.planner.search.exhaustive import _Search, all_configs, devices_interchangeable, exhaustive_search
from autopar.planner.search.mcmc import run_chain
from autopar.planner.sim._plans import bwd_key, fwd_key
from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder

from ._graphs import diamond, mlp, rnn

GRAPHS = {"mlp": mlp, "diamond": diamond, "rnn": rnn}


def _brute_force(builder, space):
    graph = builder.graph
    configs = [all_configs(op, builder.num_devices, space) for op in graph.ops]
    session = DeltaSession(builder, single_device(graph))
    best = math.inf
    for combo in itertools.product(*configs):
        for op, cfg in zip(graph.ops, combo):
            if session.strategy[op.name] != cfg:
                session.change(op.name, cfg)
        best = min(best, session.step_time)
    return best


def _search(graph, preset):
    b = TaskGraphBuilder(graph, get_preset(preset), CostModel())
    return b, _Search(b, [data_parallel(graph, b.num_devices)], None, None, None, time.perf_counter())


def _random_strategies(search, count, seed):
    """Half near data parallelism (one to three ops changed: where bounds are tight), half uniform."""
    rng = random.Random(seed)
    base = [search.best[op.name] for op in search.ops]
    for k in range(count):
        if k % 2:
            yield [rng.choice(c) for c in search.configs]
        else:
            cfgs = list(base)
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(search.N)
                cfgs[i] = rng.choice(search.configs[i])
            yield cfgs


def _timeline(b, search, cfgs):
    strategy = Strategy(tuple(op.name for op in search.ops), tuple(cfgs))
    return DeltaSession(b, strategy).timeline()


@pytest.mark.slow
def test_exhaustive_search_finds_the_brute_force_optimum_on_two_devices():
    graph = mlp()
    b = TaskGraphBuilder(graph, get_preset("p100-1x2"), CostModel())
    res = exhaustive_search(b, data_parallel(graph, 2))
    assert res.optimal and res.symmetric
    assert res.step_time == _brute_force(b, "soap")
    assert res.leaves < res.space_size  # the bound and the symmetry pruned something


@pytest.mark.parametrize("space", [pytest.param("sorted", marks=pytest.mark.slow), "aligned"])
def test_exhaustive_search_over_a_smaller_space_matches_brute_force(space):
    graph = mlp(batch=2, width=2)
    b = TaskGraphBuilder(graph, get_preset("p100-1x2"), CostModel())
    res = exhaustive_search(b, single_device(graph), space=space)
    assert res.optimal and res.step_time == _brute_force(b, space)


@pytest.mark.slow
def test_exhaustive_search_over_aligned_blocks_matches_brute_force_on_branches():
    graph = diamond(batch=2, width=2)
    b = TaskGraphBuilder(graph, get_preset("p100-1x2"), CostModel())
    res = exhaustive_search(b, single_device(graph), space="aligned")
    assert res.optimal and res.step_time == _brute_force(b, "aligned")


def test_exhaustive_search_starts_from_the_fastest_incumbent_and_needs_one():
    graph = mlp()
    b = TaskGraphBuilder(graph, get_preset("p100-1x2"), CostModel())
    starts = [single_device(graph), data_parallel(graph, 2)]
    res = exhaustive_search(b, starts, space="aligned")
    assert res.optimal
    assert res.step_time <= min(DeltaSession(b, s).step_time for s in starts)
    with pytest.raises(ValueError, match="at least one incumbent"):
        exhaustive_search(b, [], space="aligned")


@pytest.mark.parametrize("name, preset", [("mlp", "p100-1x4"), ("mlp", "p100-2x2"), ("diamond", "p100-1x4"),
                                          ("rnn", "p100-1x2")])
def test_every_prefix_bound_is_at_most_the_simulated_step(name, preset):
    b, search = _search(GRAPHS[name](), preset)
    for cfgs in _random_strategies(search, 24, seed=1):
        step = _timeline(b, search, cfgs).makespan
        for i, _, bound, _ in search._walk(cfgs):
            assert bound <= step * (1 + 1e-12), (name, preset, i, bound, step, cfgs)


@pytest.mark.parametrize("name, preset", [("mlp", "p100-1x4"), ("diamond", "p100-1x4"), ("mlp", "p100-2x2")])
def test_fifo_windows_hold_on_simulated_timelines(name, preset):
    b, search = _search(GRAPHS[name](), preset)
    checked = 0
    for cfgs in _random_strategies(search, 24, seed=2):
        tl = _timeline(b, search, cfgs)
        last = [max(tl.end[bwd_key(search.N, i, t)] for t in range(len(c.devices))) for i, c in enumerate(cfgs)]
        for k, node, _, placed in search._walk(cfgs):
            win = window(search.S, placed + [node], k) if search.S.window_ok[k] else None
            if win is None:
                continue
            to, end = win
            assert tl.makespan - last[k] >= end - 1e-15
            for m, gap in to.items():
                assert last[m] - last[k] >= gap - 1e-15
            checked += 1
    assert checked > 0  # the windows were not all skipped


@pytest.mark.parametrize("name, preset", [("mlp", "p100-1x4"), ("diamond", "p100-2x2"), ("rnn", "p100-1x2")])
def test_memoized_round_trips_are_at_most_the_simulated_ones(name, preset):
    b, search = _search(GRAPHS[name](), preset)
    assert search.rt is not None
    for cfgs in _random_strategies(search, 24, seed=3):
        tl = _timeline(b, search, cfgs)
        for v, cfg in enumerate(cfgs):
            for t, rt in enumerate(search.rt[v][cfg]):
                assert tl.ready[bwd_key(search.N, v, t)] - tl.end[fwd_key(v, t)] >= rt - 1e-15


def test_devices_of_one_nvlink_node_are_interchangeable_but_not_across_nodes():
    cm = CostModel()
    assert devices_interchangeable(TaskGraphBuilder(mlp(), get_preset("p100-1x4"), cm))
    assert not devices_interchangeable(TaskGraphBuilder(mlp(), get_preset("p100-2x2"), cm))
    assert not devices_interchangeable(TaskGraphBuilder(mlp(), get_preset("k80-1x4"), cm))


@pytest.mark.slow
def test_mcmc_reaches_the_exhaustive_optimum_on_a_small_graph():
    graph = mlp()
    b = TaskGraphBuilder(graph, get_preset("p100-1x2"), CostModel())
    optimum = exhaustive_search(b, data_parallel(graph, 2)).step_time
    best = min(run_chain(b, start, budget_s=math.inf, rng=random.Random(k), max_proposals=1500).best_time
               for k, start in enumerate([data_parallel(graph, 2), single_device(graph)]))
    assert best == optimum
