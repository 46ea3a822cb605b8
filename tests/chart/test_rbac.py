"""The chart's RBAC: every rule names the code that needs it; the operator gets what its
handlers do (operator/handlers.py: kopf's watches and indexes, the creates and deletes of
`_execute` for the kinds of `KINDS`) and no more (no wildcards, no secrets, no escalate, bind
or impersonate); it holds every permission of the per-job Roles it creates (operator/resources.py
planner_role, progress_role), because RBAC refuses to let it grant what it lacks; and the
delegate role is exactly those Roles' rules."""

from __future__ import annotations

import re
from pathlib import Path

import kopf
import pytest

from autopar.operator import resources as r
from autopar.operator.handlers import KINDS
from tests.chart.render import CHART, NAMESPACE, RELEASE, ROOT, granted, one, rbac_rules, render
from tests.operator.test_resources import UID, make_job

RULES_TEMPLATE = CHART / "templates" / "_rbac_rules.tpl"
KOPF = Path(kopf.__file__).parent.parent
CASES = {
    "clusterwide": {},
    "clusterwide-peering": {"replicaCount": 2},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "namespaced-peering": {"replicaCount": 2, "watchNamespaces": ["team-a", "team-b"]},
}


def _comment_blocks() -> list[tuple[str, str]]:
    """(comment before the rule, the rule's first line) for each rule in the template."""
    lines = RULES_TEMPLATE.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("- apiGroups:"):
            j, comment = i - 1, []
            while j >= 0 and lines[j].startswith("#"):
                comment.insert(0, lines[j].lstrip("# "))
                j -= 1
            out.append((" ".join(comment), line))
    return out


def test_every_rule_carries_a_comment_naming_existing_code():
    blocks = _comment_blocks()
    assert len(blocks) >= 14
    for comment, rule in blocks:
        files = re.findall(r"((?:operator|kopf)/[\w/]+\.py) (\w+)", comment)
        assert files, f"rule {rule!r}: its comment names no file and function: {comment!r}"
        for path, name in files:
            source = (KOPF / path if path.startswith("kopf/") else ROOT / path)
            assert source.is_file(), f"{path} (named before {rule!r}) does not exist"
            text = source.read_text()
            assert re.search(rf"^\s*(async def|def|class) {name}\b|^{name}\s*=", text, re.M), \
                f"{path} has no {name} (named before {rule!r})"


def test_rendered_rules_keep_their_comments(helm):
    from tests.chart.render import render_text
    text = render_text(helm, {})
    role = text[text.index("kind: ClusterRole"):]
    role = role[:role.index("---")]
    rules = role.count("- apiGroups:")
    assert rules and role.count("\n  # operator/") + role.count("\n  # kopf's") >= rules


@pytest.fixture(scope="module")
def renders(helm):
    return {case: render(helm, values) for case, values in CASES.items()}


def _where(grants, ns):
    """What the operator may do in namespace `ns`: cluster-wide grants plus those of `ns`."""
    return grants.get(None, set()) | grants.get(ns, set())


def _needed(peering: bool, namespaced: bool) -> tuple[set, set]:
    """(in each watched namespace, cluster-wide) what operator/handlers.py does."""
    ns = {(g, plural, "create") for g, _, plural in KINDS.values()}
    ns |= {("", "pods", v) for v in ("list", "watch", "delete")}
    ns |= {("", "configmaps", v) for v in ("list", "watch", "delete")}
    ns |= {("batch", "jobs", "list"), ("batch", "jobs", "watch"), ("", "services", "list"), ("", "services", "watch")}
    ns |= {("autopar.dev", "paralleltrainingjobs", v) for v in ("list", "watch", "patch", "delete")}
    ns |= {("autopar.dev", "paralleltrainingjobs/status", "patch")}
    cluster = {("", "nodes", "list"), ("", "nodes", "watch"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "watch")}
    if peering and namespaced:
        ns |= {("kopf.dev", "kopfpeerings", v) for v in ("list", "watch", "patch")}
    if peering and not namespaced:
        cluster |= {("kopf.dev", "clusterkopfpeerings", v) for v in ("list", "watch", "patch")}
    return ns, cluster


def _delegated() -> set[tuple[str, str, str]]:
    job = make_job("tiny", namespace="team-a")
    out = set()
    for role in (r.planner_role(job, UID), r.progress_role(job, UID)):
        for rule in role["rules"]:
            out |= {(g, res, v) for g in rule["apiGroups"] for res in rule["resources"] for v in rule["verbs"]}
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_the_operator_may_do_what_its_handlers_do(renders, case):
    values = CASES[case]
    grants = granted(renders[case], RELEASE, NAMESPACE)
    namespaces = values.get("watchNamespaces") or [None]
    need_ns, need_cluster = _needed(values.get("replicaCount", 1) > 1, bool(values.get("watchNamespaces")))
    assert need_cluster <= grants.get(None, set()), sorted(need_cluster - grants.get(None, set()))
    for ns in namespaces:
        have = _where(grants, ns)
        assert need_ns <= have, f"{ns}: missing {sorted(need_ns - have)}"
        # RBAC lets the operator create the per-job Roles only with their permissions
        assert _delegated() <= have, f"{ns}: cannot grant {sorted(_delegated() - have)}"
    if values.get("watchNamespaces"):
        cluster_resources = {res for _, res, _ in grants.get(None, set())}
        assert cluster_resources <= {"nodes", "customresourcedefinitions", "namespaces"}
        assert _where(grants, "elsewhere") == grants.get(None, set())


@pytest.mark.parametrize("case", list(CASES))
def test_the_operator_gets_nothing_more(renders, case):
    values = CASES[case]
    grants = granted(renders[case], RELEASE, NAMESPACE)
    need_ns, need_cluster = _needed(values.get("replicaCount", 1) > 1, bool(values.get("watchNamespaces")))
    extra_ok = _delegated() | {("autopar.dev", "paralleltrainingjobs/finalizers", "update"),
                               ("", "namespaces", "list"), ("", "namespaces", "watch")}
    for ns, have in grants.items():
        extra = have - need_ns - need_cluster - extra_ok
        assert not extra, f"{ns}: granted but not used: {sorted(extra)}"
        assert not any("*" in part for t in have for part in t)
        assert not {v for _, _, v in have} & {"escalate", "bind", "impersonate"}
        assert not {res for _, res, _ in have} & {"secrets"}


def test_delegate_role_is_the_planner_and_progress_roles(renders):
    docs = renders["clusterwide"]
    rules = rbac_rules(docs)[("ClusterRole", None, f"{RELEASE}-delegate")]
    got = {(g, res, v) for rule in rules for g in rule["apiGroups"] for res in rule["resources"] for v in rule["verbs"]}
    assert got == _delegated()
    for ns in ("team-a", "team-b"):
        rules = rbac_rules(renders["namespaced"])[("Role", ns, f"{RELEASE}-delegate")]
        assert {(g, res, v) for rule in rules for g in rule["apiGroups"] for res in rule["resources"]
                for v in rule["verbs"]} == _delegated()


def test_bindings_name_the_operators_service_account(renders):
    for case, docs in renders.items():
        sa = one(docs, "ServiceAccount")
        pod = one(docs, "Deployment")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == sa["metadata"]["name"] == RELEASE
        for b in docs:
            if b["kind"] in ("ClusterRoleBinding", "RoleBinding"):
                assert b["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}], case
