"""`helm lint --strict` for the default values and each case of test_render.py, and the values
schema (values.schema.json) refusing values the chart cannot use."""

from __future__ import annotations

import pytest

from tests.chart.render import CHART, render_text, run, values_file
from tests.chart.test_render import CASES


@pytest.mark.parametrize("case", list(CASES))
def test_helm_lint_strict_passes(helm, case, tmp_path):
    path = values_file(CASES[case], tmp_path)
    out = run([helm, "lint", "--strict", CHART, "-f", path], check=False)
    assert out.returncode == 0 and "0 chart(s) failed" in out.stdout, out.stdout + out.stderr


BAD_VALUES = {
    "no replicas": ({"replicaCount": 0}, "replicaCount"),
    "namespaces as a string": ({"watchNamespaces": "team-a"}, "watchNamespaces"),
    "a namespace that is no DNS label": ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    "unknown device": ({"operator": {"device": "tpu"}}, "device"),
    "misspelt key": ({"replicas": 2}, "replicas"),
    "misspelt nested key": ({"metrics": {"serviceMonitor": {"enable": True}}}, "enable"),
    "bad digest": ({"image": {"repository": "x", "digest": "latest"}}, "digest"),
    "no such search bucket": ({"metrics": {"prometheusRule": {"slowSearchSeconds": 450}}}, "slowSearchSeconds"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_values_schema_refuses(helm, case):
    values, field = BAD_VALUES[case]
    with pytest.raises(AssertionError) as e:
        render_text(helm, values)
    assert "values don't meet the specifications of the schema" in str(e.value) and field in str(e.value)


def test_lint_fails_on_a_broken_template(helm, tmp_path):
    """Lint can fail: a copy of the chart with a template that does not parse."""
    import shutil
    copy = tmp_path / "autopar"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "broken.yaml").write_text("{{ if }}\n")
    assert run([helm, "lint", "--strict", copy], check=False).returncode != 0
