"""`DeltaSession` edits a changed op's edge and parameter groups by the difference between their
old and new plans: the task graph it ends with is exactly the one a fresh build of the strategy
gives — same tasks (key, resources, durations, kind, bytes, label) and same edges."""

from __future__ import annotations

import random

import pytest

import autopar.planner.sim.taskgraph as taskgraph_module
from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.fx_import import import_spec
from autopar.planner.ir.strategy import data_parallel, random_config
from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder, _diff, _removed_keys, _stale_edges
from autopar.planner.zoo import get_model


def content(g) -> tuple[dict, set]:
    """Tasks by key with everything about them, and edges by keys."""
    tasks = {k: (g._res[i], g._dur[i], g._kind[i], g._nbytes[i], g._label[i]) for k, i in g._id.items()}
    key = g._key
    edges = {(key[i], key[j]) for i in g._id.values() for j in g._succ[i]}
    return tasks, edges


def test_a_plan_difference_keeps_identical_tasks_and_sorts_the_edges():
    a, b, c, d = (0, 1), (0, 2), (0, 3), (0, 4)
    old = ([(a, 0, 1.0, "x", 0.0, ""), (b, 1, 1.0, "x", 0.0, ""), (c, 2, 1.0, "x", 0.0, "")],
           [(a, b), (b, c)], (a, b, c))
    new = ([(a, 0, 1.0, "x", 0.0, ""), (b, 1, 2.0, "x", 0.0, ""), (d, 3, 1.0, "x", 0.0, "")],
           [(a, b), (a, d)], (a, b, d))
    remove, add, both, only_old, only_new = _diff(old, new)
    assert remove == [b, c]                       # b's duration changed: replaced
    assert add == [new[0][1], new[0][2]]
    assert both == [(a, b)] and only_old == [(b, c)] and only_new == [(a, d)]
    # (b, c) loses both ends, so it cannot survive; an edge between two kept tasks would.
    assert not _stale_edges(only_old, {b, c})
    assert _stale_edges([(a, (9,))], {b, c})
    # Plans with no task in common are replaced whole.
    assert _diff(old, ([(d, 3, 1.0, "x", 0.0, "")], [], (d,))) is None
    owned = {("op", 0): old, ("param", "w"): old}
    assert _removed_keys(owned, {("op", 0): new, ("param", "w"): new}, {("param", "w"): _diff(old, new)}) == {a, b, c}


@pytest.mark.parametrize("model, options, topology", [
    ("rnnlm", dict(batch=8, vocab=64, embed=16, hidden=16, layers=2, steps=6), "k80-2x2"),
    ("nmt", dict(batch=8, src_vocab=64, tgt_vocab=64, embed=16, hidden=16, layers=2, src_len=4, tgt_len=4),
     "p100-1x4"),
    ("inception_v3", dict(batch=4, image=75, classes=10), "k80-2x2"),
])
def test_a_session_edited_by_differences_holds_the_graph_a_fresh_build_gives(model, options, topology, monkeypatch):
    graph = import_spec(get_model(model, **options))
    topo = get_preset(topology)
    builder = TaskGraphBuilder(graph, topo, CostModel().bind(graph))
    session = DeltaSession(builder, data_parallel(graph, topo.num_devices))
    used = []
    real = taskgraph_module._diff

    def spy(old, new):
        d = real(old, new)
        used.append(d is not None)
        return d

    monkeypatch.setattr(taskgraph_module, "_diff", spy)
    rng = random.Random(3)
    for step in range(40):
        op = rng.choice(graph.ops)
        old = session.strategy[op.name]
        session.change(op.name, random_config(op, topo.num_devices, rng))
        assert content(session.sim.graph) == content(builder.build(session.strategy)), f"change {step} ({op.name})"
        if rng.random() < 0.3:
            session.sim._last_journal = None  # no rollback: the old plans come back by difference too
            session.change(op.name, old)
            assert content(session.sim.graph) == content(builder.build(session.strategy)), f"undo {step}"
    assert any(used), "no group was edited by its difference"
