"""The planner never returns a strategy slower than a baseline it evaluated, and fits in memory."""

from dataclasses import replace

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.errors import OutOfMemoryError
from autopar.planner.hardware.presets import get_preset
from autopar.planner.search.plan import plan
from autopar.planner.sim.evaluate import simulate_strategy
from autopar.planner.sim.taskgraph import TaskGraphBuilder
from autopar.planner.sim.trainer_model import loss_allreduce_s

from ._graphs import diamond, mlp, rnn

GRAPHS = {"mlp": mlp, "diamond": diamond, "rnn": rnn}


@pytest.fixture(scope="module", params=list(GRAPHS))
def planned(request):
    graph = GRAPHS[request.param]()
    topo = get_preset("p100-1x4")
    return graph, topo, plan(graph, topo, CostModel(), budget_s=1e9, placement_budget_s=1e9, max_proposals=60, seed=1)


def test_the_plan_is_never_slower_than_any_candidate_it_evaluated(planned):
    _, _, r = planned
    times = [c.step_time for k, c in r.candidates.items() if k != "mcmc" and c.step_time is not None and c.fits]
    assert times and r.step_time <= min(times)
    assert r.candidates["mcmc"].step_time == r.step_time


def test_the_reported_time_is_a_full_simulation_of_the_returned_strategy(planned):
    graph, topo, r = planned
    full, _, _ = simulate_strategy(TaskGraphBuilder(graph, topo, CostModel()), r.strategy)
    assert full.step_time == r.step_time
    assert r.peak_memory == full.peak_memory


def test_when_nothing_beats_data_parallelism_the_plan_says_so_and_is_data_parallelism(planned):
    _, _, r = planned
    dp = r.candidates["data-parallel"]
    if r.step_time == dp.step_time:
        assert r.strategy.configs == dp.strategy.configs and "beats data parallelism" in r.note
    else:
        assert r.step_time < dp.step_time and "data parallelism" not in r.note


def test_the_same_seed_gives_the_same_plan():
    graph, topo = diamond(), get_preset("p100-1x4")
    a, b = (plan(graph, topo, CostModel(), budget_s=1e9, placement_budget_s=1e9, max_proposals=40, seed=3)
            for _ in range(2))
    assert a.strategy.configs == b.strategy.configs and a.step_time == b.step_time


def _shrunk(topo, memory: int):
    return replace(topo, devices=tuple(replace(d, memory=memory) for d in topo.devices))


def test_a_model_that_fits_nowhere_is_refused_with_how_much_is_missing():
    graph = mlp()
    topo = _shrunk(get_preset("p100-1x4"), 256)
    with pytest.raises(OutOfMemoryError, match=r"fits on p100-1x4 under no strategy: .* need [0-9.]+ KiB, but the 4 "
                                               r"devices hold 1.00 KiB together \(756 B short\)"):
        plan(graph, topo, CostModel(), budget_s=1e9, placement_budget_s=1e9, max_proposals=5)


def test_when_the_search_finds_nothing_that_fits_the_closest_strategy_is_named():
    graph = mlp(batch=64, width=256)
    # Exactly a quarter of one copy of everything per device: the total-memory bound cannot
    # refuse it, but no strategy fits (activations that move are stored twice).
    total = 4 * graph.param_bytes + sum(o.nbytes for op in graph.ops for o in op.outputs)
    topo = _shrunk(get_preset("p100-1x4"), total // 4 + 1)
    with pytest.raises(OutOfMemoryError, match=r"no strategy found for mlp on p100-1x4 fits in memory; the closest, "
                                               r"[a-z-]+: device \d .* needs [0-9.]+ GiB but has [0-9.]+ GiB"):
        plan(graph, topo, CostModel(), budget_s=1e9, placement_budget_s=1e9, max_proposals=1)


def test_a_baseline_above_the_task_limit_is_reported_as_not_simulated():
    graph, topo = diamond(), get_preset("p100-1x4")
    r = plan(graph, topo, CostModel(), budget_s=1e9, placement_budget_s=1e9, max_proposals=5, max_tasks=10)
    dp = r.candidates["data-parallel"]
    assert dp.step_time is None and "not simulated" in dp.note and "above the limit of 10" in dp.note
    assert r.step_time is not None  # the searches still give a plan


def test_a_random_start_far_larger_than_data_parallelism_is_not_run_and_the_plan_says_why(monkeypatch):
    import importlib
    import json

    plan_module = importlib.import_module("autopar.planner.search.plan")  # the package exports the function
    graph, topo = mlp(), get_preset("p100-1x4")
    monkeypatch.setattr(plan_module, "MAX_RANDOM_START_TASKS_RATIO", 0)
    r = plan(graph, topo, CostModel(), budget_s=1e9, placement_budget_s=1e9, max_proposals=20, seed=1)
    skipped = [c for c in r.chains if c.start == "random"]
    assert len(skipped) == 1 and skipped[0].proposals == 0 and skipped[0].stopped.startswith("not run")
    assert "x data parallelism's" in skipped[0].stopped
    assert [c.start for c in r.chains if c.space == "soap" and c.proposals] != []
    out = json.loads(json.dumps(r.to_dict(), allow_nan=False))  # valid JSON: no NaN for the unknown start time
    assert next(c for c in out["chains"] if c["start"] == "random")["start_seconds"] is None


def test_budget_the_chains_leave_goes_to_restarts_from_the_best_strategy_found(monkeypatch):
    import importlib
    plan_mod = importlib.import_module("autopar.planner.search.plan")
    from autopar.planner.ir.strategy import data_parallel
    from autopar.planner.search.mcmc import ChainResult

    graph, topo = diamond(), get_preset("p100-1x4")
    builder = TaskGraphBuilder(graph, topo, CostModel())
    dp = data_parallel(graph, topo.num_devices)
    step = simulate_strategy(builder, dp)[0].step_time
    worse = ChainResult("random", "soap", 2 * step, dp, 2 * step)
    best = ChainResult("expert", "soap", step, dp, step)
    monkeypatch.setattr(plan_mod, "MIN_RESTART_SECONDS", 0.05)
    out = plan_mod._restarts(builder, [worse, best], 0.5, seed=0, beta_rel=400, max_proposals=None,
                             ui=plan_mod._Progress(False))
    assert out and all(c.start == "restart from expert" for c in out)
    assert all(c.best_time <= step for c in out)  # a chain's best is never worse than its start
    # A counted search has no leftover time to spend; neither has an endless one.
    assert plan_mod._restarts(builder, [best], 0.5, seed=0, beta_rel=400, max_proposals=10,
                              ui=plan_mod._Progress(False)) == []
    assert plan_mod._restarts(builder, [best], float("inf"), seed=0, beta_rel=400, max_proposals=None,
                              ui=plan_mod._Progress(False)) == []


@pytest.mark.parametrize("devices, expect", [
    (4, ["per device (used/capacity): 0: 1.00 MiB/16.00 GiB, 1: 2.00 MiB/16.00 GiB"]),
    # Beyond eight devices: the fullest and the emptiest relative to capacity, not a screenful.
    (16, ["of 16 devices (used/capacity): fullest device 15 16.00 MiB/16.00 GiB, emptiest device 0 1.00 MiB/16.00 GiB"]),
])
def test_the_report_lists_peak_memory_per_device_up_to_eight_and_summarizes_beyond(devices, expect):
    from autopar.planner.search._result import _memory_summary
    peak = {d: (d + 1) * 2 ** 20 for d in range(devices)}
    line = _memory_summary(peak, {d: 16 * 2 ** 30 for d in range(devices)})
    assert all(e in line for e in expect), line
    assert line.count("/16.00 GiB") == (devices if devices <= 8 else 2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_new_users_first_simulate_then_plan_succeeds(tmp_path):
    """With an empty Numba cache, `autopar simulate` compiles (and caches) the full pass, and the
    first `autopar plan` compiles the delta pass inside the search, whose collector is paused: the
    compile's reference cycles must not keep views of the task graph alive (that was a BufferError
    on the graph's next append, on every fresh machine)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), AUTOPAR_CACHE_DIR=str(tmp_path / "cache"))
    model = ["--model", "lenet", "--topology", "p100-4x4"]
    for args in (["simulate", *model], ["plan", *model, "--max-proposals", "200", "--out", str(tmp_path / "plan.yaml")]):
        run = subprocess.run([sys.executable, "-m", "autopar.cli", *args], env=env, capture_output=True, text=True,
                             cwd=tmp_path)
        assert run.returncode == 0, f"autopar {args[0]}: {run.stderr[-3000:]}"
    assert (tmp_path / "plan.yaml").exists()


def test_with_arrival_noise_every_candidate_is_compared_as_a_full_simulation_reports_it():
    """The chains rank plans on mean arrivals (delta simulation); the candidates the plan is chosen
    from are each timed with their waits at their means, as every command reports a step, and
    with the all-reduce of the step's loss that ends every trained step."""
    from autopar.planner.cost import Curve, ProfileCache
    from autopar.planner.cost.calibration import default_calibration
    graph = rnn()
    topo = get_preset("local:2")
    flat = Curve.fit([(1, 1e-7), (1 << 30, 1e-7)])
    cache = ProfileCache()
    cache.put_calibration(replace(default_calibration("CPU-core", "gloo", 2), jitter=2e-4, latency_var=flat,
                                  leave_var=flat))
    cost = CostModel(cache)
    r = plan(graph, topo, cost, budget_s=1e9, placement_budget_s=1e9, max_proposals=20, seed=1)
    builder = TaskGraphBuilder(graph, topo, cost)
    assert builder.runtime.jitter == 2e-4
    loss = loss_allreduce_s(builder)
    assert loss == builder.runtime.allreduce_time(8, 2) > 0
    for name, c in r.candidates.items():
        if c.strategy is not None and c.step_time is not None and name != "mcmc":
            assert c.step_time == simulate_strategy(builder, c.strategy)[0].step_time + loss, name
    assert r.step_time == simulate_strategy(builder, r.strategy)[0].step_time + loss
