"""`trainer.calibrate`: a quick calibration of 2 local ranks is a usable `RuntimeCalibration`
that survives the profile cache, and the optimizer fit recovers known coefficients."""

from __future__ import annotations

import statistics

import pytest

from autopar.planner.cost import Curve, ProfileCache
from autopar.planner.cost.calibration import CALIBRATION_METHOD, STAGING_PARTS, RuntimeCalibration
from autopar.trainer.calibrate import (IN_SITU_BATCHES, QUICK_SIZES, _interleaved, arrival_noise, calibrate, fit_draw,
                                      fit_intercept, fit_optimizer, fit_zero, in_situ_job, in_step_curve, issue_curve,
                                      message_latencies, message_serial, one_way_latencies, receive_posting, send_calls,
                                      send_waits, spread, staging_curves)


def _monotone_positive(points) -> bool:
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    return all(y > 0 for y in ys) and all(b > a for a, b in zip(xs, xs[1:])) and all(b >= a for a, b in zip(ys, ys[1:]))


def test_every_repetition_takes_every_size_once_starting_one_further_each_time():
    got = list(_interleaved([4, 1024, 65536], 4))
    assert [rep for rep, _ in got] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert [case for _, case in got] == [4, 1024, 65536, 1024, 65536, 4, 65536, 4, 1024, 4, 1024, 65536]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_quick_calibration_of_two_ranks_is_complete_and_round_trips(tmp_path):
    stages = []
    cal = calibrate(2, quick=True, progress=stages.append)
    assert isinstance(cal, RuntimeCalibration)
    assert (cal.backend, cal.world, cal.source, cal.product) == ("gloo", 2, "measured", "CPU-core")
    assert len(stages) >= 3
    assert _monotone_positive(cal.p2p.points)
    assert cal.p2p.points[0][0] <= 1024 and cal.p2p.points[-1][0] == QUICK_SIZES[-1]   # in-situ sizes, then the microbenchmark's
    assert [g for g, _ in cal.allreduce] == [2]
    assert _monotone_positive(cal.allreduce[0][1].points)
    assert cal.p2p(1 << 20) > 0 and cal.allreduce_time(1 << 20, 2) > 0
    assert min(cal.fwd_task_s, cal.bwd_task_s, cal.exchange_s) >= 0
    assert max(cal.fwd_task_s, cal.bwd_task_s, cal.exchange_s) < 5e-3     # microseconds, not a stray step
    # The per-task overheads: the work between the spans timed with every op evicting the caches,
    # the warm figures kept beside them; an unfused op's own call costs its engine start-up more.
    assert cal.method == CALIBRATION_METHOD and cal.bwd_call_s >= 0
    chains = dict(cal.details)["overhead_chains"]
    assert all(row[f"{tag}{p}_{x}"] > 0 for row in chains for tag in ("", "unfused_", "cold_", "cold_unfused_")
               for p in ("fwd", "bwd") for x in ("wall", "phase"))
    assert {"warm_fwd_task_s", "warm_bwd_task_s", "bwd_task_unfused_s"} <= set(dict(cal.details))
    # Issuing each bucket's all-reduce was timed in the optimizer stage's data-parallel steps.
    assert dict(cal.details)["allreduce_issue"]["issues"] > 0 and 0 < cal.issue_time(1 << 20) < 5e-2
    # Posting the receives ahead was timed in the in-situ steps.
    assert dict(cal.details)["posting"]["receives"] > 0 and 0 < cal.post_s < 5e-3
    # So was the wait for each step's send requests as it ends.
    assert dict(cal.details)["send_waits"]["sends"] > 0 and 0 < cal.send_wait_s < 5e-3
    assert {name for name, _, _ in cal.optimizer} == {"adam", "sgd"}
    assert all(t >= 0 and b >= 0 and t + b > 0 for _, t, b in cal.optimizer)
    assert cal.optimizer_time("adam", 10, 40e6) > 0
    details = dict(cal.details)
    assert details["quick"] is True and details["sizes"] == list(QUICK_SIZES) and "torch" in details
    assert _monotone_positive([tuple(p) for p in details["p2p_median"]])
    # The latency is measured on the in-situ workload's messages at every size; the curve is the
    # monotone fit of their means there.
    fit = details["in_situ"]
    assert fit["messages"] > 0 and fit["message_bytes"] == 32 * 256 // 2 * 4
    assert 0 < fit["latency_median_s"] <= fit["latency_p90_s"]
    sizes = [p["message_bytes"] for p in fit["per_size"]]
    assert [p["batch"] for p in fit["per_size"]] == sorted(IN_SITU_BATCHES) and sizes == sorted(sizes)
    means = Curve.fit((p["message_bytes"], p["mean_s"]) for p in fit["per_size"])
    for size in sizes:
        assert cal.p2p(size) == pytest.approx(means(size), rel=1e-9)
    assert cal.p2p(16 << 20) >= cal.p2p(sizes[-1])
    # One-way messages were measured apart, on the chain's ops placed on ranks 0 and 1 in turn.
    one_way = fit["one_way"]["per_size"]
    assert [p["batch"] for p in one_way] == sorted(IN_SITU_BATCHES) and all(p["messages"] > 0 for p in one_way)
    assert _monotone_positive(cal.p2p_oneway.points)
    for p in one_way:   # at the median per size (calibration method 11)
        assert cal.p2p_oneway(p["message_bytes"]) == pytest.approx(
            Curve.fit((q["message_bytes"], q["median_s"]) for q in one_way)(p["message_bytes"]), rel=1e-9)
    # and the sender's own call of each, at the median per size too
    sending = fit["one_way"]["send_call_per_size"]
    assert [p["message_bytes"] for p in sending] == [p["message_bytes"] for p in one_way]
    assert _monotone_positive(cal.send_call.points)
    assert cal.send_call(sending[0]["message_bytes"]) == pytest.approx(
        Curve.fit((q["message_bytes"], q["median_s"]) for q in sending)(sending[0]["message_bytes"]), rel=1e-9)
    assert fit["predicted_step_s"] > 0 and fit["measured_step_s"] > 0
    # How the ranks' arrivals vary was measured on the same chain's exchanges.
    noise = details["arrival_noise"]
    assert cal.jitter == noise["jitter"] >= 0 and cal.latency_var is not None and cal.leave_var is not None
    assert [p["batch"] for p in noise["per_batch"]] == sorted(IN_SITU_BATCHES)
    assert all(y >= 0 for c in (cal.latency_var, cal.leave_var) for _, y in c.points)
    batches = details["message_batches"]
    assert cal.message_serial_s == batches["message_serial_s"] >= 0 and batches["one_each_way_s"] > 0
    # Staging was timed in the runtime's own steps: placing 1 MiB costs more than placing 1 KiB.
    assert len(cal.staging) == len(STAGING_PARTS) and set(details["staging"]) >= set(STAGING_PARTS)
    for part in range(len(STAGING_PARTS)):
        assert cal.staging_time(part, 1 << 20) >= cal.staging_time(part, 1 << 10) >= 0
    assert cal.staging_time(1, 1 << 20) > cal.staging_time(1, 1 << 10) > 0
    # Drawing the synthetic batch was timed on both ranks: more elements cost more, of either kind.
    assert {name for name, _, _ in cal.draw} == {"float", "int"} and len(details["draw_samples"]) == 2
    assert all(t >= 0 and e > 0 for _, t, e in cal.draw)
    assert cal.draw_time(True, 1 << 20) > cal.draw_time(True, 1 << 10) > 0
    # Zeroing the buckets was timed in the optimizer's data-parallel steps on both ranks, past each
    # job's first zeroings: 16 MiB costs more than 16 KiB.
    zeroed = details["zero_samples"]
    assert len(zeroed) == 2 and all(len(rank) > 0 for rank in zeroed)
    assert {(t, b) for t, b, _ in zeroed[0]} == {(t, b) for t, b, _ in zeroed[1]}
    assert cal.zero is not None and min(cal.zero) >= 0
    assert cal.zero_time(4, 16 << 20) > cal.zero_time(4, 16 << 10) > 0
    # The optimizer was timed inside the trainer's steps: bigger cases cost more.
    for name, samples in details["optimizer_samples"].items():
        by_bytes = sorted(samples, key=lambda s: s[1])
        assert by_bytes[-1][2] > by_bytes[0][2], (name, samples)

    path = tmp_path / "profile.json"
    cache = ProfileCache(path=path)
    cache.put_calibration(cal)
    cache.save()
    back = ProfileCache.load(path).calibration(cal.product, "gloo", 2)
    assert back == cal
    assert dict(back.details)["date"] == details["date"]


def test_optimizer_fit_recovers_coefficients_and_never_goes_negative():
    per_tensor, per_byte = 20e-6, 0.8e-9
    cases = [(t, float(t * b)) for t in (4, 32) for b in (4 << 10, 64 << 10, 4 << 20)]
    exact = [(t, nb, t * per_tensor + nb * per_byte) for t, nb in cases]
    a, c = fit_optimizer(exact)
    assert a == pytest.approx(per_tensor, rel=1e-6) and c == pytest.approx(per_byte, rel=1e-6)
    # Noise of +-5 % keeps both coefficients close.
    noisy = [(t, nb, s * (1.05 if k % 2 else 0.95)) for k, (t, nb, s) in enumerate(exact)]
    a, c = fit_optimizer(noisy)
    assert a == pytest.approx(per_tensor, rel=0.2) and c == pytest.approx(per_byte, rel=0.1)
    # Costs that fall with the tensor count would need a negative per-tensor cost: clamped to 0.
    a, c = fit_optimizer([(1, 1e6, 2e-3), (100, 1e6, 1e-3), (1, 4e6, 4e-3)])
    assert a == 0.0 and c > 0
    with pytest.raises(ValueError):
        fit_optimizer([])


def test_the_draw_fit_is_per_tensor_plus_per_element_over_the_ranks_medians():
    per_rank = [{"float": [(1000, 2e-5), (3000, 4e-5)], "int": [(1000, 1e-5), (3000, 3e-5)]},
                {"float": [(1000, 2e-5), (3000, 4e-5)], "int": [(1000, 1e-5), (3000, 3e-5)]},
                {"float": [(1000, 9e-5), (3000, 9e-5)], "int": [(1000, 1e-5), (3000, 3e-5)]}]   # the median rules
    got = dict((k, (t, e)) for k, t, e in fit_draw(per_rank))
    assert got["float"] == pytest.approx((1e-5, 1e-8)) and got["int"] == pytest.approx((0.0, 1e-8), abs=1e-12)


def test_the_zero_fit_takes_the_median_per_case_over_every_ranks_calls():
    per_rank = [[(4, 1 << 20, 2e-4), (4, 1 << 20, 2e-4), (8, 8 << 20, 9e-4)],
                [(4, 1 << 20, 5e-3), (8, 8 << 20, 9e-4), (8, 8 << 20, 9e-4)]]    # one slow call: the median rules
    per_tensor, per_byte = fit_zero(per_rank)
    assert per_tensor > 0 and per_byte > 0
    assert 4 * per_tensor + (1 << 20) * per_byte == pytest.approx(2e-4, rel=1e-6)
    assert 8 * per_tensor + (8 << 20) * per_byte == pytest.approx(9e-4, rel=1e-6)
    assert fit_zero([[], []]) is None


def test_drawing_samples_time_each_kind_at_every_size():
    import torch
    from autopar.trainer.calibrate import DRAW_SIZES, _draw_samples
    out = _draw_samples(torch.device("cpu"))
    assert set(out) == {"float", "int"}
    for rows in out.values():
        assert [n for n, _ in rows] == list(DRAW_SIZES) and all(s > 0 for _, s in rows)


def test_intercept_fit_is_the_per_task_slope():
    rows = [(n, 30e-6 + n * 12e-6) for n in (8, 20, 52)]
    slope, const = fit_intercept(rows)
    assert slope == pytest.approx(12e-6) and const == pytest.approx(30e-6)
    assert fit_intercept([(10, -1e-4), (20, -3e-4)])[0] == 0.0     # clamped
    assert fit_intercept([(10, 1e-4), (10, 3e-4)])[0] == pytest.approx(2e-5)


def test_message_latencies_pair_the_ranks_calls():
    """Call k of every rank meets call k of the others: a message's latency runs from the last
    rank's entry to the receiver's return; calls that receive nothing are not messages."""
    rank0 = {"times": [0.01], "calls": [[(1.0, 1.5, 64), (2.0, 2.1, 0)]]}
    rank1 = {"times": [0.01], "calls": [[(1.2, 1.4, 64), (2.05, 2.3, 64)]]}
    samples, size = message_latencies([rank0, rank1])
    assert samples == pytest.approx([0.3, 0.2, 0.25]) and size == 64
    with pytest.raises(ValueError):
        message_latencies([rank0, {"times": [0.01], "calls": [[(1.2, 1.4, 64)]]}])


def test_arrival_noise_is_what_the_ranks_add_to_their_offset_between_exchanges_per_second():
    """Rank 1 enters call 1 of each step 0.2 ms before or after rank 0, having left call 0 at
    the same moment and run 1 ms: the offset's variance grew by that of the Gaussian with the same
    interquartile range (`spread`) over 2 ms run by the two ranks.  It leaves call 1 as far from
    rank 0 as it entered it.  The variances of leaving and of the one-way latencies are `spread`s
    too."""
    def run(shift):
        steps0 = [[(0.0, 1e-3, 64), (2e-3, 3e-3, 64)] for _ in shift]
        steps1 = [[(0.0, 1e-3, 64), (2e-3 + x, 3e-3 + x, 64)] for x in shift]
        return [{"times": [0.01] * len(shift), "calls": steps0}, {"times": [0.01] * len(shift), "calls": steps1}]
    r0, r1 = run([2e-4, -2e-4] * 5)
    o0 = {"times": [0.01] * 3, "calls": [[(0.0, 1e-4, 0)], [(0.0, 1e-4, 0)], [(0.0, 1e-4, 0)]]}
    o1 = {"times": [0.01] * 3, "calls": [[(5e-5, 2e-4, 128)], [(5e-5, 3e-4, 128)], [(5e-5, 5e-4, 128)]]}
    jitter, latency_var, leave_var, details = arrival_noise([{4: r0}, {4: r1}], [{8: o0}, {8: o1}])
    assert jitter == pytest.approx(spread([2e-4, -2e-4] * 5) / 2e-3, rel=1e-6)
    assert leave_var(64) == 0.0                      # call 0: both left at 1 ms in every step
    samples, size = one_way_latencies([o0, o1])
    assert size == 128 and latency_var(128) > 0 and latency_var(128) == pytest.approx(spread(samples), rel=1e-9)
    assert details["jitter"] == jitter and details["per_batch"][0]["batch"] == 4
    # Leaving as far apart as they arrive adds nothing: no negative jitter.
    r0, r1 = run([0.0] * 10)
    assert arrival_noise([{4: r0}, {4: r1}], [{8: o0}, {8: o1}])[0] == 0.0


def test_a_few_stalls_do_not_set_the_arrival_noise():
    """A rank's program drifts 0.2 ms (sd) between two exchanges 1 ms apart, and in two steps of
    forty it stalls 50 ms, as where the hypervisor takes its CPU: the rate is the drift's, not
    the 100x the stalls would give the plain variance."""
    import random
    import statistics
    rng = random.Random(7)
    shifts = [rng.gauss(0.0, 2e-4) for _ in range(40)]
    shifts[5] += 0.05
    shifts[27] -= 0.05
    steps0 = [[(0.0, 1e-3, 64), (2e-3, 3e-3, 64)] for _ in shifts]
    steps1 = [[(0.0, 1e-3, 64), (2e-3 + x, 3e-3 + x, 64)] for x in shifts]
    r0, r1 = ({"times": [0.01] * len(shifts), "calls": steps} for steps in (steps0, steps1))
    o0 = {"times": [0.01], "calls": [[(0.0, 1e-4, 0)]]}
    o1 = {"times": [0.01], "calls": [[(5e-5, 2e-4, 128)]]}
    jitter = arrival_noise([{4: r0}, {4: r1}], [{8: o0}, {8: o1}])[0]
    assert jitter == pytest.approx((2e-4) ** 2 / 2e-3, rel=0.5)
    assert statistics.pvariance(shifts) / 2e-3 > 100 * jitter


def test_arrival_noise_counts_only_the_two_way_exchanges():
    """Between two exchanges the chain calls `exchange_many` with nothing to move for every op
    whose input is in place; such a call returns at once, wherever the other rank is.  In a call
    that moves bytes one way, the sender returns at once too.  The ranks leave each two-way
    exchange within 10 us of each other and drift up to 0.3 ms apart in between: ``leave_var``
    is the exchanges' own spread, not the drift the other calls pass through, and the jitter is
    the drift over the time run between the exchanges."""
    import random
    rng = random.Random(5)
    steps0, steps1 = [], []
    for _ in range(400):
        lag = [rng.gauss(0.0, 1e-5) for _ in range(3)]      # how far apart they leave each exchange
        drift = [rng.gauss(0.0, 1.5e-4) for _ in range(2)]  # what each rank's program adds before the next
        c0, c1, t = [], [], 0.0
        for j in range(3):
            entry1 = t + (drift[j - 1] if j else 0.0)
            c0.append((t, t + 2e-4, 64))
            c1.append((entry1, t + 2e-4 + lag[j], 64))
            if j < 2:       # three ops whose input is in place, one that rank 0 sends, then the next exchange
                for i in range(1, 5):
                    at0, at1 = t + i * 2e-4, t + i * 2e-4 + drift[j] * i / 4
                    got = 64 if i == 2 else 0
                    c0.append((at0, at0, 0))
                    c1.append((at1, max(at1, at0 + 5e-5) if got else at1, got))
            t += 1e-3
        steps0.append(c0)
        steps1.append(c1)
    r0 = {"times": [0.01] * 400, "calls": steps0}
    r1 = {"times": [0.01] * 400, "calls": steps1}
    o0 = {"times": [0.01], "calls": [[(0.0, 1e-4, 0)]]}
    o1 = {"times": [0.01], "calls": [[(5e-5, 2e-4, 128)]]}
    jitter, _, leave_var, details = arrival_noise([{4: r0}, {4: r1}], [{8: o0}, {8: o1}])
    assert leave_var(64) ** 0.5 < 3e-5                 # 10 us, not the 0.1 ms drift
    ran = 2 * 8e-4                                     # both ranks, from leaving one exchange to the next
    assert jitter == pytest.approx((1.5e-4) ** 2 / ran, rel=0.25)
    assert details["per_batch"][0]["between_s"] == pytest.approx(ran, rel=0.05)


def test_spread_is_the_variance_of_the_gaussian_with_the_same_interquartile_range():
    import random
    rng = random.Random(3)
    xs = [rng.gauss(0.0, 2e-4) for _ in range(20_000)]
    assert spread(xs) == pytest.approx(4e-8, rel=0.05)
    # A rare stall of 3 ms moves the variance, not the spread.
    stalled = xs + [3e-3] * 200
    assert statistics.pvariance(stalled) > 2 * statistics.pvariance(xs)
    assert spread(stalled) == pytest.approx(spread(xs), rel=0.05)
    assert spread([1.0]) == 0.0


def test_one_way_latencies_run_from_the_senders_entry_to_the_receivers_return():
    """Ranks 0 and 1 make the same calls; in each, one receives (its bytes) or neither does: the
    latency runs from the other rank's entry, whichever came first."""
    rank0 = {"times": [0.01], "calls": [[(1.0, 1.1, 0), (2.0, 2.5, 64), (3.0, 3.1, 0)]]}
    rank1 = {"times": [0.01], "calls": [[(1.05, 1.3, 64), (2.2, 2.3, 0), (3.0, 3.05, 0)]]}
    samples, size = one_way_latencies([rank0, rank1, {"times": [], "calls": []}])   # rank 2 takes no part
    assert samples == pytest.approx([0.3, 0.3]) and size == 64
    with pytest.raises(ValueError):
        one_way_latencies([rank0, {"times": [0.01], "calls": [[(1.05, 1.3, 64)]]}])
    with pytest.raises(ValueError):
        one_way_latencies([rank0])


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_models_sync_steps_go_on_in_whole_rounds_until_their_seconds_or_the_most_blocks():
    """`model_sync` steps at least `SYNC_STEPS` blocks with the all-reduces and without, then two
    more of each at a time (on, off, off, on) while its timed steps have run under `seconds`, up to
    `max_blocks` of each: both ranks stop at the same block."""
    from autopar.trainer import calibrate as calib
    untimed, blocks, per_block = calib.SYNC_STEPS[True]
    options = {"batch": 4}
    assert calib.model_sync("lenet", options, 2, quick=True, seconds=0.0)["steps"] == 2 * blocks * per_block
    longer = calib.model_sync("lenet", options, 2, quick=True, seconds=1e9, max_blocks=blocks + 2)
    assert longer["steps"] == 2 * (blocks + 2) * per_block and longer["added_s"] >= 0
    assert calib.model_sync("lenet", options, 1, quick=True) is None


def test_send_calls_are_the_senders_own_calls_of_one_way_messages():
    """Paired as the latencies are: the sender's call from its entry to its return, whoever
    entered first; the calls where neither receives are no message."""
    rank0 = {"times": [0.01], "calls": [[(1.0, 1.1, 0), (2.0, 2.5, 64), (3.0, 3.1, 0)]]}
    rank1 = {"times": [0.01], "calls": [[(1.05, 1.3, 64), (2.2, 2.26, 0), (3.0, 3.05, 0)]]}
    samples, size = send_calls([rank0, rank1])
    assert samples == pytest.approx([0.1, 0.06]) and size == 64
    with pytest.raises(ValueError, match="same number of steps"):
        send_calls([rank0])


def test_a_curve_without_a_shape_goes_on_along_its_last_two_sizes():
    """The sender's call grows with the bytes past the largest size measured (``send_call``)."""
    samples = {1: ([6e-5] * 5, 2048), 2: ([1.4e-4] * 5, 512 << 10), 3: ([5.6e-4] * 5, 2 << 20)}
    curve, per_size = in_step_curve([{1: 1, 2: 2, 3: 3}], lambda per_rank: samples[per_rank[0]], None, "median_s")
    assert [p["median_s"] for p in per_size] == pytest.approx([6e-5, 1.4e-4, 5.6e-4])
    assert curve(4 << 20) == pytest.approx(5.6e-4 + (5.6e-4 - 1.4e-4) * (2 << 20) / (1.5 * (1 << 20)))


def test_an_in_step_curve_follows_the_mean_or_the_median_per_size_and_the_shape_beyond():
    """Two sizes whose latencies have a bulk and, at the larger, one stall: the mean curve carries
    the stall (the two-way curve), the median curve does not (the one-way curve, calibration
    method 11); beyond the largest size both follow `shape`, shifted to meet their last point."""
    samples = {1: ([1e-4] * 9 + [1.1e-4], 1024), 2: ([2e-4] * 9 + [5.2e-3], 4096)}
    shape = Curve(((1024.0, 1e-4), (4096.0, 3e-4), (16384.0, 9e-4)))
    runs = [{1: 1, 2: 2}]
    mean, per_size = in_step_curve(runs, lambda per_rank: samples[per_rank[0]], shape)
    median, _ = in_step_curve(runs, lambda per_rank: samples[per_rank[0]], shape, "median_s")
    assert [p["message_bytes"] for p in per_size] == [1024, 4096] and per_size[1]["messages"] == 10
    assert mean(4096) == pytest.approx(statistics.fmean(samples[2][0])) == pytest.approx(7e-4)
    assert median(4096) == pytest.approx(2e-4) and median(1024) == pytest.approx(1e-4)
    assert mean(16384) == pytest.approx(7e-4 + 6e-4) and median(16384) == pytest.approx(2e-4 + 6e-4)
    with pytest.raises(ValueError, match="mean_s or the median_s"):
        in_step_curve(runs, lambda per_rank: samples[per_rank[0]], shape, "p90_s")


def test_the_one_way_workload_puts_each_op_whole_on_ranks_0_and_1_in_turn():
    job = in_situ_job(3, 8, one_way=True)
    devices = [job.strategy[op.name].devices for op in job.graph.ops]
    assert devices == [(k % 2,) for k in range(len(job.graph.ops))]
    assert all(d == 1 for op in job.graph.ops for d in job.strategy[op.name].degrees)
    two_way = in_situ_job(2, 8)
    assert len(two_way.graph.ops) > len(job.graph.ops)        # its ranks compute between exchanges


def test_message_serial_is_half_what_a_second_message_each_way_adds():
    one = [(0.0, 1.0e-3), (1.0, 1.0 + 1.0e-3)]
    two = [(0.0, 1.6e-3), (1.0, 1.0 + 1.6e-3)]
    serial, means = message_serial([{1: one, 2: two}, {1: one, 2: two}])
    assert means["one_each_way_s"] == pytest.approx(1.0e-3) and serial == pytest.approx(0.3e-3)
    # never more than half a one-message latency, never negative
    assert message_serial([{1: one, 2: [(0.0, 9e-3)] * 2}] * 2)[0] == pytest.approx(0.5e-3)
    assert message_serial([{1: two, 2: one}] * 2)[0] == 0.0


def test_staging_curves_are_seconds_per_call_at_each_message_size():
    """Per part: the median over steps of seconds per call, averaged over ranks, at the bytes of
    one call; monotone; a step that staged nothing of a part does not count."""
    def rank(scale):
        out = {}
        for k, batch in enumerate(sorted(IN_SITU_BATCHES)):
            nbytes = 1024 * 4 ** k
            # (seconds, bytes, calls) per part: 10 calls a step; part 2 also has an empty step
            step = [(10 * scale * (20e-6 + nbytes * 1e-10), 10 * nbytes, 10) for _ in STAGING_PARTS]
            out[batch] = {"staging": [step, step, step[:2] + [(0.0, 0, 0)] + step[3:]]}
        return out
    curves, details = staging_curves([rank(1.0), rank(3.0)])
    assert len(curves) == len(STAGING_PARTS) and set(details) == set(STAGING_PARTS)
    for curve in curves:
        for k in range(len(IN_SITU_BATCHES)):
            nbytes = 1024 * 4 ** k
            assert curve(nbytes) == pytest.approx(2.0 * (20e-6 + nbytes * 1e-10))
        assert curve(16) == curve(1024)              # smaller messages cost what the smallest did
    with pytest.raises(ValueError, match="staged no forward send"):
        staging_curves([{b: {"staging": [[(0.0, 0, 0)] * 4]} for b in IN_SITU_BATCHES}])


def test_the_calibration_target_names_product_and_backend_and_refuses_what_this_machine_lacks():
    import torch

    from autopar.trainer.calibrate import calibration_target
    from autopar.trainer.errors import TrainerConfigError
    assert calibration_target(2) == ("CPU-core", "gloo")
    with pytest.raises(TrainerConfigError, match="cpu or cuda"):
        calibration_target(1, "meta")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(TrainerConfigError, match=f"{have + 1} CUDA rank.s. need one GPU each.*calibrate fewer"):
        calibration_target(have + 1, "cuda")


def test_the_send_wait_is_the_mean_over_every_send_of_every_rank():
    per_rank = [{2: {"send_waits": [(2e-4, 10), (4e-4, 10)]}},
                {2: {"send_waits": [(0.0, 0)]}, 8: {"send_waits": [(3e-4, 20)]}}]
    seconds, details = send_waits(per_rank)
    assert seconds == pytest.approx(9e-4 / 40) and details["sends"] == 40
    with pytest.raises(ValueError, match="no send request"):
        send_waits([{2: {"send_waits": [(0.0, 0)]}}])


def test_receive_posting_is_the_mean_over_every_receive_of_every_rank():
    per_rank = [{2: {"posting": [(1e-3, 10), (3e-3, 10)]}}, {2: {"posting": [(0.0, 0)]}, 8: {"posting": [(2e-3, 20)]}}]
    seconds, details = receive_posting(per_rank)
    assert seconds == pytest.approx(6e-3 / 40) and details["receives"] == 40
    with pytest.raises(ValueError, match="posted no receive"):
        receive_posting([{2: {"posting": [(0.0, 0)]}}])


def test_the_issue_curve_is_the_mean_per_bucket_size_over_every_rank():
    curve, details = issue_curve([[(1024, 1e-4), (1024, 3e-4), (4096, 5e-4)], [(4100, 7e-4)]])
    assert curve(1024) == pytest.approx(2e-4) and curve(4096) == pytest.approx(6e-4)   # 4100 B is 4 KiB
    assert details["issues"] == 4
    assert issue_curve([[], []]) == (None, {})


def test_the_issue_curve_does_not_grow_past_the_largest_bucket_measured():
    """Buckets a few bytes apart with different means once made a line so steep that an 8 MiB
    bucket cost 95 ms to issue; sizes are binned and the curve is flat past the last one."""
    curve, _ = issue_curve([[(4 << 20, 5.0e-4), ((4 << 20) + 2048, 5.4e-4), ((4 << 20) + 4096, 5.9e-4)]])
    assert curve(8 << 20) == curve(4 << 20) == curve(1 << 34) == pytest.approx(5.43e-4, rel=1e-2)


def test_summary_line_says_what_one_rank_could_not_measure():
    """A one-rank calibration (`autopar profile --topology local:1`, or one GPU) has no peer for
    messages, all-reduces or exchanges: its line says so instead of printing the defaults it keeps."""
    from dataclasses import replace

    from autopar.planner.cost.calibration import default_calibration
    from autopar.trainer.calibrate import summary, summary_line
    two = default_calibration("CPU-core", "gloo", 2)
    line = summary_line(two)
    assert line.startswith("p2p ") and "all-reduce" in line and "exchange " in line and "not measured" not in line
    one = replace(default_calibration("H200-SXM-141GB", "nccl", 1),
                  details=(("not_measured", ["p2p", "allreduce", "exchange_s"]),))
    line = summary_line(one)
    assert line.startswith("p2p and all-reduce not measured (one rank: no peer); overheads fwd ")
    assert "exchange not measured" in line and " us at 1 MiB" not in line
    assert summary(one)["not_measured"] == ["p2p", "allreduce", "exchange_s"]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_models_own_steps_give_its_runtime_work_per_task_and_the_cache_keeps_it(tmp_path, monkeypatch):
    """`model_overheads` steps the model whole on both ranks and divides the work between the
    runtime's spans by the tasks the simulator counts; `ensure_model_overheads` stores it under
    the cache's calibration and the graph's fingerprint, keeps it on the next call, measures it
    again when asked, and skips a cache with no calibration to go with."""
    import dataclasses

    from autopar.planner.cost import default_calibration
    from autopar.planner.ir import import_spec
    from autopar.planner.sim import requires_grad
    from autopar.planner.zoo import load_model
    from autopar.trainer import calibrate as calib
    from autopar.trainer.calibrate import ensure_model_overheads
    from autopar.trainer.errors import RankFailedError
    options = {"batch": 4}
    graph = import_spec(load_model("lenet", **options))
    got = calib.model_overheads("lenet", options, 2, quick=True)
    assert got["fingerprint"] == graph.fingerprint and got["ranks"] == 2
    assert got["fwd_tasks"] == len(graph.ops) and got["bwd_tasks"] == sum(requires_grad(graph)) > 0
    assert 0 < got["fwd_task_s"] < 5e-3 and 0 <= got["bwd_task_s"] < 5e-3 and got["steps"] == calib.MODEL_STEPS[True][1]
    # Every op with inputs calls its exchange forward; lenet's chain is one autograd call backward.
    assert 0 < got["exchange_call_s"][0] < 5e-3 and got["exchange_call_s"][1] == 0
    # Its data-parallel steps with their buckets' all-reduces and without, in alternating blocks:
    # the buckets are those the simulator plans for data parallelism.
    from autopar.planner.cost import ProfileCache as _Cache
    from autopar.planner.cost import CostModel
    from autopar.planner.hardware import get_preset
    from autopar.planner.ir import data_parallel
    from autopar.planner.sim import TaskGraphBuilder, simulate_strategy
    untimed, blocks, per_block = calib.SYNC_STEPS[True]
    sync = got["sync"]
    assert sync["steps"] == 2 * blocks * per_block and sync["with_s"] > 0 and sync["without_s"] > 0
    assert sync["added_s"] == max(0.0, sync["with_s"] - sync["without_s"])
    tg = simulate_strategy(TaskGraphBuilder(graph, get_preset("local:2"), CostModel(_Cache()).bind(graph)),
                           data_parallel(graph, 2))[2]
    assert sorted(sync["buckets"]) == sorted(int(tg.task(k).nbytes) for k in tg if k[0] == 2 and len(k) == 3)

    cache = ProfileCache.load(tmp_path / "profile.json")
    assert ensure_model_overheads(cache, "lenet", options, 2)["status"] == "skipped"
    cal = dataclasses.replace(default_calibration("CPU-core", "gloo", 2), source="measured")
    cache.put_calibration(cal)
    calls = []
    monkeypatch.setattr(calib, "model_overheads", lambda *a, **k: calls.append(a) or {**got, "fwd_task_s": 7e-5})
    first = ensure_model_overheads(cache, "lenet", options, 2)
    assert first["status"] == "measured" and first["fwd_task_us"] == 70.0 and len(calls) == 1
    ratio = sync["added_s"] / sum(cal.allreduce_time(b, 2) for b in sync["buckets"])
    assert first["allreduce_in_step"] == round(ratio, 3) and "all-reduces add" in first["line"]
    assert first["sync_steps"] == {k: sync[k] for k in ("with_s", "without_s", "steps")}
    saved = ProfileCache.load(tmp_path / "profile.json")
    assert saved.allreduce_in_step(cal, graph.fingerprint) == pytest.approx(ratio)
    assert first["exchange_call_us"] == [round(got["exchange_call_s"][0] * 1e6, 1), 0.0]
    saved = ProfileCache.load(tmp_path / "profile.json")
    assert saved.overheads(cal, graph.fingerprint)[0] == 7e-5 and \
        saved.exchange_overheads(cal, graph.fingerprint) == got["exchange_call_s"]
    kept = ensure_model_overheads(cache, "lenet", options, 2)
    assert kept["status"] == "kept" and kept["exchange_call_us"] == first["exchange_call_us"] and len(calls) == 1
    assert "sync_steps" not in kept                                   # the cache keeps the ratio, not the steps
    assert ensure_model_overheads(cache, "lenet", options, 2, remeasure=True)["status"] == "measured"
    assert len(calls) == 2

    def fails(*a, **k):
        raise RankFailedError(1, "rank 1 exited with code 1")
    monkeypatch.setattr(calib, "model_overheads", fails)
    failed = ensure_model_overheads(cache, "lenet", options, 2, remeasure=True)
    assert failed["status"] == "failed" and "rank 1 exited" in failed["line"]
    assert "per-op figures are used" in failed["line"]
    assert cache.overheads(cal, graph.fingerprint)[0] == 7e-5          # what was measured before stays
