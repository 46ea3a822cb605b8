"""Render the chart with the real `helm` and pick its objects apart; the tools the chart tests use.

    from tests.chart.render import render, rbac_rules
    docs = render(helm, {"watchNamespaces": ["ml"]})          # every object of `helm template`
    rules = rbac_rules(docs)    # {("Role", "ml", "autopar"): [rule, ...], ("ClusterRole", None, ...): ...}

`rbac_rules` is what a check of the verbs the operator uses against those the chart grants
(e.g. from the API server's audit log) compares with.  The tools (helm, promtool,
dashboard-check) are built by tests/controlplane/build.py and cached like the control plane.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "autopar"
RELEASE = "autopar"
NAMESPACE = "autopar-system"
RBAC_KINDS = ("ClusterRole", "Role")
BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")


def tool(name: str) -> Path:
    """The tool's path, built when missing; skip without Go (fail under CI=true)."""
    from tests.controlplane.build import GoNotFoundError, ensure_binaries
    try:
        return ensure_binaries(names=[name])[name]
    except GoNotFoundError as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the chart tests: {e}")
        pytest.skip(f"the chart tests need Go to build {name}: {e}")


def run(cmd: list[str | Path], *, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def values_file(values: dict[str, Any] | None, directory: Path | None = None) -> Path:
    fd, name = tempfile.mkstemp(prefix="values-", suffix=".yaml", dir=directory)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(values or {}, fh)
    return Path(name)


def render_text(helm: Path, values: dict[str, Any] | None = None, *, release: str = RELEASE,
                namespace: str = NAMESPACE, extra: tuple[str, ...] = ()) -> str:
    """`helm template` of the chart with `values` (a dict, as a values file would hold it)."""
    path = values_file(values)
    try:
        return run([helm, "template", release, CHART, "--namespace", namespace, "-f", path, *extra]).stdout
    finally:
        path.unlink(missing_ok=True)


def render(helm: Path, values: dict[str, Any] | None = None, **kw) -> list[dict[str, Any]]:
    """The objects `helm template` renders (CRDs of crds/ excluded)."""
    return [d for d in yaml.safe_load_all(render_text(helm, values, **kw)) if d]


def find(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)
            and (namespace is None or d["metadata"].get("namespace") == namespace)]


def one(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> dict:
    got = find(docs, kind, name, namespace)
    assert len(got) == 1, f"expected one {kind} {name or ''}, found {len(got)}"
    return got[0]


def rbac_rules(docs: list[dict]) -> dict[tuple[str, str | None, str], list[dict]]:
    """{(kind, namespace or None, name): rules} of every ClusterRole and Role in a render."""
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d.get("rules") or []
            for d in docs if d["kind"] in RBAC_KINDS}


def granted(docs: list[dict], account: str, account_namespace: str = NAMESPACE
            ) -> dict[str | None, set[tuple[str, str, str]]]:
    """What ServiceAccount `account_namespace/account` may do through the render's bindings:
    {namespace (None: every namespace): {(apiGroup, resource, verb)}}.  resourceNames are ignored."""
    roles = rbac_rules(docs)
    out: dict[str | None, set[tuple[str, str, str]]] = {}
    for b in docs:
        if b["kind"] not in BINDING_KINDS:
            continue
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == account
                   and s.get("namespace") == account_namespace for s in b.get("subjects") or []):
            continue
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        rules = roles.get((ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"]))
        assert rules is not None, f"{b['kind']} {b['metadata']['name']} refers to a missing {ref['kind']} {ref['name']}"
        bucket = out.setdefault(ns, set())
        for r in rules:
            for g in r.get("apiGroups") or [""]:
                for res in r["resources"]:
                    for v in r["verbs"]:
                        bucket.add((g, res, v))
    return out


def operator_args(docs: list[dict]) -> list[str]:
    deployment = one(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return container["command"] + container["args"]


# -- what an identity really did, from the API server's audit log (tests/chart/test_rbac_audit.py)

#: (verb, apiGroup, resource[/subresource], namespace or None) of one request on a resource
Request = tuple[str, str, str, "str | None"]


def audited_requests(events: list[dict[str, Any]], username: str) -> list[dict[str, Any]]:
    """The requests `username` made, one record per request (an audit ID's stages merged):
    ``{"verb", "group", "resource" (with ``/subresource``), "namespace" (None: cluster-scoped or
    every namespace), "name", "code" (the response's status; None while a watch runs), "uri"}``.
    A request on a non-resource URL (discovery: /api, /apis/...) has resource None."""
    by_id: dict[str, dict[str, Any]] = {}
    for e in events:
        if (e.get("user") or {}).get("username") != username:
            continue
        ref = e.get("objectRef") or {}
        resource = ref.get("resource")
        if resource and ref.get("subresource"):
            resource = f"{resource}/{ref['subresource']}"
        rec = by_id.setdefault(e["auditID"], {
            "verb": e["verb"], "group": ref.get("apiGroup") or "", "resource": resource,
            "namespace": ref.get("namespace"), "name": ref.get("name"), "code": None, "uri": e.get("requestURI")})
        code = (e.get("responseStatus") or {}).get("code")
        if code is not None and (rec["code"] is None or e.get("stage") == "ResponseComplete"):
            rec["code"] = code
    return list(by_id.values())


def covered(grants: dict[str | None, set[tuple[str, str, str]]], verb: str, group: str, resource: str,
            namespace: str | None) -> bool:
    """Whether `granted`'s result allows `verb` on `group`/`resource` in `namespace` (None: a
    cluster-scoped resource, or a namespaced one in every namespace: only a ClusterRole binding
    grants that)."""
    want = (group, resource, verb)
    return want in grants.get(None, set()) or (namespace is not None and want in grants.get(namespace, set()))
