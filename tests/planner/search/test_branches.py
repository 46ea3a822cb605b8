"""The branches start (FlexFlow sec. 8.5, Figure 13): an Inception module's branches side by
side on a node's GPUs, split by sample across nodes only."""

import functools
import math

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.graph import DimKind
from autopar.planner.presets import get_preset
from autopar.planner.search.branches import branch_placement, module_branches
from autopar.planner.strategy import data_parallel
from autopar.planner.taskgraph import TaskGraphBuilder, simulate_strategy

from ._graphs import zoo


@functools.lru_cache(maxsize=None)
def _inception():
    return zoo("inception_v3", batch=8, image=75, classes=10)


def test_each_inception_module_has_its_towers_as_branches():
    graph = _inception()
    modules = module_branches(graph)
    assert len(modules) >= 11  # mixed_5b .. mixed_7c (7b and 7c also join sub-branches)
    first = modules[next(iter(modules))]
    assert len(first) == 4  # 1x1, 5x5, double 3x3, pool
    for branches in modules.values():
        ops = [m for chain in branches for m in chain]
        assert len(ops) == len(set(ops))  # an op is in one branch only


def test_branches_run_on_one_gpu_per_node_and_the_rest_stays_data_parallel():
    graph, topo = _inception(), get_preset("p100-2x4")
    base = data_parallel(graph, 8)
    b = TaskGraphBuilder(graph, topo, CostModel())
    s = branch_placement(b, base, spread=math.inf)
    in_branches = {m for branches in module_branches(graph).values() for chain in branches for m in chain}
    for op in graph.ops:
        cfg = s[op.name]
        if op.name in in_branches:
            degrees = dict(zip((p.kind for p in op.pardims), cfg.degrees))
            assert degrees[DimKind.SAMPLE] == 2 and cfg.num_tasks == 2  # one task per node
            assert cfg.devices[1] - cfg.devices[0] == 4  # the same GPU of each node
        else:
            assert cfg == base[op.name]
    # Within a module, the branches are spread over the node's GPUs.
    first = module_branches(graph)[next(iter(module_branches(graph)))]
    assert len({s[chain[0]].devices[0] for chain in first}) == 4


def test_a_heavy_branch_keeps_its_base_configuration():
    graph, topo = _inception(), get_preset("p100-2x4")
    base = data_parallel(graph, 8)
    s = branch_placement(TaskGraphBuilder(graph, topo, CostModel()), base, spread=0.0)
    assert all(s[op.name] == base[op.name] for op in graph.ops)  # every branch over 0x its share


def test_there_are_no_branches_to_place_on_one_node_or_in_a_chain():
    graph = _inception()
    one_node = TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())
    assert branch_placement(one_node, data_parallel(graph, 4)) is None
    lenet = zoo("lenet")
    assert branch_placement(TaskGraphBuilder(lenet, get_preset("p100-2x4"), CostModel()), data_parallel(lenet, 8)) is None


def test_the_plan_starts_from_the_faster_branch_placement():
    from autopar.planner.search.plan import BRANCH_SPREADS, _branches
    graph, topo = _inception(), get_preset("p100-2x4")
    b = TaskGraphBuilder(graph, topo, CostModel())
    base = data_parallel(graph, 8)
    times = [simulate_strategy(b, branch_placement(b, base, sp))[0].step_time for sp in BRANCH_SPREADS]
    sessions = {}
    cand = _branches(b, base, sessions, None)
    assert cand.step_time == pytest.approx(min(times), rel=1e-12)
    assert sessions["branches"][0].strategy.configs == cand.strategy.configs
