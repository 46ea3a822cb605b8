"""The layer-blocks start (FlexFlow sec. 8.5): recurrent layers side by side, their neighbours
with them, the heavy softmax split by channel on the first layer's block."""

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.graph import DimKind
from autopar.planner.ir.strategy import ParallelConfig, Strategy, data_parallel
from autopar.planner.search.layer_blocks import layer_blocks, recurrent_layers
from autopar.planner.sim.evaluate import simulate_strategy
from autopar.planner.sim.taskgraph import TaskGraphBuilder

from ._graphs import zoo


def _nmt():
    return zoo("nmt", batch=16, src_len=3, tgt_len=3, src_vocab=4096, tgt_vocab=4096, embed=64, hidden=64)


def _block_of(cfg):
    return {d // 4 for d in cfg.devices}


def test_recurrent_layers_are_the_unrolled_lstm_layers_in_graph_order():
    graph = _nmt()
    layers = recurrent_layers(graph)
    assert [graph[m[0]].kind for m in layers] == ["lstm_cell"] * 4
    assert all(len(m) == 3 for m in layers)  # three steps each
    assert [graph.index[m[0]] for m in layers] == sorted(graph.index[m[0]] for m in layers)


def test_each_recurrent_layer_gets_a_node_of_its_own():
    graph, topo = _nmt(), get_preset("p100-4x4")
    s = layer_blocks(graph, topo, data_parallel(graph, 16))
    nodes = []
    for members in recurrent_layers(graph):
        cfgs = {s[m] for m in members}
        assert len(cfgs) == 1 and cfgs.pop().devices == tuple(range(4 * len(nodes), 4 * len(nodes) + 4))
        nodes.append(len(nodes))


def test_the_embedding_and_its_slices_go_to_the_node_of_the_layer_they_feed():
    graph, topo = _nmt(), get_preset("p100-4x4")
    s = layer_blocks(graph, topo, data_parallel(graph, 16))
    first_layer_node = _block_of(s[recurrent_layers(graph)[0][0]])
    emb = graph["src_embedding"]
    assert _block_of(s[emb.name]) == first_layer_node
    # Parameter-heavy and light (FlexFlow 8.5, first insight): split by its embedding dim there.
    e = next(i for i, p in enumerate(emb.pardims) if p.kind is DimKind.PARAMETER)
    assert s[emb.name].degrees[e] == 4 and s[emb.name].num_tasks == 4
    slices = [c for c, _, _ in graph.consumers[emb.name]]
    assert slices and all(s[c] == s[emb.name] or _block_of(s[c]) == first_layer_node for c in slices)


def test_the_softmax_projection_is_split_by_channel_on_the_first_node_with_the_loss():
    graph, topo = _nmt(), get_preset("p100-4x4")
    s = layer_blocks(graph, topo, data_parallel(graph, 16))
    gens = [op for op in graph.ops if op.name.startswith("generator")]
    assert gens
    for op in gens:
        cfg = s[op.name]
        degrees = dict(zip((p.kind for p in op.pardims), cfg.degrees))
        assert degrees[DimKind.SAMPLE] == 1 and degrees[DimKind.PARAMETER] == 4  # no replica to synchronize
        assert cfg.devices == (0, 1, 2, 3)
    assert _block_of(s["loss"]) == {0}


def test_without_neighbours_only_the_recurrent_layers_move():
    graph, topo = _nmt(), get_preset("p100-4x4")
    base = data_parallel(graph, 16)
    s = layer_blocks(graph, topo, base, neighbours=False)
    in_layers = {m for members in recurrent_layers(graph) for m in members}
    assert all(s[op.name] == base[op.name] for op in graph.ops if op.name not in in_layers)
    assert all(s[m] != base[m] for m in in_layers)


def test_a_graph_without_two_recurrent_layers_has_no_layer_blocks():
    topo = get_preset("p100-4x4")
    assert layer_blocks(zoo("lenet"), topo, data_parallel(zoo("lenet"), 16)) is None


def test_two_layers_to_a_block_take_the_blocks_in_turn_with_the_steps_scaled_to_the_block():
    """On one node of four GPUs: encoder layers 1 and 2 (and decoder layers 1 and 2) run side by
    side on GPUs 0-1 and 2-3; OptCNN-like 2 x 2 steps become 1 x 2 (hidden split in two)."""
    graph, topo = _nmt(), get_preset("p100-1x4")
    base = data_parallel(graph, 4)
    cfgs = dict(base.items())
    for members in recurrent_layers(graph):
        for m in members:
            h = next(i for i, p in enumerate(graph[m].pardims) if p.kind is DimKind.PARAMETER)
            cfgs[m] = ParallelConfig(tuple(2 for _ in graph[m].pardims), (0, 1, 2, 3))
    s = layer_blocks(graph, topo, Strategy.from_mapping(graph, cfgs), neighbours=False, share=2)
    blocks = []
    for members in recurrent_layers(graph):
        cfgs_ = {s[m] for m in members}
        assert len(cfgs_) == 1
        cfg = cfgs_.pop()
        assert cfg.num_tasks == 2 and cfg.degrees[h] == 2  # the largest degree halved: hidden stays split
        blocks.append(cfg.devices)
    assert blocks == [(0, 1), (2, 3), (0, 1), (2, 3)]
    assert layer_blocks(graph, topo, base, share=4) is None  # one block of all four: no layers side by side


def test_the_plan_starts_from_the_fastest_layer_block_strategy():
    from autopar.planner.search.plan import _layer_blocks
    graph, topo = _nmt(), get_preset("p100-4x4")
    b = TaskGraphBuilder(graph, topo, CostModel())
    base = data_parallel(graph, 16)
    times = {(nb, share): simulate_strategy(b, layer_blocks(graph, topo, base, neighbours=nb, share=share))[0].step_time
             for nb, share in ((True, 1), (False, 1), (False, 2))}
    sessions = {}
    cand = _layer_blocks(b, base, sessions, None)
    assert cand.step_time == pytest.approx(min(times.values()), rel=1e-12)
    assert sessions["layer-blocks"][0].strategy.configs == cand.strategy.configs
