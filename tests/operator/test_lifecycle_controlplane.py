"""The operator on the real control plane: `autopar operator run` as a process, simulated GPU
nodes (KWOK), and the planner pod's own command run here as that pod would run it.

create → topology ConfigMap → planner Job → (the planner's `autopar plan` and publish step, as the
planner's ServiceAccount) → plan → trainer pods on the chosen nodes, Running → a trainer fails →
the gang restarts → deleting the job removes everything it owns (the garbage collector runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from autopar.operator import resources as r
from tests.controlplane.cluster import free_port
from tests.controlplane.nodes import dgx_h100

pytestmark = pytest.mark.controlplane


def _ready(node):
    return node


@pytest.fixture
def pool(controlplane, namespace):
    """Two DGX H100 nodes only this test's jobs select (label autopar.dev/test-pool=<namespace>)."""
    nodes = dgx_h100(2, prefix=f"{namespace[:40]}-h100", labels={"autopar.dev/test-pool": namespace})
    controlplane.apply(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    controlplane.wait_for("the pool's nodes Ready", lambda: all(
        any(c["type"] == "Ready" and c["status"] == "True"
            for c in controlplane.get("node", n).get("status", {}).get("conditions", [])) for n in names))
    yield names
    controlplane.kubectl("delete", "node", *names, "--wait=false", check=False)


@pytest.fixture
def operator(crd_installed, namespace, tmp_path):
    """`autopar operator run` watching the test's namespace, as the admin."""
    log = open(tmp_path / "operator.log", "w")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autopar.cli", "operator", "run", "--namespace", namespace,
                             "--kubeconfig", str(crd_installed.kubeconfig), "--image", "autopar:test",
                             "--device", "cpu", "--metrics-port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.metrics_port = port
    proc.log_path = tmp_path / "operator.log"
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()
    sys.stderr.write("\n--- operator log (tail) ---\n" + "\n".join(
        proc.log_path.read_text().splitlines()[-40:]) + "\n")


def _job(namespace: str) -> dict:
    return {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
            "metadata": {"name": "lenet", "namespace": namespace},
            "spec": {"model": {"name": "lenet", "options": {"image": 12}},
                     "training": {"steps": 20, "batchSize": 64},
                     "devices": {"nodes": 2, "gpusPerNode": 8,
                                 "nodeSelector": {"autopar.dev/test-pool": namespace}},
                     "planner": {"algorithm": "auto", "budgetSeconds": 1, "maxProposals": 10},
                     "runPolicy": {"backoffLimit": 2}}}


def _run_planner_pod(plane, namespace: str, planner: dict, tmp_path: Path) -> None:
    """Run the planner pod's two steps here, as the pod would: `autopar plan` on the mounted
    topology ConfigMap, then publish the plan with the planner's ServiceAccount."""
    from autopar.operator.kube import KubeClient
    from autopar.operator.podside import publish_plan
    pod = planner["spec"]["template"]["spec"]
    topo_cm = plane.get("configmap", "lenet-topology", "-n", namespace)
    topo = tmp_path / "topology.yaml"
    topo.write_text(topo_cm["data"][r.TOPOLOGY_KEY])
    out = tmp_path / "plan.yaml"
    plan = pod["initContainers"][0]
    args = [a.replace(r.TOPOLOGY_FILE, str(topo)).replace(r.PLANNER_OUT, str(out))
            for a in plan["command"][1:] + plan.get("args", [])]
    done = subprocess.run([sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "AUTOPAR_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    account = plane.as_service_account(r.planner_account_name(_parsed(namespace)), namespace)
    fingerprint = topo_cm["metadata"]["annotations"][r.ANN_TOPOLOGY_FINGERPRINT]
    publish_plan(KubeClient.from_kubeconfig(account), namespace, "lenet-plan", out, topology_fingerprint=fingerprint)


def _parsed(namespace: str):
    from autopar.job import parse_job
    return parse_job(_job(namespace))


def test_create_plan_train_restart_delete(controlplane, namespace, pool, operator, tmp_path):
    plane = controlplane
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_job(namespace)))
    job = plane.get("ptj", "lenet", "-n", namespace)
    assert job["metadata"]["name"] == "lenet"

    planner = plane.wait_for("the planner Job", lambda: plane.kubectl(
        "get", "job", "lenet-planner", "-n", namespace, "-o", "json", check=False).stdout and
        json.loads(plane.kubectl("get", "job", "lenet-planner", "-n", namespace, "-o", "json").stdout), timeout=60)
    status = plane.get("ptj", "lenet", "-n", namespace)["status"]
    assert status["phase"] == "Planning" and status["topology"]["gpus"] == 16
    assert sorted(status["topology"]["nodes"]) == sorted(pool)

    _run_planner_pod(plane, namespace, planner, tmp_path)

    def trainers_running():
        pods = plane.get("pods", "-n", namespace, "-l", f"{r.LABEL_COMPONENT}=trainer")["items"]
        return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else None
    pods = plane.wait_for("two trainer pods Running", trainers_running, timeout=90)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(pool)
    status = plane.get("ptj", "lenet", "-n", namespace)["status"]
    assert status["phase"] == "Training" and status["simulatedStepSeconds"] > 0
    table = plane.kubectl("get", "ptj", "-n", namespace).stdout
    assert "Training" in table and status["simulatedStep"] in table

    # a trainer fails: the gang restarts from the last checkpoint
    plane.kubectl("patch", "pod", "lenet-trainer-1", "-n", namespace, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"phase": "Failed"}}))

    def restarted():
        pods = plane.get("pods", "-n", namespace, "-l", f"{r.LABEL_COMPONENT}=trainer")["items"]
        return len(pods) == 2 and all(p["metadata"]["labels"][r.LABEL_RESTART] == "1" for p in pods) and pods
    pods = plane.wait_for("the gang restarted", restarted, timeout=90)
    assert "--resume" in " ".join(pods[0]["spec"]["containers"][0]["args"])
    assert plane.get("ptj", "lenet", "-n", namespace)["status"]["restarts"] == 1

    # metrics
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics").read().decode()
    assert f'autopar_job_simulated_step_seconds{{job="lenet",namespace="{namespace}"}}' in text

    # deletion removes everything the job owns
    plane.kubectl("delete", "ptj", "lenet", "-n", namespace, "--wait=true", "--timeout=60s")

    def gone():
        left = plane.kubectl("get", "pods,configmaps,services,jobs,serviceaccounts,roles,rolebindings", "-n",
                             namespace, "-l", f"{r.LABEL_JOB}=lenet", "-o", "name").stdout.split()
        return not left
    plane.wait_for("every owned object collected", gone, timeout=90)
