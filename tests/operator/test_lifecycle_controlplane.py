"""Whole lifecycles on the real control plane: `autopar operator run` as a process, simulated GPU
nodes (KWOK), and every planner and trainer pod run here as a local process with that pod's
command, environment, mounted files and ServiceAccount token (`tests.controlplane.podrunner`), so
the real `autopar plan`, `publish-plan`, `torchrun … autopar train` and `report-progress` run
against the real API server.

The pool (`tests.operator.lifecycle.make_pool`): three GPU nodes (AWS p4d, 8 × A100; a job uses
one GPU on each of two: one trainer process per pod, on the CPU) and one CPU node for the planner
pods; checkpoints on a PersistentVolumeClaim that every trainer pod of the job mounts.

The flows: create → topology → planner → plan → trainers → Succeeded, and deletion collects
everything; a trainer dies → the gang restarts from the checkpoint (losses equal an uninterrupted
run's); backoff exhausted → Failed; a node lost → re-plan → resumed (losses continue exactly);
suspend and resume; the active deadline; a bad spec → Failed with the message; the operator
SIGKILLed and restarted mid-job; a link label changed → planned again while training, the slower
plan kept; a planner that fails → PlannerFailed, then the TTL deletes the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autopar.operator import resources as r

from tests.controlplane.podrunner import PodRunner
from tests.operator.lifecycle import (CLAIM, Operator, checkpoints, create, job_manifest, kill_trainer, make_claim,
                                      make_pool, owned, reached_step, running_gang, status, summaries,
                                      trainer_pods, wait, wait_phase)

pytestmark = pytest.mark.controlplane


@pytest.fixture
def pool(controlplane, namespace):
    gpus, names = make_pool(controlplane, namespace)
    yield gpus
    controlplane.kubectl("delete", "node", *names, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def claim(controlplane, namespace):
    pv = make_claim(controlplane, namespace)
    yield CLAIM
    controlplane.kubectl("delete", "pv", pv, "--wait=false", check=False)


@pytest.fixture
def runner(controlplane, namespace, tmp_path):
    with PodRunner(controlplane, namespace, tmp_path / "pods") as run:
        yield run
        if run.errors:
            sys.stderr.write("\n--- pod runner errors ---\n" + "\n".join(run.errors) + "\n")
        sys.stderr.write("\n--- pod logs (tails) ---\n" + run.logs(lines=15) + "\n")


@pytest.fixture
def operator(crd_installed, namespace, tmp_path):
    op = Operator(crd_installed, namespace, tmp_path)
    op.start()
    yield op
    op.kill(signal.SIGTERM)
    sys.stderr.write("\n--- operator log (tail) ---\n" + "\n".join(op.log().splitlines()[-40:]) + "\n")


# -- the flows ------------------------------------------------------------------------------------

def test_create_plan_train_succeed_delete(controlplane, namespace, pool, claim, runner, operator):
    """create → topology → planner Job (its pod plans and publishes) → plan → trainer pods (torchrun,
    rank 0's progress sidecar) → Succeeded with measured step times; deleting the job lets the
    garbage collector remove everything it owns."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=600))
    s = wait(plane, namespace, "the topology", lambda: (st := status(plane, namespace)).get("topology") and st,
             timeout=60)
    assert len(s["topology"]["nodes"]) == 2 and set(s["topology"]["nodes"]) <= set(pool), s["topology"]
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
    assert {f.phase for f in runner.done if f.name.startswith("lenet-trainer")} == {"Succeeded"}, \
        runner.why_failed("lenet-trainer")
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


def test_changed_labels_replan_while_training(controlplane, namespace, pool, claim, runner, operator):
    """A link label changes on a node the trainers use: a new topology fingerprint, the same nodes.
    The trainers keep running while a second planner plans for it; the new plan is not faster by
    more than replanMargin, so the running plan is kept and the same pods finish the job."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, steps=3000, every=500))
    gang = wait(plane, namespace, "the gang Running", lambda: running_gang(plane, namespace, 0), timeout=240)
    wait(plane, namespace, "training under way", lambda: reached_step(runner, "lenet-trainer-0", 20), timeout=120)
    uids = sorted(p["metadata"]["uid"] for p in gang)
    before = status(plane, namespace)
    plane.kubectl("label", "node", gang[0]["spec"]["nodeName"], "autopar.dev/network-bandwidth=100Gbps")
    s = wait(plane, namespace, "re-planning while training", lambda: (st := status(plane, namespace)).get(
        "replanPending") and st, timeout=60)
    assert s["topologyFingerprint"] != before["topologyFingerprint"] and s["phase"] == "Training"
    assert sorted(p["metadata"]["uid"] for p in running_gang(plane, namespace, 0) or gang) == uids
    wait(plane, namespace, "the second planner", lambda: any(
        f.name.startswith("lenet-planner-1") and f.phase == "Succeeded" for f in runner.done), timeout=180)
    s = wait_phase(plane, namespace, "Succeeded", timeout=240)
    kept = {c["type"]: c for c in s["conditions"]}["Planned"]
    assert kept["reason"] == "PlanKept" and s["keptPlanHash"] and s["replans"] == 1, kept
    trainers = [f for f in runner.done if f.name.startswith("lenet-trainer")]
    assert sorted(f.uid for f in trainers) == uids and {f.phase for f in trainers} == {"Succeeded"}


def test_planner_failure_fails_the_job_and_the_ttl_deletes_it(controlplane, namespace, pool, runner, operator):
    """A user's model the planner pod cannot import (the operator cannot check it: it lives in the
    job's image): the planner Job fails, the job fails with PlannerFailed naming the planner Job;
    ``ttlSecondsAfterFinished`` then deletes the job, and the garbage collector what it owned."""
    plane = controlplane
    create(plane, namespace, job_manifest(namespace, model="nowhere.models:factory", ttl=5))
    s = wait_phase(plane, namespace, "Failed", timeout=180)
    failed = {c["type"]: c for c in s["conditions"]}["Failed"]
    assert failed["reason"] == "PlannerFailed" and "lenet-planner" in failed["message"], failed
    planners = [f for f in runner.done if f.name.startswith("lenet-planner")]
    assert planners and planners[0].phase == "Failed" and planners[0].exit_codes["plan"] != 0
    assert "nowhere" in runner.logs(planners[0].name)
    wait(plane, namespace, "the job deleted after its TTL", lambda: plane.kubectl(
        "get", "ptj", "lenet", "-n", namespace, check=False).returncode != 0, timeout=60)
    wait(plane, namespace, "every owned object collected", lambda: not owned(plane, namespace), timeout=90)
