"""The branches start (FlexFlow sec. 8.5, Figure 13): an Inception module's branches side by
side on a node's GPUs, split by sample across nodes only."""

import functools
import itertools
import math
import random

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.graph import DimKind
from autopar.planner.search.branches import (_best_blocks, balanced_branches, branch_placement, module_branches,
                                             node_blocks)
from autopar.planner.ir.strategy import data_parallel
from autopar.planner.sim.evaluate import simulate_strategy
from autopar.planner.sim.taskgraph import TaskGraphBuilder

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
    from autopar.planner.search.plan import BRANCH_ALPHAS, BRANCH_SPREADS, _branches
    graph, topo = _inception(), get_preset("p100-2x4")
    b = TaskGraphBuilder(graph, topo, CostModel())
    base = data_parallel(graph, 8)
    times = [simulate_strategy(b, branch_placement(b, base, sp))[0].step_time for sp in BRANCH_SPREADS]
    times += [simulate_strategy(b, balanced_branches(b, base, a))[0].step_time for a in BRANCH_ALPHAS]
    sessions = {}
    cand = _branches(b, base, sessions, None)
    assert cand.step_time == pytest.approx(min(times), rel=1e-12)
    assert sessions["branches"][0].strategy.configs == cand.strategy.configs


def test_a_branch_may_take_one_gpu_a_pair_an_aligned_block_or_the_whole_node():
    assert node_blocks(4) == [(0,), (1,), (2,), (3,), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1, 2, 3)]
    assert node_blocks(8) == [(k,) for k in range(8)] + [(0, 1), (2, 3), (4, 5), (6, 7)] + \
        [(0, 1, 2, 3), (4, 5, 6, 7), tuple(range(8))]
    assert node_blocks(1) == [(0,)]


@pytest.mark.parametrize("seed", range(20))
def test_block_choice_is_the_exact_minimum_of_the_module_objective(seed):
    """Branch and bound gives what brute force over every assignment gives."""
    rng = random.Random(seed)
    gpus = rng.choice([2, 4])
    blocks = node_blocks(gpus)
    nb = rng.randint(2, 4)
    one = [rng.uniform(0.1, 5.0) for _ in range(nb)]
    cost = {w: [c / w * rng.uniform(1.0, 1.5) for c in one] for w in {len(b) for b in blocks}}
    net = {w: [rng.uniform(0.0, 1.0) * w for _ in range(nb)] for w in cost}
    alpha = rng.choice([0.0, 0.5, 1.0, 2.0])

    def objective(assign):
        loads = [0.0] * gpus
        for k, blk in enumerate(assign):
            for j in blk:
                loads[j] += cost[len(blk)][k]
        nc = sum(net[len(blk)][k] for k, blk in enumerate(assign))
        return max(loads) + alpha * nc

    brute = min(objective(a) for a in itertools.product(blocks, repeat=nb))
    order = sorted(range(nb), key=lambda k: -cost[1][k])
    got = _best_blocks(order, blocks, cost, net, gpus, alpha)
    assert objective([got[k] for k in range(nb)]) == pytest.approx(brute, rel=1e-12)


def test_balanced_branches_give_every_op_of_a_branch_one_block_of_each_node():
    graph, topo = _inception(), get_preset("p100-2x4")
    base = data_parallel(graph, 8)
    s = balanced_branches(TaskGraphBuilder(graph, topo, CostModel()), base)
    modules = module_branches(graph)
    in_branches = {m for branches in modules.values() for chain in branches for m in chain}
    for op in graph.ops:
        if op.name not in in_branches:
            assert s[op.name] == base[op.name]
    for branches in modules.values():
        for chain in branches:
            cfgs = {s[m].devices for m in chain}
            assert len(cfgs) == 1  # one block for the whole branch: no transfer inside it
            devices = cfgs.pop()
            half = len(devices) // 2
            assert [d - 4 for d in devices[half:]] == list(devices[:half])  # the same GPUs of both nodes
            for m in chain:
                degrees = dict(zip((p.kind for p in graph[m].pardims), s[m].degrees))
                assert degrees[DimKind.SAMPLE] == len(devices) == s[m].num_tasks  # split by sample only


def test_weighing_the_network_heavily_puts_every_branch_on_one_gpu_per_node():
    graph, topo = _inception(), get_preset("p100-2x4")
    s = balanced_branches(TaskGraphBuilder(graph, topo, CostModel()), data_parallel(graph, 8), alpha=1e6)
    for branches in module_branches(graph).values():
        for chain in branches:
            assert s[chain[0]].num_tasks == 2  # the fewest replicas: one per node


def test_balanced_branches_need_two_nodes_and_modules():
    graph = _inception()
    assert balanced_branches(TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel()), data_parallel(graph, 4)) is None
    lenet = zoo("lenet")
    assert balanced_branches(TaskGraphBuilder(lenet, get_preset("p100-2x4"), CostModel()), data_parallel(lenet, 8)) is None


@pytest.mark.slow
def test_balanced_branches_beat_data_parallelism_by_a_third_on_inception_at_16_gpus():
    """FlexFlow 8.5 / Figure 13 on the paper's P100 cluster: data parallelism 53.35 ms,
    OptCNN 49.64, the balanced placement 39.3."""
    graph, topo = zoo("inception_v3"), get_preset("p100-4x4")
    b = TaskGraphBuilder(graph, topo, CostModel())
    base = data_parallel(graph, 16)
    dp = simulate_strategy(b, base)[0].step_time
    side = simulate_strategy(b, balanced_branches(b, base))[0].step_time
    assert dp / side >= 1.3
