"""The ParallelTrainingJob CRD on a real API server: it installs, the examples are accepted, bad
manifests are refused by the server with the message `autopar run --local` gives, the spec is
fixed after creation except `suspend`, the status subresource and printer columns work, and RBAC
applies."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from autopar.job import JobSpecError, parse_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _job(name: str, **spec) -> dict:
    return {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob", "metadata": {"name": name},
            "spec": {"model": {"name": "lenet"}, **spec}}


def _server_error(plane, ns: str, doc: dict) -> str:
    out = plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert out.returncode != 0, f"the API server accepted {doc['spec']}"
    return out.stderr


def _local_error(doc: dict) -> str:
    with pytest.raises(JobSpecError) as e:
        parse_job(doc)
    return str(e.value)


def test_the_crd_is_established(crd_installed):
    crd = crd_installed.get("crd", "paralleltrainingjobs.autopar.dev")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert crd["status"]["acceptedNames"]["shortNames"] == ["ptj"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted(crd_installed, namespace, path):
    crd_installed.kubectl("apply", "-n", namespace, "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = crd_installed.get("ptj", name, "-n", namespace)
    # the server filled in the same defaults as the local driver
    local = parse_job(yaml.safe_load(path.read_text())).to_manifest()["spec"]
    assert stored["spec"] == local


#: (case id, spec edit, text both messages contain) — each is refused by the API server and by
#: `autopar run --local`, and the two name the same field.
BAD = [
    ("steps-zero", {"training": {"steps": 0}}, "spec.training.steps"),
    ("steps-string", {"training": {"steps": "many"}}, "spec.training.steps"),
    ("lr-zero", {"training": {"learningRate": 0}}, "spec.training.learningRate"),
    ("optimizer-enum", {"training": {"optimizer": "rmsprop"}}, "spec.training.optimizer"),
    ("dtype-enum", {"training": {"dtype": "float8"}}, "spec.training.dtype"),
    ("algorithm-enum", {"planner": {"algorithm": "mcmcc"}}, "spec.planner.algorithm"),
    ("budget-negative", {"planner": {"budgetSeconds": -1}}, "spec.planner.budgetSeconds"),
    ("gpus-too-many", {"devices": {"gpusPerNode": 100}}, "spec.devices.gpusPerNode"),
    ("nodes-zero", {"devices": {"nodes": 0}}, "spec.devices.nodes"),
    ("toleration-operator", {"devices": {"tolerations": [{"operator": "Maybe"}]}}, "operator"),
    ("pinned-without-plan", {"planner": {"algorithm": "pinned"}}, "algorithm 'pinned' needs planner.planRef"),
    ("plan-ref-both", {"planner": {"algorithm": "pinned", "planRef": {"path": "p.yaml", "configMap": "plans"}}},
     "planRef needs exactly one of configMap and path"),
    ("file-data-without-path", {"data": {"source": "file"}}, "data.source 'file' needs data.path"),
    ("model-name-pattern", {"model": {"name": "my model"}}, "spec.model.name"),
    ("unknown-field", {"trainig": {"steps": 3}}, "spec.trainig"),
    ("missing-model", {"model": None}, "spec.model"),
]


@pytest.mark.parametrize("case,edit,shared", BAD, ids=[b[0] for b in BAD])
def test_bad_manifests_are_refused_by_the_server_as_locally(crd_installed, namespace, case, edit, shared):
    doc = _job(f"bad-{case}", **{k: v for k, v in edit.items() if v is not None})
    if edit.get("model", 1) is None:
        del doc["spec"]["model"]
    server = _server_error(crd_installed, namespace, doc)
    local = _local_error(doc)
    assert shared in server, f"server: {server}"
    assert shared in local, f"local: {local}"


def test_the_spec_cannot_change_after_creation_except_suspend(crd_installed, namespace):
    plane = crd_installed
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(
        _job("fixed", runPolicy={"activeDeadlineSeconds": 600})))
    edits = {
        "training": ({"spec": {"training": {"steps": 7}}}, "spec.training cannot change after the job is created"),
        "model": ({"spec": {"model": {"name": "alexnet"}}}, "spec.model cannot change"),
        "deadline": ({"spec": {"runPolicy": {"activeDeadlineSeconds": 60}}},
                     "spec.runPolicy.activeDeadlineSeconds cannot change"),
        "remove deadline": ({"spec": {"runPolicy": {"activeDeadlineSeconds": None}}},
                            "spec.runPolicy fields cannot be added or removed"),
    }
    for what, (patch, message) in edits.items():
        out = plane.kubectl("patch", "ptj", "fixed", "-n", namespace, "--type=merge", "-p", json.dumps(patch),
                            check=False)
        assert out.returncode != 0 and message in out.stderr, f"{what}: {out.stderr or out.stdout}"
    plane.kubectl("patch", "ptj", "fixed", "-n", namespace, "--type=merge", "-p",
                  json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
    stored = plane.get("ptj", "fixed", "-n", namespace)
    assert stored["spec"]["runPolicy"]["suspend"] is True and stored["spec"]["training"]["steps"] == 100


STATUS = {"phase": "Training", "devices": "8x H100", "strategy": "plan", "simulatedStep": "64.3ms",
          "actualStep": "78.8ms", "predictedSpeedup": "1.35x", "simulatedStepSeconds": 0.0643,
          "actualStepSeconds": 0.0788, "predictionError": -0.184}


def test_status_subresource_and_printer_columns(crd_installed, namespace):
    plane = crd_installed
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_job("shown")))
    # status through /status; a spec sent along with it is ignored
    plane.kubectl("patch", "ptj", "shown", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                  json.dumps({"status": STATUS, "spec": {"training": {"steps": 5}}}))
    stored = plane.get("ptj", "shown", "-n", namespace)
    assert stored["status"]["phase"] == "Training" and stored["spec"]["training"]["steps"] == 100
    # status through the main resource is ignored
    plane.kubectl("patch", "ptj", "shown", "-n", namespace, "--type=merge", "-p",
                  json.dumps({"status": {"phase": "Failed"}}))
    assert plane.get("ptj", "shown", "-n", namespace)["status"]["phase"] == "Training"

    table = plane.kubectl("get", "ptj", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "DEVICES", "SIMULATED", "ACTUAL", "SPEEDUP", "AGE"]
    assert table[1].split()[:6] == ["shown", "Training", "8x", "H100", "64.3ms", "78.8ms"] or \
        table[1].split()[:7] == ["shown", "Training", "8x", "H100", "64.3ms", "78.8ms", "1.35x"]
    wide = plane.kubectl("get", "ptj", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["AGE", "STRATEGY", "ERROR"] or "STRATEGY" in wide[0].split()
    assert "-0.184" in wide[1]


def test_a_service_account_without_a_role_may_not_list_jobs(crd_installed, namespace):
    nobody = crd_installed.as_service_account("nobody", namespace)
    out = crd_installed.kubectl("get", "ptj", "-n", namespace, kubeconfig=nobody, check=False)
    assert out.returncode != 0 and "forbidden" in out.stderr.lower()
    assert 'cannot list resource "paralleltrainingjobs"' in out.stderr
    # granted a role, the same account may
    crd_installed.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "ptj-reader", "namespace": namespace},
         "rules": [{"apiGroups": ["autopar.dev"], "resources": ["paralleltrainingjobs"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "ptj-reader", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ptj-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}]}])
    crd_installed.wait_for("the role to apply", lambda: crd_installed.kubectl(
        "get", "ptj", "-n", namespace, kubeconfig=nobody, check=False).returncode == 0, timeout=20)


def test_the_server_sets_what_kmock_does_not(crd_installed, namespace):
    plane = crd_installed
    doc = copy.deepcopy(_job("x"))
    del doc["metadata"]["name"]
    doc["metadata"]["generateName"] = "gen-"
    created = json.loads(plane.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                                       input=yaml.safe_dump(doc)).stdout)
    meta = created["metadata"]
    assert meta["name"].startswith("gen-") and meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert meta["generation"] == 1
    plane.kubectl("label", "ptj", meta["name"], "-n", namespace, "team=vision")
    selected = plane.get("ptj", "-n", namespace, "-l", "team=vision")["items"]
    assert [i["metadata"]["name"] for i in selected] == [meta["name"]]
    assert plane.get("ptj", "-n", namespace, "-l", "team=other")["items"] == []
