"""FlexFlow Figure 5: a three-layer RNN (embedding, recurrent, linear layer) under model
parallelism — each layer on its own GPU — simulated with costs chosen so that the whole
timeline can be written out by hand.

Two unrolled steps.  Every forward task takes 1 s, every backward task 2 s, every update 0.5 s;
every activation is 128 bytes over a 256 B/s link, so every transfer takes 0.5 s.
"""

from __future__ import annotations

import pytest

from autopar.planner.cost.model import Estimate
from autopar.planner.hardware.topology import Device, DeviceTopology, Link
from autopar.planner.ir.graph import WHOLE, DimKind, Op, OperatorGraph, ParamSpec, ParDim, TensorRef, TensorSpec, same
from autopar.planner.ir.strategy import ParallelConfig, Strategy
from autopar.planner.sim._plans import bwd_key, fwd_key
from autopar.planner.sim.simulator import simulate
from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder


class FixedCost:
    def task_cost(self, op, degrees, device, input_shapes=()):
        return Estimate(1.0, 2.0, "fixed")

    def update_time(self, param_bytes, device, optimizer=None):
        return 0.5


def _op(name, inputs, param):
    act = TensorSpec((4, 8), ("n", "c"))
    return Op(name=name, kind="linear", inputs=tuple(TensorRef(i) for i in inputs),
              input_maps=tuple((same("n"), WHOLE) for _ in inputs), outputs=(act,),
              pardims=(ParDim("n", DimKind.SAMPLE, 4),),
              params=(ParamSpec(param, (8, 8), (8, 8), (WHOLE, WHOLE)),))


def rnn_graph() -> OperatorGraph:
    ops = [_op("e1", [], "emb"), _op("e2", [], "emb"),
           _op("r1", ["e1"], "rnn"), _op("r2", ["e2", "r1"], "rnn"),
           _op("o1", ["r1"], "out"), _op("o2", ["r2"], "out")]
    return OperatorGraph("figure5-rnn", tuple(ops), batch_size=4)


def three_gpus() -> DeviceTopology:
    devs = tuple(Device(i, f"gpu{i}", "node0", "test-gpu", peak_flops=1e12, mem_bandwidth=1e11, memory=2**30)
                 for i in range(3))
    links = tuple(Link(f"gpu{a}", f"gpu{b}", "nvlink", 256.0) for a in range(3) for b in range(3) if a != b)
    return DeviceTopology("three-gpus", devs, links)


def model_parallel(graph) -> Strategy:
    gpu = {"e": 0, "r": 1, "o": 2}
    return Strategy.from_mapping(graph, {op.name: ParallelConfig((1,), (gpu[op.name[0]],)) for op in graph.ops})


# (op index, forward start, forward end, backward start, backward end), worked out by hand:
#  GPU0: e1 0-1, e2 1-2;   link 0->1: e1 1-1.5, e2 2-2.5
#  GPU1: r1 1.5-2.5, r2 2.5-3.5;   link 1->2: r1 2.5-3, r2 3.5-4
#  GPU2: o1 3-4, o2 4-5 (a forward task ready at 4 goes before o1's backward, also ready at 4),
#        o1' 5-7, o2' 7-9;   link 2->1: 7-7.5, 9-9.5
#  GPU1: r2' 9.5-11.5 (needs o2's gradient), r1' 11.5-13.5 (needs r2' and o1's gradient)
#  link 1->0: r2' 11.5-12, r1' 13.5-14;   GPU0: e2' 12-14, e1' 14-16
EXPECTED = {
    "e1": (0, 1, 14, 16), "e2": (1, 2, 12, 14),
    "r1": (1.5, 2.5, 11.5, 13.5), "r2": (2.5, 3.5, 9.5, 11.5),
    "o1": (3, 4, 5, 7), "o2": (4, 5, 7, 9),
}
# Updates run when every backward task that uses the parameter is done.
EXPECTED_UPDATES = {"emb": (16, 16.5), "rnn": (13.5, 14), "out": (9, 9.5)}


def test_figure5_model_parallel_timeline_matches_hand_computation():
    graph = rnn_graph()
    builder = TaskGraphBuilder(graph, three_gpus(), FixedCost())
    tg = builder.build(model_parallel(graph))
    tl = simulate(tg)
    n = len(graph.ops)
    for i, op in enumerate(graph.ops):
        fs, fe, bs, be = EXPECTED[op.name]
        assert (tl.start[fwd_key(i, 0)], tl.end[fwd_key(i, 0)]) == (fs, fe), op.name
        assert (tl.start[bwd_key(n, i, 0)], tl.end[bwd_key(n, i, 0)]) == (bs, be), op.name
    # Parameters are numbered in order of first use (emb 0, rnn 1, out 2); update keys are
    # (3, parameter, device) and each parameter lives on the GPU of its layer.
    for pi, (name, (s, e)) in enumerate(EXPECTED_UPDATES.items()):
        key = (3, pi, pi)
        assert (tl.start[key], tl.end[key]) == (s, e), name
    assert tl.makespan == 16.5
    # 6 ops x (forward + backward) + 4 transfers each way + 3 updates
    assert len(tg) == 12 + 8 + 3


def test_figure5_delta_after_moving_r1_to_gpu0_equals_full():
    graph = rnn_graph()
    builder = TaskGraphBuilder(graph, three_gpus(), FixedCost())
    session = DeltaSession(builder, model_parallel(graph))
    assert session.step_time == 16.5
    new = session.change("r1", ParallelConfig((1,), (0,)))
    full = simulate(builder.build(session.strategy))
    assert session.timeline().same_as(full)
    assert new == full.makespan


@pytest.mark.parametrize("degree", [2, 4])
def test_figure5_data_parallel_has_one_sync_group_per_parameter(degree):
    graph = rnn_graph()
    topo = three_gpus()
    builder = TaskGraphBuilder(graph, topo, FixedCost())
    devs = tuple(range(degree)) if degree <= 3 else (0, 1, 2, 0)
    strat = Strategy.from_mapping(graph, {op.name: ParallelConfig((degree,), devs) for op in graph.ops})
    groups = builder.sync_groups(strat, "rnn")
    assert groups == [(tuple(sorted(set(devs))), 8 * 8 * 4)]
