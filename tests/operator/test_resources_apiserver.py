"""The resource builders against a real kube-apiserver (v1.37, tests/controlplane): every object
passes the server's validation (server-side dry run, in a namespace that enforces the
`restricted` Pod Security Standard), the Roles grant exactly what the planner and rank 0 need
(the plan ConfigMap patch and the status patch done with the ServiceAccounts' own tokens), and
garbage collection deletes every child with the job."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from autopar.job import parse_job
from autopar.operator import resources as r

pytestmark = pytest.mark.controlplane

PRIORITY_CLASS = "autopar-test-high"
LONG = "a-very-long-job-name-that-uses-every-one-of-its-sixty-three-chr"


def _job(name: str, ns: str, **spec):
    return parse_job({"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                      "metadata": {"name": name, "namespace": ns},
                      "spec": {"model": {"name": "lenet"}, **spec}})


JOBS = {
    "gpu-cluster": dict(devices={"nodes": 2, "gpusPerNode": 2,
                                 "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                  "effect": "NoSchedule"}]},
                        checkpoint={"everySteps": 25},
                        runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 3600, "queueName": "gpu-queue"}),
    "long-name": dict(devices={"nodes": 3, "gpusPerNode": 8},
                      training={"dtype": "bfloat16", "batchSize": 48},
                      planner={"algorithm": "mcmc", "maxProposals": 200},
                      checkpoint={"path": "pvc://shared-ckpt/runs"},
                      runPolicy={"schedulerName": "volcano", "priorityClassName": PRIORITY_CLASS}),
    "digit-first": dict(model={"name": "lenet", "options": {"channels": 3}, "image": "registry.local/me/model:1"},
                        checkpoint={"path": "/scratch/ckpt"}),
}
NAMES = {"gpu-cluster": "lenet-h100", "long-name": LONG, "digit-first": "9lives"}


def _objects(job, uid: str) -> list[dict]:
    n = job.spec.devices.nodes
    return [r.topology_configmap(job, uid, {"name": "cluster", "devices": [{"name": "gpu0"}]}, "sha256:0123"),
            r.plan_configmap(job, uid, topology_fingerprint="sha256:0123"),
            r.planner_serviceaccount(job, uid), r.planner_role(job, uid), r.planner_rolebinding(job, uid),
            r.planner_job(job, uid, "autopar:test", topology_fingerprint="sha256:0123",
                          profile_cache_claim="profile-cache"),
            r.trainer_serviceaccount(job, uid), r.progress_role(job, uid), r.progress_rolebinding(job, uid),
            r.trainer_service(job, uid),
            *r.trainer_pods(job, uid, [f"gpu-node-{i}" for i in range(n)], "autopar:test", restart_count=1,
                            plan_text_hash="sha256:77"),
            r.event(job, uid, "Planning", "planner job started")]


def _create_job(plane, ns: str, job) -> str:
    plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(job.to_manifest()))
    return plane.get("ptj", job.name, "-n", ns)["metadata"]["uid"]


def _restricted(plane, ns: str) -> None:
    plane.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                  "pod-security.kubernetes.io/warn=restricted", "--overwrite")


@pytest.mark.parametrize("case", list(JOBS))
def test_every_object_passes_the_api_servers_validation(crd_installed, namespace, case):
    plane = crd_installed
    if case == "long-name":
        plane.kubectl("create", "priorityclass", PRIORITY_CLASS, "--value", "1000", check=False)
    _restricted(plane, namespace)
    job = _job(NAMES[case], namespace, **JOBS[case])
    uid = _create_job(plane, namespace, job)
    for obj in _objects(job, uid):
        out = plane.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj),
                            check=False)
        what = f"{obj['kind']} {obj['metadata']['name']}"
        assert out.returncode == 0, f"{what} refused: {out.stderr}"
        assert "Warning" not in out.stderr, f"{what}: {out.stderr}"
        if obj["kind"] == "ServiceAccount":   # pods are refused until their ServiceAccount exists
            plane.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))


def _can(plane, ns: str, account: str, *args: str) -> bool:
    out = plane.kubectl("auth", "can-i", *args, "-n", ns, f"--as=system:serviceaccount:{ns}:{account}",
                        check=False)
    return out.stdout.strip() == "yes"


def test_rbac_the_publish_and_progress_steps_and_garbage_collection(crd_installed, namespace):
    plane, ns = crd_installed, namespace
    _restricted(plane, ns)
    job = _job("rbac-check", ns, devices={"nodes": 2, "gpusPerNode": 1})
    uid = _create_job(plane, ns, job)
    objs = _objects(job, uid)
    plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objs[:-1]))   # all but the Event
    plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(objs[-1]))

    planner, trainer = r.planner_account_name(job), r.trainer_account_name(job)
    # the planner: its plan ConfigMap only
    assert _can(plane, ns, planner, "patch", f"configmaps/{r.plan_configmap_name(job)}")
    assert _can(plane, ns, planner, "get", f"configmaps/{r.plan_configmap_name(job)}")
    assert not _can(plane, ns, planner, "patch", f"configmaps/{r.topology_configmap_name(job)}")
    assert not _can(plane, ns, planner, "create", "configmaps")
    assert not _can(plane, ns, planner, "list", "configmaps")
    assert _can(plane, ns, planner, "create", "events")
    # rank 0: this job's status only
    assert _can(plane, ns, trainer, "patch", f"paralleltrainingjobs.autopar.dev/{job.name}", "--subresource=status")
    assert _can(plane, ns, trainer, "get", f"paralleltrainingjobs.autopar.dev/{job.name}", "--subresource=status")
    assert not _can(plane, ns, trainer, "patch", "paralleltrainingjobs.autopar.dev/other", "--subresource=status")
    assert not _can(plane, ns, trainer, "patch", f"paralleltrainingjobs.autopar.dev/{job.name}")
    assert not _can(plane, ns, trainer, "get", "secrets")

    # `autopar operator publish-plan`, as the planner's ServiceAccount
    text = "apiVersion: autopar.dev/v1alpha1\nkind: Strategy\nops: {}\n"
    as_planner = plane.as_service_account(planner, ns)
    plane.kubectl("patch", "configmap", r.plan_configmap_name(job), "-n", ns, "--type", "merge", "-p",
                  json.dumps(r.plan_configmap_patch(text, topology_fingerprint="sha256:0123")), kubeconfig=as_planner)
    cm = plane.get("configmap", r.plan_configmap_name(job), "-n", ns)
    assert cm["data"] == {"plan.yaml": text}
    assert cm["metadata"]["annotations"]["autopar.dev/plan-state"] == "Ready"
    with pytest.raises(subprocess.CalledProcessError):
        plane.kubectl("patch", "configmap", r.topology_configmap_name(job), "-n", ns, "--type", "merge", "-p",
                      '{"data": {"x": "y"}}', kubeconfig=as_planner)

    # `autopar operator report-progress`, as the trainers' ServiceAccount
    as_trainer = plane.as_service_account(trainer, ns)
    plane.kubectl("patch", "ptj", job.name, "-n", ns, "--subresource=status", "--type", "merge", "-p",
                  '{"status": {"completedSteps": 3}}', kubeconfig=as_trainer)
    assert plane.get("ptj", job.name, "-n", ns)["status"]["completedSteps"] == 3

    # the Service selects both trainer pods (an EndpointSlice lists them once they have IPs; here
    # the selector is checked on the server's label selection)
    svc = plane.get("service", r.service_name(job), "-n", ns)
    selector = ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
    pods = plane.get("pods", "-n", ns, "-l", selector)["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == [r.trainer_pod_name(job, 0), r.trainer_pod_name(job, 1)]

    # deleting the job deletes its children
    plane.kubectl("delete", "ptj", job.name, "-n", ns, "--wait=false")
    kinds = "configmaps,serviceaccounts,roles,rolebindings,services,jobs.batch,pods"

    def gone():
        left = plane.get(kinds, "-n", ns, "-l", f"autopar.dev/job={job.name}")["items"]
        return not left
    plane.wait_for("garbage collection of the job's children", gone, timeout=90)
