"""Simulated GPU nodes (KWOK) with real labels and allocatable GPUs; the scheduler binds a GPU pod
to one and it runs; the Job controller creates a Job's pod; garbage collection removes it."""

from __future__ import annotations

import pytest
import yaml

from .nodes import dgx_h100, gb200_nvl, l4_pool, p4d


def _ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


@pytest.fixture(scope="module")
def gpu_nodes(controlplane):
    nodes = dgx_h100(2) + l4_pool(2) + gb200_nvl(2) + p4d(2)
    controlplane.apply(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    controlplane.wait_for("simulated nodes Ready", lambda: all(
        _ready(controlplane.get("node", n)) for n in names), timeout=60)
    yield names
    controlplane.kubectl("delete", "node", *names, "--wait=false", check=False)


def test_nodes_carry_their_labels_and_gpus(controlplane, gpu_nodes):
    node = controlplane.get("node", "dgx-h100-1")
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and labels["nvidia.com/gpu.count"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    selected = controlplane.get("nodes", "-l", "nvidia.com/gpu.product=NVIDIA-L4")["items"]
    assert sorted(n["metadata"]["name"] for n in selected) == ["l4-0", "l4-1"]
    cliques = {n["metadata"]["labels"].get("nvidia.com/gpu.clique")
               for n in controlplane.get("nodes", "-l", "nvidia.com/gpu.family=blackwell")["items"]}
    assert len(cliques) == 1 and None not in cliques
    assert controlplane.get("node", "l4-0")["metadata"]["labels"]["autopar.dev/network-bandwidth"] == "50Gbps"


def _gpu_pod(name: str, product: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": product, "type": "kwok"},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "train", "image": "autopar:test",
                                     "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}


def test_a_gpu_pod_is_scheduled_onto_a_matching_node_and_runs(controlplane, gpu_nodes, namespace):
    controlplane.kubectl("apply", "-n", namespace, "-f", "-",
                         input=yaml.safe_dump(_gpu_pod("trainer-0", "NVIDIA-H100-80GB-HBM3")))
    def running():
        pod = controlplane.get("pod", "trainer-0", "-n", namespace)
        return pod if pod["status"].get("phase") == "Running" else None
    pod = controlplane.wait_for("the pod to run", running)
    assert pod["spec"]["nodeName"] in ("dgx-h100-0", "dgx-h100-1")


def test_a_pod_asking_for_more_gpus_than_a_node_has_stays_pending(controlplane, gpu_nodes, namespace):
    pod = _gpu_pod("too-big", "NVIDIA-L4")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
    controlplane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))

    def unschedulable():
        p = controlplane.get("pod", "too-big", "-n", namespace)
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in p["status"].get("conditions", []))
    controlplane.wait_for("the scheduler to refuse the pod", unschedulable)
    assert "nodeName" not in controlplane.get("pod", "too-big", "-n", namespace)["spec"]


def test_the_job_controller_runs_a_jobs_pod_to_completion(controlplane, gpu_nodes, namespace):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "planner"},
           "spec": {"backoffLimit": 0, "template": {"spec": {**_gpu_pod("x", "NVIDIA-A100-SXM4-40GB")["spec"],
                                                              "restartPolicy": "Never"}}}}
    controlplane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))
    done = controlplane.wait_for("the Job to succeed", lambda: controlplane.get("job", "planner", "-n", namespace)
                                 ["status"].get("succeeded"), timeout=90)
    assert done == 1
    pods = controlplane.get("pods", "-n", namespace, "-l", "job-name=planner")["items"]
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"].startswith("p4d-")
    # garbage collection: deleting the Job (foreground) removes its pod
    controlplane.kubectl("delete", "job", "planner", "-n", namespace, "--cascade=foreground", "--timeout=60s")
    controlplane.wait_for("the Job's pod to be collected", lambda: not controlplane.get(
        "pods", "-n", namespace, "-l", "job-name=planner")["items"], timeout=60)
