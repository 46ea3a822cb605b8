"""What the lifecycle tests on the real control plane share: the node pool, the checkpoint claim,
the operator as a process, the job manifest, and ways to watch a job and its pods
(tests/operator/test_lifecycle_controlplane.py, and the chart's RBAC audit in tests/chart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from autopar.operator import resources as r
from tests.controlplane.cluster import free_port
from tests.controlplane.nodes import cpu_node, p4d
from tests.controlplane.podrunner import PodRunner

CLAIM = "checkpoints"


def make_pool(plane, namespace: str) -> tuple[list[str], list[str]]:
    """Three p4d nodes (8 × A100 each) and a CPU node only `namespace`'s jobs use (label
    autopar.dev/test-pool); (the GPU nodes' names, every node's name)."""
    mark = {"autopar.dev/test-pool": namespace}
    gpus = p4d(3, prefix=f"{namespace[:40]}-p4d", labels=mark)
    nodes = gpus + [cpu_node(f"{namespace[:40]}-cpu", labels=mark)]
    plane.apply(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    plane.wait_for("the pool's nodes Ready", lambda: all(
        any(c["type"] == "Ready" and c["status"] == "True"
            for c in plane.get("node", n).get("status", {}).get("conditions", [])) for n in names))
    return [n["metadata"]["name"] for n in gpus], names


def make_claim(plane, namespace: str) -> str:
    """A bound PersistentVolumeClaim `CLAIM` for the checkpoints (the pod runner keeps its files in
    one folder); the name of its PersistentVolume."""
    pv = f"{namespace[:50]}-ckpt"
    plane.apply([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                  "storageClassName": "autopar-test", "persistentVolumeReclaimPolicy": "Retain",
                  "hostPath": {"path": f"/var/lib/autopar-test/{pv}"},
                  "claimRef": {"namespace": namespace, "name": CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "autopar-test", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Gi"}}}}])
    plane.wait_for("the checkpoint claim Bound", lambda: plane.get(
        "pvc", CLAIM, "-n", namespace).get("status", {}).get("phase") == "Bound")
    return pv


class Operator:
    """`autopar operator run` watching one namespace, as the admin; can be killed and started again."""

    def __init__(self, plane, namespace: str, workdir: Path, *, kubeconfig: Path | None = None):
        self.plane, self.namespace, self.workdir = plane, namespace, workdir
        self.kubeconfig = kubeconfig or plane.kubeconfig
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"operator-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autopar.cli", "operator", "run", "--namespace", self.namespace,
             "--kubeconfig", str(self.kubeconfig), "--image", "autopar:test", "--device", "cpu",
             "--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("operator-*.log")))


def job_manifest(namespace: str, name: str = "lenet", *, steps: int = 40, every: int = 0, backoff: int = 2,
                 deadline: int | None = None, options: dict | None = None, model: str = "lenet",
                 ttl: int | None = None) -> dict:
    run_policy: dict = {"backoffLimit": backoff}
    if deadline is not None:
        run_policy["activeDeadlineSeconds"] = deadline
    if ttl is not None:
        run_policy["ttlSecondsAfterFinished"] = ttl
    if options is None:
        options = {"image": 28} if model == "lenet" else {}
    return {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "options": options},
                     "training": {"steps": steps, "batchSize": 32, "seed": 3},
                     "devices": {"nodes": 2, "gpusPerNode": 1,
                                 "nodeSelector": {"autopar.dev/test-pool": namespace}},
                     "planner": {"algorithm": "auto", "budgetSeconds": 1, "maxProposals": 10},
                     "checkpoint": {"path": f"pvc://{CLAIM}", "everySteps": every},
                     "runPolicy": run_policy}}


def wait(plane, namespace: str, what: str, check, timeout: float = 60, name: str = "lenet"):
    """`plane.wait_for`, with the job's status in the message when it times out."""
    try:
        return plane.wait_for(what, check, timeout=timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; status of {name}: {json.dumps(status(plane, namespace, name), indent=1)}") from None


def create(plane, namespace: str, manifest: dict) -> None:
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def status(plane, namespace: str, name: str = "lenet") -> dict:
    return plane.get("ptj", name, "-n", namespace).get("status") or {}


def wait_phase(plane, namespace: str, phase: str, timeout: float = 120, name: str = "lenet") -> dict:
    def reached():
        s = status(plane, namespace, name)
        if s.get("phase") == phase:
            return s
        if s.get("phase") == "Failed" and phase != "Failed":
            raise AssertionError(f"job failed instead of reaching {phase}: {s.get('message')}")
        return None
    return wait(plane, namespace, f"job {name} {phase}", reached, timeout=timeout, name=name)


def trainer_pods(plane, namespace: str) -> list[dict]:
    return plane.get("pods", "-n", namespace, "-l", f"{r.LABEL_COMPONENT}=trainer")["items"]


def running_gang(plane, namespace: str, restart: int | None = None, n: int = 2):
    pods = [p for p in trainer_pods(plane, namespace) if not p["metadata"].get("deletionTimestamp")]
    if restart is not None:
        pods = [p for p in pods if p["metadata"]["labels"][r.LABEL_RESTART] == str(restart)]
    return pods if len(pods) == n and all(p["status"].get("phase") == "Running" for p in pods) else None


def summaries(run: PodRunner, pod: str) -> list[dict]:
    """The JSON summaries `autopar train --json` printed in `pod`'s trainer logs (one per run of it)."""
    out = []
    for log in sorted(run.workdir.glob(f"{pod}-*/trainer.log"), key=lambda p: p.stat().st_mtime):
        block: list[str] | None = None
        for line in log.read_text(errors="replace").splitlines():
            if line == "{":
                block = [line]
            elif block is not None:
                block.append(line)
                if line == "}":
                    doc = json.loads("\n".join(block))
                    if "losses" in doc:
                        out.append(doc)
                    block = None
    return out


def reached_step(run: PodRunner, pod: str, step: int) -> bool:
    """Whether the newest run of `pod`'s trainer logged step `step` (training is under way)."""
    logs = sorted(run.workdir.glob(f"{pod}-*/trainer.log"), key=lambda p: p.stat().st_mtime)
    return bool(logs) and any(line.startswith(f"step {step}/") for line in logs[-1].read_text().splitlines())


def checkpoints(run: PodRunner, job: str = "lenet") -> list[Path]:
    return sorted((run.workdir / "claims" / CLAIM / job).glob("step-*.pt"))


def kill_trainer(run: PodRunner, pod: str) -> None:
    """SIGKILL the trainer processes of `pod` (a crash: no checkpoint, exit 137)."""
    target = next(p for p in run.pods.values() if p.name == pod)
    with target.lock:
        procs = [c.proc for c in target.containers if c.name == "trainer"]
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)


def owned(plane, namespace: str, job: str = "lenet") -> list[str]:
    return plane.kubectl("get", "pods,configmaps,services,jobs,serviceaccounts,roles,rolebindings", "-n",
                         namespace, "-l", f"{r.LABEL_JOB}={job}", "-o", "name").stdout.split()
