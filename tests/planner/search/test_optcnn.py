"""OptCNN: its tables are its cost model, and its dynamic programming is optimal under it."""

import itertools
import random

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import Strategy
from autopar.planner.search._optcnn_tables import Tables
from autopar.planner.search.optcnn import _Layers, optcnn, optcnn_cost
from autopar.planner.sim.taskgraph import TaskGraphBuilder

from ._graphs import diamond, mlp, rnn, zoo


def _reference_cost(graph, topology, cost, strategy) -> float:
    """OptCNN's eq. 1 written out op by op, with transfers from the task-graph builder."""
    builder = TaskGraphBuilder(graph, topology, cost)
    tables = Tables(graph, topology, cost, None)
    total = 0.0
    for op in graph.ops:
        cfg = strategy[op.name]
        shapes = tuple(graph.input_spec(op, i).shape for i in range(len(op.inputs)))
        total += max(cost.task_cost(op, cfg.degrees, topology.devices[d], shapes).total for d in cfg.devices)
        for j, ref in enumerate(op.inputs):
            itemsize = graph[ref.op].outputs[ref.index].itemsize
            transfers, _ = builder.transfers(op, j, cfg, strategy[ref.op], itemsize)
            incoming: dict[int, float] = {}
            for tr in transfers:
                t = tr.nbytes / topology.route_bandwidth(tr.src_dev, tr.dst_dev) + topology.route_latency(tr.src_dev, tr.dst_dev)
                incoming[tr.dst_dev] = incoming.get(tr.dst_dev, 0.0) + t
            total += 2 * max(incoming.values(), default=0.0)
    for name, users in graph.param_users.items():
        op = graph[users[0]]
        j = next(k for k, p in enumerate(op.params) if p.name == name)
        cfg = strategy[users[0]]
        total += tables.sync(op, [j])[tables.configs[op.name].index(cfg)]
    return total


GRAPHS = {"mlp": mlp, "diamond": diamond, "rnn": rnn}


@pytest.mark.parametrize("name", GRAPHS)
def test_tables_add_up_to_the_cost_model_written_out(name):
    graph, topology, cost = GRAPHS[name](), get_preset("p100-1x4"), CostModel()
    layers = _Layers(graph, Tables(graph, topology, cost, None), call_site=False)
    problem = layers.problem()
    rng = random.Random(0)
    for _ in range(20):
        assignment = [rng.randrange(s) for s in problem.sizes]
        strategy = Strategy.from_mapping(graph, layers.configs(assignment))
        if any(v != layers.var_of[m[0]] for v, m in enumerate(layers.groups)):
            continue  # split sources: the written-out model has one configuration per op
        assert problem.cost(assignment) == pytest.approx(_reference_cost(graph, topology, cost, strategy), rel=1e-5)


@pytest.mark.parametrize("name", ["mlp", "diamond", pytest.param("rnn", marks=pytest.mark.slow)])
def test_optcnn_is_optimal_by_brute_force_on_two_devices(name):
    graph, topology, cost = GRAPHS[name](), get_preset("p100-1x2"), CostModel()
    result = optcnn(graph, topology, cost, placements="aligned")
    layers = _Layers(graph, Tables(graph, topology, cost, None, "aligned"), call_site=False)
    problem = layers.problem()
    best = min(problem.cost(list(a)) for a in itertools.product(*(range(s) for s in problem.sizes)))
    assert result.cost == pytest.approx(best, rel=1e-9)


def test_optcnn_cost_of_its_own_strategy_is_the_reported_cost():
    graph, topology, cost = diamond(), get_preset("p100-1x4"), CostModel()
    result = optcnn(graph, topology, cost, placements="aligned")
    assert optcnn_cost(graph, topology, cost, result.strategy, placements="aligned") == pytest.approx(result.cost)


def test_unrolled_steps_of_a_layer_take_one_configuration():
    graph = rnn(steps=3)
    result = optcnn(graph, get_preset("p100-1x4"), CostModel())
    cells = [op.name for op in graph.ops if op.kind == "lstm_cell"]
    assert len(cells) == 3 and len({result.strategy[c] for c in cells}) == 1
    assert result.layers == len(graph.ops) - 2


@pytest.mark.slow
@pytest.mark.parametrize("model", ["inception_v3", "resnet101"])
def test_cnns_reduce_completely_by_eliminations(model):
    # OptCNN sec. 5.2: real CNNs reduce to a trivial final graph; no enumeration is needed.
    result = optcnn(zoo(model), get_preset("p100-1x4"), CostModel())
    assert result.stats.final_variables == 0 and result.stats.wide_eliminations == 0
    assert result.stats.node_eliminations > 100
    assert result.tying == "parameters"
