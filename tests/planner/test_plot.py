"""`--plot`: the timeline and the strategy picture are written as one PNG of bounded size."""

import pytest
from PIL import Image

from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import data_parallel, model_parallel, single_device
from autopar.planner.plot import (DPI, MAX_FIG_INCHES, MAX_GROUP_ROWS, _degree_summary, _grid, _layers,
                                  _module_groups, _occupancy, _per_op, plot_strategy)

from .search._graphs import rnn, zoo

MAX_PIXELS = (MAX_FIG_INCHES[0] * DPI, MAX_FIG_INCHES[1] * DPI)


@pytest.mark.parametrize("build", [data_parallel, model_parallel])
def test_a_plot_is_written_as_a_png(tmp_path, build):
    graph, topo = rnn(steps=3), get_preset("p100-1x4")
    path = plot_strategy(tmp_path / "plan.png", graph, topo, build(graph, 4))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]  # no temporary file left behind


def test_unrolled_steps_of_a_layer_share_one_row():
    graph = rnn(steps=3)
    rows, labels = _layers(graph)
    cell_rows = [r for r in rows if r[0].kind == "lstm_cell"]
    assert len(cell_rows) == 1 and len(cell_rows[0]) == 3
    assert any(label.endswith("×3") for label in labels)
    assert sum(len(r) for r in rows) == len(graph.ops)


def test_the_partition_grid_puts_the_sample_degree_down_and_the_rest_across():
    graph = rnn()
    cell = next(op for op in graph.ops if op.kind == "lstm_cell")  # dims (n, h)
    assert _grid(cell, (2, 2)) == (2, 2) and _grid(cell, (4, 1)) == (4, 1) and _grid(cell, (1, 4)) == (1, 4)


def test_inception_is_grouped_by_block_in_graph_order():
    graph = zoo("inception_v3")
    assert not _per_op(graph, _layers(graph)[0])  # 317 ops, 210 layers: too many for a square each
    groups = _module_groups(graph)
    keys = [key for key, _ in groups]
    assert len(groups) <= MAX_GROUP_ROWS < len(graph.ops)
    assert [op for _, ops in groups for op in ops] == list(graph.ops)  # every op once, in order
    assert {"Mixed_5b", "Mixed_6e", "Mixed_7c", "fc"} <= set(keys) and len(set(keys)) == len(keys)
    block = dict(groups)["Mixed_5b"]
    assert all(op.name.startswith("mixed_5b") or op.kind in ("concat", "pool") for op in block)
    assert block[-1].kind == "concat"  # the block's torch.cat joins the block, not a row of its own


def test_resnet_blocks_get_a_row_each_and_too_many_runs_are_merged():
    graph = zoo("resnet101")
    keys = [key for key, _ in _module_groups(graph)]
    assert "layer3.22" in keys and "layer3" not in keys  # the deepest module path that fits
    merged = _module_groups(graph, max_rows=5)
    assert len(merged) <= 5 and [op for _, ops in merged for op in ops] == list(graph.ops)
    assert any(" … " in key for key, _ in merged)


def test_a_groups_strip_shows_where_its_work_runs():
    graph = zoo("inception_v3")
    ops = dict(_module_groups(graph))["Mixed_5b"]
    assert _occupancy(ops, data_parallel(graph, 16), 16) == pytest.approx([1 / 16] * 16)
    assert _occupancy(ops, single_device(graph, 3), 16) == pytest.approx([0] * 3 + [1] + [0] * 12)
    assert _degree_summary(ops, data_parallel(graph, 16)) == f"n16 ({len(ops)})"
    assert _degree_summary(ops, single_device(graph, 0)) == f"whole ({len(ops)})"


def test_a_600_op_graph_gives_a_picture_of_bounded_size(tmp_path):
    graph, topo = zoo("inception_v3"), get_preset("p100-4x4")
    path = plot_strategy(tmp_path / "big.png", graph, topo, data_parallel(graph, 16))
    width, height = Image.open(path).size
    assert width <= MAX_PIXELS[0] and height <= MAX_PIXELS[1]  # it was 3748 x 8602 with a row per op


def test_a_small_graph_keeps_a_square_per_op(tmp_path):
    graph, topo = zoo("lenet"), get_preset("p100-4x4")
    rows, _ = _layers(graph)
    assert _per_op(graph, rows) and sum(len(r) for r in rows) == len(graph.ops)
    assert max(len(r) for r in rows) <= 2 and len(rows) >= len(graph.ops) - 3  # a row per layer, not per block
    path = plot_strategy(tmp_path / "small.png", graph, topo, data_parallel(graph, 16))
    width, height = Image.open(path).size
    assert width <= MAX_PIXELS[0] and height <= MAX_PIXELS[1]
