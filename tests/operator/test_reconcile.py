"""The operator's decisions (`operator.reconcile`), played against an in-memory cluster that
applies them: whole lifecycles without a server — create → topology → planner → plan → trainers →
Succeeded; a failure and a gang restart; backoff exhausted; a node lost → re-plan → resume;
suspend and resume; the deadline; a bad spec; idempotency."""

from __future__ import annotations

import copy
import datetime as _dt

import pytest

from autopar.job import parse_job
from autopar.operator import resources as r
from autopar.operator.reconcile import Observed, Settings, reconcile
from tests.controlplane.nodes import dgx_h100

T0 = _dt.datetime(2026, 11, 25, 12, 0, tzinfo=_dt.timezone.utc)
PLAN = """apiVersion: autopar.dev/v1alpha1
kind: Strategy
metadata: {name: plan}
predicted: {stepSeconds: 0.05, baselines: {data-parallel: 0.08}}
search: {seconds: 12.5}
ops: []
"""


def _ready(node):
    node = copy.deepcopy(node)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


class World:
    """Objects by (kind, name); the job's status; a clock."""

    def __init__(self, nodes=2, **spec):
        doc = {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
               "metadata": {"name": "llm", "namespace": "ml"},
               "spec": {"model": {"name": "lenet"}, "training": {"steps": 100},
                        "devices": {"nodes": nodes, "gpusPerNode": 8}, **spec}}
        self.job = parse_job(doc)
        self.objects: dict[tuple[str, str], dict] = {}
        self.status: dict = {}
        self.events: list[dict] = []
        self.nodes = [_ready(n) for n in dgx_h100(3)]
        self.now = T0
        self.conflicts = 0
        self.deleted_job = False

    def get(self, kind, name):
        return self.objects.get((kind, name))

    def observe(self) -> Observed:
        attempt = int(self.status.get("replans") or 0)
        pods = [o for (k, _), o in sorted(self.objects.items()) if k == "Pod"]
        return Observed(job=self.job, uid="uid-1", generation=1, status=copy.deepcopy(self.status),
                        nodes=self.nodes, topology_configmap=self.get("ConfigMap", r.topology_configmap_name(self.job)),
                        plan_configmap=self.get("ConfigMap", r.plan_configmap_name(self.job)),
                        planner_job=self.get("Job", r.planner_name(self.job, attempt)),
                        service=self.get("Service", r.service_name(self.job)), pods=pods, now=self.now)

    def step(self):
        actions = reconcile(self.observe(), Settings(image="autopar:test"))
        for a in actions:
            if a.verb == "create":
                key = (a.obj["kind"], a.obj["metadata"]["name"])
                if key in self.objects:
                    self.conflicts += 1        # 409 Conflict: already there, done
                else:
                    self.objects[key] = copy.deepcopy(a.obj)
            elif a.verb == "delete":
                self.objects.pop((a.kind, a.name), None)
            elif a.verb == "status":
                self.status.update(copy.deepcopy(a.patch))
            elif a.verb == "event":
                self.events.append(a.obj)
            elif a.verb == "delete_job":
                self.deleted_job = True
        return actions

    def conditions(self):
        return {c["type"]: c["status"] for c in self.status.get("conditions", [])}

    def pods(self):
        return [o for (k, _), o in sorted(self.objects.items()) if k == "Pod"]

    def publish_plan(self, step_seconds: float | None = None):
        cm = self.get("ConfigMap", r.plan_configmap_name(self.job))
        text = PLAN if step_seconds is None else PLAN.replace("stepSeconds: 0.05", f"stepSeconds: {step_seconds}")
        patch = r.plan_configmap_patch(text, topology_fingerprint=self.status["topologyFingerprint"])
        cm.setdefault("data", {}).update(patch.get("data", {}))
        cm["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])

    def set_pods(self, phase, only=None):
        for p in self.pods():
            if only is None or p["metadata"]["name"] == only:
                p["status"] = {"phase": phase}

    def add_planner_pod(self):
        """The planner Job's pod, labelled as the job's: it must not count as a trainer."""
        self.objects[("Pod", "llm-planner-x")] = {"kind": "Pod", "metadata": {
            "name": "llm-planner-x", "labels": r.labels(self.job, "planner")}, "status": {"phase": "Pending"}}

    def run_to_training(self):
        self.step()                       # topology, planner
        self.publish_plan()
        self.step()                       # plan read, trainers created
        self.set_pods("Running")
        self.step()


def test_create_to_succeeded():
    w = World()
    first = w.step()
    assert w.status["phase"] == "Planning" and w.conditions()["Planning"] == "True"
    assert w.get("ConfigMap", "llm-topology") and w.get("Job", "llm-planner")
    assert w.get("ConfigMap", "llm-plan")["metadata"]["annotations"][r.ANN_PLAN_STATE] == "Pending"
    assert w.status["topology"]["gpus"] == 16 and w.status["devices"] == "16x H100-SXM5-80GB"
    assert any(e["reason"] == "TopologyDiscovered" for e in w.events)
    assert not w.pods()
    assert [a for a in w.step() if a.verb in ("create", "status")] == []   # the planner runs: nothing to do
    assert w.conflicts == 0
    w.add_planner_pod()
    w.publish_plan()
    w.step()
    assert w.conditions()["Planned"] == "True" and w.status["simulatedStep"] == "50.0ms"
    assert w.status["predictedSpeedup"] == "1.60x" and w.status["searchSeconds"] == 12.5
    pods = w.pods()
    assert [p["metadata"]["name"] for p in pods if "trainer" in p["metadata"]["name"]] == \
        ["llm-trainer-0", "llm-trainer-1"]
    w.objects.pop(("Pod", "llm-planner-x"))
    pods = w.pods()
    assert w.get("Service", "llm-rdzv") and w.status["phase"] == "Training"
    nodes = {p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
             ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0] for p in pods}
    assert nodes == set(w.status["topology"]["nodes"])
    w.set_pods("Running")
    assert not [a for a in w.step() if a.verb == "create"]
    w.set_pods("Succeeded")
    w.step()
    assert w.status["phase"] == "Succeeded" and w.conditions()["Running"] == "False"
    assert w.status["completionTime"] and first


def test_a_failed_trainer_restarts_the_gang_from_the_checkpoint_then_succeeds():
    w = World()
    w.run_to_training()
    w.set_pods("Failed", only="llm-trainer-1")
    w.step()
    assert w.status["restarts"] == 1 and w.conditions()["Restarting"] == "True" and not w.pods()
    w.step()
    pods = w.pods()
    assert len(pods) == 2 and all(p["metadata"]["labels"][r.LABEL_RESTART] == "1" for p in pods)
    args = " ".join(pods[0]["spec"]["containers"][0]["args"] + pods[0]["spec"]["containers"][0].get("command", []))
    assert "--resume" in args
    assert w.conditions()["Running"] == "True"
    w.set_pods("Succeeded")
    w.step()
    assert w.status["phase"] == "Succeeded"


def test_an_older_gangs_failure_the_index_still_shows_live_is_not_a_second_restart():
    """A trainer dies and its peer fails with it: the gang restarts once.  The pods index can still
    show the peer as live and Failed after the restart deleted it (the watch lags behind the
    delete): that is the old gang ending, not a failure of the new one."""
    w = World()
    w.run_to_training()
    w.set_pods("Failed", only="llm-trainer-1")
    old = copy.deepcopy(w.pods())
    w.step()
    assert w.status["restarts"] == 1 and not w.pods()
    for p in old:                                   # the index has not seen the deletes yet
        p["status"] = {"phase": "Failed"}
        w.objects[("Pod", p["metadata"]["name"])] = p
    actions = w.step()
    assert w.status["restarts"] == 1 and w.status["phase"] == "Training"
    assert sorted(a.name for a in actions if a.verb == "delete") == ["llm-trainer-0", "llm-trainer-1"]
    assert not [a for a in actions if a.verb == "create" and a.obj["kind"] == "Pod"], "the old gang goes first"
    w.step()
    pods = w.pods()
    assert len(pods) == 2 and {p["metadata"]["labels"][r.LABEL_RESTART] for p in pods} == {"1"}
    assert [e["reason"] for e in w.events].count("TrainerFailed") == 1


def test_a_status_read_behind_the_pods_takes_the_gang_from_their_label():
    """The status read lags behind the pods (restarts 0, the restarted gang's pods labelled 1): the
    running gang is the current one; its failure is the second restart, not the first again."""
    w = World()
    w.run_to_training()
    w.set_pods("Failed", only="llm-trainer-1")
    w.step()
    w.step()
    assert {p["metadata"]["labels"][r.LABEL_RESTART] for p in w.pods()} == {"1"}
    w.set_pods("Running")
    w.status["restarts"] = 0                        # a status from before the restart
    assert not [a for a in w.step() if a.verb in ("create", "delete")]
    w.set_pods("Failed", only="llm-trainer-0")
    w.step()
    assert w.status["restarts"] == 2


def test_backoff_exhausted_fails_the_job():
    w = World(runPolicy={"backoffLimit": 1})
    w.run_to_training()
    for _ in range(2):
        w.set_pods("Failed", only="llm-trainer-0")
        w.step()
        w.step()
    assert w.status["phase"] == "Failed" and "BackoffLimitExceeded" in {e["reason"] for e in w.events}
    assert "backoffLimit 1" in w.status["message"]


def test_a_lost_node_replans_and_resumes():
    w = World()
    w.run_to_training()
    before = w.status["topologyFingerprint"]
    used = set(w.status["topology"]["nodes"])
    w.nodes = [n for n in w.nodes if n["metadata"]["name"] != sorted(used)[0]]   # a node disappears
    w.step()
    assert w.conditions()["Replanning"] == "True" and w.status["replans"] == 1 and not w.pods()
    assert w.status["topologyFingerprint"] != before
    lost = sorted(used)[0]
    assert w.status["topology"]["network"][lost] is None, "the status patch removes the lost node"
    w.step()
    assert w.get("Job", r.planner_name(w.job, 1)), "a new planner for the new topology"
    w.publish_plan()
    w.step()
    pods = w.pods()
    assert len(pods) == 2 and "--resume" in " ".join(pods[0]["spec"]["containers"][0]["args"])
    assert sorted(used)[0] not in {p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                                   ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0] for p in pods}


def _relabel_a_used_node(w):
    """A link label changes on a node the trainers use: a new fingerprint, the same nodes."""
    used = sorted(w.status["topology"]["nodes"])[0]
    for n in w.nodes:
        if n["metadata"]["name"] == used:
            n["metadata"]["labels"]["autopar.dev/network-bandwidth"] = "200Gbps"


@pytest.mark.parametrize("new_step, switched", [(0.03, True), (0.049, False)])
def test_a_changed_topology_that_still_fits_replans_while_training(new_step, switched):
    """The running plan's nodes are all still there: training continues while a new plan is made,
    and the trainers restart under it only if it is faster by more than replanMargin (5 %)."""
    w = World()
    w.run_to_training()
    before = w.status["topologyFingerprint"]
    running = sorted(p["metadata"]["uid"] if "uid" in p["metadata"] else p["metadata"]["name"] for p in w.pods())
    _relabel_a_used_node(w)
    w.step()
    assert w.status["topologyFingerprint"] != before and w.status["replans"] == 1
    assert w.conditions()["Replanning"] == "True" and w.status["phase"] == "Training"
    assert w.status["replanPending"] is True and len(w.pods()) == 2, "the trainers keep running"
    w.step()
    assert w.get("Job", r.planner_name(w.job, 1)), "a new planner for the new topology"
    w.publish_plan(step_seconds=new_step)
    w.step()
    reasons = [e["reason"] for e in w.events]
    if switched:
        assert reasons[-1] == "FasterPlan" and not w.pods()
        assert w.status["simulatedStepSeconds"] == new_step and not w.status.get("replanPending")
        w.step()
        pods = w.pods()
        assert len(pods) == 2 and "--resume-if-present" in pods[0]["spec"]["containers"][0]["args"]
    else:
        assert reasons[-1] == "PlanKept" and len(w.pods()) == 2
        assert w.status["simulatedStepSeconds"] == 0.05 and w.status["keptPlanHash"]
        assert sorted(p["metadata"]["name"] for p in w.pods()) == running
        assert not [a for a in w.step() if a.verb in ("create", "delete")], "nothing more to do"
        # a later gang (a failure restarts it) trains the plan the ConfigMap holds now
        w.set_pods("Failed", only="llm-trainer-0")
        w.step()
        w.step()
        assert len(w.pods()) == 2 and w.status["simulatedStepSeconds"] == new_step
        assert not w.status.get("keptPlanHash")


def test_too_few_nodes_waits_with_the_reasons():
    w = World(nodes=4)
    w.step()
    assert w.status["phase"] == "Pending" and "4" in w.status["message"]
    assert not w.objects


def test_suspend_deletes_the_pods_and_resume_restarts_them():
    w = World()
    w.run_to_training()
    w.job = parse_job({**w.job.to_manifest(), "spec": {**w.job.to_manifest()["spec"],
                                                       "runPolicy": {"suspend": True}}})
    w.step()
    assert w.status["phase"] == "Suspended" and not w.pods()
    assert w.step() == []
    w.job = parse_job({**w.job.to_manifest(), "spec": {**w.job.to_manifest()["spec"],
                                                       "runPolicy": {"suspend": False}}})
    w.step()
    assert len(w.pods()) == 2 and w.status["phase"] == "Training"


def test_the_active_deadline_fails_the_job():
    w = World(runPolicy={"activeDeadlineSeconds": 60})
    w.run_to_training()
    w.now = T0 + _dt.timedelta(seconds=61)
    w.step()
    assert w.status["phase"] == "Failed" and not w.pods()
    assert any(e["reason"] == "DeadlineExceeded" for e in w.events)


def test_ttl_after_finished_deletes_the_job():
    w = World(runPolicy={"ttlSecondsAfterFinished": 30})
    w.run_to_training()
    w.set_pods("Succeeded")
    w.step()
    w.now = T0 + _dt.timedelta(seconds=10)
    w.step()
    assert not w.deleted_job
    w.now = T0 + _dt.timedelta(seconds=31)
    w.step()
    assert w.deleted_job


def test_a_bad_spec_fails_with_what_to_change():
    w = World(model={"name": "lenet", "options": {"hiden": 3}})
    w.step()
    assert w.status["phase"] == "Failed"
    assert "spec.model.options.hiden" in w.status["message"] and "fix the spec" in w.status["message"]
    assert w.conditions()["Failed"] == "True" and not w.objects
    assert w.step() == []                  # never a retry loop


@pytest.mark.parametrize("stage", ["planning", "training"])
def test_deciding_twice_creates_nothing_twice(stage):
    w = World()
    w.step()
    if stage == "training":
        w.publish_plan()
        w.step()
    objects = dict(w.objects)
    status = copy.deepcopy(w.status)
    w.status = status
    again = w.step()
    assert w.objects.keys() == objects.keys()
    assert not [a for a in again if a.verb == "create" and (a.obj["kind"], a.obj["metadata"]["name"]) not in objects]
