"""The real kopf handlers (`operator.handlers.run`) against KMock, an in-memory Kubernetes API
server: what the operator asks of the API server when a job is created, read back from the
requests KMock recorded.  A valid job → topology ConfigMap, planner Job and its RBAC, status
Planning; a bad spec → Failed with an Event, once; too few nodes → Pending with the reasons; a
pinned plan → no planner, trainer pods; a create answered 409 Conflict → treated as done.

KMock's traps (../shared/notes/kopf-kmock.md): objects need ``metadata.resourceVersion``; the
job is created only once the operator's watch is open; KMock 0.8 answers a cluster-wide list of
namespaces with 500, so kopf runs with scanning off; nothing is validated and no controller runs
(a planner Job never finishes here: tests/operator/test_lifecycle_controlplane.py drives that).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from typing import Any, Callable

import kopf
import pytest
import pytest_asyncio
import yaml

from autopar.job.spec import GROUP, PLURAL, VERSION
from autopar.operator import handlers
from autopar.operator import resources as r
from autopar.planner.hardware import parse_topology
from tests.controlplane.nodes import dgx_h100

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]

NS = "ml"
JOBS = f"{GROUP}/{VERSION}/{PLURAL}"
PLAN = """apiVersion: autopar.dev/v1alpha1
kind: Strategy
metadata: {name: pinned}
predicted: {stepSeconds: 0.05}
ops: []
"""


def job_manifest(name: str = "llm", *, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ParallelTrainingJob",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": "1", "uid": f"uid-{name}",
                         "generation": 1},
            "spec": {"model": {"name": "lenet"}, "training": {"steps": 100},
                     "devices": {"nodes": nodes, "gpusPerNode": 8}, **spec}}


def ready_nodes(n: int) -> list[dict[str, Any]]:
    nodes = copy.deepcopy(dgx_h100(n))
    for node in nodes:
        node["metadata"]["resourceVersion"] = "1"
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return nodes


class Operator:
    """`handlers.run` in a thread against `kmock`, and what the tests ask of the requests."""

    def __init__(self, kmock, kubeconfig: str):
        self.kmock = kmock
        self.kubeconfig = kubeconfig
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.ticks = 0

    def _run(self) -> None:
        try:
            handlers.run(namespaces=[NS], kubeconfig=self.kubeconfig, image="autopar:test", metrics_port=None,
                         stop_flag=self.stop_flag, ready_flag=self.ready_flag)
        except BaseException as e:  # noqa: BLE001 - reported by the fixture
            self.error = e

    async def start(self, nodes: list[dict[str, Any]]) -> None:
        for node in nodes:
            self.kmock.objects[self.kmock.resource("v1/nodes"), None, node["metadata"]["name"]] = node
        self.thread = threading.Thread(target=self._run, name="kopf-operator", daemon=True)
        self.thread.start()
        await self.wait_for("the operator ready", self.ready_flag.is_set)
        await self.wait_for("the operator's watch of the jobs", lambda: len(
            self.kmock[self.kmock.action.WATCH, self.kmock.resource(JOBS)]) > 0)

    async def stop(self) -> None:
        self.stop_flag.set()
        if self.thread is not None:
            await asyncio.to_thread(self.thread.join, 20)
            assert not self.thread.is_alive(), "the operator did not stop"
        assert self.error is None, f"the operator crashed: {self.error!r}"

    async def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float = 15) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.error is not None:
                raise AssertionError(f"the operator crashed waiting for {what}: {self.error!r}")
            value = predicate()
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    async def wait_ticks(self, n: int) -> None:
        """Until the timer ran `n` more times (the `operator` fixture counts them)."""
        target = self.ticks + n
        await self.wait_for(f"{n} more ticks", lambda: self.ticks >= target)

    async def create_job(self, manifest: dict[str, Any]) -> None:
        url = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
        async with self.kmock.post(url, json=manifest) as resp:
            assert resp.status in (200, 201), await resp.text()

    def job(self, name: str = "llm") -> dict[str, Any]:
        return self.kmock.objects[self.kmock.resource(JOBS), NS, name].raw

    def status(self, name: str = "llm") -> dict[str, Any]:
        return self.job(name).get("status") or {}

    def posted(self, plural: str) -> list[dict[str, Any]]:
        """Bodies POSTed for `plural` (``configmaps``, ``batch/v1/jobs``, …), but by the test itself."""
        res = self.kmock.resource(plural if "/" in plural else f"v1/{plural}")
        return [req.data for req in self.kmock["post", res] if req.namespace == NS and not any(
            k.lower() == "user-agent" and v.startswith("kmock/") for k, v in req.headers.items())]

    def posted_names(self, plural: str) -> list[str]:
        return [body["metadata"]["name"] for body in self.posted(plural)]

    def events(self) -> list[dict[str, Any]]:
        """The operator's own Events (kopf's, about handler failures, have another source)."""
        return [e for e in self.posted("events") if (e.get("source") or {}).get("component") == r.MANAGER]

    def status_patches(self) -> list[dict[str, Any]]:
        return [req.data["status"] for req in self.kmock["patch", self.kmock.resource(JOBS)]
                if isinstance(req.data, dict) and req.data.get("status")]


@pytest.fixture
def kubeconfig(kmock, tmp_path, monkeypatch) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "kmock"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(path))          # run() sets it too; this restores it after
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return str(path)


@pytest_asyncio.fixture
async def operator(kmock, kubeconfig, monkeypatch):
    """An Operator (not started: a test seeds its nodes first), stopped after the test."""
    kmock.resources.load_bundled()
    kmock.resources[JOBS] = dict(kind="ParallelTrainingJob", namespaced=True, subresources={"status"},
                                 verbs={"list", "watch", "get", "create", "patch", "delete", "update"})
    op = Operator(kmock, kubeconfig)
    # KMock 0.8 cannot parse GET /api/v1/namespaces (500): kopf must not observe namespaces or
    # CRDs, so the settings `run()` hands to kopf come with scanning off (handlers' own startup
    # handler still applies its settings on top).
    real_run = kopf.run

    def run_without_scanning(**kwargs):
        settings = kopf.OperatorSettings()
        settings.scanning.disabled = True
        return real_run(settings=settings, **kwargs)
    monkeypatch.setattr(kopf, "run", run_without_scanning)
    real = handlers.parse_job                 # the first thing every tick does

    def counting(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            op.ticks += 1
    monkeypatch.setattr(handlers, "parse_job", counting)
    monkeypatch.setattr(handlers, "RUNTIME", handlers.Runtime())
    try:
        yield op
    finally:
        await op.stop()


def _handler_errors(caplog) -> list[str]:
    """Errors logged anywhere, and warnings of the handlers (kopf.objects) and of the operator."""
    return [f"{rec.name}: {rec.getMessage()}" for rec in caplog.records
            if rec.levelno >= logging.ERROR or (rec.levelno >= logging.WARNING and
                                                rec.name.startswith(("kopf.objects", "autopar.operator")))]


# -- tests ---------------------------------------------------------------------------------------

async def test_a_valid_job_gets_its_topology_and_planner_and_status_planning(operator, caplog):
    await operator.start(ready_nodes(3))
    await operator.create_job(job_manifest())
    await operator.wait_for("phase Planning", lambda: operator.status().get("phase") == "Planning")
    await operator.wait_for("the planner Job", lambda: operator.posted("batch/v1/jobs"))
    await operator.wait_ticks(2)                         # later ticks see the children: nothing again

    (topology,) = [cm for cm in operator.posted("configmaps") if cm["metadata"]["name"] == "llm-topology"]
    topo = parse_topology(yaml.safe_load(topology["data"][r.TOPOLOGY_KEY]))
    fingerprint = operator.status()["topologyFingerprint"]
    assert len(topo.devices) == 16 and topo.fingerprint == fingerprint
    assert topology["metadata"]["annotations"][r.ANN_TOPOLOGY_FINGERPRINT] == fingerprint
    assert topology["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    assert sorted(operator.posted_names("configmaps")) == ["llm-plan", "llm-topology"]
    (planner,) = operator.posted("batch/v1/jobs")
    assert planner["metadata"]["name"] == "llm-planner" and planner["metadata"]["labels"][r.LABEL_JOB] == "llm"
    assert operator.posted_names("serviceaccounts") == ["llm-planner"]
    assert operator.posted_names("rbac.authorization.k8s.io/v1/roles") == ["llm-planner"]
    assert operator.posted_names("rbac.authorization.k8s.io/v1/rolebindings") == ["llm-planner"]
    assert operator.posted("pods") == [] and operator.posted("services") == []

    status = operator.status()
    assert status["topology"]["gpus"] == 16 and status["devices"] == "16x H100-SXM5-80GB"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Planning"] == "True"
    assert [e["reason"] for e in operator.events()] == ["TopologyDiscovered"]
    patches = operator.status_patches()
    assert [p.get("phase") for p in patches if "phase" in p] == ["Planning"]
    # the status goes to the status subresource
    assert any(req.subresource == "status" for req in operator.kmock["patch", operator.kmock.resource(JOBS)])
    assert _handler_errors(caplog) == []


@pytest.mark.parametrize("spec, words", [
    pytest.param({"model": {"name": "lenet", "options": {"hiden": 3}}}, ["spec.model.options.hiden", "fix the spec"],
                 id="zoo-option"),
    pytest.param({"model": {"name": "nosuchmodel"}}, ["nosuchmodel", "fix the spec"], id="unknown-model"),
    # a spec parse_job refuses (the CRD's rules bypassed, or an older CRD): failed once, not every tick
    pytest.param({"planner": {"algorithm": "pinned"}}, ["planRef", "fix the spec"], id="unreadable"),
])
async def test_a_bad_spec_fails_once_with_an_event(operator, caplog, spec, words):
    await operator.start(ready_nodes(3))
    await operator.create_job(job_manifest(**spec))
    await operator.wait_for("phase Failed", lambda: operator.status().get("phase") == "Failed")
    await operator.wait_ticks(2)

    status = operator.status()
    for word in words:
        assert word in status["message"]
    assert len([p for p in operator.status_patches() if p.get("phase") == "Failed"]) == 1, "no retry loop"
    assert {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Failed") == "True"
    assert status.get("completionTime")
    (event,) = operator.events()
    assert event["type"] == "Warning" and event["reason"] == "FailedValidation"
    assert event["involvedObject"] == {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ParallelTrainingJob",
                                       "name": "llm", "namespace": NS, "uid": "uid-llm"}
    assert words[0] in event["message"]
    for plural in ("configmaps", "pods", "batch/v1/jobs", "services", "serviceaccounts"):
        assert operator.posted(plural) == [], plural
    assert _handler_errors(caplog) == []


async def test_too_few_nodes_keeps_the_job_pending_with_the_reasons(operator, caplog):
    await operator.start(ready_nodes(3))
    await operator.create_job(job_manifest(nodes=4))
    await operator.wait_for("phase Pending", lambda: operator.status().get("phase") == "Pending")
    await operator.wait_ticks(2)

    message = operator.status()["message"]
    assert "4" in message and "3" in message, message
    assert len(operator.status_patches()) == 1, "the same reasons are not written again"
    for plural in ("configmaps", "pods", "batch/v1/jobs", "services", "serviceaccounts"):
        assert operator.posted(plural) == [], plural
    assert _handler_errors(caplog) == []


async def test_a_pinned_plan_skips_the_planner_and_starts_the_trainers(operator, caplog):
    await operator.start(ready_nodes(3))
    operator.kmock.objects[operator.kmock.resource("v1/configmaps"), NS, "my-plan"] = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "my-plan", "namespace": NS,
                                                             "resourceVersion": "1"},
        "data": {"plan.yaml": PLAN}}
    await operator.create_job(job_manifest(planner={"algorithm": "pinned",
                                                    "planRef": {"configMap": "my-plan", "key": "plan.yaml"}}))
    await operator.wait_for("phase Training", lambda: operator.status().get("phase") == "Training")
    await operator.wait_ticks(2)

    assert operator.posted("batch/v1/jobs") == []
    assert operator.posted_names("configmaps") == ["llm-topology"]
    pods = operator.posted("pods")
    assert sorted(p["metadata"]["name"] for p in pods) == ["llm-trainer-0", "llm-trainer-1"]
    for pod in pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["plan"]["configMap"]["name"] == "my-plan"
    chosen = set(operator.status()["topology"]["nodes"])
    assert {p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0] for p in pods} == chosen
    assert operator.posted_names("services") == ["llm-rdzv"]
    assert operator.posted_names("serviceaccounts") == ["llm-trainer"]
    reasons = [e["reason"] for e in operator.events()]
    assert reasons == ["TopologyDiscovered", "PlanReady", "TrainersStarted"]
    assert operator.status()["planHash"] == "pinned"
    assert _handler_errors(caplog) == []


async def test_a_create_answered_409_conflict_is_done(operator, caplog):
    """The planner's ServiceAccount and Role exist already (a restarted operator made them)."""
    kmock = operator.kmock
    for plural, name in [("v1/serviceaccounts", "llm-planner"), ("rbac.authorization.k8s.io/v1/roles", "llm-planner")]:
        kind = "ServiceAccount" if "serviceaccounts" in plural else "Role"
        kmock.objects[kmock.resource(plural), NS, name] = {
            "apiVersion": plural.rsplit("/", 1)[0], "kind": kind,
            "metadata": {"name": name, "namespace": NS, "resourceVersion": "1"}}
    await operator.start(ready_nodes(3))
    await operator.create_job(job_manifest())
    await operator.wait_for("the planner Job", lambda: operator.posted("batch/v1/jobs"))
    await operator.wait_ticks(2)

    assert operator.posted_names("serviceaccounts") == ["llm-planner"]      # tried once, got 409
    assert operator.posted_names("rbac.authorization.k8s.io/v1/rolebindings") == ["llm-planner"]
    assert operator.status()["phase"] == "Planning"
    assert _handler_errors(caplog) == []
    assert operator.thread.is_alive()


async def test_gpus_held_by_other_pods_steer_the_job_to_free_nodes(operator, caplog):
    """The pods index: a running pod of someone else holds all 8 GPUs of dgx-h100-0."""
    kmock = operator.kmock
    kmock.objects[kmock.resource("v1/pods"), NS, "someone-else"] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "someone-else", "namespace": NS, "resourceVersion": "1"},
        "spec": {"nodeName": "dgx-h100-0", "containers": [
            {"name": "c", "image": "x", "resources": {"limits": {r.GPU_RESOURCE: "8"}}}]},
        "status": {"phase": "Running"}}
    await operator.start(ready_nodes(3))
    await operator.create_job(job_manifest())
    await operator.wait_for("phase Planning", lambda: operator.status().get("phase") == "Planning")

    assert operator.status()["topology"]["nodes"] == ["dgx-h100-1", "dgx-h100-2"]
    assert _handler_errors(caplog) == []
