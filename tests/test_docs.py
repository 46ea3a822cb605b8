"""The documentation is checked against the code, so that it cannot go stale.

* docs/reference/ is what `python -m autopar.reference` generates now.
* Every ``ParallelTrainingJob`` manifest in a ```yaml block of README.md and docs/ validates
  (`autopar.job.parse_job`, then the model's options as `autopar run` checks them), unless it is
  written out as a deliberately bad file (``<!-- test: file NAME bad -->``).
* Blocks marked in the Markdown run here, in a fresh directory per document (with ``examples/``
  linked into it, and an empty profile cache so that costs are analytic and the same everywhere):

  ``<!-- test: file NAME [bad] -->``     the next block is written to NAME;
  ``<!-- test: run -->``                 the next block's ``$ autopar …`` lines are run in-process
                                         (`autopar.cli.main`), each line after a command is its
                                         expected output (stdout and stderr together); ``...`` alone
                                         on a line matches any lines, inside a line any text;
  ``<!-- test: message NAME -->``        the next block is the message `MESSAGES[NAME]` makes now,
                                         from the code (``...`` as above);
  ``<!-- test: same-as PATH -->``        the next block is the file PATH of the repository.

Only ``autopar`` commands may be in a ``run`` block; expensive ones (``autopar run --local``,
benchmarks) are shown in unmarked blocks with the output of a real run.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_MARK = re.compile(r"<!--\s*test:\s*(?P<kind>[\w-]+)(?P<args>[^>]*?)\s*-->")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)\s*$")


@dataclass
class Block:
    doc: Path
    line: int              # 1-based line of the block's first content line
    lang: str
    text: str
    mark: str | None = None
    args: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of `doc`, each with the ``<!-- test: … -->`` mark right before it (if any)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    mark: tuple[str, tuple[str, ...]] | None = None
    i = 0
    while i < len(lines):
        m = _MARK.search(lines[i])
        f = _FENCE.match(lines[i])
        if m:
            mark = (m["kind"], tuple(m["args"].split()))
        elif f:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(f["fence"]))
            kind, args = mark or (None, ())
            out.append(Block(doc, i + 2, f["lang"], "\n".join(lines[i + 1:end]), kind, args))
            mark, i = None, end
        elif lines[i].strip():
            mark = None            # a mark applies to the block right after it (blank lines aside)
        i += 1
    return out


def _all_blocks() -> list[Block]:
    return [b for d in DOCS for b in blocks(d)]


def _matches(expected: str, got: str) -> bool:
    """`got` equals `expected`, where a line ``...`` matches any lines and ``...`` in a line any text."""
    parts = []
    for line in expected.strip("\n").splitlines():
        line = line.rstrip()
        if line == "...":
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(map(re.escape, line.split("..."))) + r"[ \t]*\n")
    want = "".join(parts)
    text = "\n".join(x.rstrip() for x in got.strip("\n").splitlines()) + "\n"
    return re.fullmatch(want, text) is not None


# -- the reference pages -------------------------------------------------------------------------

def test_reference_pages_are_generated_from_the_code(tmp_path):
    from autopar import reference

    assert reference.main([str(tmp_path)]) == 0
    stale = [name for name in reference.PAGES
             if not (ROOT / "docs" / "reference" / name).exists()
             or (ROOT / "docs" / "reference" / name).read_text(encoding="utf-8")
             != (tmp_path / name).read_text(encoding="utf-8")]
    assert not stale, (f"docs/reference/{', '.join(stale)} differ(s) from what the code generates; "
                       f"regenerate with `{reference.COMMAND}`")


def test_reference_covers_every_field_command_and_metric():
    text = {name: (ROOT / "docs" / "reference" / name).read_text() for name in ("crd.md", "cli.md", "metrics.md")}
    for field in ("spec.planner.replanMargin", "spec.runPolicy.suspend", "spec.devices.tolerations[].effect",
                  "status.conditions[].reason"):
        assert f"`{field}`" in text["crd.md"], field
    for cmd in ("autopar run", "autopar operator run", "autopar operator publish-plan", "autopar train",
                "autopar bench"):
        assert f"## {cmd}\n" in text["cli.md"], cmd
    assert "--checkpoint-dir" in text["cli.md"]           # train's own options are there
    for metric in ("autopar_job_simulated_step_seconds", "autopar_job_actual_step_seconds",
                   "autopar_job_prediction_error", "autopar_trainer_step_seconds_bucket", "autopar_jobs"):
        assert f"`{metric}`" in text["metrics.md"], metric


# -- manifests -----------------------------------------------------------------------------------

def _manifests() -> list[Block]:
    return [b for b in _all_blocks() if b.lang in ("yaml", "yml") and "kind: ParallelTrainingJob" in b.text
            and not (b.mark == "file" and "bad" in b.args)]


@pytest.mark.parametrize("block", _manifests(), ids=lambda b: b.where)
def test_manifests_in_the_docs_validate(block):
    from autopar.job import parse_job
    from autopar.job.pipeline import checked_model_options

    job = parse_job(yaml.safe_load(block.text), source=block.where)
    if ":" not in job.spec.model.name:          # a zoo model: its options are known here
        checked_model_options(job)


# -- marked blocks -------------------------------------------------------------------------------

def _docs_with_marks() -> list[Path]:
    return [d for d in DOCS if any(b.mark in ("file", "run", "same-as") for b in blocks(d))]


def _run(argv: list[str]) -> tuple[int, str]:
    from autopar.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            status = main(argv)
        except SystemExit as e:            # argparse's --help and usage errors
            status = e.code if isinstance(e.code, int) else 1
    return status, buf.getvalue()


def _commands(block: Block) -> list[tuple[str, str]]:
    """(command, expected output) of a ``run`` block."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"{block.where}: a run block starts with a `$ ` command line")
    return [(cmd, "\n".join(lines)) for cmd, lines in out]


@pytest.mark.parametrize("doc", _docs_with_marks(), ids=lambda d: str(d.relative_to(ROOT)))
def test_marked_examples_run_as_shown(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path / ".cache"))   # analytic costs, the same everywhere
    monkeypatch.setenv("COLUMNS", "100")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    ran = 0
    for block in blocks(doc):
        if block.mark == "file":
            (tmp_path / block.args[0]).write_text(block.text + "\n", encoding="utf-8")
        elif block.mark == "same-as":
            assert block.text.strip() == (ROOT / block.args[0]).read_text().strip(), (
                f"{block.where}: the block is not {block.args[0]} any more; paste the file again")
        elif block.mark == "run":
            for cmd, expected in _commands(block):
                argv = shlex.split(cmd)
                while "=" in argv[0]:                     # VAR=value before the command
                    var, _, value = argv.pop(0).partition("=")
                    if var == "PYTHONPATH":
                        monkeypatch.syspath_prepend(str(tmp_path / value))
                    monkeypatch.setenv(var, value)
                assert argv[0] == "autopar", f"{block.where}: only autopar commands run here: {cmd}"
                status, got = _run(argv[1:])
                assert _matches(expected, got), f"{block.where}: `{cmd}` printed\n{got}\ninstead of\n{expected}"
                want = 2 if "autopar: error:" in expected else 0
                assert status == want, f"{block.where}: `{cmd}` exited {status}, expected {want}:\n{got}"
                ran += 1
    assert ran or any(b.mark in ("file", "same-as") for b in blocks(doc))


# -- messages the operator and the trainer give ---------------------------------------------------

def _node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": labels.pop("_gpus", "8")}}}


def _dgx(name: str, **extra) -> dict:
    node = _node(name, **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"})
    node.update(extra)
    return node


def _msg_unknown_product() -> str:
    from autopar.operator.discovery import UnknownGpuProductError, build_topology

    node = _node("gpu-7", **{"nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000", "nvidia.com/gpu.count": "8"})
    try:
        build_topology([node], 8)
    except UnknownGpuProductError as e:
        return str(e)
    raise AssertionError("an unknown product was accepted")


def _msg_too_few_nodes() -> str:
    from autopar.operator.discovery import eligible

    nodes = [_dgx("dgx-a"),
             _dgx("dgx-b", spec={"taints": [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]}),
             _dgx("dgx-c", spec={"unschedulable": True},
                  status={"allocatable": {"nvidia.com/gpu": "8"},
                          "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}),
             _node("cpu-1")]
    nodes[3]["status"]["allocatable"] = {}
    return eligible(nodes, {"nodes": 2, "gpusPerNode": 8}, {"dgx-a": 4}).message


def _msg_bad_override() -> str:
    from autopar.operator.discovery import eligible

    node = _dgx("dgx-a")
    node["metadata"]["labels"]["autopar.dev/network-bandwidth"] = "fast"
    return eligible([node], {"nodes": 1, "gpusPerNode": 8}).message


def _observed(manifest_spec: dict, **kw):
    from autopar.job import parse_job
    from autopar.operator.reconcile import Observed

    job = parse_job({"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                     "metadata": {"name": "lenet", "namespace": "ml"}, "spec": manifest_spec})
    now = _dt.datetime(2026, 11, 25, 12, 0, tzinfo=_dt.timezone.utc)
    return Observed(job=job, uid="uid-1", now=now, nodes=[_dgx("dgx-a"), _dgx("dgx-b")], **kw)


def _condition(obs, reason: str) -> str:
    from autopar.operator.reconcile import reconcile

    patch = next(a.patch for a in reconcile(obs) if a.verb == "status")
    cond = next(c for c in patch["conditions"] if c["reason"] == reason and c["status"] == "True")
    return f"{cond['type']}  {cond['reason']}  {cond['message']}"


_SPEC = {"model": {"name": "lenet"}, "devices": {"nodes": 2, "gpusPerNode": 8}}


def _msg_failed_validation() -> str:
    return _condition(_observed({**_SPEC, "model": {"name": "lenet", "options": {"imagee": 28}}}), "FailedValidation")


def _msg_deadline() -> str:
    spec = {**_SPEC, "runPolicy": {"activeDeadlineSeconds": 3600}}
    return _condition(_observed(spec, status={"phase": "Training", "startTime": "2026-11-25T10:00:00Z"}),
                      "DeadlineExceeded")


def _running(**kw):
    """A job training on dgx-a and dgx-b under a ready plan, as the operator observes it."""
    from autopar.operator import resources as r
    from autopar.operator.discovery import discover

    obs = _observed(_SPEC, **kw)
    found = discover(obs.nodes, obs.job.spec.devices, name="lenet-topology")
    fp = found.report.fingerprint
    plan = r.plan_configmap(obs.job, obs.uid, topology_fingerprint=fp)
    plan["metadata"]["annotations"][r.ANN_PLAN_STATE] = "Ready"
    plan["data"] = {r.PLAN_KEY: "metadata: {name: plan}\npredicted: {stepSeconds: 0.01}\n"}
    obs.topology_configmap = r.topology_configmap(obs.job, obs.uid, found.report.document, fp)
    obs.plan_configmap = plan
    obs.status = {"phase": "Training", "topologyFingerprint": fp, "planHash": r.plan_hash(plan["data"][r.PLAN_KEY]),
                  "conditions": [{"type": "Running", "status": "True"}], **obs.status}
    obs.pods = r.trainer_pods(obs.job, obs.uid, ["dgx-a", "dgx-b"], "img", restart_count=obs.status.get("restarts", 0))
    for p in obs.pods:
        p["status"] = {"phase": "Running"}
    return obs


def _msg_backoff() -> str:
    obs = _running(status={"restarts": 3})
    obs.pods[1]["status"]["phase"] = "Failed"
    return _condition(obs, "BackoffLimitExceeded")


def _msg_trainer_failed() -> str:
    obs = _running()
    obs.pods[1]["status"]["phase"] = "Failed"
    return _condition(obs, "TrainerFailed")


def _msg_nodes_lost() -> str:
    obs = _running()
    obs.nodes = obs.nodes[:1]
    return _condition(obs, "NodesLost")


def _msg_topology_changed() -> str:
    obs = _running()
    obs.nodes = [_dgx("dgx-a"), _dgx("dgx-c")]
    return _condition(obs, "TopologyChanged")


def _msg_topology_changed_fits() -> str:
    obs = _running()
    obs.nodes[1]["metadata"]["labels"]["autopar.dev/network-bandwidth"] = "200Gbps"   # a link label changed
    return _condition(obs, "TopologyChanged")


def _replanned(step_seconds: float):
    """A job whose trainers kept running while a new plan (simulated at `step_seconds`) was made."""
    from autopar.operator import resources as r
    from autopar.operator.status import fmt_step

    obs = _running(status={"replanPending": True, "simulatedStepSeconds": 0.010, "simulatedStep": fmt_step(0.010)})
    obs.plan_configmap["data"] = {r.PLAN_KEY: f"metadata: {{name: plan}}\npredicted: {{stepSeconds: {step_seconds}}}\n"}
    return obs


def _msg_plan_kept() -> str:
    return _condition(_replanned(0.0098), "PlanKept")


def _msg_faster_plan() -> str:
    return _condition(_replanned(0.008), "FasterPlan")


def _msg_planner_failed() -> str:
    from autopar.operator import resources as r

    obs = _running()
    obs.plan_configmap = None
    obs.planner_job = {"metadata": {"name": "lenet-planner-0"},
                       "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                  "message": "Job has reached the specified backoff limit"}]}}
    assert r.plan_configmap_name(obs.job) == "lenet-plan"
    return _condition(obs, "PlannerFailed")


def _msg_gpus_short() -> str:
    """`autopar train --device cuda --nproc 2` on a machine with one GPU."""
    from unittest import mock

    from autopar.trainer.errors import TrainerConfigError
    from autopar.trainer.launch import check_gpus
    with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("torch.cuda.device_count",
                                                                              return_value=1):
        try:
            check_gpus(2)
        except TrainerConfigError as e:
            return f"autopar: error: {e}"
    raise AssertionError("check_gpus(2) accepted two ranks on one GPU")


MESSAGES = {
    "gpus-short": _msg_gpus_short,
    "unknown-gpu-product": _msg_unknown_product,
    "too-few-nodes": _msg_too_few_nodes,
    "bad-override": _msg_bad_override,
    "failed-validation": _msg_failed_validation,
    "deadline-exceeded": _msg_deadline,
    "backoff-limit-exceeded": _msg_backoff,
    "trainer-failed": _msg_trainer_failed,
    "nodes-lost": _msg_nodes_lost,
    "topology-changed": _msg_topology_changed,
    "topology-changed-fits": _msg_topology_changed_fits,
    "plan-kept": _msg_plan_kept,
    "faster-plan": _msg_faster_plan,
    "planner-failed": _msg_planner_failed,
}


def _message_blocks() -> list[Block]:
    return [b for b in _all_blocks() if b.mark == "message"]


@pytest.mark.parametrize("block", _message_blocks(), ids=lambda b: f"{b.where}:{b.args[0]}")
def test_messages_in_the_docs_are_what_the_code_says(block):
    name = block.args[0]
    assert name in MESSAGES, f"{block.where}: no message {name!r} in tests/test_docs.py MESSAGES"
    got = MESSAGES[name]()
    assert _matches(block.text, got), f"{block.where}: the code now says\n{got}\ninstead of\n{block.text}"


def test_every_message_is_shown_somewhere():
    shown = {b.args[0] for b in _message_blocks()}
    assert shown == set(MESSAGES), f"messages not in the docs: {sorted(set(MESSAGES) - shown)}"


# -- links and the README ------------------------------------------------------------------------

def test_relative_links_point_at_files():
    broken = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)                 # code spans are not links
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_readme_starts_with_the_two_commands_and_links_every_doc():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# autopar" and lines[2] == "```bash"
    assert lines[3].endswith(".venv/bin/autopar run examples/quickstart.yaml --local")
    assert lines[4].endswith('.venv/bin/python -m pytest -q -m "not slow"') and lines[5] == "```"
    ci = (ROOT / ".ci" / "run").read_text()
    assert lines[4] in ci, "the README's test command is what CI runs"
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in text, f"README.md does not link docs/{doc.name}"


def test_dashboard_picture_renders_from_the_run_metrics(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_dashboard", ROOT / "docs" / "render_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.render(ROOT / "docs" / "img" / "quickstart-run", tmp_path / "dashboard.png")
    assert out.stat().st_size > 10_000
    assert (ROOT / "docs" / "img" / "dashboard.png").stat().st_size < 250_000
