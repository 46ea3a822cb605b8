"""`--plot`: the strategy picture and the timeline are written as a PNG."""

import pytest

from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import data_parallel, model_parallel
from autopar.planner.plot import _grid, _layers, plot_strategy

from .search._graphs import rnn


@pytest.mark.parametrize("build", [data_parallel, model_parallel])
def test_a_plot_is_written_as_a_png(tmp_path, build):
    graph, topo = rnn(steps=3), get_preset("p100-1x4")
    path = plot_strategy(tmp_path / "plan.png", graph, topo, build(graph, 4))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


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
