"""`autopar bench operator` at toy size: a control plane of its own (with an audit log), 10 KWOK
nodes, 3 jobs with pinned plans; the document has every figure and target, and every job got its
trainer pods.  The benchmark's numbers are not checked here (they are what the benchmark reports)."""

from __future__ import annotations

import pytest

from autopar import bench_operator as b

pytestmark = pytest.mark.controlplane


def test_percentile_is_nearest_rank():
    assert b.percentile([], 95) is None
    assert b.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert b.percentile([float(i) for i in range(1, 101)], 95) == 95.0


def test_error_lines_tell_handler_failures_from_retried_requests():
    handler, other = b.error_lines(
        "x ERROR kopf.objects: Timer 'tick' failed with an exception. Will retry.\n"
        "x ERROR kopf._cogs.clients.watching: Request attempt #1/9 failed; will retry\n"
        "x INFO kopf.objects: Timer 'tick' succeeded.\n")
    assert len(handler) == 1 and "Timer 'tick'" in handler[0]
    assert len(other) == 1 and "watching" in other[0]


def test_the_operators_discovery_histogram_is_read_from_its_metrics():
    from autopar.operator.metrics import OperatorMetrics

    m = OperatorMetrics()
    for seconds in [0.002] * 18 + [0.03, 0.7]:
        m.discovered(seconds)
    got = b.discovery_from_metrics(m.exposition().decode())
    assert got["calls"] == 20 and abs(got["mean"] - (18 * 0.002 + 0.73) / 20) < 1e-4
    assert got["p50_le"] == 0.0025 and got["p95_le"] == 0.05 and got["max_le"] == 1.0
    assert b.discovery_from_metrics("autopar_jobs{phase=\"Training\"} 1.0\n") is None


def test_a_small_run_gives_every_figure_and_every_job_its_pods(controlplane_binaries):
    doc = b.run_operator_bench(nodes=10, jobs=3, progress=True, timeout=60)
    assert doc["benchmark"] == "operator"
    assert doc["inputs"]["nodes"] == 10 and doc["inputs"]["jobs"] == 3 and doc["inputs"]["trainer_pods"] == 4
    lat = doc["create_to_pods_s"]
    assert lat["jobs"] == 3 and set(lat["per_job"]) == {"bench-000", "bench-001", "bench-002"}
    assert 0 < lat["p50"] <= lat["p95"] <= lat["max"]
    assert doc["discovery_s"]["nodes"] == 10 and doc["discovery_s"]["calls"] == 3
    assert doc["discovery_s"]["operator"]["calls"] >= 3        # the operator's own, one per reconcile
    api = doc["api_requests"]
    assert api["per_job"] > 0 and api["by_request"].get("create pods", 0) >= 4
    assert doc["operator_peak_rss_mb"] > 0
    assert set(doc["targets"]) == {*b.TARGETS, "all_jobs_have_pods"}
    assert doc["targets"]["all_jobs_have_pods"]["pass"]
    assert all({"target", "value", "pass"} <= set(t) for t in doc["targets"].values())
    assert doc["pass"] == all(t["pass"] for t in doc["targets"].values())
    assert doc["job_phases"] == {"Training": 3}
