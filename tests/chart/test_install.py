"""`helm install`, `helm upgrade` and `helm uninstall` of the chart into the tests' real control
plane (tests/controlplane): the objects exist and the API server accepts them (with
prometheus-operator's CRDs installed, the ServiceMonitor and PrometheusRule too); the operator's
ServiceAccount may create the per-job Roles of operator/resources.py (the API server's RBAC
escalation check) and nothing it was not granted; an upgrade to two replicas brings kopf's
peering; and the CRD survives the uninstall (and stays the one other tests installed, if they
did)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from autopar.operator import resources as r
from tests.chart.render import CHART, RELEASE, run, values_file
from tests.operator.test_resources import UID, make_job

pytestmark = pytest.mark.controlplane

RELEASE_NS = "autopar-chart-test"
CRD = "paralleltrainingjobs.autopar.dev"
PROMETHEUS_CRDS = CHART.parents[1] / "tests" / "chart" / "data" / "prometheus-operator"


def _helm(helm, plane, *args, check=True):
    return run([helm, "--kubeconfig", plane.kubeconfig, *args], check=check, timeout=300)


def _exists(plane, *what) -> bool:
    return plane.kubectl("get", *what, check=False).returncode == 0


def _uid(plane, *what) -> str | None:
    out = plane.kubectl("get", *what, "-o", "json", check=False)
    return json.loads(out.stdout)["metadata"]["uid"] if out.returncode == 0 else None


def _wait_established(plane, crd: str) -> None:
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    plane.wait_for(f"CRD {crd} Established", lambda: plane.kubectl(
        "get", "crd", crd, "-o", f"jsonpath={jsonpath}", check=False).stdout.strip() == "True")


def _dry_run_as(plane, kubeconfig, obj) -> tuple[int, str]:
    out = plane.kubectl("create", "--dry-run=server", "-f", "-", kubeconfig=kubeconfig,
                        input=yaml.safe_dump(obj), check=False)
    return out.returncode, out.stdout + out.stderr


def test_install_upgrade_uninstall(helm, controlplane, namespace, tmp_path):
    plane = controlplane
    crd_uid_before = _uid(plane, "crd", CRD)            # set when crd_installed ran before this test
    plane.kubectl("apply", "--server-side", "-f", str(PROMETHEUS_CRDS))
    for name in ("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"):
        _wait_established(plane, name)
    values = values_file({"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}},
                         tmp_path)
    try:
        # -- install
        out = _helm(helm, plane, "install", RELEASE, CHART, "--namespace", RELEASE_NS, "--create-namespace",
                    "-f", values)
        assert "STATUS: deployed" in out.stdout and "rollout status deployment/autopar" in out.stdout
        _wait_established(plane, CRD)
        for what in (("deployment", RELEASE), ("serviceaccount", RELEASE), ("service", f"{RELEASE}-metrics"),
                     ("configmap", f"{RELEASE}-dashboard"), ("servicemonitor", RELEASE), ("prometheusrule", RELEASE)):
            assert _exists(plane, *what, "-n", RELEASE_NS), what
        for what in (("clusterrole", RELEASE), ("clusterrole", f"{RELEASE}-delegate"),
                     ("clusterrolebinding", RELEASE), ("clusterrolebinding", f"{RELEASE}-delegate")):
            assert _exists(plane, *what), what
        if crd_uid_before:
            assert _uid(plane, "crd", CRD) == crd_uid_before

        # -- the operator's ServiceAccount, as the API server sees it
        sa = plane.as_service_account(RELEASE, RELEASE_NS)

        def can(verb, resource, ns=namespace):
            return plane.kubectl("auth", "can-i", verb, resource, "-n", ns, kubeconfig=sa,
                                 check=False).stdout.strip() == "yes"
        assert can("create", "pods") and can("delete", "pods") and can("watch", "nodes")
        assert can("patch", "paralleltrainingjobs.autopar.dev/status") and can("create", "roles.rbac.authorization.k8s.io")
        assert not can("get", "secrets") and not can("update", "deployments.apps") and not can("delete", "services")
        job = make_job("chart", namespace=namespace)
        for role in (r.planner_role(job, UID), r.progress_role(job, UID)):
            role["metadata"].pop("ownerReferences")          # no such job here: only the Role is at stake
            rc, msg = _dry_run_as(plane, sa, role)
            assert rc == 0, f"the operator may not create {role['metadata']['name']}: {msg}"
        greedy = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": "greedy", "namespace": namespace},
                  "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}
        rc, msg = _dry_run_as(plane, sa, greedy)
        assert rc != 0 and "permissions not currently held" in msg, msg     # RBAC refuses a Role beyond its own

        # -- upgrade: two replicas, kopf peering
        out = _helm(helm, plane, "upgrade", RELEASE, CHART, "--namespace", RELEASE_NS, "-f", values,
                    "--set", "replicaCount=2")
        assert "STATUS: deployed" in out.stdout
        deployment = plane.get("deployment", RELEASE, "-n", RELEASE_NS)
        assert deployment["spec"]["replicas"] == 2
        assert f"--peering={RELEASE}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert _exists(plane, "crd", "clusterkopfpeerings.kopf.dev")
        assert _exists(plane, "clusterkopfpeering.kopf.dev", RELEASE)
        assert plane.kubectl("auth", "can-i", "patch", f"clusterkopfpeerings.kopf.dev/{RELEASE}", kubeconfig=sa,
                             check=False).stdout.strip() == "yes"

        # -- upgrade: one namespace only (Roles there instead of the ClusterRole's namespaced rules)
        _helm(helm, plane, "upgrade", RELEASE, CHART, "--namespace", RELEASE_NS, "-f", values,
              "--set", f"watchNamespaces[0]={namespace}")
        assert _exists(plane, "role", RELEASE, "-n", namespace)
        assert _exists(plane, "clusterrole", f"{RELEASE}-cluster") and not _exists(plane, "clusterrole", RELEASE)
        assert not _exists(plane, "clusterkopfpeering.kopf.dev", RELEASE)
        time.sleep(0.5)                                          # RBAC's informers catch up
        assert can("create", "pods") and not can("create", "pods", ns="default")

        # -- uninstall
        out = _helm(helm, plane, "uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait")
        assert "uninstalled" in out.stdout
        for what in (("deployment", RELEASE, "-n", RELEASE_NS), ("servicemonitor", RELEASE, "-n", RELEASE_NS),
                     ("clusterrole", f"{RELEASE}-cluster"), ("role", RELEASE, "-n", namespace)):
            assert not _exists(plane, *what), what
        assert _exists(plane, "crd", CRD), "helm uninstall deleted the CRD"
        if crd_uid_before:
            assert _uid(plane, "crd", CRD) == crd_uid_before
        assert _exists(plane, "crd", "kopfpeerings.kopf.dev")
    finally:
        _helm(helm, plane, "uninstall", RELEASE, "--namespace", RELEASE_NS, check=False)
        plane.kubectl("delete", "namespace", RELEASE_NS, "--wait=false", check=False)


def test_install_and_uninstall_leave_an_installed_crd_alone(helm, crd_installed, tmp_path):
    """The CRD applied by other tests (the `crd_installed` fixture) is the one after the chart
    came and went: same uid, still Established, its objects still there."""
    plane = crd_installed
    uid = _uid(plane, "crd", CRD)
    assert uid
    release, ns = "autopar-crd-check", "autopar-chart-crd"
    try:
        _helm(helm, plane, "install", release, CHART, "--namespace", ns, "--create-namespace")
        assert _uid(plane, "crd", CRD) == uid
        _helm(helm, plane, "uninstall", release, "--namespace", ns, "--wait")
        assert _uid(plane, "crd", CRD) == uid
        _wait_established(plane, CRD)
        assert not _exists(plane, "deployment", f"{release}-autopar", "-n", ns)
    finally:
        _helm(helm, plane, "uninstall", release, "--namespace", ns, check=False)
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
