"""Each wait of the trainer's step at its mean when the ranks' arrivals vary (`planner.sim.waits`):
Clark's moments, the first wait's closed form, and what the step and its parts hold."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from autopar.planner.cost import CostModel, Curve
from autopar.planner.cost.calibration import default_calibration
from autopar.planner.hardware import get_preset
from autopar.planner.ir import model_parallel
from autopar.planner.sim import MIN_TASK_SECONDS, STEP_PARTS, TaskGraphBuilder, simulate, simulate_strategy, step_parts
from autopar.planner.sim.waits import clark_max, has_arrival_noise, mean_waits
from autopar.planner.sim.trainer_model import optimizer_step

from ..search._graphs import mlp, rnn


def test_clark_max_gives_the_moments_of_the_maximum_of_two_gaussians():
    mean, var = clark_max(0.0, 1.0, 0.0, 1.0)
    assert mean == pytest.approx(1 / math.sqrt(math.pi)) and var == pytest.approx(1 - 1 / math.pi)
    rng = random.Random(7)
    xs = [max(rng.gauss(1.0, 0.5), rng.gauss(1.4, 1.2)) for _ in range(200_000)]
    mean, var = clark_max(1.0, 0.25, 1.4, 1.44)
    assert mean == pytest.approx(statistics.fmean(xs), abs=0.01)
    assert var == pytest.approx(statistics.pvariance(xs), rel=0.02)
    # Far apart, or without noise, the maximum is the larger one as it is.
    assert clark_max(10.0, 0.01, 0.0, 0.01) == pytest.approx((10.0, 0.01))
    assert clark_max(1.0, 0.0, 2.0, 0.0) == (2.0, 0.0)


def _builders(g, latency_sd=3e-4, jitter=0.0):
    cal = default_calibration("CPU-core", "gloo", 2)
    flat = Curve.fit([(1, latency_sd ** 2), (1 << 30, latency_sd ** 2)])
    noisy = replace(cal, jitter=jitter, latency_var=flat, leave_var=flat)
    cost = CostModel().bind(g)
    topo = get_preset("local:2")
    return TaskGraphBuilder(g, topo, cost, runtime=cal), TaskGraphBuilder(g, topo, cost, runtime=noisy)


def test_without_measured_noise_every_wait_is_priced_between_mean_arrivals():
    g = mlp()
    plain, _ = _builders(g)
    assert not has_arrival_noise(plain)
    strategy = model_parallel(g, 2)
    res, _, _ = simulate_strategy(plain, strategy)
    assert res.step_time == simulate(plain.build(strategy)).makespan


def test_the_first_wait_for_a_one_way_message_is_the_mean_of_max_0_d():
    """At the step's first wait the ranks have not met yet: with no jitter, the arrival difference
    D varies by the message's latency alone, and the wait costs E[max(0, D)] (the closed form of a
    Gaussian's positive part) beyond the simulated max(0, E[D])."""
    g = mlp()
    _, noisy = _builders(g, latency_sd=3e-4)
    tg = noisy.build(model_parallel(g, 2))
    tl = simulate(tg)
    extra = mean_waits(noisy, tg, tl)
    assert extra and all(e >= 0 for e in extra.values())
    first = min(extra, key=lambda w: tl.start[w])
    own = [p for p in tg.preds(first) if not (len(p) == 7 and p[2] == 1)]
    data = [p for p in tg.preds(first) if len(p) == 7 and p[2] == 1 and (p[-1] >= 0 or p[-1] == -4)]
    messages = {p[:6] for p in data}
    senders = [p for m in messages for p in tg.preds(m + (-1,)) if len(p) == 5 and p[4] == 0]
    assert len(messages) == 1 and len({p[3] for p in senders}) == 1, "a one-way message from one rank"
    mu = max(tl.end[p] for p in data) - max(tl.end[p] for p in own)
    sd = 3e-4
    positive = mu * 0.5 * (1 + math.erf(mu / sd / math.sqrt(2))) + sd * math.exp(-mu * mu / 2 / sd / sd) / math.sqrt(
        2 * math.pi)
    assert extra[first] == pytest.approx(positive - max(0.0, mu), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("graph", [mlp, lambda: rnn(steps=3)])
def test_noise_lengthens_the_step_by_its_waits_and_the_parts_hold_them_as_transfer(graph):
    g = graph()
    plain, noisy = _builders(g, latency_sd=4e-4, jitter=2e-4)
    assert has_arrival_noise(noisy)
    strategy = model_parallel(g, 2)
    base, tl0, tg0 = simulate_strategy(plain, strategy)
    res, tl, tg = simulate_strategy(noisy, strategy)
    assert res.step_time > base.step_time
    before, after = step_parts(plain, tg0, tl0), step_parts(noisy, tg, tl)
    for d in range(2):
        assert after[d]["transfer"] > before[d]["transfer"]
        assert after[d]["compute"] == pytest.approx(before[d]["compute"], rel=1e-9)
        assert sum(after[d][p] for p in STEP_PARTS) == pytest.approx(tl.end[optimizer_step(d)], rel=1e-9)
    assert max(sum(p.values()) for p in after.values()) == pytest.approx(res.step_time, rel=1e-9)
    # The waits were recomputed on the timeline they lengthened, to a fixed point: once more
    # moves none of them by more than a microsecond.
    again = mean_waits(noisy, tg, tl)
    assert again and all(tg.task(w).duration - MIN_TASK_SECONDS == pytest.approx(e, abs=1e-6) for w, e in again.items())


def test_more_jitter_never_makes_a_step_shorter():
    g = rnn(steps=3)
    steps = [simulate_strategy(_builders(g, latency_sd=2e-4, jitter=j)[1], model_parallel(g, 2))[0].step_time
             for j in (0.0, 5e-5, 2e-4, 8e-4)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_the_simulated_trace_shows_what_the_noise_adds_to_each_wait():
    from autopar.planner.sim import simulated_trace
    g = mlp()
    plain, noisy = _builders(g, latency_sd=4e-4, jitter=2e-4)
    strategy = model_parallel(g, 2)
    _, tl, tg = simulate_strategy(noisy, strategy)
    doc = simulated_trace(g, noisy.topology, tl, tg)
    waits = [e for e in doc["traceEvents"] if e.get("cat") == "wait"]
    assert waits and all(e["name"].startswith(("mean wait ", "mean grad wait ")) and e["tid"] == 2 for e in waits)
    assert {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e.get("tid") == 2} == {"mean waits"}
    _, tl0, tg0 = simulate_strategy(plain, strategy)
    assert not any(e.get("cat") == "wait" for e in simulated_trace(g, plain.topology, tl0, tg0)["traceEvents"])
