"""Exhaustive search with lower-bound pruning finds the brute-force optimum (FlexFlow sec. 8.4)."""

import itertools
import math
import random

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.presets import get_preset
from autopar.planner.search.exhaustive import all_configs, devices_interchangeable, exhaustive_search
from autopar.planner.search.mcmc import run_chain
from autopar.planner.strategy import data_parallel, single_device
from autopar.planner.taskgraph import DeltaSession, TaskGraphBuilder

from ._graphs import mlp


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
