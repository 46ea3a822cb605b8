"""Expert strategies (FlexFlow 8.2.1) and the placement-only space, as named strategies."""

import random

import pytest

from autopar.planner.errors import StrategyError
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.graph import DimKind
from autopar.planner.search import list_named, named_strategy
from autopar.planner.search.experts import PlacementSpace, expert_cnn, expert_rnn, layer_depths

from ._graphs import mlp, rnn, zoo


def test_every_baseline_is_a_named_strategy():
    assert {"data-parallel", "model-parallel", "expert", "expert-cnn", "expert-rnn", "placement",
            "optcnn"} <= set(list_named())


def test_one_weird_trick_is_data_parallel_before_the_dense_layers_and_model_parallel_in_them():
    graph, topo = zoo("alexnet"), get_preset("p100-1x4")
    s = expert_cnn(graph, topo)
    dense = False
    for op in graph.ops:
        cfg = s[op.name]
        if op.kind == "linear":
            dense = True
            param = next(i for i, p in enumerate(op.pardims) if p.kind is DimKind.PARAMETER)
            assert cfg.degrees[param] == 4 and cfg.num_tasks == 4
        elif not dense and op.kind in ("conv2d", "pool"):
            sample = next(i for i, p in enumerate(op.pardims) if p.kind is DimKind.SAMPLE)
            assert cfg.degrees[sample] == 4 and cfg.num_tasks == 4
    # The ReLU between two dense layers keeps the features split, on the same devices.
    relu = next(op for op in graph.ops if op.kind == "elementwise" and op.inputs[0].op.startswith("classifier"))
    assert s[relu.name] == s[relu.inputs[0].op]


def test_the_rnn_expert_is_data_parallel_across_nodes_and_one_depth_per_gpu():
    graph, topo = rnn(batch=8, steps=3), get_preset("p100-2x4")
    s = expert_rnn(graph, topo)
    depth = layer_depths(graph)
    for op in graph.ops:
        cfg = s[op.name]
        gpu = max(depth[op.name] - 1, 0) % 4
        assert cfg.devices == (gpu, 4 + gpu), op.name  # one replica per node, same GPU index
    cells = [op.name for op in graph.ops if op.kind == "lstm_cell"]
    assert len({depth[c] for c in cells}) == 1  # the unrolled steps of a layer share a depth


def test_stacked_lstm_layers_get_increasing_depths():
    graph = zoo("rnntc", steps=2, hidden=8, embed=8, vocab=16)
    depth = layer_depths(graph)
    per_layer = {}
    for op in graph.ops:
        if op.kind == "lstm_cell":
            per_layer.setdefault(op.params[0].name, set()).add(depth[op.name])
    depths = [d.pop() for d in per_layer.values()]
    assert depths == sorted(depths) and len(set(depths)) == 4


@pytest.mark.parametrize("name,graph", [("expert-cnn", mlp), ("expert-rnn", mlp), ("expert", mlp)])
def test_an_expert_strategy_that_does_not_apply_is_refused(name, graph):
    with pytest.raises(StrategyError, match="does not apply|no expert-designed strategy"):
        named_strategy(name, graph(), get_preset("p100-1x4"))


def test_the_placement_space_keeps_every_op_whole_on_one_device():
    space, rng = PlacementSpace(4), random.Random(0)
    graph = mlp()
    for op in graph.ops:
        cfg = space.random(op, rng)
        assert cfg.num_tasks == 1 and all(d == 1 for d in cfg.degrees) and 0 <= cfg.devices[0] < 4
    s = named_strategy("placement", graph, get_preset("p100-1x4"))
    assert all(space.contains(op, s[op.name]) for op in graph.ops)

