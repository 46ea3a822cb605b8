"""The pods' own commands: `publish_plan` (the planner pod) and `report_progress` (rank 0's
sidecar) against a real kube-apiserver (tests/controlplane) with the ServiceAccounts, Roles and
RoleBindings of `operator/resources.py` and the tokens those accounts get; and the small REST
client (`operator/kube.py`) on its own: kubeconfig and in-cluster credentials, the token read
again for every request, patch content types and the mapping of API errors."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import threading
import time
from pathlib import Path

import pytest
import yaml

from autopar.job import parse_job
from autopar.operator import resources as r
from autopar.operator import podside
from autopar.operator.kube import KubeClient, KubeConfigError, KubeError, resource_path
from autopar.operator.podside import (EXIT_NOTHING, EXIT_OK, EXIT_REFUSED, PodsideError, parse_metrics, publish_plan,
                                      report_progress, step_seconds)
from autopar.planner.errors import AutoparError, PlanFileError
from autopar.trainer.metrics import StepMetrics
from tests.controlplane.cluster import _write_pki, kubeconfig

pytestmark = pytest.mark.controlplane

FINGERPRINT = "sha256:0123456789abcdef"
PLAN = {"apiVersion": "autopar.dev/v1alpha1", "kind": "Strategy", "metadata": {"name": "plan"},
        "graph": {"name": "lenet", "fingerprint": "sha256:feed", "ops": 1},
        "topology": {"name": "cluster", "fingerprint": FINGERPRINT, "devices": 2},
        "predicted": {"stepSeconds": 0.05}, "search": {},
        "ops": [{"op": "conv1", "degrees": {"n": 2}, "devices": [0, 1]}]}


# -- helpers --------------------------------------------------------------------------------------

def _job(name: str, ns: str):
    return parse_job({"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                      "metadata": {"name": name, "namespace": ns},
                      "spec": {"model": {"name": "lenet"}, "devices": {"nodes": 2, "gpusPerNode": 1}}})


def _create_job(plane, ns: str, job) -> str:
    plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(job.to_manifest()))
    return plane.get("ptj", job.name, "-n", ns)["metadata"]["uid"]


def _wait_can(plane, ns: str, account: str, *args: str) -> None:
    """RBAC's authorizer sees a new RoleBinding through an informer: wait until it does."""
    def can():
        out = plane.kubectl("auth", "can-i", *args, "-n", ns, f"--as=system:serviceaccount:{ns}:{account}",
                            check=False)
        return out.stdout.strip() == "yes"
    plane.wait_for(f"{account} may {' '.join(args)}", can, timeout=30)


def _plan_file(tmp_path: Path, doc: dict | str = PLAN) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def metrics():
    """The trainer's own metrics (`StepMetrics`), served on 127.0.0.1 as rank 0 serves them."""
    m = StepMetrics("lenet", "plan", predicted=0.05, port=0)
    yield m
    m.close()


# -- publish-plan on the control plane --------------------------------------------------------------

def test_publish_plan_as_the_planners_serviceaccount(crd_installed, namespace, tmp_path):
    plane, ns = crd_installed, namespace
    job = _job("publish", ns)
    uid = _create_job(plane, ns, job)
    plane.apply([r.topology_configmap(job, uid, {"name": "cluster"}, FINGERPRINT),
                 r.plan_configmap(job, uid, topology_fingerprint=FINGERPRINT),
                 r.planner_serviceaccount(job, uid), r.planner_role(job, uid), r.planner_rolebinding(job, uid)])
    account, cm_name = r.planner_account_name(job), r.plan_configmap_name(job)
    _wait_can(plane, ns, account, "patch", f"configmaps/{cm_name}")
    client = KubeClient.from_kubeconfig(plane.as_service_account(account, ns))

    placeholder = plane.get("configmap", cm_name, "-n", ns)
    assert placeholder["metadata"]["annotations"]["autopar.dev/plan-state"] == "Pending"
    assert "data" not in placeholder

    path = _plan_file(tmp_path)
    digest = publish_plan(client, ns, cm_name, path, topology_fingerprint=FINGERPRINT)
    assert digest == r.plan_hash(path.read_text())
    cm = plane.get("configmap", cm_name, "-n", ns)
    assert cm["data"] == {"plan.yaml": path.read_text()}
    assert yaml.safe_load(cm["data"]["plan.yaml"]) == PLAN
    ann = cm["metadata"]["annotations"]
    assert ann["autopar.dev/plan-state"] == "Ready"
    assert ann["autopar.dev/plan-hash"] == digest
    assert ann["autopar.dev/topology-fingerprint"] == FINGERPRINT
    assert cm["metadata"]["ownerReferences"][0]["uid"] == uid          # a patch keeps the owner

    # the planner's token may patch that one ConfigMap and no other
    topo_name = r.topology_configmap_name(job)
    with pytest.raises(KubeError) as err:
        publish_plan(client, ns, topo_name, path)
    assert err.value.status == 403 and err.value.reason == "Forbidden"
    assert f"configmap {ns}/{topo_name}" in str(err.value) and "forbidden" in str(err.value)
    assert "\n" not in str(err.value)
    assert "data" not in plane.get("configmap", topo_name, "-n", ns) or \
        "plan.yaml" not in plane.get("configmap", topo_name, "-n", ns)["data"]
    # ... nor list or read other ConfigMaps through the same client
    with pytest.raises(KubeError) as err:
        client.get(resource_path(ns, "configmaps", topo_name))
    assert err.value.status == 403

    # a file that is not a plan is refused before anything is sent
    bad = _plan_file(tmp_path, "apiVersion: autopar.dev/v1alpha1\nkind: Strategy\nops: {}\n")
    with pytest.raises(PlanFileError, match="plan file"):
        publish_plan(client, ns, cm_name, bad)
    assert plane.get("configmap", cm_name, "-n", ns)["metadata"]["annotations"]["autopar.dev/plan-hash"] == digest


def test_publish_plan_to_a_configmap_that_is_gone(crd_installed, namespace, tmp_path):
    """Deleting the job collects the placeholder: a 404 with a hint, not a retry loop."""
    plane, ns = crd_installed, namespace
    job = _job("gone", ns)
    uid = _create_job(plane, ns, job)
    admin = KubeClient.from_kubeconfig(plane.kubeconfig)
    with pytest.raises(KubeError) as err:
        publish_plan(admin, ns, r.plan_configmap_name(job), _plan_file(tmp_path), retries=1)
    assert err.value.status == 404 and "was the job deleted" in str(err.value)
    assert uid


# -- report-progress on the control plane -----------------------------------------------------------

def test_report_progress_as_the_trainers_serviceaccount(crd_installed, namespace, metrics, caplog):
    plane, ns = crd_installed, namespace
    job = _job("progress", ns)
    uid = _create_job(plane, ns, job)
    plane.apply([r.trainer_serviceaccount(job, uid), r.progress_role(job, uid), r.progress_rolebinding(job, uid)])
    account = r.trainer_account_name(job)
    _wait_can(plane, ns, account, "patch", f"paralleltrainingjobs.autopar.dev/{job.name}", "--subresource=status")
    client = KubeClient.from_kubeconfig(plane.as_service_account(account, ns))
    url = f"http://127.0.0.1:{metrics.port}/metrics"

    for seconds in (0.04, 0.04, 0.04, 0.04):
        metrics.record(seconds, loss=2.3, samples=64)
    caplog.set_level(logging.INFO, logger="autopar.operator.podside")
    assert report_progress(client, ns, job.name, url, once=True) == EXIT_OK
    status = plane.get("ptj", job.name, "-n", ns)["status"]
    assert status["completedSteps"] == 4
    assert status["actualStepSeconds"] == pytest.approx(0.04)
    assert status["actualStep"] == "40.0ms"
    assert status["predictionError"] == pytest.approx(0.05 / 0.04 - 1, abs=1e-4)
    assert "step 4" in caplog.text

    # the same token may not write another job's status: a clear message and status 3
    other = _job("other", ns)
    _create_job(plane, ns, other)
    caplog.clear()
    assert report_progress(client, ns, other.name, url, once=True) == EXIT_REFUSED
    msg = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(msg) == 1 and "\n" not in msg[0]
    assert "403 Forbidden" in msg[0] and f"paralleltrainingjobs/{other.name}" in msg[0] and "Role" in msg[0]
    assert "completedSteps" not in (plane.get("ptj", other.name, "-n", ns).get("status") or {})


def test_report_progress_follows_the_trainer_until_it_stops(crd_installed, namespace):
    """The sidecar loop: each scrape's window of steps is reported; the endpoint gone ends it (0)."""
    plane, ns = crd_installed, namespace
    job = _job("follow", ns)
    uid = _create_job(plane, ns, job)
    plane.apply([r.trainer_serviceaccount(job, uid), r.progress_role(job, uid), r.progress_rolebinding(job, uid)])
    account = r.trainer_account_name(job)
    _wait_can(plane, ns, account, "patch", f"paralleltrainingjobs.autopar.dev/{job.name}", "--subresource=status")
    client = KubeClient.from_kubeconfig(plane.as_service_account(account, ns))
    m = StepMetrics("lenet", "plan", predicted=None, port=0)
    url = f"http://127.0.0.1:{m.port}/metrics"
    m.record(1.0, loss=2.3, samples=64)                      # a slow first step ...
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault(
        "rc", report_progress(client, ns, job.name, url, interval=0.2, gone_after=1.0)))
    worker.start()
    try:
        plane.wait_for("first report", lambda: (plane.get("ptj", job.name, "-n", ns).get("status") or {})
                       .get("completedSteps") == 1, timeout=20)
        for _ in range(3):                                       # ... then fast ones
            m.record(0.02, loss=2.0, samples=64)
        status = plane.wait_for("second report", lambda: (
            s := plane.get("ptj", job.name, "-n", ns).get("status") or {}).get("completedSteps") == 4 and s,
            timeout=20)
        assert status["actualStepSeconds"] == pytest.approx(0.02)   # the window, not the warm-up
        assert status.get("predictionError") is None                 # the plan predicted nothing
    finally:
        m.close()
    worker.join(30)
    assert not worker.is_alive() and result["rc"] == EXIT_OK


# -- the client without a server ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _write_pki(d)
    return d


@pytest.mark.parametrize("creds", ["token", "certificate", "data"])
def test_kubeconfig_credentials(tmp_path, pki, creds):
    if creds == "token":
        doc = kubeconfig("https://127.0.0.1:6443", pki / "ca.crt", token="abc.def", user="sa")
    elif creds == "certificate":
        doc = kubeconfig("https://127.0.0.1:6443", pki / "ca.crt", cert=pki / "admin.crt", key=pki / "admin.key")
    else:
        b64 = lambda p: base64.b64encode(p.read_bytes()).decode()   # noqa: E731
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
               "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1",
                                                      "certificate-authority-data": b64(pki / "ca.crt")}}],
               "users": [{"name": "u", "user": {"client-certificate-data": b64(pki / "admin.crt"),
                                                "client-key-data": b64(pki / "admin.key")}}],
               "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "team"}}]}
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    client = KubeClient.from_kubeconfig(path)
    assert client.server == doc["clusters"][0]["cluster"]["server"]
    assert client.token == ("abc.def" if creds == "token" else None)
    assert client.namespace == ("team" if creds == "data" else None)
    assert client.context is not None and client.context.verify_mode.name == "CERT_REQUIRED"


def test_kubeconfig_relative_paths_kubeconfig_env_and_contexts(tmp_path, pki, monkeypatch):
    (tmp_path / "certs").mkdir()
    for f in ("ca.crt", "admin.crt", "admin.key"):
        (tmp_path / "certs" / f).write_bytes((pki / f).read_bytes())
    (tmp_path / "tok").write_text("from-file\n")
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "a",
           "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1/",
                                                  "certificate-authority": "certs/ca.crt"}}],
           "users": [{"name": "cert", "user": {"client-certificate": "certs/admin.crt",
                                               "client-key": "certs/admin.key"}},
                     {"name": "file", "user": {"tokenFile": "tok"}}],
           "contexts": [{"name": "a", "context": {"cluster": "k", "user": "cert"}},
                        {"name": "b", "context": {"cluster": "k", "user": "file", "namespace": "ns-b"}}]}
    path = tmp_path / "kc.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", f"{path}:{tmp_path / 'missing'}")
    client = KubeClient.from_kubeconfig()
    assert client.server == "https://127.0.0.1:1" and client.token is None
    other = KubeClient.from_kubeconfig(context="b")
    assert other.namespace == "ns-b" and other._token() == "from-file"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert KubeClient.default().server == "https://127.0.0.1:1"            # not in a pod: $KUBECONFIG


@pytest.mark.parametrize("doc, match", [
    ("- a list", "expected a mapping"),
    ({"contexts": [], "current-context": "x"}, "no context named 'x'"),
    ({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
      "clusters": [{"name": "k", "cluster": {"server": "https://h"}}],
      "users": [{"name": "u", "user": {"exec": {"command": "aws"}}}]}, "uses exec"),
    ({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k"}}],
      "clusters": [{"name": "k", "cluster": {}}]}, "has no server"),
    ({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
      "clusters": [{"name": "k", "cluster": {"server": "https://h"}}],
      "users": [{"name": "u", "user": {"client-certificate": "c.crt"}}]}, "needs client-key"),
])
def test_kubeconfig_errors_are_one_line(tmp_path, doc, match):
    path = tmp_path / "config"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match=match) as err:
        KubeClient.from_kubeconfig(path)
    assert "\n" not in str(err.value) and isinstance(err.value, AutoparError)
    with pytest.raises(KubeConfigError, match="cannot read it"):
        KubeClient.from_kubeconfig(tmp_path / "nope")


def test_in_cluster_credentials(tmp_path, pki, monkeypatch):
    d = tmp_path / "sa"
    d.mkdir()
    (d / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    (d / "namespace").write_text("team-a")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    with pytest.raises(KubeConfigError, match="automountServiceAccountToken"):
        KubeClient.from_env(d)
    (d / "token").write_text("t1")
    client = KubeClient.from_env(d)
    assert client.server == "https://[fd00::1]:6443" and client.namespace == "team-a"
    assert client._token() == "t1"
    (d / "token").write_text("t2\n")                                    # the kubelet rotated it
    assert client._token() == "t2"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(KubeConfigError, match="not in a pod"):
        KubeClient.from_env(d)


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers with what the test queued; records each request."""

    replies: list[tuple[int, str, bytes]] = []
    seen: list[dict] = []

    def _any(self):
        length = int(self.headers.get("Content-Length") or 0)
        type(self).seen.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                                "type": self.headers.get("Content-Type"),
                                "body": json.loads(self.rfile.read(length)) if length else None})
        code, ctype, body = type(self).replies.pop(0) if type(self).replies else (200, "application/json", b"{}")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _any

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    _Recorder.replies, _Recorder.seen = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server, _Recorder
    server.shutdown()
    server.server_close()


def test_requests_patch_types_token_rotation_and_error_mapping(tmp_path, fake_server):
    server, rec = fake_server
    token = tmp_path / "token"
    token.write_text("one")
    client = KubeClient(f"http://127.0.0.1:{server.server_address[1]}", token_file=token)
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
              "message": 'configmaps "x" is forbidden: User "system:serviceaccount:a:b" cannot patch resource'}
    rec.replies = [(200, "application/json", b'{"kind": "ConfigMap"}'), (200, "application/json", b""),
                   (200, "application/json", b"{}"), (200, "application/json", b"{}"),
                   (200, "application/json", b"{}"),
                   (403, "application/json", json.dumps(status).encode()),
                   (500, "text/plain", b"etcd is sad\nmore"), (404, "application/json", b"")]
    assert client.get("/api/v1/namespaces/a/configmaps/x") == {"kind": "ConfigMap"}
    token.write_text("two")
    assert client.delete("/api/v1/namespaces/a/configmaps/x", propagationPolicy="Background") is None
    client.patch("/p", {"a": 1})
    client.patch("/p", [{"op": "add", "path": "/a", "value": 1}], "json")
    client.patch("/p", {"a": 1}, "apply", field_manager="autopar", force=True)
    with pytest.raises(KubeError) as err:
        client.post("/api/v1/namespaces/a/events", {"kind": "Event"})
    assert (err.value.status, err.value.reason, err.value.message) == (403, "Forbidden", status["message"])
    with pytest.raises(KubeError) as err:
        client.get("/x")
    assert (err.value.status, err.value.reason, err.value.message) == (500, "InternalError", "etcd is sad")
    with pytest.raises(KubeError) as err:
        client.get("/y")
    assert (err.value.status, err.value.reason) == (404, "NotFound") and "GET /y" in err.value.message

    assert [s["auth"] for s in rec.seen[:2]] == ["Bearer one", "Bearer two"]
    assert rec.seen[1]["path"].endswith("?propagationPolicy=Background")
    assert [s["type"] for s in rec.seen[2:6]] == ["application/merge-patch+json", "application/json-patch+json",
                                                 "application/apply-patch+yaml", "application/json"]
    assert rec.seen[4]["path"] == "/p?fieldManager=autopar&force=true"
    with pytest.raises(ValueError, match="field_manager"):
        client.patch("/p", {}, "apply")
    with pytest.raises(ValueError, match="choose one of"):
        client.patch("/p", {}, "xml")


def test_an_unreachable_server_is_status_zero():
    from tests.controlplane.cluster import free_port
    client = KubeClient(f"https://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(KubeError) as err:
        client.get("/api")
    assert err.value.status == 0 and err.value.reason == "Unreachable" and "cannot reach" in str(err.value)


def test_resource_paths():
    assert resource_path("ns", "configmaps", "x") == "/api/v1/namespaces/ns/configmaps/x"
    assert resource_path("ns", "paralleltrainingjobs", "j", group="autopar.dev", version="v1alpha1",
                         subresource="status") == "/apis/autopar.dev/v1alpha1/namespaces/ns/paralleltrainingjobs/j/status"
    assert resource_path(None, "nodes") == "/api/v1/nodes"


# -- the metrics, and the loop with a fake API ------------------------------------------------------

def test_parse_the_trainers_metrics():
    from prometheus_client import generate_latest
    m = StepMetrics("lenet", "plan", predicted=0.05)
    assert parse_metrics(generate_latest(m.registry).decode()).steps == 0
    for s in (0.5, 0.1, 0.1):
        m.record(s, loss=1.5, samples=32)
    first = parse_metrics(generate_latest(m.registry).decode())
    assert (first.steps, first.seconds_count, first.predicted, first.loss) == (3, 3, 0.05, 1.5)
    assert step_seconds(first, None) == pytest.approx(0.7 / 3)
    m.record(0.2, loss=1.0, samples=32)
    second = parse_metrics(generate_latest(m.registry).decode())
    assert step_seconds(second, first) == pytest.approx(0.2)
    assert step_seconds(second, second) == pytest.approx(0.9 / 4)       # no new step: the mean so far
    assert second.step == 4


def test_a_resumed_trainer_reports_the_step_from_the_start_of_training():
    """After a restart from the checkpoint of step 100, three more steps are steps 101..103 (the
    job's completedSteps), though this process ran three."""
    from prometheus_client import generate_latest
    m = StepMetrics("lenet", "plan")
    for step in (101, 102, 103):
        m.record(0.1, loss=1.0, samples=32, step=step)
    scrape = parse_metrics(generate_latest(m.registry).decode())
    assert (scrape.steps, scrape.step) == (3, 103)
    unpredicted = parse_metrics(generate_latest(StepMetrics("lenet", "plan").registry).decode())
    assert unpredicted.predicted is None and step_seconds(unpredicted, None) is None
    with pytest.raises(PodsideError, match="not an autopar trainer"):
        parse_metrics("# TYPE up gauge\nup 1\n")


class _FakeApi:
    def __init__(self, error: KubeError | None = None):
        self.patches, self.error = [], error

    def patch(self, path, body, patch_type="merge"):
        if self.error:
            raise self.error
        self.patches.append((path, body, patch_type))
        return {}


def test_report_progress_once_without_metrics_or_permission(metrics, caplog):
    from tests.controlplane.cluster import free_port
    caplog.set_level(logging.INFO, logger="autopar.operator.podside")
    api = _FakeApi()
    assert report_progress(api, "ns", "j", f"http://127.0.0.1:{free_port()}/metrics", once=True) == EXIT_NOTHING
    assert not api.patches and "no metrics from" in caplog.text
    metrics.record(0.1, loss=1.0, samples=8)
    url = f"http://127.0.0.1:{metrics.port}/metrics"
    assert report_progress(api, "ns", "j", url, once=True) == EXIT_OK
    assert api.patches == [("/apis/autopar.dev/v1alpha1/namespaces/ns/paralleltrainingjobs/j/status",
                            {"status": {"completedSteps": 1, "actualStepSeconds": 0.1, "actualStep": "100.0ms",
                                        "predictionError": -0.5}}, "merge")]
    for code, reason, words in [(404, "NotFound", "was the job deleted"), (403, "Forbidden", "Role allows")]:
        caplog.clear()
        denied = _FakeApi(KubeError(code, reason, "nope"))
        assert report_progress(denied, "ns", "j", url, interval=0.01) == EXIT_REFUSED
        assert words in caplog.text
    caplog.clear()
    flaky = _FakeApi(KubeError(503, "ServiceUnavailable", "etcd leader changed"))
    assert report_progress(flaky, "ns", "j", url, once=True) == EXIT_NOTHING
    assert "will retry" in caplog.text


def test_a_scrape_with_no_new_step_keeps_the_last_window(metrics):
    """Scrapes between two steps' ends report the last window, never the mean with the warm-up."""
    api, stop = _FakeApi(), threading.Event()
    metrics.record(1.0, loss=2.3, samples=8)                  # a slow first step, then fast ones
    url = f"http://127.0.0.1:{metrics.port}/metrics"
    worker = threading.Thread(target=report_progress, args=(api, "ns", "j", url),
                              kwargs={"interval": 0.01, "stop": stop})
    worker.start()
    try:
        _until(lambda: api.patches)
        for _ in range(3):
            metrics.record(0.02, loss=2.0, samples=8)
        _until(lambda: api.patches[-1][1]["status"]["completedSteps"] == 4)
        seen = len(api.patches)
        time.sleep(0.2)                                        # about 20 scrapes that see no new step
    finally:
        stop.set()
        worker.join(10)
    reported = [b["status"]["actualStepSeconds"] for _, b, _ in api.patches]
    assert reported[0] == pytest.approx(1.0) and reported[1:] == pytest.approx([0.02] * (len(reported) - 1))
    assert len(api.patches) == seen


def _until(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_report_progress_stops_on_sigterm_before_the_trainer_starts():
    from tests.controlplane.cluster import free_port
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert report_progress(_FakeApi(), "ns", "j", f"http://127.0.0.1:{free_port()}/metrics", interval=0.05,
                           gone_after=0.0, stop=stop) == EXIT_OK


def test_publish_plan_refuses_without_sending(tmp_path):
    class Unused:
        def patch(self, *a, **k):
            raise AssertionError("sent")
    with pytest.raises(PlanFileError, match="cannot read it"):
        publish_plan(Unused(), "ns", "cm", tmp_path / "none.yaml")
    with pytest.raises(AutoparError, match="about 1 MiB"):
        publish_plan(Unused(), "ns", "cm", _plan_file(tmp_path, {**PLAN, "search": {"pad": "x" * (1 << 20)}}))


def test_publish_plan_retries_what_may_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(podside.time, "sleep", lambda s: None)
    path = _plan_file(tmp_path)
    calls = []

    class Flaky:
        def patch(self, where, body, patch_type):
            calls.append(where)
            if len(calls) < 3:
                raise KubeError(0 if len(calls) == 1 else 503, "Unreachable", "connection refused")
            return {"metadata": {"annotations": body["metadata"]["annotations"]}}
    assert publish_plan(Flaky(), "ns", "cm", path) == r.plan_hash(path.read_text())
    assert calls == ["/api/v1/namespaces/ns/configmaps/cm"] * 3
