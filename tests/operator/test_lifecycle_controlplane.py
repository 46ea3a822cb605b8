"""Whole lifecycles on the real control plane: `autopar operator run` as a process, simulated GPU
nodes (KWOK), and every planner and trainer pod run here as a local process with that pod's
command, environment, mounted files and ServiceAccount token (`tests.controlplane.podrunner`), so
the real `autopar plan`, `publish-plan`, `torchrun … autopar train` and `report-progress` run
against the real API server.

The pool: three GPU nodes (AWS p4d, 8 × A100; a job uses one GPU on each of two: one
trainer process per pod, on the CPU) and one CPU node for the planner pods; checkpoints on a
PersistentVolumeClaim that every trainer pod of the job mounts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from autopar.operator import resources as r
from tests.controlplane.cluster import free_port
from tests.controlplane.nodes import cpu_node, p4d
from tests.controlplane.podrunner import PodRunner

pytestmark = pytest.mark.controlplane

CLAIM = "checkpoints"


@pytest.fixture
def pool(controlplane, namespace):
    """Three p4d nodes (8 × A100 each) and a CPU node only this test's jobs use (label autopar.dev/test-pool)."""
    mark = {"autopar.dev/test-pool": namespace}
    gpus = p4d(3, prefix=f"{namespace[:40]}-p4d", labels=mark)
    nodes = gpus + [cpu_node(f"{namespace[:40]}-cpu", labels=mark)]
    controlplane.apply(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    controlplane.wait_for("the pool's nodes Ready", lambda: all(
        any(c["type"] == "Ready" and c["status"] == "True"
            for c in controlplane.get("node", n).get("status", {}).get("conditions", [])) for n in names))
    yield [n["metadata"]["name"] for n in gpus]
    controlplane.kubectl("delete", "node", *names, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def claim(controlplane, namespace):
    """A bound PersistentVolumeClaim for the checkpoints (the runner keeps its files in one folder)."""
    pv = f"{namespace[:50]}-ckpt"
    controlplane.apply([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                  "storageClassName": "autopar-test", "persistentVolumeReclaimPolicy": "Retain",
                  "hostPath": {"path": f"/var/lib/autopar-test/{pv}"},
                  "claimRef": {"namespace": namespace, "name": CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "autopar-test", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Gi"}}}}])
    controlplane.wait_for("the checkpoint claim Bound", lambda: controlplane.get(
        "pvc", CLAIM, "-n", namespace).get("status", {}).get("phase") == "Bound")
    yield CLAIM
    controlplane.kubectl("delete", "pv", pv, "--wait=false", check=False)


@pytest.fixture
def runner(controlplane, namespace, tmp_path):
    with PodRunner(controlplane, namespace, tmp_path / "pods") as run:
        yield run
        if run.errors:
            sys.stderr.write("\n--- pod runner errors ---\n" + "\n".join(run.errors) + "\n")
        sys.stderr.write("\n--- pod logs (tails) ---\n" + run.logs(lines=15) + "\n")


class Operator:
    """`autopar operator run` watching one namespace, as the admin; can be killed and started again."""

    def __init__(self, plane, namespace: str, workdir: Path):
        self.plane, self.namespace, self.workdir = plane, namespace, workdir
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"operator-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autopar.cli", "operator", "run", "--namespace", self.namespace,
             "--kubeconfig", str(self.plane.kubeconfig), "--image", "autopar:test", "--device", "cpu",
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


@pytest.fixture
def operator(crd_installed, namespace, tmp_path):
    op = Operator(crd_installed, namespace, tmp_path)
    op.start()
    yield op
    op.kill(signal.SIGTERM)
    sys.stderr.write("\n--- operator log (tail) ---\n" + "\n".join(op.log().splitlines()[-40:]) + "\n")


def job_manifest(namespace: str, name: str = "lenet", *, steps: int = 40, every: int = 0, backoff: int = 2,
                 deadline: int | None = None, options: dict | None = None) -> dict:
    run_policy: dict = {"backoffLimit": backoff}
    if deadline is not None:
        run_policy["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "lenet", "options": options or {"image": 28}},
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


# -- the flows ------------------------------------------------------------------------------------

def test_create_plan_train_succeed_delete(controlplane, namespace, pool, claim, runner, operator):
    """create → topology → planner Job (its pod plans and publishes) → plan → trainer pods (torchrun,
    rank 0's progress sidecar) → Succeeded with measured step times; deleting the job lets the
    garbage collector remove everything it owns."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600))
    s = wait(plane, namespace, "the topology", lambda: (st := status(plane, namespace)).get("topology") and st,
             timeout=60)
    assert s["topology"]["gpus"] == 2 and sorted(s["topology"]["nodes"]) == sorted(pool)[:2] or \
        len(s["topology"]["nodes"]) == 2, s["topology"]
    topo = plane.get("configmap", "lenet-topology", "-n", namespace)
    assert r.ANN_TOPOLOGY_FINGERPRINT in topo["metadata"]["annotations"]

    s = wait_phase(plane, namespace, "Succeeded", timeout=240)
    assert s["simulatedStepSeconds"] > 0 and s["strategy"]
    assert s.get("actualStepSeconds", 0) > 0, s          # rank 0's sidecar reported measured steps
    types = {c["type"]: c for c in s["conditions"]}
    for t in ("Planning", "Planned", "Running", "Succeeded"):
        assert t in types, f"no {t} condition: {sorted(types)}"
    assert types["Succeeded"]["status"] == "True" and types["Succeeded"]["reason"] == "Completed"

    ranks = {p.name: p for p in runner.done}
    assert {f.phase for f in runner.done if f.name.startswith("lenet-trainer")} == {"Succeeded"}
    assert any(f.name.startswith("lenet-planner") and f.phase == "Succeeded" for f in runner.done), ranks
    (summary,) = summaries(runner, "lenet-trainer-0")
    assert summary["nproc"] == 2 and len(summary["losses"]) == 600
    assert checkpoints(runner), "no final checkpoint on the claim"

    table = plane.kubectl("get", "ptj", "-n", namespace).stdout
    assert "Succeeded" in table and s["simulatedStep"] in table
    text = operator.metrics()
    assert f'autopar_job_simulated_step_seconds{{job="lenet",namespace="{namespace}"}}' in text
    assert f'autopar_job_actual_step_seconds{{job="lenet",namespace="{namespace}"}}' in text
    events = plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                           "involvedObject.kind=ParallelTrainingJob", "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"TopologyDiscovered", "PlanReady", "TrainersStarted", "Completed"} <= reasons, reasons

    plane.kubectl("delete", "ptj", "lenet", "-n", namespace, "--wait=true", "--timeout=60s")
    wait(plane, namespace, "every owned object collected", lambda: not owned(plane, namespace), timeout=90)


def test_trainer_failure_restarts_the_gang_from_the_checkpoint(controlplane, namespace, pool, claim, runner,
                                                               operator):
    """A trainer process dies: its pod fails, the whole gang restarts (``--resume-if-present``) from
    the last checkpoint on the claim and the job succeeds; the losses after the restart are those an
    uninterrupted run has at the same steps."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600, every=100))
    wait(plane, namespace, "the gang Running", lambda: running_gang(plane, namespace, 0), timeout=240)
    wait(plane, namespace, "a checkpoint", lambda: checkpoints(runner), timeout=120)
    kill_trainer(runner, "lenet-trainer-1")
    wait(plane, namespace, "the restarted gang", lambda: running_gang(plane, namespace, 1), timeout=120)
    s = wait_phase(plane, namespace, "Succeeded", timeout=240)
    assert s["restarts"] == 1
    assert "Restarting" in {c["type"] for c in s["conditions"]}
    finished = {(f.name, f.restart): f.phase for f in runner.done if f.name.startswith("lenet-trainer")}
    assert finished[("lenet-trainer-1", "0")] == "Failed"
    assert finished[("lenet-trainer-0", "1")] == finished[("lenet-trainer-1", "1")] == "Succeeded"
    resumed = summaries(runner, "lenet-trainer-0")[-1]
    start = resumed["resumed_from_step"]
    assert start and len(resumed["losses"]) == 600 - start
    reference = _uninterrupted_losses(runner, steps=600)
    assert resumed["losses"] == pytest.approx(reference[start:], rel=1e-5, abs=1e-6)


def _uninterrupted_losses(run: PodRunner, steps: int) -> list[float]:
    """The losses of the same training without interruption: `autopar train` here, with the job's
    plan (any plan gives the same numbers) and the trainer pod's options."""
    pod_dir = next(run.workdir.glob("lenet-trainer-0-*"))
    argv = (pod_dir / "trainer.log").read_text().splitlines()[0][2:].split()
    args = argv[argv.index("train") + 1:]
    drop = {"--checkpoint-dir": 1, "--checkpoint-every": 1, "--metrics-port": 1, "--resume-if-present": 0,
            "--checkpoint-final": 0}
    kept, i = [], 0
    while i < len(args):
        if args[i] in drop:
            i += 1 + drop[args[i]]
            continue
        kept.append(args[i])
        i += 1
    done = subprocess.run([sys.executable, "-m", "autopar.cli", "train", *kept, "--nproc", "2"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["losses"]


def test_backoff_exhausted_fails_the_job(controlplane, namespace, pool, claim, runner, operator):
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600, every=100, backoff=0))
    wait(plane, namespace, "the gang Running", lambda: running_gang(plane, namespace, 0), timeout=240)
    kill_trainer(runner, "lenet-trainer-0")
    s = wait_phase(plane, namespace, "Failed", timeout=90)
    failed = {c["type"]: c for c in s["conditions"]}["Failed"]
    assert failed["reason"] == "BackoffLimitExceeded" and "lenet-trainer-0" in failed["message"]
    wait(plane, namespace, "the pods gone", lambda: not trainer_pods(plane, namespace), timeout=90)


def test_node_lost_replans_and_resumes(controlplane, namespace, pool, claim, runner, operator):
    """A node of the gang disappears mid-run: the topology changes, a second planner plans for the
    nodes left, and training resumes from the last checkpoint on another node, its losses those of
    an uninterrupted run."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600, every=100))
    gang = wait(plane, namespace, "the gang Running", lambda: running_gang(plane, namespace, 0), timeout=240)
    first_fp = status(plane, namespace)["topologyFingerprint"]
    used = sorted(p["spec"]["nodeName"] for p in gang)
    spare = next(n for n in pool if n not in used)
    wait(plane, namespace, "a checkpoint", lambda: checkpoints(runner), timeout=120)
    plane.kubectl("delete", "node", used[1], "--wait=false")

    s = wait(plane, namespace, "re-planned", lambda: (st := status(plane, namespace)).get("replans") == 1 and st,
                       timeout=60)
    assert s["topologyFingerprint"] != first_fp
    wait(plane, namespace, "the second planner", lambda: any(
        f.name.startswith("lenet-planner-1") and f.phase == "Succeeded" for f in runner.done), timeout=180)
    gang = wait(plane, namespace, "the gang Running again", lambda: running_gang(plane, namespace), timeout=240)
    assert sorted(p["spec"]["nodeName"] for p in gang) == sorted([used[0], spare])
    s = wait_phase(plane, namespace, "Succeeded", timeout=240)
    assert s["replans"] == 1 and s.get("restarts", 0) == 0
    assert "Replanning" in {c["type"] for c in s["conditions"]}
    resumed = summaries(runner, "lenet-trainer-0")[-1]
    start = resumed["resumed_from_step"]
    assert start and len(resumed["losses"]) == 600 - start
    reference = _uninterrupted_losses(runner, steps=600)
    assert resumed["losses"] == pytest.approx(reference[start:], rel=1e-5, abs=1e-6)


def test_suspend_and_resume(controlplane, namespace, pool, claim, runner, operator):
    """``runPolicy.suspend`` deletes the trainer pods (they stop after a step with a checkpoint);
    resuming recreates them and they continue from it (Kueue's contract)."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600, every=200))
    wait(plane, namespace, "the gang Running", lambda: running_gang(plane, namespace, 0), timeout=240)
    wait(plane, namespace, "training under way", lambda: reached_step(runner, "lenet-trainer-0", 50), timeout=120)
    plane.kubectl("patch", "ptj", "lenet", "-n", namespace, "--type=merge",
                  "-p", json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
    wait_phase(plane, namespace, "Suspended", timeout=60)
    wait(plane, namespace, "the pods gone", lambda: not trainer_pods(plane, namespace), timeout=90)
    stopped = [f for f in runner.done if f.name == "lenet-trainer-0"]
    assert stopped and stopped[-1].phase == "Killed"
    (first,) = summaries(runner, "lenet-trainer-0")
    assert first["stop_signal"] == "SIGTERM" and first["stopped_at_step"], first

    plane.kubectl("patch", "ptj", "lenet", "-n", namespace, "--type=merge",
                  "-p", json.dumps({"spec": {"runPolicy": {"suspend": False}}}))
    s = wait_phase(plane, namespace, "Succeeded", timeout=240)
    assert s.get("restarts", 0) == 0
    second = summaries(runner, "lenet-trainer-0")[-1]
    assert second["resumed_from_step"] == first["stopped_at_step"]
    assert len(second["losses"]) == 600 - first["stopped_at_step"]


def test_deadline_exceeded(controlplane, namespace, pool, claim, runner, operator):
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=100000, every=0, deadline=20))
    s = wait_phase(plane, namespace, "Failed", timeout=120)
    failed = {c["type"]: c for c in s["conditions"]}["Failed"]
    assert failed["reason"] == "DeadlineExceeded"
    wait(plane, namespace, "the pods gone", lambda: not trainer_pods(plane, namespace), timeout=90)


def test_bad_spec_fails_with_the_message(controlplane, namespace, pool, runner, operator):
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, options={"imagee": 28}))
    s = wait_phase(plane, namespace, "Failed", timeout=60)
    failed = {c["type"]: c for c in s["conditions"]}["Failed"]
    assert failed["reason"] == "FailedValidation" and "imagee" in failed["message"]
    events = json.loads(plane.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    assert any(e["reason"] == "FailedValidation" and "imagee" in e["message"] for e in events)
    time.sleep(3)                                     # no retry loop: nothing is created, nothing changes
    assert status(plane, namespace)["conditions"] == s["conditions"]
    assert not [n for n in owned(plane, namespace) if not n.startswith("configmap/kube-root")]


def test_operator_killed_and_restarted_mid_job(controlplane, namespace, pool, claim, runner, operator):
    """SIGKILL the operator while the trainers run; a new one picks the job up where it was:
    nothing is created twice, the same pods finish, the job succeeds."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600, every=0))
    gang = wait(plane, namespace, "the gang Running", lambda: running_gang(plane, namespace, 0), timeout=240)
    uids = sorted(p["metadata"]["uid"] for p in gang)
    operator.kill(signal.SIGKILL)
    time.sleep(2)
    operator.start()
    s = wait_phase(plane, namespace, "Succeeded", timeout=240)
    assert s.get("restarts", 0) == 0 and s.get("replans", 0) == 0
    trainers = [f for f in runner.done if f.name.startswith("lenet-trainer")]
    assert sorted(f.uid for f in trainers) == uids and {f.phase for f in trainers} == {"Succeeded"}
    planners = [f for f in runner.done if f.name.startswith("lenet-planner")]
    assert len(planners) == 1
