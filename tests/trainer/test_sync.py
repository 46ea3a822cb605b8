"""Which gradient cells are all-reduced among which devices, and in which buckets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.ir.graph import WHOLE, DimKind, Op, OperatorGraph, ParamSpec, ParDim, TensorRef, TensorSpec, same
from autopar.planner.ir.regions import cells, intersect, volume
from autopar.planner.ir.strategy import ParallelConfig, Strategy
from autopar.trainer.plan import ExecutionPlan
from autopar.trainer.sync import plan_buckets


@st.composite
def _holdings(draw):
    size = draw(st.sampled_from([4, 6, 8]))
    out = {}
    for dev in range(draw(st.integers(1, 4))):
        boxes = set()
        for _ in range(draw(st.integers(1, 2))):
            d = draw(st.sampled_from([k for k in (1, 2, size // 2, size) if size % k == 0]))
            i = draw(st.integers(0, d - 1))
            boxes.add(((i * size // d, (i + 1) * size // d), (0, 3)))
        out[dev] = tuple(sorted(boxes))
    return out


@settings(max_examples=100, deadline=None)
@given(_holdings())
def test_cells_tile_the_union_and_name_exactly_their_holders(held):
    cs = cells(held)
    for a in range(len(cs)):
        for b in range(a + 1, len(cs)):
            assert intersect(cs[a][0], cs[b][0]) is None
    union = {(r, c) for bs in held.values() for b in bs for r in range(*b[0]) for c in range(*b[1])}
    assert sum(volume(c) for c, _ in cs) == len(union)
    for cell, holders in cs:
        r, c = cell[0][0], cell[1][0]
        assert holders == tuple(d for d, bs in sorted(held.items())
                                if any(lo <= r < hi and clo <= c < chi for (lo, hi), (clo, chi) in bs))


def test_a_replicated_parameter_is_one_cell():
    held = {0: (((0, 8), (0, 3)),), 1: (((0, 4), (0, 3)), ((4, 8), (0, 3)))}
    assert cells(held) == [(((0, 8), (0, 3)), (0, 1))]


def _shared_graph() -> OperatorGraph:
    """Two linear ops sharing one weight (an unrolled step), then a third with its own."""
    x = Op("x", "input", (), (), (TensorSpec((4, 6), ("n", "f")),), (ParDim("n", DimKind.SAMPLE, 4),))

    def lin(name, src, w):
        return Op(name, "linear", (TensorRef(src),), ((same("n"), WHOLE),), (TensorSpec((4, 6), ("n", "f")),),
                  (ParDim("n", DimKind.SAMPLE, 4), ParDim("f", DimKind.PARAMETER, 6)),
                  (ParamSpec(w, (6, 6), (6, 6), (same("f"), WHOLE)),))
    return OperatorGraph("shared", (x, lin("a", "x", "w"), lin("b", "a", "w"), lin("c", "b", "v")), 4)


def test_shared_parameters_are_synchronized_once_after_their_first_user():
    g = _shared_graph()
    s = Strategy.from_mapping(g, {"x": ParallelConfig((2,), (0, 1)), "a": ParallelConfig((2, 1), (0, 1)),
                                  "b": ParallelConfig((1, 2), (0, 1)), "c": ParallelConfig((2, 1), (0, 1))})
    plan = ExecutionPlan(g, s, 2)
    buckets = plan_buckets(plan, bucket_bytes=1 << 30)
    entries = [(b.devices, e.param, e.box) for b in buckets for e in b.entries]
    # w: op a holds it whole on both devices, op b half on each -> all cells on both: one cell.
    assert [(d, p) for d, p, _ in entries] == [((0, 1), "v"), ((0, 1), "w")]
    assert plan.param_ready_index == {"w": 1, "v": 3}


def test_a_parameter_split_over_its_devices_needs_no_synchronization():
    g = _shared_graph()
    s = Strategy.from_mapping(g, {"x": ParallelConfig((2,), (0, 1)), "a": ParallelConfig((1, 2), (0, 1)),
                                  "b": ParallelConfig((1, 2), (0, 1)), "c": ParallelConfig((1, 2), (1, 0))})
    assert plan_buckets(ExecutionPlan(g, s, 2)) == []


def test_full_buckets_leave_at_the_op_that_fills_them():
    g = _shared_graph()
    s = Strategy.from_mapping(g, {op.name: ParallelConfig((2,) + (1,) * (len(op.pardims) - 1), (0, 1)) for op in g.ops})
    buckets = plan_buckets(ExecutionPlan(g, s, 2), bucket_bytes=100)
    assert [(b.after_op, [e.param for e in b.entries]) for b in buckets] == [(3, ["v"]), (1, ["w"])]


def test_a_bucket_that_never_fills_leaves_when_its_last_cell_is_final_and_in_that_order():
    """The trainer's gradient hooks issue a bucket as soon as all its cells are final, full or not
    (`GradSync`): v (op c, devices 1 and 2) is final after op c's backward, long before w (ops a
    and b, devices 0 and 1), so its bucket goes first, whatever the device sets' order."""
    g = _shared_graph()
    s = Strategy.from_mapping(g, {"x": ParallelConfig((2,), (0, 1)), "a": ParallelConfig((2, 1), (0, 1)),
                                  "b": ParallelConfig((2, 1), (0, 1)), "c": ParallelConfig((2, 1), (1, 2))})
    buckets = plan_buckets(ExecutionPlan(g, s, 3), bucket_bytes=1 << 30)
    assert [(b.devices, b.after_op, [e.param for e in b.entries]) for b in buckets] == [
        ((1, 2), 3, ["v"]), ((0, 1), 1, ["w"])]
