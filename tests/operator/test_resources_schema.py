"""Every object `operator.resources` builds, checked against the Kubernetes v1.37 OpenAPI schemas
(kubernetes-validate, strict: a field the schema does not name fails), without a server.

Two sources of objects: the builders called directly for several jobs (the helpers of
tests/operator/test_resources.py and the jobs of tests/operator/test_resources_apiserver.py), and
what `reconcile` creates over whole lifecycles (tests/operator/test_reconcile.py's World): the
plain path, a pinned plan, a gang restart, a re-plan, scheduling options, a bad spec.  The schemas
check structure and types; names, Pod Security and RBAC need the real server
(test_resources_apiserver.py)."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import kubernetes_validate
import pytest

from autopar.operator import resources as r
from autopar.operator.handlers import KINDS
from tests.operator.test_reconcile import World
from tests.operator.test_resources import LONG, UID, all_objects, gpu_job, make_job
from tests.operator.test_resources_apiserver import JOBS, NAMES
from tests.operator.test_resources_apiserver import _objects as apiserver_objects

KUBERNETES = "1.37.0"      # the newest kubernetes-validate 1.37.0 knows; the control plane's too
_VERDICTS: dict[str, str | None] = {}      # an object seen before is not validated again (~50 ms each)


def schema_errors(objects: list[dict[str, Any]]) -> list[str]:
    """One line per distinct object the strict schema refuses: kind, name, field path, reason."""
    errors = []
    for key in dict.fromkeys(json.dumps(obj, sort_keys=True) for obj in objects):
        if key not in _VERDICTS:
            obj = json.loads(key)
            try:
                kubernetes_validate.validate(obj, KUBERNETES, strict=True)
                _VERDICTS[key] = None
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.absolute_path) or "(top)"
                _VERDICTS[key] = f"{obj['kind']} {obj['metadata']['name']}: {where}: {e.message}"
        if _VERDICTS[key] is not None:
            errors.append(_VERDICTS[key])
    return errors


def test_validates_against_the_newest_schemas_the_package_has():
    assert kubernetes_validate.utils.latest_version() == KUBERNETES


# -- the builders, called directly -----------------------------------------------------------------

BUILT: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "one-node": lambda: all_objects(make_job("tiny")) + [r.event(make_job("tiny"), UID, "Planned", "plan found")],
    "twelve-nodes": lambda: all_objects(make_job("tiny", devices={"nodes": 12, "gpusPerNode": 1})),
    "long-name": lambda: all_objects(make_job(LONG, devices={"nodes": 3, "gpusPerNode": 8})),
    # examples/gpu-cluster.yaml: nodeSelector, tolerations, a Kueue queue
    "gpu-cluster-example": lambda: all_objects(gpu_job()),
    **{f"apiserver-{case}": (lambda case=case: apiserver_objects(
        make_job(NAMES[case], "team-a", **JOBS[case]), UID)) for case in JOBS},
    "pinned-plan": lambda: r.trainer_pods(
        make_job(devices={"nodes": 2, "gpusPerNode": 4},
                 planner={"algorithm": "pinned", "planRef": {"configMap": "my-plan", "key": "mine.yaml"}}),
        UID, ["a", "b"], "img", plan_configmap="my-plan", plan_key="mine.yaml", plan_text_hash="sha256:77"),
    "restart-and-resume": lambda: r.trainer_pods(make_job(devices={"nodes": 2}), UID, ["a", "b"], "img",
                                                 restart_count=3, resume=True),
    "cpu-no-sidecar": lambda: [r.trainer_pod(make_job(), UID, 0, None, "img", device="cpu", gpu_resource=None,
                                             resources={"requests": {"cpu": "2", "memory": "4Gi"}},
                                             progress_sidecar=False)],
    "checkpoints-on-a-claim": lambda: r.trainer_pods(
        make_job(checkpoint={"path": "pvc://shared.ckpt/runs/a", "everySteps": 5}), UID, ["a"], "img"),
    "planner-with-profile-cache": lambda: [r.planner_job(gpu_job(), UID, "img", topology_fingerprint="sha256:1",
                                                         attempt=2, profile_cache_claim="profile-cache")],
    "warning-event-long-message": lambda: [r.event(make_job(), UID, "PlannerFailed", "m" * 5000, "Warning")],
}


@pytest.mark.parametrize("case", list(BUILT))
def test_every_built_object_passes_the_strict_schema(case):
    objects = BUILT[case]()
    assert objects
    assert schema_errors(objects) == []


def test_every_kind_the_operator_creates_is_checked():
    checked = {obj["kind"] for build in BUILT.values() for obj in build()}
    assert checked == set(KINDS)


# -- what reconcile creates over whole lifecycles ------------------------------------------------------

class Recording(World):
    """test_reconcile's World that keeps every object a create or event action carried."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[dict[str, Any]] = []

    def step(self):
        actions = super().step()
        self.sent += [copy.deepcopy(a.obj) for a in actions if a.verb in ("create", "event")]
        return actions


def _plain_run(w):
    w.run_to_training()
    w.set_pods("Succeeded")
    w.step()


def _restart(w):
    w.run_to_training()
    w.set_pods("Failed", only="llm-trainer-1")
    w.step()
    w.step()


def _replan(w):
    w.run_to_training()
    lost = sorted(w.status["topology"]["nodes"])[0]
    w.nodes = [n for n in w.nodes if n["metadata"]["name"] != lost]
    w.step()
    w.step()
    w.publish_plan()
    w.step()


def _steps(n):
    def run(w):
        for _ in range(n):
            w.step()
    return run


SCHEDULING = dict(devices={"nodes": 2, "gpusPerNode": 8,
                           "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
                  runPolicy={"queueName": "gpu-queue", "schedulerName": "volcano", "priorityClassName": "high",
                             "backoffLimit": 2})
EVERY_KIND = set(KINDS)        # what the handlers know how to create
LIFECYCLES = {
    "create-to-succeeded": ({}, _plain_run, EVERY_KIND),
    "pinned-plan": (dict(planner={"algorithm": "pinned", "planRef": {"configMap": "my-plan"}}), _steps(2),
                    EVERY_KIND - {"Job"}),
    "gang-restart": ({}, _restart, EVERY_KIND),
    "replan": ({}, _replan, EVERY_KIND),
    "scheduling-and-kueue": (SCHEDULING, _plain_run, EVERY_KIND),
    "bad-spec": (dict(model={"name": "lenet", "options": {"hiden": 3}}), _steps(2), {"Event"}),
}


@pytest.mark.parametrize("case", list(LIFECYCLES))
def test_what_reconcile_creates_passes_the_strict_schema(case):
    spec, drive, kinds = LIFECYCLES[case]
    w = Recording(**spec)
    drive(w)
    assert {o["kind"] for o in w.sent} == kinds
    assert schema_errors(w.sent) == []


# -- the check itself can fail ---------------------------------------------------------------------

def _pod():
    return r.trainer_pod(make_job(), UID, 0, "n", "img")


@pytest.mark.parametrize("spoil, where", [
    (lambda p: p["spec"]["containers"][0].update(imagePulPolicy="Always"), "spec.containers.0"),  # a typo
    (lambda p: p["spec"]["containers"][0]["ports"][0].update(containerPort="9090"), "containerPort"),
    (lambda p: p["spec"].update(tolerations={"key": "x"}), "spec.tolerations"),
    (lambda p: p["metadata"]["labels"].update({"autopar.dev/restart": 0}), "metadata.labels"),
    (lambda p: p["spec"]["containers"][0].pop("name"), "spec.containers.0"),                    # required
])
def test_a_wrong_field_is_caught(spoil, where):
    pod = _pod()
    assert schema_errors([pod]) == []
    spoil(pod)
    (error,) = schema_errors([pod])
    assert where in error, error


def test_strict_mode_is_what_catches_an_unknown_field():
    pod = _pod()
    pod["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    kubernetes_validate.validate(pod, KUBERNETES, strict=False)     # the lax schema lets it through
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePulPolicy"):
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)
