"""The Grafana dashboard (charts/autopar/dashboards/autopar-jobs.json) against Grafana's dashboard
schema: `dashboard-check` (tests/controlplane/grafana) decodes it with the strict decoders the
Grafana Foundation SDK generates from Grafana's own schema (unknown fields, wrong types and
missing required fields fail, in the dashboard, its panels, their options and their queries)
and runs the schema's constraints.  And it shows, per job, what the issue asks for."""

from __future__ import annotations

import copy
import json

import pytest

from tests.chart.render import CHART, run

DASHBOARD = CHART / "dashboards" / "autopar-jobs.json"


def test_the_dashboard_matches_grafanas_schema(dashboard_check):
    out = run([dashboard_check, DASHBOARD], check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith(": ok"), out.stdout + out.stderr


BREAKAGES = {
    "unknown top-level field": lambda d: d.update(pannels=[]),
    "wrong type": lambda d: d.update(refresh=30),
    "misspelt gridPos": lambda d: d["panels"][0]["gridPos"].update(wdith=3),
    "misspelt panel option": lambda d: d["panels"][0]["options"]["legend"].update(shwLegend=True),
    "misspelt query field": lambda d: d["panels"][0]["targets"][0].update(exprr="up"),
    "missing required field": lambda d: d.pop("schemaVersion"),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_dashboard_fails_the_check(dashboard_check, tmp_path, breakage):
    doc = copy.deepcopy(json.loads(DASHBOARD.read_text()))
    BREAKAGES[breakage](doc)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc))
    out = run([dashboard_check, path], check=False)
    assert out.returncode == 1, out.stdout


def test_the_dashboard_shows_each_job_what_the_issue_asks_for():
    doc = json.loads(DASHBOARD.read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in doc["panels"]}
    every = " ".join(exprs.values())
    for metric in ("autopar_job_simulated_step_seconds", "autopar_job_actual_step_seconds",
                   "autopar_job_prediction_error", "autopar_job_completed_steps", "autopar_job_restarts_total",
                   "autopar_job_replans_total", "autopar_jobs"):
        assert metric in every, metric
    step = next(e for t, e in exprs.items() if "simulated" in e and "actual" in e)   # one panel, both lines
    assert step
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= set(variables)
    per_job = [e for e in exprs.values() if "autopar_job_" in e]
    assert all('job=~"$job"' in e and 'namespace=~"$namespace"' in e for e in per_job)
    assert all(t["datasource"]["uid"] == "${datasource}" for p in doc["panels"] for t in p["targets"])
