"""The chart's alerts (templates/prometheusrule.yaml, default values): `promtool check rules`
and `promtool test rules` with charts/autopar/tests/alerts_test.yaml; and every autopar_ metric
the alerts and the dashboard query is one the operator exports (operator/metrics.py)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from autopar.operator.metrics import OperatorMetrics
from tests.chart.render import CHART, one, render, run

RULES_TEST = CHART / "tests" / "alerts_test.yaml"
ENABLED = {"metrics": {"prometheusRule": {"enabled": True}}}


@pytest.fixture(scope="module")
def rules(helm) -> dict:
    return one(render(helm, ENABLED), "PrometheusRule")["spec"]


@pytest.fixture
def rules_dir(rules, tmp_path):
    (tmp_path / "autopar-alerts.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    return tmp_path


def test_promtool_accepts_the_rules(promtool, rules_dir):
    out = run([promtool, "check", "rules", rules_dir / "autopar-alerts.yaml"])
    assert "SUCCESS: 6 rules found" in out.stdout, out.stdout


def test_promtool_unit_tests_of_the_alerts_pass(promtool, rules_dir):
    out = run([promtool, "test", "rules", rules_dir / RULES_TEST.name], check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    alerts = {r["alert"] for g in yaml.safe_load((rules_dir / "autopar-alerts.yaml").read_text())["groups"]
              for r in g["rules"]}
    assert tested == alerts, f"alerts without a unit test: {alerts - tested}"


def test_promtool_catches_a_broken_rule_and_a_wrong_threshold(promtool, rules, rules_dir):
    """Both checks can fail: a rule that does not parse, and a threshold the tests pin down."""
    bad = json.loads(json.dumps(rules))
    bad["groups"][0]["rules"][0]["expr"] = "abs(autopar_job_prediction_error > "
    (rules_dir / "autopar-alerts.yaml").write_text(yaml.safe_dump(bad))
    assert run([promtool, "check", "rules", rules_dir / "autopar-alerts.yaml"], check=False).returncode != 0
    moved = json.loads(json.dumps(rules))
    moved["groups"][0]["rules"][0]["expr"] = "abs(autopar_job_prediction_error) > 0.05"
    (rules_dir / "autopar-alerts.yaml").write_text(yaml.safe_dump(moved))
    assert run([promtool, "test", "rules", rules_dir / RULES_TEST.name], check=False).returncode != 0


def test_thresholds_come_from_the_values(helm):
    values = {"metrics": {"prometheusRule": {"enabled": True, "predictionErrorThreshold": 0.1,
                                             "predictionErrorFor": "1h", "replans": 5, "replanWindow": "6h",
                                             "slowSearchSeconds": 300}}}
    spec = one(render(helm, values), "PrometheusRule")["spec"]
    by = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    assert by["AutoparPredictionErrorHigh"]["expr"].endswith("> 0.1")
    assert by["AutoparPredictionErrorHigh"]["for"] == "1h"
    assert "[6h]) >= 5" in by["AutoparJobReplanningRepeatedly"]["expr"]
    assert 'le="300.0"' in by["AutoparPlanSearchSlow"]["expr"]


def _exported_names() -> set[str]:
    """Every sample name the operator's /metrics can carry (a job observed in every field)."""
    from autopar.reference import operator_exposition
    text = operator_exposition()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def _queried(text: str) -> set[str]:
    return set(re.findall(r"\b(autopar_[a-z_]+)\b", text))


def test_alerts_and_dashboard_query_only_metrics_the_operator_exports(rules):
    exported = _exported_names()
    assert {"autopar_job_simulated_step_seconds", "autopar_job_actual_step_seconds",
            "autopar_job_prediction_error"} <= exported
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    dashboard = (CHART / "dashboards" / "autopar-jobs.json").read_text()
    exprs_dash = " ".join(t["expr"] for p in json.loads(dashboard)["panels"] for t in p.get("targets", []))
    for what, text in (("alerts", exprs), ("dashboard", exprs_dash)):
        unknown = _queried(text) - exported
        assert not unknown, f"the {what} query metrics the operator does not export: {sorted(unknown)}"
    # le="600.0": how prometheus_client writes the bucket the slow-search alert reads
    assert 'autopar_plan_search_seconds_bucket{le="600.0"}' in OperatorMetrics().exposition().decode()
