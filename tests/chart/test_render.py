"""The chart rendered by the real `helm template` for its default values and for each documented
setting (one case each), every object validated against the Kubernetes v1.37 schemas
(kubernetes-validate, strict: a field the schema does not name fails) or, for the CRD-typed ones,
against their CRD's openAPIV3Schema (ServiceMonitor and PrometheusRule: prometheus-operator
v0.93.0's CRDs, vendored in tests/chart/data; KopfPeering and ClusterKopfPeering: the chart's
crds/kopf-peering.yaml), and checked for what the setting is for."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autopar.operator.reconcile import Settings
from tests.chart.render import CHART, NAMESPACE, RELEASE, find, one, operator_args, render

KUBERNETES = "1.37.0"
DATA = Path(__file__).parent / "data"
FULLNAME = f"{RELEASE}-autopar" if "autopar" not in RELEASE else RELEASE

CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "replicas": {"replicaCount": 3},
    "replicas-namespaces": {"replicaCount": 2, "watchNamespaces": ["team-a", "team-b"]},
    "namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "rbac-off": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops-made"}},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}},
    "prometheusrule": {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}},
    "images": {"image": {"registry": "registry.example.com:5000", "repository": "mirror/autopar-operator",
                         "tag": "0.1.0-rc1", "pullPolicy": "Always"},
               "trainerImage": {"registry": "", "repository": "mirror/autopar",
                                "digest": "sha256:" + "ab" * 32},
               "imagePullSecrets": [{"name": "mirror-pull"}]},
    "dashboard-off": {"grafanaDashboard": {"enabled": False}},
    "operator-options": {"operator": {"device": "cpu", "profileCacheClaim": "profile-cache",
                                      "metricsPort": 9100, "extraArgs": ["--kubeconfig=/etc/kube/config"]}},
}


def _crd_schemas() -> dict[tuple[str, str], dict]:
    """{(apiVersion, kind): openAPIV3Schema} of the CRDs CRD-typed objects are checked against."""
    out = {}
    files = [*(DATA / "prometheus-operator").glob("*.yaml"), CHART / "crds" / "kopf-peering.yaml"]
    for path in files:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            for v in crd["spec"]["versions"]:
                api_version = f"{crd['spec']['group']}/{v['name']}"
                out[(api_version, crd["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def _strict(schema: Any) -> Any:
    """An openAPIV3Schema as JSON Schema that, like `kubectl --validate=strict`, refuses fields it
    does not name (the API server would prune them silently)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable"):
        out.pop("nullable")
        if "type" in out:
            out["type"] = [out["type"], "null"]
    if (schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _top(schema: dict) -> dict:
    """apiVersion and kind are every object's, whether the CRD's schema names them or not."""
    props = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, **schema.get("properties", {})}
    return {**schema, "properties": props}


CRD_SCHEMAS = {k: _strict(_top(v)) for k, v in _crd_schemas().items()}


def schema_errors(obj: dict) -> list[str]:
    what = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        body = {k: v for k, v in obj.items() if k != "metadata"}
        validator = jsonschema.Draft7Validator(CRD_SCHEMAS[key])
        errs = [f"{what}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in validator.iter_errors(body)]
        try:        # metadata is ObjectMeta, whatever the kind
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]},
                                         KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as e:
            errs.append(f"{what}: metadata: {e.message}")
        return errs
    try:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{what}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{what}: no schema for {obj['apiVersion']} {obj['kind']}: {e}"]
    return []


@pytest.fixture(scope="module")
def renders(helm) -> dict[str, list[dict]]:
    return {name: render(helm, values) for name, values in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rendered_object_matches_its_schema(renders, case):
    docs = renders[case]
    assert docs, f"{case}: nothing rendered"
    errors = [e for d in docs for e in schema_errors(d)]
    assert not errors, "\n".join(errors)


def test_a_wrong_field_fails_the_schema_check(renders):
    """The check above can fail: a misspelt field of a built-in kind and of each CRD kind."""
    bad = copy.deepcopy(one(renders["default"], "Deployment"))
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    assert any("livenesProbe" in e for e in schema_errors(bad))
    for case, kind in (("servicemonitor", "ServiceMonitor"), ("prometheusrule", "PrometheusRule"),
                       ("replicas", "ClusterKopfPeering")):
        bad = copy.deepcopy(one(renders[case], kind))
        bad["spec"] = {"endpoints": [{"prot": "x"}]} if kind == "ServiceMonitor" else {"x": 1}
        assert schema_errors(bad), kind


def test_default_runs_one_standalone_operator_for_every_namespace(renders):
    docs = renders["default"]
    args = operator_args(docs)
    assert args[:3] == ["autopar", "operator", "run"]
    assert not any(a.startswith(("--peering", "--namespace")) for a in args)
    deployment = one(docs, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"     # never two standalone operators
    assert not find(docs, "ClusterKopfPeering") and not find(docs, "KopfPeering")
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service",
                                         "Deployment", "ConfigMap"}
    assert not find(docs, "Role") and not find(docs, "RoleBinding")


def test_default_pod_is_hardened_and_probed(renders):
    pod = one(renders["default"], "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    port = next(p for p in c["ports"] if p["name"] == "http-metrics")
    assert port["containerPort"] == 8080 and "--metrics-port=8080" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]        # writable scratch only


def test_default_images_are_the_dockerfiles_and_the_operators_default(renders):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    c = one(renders["default"], "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == f"ghcr.io/autopar/autopar-operator:{chart['appVersion']}"
    # the operator's own default (operator/reconcile.py Settings.image) is the trainer image
    assert f"--image={Settings().image}" in c["args"]
    root = CHART.parents[1]
    for dockerfile, image in (("docker/operator.Dockerfile", c["image"]), ("docker/trainer.Dockerfile", Settings().image)):
        text = (root / dockerfile).read_text()
        assert f"# image: {image.rsplit(':', 1)[0]}:<version>" in text, dockerfile
    pyproject = (root / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in pyproject       # images are tagged with the release


@pytest.mark.parametrize("case", ["replicas", "replicas-namespaces"])
def test_more_than_one_replica_uses_kopf_peering(renders, case):
    docs = renders[case]
    values = CASES[case]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == values["replicaCount"]
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert f"--peering={FULLNAME}" in operator_args(docs)
    if values.get("watchNamespaces"):
        peerings = find(docs, "KopfPeering")
        assert sorted(p["metadata"]["namespace"] for p in peerings) == sorted(values["watchNamespaces"])
        assert all(p["metadata"]["name"] == FULLNAME for p in peerings)
        assert not find(docs, "ClusterKopfPeering")
    else:
        assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == FULLNAME
        assert not find(docs, "KopfPeering")


def test_watch_namespaces_gives_roles_there_and_only_cluster_reads_cluster_wide(renders):
    docs = renders["namespaces"]
    args = operator_args(docs)
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    for ns in ("team-a", "team-b"):
        assert one(docs, "Role", FULLNAME, ns) and one(docs, "Role", f"{FULLNAME}-delegate", ns)
        assert one(docs, "RoleBinding", FULLNAME, ns) and one(docs, "RoleBinding", f"{FULLNAME}-delegate", ns)
    cluster = one(docs, "ClusterRole")
    assert cluster["metadata"]["name"] == f"{FULLNAME}-cluster"
    resources = {res for rule in cluster["rules"] for res in rule["resources"]}
    assert resources == {"nodes", "customresourcedefinitions", "namespaces"}
    assert all(set(rule["verbs"]) <= {"list", "watch"} for rule in cluster["rules"])


def test_rbac_off_renders_no_rbac_and_uses_the_given_account(renders):
    docs = renders["rbac-off"]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ops-made"


def test_service_monitor_scrapes_the_metrics_service(renders):
    docs = renders["servicemonitor"]
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    pod = one(docs, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert not find(renders["default"], "ServiceMonitor") and not find(renders["default"], "PrometheusRule")


def test_image_overrides_reach_the_operator_and_its_pods(renders):
    docs = renders["images"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.example.com:5000/mirror/autopar-operator:0.1.0-rc1"
    assert c["imagePullPolicy"] == "Always"
    assert f"--image=mirror/autopar@sha256:{'ab' * 32}" in c["args"]
    assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]


def test_operator_options_become_flags(renders):
    args = operator_args(renders["operator-options"])
    for flag in ("--device=cpu", "--profile-cache-claim=profile-cache", "--metrics-port=9100",
                 "--kubeconfig=/etc/kube/config"):
        assert flag in args


def test_dashboard_configmap_is_sidecar_discoverable(renders):
    cm = one(renders["default"], "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["autopar-jobs.json"] == (CHART / "dashboards" / "autopar-jobs.json").read_text().rstrip("\n")
    assert not find(renders["dashboard-off"], "ConfigMap")


def test_every_documented_value_has_a_case():
    """README.md's settings table and values.yaml's top-level keys: each is rendered by a case."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    covered = {k for case in CASES.values() for k in case} | {"operator", "metrics", "grafanaDashboard"}
    untested_by_design = {"nameOverride", "fullnameOverride", "peering", "podAnnotations", "podLabels",
                          "priorityClassName", "nodeSelector", "tolerations", "affinity", "resources",
                          "podSecurityContext", "securityContext", "livenessProbe", "readinessProbe"}
    assert set(values) - covered - untested_by_design == set()
