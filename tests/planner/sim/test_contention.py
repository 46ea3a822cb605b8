"""Each CPU op at its solo speed while the other ranks of its machine are idle
(`planner.sim.contention`): the interval arithmetic, what data-parallel and model-parallel steps
make of it, the fixed point, and the parts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.cost.calibration import default_calibration
from autopar.planner.hardware import get_preset
from autopar.planner.ir import data_parallel, model_parallel
from autopar.planner.sim import STEP_PARTS, TaskGraphBuilder, settles, simulate, simulate_strategy, step_parts
from autopar.planner.sim.contention import _covered, _merged, contention_deltas, shares_cores, solo_gains

from ..search._graphs import mlp, rnn


class SoloCost:
    """A cost model whose every estimate has solo times `ratio` of its all-busy ones (or, with
    `solo_only`, runs at them outright)."""

    def __init__(self, cost: CostModel, ratio: float, solo_only: bool = False):
        self.cost, self.ratio, self.solo_only = cost, ratio, solo_only

    def task_cost(self, op, degrees, device, input_shapes=None):
        est = self.cost.task_cost(op, degrees, device, input_shapes)
        solo = (est.forward * self.ratio, est.backward * self.ratio)
        return replace(est, forward=solo[0], backward=solo[1], solo=None) if self.solo_only else replace(est, solo=solo)

    def __getattr__(self, name):
        return getattr(self.cost, name)


def _builder(g, ratio=0.5, solo_only=False, topology="local:2"):
    topo = get_preset(topology)
    cal = default_calibration("CPU-core", "gloo", topo.num_devices)
    return TaskGraphBuilder(g, topo, SoloCost(CostModel().bind(g), ratio, solo_only), runtime=cal)


def test_the_union_of_spans_and_what_of_an_interval_it_covers():
    starts, ends = _merged([(5.0, 6.0), (0.0, 1.0), (0.5, 2.0), (3.0, 3.0), (2.0, 2.5)])
    assert (starts, ends) == ([0.0, 5.0], [2.5, 6.0])
    assert _covered(starts, ends, 1.0, 5.5) == pytest.approx(1.5 + 0.5)
    assert _covered(starts, ends, 2.5, 5.0) == 0.0
    assert _covered(starts, ends, -1.0, 7.0) == pytest.approx(3.5)
    assert _covered([], [], 0.0, 1.0) == 0.0


def test_only_cpu_ranks_sharing_a_machine_are_modelled():
    g = mlp()
    assert shares_cores(_builder(g)) and not shares_cores(_builder(g, topology="local:1"))
    gpu = TaskGraphBuilder(g, get_preset("local:2"), SoloCost(CostModel().bind(g), 0.5),
                           runtime=default_calibration("CPU-core", "nccl", 2))
    assert not shares_cores(gpu) and solo_gains(gpu, model_parallel(g, 2)) == {}
    assert not settles(TaskGraphBuilder(g, get_preset("p100-1x4"), CostModel().bind(g)))


def test_without_solo_times_the_step_is_algorithm_1s():
    g = mlp()
    b = _builder(g, ratio=1.0)            # solo as fast as all-busy: nothing to gain
    strategy = model_parallel(g, 2)
    assert solo_gains(b, strategy) == {}
    assert simulate_strategy(b, strategy)[0].step_time == simulate(b.build(strategy)).makespan


@pytest.mark.parametrize("graph", [mlp, lambda: rnn(steps=3)])
def test_data_parallel_ranks_compute_side_by_side_so_their_ops_keep_the_all_busy_time(graph):
    g = graph()
    b = _builder(g)
    strategy = data_parallel(g, 2)
    busy = simulate_strategy(b, strategy, solo=False)[0].step_time
    mixed = simulate_strategy(b, strategy)[0].step_time
    assert solo_gains(b, strategy)
    assert mixed <= busy and mixed == pytest.approx(busy, rel=0.02)


@pytest.mark.parametrize("graph", [mlp, lambda: rnn(steps=3)])
def test_a_rank_computing_while_the_other_waits_runs_at_its_solo_speed(graph):
    """In a model-parallel step one rank mostly waits while the other computes: its ops run near
    their solo speed, so the step lies between the all-busy step and the all-solo one."""
    g = graph()
    strategy = model_parallel(g, 2)
    b = _builder(g)
    busy, tl0, tg0 = simulate_strategy(b, strategy, solo=False)
    mixed, tl, tg = simulate_strategy(b, strategy)
    solo = simulate_strategy(_builder(g, solo_only=True), strategy)[0].step_time
    assert solo <= mixed.step_time < busy.step_time
    assert mixed.step_time < busy.step_time - 0.3 * (busy.step_time - solo)
    before, after = step_parts(b, tg0, tl0), step_parts(b, tg, tl)
    for d in range(2):
        assert after[d]["compute"] < before[d]["compute"]
        assert sum(after[d][p] for p in STEP_PARTS) == pytest.approx(mixed.step_time, rel=1e-9)
    # Settled: the shares read off the final timeline move no task by more than a microsecond.
    built = b.build(strategy)
    again = contention_deltas(b, tg, tl, solo_gains(b, strategy))
    assert again and all(tg.task(k).duration - built.task(k).duration == pytest.approx(e, abs=1e-6)
                         for k, e in again.items())


def test_the_solo_speed_is_never_slower_than_all_busy():
    g = rnn(steps=3)
    strategy = model_parallel(g, 2)
    steps = [simulate_strategy(_builder(g, ratio=r), strategy)[0].step_time for r in (1.0, 0.8, 0.5)]
    assert steps == sorted(steps, reverse=True) and steps[-1] < steps[0]
