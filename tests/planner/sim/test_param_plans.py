"""A parameter's plan is a core (sync groups, rings, updates) shared by every strategy whose
users hold the same cells, plus one feed of edges per user; a change of one user's
configuration edits that user's feed only."""

from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

import autopar.planner.sim.taskgraph as taskgraph_module
from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.fx_import import import_spec
from autopar.planner.ir.regions import maximal, union_volume
from autopar.planner.ir.strategy import ParallelConfig, data_parallel, random_config
from autopar.planner.sim._plans import _sync_groups
from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder
from autopar.planner.zoo import get_model

from .test_delta_session_diff import content


@st.composite
def _held(draw):
    size = draw(st.sampled_from([4, 8]))
    out = {}
    for dev in range(draw(st.integers(1, 4))):
        boxes = []
        for _ in range(draw(st.integers(1, 3))):
            rows = draw(st.sampled_from([1, 2, 4]))
            i = draw(st.integers(0, rows - 1))
            cols = draw(st.sampled_from([1, 2]))
            j = draw(st.integers(0, cols - 1))
            boxes.append(((i * size // rows, (i + 1) * size // rows), (j * 6 // cols, (j + 1) * 6 // cols)))
        out[dev] = boxes
    return size, out


@settings(max_examples=200, deadline=None)
@given(_held())
def test_dropping_contained_boxes_changes_no_sync_group_and_no_update(case):
    size, held = case
    spec = SimpleNamespace(shape=(size, 6), nbytes=4 * size * 6)  # what `_sync_groups` reads
    kept = {d: maximal(bs) for d, bs in held.items()}
    assert _sync_groups(kept, spec) == _sync_groups({d: sorted(set(bs)) for d, bs in held.items()}, spec)
    for d, bs in held.items():
        assert union_volume(kept[d]) == union_volume(sorted(set(bs)))
        assert all(not (a != b and all(alo <= blo and bhi <= ahi for (alo, ahi), (blo, bhi) in zip(a, b)))
                   for a in kept[d] for b in kept[d])


def _rnnlm(topology: str = "k80-2x2"):
    graph = import_spec(get_model("rnnlm", batch=8, vocab=64, embed=16, hidden=16, layers=2, steps=6))
    topo = get_preset(topology)
    return graph, topo, TaskGraphBuilder(graph, topo, CostModel().bind(graph))


def test_plans_of_a_shared_parameter_share_the_core_and_the_unchanged_feeds():
    graph, topo, b = _rnnlm()
    dp = data_parallel(graph, topo.num_devices)
    param = next(p for p, users in graph.param_users.items() if len(users) > 2)
    users = graph.param_users[param]
    # Split the second user's hidden (parameter) dimension: its devices then read shards of the weight they
    # also hold whole for the other users — the same cells, so the same core.
    op = graph[users[1]]
    degrees = tuple(2 if p.kind.value == "parameter" else 1 for p in op.pardims)
    assert degrees.count(2) == 1, op.pardims
    changed = dp.with_config(op.name, ParallelConfig(degrees, (0, 1)))
    p0, p1 = b._param_plan(dp, param), b._param_plan(changed, param)
    (core0, feeds0), (core1, feeds1) = p0[3], p1[3]
    assert core0 is core1
    assert [f0 is f1 for f0, f1 in zip(feeds0, feeds1)] == [k != 1 for k in range(len(users))]
    # The plan is its core plus every feed: one edge per backward task per ring it joins.
    assert p1[1] == core1[1] + [e for f in feeds1 for e in f]
    assert len(feeds1[1]) == 2 and {e[0] for e in feeds1[1]} == {(1, b.num_ops - graph.index[op.name], 0, t)
                                                                  for t in range(2)}
    # A user on devices no other user is on: new holders, a new core.
    two = data_parallel(graph, 2)
    wider = two.with_config(users[0], data_parallel(graph, 4)[users[0]])
    assert b._param_plan(wider, param)[3][0] is not b._param_plan(two, param)[3][0]


def test_a_one_user_change_edits_its_feed_and_the_graph_stays_what_a_fresh_build_gives(monkeypatch):
    graph, topo, b = _rnnlm()
    session = DeltaSession(b, data_parallel(graph, topo.num_devices))
    shared = {p for p, users in graph.param_users.items() if len(users) > 1}
    fast = []
    real = taskgraph_module._diff

    def spy(old, new):
        d = real(old, new)
        if len(old) > 3 and old[3][0] is new[3][0]:
            fast.append(sum(f0 is not f1 for f0, f1 in zip(old[3][1], new[3][1])))
            assert d[0] == d[1] == d[2] == []  # no task of the group changes, no kept edge loses an end
        return d

    monkeypatch.setattr(taskgraph_module, "_diff", spy)
    rng = random.Random(5)
    users = [u for p in shared for u in graph.param_users[p]]
    for step in range(30):
        name = rng.choice(users)
        old = session.strategy[name]
        session.change(name, random_config(graph[name], topo.num_devices, rng))
        assert content(session.sim.graph) == content(b.build(session.strategy)), f"change {step} ({name})"
        session.sim._last_journal = None  # no rollback: taking it back is a change by difference too
        session.change(name, old)
        assert content(session.sim.graph) == content(b.build(session.strategy)), f"undo {step} ({name})"
    assert fast and set(fast) == {1}, fast  # one feed per changed user, the core kept
