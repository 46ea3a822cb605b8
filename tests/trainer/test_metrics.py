"""Rank 0 serves a step-time histogram and a step counter in Prometheus format."""

from __future__ import annotations

import urllib.request

from autopar.trainer.metrics import StepMetrics, median_step


def test_the_endpoint_exports_step_times_and_the_step_count():
    m = StepMetrics("lenet", "data-parallel", predicted=0.01, port=0)
    try:
        m.record(0.02, 2.3, 64)
        m.record(0.03, 2.2, 64)
        body = urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10).read().decode()
    finally:
        m.close()
    labels = 'model="lenet",strategy="data-parallel"'
    assert f"autopar_trainer_steps_total{{{labels}}} 2.0" in body
    assert f'autopar_trainer_step_seconds_bucket{{le="0.025",{labels}}} 1.0' in body
    assert f"autopar_trainer_step_seconds_count{{{labels}}} 2.0" in body
    assert f"autopar_trainer_predicted_step_seconds{{{labels}}} 0.01" in body
    assert f"autopar_trainer_loss{{{labels}}} 2.2" in body


def test_the_median_leaves_out_the_warm_up_step():
    assert median_step([5.0, 1.0, 2.0, 3.0]) == 2.0
    assert median_step([5.0]) == 5.0
    assert median_step([]) is None
