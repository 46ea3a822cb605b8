"""The chart's CRD is the repository's crds/ file, byte for byte (`autopar crd` generates it)."""

from __future__ import annotations

import yaml

from tests.chart.render import CHART, ROOT

NAME = "paralleltrainingjobs.autopar.dev.yaml"


def test_the_charts_crd_is_the_same_file_as_crds():
    chart, repo = (CHART / "crds" / NAME).read_bytes(), (ROOT / "crds" / NAME).read_bytes()
    assert chart == repo, f"charts/autopar/crds/{NAME} differs from crds/{NAME}: cp crds/{NAME} charts/autopar/crds/"


def test_the_chart_brings_kopfs_peering_crds():
    docs = list(yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text()))
    names = {(d["spec"]["names"]["kind"], d["spec"]["scope"]) for d in docs}
    assert names == {("ClusterKopfPeering", "Cluster"), ("KopfPeering", "Namespaced")}
    assert {d["spec"]["group"] for d in docs} == {"kopf.dev"}
