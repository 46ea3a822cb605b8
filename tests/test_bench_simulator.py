"""`autopar bench simulator`: rows of the documented shape, delta agreeing with full simulation."""

import pytest

from autopar import bench_simulator
from autopar.bench_simulator import bench_row


def test_a_row_compares_delta_with_full_simulation_and_agrees():
    row = bench_row("lenet", "p100-2x2", moves=6, fulls=2, seed=0)
    assert {"model", "topology", "devices", "tasks", "full_ms", "delta_ms", "speedup", "agree"} <= set(row)
    assert row["agree"] is True and row["devices"] == 4 and row["tasks"] > 0
    assert row["changes"] == 12 and row["full_samples"] == 2 and row["redrawn_too_big"] == 0
    assert row["speedup"] == pytest.approx(row["full_ms"] / row["delta_ms"], rel=0.01)


def test_changes_mcmc_would_not_build_are_redrawn_unless_all_are_asked_for(monkeypatch):
    monkeypatch.setattr(bench_simulator, "MAX_CHANGE_RATIO", 1e-9)
    monkeypatch.setattr(bench_simulator, "MAX_REDRAWS", 3)
    row = bench_row("lenet", "p100-2x2", moves=2, fulls=1, seed=0)
    assert row["redrawn_too_big"] == 6 and row["changes"] == 4 and row["agree"] is True
    assert bench_row("lenet", "p100-2x2", moves=2, fulls=1, seed=0, all_changes=True)["redrawn_too_big"] == 0


def test_the_timed_full_build_does_not_find_what_the_change_just_memoized():
    from autopar.planner.cost.model import CostModel
    from autopar.planner.hardware.presets import get_preset
    from autopar.planner.ir.strategy import ParallelConfig, data_parallel
    from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder

    from tests.planner.search._graphs import mlp
    graph = mlp()
    b = TaskGraphBuilder(graph, get_preset("p100-1x4"), CostModel())
    session = DeltaSession(b, data_parallel(graph, 4))
    before = bench_simulator._memo_keys(b)
    op = graph.ops[1]
    session.change(op.name, ParallelConfig((1,) * (len(op.pardims) - 1) + (2,), (2, 3)))
    assert bench_simulator._memo_keys(b)[0] > before[0]  # the change memoized its groups
    bench_simulator._forget_since(b, before)
    assert bench_simulator._memo_keys(b) == before


def test_both_paths_are_timed_in_the_garbage_collection_regime_of_a_search(monkeypatch):
    from autopar.planner.sim import gc_regime
    from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder

    frozen: dict[str, set] = {"full": set(), "delta": set()}
    build, change = TaskGraphBuilder.build, DeltaSession.change

    def spy_build(self, *args, **kw):
        frozen["full"].add(gc_regime._frozen_depth > 0)
        return build(self, *args, **kw)

    def spy_change(self, *args, **kw):
        frozen["delta"].add(gc_regime._frozen_depth > 0)
        return change(self, *args, **kw)

    monkeypatch.setattr(TaskGraphBuilder, "build", spy_build)
    monkeypatch.setattr(DeltaSession, "change", spy_change)
    assert bench_row("lenet", "p100-2x2", moves=4, fulls=2, seed=0)["agree"] is True
    assert frozen == {"full": {True}, "delta": {True}}
