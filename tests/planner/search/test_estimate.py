"""Task counts estimated without building match what the builder builds."""

import random

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import Strategy, block_config, data_parallel, random_config
from autopar.planner.search._estimate import change_tasks, estimate_tasks
from autopar.planner.sim.taskgraph import TaskGraphBuilder

from ._graphs import diamond, mlp, rnn

GRAPHS = {"mlp": mlp, "diamond": diamond, "rnn": rnn}


def _op_and_edge_tasks(builder, strategy):
    """Forward/backward tasks and the transfers of graph edges (keys of stage 0 and 1; rings,
    barriers and updates are stage 2 and up), a transfer counted once per link of its route
    (its parts: `TaskGraph.placements`)."""
    tg = builder.build(strategy)
    return sum(len(tg._res[i]) if type(tg._res[i]) is tuple else 1 for k, i in tg._id.items() if k[0] in (0, 1))


@pytest.mark.parametrize("name, preset", [("mlp", "p100-1x4"), ("diamond", "p100-2x2"), ("rnn", "k80-16x4")])
def test_the_estimate_counts_every_op_task_and_edge_transfer(name, preset):
    graph = GRAPHS[name]()
    b = TaskGraphBuilder(graph, get_preset(preset), CostModel())
    rng = random.Random(0)
    for k in range(6):
        draw = random_config if k % 2 else block_config
        s = Strategy.from_mapping(graph, {op.name: draw(op, b.num_devices, rng) for op in graph.ops})
        assert estimate_tasks(b, s) == _op_and_edge_tasks(b, s)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_a_change_builds_its_ops_and_every_edge_that_touches_them(name):
    graph = GRAPHS[name]()
    n = len(graph.ops)
    b = TaskGraphBuilder(graph, get_preset("p100-2x2"), CostModel())
    rng = random.Random(1)
    s = data_parallel(graph, 4)
    for _ in range(10):
        names = rng.sample([op.name for op in graph.ops], 2)
        changes = {m: random_config(graph[m], 4, rng) for m in names}
        new = s
        for m, c in changes.items():
            new = new.with_config(m, c)
        changed = {graph.index[m] for m in names}

        def rebuilt(k):
            if k[0] not in (0, 1):
                return False
            i = k[1] if k[0] == 0 else n - k[1]   # the consumer op of a transfer, or the op of a task
            if k[2] == 0:
                return i in changed
            producer = graph.index[graph.ops[i].inputs[k[3]].op]
            return i in changed or producer in changed

        tg = b.build(new)
        actual = sum(len(tg._res[i]) if type(tg._res[i]) is tuple else 1 for k, i in tg._id.items() if rebuilt(k))
        assert change_tasks(b, s, changes) == actual
