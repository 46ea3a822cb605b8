"""Redistribution between two partitionings: every consumer task gets exactly its input box (halo
included) and gradients flow back as the adjoint — each producer receives the sum of what every
consumer task computed for its region.  All ranks are played in turn in one process."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.ir.graph import WHOLE, AxisMap, DimKind, Op, OperatorGraph, ParDim, TensorRef, TensorSpec, same
from autopar.planner.ir.regions import translate
from autopar.planner.ir.strategy import ParallelConfig, Strategy
from autopar.trainer.plan import ExecutionPlan
from autopar.trainer.redistribute import (GradAccumulator, RouteView, backward_accumulate, backward_sends,
                                          forward_inputs, forward_sends, shape_of)

N, C, L = 4, 2, 12


def _graph(kernel: int, stride: int, pad: int) -> OperatorGraph:
    x = Op("x", "input", (), (), (TensorSpec((N, C, L), ("n", "c", "l"), "float64"),),
           (ParDim("n", DimKind.SAMPLE, N), ParDim("c", DimKind.ATTRIBUTE, C), ParDim("l", DimKind.ATTRIBUTE, L)))
    lout = (L + 2 * pad - kernel) // stride + 1
    y = Op("y", "conv1d", (TensorRef("x"),), ((same("n"), WHOLE, AxisMap(dim="l", kernel=kernel, stride=stride, pad=pad)),),
           (TensorSpec((N, 3, lout), ("n", "c", "l"), "float64"),),
           (ParDim("n", DimKind.SAMPLE, N), ParDim("c", DimKind.ATTRIBUTE, 3), ParDim("l", DimKind.ATTRIBUTE, lout)))
    return OperatorGraph("halo", (x, y), N)


@st.composite
def _case(draw):
    kernel = draw(st.sampled_from([1, 2, 3, 5]))
    stride = draw(st.sampled_from([1, 2]))
    pad = draw(st.integers(0, kernel // 2))
    g = _graph(kernel, stride, pad)
    world = draw(st.integers(1, 4))
    cfgs = {}
    for op in g.ops:
        degrees = tuple(draw(st.sampled_from(p.allowed_degrees(4))) for p in op.pardims)
        k = 1
        for d in degrees:
            k *= d
        devices = tuple(draw(st.lists(st.integers(0, world - 1), min_size=k, max_size=k)))
        cfgs[op.name] = ParallelConfig(degrees, devices)
    return g, Strategy.from_mapping(g, cfgs), world


def _outputs(plan: ExecutionPlan, full: torch.Tensor) -> dict:
    op = plan.graph["x"]
    return {("x", t.index): [full[tuple(slice(a, b) for a, b in op.output_box(0, t.range_map))]]
            for t in plan.tasks["x"]}


@settings(max_examples=60, deadline=None)
@given(_case())
def test_every_consumer_task_receives_exactly_its_halo_box(case):
    g, strategy, world = case
    plan = ExecutionPlan(g, strategy, world)
    route = plan.routes["y"][0]
    full = torch.randn(N, C, L, dtype=torch.float64)
    outs = _outputs(plan, full)
    views = {r: RouteView(plan, route, r) for r in range(world)}
    mail = {(r, d): m for r in range(world) for d, m in forward_sends(views[r], outs).items()}
    y = g["y"]
    for r in range(world):
        got = forward_inputs(views[r], outs, {s: mail[(s, r)] for s in views[r].recv_sizes}, torch.float64)
        for t in plan.local_tasks("y", r):
            box = y.input_box(0, t.range_map, full.shape)
            assert torch.equal(got[t.index], full[tuple(slice(a, b) for a, b in box)])


@settings(max_examples=60, deadline=None)
@given(_case())
def test_gradients_flow_back_as_the_adjoint_of_the_forward_moves(case):
    g, strategy, world = case
    plan = ExecutionPlan(g, strategy, world)
    route = plan.routes["y"][0]
    y, x = g["y"], g["x"]
    grads, expected = {}, torch.zeros(N, C, L, dtype=torch.float64)
    for t in plan.tasks["y"]:
        box = y.input_box(0, t.range_map, (N, C, L))
        gr = torch.randn(shape_of(box), dtype=torch.float64)
        grads[("y", t.index)] = [gr]
        expected[tuple(slice(a, b) for a, b in box)] += gr
    accs = {("x", t.index): [GradAccumulator(shape_of(x.output_box(0, t.range_map)), torch.float64)]
            for t in plan.tasks["x"]}
    views = {r: RouteView(plan, route, r) for r in range(world)}
    mail = {}
    for r in range(world):
        for dst, m in backward_sends(views[r], grads, accs, torch.float64).items():
            mail[(r, dst)] = m
    for r in range(world):
        backward_accumulate(views[r], {d: mail[(d, r)] for d, _ in views[r].sends}, accs)
    for t in plan.tasks["x"]:
        box = x.output_box(0, t.range_map)
        assert torch.allclose(accs[("x", t.index)][0].get(), expected[tuple(slice(a, b) for a, b in box)],
                              rtol=0, atol=1e-12)


def test_a_piece_several_tasks_on_one_device_read_travels_once():
    # Producer whole on device 0; the consumer's 3 channel tasks on device 1 all read the whole input.
    g = _graph(3, 1, 1)
    strategy = Strategy.from_mapping(g, {"x": ParallelConfig((1, 1, 1), (0,)), "y": ParallelConfig((1, 3, 1), (1, 1, 1))})
    (move,) = ExecutionPlan(g, strategy, 2).routes["y"][0].moves
    assert (move.src, move.dst) == (0, 1)
    assert [(p.box, p.dst_tasks) for p in move.pieces] == [(((0, N), (0, C), (0, L)), (0, 1, 2))]


def test_overlapping_halo_windows_move_as_one_message_per_device_pair():
    g = _graph(3, 1, 1)
    strategy = Strategy.from_mapping(g, {"x": ParallelConfig((1, 1, 1), (0,)), "y": ParallelConfig((1, 1, 3), (1, 1, 1))})
    (move,) = ExecutionPlan(g, strategy, 2).routes["y"][0].moves
    # Windows [0,5), [3,9), [7,12) of the 3 length tasks: their halos overlap, each is its own piece.
    assert [p.box[2] for p in move.pieces] == [(0, 5), (3, 9), (7, 12)]


def test_accumulator_never_changes_a_borrowed_tensor():
    borrowed = torch.ones(2, 3, dtype=torch.float64)
    acc = GradAccumulator((2, 3), torch.float64)
    acc.add(None, borrowed)
    acc.add(translate(((0, 1), (0, 3)), ((0, 2), (0, 3))), torch.ones(1, 3, dtype=torch.float64))
    assert torch.equal(borrowed, torch.ones(2, 3, dtype=torch.float64))
    assert acc.get()[0].tolist() == [2.0, 2.0, 2.0] and acc.get()[1].tolist() == [1.0, 1.0, 1.0]


def test_a_task_that_reads_a_strided_cut_of_a_local_output_whole_gets_a_contiguous_copy():
    """An op runs on one run of memory, as it was profiled: a consumer task whose whole input box
    is a cut of a local producer's output that is not one gets a copy; a cut that is one run (a
    block of samples) is passed as it is."""
    g = _graph(1, 1, 0)
    full = torch.randn(N, C, L, dtype=torch.float64)
    for ydeg, strided in (((1, 1, 2), True), ((2, 1, 1), False)):
        strategy = Strategy.from_mapping(g, {"x": ParallelConfig((1, 1, 1), (0,)), "y": ParallelConfig(ydeg, (0, 0))})
        plan = ExecutionPlan(g, strategy, 1)
        view = RouteView(plan, plan.routes["y"][0], 0)
        outs = _outputs(plan, full)
        got = forward_inputs(view, outs, {}, torch.float64)
        for t in plan.local_tasks("y", 0):
            box = g["y"].input_box(0, t.range_map, full.shape)
            assert torch.equal(got[t.index], full[tuple(slice(a, b) for a, b in box)])
            assert got[t.index].is_contiguous()
            shares = got[t.index].untyped_storage().data_ptr() == outs[("x", 0)][0].untyped_storage().data_ptr()
            assert shares != strided, f"y split {ydeg}: the input should {'not ' if strided else ''}be a view"
