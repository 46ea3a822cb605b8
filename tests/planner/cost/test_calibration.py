"""Runtime calibrations: monotone communication curves, and the profile cache keeps them."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.cost.calibration import Curve, RuntimeCalibration, default_calibration, usable_cores
from autopar.planner.cost.profile_cache import ProfileCache
from autopar.planner.errors import CostModelError


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1 << 26), st.floats(1e-6, 1.0)), min_size=1, max_size=30),
       st.lists(st.integers(0, 1 << 27), min_size=2, max_size=10))
def test_a_fitted_curve_never_makes_more_bytes_cheaper(samples, queries):
    curve = Curve.fit(samples)
    values = [curve(q) for q in sorted(queries)]
    assert all(b >= a - 1e-15 for a, b in zip(values, values[1:]))
    # Pool-adjacent-violators keeps the mean: the fitted values average the samples.
    lo, hi = min(s for _, s in samples), max(s for _, s in samples)
    assert all(lo - 1e-12 <= curve(b) <= hi + 1e-12 for b, _ in samples)


def test_a_curve_interpolates_linearly_and_extends_its_last_slope():
    curve = Curve.fit([(0, 1.0), (10, 2.0), (20, 4.0)])
    assert curve(5) == pytest.approx(1.5) and curve(15) == pytest.approx(3.0)
    assert curve(30) == pytest.approx(6.0)            # the last segment's slope, 0.2 s per byte
    assert curve(-5) == 1.0


def test_a_curve_flat_after_its_last_point_keeps_its_range_and_holds_its_last_value():
    curve = Curve.fit([(0, 1.0), (10, 2.0), (20, 4.0)]).flat_after_last()
    assert curve(15) == pytest.approx(3.0) and curve(30) == curve(1e12) == pytest.approx(4.0)
    assert curve.flat_after_last() == curve
    issue = default_calibration("CPU-core", "gloo", 2).issue_time
    assert issue(64 << 20) == issue(4 << 20) > issue(64 << 10) > 0


def test_a_curve_refuses_decreasing_points():
    with pytest.raises(CostModelError, match="non-decreasing"):
        Curve(((0.0, 2.0), (10.0, 1.0)))


def test_the_profile_cache_keeps_calibrations_across_a_save(tmp_path):
    cache = ProfileCache(path=tmp_path / "p.json")
    from dataclasses import replace
    cal = replace(default_calibration("CPU-core", "gloo", 2), wire=Curve.fit([(0, 0.0), (1 << 20, 2e-4)]),
                  jitter=7e-5, latency_var=Curve.fit([(1 << 10, 1e-9), (1 << 20, 4e-8)]),
                  leave_var=Curve.fit([(1 << 10, 1e-8), (1 << 20, 2e-6)]))
    cache.put_calibration(cal)
    cache.put_calibration(default_calibration("CPU-core", "gloo", 4))        # no wire curve
    cache.save()
    again = ProfileCache.load(tmp_path / "p.json")
    got = again.calibration("CPU-core", "gloo", 2)
    assert got == cal and again.calibration("CPU-core", "gloo", 3) is None
    assert got.wire_time(1 << 19) == pytest.approx(1e-4) and again.calibration("CPU-core", "gloo", 4).wire is None
    assert got.allreduce_time(1 << 20, 2) == cal.allreduce[0][1](1 << 20)
    assert got.optimizer_time("sgd", 2, 1e6) == pytest.approx(2 * 15e-6 + 1e6 * 0.55e-9)
    assert got.optimizer_time("lamb", 2, 1e6) is None
    assert got.jitter == 7e-5 and got.leave_var(1 << 20) == 2e-6 and got.latency_var(1 << 10) == 1e-9
    default = again.calibration("CPU-core", "gloo", 4)      # the arrival noise: not measured
    assert (default.jitter, default.latency_var, default.leave_var) == (0.0, None, None)


def test_a_calibration_with_a_missing_field_names_it():
    doc = default_calibration("CPU-core", "gloo", 2).to_json()
    del doc["p2p"]
    with pytest.raises(CostModelError, match="p2p"):
        RuntimeCalibration.from_json(doc)


def test_a_one_way_message_costs_its_own_curve_where_one_was_measured(tmp_path):
    from dataclasses import replace
    cal = default_calibration("CPU-core", "gloo", 2)
    assert cal.p2p_oneway is not None and cal.receives_ahead
    assert cal.message_time(1 << 20, two_way=False) == cal.p2p_oneway(1 << 20)
    assert cal.p2p_oneway(1 << 20) < cal.message_time(1 << 20) == cal.p2p(1 << 20)
    plain = replace(cal, p2p_oneway=None)               # measured before one-way messages were apart
    assert plain.message_time(1 << 20, two_way=False) == plain.p2p(1 << 20)
    assert RuntimeCalibration.from_json(plain.to_json()) == plain and "p2p_oneway" not in plain.to_json()
    assert RuntimeCalibration.from_json(cal.to_json()) == cal
    assert not replace(cal, backend="nccl").receives_ahead    # NCCL posts a receive with its exchange


def test_a_senders_own_call_is_kept_with_the_calibration_where_measured():
    from dataclasses import replace
    cal = default_calibration("CPU-core", "gloo", 2)
    assert cal.send_call is not None and cal.send_call(2 << 20) > cal.send_call(2 << 10) > 0
    assert RuntimeCalibration.from_json(cal.to_json()).send_call == cal.send_call
    plain = replace(cal, send_call=None)                # measured before the sender's call was
    assert "send_call" not in plain.to_json() and RuntimeCalibration.from_json(plain.to_json()) == plain
    assert default_calibration("H100", "nccl", 2).send_call is None      # nothing measured on GPUs


def test_drawing_a_synthetic_tensor_costs_its_kind_per_tensor_and_per_element(tmp_path):
    from dataclasses import replace
    cal = replace(default_calibration("CPU-core", "gloo", 2), draw=(("float", 1e-5, 2e-9), ("int", 3e-6, 1e-9)))
    assert cal.draw_time(True, 1000) == pytest.approx(1e-5 + 2e-6)
    assert cal.draw_time(False, 1000) == pytest.approx(3e-6 + 1e-6)
    assert replace(cal, draw=()).draw_time(True, 1000) == 0.0          # not measured: nothing
    assert default_calibration("GPU", "nccl", 2).draw == ()             # a GPU rank draws on its device
    cache = ProfileCache(path=tmp_path / "p.json")
    cache.put_calibration(cal)
    cache.save()
    assert ProfileCache.load(tmp_path / "p.json").calibration("CPU-core", "gloo", 2).draw == cal.draw
    doc = cal.to_json()
    del doc["draw"]                                                      # a file from before it was measured
    assert RuntimeCalibration.from_json(doc).draw == ()


def test_without_arrival_noise_drops_every_part_of_it():
    from dataclasses import replace
    cal = default_calibration("CPU-core", "gloo", 2)
    assert not cal.measures_arrival_noise
    for noise in ({"jitter": 1e-5}, {"latency_var": Curve.fit([(1, 1e-9)])}, {"leave_var": Curve.fit([(1, 1e-9)])}):
        noisy = replace(cal, **noise)
        assert noisy.measures_arrival_noise and not noisy.without_arrival_noise().measures_arrival_noise
        assert noisy.without_arrival_noise() == cal


def _cgroups(tmp_path, files: dict[str, str], own: str):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "own").write_text(own)
    return tmp_path, tmp_path / "own"


def test_usable_cores_takes_the_smallest_cgroup_v2_quota_above_the_process(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    # A pod limited to 1.5 CPUs, inside a node slice without a limit: floor(1.5) = 1 core.
    root, own = _cgroups(tmp_path, {"cpu.max": "max 100000\n", "kubepods/cpu.max": "max 100000\n",
                                    "kubepods/pod1/cpu.max": "150000 100000\n"}, "0::/kubepods/pod1/c1\n")
    assert usable_cores(root, own) == 1
    # A limit on a group above the process's applies to it too.
    (root / "kubepods/cpu.max").write_text("100000 100000\n")
    (root / "kubepods/pod1/cpu.max").write_text("max 100000\n")
    assert usable_cores(root, own) == 1
    # No quota anywhere: the affinity mask decides; a quota above it changes nothing.
    (root / "kubepods/cpu.max").write_text("max 100000\n")
    assert usable_cores(root, own) == affinity
    (root / "kubepods/pod1/cpu.max").write_text(f"{(affinity + 3) * 100000} 100000\n")
    assert usable_cores(root, own) == affinity


def test_usable_cores_reads_a_cgroup_v1_cpu_quota_and_ignores_what_it_cannot_read(tmp_path):
    v1 = {"cpu,cpuacct/cpu.cfs_quota_us": "100000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    root, own = _cgroups(tmp_path, v1, "12:memory:/\n4:cpu,cpuacct:/\n0::/\n")
    assert usable_cores(root, own) == 1
    (root / "cpu,cpuacct/cpu.cfs_quota_us").write_text("-1\n")     # v1's "no limit"
    assert usable_cores(root, own) == len(os.sched_getaffinity(0))
    (root / "cpu,cpuacct/cpu.cfs_quota_us").write_text("garbage\n")
    assert usable_cores(root, own) == len(os.sched_getaffinity(0))
    assert usable_cores(root, tmp_path / "missing") == len(os.sched_getaffinity(0))


def test_the_default_calibration_counts_a_quota_of_one_core_as_shared_with_gloo(tmp_path, monkeypatch):
    from autopar.planner.cost import calibration
    root, own = _cgroups(tmp_path, {"cpu.max": "100000 100000\n"}, "0::/\n")
    monkeypatch.setattr(calibration, "CGROUP_ROOT", root)
    monkeypatch.setattr(calibration, "OWN_CGROUPS", own)
    assert default_calibration("CPU-core", "gloo", 1).comm_uses_cores        # 1 core < 2 per rank
    if len(os.sched_getaffinity(0)) >= 2:
        (root / "cpu.max").write_text("max 100000\n")
        assert not default_calibration("CPU-core", "gloo", 1).comm_uses_cores
