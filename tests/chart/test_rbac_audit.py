"""The chart's RBAC, proven on the real control plane rather than assumed: `autopar operator run`
runs as the chart's ServiceAccount (a TokenRequest token; `helm install` created the account and
its bindings) and drives the job lifecycles of tests/operator/test_lifecycle_controlplane.py,
while the API server's audit log records every request of that account.  Then:

- no request was refused (no 403 in the audit log, nor in the operator's log);
- every (verb, API group, resource, namespace) the operator requested is granted by the rules the
  chart installed (`helm get manifest`: exactly what was rendered for these values) — a missing
  rule fails, naming it;
- every rule the chart grants was requested at least once — a surplus rule fails, naming it —
  except the short allowlist `NOT_REQUESTED` of permissions the API server checks on requests of
  another verb (RBAC's escalation check when the operator creates the per-job Roles, and the
  OwnerReferencesPermissionEnforcement admission plugin, enabled on this control plane, when it
  creates children with ``blockOwnerDeletion``).  The test proves both checks are live: a Role
  beyond the operator's own rules and a child whose creator lacks ``update`` on
  ``paralleltrainingjobs/finalizers`` are refused.

The cases (one control plane for the module, with the audit log on; one `helm install` each,
uninstalled after):

- ``clusterwide``: default values (the ClusterRoles), the operator without ``--namespace``; the
  whole flow: create → topology → planner Job → plan → trainer gang → a node of the gang removed
  → re-plan (old topology ConfigMap and trainer pods deleted) → training resumes from the
  checkpoint → Succeeded → ``ttlSecondsAfterFinished`` deletes the job → the garbage collector
  removes what it owned; beside it a job with a bad spec → Failed with an Event → TTL.
- ``namespaced-peering``: ``watchNamespaces`` (a Role in each) and two replicas (kopf peering, a
  KopfPeering per namespace), the operator with ``--namespace`` for each and ``--peering``; the
  short flow (gang running → node removed → re-plan → the job deleted → GC) in one namespace,
  a bad spec (Failed, Event, TTL) in each.
- ``clusterwide-peering``: two replicas cluster-wide (the ClusterKopfPeering), the short flow.

Flows that make no request of their own are left out: a trainer failure (gang restart), suspend
and the deadline delete trainer pods and patch the status as the re-plan does; an operator
restart lists and watches as a start does.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.chart.render import CHART, RELEASE, audited_requests, covered, granted, run, values_file
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.podrunner import PodRunner, kwok_stages_without_autopar_pods
from tests.operator.lifecycle import (Operator, checkpoints, create, job_manifest, make_claim, make_pool, owned,
                                      running_gang, status, trainer_pods, wait, wait_phase)

pytestmark = pytest.mark.controlplane

SA = RELEASE          # the chart's ServiceAccount: the release's full name


@dataclass(frozen=True)
class Case:
    release_ns: str
    values: dict = field(default_factory=dict)
    namespaces: tuple[str, ...] = ()      # job namespaces; the first runs the trainer flow
    full: bool = False                    # the whole flow (to Succeeded) or the short one

    @property
    def watch(self) -> list[str]:
        return list(self.values.get("watchNamespaces") or [])

    @property
    def peering(self) -> str | None:
        return RELEASE if self.values.get("replicaCount", 1) > 1 else None

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.release_ns}:{SA}"


CASES = {
    "clusterwide": Case("autopar-audit-cw", {}, ("audit-cw",), full=True),
    "namespaced-peering": Case("autopar-audit-ns", {"replicaCount": 2, "watchNamespaces": ["audit-ns-a", "audit-ns-b"]},
                               ("audit-ns-a", "audit-ns-b")),
    "clusterwide-peering": Case("autopar-audit-cwp", {"replicaCount": 2}, ("audit-cwp",)),
}

#: Granted to the operator, never requested by it, and still needed: the API server checks them
#: on requests of another verb.  (apiGroup, resource, verb) -> why.
NOT_REQUESTED = {
    # RBAC's escalation check: the operator may create the per-job Roles (operator/resources.py
    # planner_role, progress_role) only holding their rules (the chart's delegate role).  Of those
    # it uses itself events create (and paralleltrainingjobs/status patch, through kopf); these
    # three only its planner and trainer pods use (operator/podside.py publish_plan,
    # report_progress).
    ("", "configmaps", "get"): "escalation check of planner_role (publish_plan reads the plan ConfigMap)",
    ("", "configmaps", "patch"): "escalation check of planner_role (publish_plan writes the plan ConfigMap)",
    ("autopar.dev", "paralleltrainingjobs/status", "get"): "escalation check of progress_role (report_progress)",
    # OwnerReferencesPermissionEnforcement (enabled on this control plane): every child the
    # operator creates names its job with blockOwnerDeletion: true, which the plugin allows only
    # with update on the owner's finalizers subresource.
    ("autopar.dev", "paralleltrainingjobs/finalizers", "update"):
        "OwnerReferencesPermissionEnforcement on blockOwnerDeletion (operator/resources.py owner_reference)",
}

#: Refusals that are answers, not failures: a create of what exists (the reconcile is idempotent),
#: a delete or patch of what is already gone.  Any other status of 400 or more fails the test (e.g.
#: a RoleBinding create whose RBAC escalation check cannot find its Role: 404).
BENIGN = {("create", 409), ("delete", 404), ("patch", 404), ("patch", 409), ("get", 404)}

#: A refusal in the operator's log (KubeError's "(403 Forbidden)", kopf's APIForbiddenError), not a
#: timestamp's milliseconds
FORBIDDEN = re.compile(r"Forbidden|(?<![,.\d])403(?!\d)")

#: What the chart's Deployment would run on the operator's pod does not run here (the operator is
#: a local process): keep its pods off every node.
CHART_VALUES = {"nodeSelector": {"autopar.dev/audit-test": "no-such-node"}}


def audit_policy(users: list[str]) -> dict:
    """Metadata of every request of `users` (once the response is known), nothing else."""
    return {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "users": users}, {"level": "None"}]}


@pytest.fixture(scope="module")
def audited(controlplane_binaries, tmp_path_factory):
    """A control plane of this module's own, as the session's (KWOK plays every pod but autopar's),
    with the audit log of the chart's ServiceAccounts on and the OwnerReferencesPermissionEnforcement
    admission plugin enabled."""
    bins = {k: v for k, v in controlplane_binaries.items() if k != "kwok-stages"}
    workdir = tmp_path_factory.mktemp("audited-controlplane")
    stages = kwok_stages_without_autopar_pods(controlplane_binaries["kwok-stages"], workdir / "kwok-stages.yaml")
    plane = ControlPlane(workdir, bins, kwok_stages=stages,
                         audit_policy=audit_policy(sorted(c.user for c in CASES.values())),
                         extra_args={"kube-apiserver": [
                             "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"]})
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


class ChartOperator(Operator):
    """`autopar operator run` as the chart's Deployment runs it: ``--namespace`` for each watched
    namespace (none: every namespace) and ``--peering`` with more than one replica."""

    def __init__(self, plane, workdir: Path, kubeconfig: Path, namespaces: list[str], peering: str | None):
        super().__init__(plane, ",".join(namespaces), workdir, kubeconfig=kubeconfig)
        self.namespaces, self.peering = namespaces, peering

    def start(self) -> None:
        self.starts += 1
        args = [f"--namespace={ns}" for ns in self.namespaces]
        if self.peering:
            args.append(f"--peering={self.peering}")
        with open(self.workdir / f"operator-{self.starts}.log", "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autopar.cli", "operator", "run", *args, "--kubeconfig", str(self.kubeconfig),
                 "--image", "autopar:test", "--device", "cpu", "--metrics-port", str(self.metrics_port),
                 "--metrics-address", "127.0.0.1"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _helm(helm, plane, *args, check=True):
    return run([helm, "--kubeconfig", plane.kubeconfig, *args], check=check, timeout=300)


def _with_ttl(manifest: dict, seconds: int) -> dict:
    manifest["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = seconds
    return manifest


def _gone(plane, ns: str, name: str) -> bool:
    return plane.kubectl("get", "ptj", name, "-n", ns, check=False).returncode != 0


# -- the flows ------------------------------------------------------------------------------------

def _create_bad(plane, ns: str) -> None:
    create(plane, ns, _with_ttl(job_manifest(ns, name="bad", options={"imagee": 28}), 1))


def _check_bad(plane, ns: str) -> None:
    """The bad spec failed the job with an Event, and its TTL deleted it."""
    wait(plane, ns, "the bad job deleted after its TTL", lambda: _gone(plane, ns, "bad"), timeout=60, name="bad")
    events = plane.get("events", "-n", ns, "--field-selector", "involvedObject.name=bad")["items"]
    assert any(e["reason"] == "FailedValidation" and "imagee" in e["message"] for e in events), events


def _create_good(plane, ns: str, *, full: bool) -> None:
    create(plane, ns, _with_ttl(job_manifest(ns, steps=600, every=100 if full else 0), 2))


def _trainer_flow(plane, ns: str, runner: PodRunner, *, full: bool) -> None:
    gang = wait(plane, ns, "the gang Running", lambda: running_gang(plane, ns, 0), timeout=240)
    if full:
        wait(plane, ns, "a checkpoint", lambda: checkpoints(runner), timeout=120)
    used = sorted(p["spec"]["nodeName"] for p in gang)
    plane.kubectl("delete", "node", used[1], "--wait=false")
    wait(plane, ns, "re-planned", lambda: status(plane, ns).get("replans") == 1, timeout=60)
    if full:
        wait(plane, ns, "the gang Running again", lambda: running_gang(plane, ns), timeout=240)
        s = wait_phase(plane, ns, "Succeeded", timeout=300)
        assert s["replans"] == 1
        wait(plane, ns, "the job deleted after its TTL", lambda: _gone(plane, ns, "lenet"), timeout=60)
    else:
        old = {p["metadata"]["uid"] for p in gang}
        wait(plane, ns, "the old gang deleted", lambda: not any(
            p["metadata"]["uid"] in old and not p["metadata"].get("deletionTimestamp")
            for p in trainer_pods(plane, ns)), timeout=60)
        plane.kubectl("delete", "ptj", "lenet", "-n", ns, "--wait=true", "--timeout=60s")
    wait(plane, ns, "every owned object collected", lambda: not owned(plane, ns), timeout=90)


def _probe_admission(plane, ns: str) -> None:
    """The two checks `NOT_REQUESTED` relies on are live here.  The operator's children carry
    blockOwnerDeletion (so OwnerReferencesPermissionEnforcement checked its finalizers permission
    when it created them), and an identity with create on ConfigMaps but not update on
    paralleltrainingjobs/finalizers may not create one like them (a dry run as a user of its own:
    the audit log stays the operator's)."""
    topology = wait(plane, ns, "the topology ConfigMap", lambda: plane.kubectl(
        "get", "configmap", "lenet-topology", "-n", ns, "-o", "json", check=False).stdout, timeout=120)
    topology = json.loads(topology)
    (ref,) = topology["metadata"]["ownerReferences"]
    assert ref["kind"] == "ParallelTrainingJob" and ref["blockOwnerDeletion"] is True, ref
    probe = "autopar-audit-probe"
    plane.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": probe, "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": probe, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": probe},
         "subjects": [{"kind": "User", "name": probe}]}])
    child = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "probe", "namespace": ns, "ownerReferences": [ref]}}

    def dry_run(*extra):
        return plane.kubectl("create", "--dry-run=server", "-f", "-", *extra, input=yaml.safe_dump(child),
                             check=False)
    out = plane.wait_for("RBAC knows the probe's Role", lambda: (o := dry_run("--as", probe)).returncode != 0
                         and "blockOwnerDeletion" in o.stderr and o, timeout=10)
    assert "finalizers" in out.stderr, out.stderr
    child["metadata"]["ownerReferences"] = [{**ref, "blockOwnerDeletion": False}]
    assert dry_run("--as", probe).returncode == 0          # the same without blockOwnerDeletion: allowed
    plane.kubectl("delete", "rolebinding,role", probe, "-n", ns)


def _probe_escalation(plane, ns: str, sa_kubeconfig: Path) -> None:
    """RBAC's escalation check is live: the operator's account may not create a Role with a rule
    beyond its own (a dry run, after the audit log was read: its 403 is the test's)."""
    greedy = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
              "metadata": {"name": "greedy", "namespace": ns},
              "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["update"]}]}
    out = plane.kubectl("create", "--dry-run=server", "-f", "-", kubeconfig=sa_kubeconfig,
                        input=yaml.safe_dump(greedy), check=False)
    assert out.returncode != 0 and "permissions not currently held" in out.stderr, out.stderr


# -- used versus granted ----------------------------------------------------------------------------

def _refused(requests: list[dict]) -> str:
    """The requests answered with a status of 400 or more, but for the `BENIGN` ones, a line each."""
    return "\n".join(f"  {q['verb']} {q['uri']}: {q['code']}" for q in requests
                     if (q["code"] or 0) >= 400 and (q["verb"], q["code"]) not in BENIGN)


def _table(used: Counter, grants) -> str:
    rows = []
    for (verb, group, resource, ns), n in sorted(used.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0],
                                                                               kv[0][3] or "")):
        how = ("ClusterRole" if (group, resource, verb) in grants.get(None, set())
               else "Role" if covered(grants, verb, group, resource, ns) else "NOT GRANTED")
        rows.append(f"  {verb:7} {group or 'core':27} {resource:35} {ns or '(cluster)':16} {n:5}  {how}")
    return "\n".join(rows)


def _compare(case: Case, requests: list[dict], grants) -> tuple[list[str], list[str]]:
    """(requests not granted, grants not requested and not in NOT_REQUESTED)."""
    used = {(q["verb"], q["group"], q["resource"], q["namespace"]) for q in requests if q["resource"]}
    missing = sorted(f"{v} {g or 'core'}/{res} in {ns or 'every namespace (or cluster-scoped)'}"
                     for v, g, res, ns in used if not covered(grants, v, g, res, ns))
    # a namespace's Role is proven by requests in any watched namespace with the very same rules
    # (the chart renders one template for each): the trainer flow runs in the first only
    same = {b: {b2 for b2 in grants if b2 is not None and grants[b2] == grants[b]} for b in grants if b is not None}
    surplus = []
    for bucket, perms in grants.items():
        for g, res, v in sorted(perms):
            if (g, res, v) in NOT_REQUESTED:
                continue
            if not any(u[:3] == (v, g, res) and (bucket is None or u[3] in same[bucket]) for u in used):
                surplus.append(f"{v} {g or 'core'}/{res} ({'ClusterRole' if bucket is None else 'Role in ' + bucket})")
    return missing, surplus


@pytest.mark.parametrize("name", list(CASES))
def test_operator_uses_exactly_the_charts_rules(name, audited, helm, tmp_path):
    case, plane = CASES[name], audited
    first = case.namespaces[0]
    for ns in case.namespaces:
        plane.kubectl("create", "namespace", ns)
    values = values_file({**CHART_VALUES, **case.values}, tmp_path)
    pool_nodes: list[str] = []
    pv = None
    operator = None
    try:
        _helm(helm, plane, "install", RELEASE, CHART, "--namespace", case.release_ns, "--create-namespace",
              "-f", values)
        docs = [d for d in yaml.safe_load_all(_helm(helm, plane, "get", "manifest", RELEASE,
                                                    "--namespace", case.release_ns).stdout) if d]
        grants = granted(docs, SA, case.release_ns)
        assert grants, "the chart bound nothing to its ServiceAccount"
        if case.peering:
            kind = "kopfpeering.kopf.dev" if case.watch else "clusterkopfpeering.kopf.dev"
            for ns in case.watch or [None]:
                plane.kubectl("get", kind, case.peering, *(["-n", ns] if ns else []))
        for ns in case.namespaces:
            plane.wait_for(f"service account default in {ns}", lambda ns=ns: plane.kubectl(
                "get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0)
        _, pool_nodes = make_pool(plane, first)
        pv = make_claim(plane, first)
        sa_kubeconfig = plane.as_service_account(SA, case.release_ns)

        operator = ChartOperator(plane, tmp_path, sa_kubeconfig, case.watch, case.peering)
        operator.start()
        with PodRunner(plane, first, tmp_path / "pods") as runner:
            try:
                for ns in case.namespaces:
                    _create_bad(plane, ns)
                _create_good(plane, first, full=case.full)
                if case.full:
                    _probe_admission(plane, first)
                _trainer_flow(plane, first, runner, full=case.full)
                for ns in case.namespaces:
                    _check_bad(plane, ns)
            except Exception as e:          # a flow stalled or its job vanished: was the operator refused?
                refused = _refused(audited_requests(plane.audit_events(), case.user))
                if refused:
                    raise AssertionError(f"{e}\n\nthe API server refused the operator:\n{refused}") from None
                raise
        assert not runner.errors, runner.errors
        operator.kill(signal.SIGTERM)             # kopf leaves the peering (a patch) on its way out

        log = operator.log()
        refused = [line for line in log.splitlines() if FORBIDDEN.search(line)]
        assert not refused, "the operator was refused:\n" + "\n".join(refused[:20])
        requests = audited_requests(plane.audit_events(), case.user)
        assert requests, f"the audit log holds no request of {case.user}"
        forbidden = [q for q in requests if q["code"] == 403]
        assert not forbidden, "403 in the audit log:\n" + "\n".join(
            f"{q['verb']} {q['uri']}" for q in forbidden[:20])
        refused = _refused(requests)
        assert not refused, "the API server refused the operator:\n" + refused
        used = Counter((q["verb"], q["group"], q["resource"], q["namespace"]) for q in requests if q["resource"])
        other = sorted({q["uri"].split("?")[0] for q in requests if not q["resource"]})
        sys.stderr.write(f"\n--- {name}: requests of {case.user} (verb, group, resource, namespace, count, "
                         f"granted by) ---\n{_table(used, grants)}\n  non-resource URLs (discovery, "
                         f"system:discovery): {', '.join(other)}\n")
        for perm in NOT_REQUESTED:
            assert any(perm in p for p in grants.values()), f"NOT_REQUESTED lists {perm}, which is not granted"
        missing, surplus = _compare(case, requests, grants)
        assert not missing, "the operator requested what the chart does not grant:\n  " + "\n  ".join(missing)
        assert not surplus, "the chart grants what the operator never requested:\n  " + "\n  ".join(surplus)
        if case.full:
            _probe_escalation(plane, first, sa_kubeconfig)
    finally:
        if operator is not None:
            operator.kill(signal.SIGTERM)
            sys.stderr.write(f"\n--- operator log ({name}, tail) ---\n" + "\n".join(operator.log().splitlines()[-30:])
                             + "\n")
        _helm(helm, plane, "uninstall", RELEASE, "--namespace", case.release_ns, check=False)
        for ns in (*case.namespaces, case.release_ns):
            plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if pool_nodes:
            plane.kubectl("delete", "node", *pool_nodes, "--wait=false", "--ignore-not-found", check=False)
        if pv:
            plane.kubectl("delete", "pv", pv, "--wait=false", check=False)
