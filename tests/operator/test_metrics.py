"""The operator's metrics: the job's gauges from its status, jobs by phase, forgetting a deleted
job, and the /metrics, /healthz and /readyz endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from autopar.operator.metrics import OperatorMetrics


def _samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


JOB = (("job", "quickstart"), ("namespace", "team-a"))


def test_job_gauges_follow_the_status():
    m = OperatorMetrics()
    m.observe_job("team-a", "quickstart", {"phase": "Training", "simulatedStepSeconds": 0.0643,
                                           "dataParallelStepSeconds": 0.0868, "actualStepSeconds": 0.0788,
                                           "predictionError": -0.184, "completedSteps": 12})
    s = _samples(m)
    assert s[("autopar_job_simulated_step_seconds", JOB)] == 0.0643
    assert s[("autopar_job_actual_step_seconds", JOB)] == 0.0788
    assert s[("autopar_job_prediction_error", JOB)] == -0.184
    assert abs(s[("autopar_job_predicted_speedup", JOB)] - 0.0868 / 0.0643) < 1e-9
    assert s[("autopar_jobs", (("phase", "Training"),))] == 1 and s[("autopar_jobs", (("phase", "Failed"),))] == 0
    m.restarted("team-a", "quickstart")
    m.searched(12.0)
    assert _samples(m)[("autopar_job_restarts_total", JOB)] == 1
    assert _samples(m)[("autopar_plan_search_seconds_count", ())] == 1


def test_a_job_moves_between_phases_and_is_forgotten_when_deleted():
    m = OperatorMetrics()
    m.observe_job("ns", "a", {"phase": "Planning"})
    m.observe_job("ns", "b", {"phase": "Planning", "simulatedStepSeconds": 0.1})
    m.observe_job("ns", "a", {"phase": "Training"})
    s = _samples(m)
    assert s[("autopar_jobs", (("phase", "Planning"),))] == 1 and s[("autopar_jobs", (("phase", "Training"),))] == 1
    m.forget_job("ns", "b")
    s = _samples(m)
    assert s[("autopar_jobs", (("phase", "Planning"),))] == 0
    assert not any(name == "autopar_job_simulated_step_seconds" and ("job", "b") in labels for name, labels in s)


def test_endpoints():
    m = OperatorMetrics()
    ready = {"ok": False}
    server = m.serve(0, "127.0.0.1", ready=lambda: ready["ok"])
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert b"autopar_jobs" in urllib.request.urlopen(base + "/metrics").read()
        assert urllib.request.urlopen(base + "/healthz").status == 200
        try:
            urllib.request.urlopen(base + "/readyz")
            raise AssertionError("not ready yet, but /readyz said 200")
        except urllib.error.HTTPError as e:
            assert e.code == 503
        ready["ok"] = True
        assert urllib.request.urlopen(base + "/readyz").status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_job_phase_is_one_for_the_current_phase_and_zero_for_the_others_until_forgotten():
    from autopar.job.spec import PHASES

    m = OperatorMetrics()
    m.observe_job("ns", "a", {"phase": "Planning"})
    m.observe_job("ns", "a", {"phase": "Training"})
    m.observe_job("ns", "b", {"phase": "Succeeded"})
    s = _samples(m)

    def phase(job: str, p: str) -> float | None:
        return s.get(("autopar_job_phase", (("job", job), ("namespace", "ns"), ("phase", p))))
    assert {p: phase("a", p) for p in PHASES} == {p: 1.0 if p == "Training" else 0.0 for p in PHASES}
    assert phase("b", "Succeeded") == 1.0 and phase("b", "Training") == 0.0
    m.observe_job("ns", "a", {"completedSteps": 3})             # no phase in the patch: unchanged
    assert _samples(m)[("autopar_job_phase", (("job", "a"), ("namespace", "ns"), ("phase", "Training")))] == 1.0
    m.forget_job("ns", "a")
    s = _samples(m)
    assert not any(name == "autopar_job_phase" and ("job", "a") in labels for name, labels in s)
    assert phase("b", "Succeeded") == 1.0


def test_topology_discovery_seconds_is_a_histogram():
    m = OperatorMetrics()
    m.discovered(0.004)
    m.discovered(0.3)
    s = _samples(m)
    assert s[("autopar_topology_discovery_seconds_count", ())] == 2
    assert abs(s[("autopar_topology_discovery_seconds_sum", ())] - 0.304) < 1e-9
    assert s[("autopar_topology_discovery_seconds_bucket", (("le", "0.005"),))] == 1
