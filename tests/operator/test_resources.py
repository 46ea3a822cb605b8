"""The operator's resource builders (autopar.operator.resources), as pure functions: names, labels,
owner references, the commands the pods run (parsed back with the real `autopar` and `torchrun`
parsers), env, scheduling, Kueue, security.  tests/operator/test_resources_apiserver.py checks
the same objects against a real API server."""

from __future__ import annotations

import copy
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from autopar.job import parse_job
from autopar.job.pipeline import Prepared, model_options, train_config
from autopar.operator import resources as r

ROOT = Path(__file__).resolve().parents[2]
UID = "0c6c9d4e-1b7a-4c55-9a52-3f1f8f2a9e10"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LONG = "a-very-long-job-name-that-uses-every-one-of-its-sixty-three-chr"


def make_job(name: str = "tiny", namespace: str = "team-a", **spec) -> object:
    doc = {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"model": {"name": "lenet"}, **spec}}
    return parse_job(doc)


def gpu_job(**over):
    doc = yaml.safe_load((ROOT / "examples" / "gpu-cluster.yaml").read_text())
    doc["metadata"]["namespace"] = "ml"
    for k, v in over.items():
        doc["spec"].setdefault(k, {}).update(v)
    return parse_job(doc)


def all_objects(job, uid: str = UID) -> list[dict]:
    nodes = [f"node-{i}" for i in range(job.spec.devices.nodes)]
    objs = [r.topology_configmap(job, uid, {"name": "t", "devices": []}, "sha256:0123"),
            r.plan_configmap(job, uid),
            r.plan_configmap(job, uid, "apiVersion: autopar.dev/v1alpha1\nkind: Strategy\n"),
            r.planner_serviceaccount(job, uid), r.planner_role(job, uid), r.planner_rolebinding(job, uid),
            r.planner_job(job, uid, "autopar:test", topology_fingerprint="sha256:0123"),
            r.trainer_serviceaccount(job, uid), r.progress_role(job, uid), r.progress_rolebinding(job, uid),
            r.trainer_service(job, uid)]
    return objs + r.trainer_pods(job, uid, nodes, "autopar:test")


def names_in(obj: dict) -> list[str]:
    out = [obj["metadata"]["name"]]
    spec = obj.get("spec", {})
    out += [v for k, v in spec.items() if k in ("hostname", "subdomain", "serviceAccountName")]
    return out


# -- names ----------------------------------------------------------------------------------------

def test_names_are_the_documented_ones():
    job = make_job("tiny")
    assert r.topology_configmap_name(job) == "tiny-topology"
    assert r.plan_configmap_name(job) == "tiny-plan"
    assert r.planner_name(job) == "tiny-planner" and r.planner_name(job, 2) == "tiny-planner-2"
    assert r.service_name(job) == "tiny-rdzv"
    assert r.trainer_pod_name(job, 3) == "tiny-trainer-3"
    assert r.master_addr(job) == "tiny-trainer-0.tiny-rdzv.team-a.svc"


@pytest.mark.parametrize("name", ["tiny", "9lives", LONG, LONG[:-1] + "9", "x" * 40 + "-" * 20 + "yyy"])
def test_every_name_is_a_dns_label_and_deterministic(name):
    job = make_job(name, devices={"nodes": 12, "gpusPerNode": 1})
    objs = all_objects(job)
    for obj in objs:
        for n in names_in(obj):
            assert len(n) <= 63 and DNS_LABEL.match(n), (obj["kind"], n)
    assert RFC1035.match(r.service_name(job))
    assert [o["metadata"]["name"] for o in objs] == [o["metadata"]["name"] for o in all_objects(job)]
    pods = [o["metadata"]["name"] for o in objs if o["kind"] == "Pod"]
    assert len(set(pods)) == 12


def test_long_names_are_cut_with_a_hash_of_the_whole_name():
    other = LONG[:-1] + "x"                       # same 62 first characters
    a, b = make_job(LONG), make_job(other)
    assert r.trainer_pod_name(a, 7) != r.trainer_pod_name(b, 7)
    assert r.trainer_pod_name(a, 7).endswith("-trainer-7")
    assert r.trainer_pod_name(a, 7).startswith(LONG[:30])
    # every child of one job shares the cut prefix and hash
    prefix = r.trainer_pod_name(a, 0).rsplit("-trainer-0", 1)[0]
    assert r.plan_configmap_name(a) == prefix + "-plan"
    assert len(r.child_name(LONG, "trainer-1023")) <= 63
    assert len(r.child_name(LONG, "x" * 30)) == 63      # a longer suffix cuts deeper


def test_service_name_starts_with_a_letter():
    assert r.service_name(make_job("9lives")) == "ptj-9lives-rdzv"
    assert r.master_addr(make_job("9lives")) == "9lives-trainer-0.ptj-9lives-rdzv.team-a.svc"


# -- metadata -------------------------------------------------------------------------------------

@pytest.mark.parametrize("job", [make_job(), gpu_job()], ids=["tiny", "gpu-cluster"])
def test_every_object_is_owned_by_the_job_and_labelled(job):
    for obj in all_objects(job):
        meta = obj["metadata"]
        assert meta["namespace"] == job.metadata.namespace
        assert meta["ownerReferences"] == [{"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                                            "name": job.name, "uid": UID, "controller": True,
                                            "blockOwnerDeletion": True}]
        lab = meta["labels"]
        assert lab["app.kubernetes.io/name"] == "autopar"
        assert lab["app.kubernetes.io/instance"] == job.name
        assert lab["autopar.dev/job"] == job.name
        assert lab["autopar.dev/component"] in ("topology", "plan", "planner", "trainer")
        assert all(len(v) <= 63 for v in lab.values())


def test_an_owner_reference_needs_the_uid():
    with pytest.raises(r.ResourceError, match="uid"):
        r.trainer_service(make_job(), "")


# -- ConfigMaps -----------------------------------------------------------------------------------

def test_topology_configmap_holds_the_document_and_fingerprint():
    doc = {"name": "cluster", "devices": [{"name": "gpu0", "node": "n0"}]}
    cm = r.topology_configmap(make_job(), UID, doc, "sha256:feed")
    assert yaml.safe_load(cm["data"]["topology.yaml"]) == doc
    assert cm["metadata"]["annotations"]["autopar.dev/topology-fingerprint"] == "sha256:feed"
    assert cm["metadata"]["labels"]["autopar.dev/component"] == "topology"


def test_a_configmap_over_a_mebibyte_is_refused():
    with pytest.raises(r.ResourceError, match="1 MiB"):
        r.plan_configmap(make_job(), UID, "x" * (1 << 20))
    with pytest.raises(r.ResourceError, match="1 MiB"):
        r.topology_configmap(make_job(), UID, {"blob": "y" * (1 << 20)}, "fp")


def _merge(target: dict, patch: dict) -> dict:
    out = copy.deepcopy(target)
    for k, v in patch.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def test_the_planner_patch_turns_the_placeholder_into_the_plan():
    job, text = make_job(), "apiVersion: autopar.dev/v1alpha1\nkind: Strategy\nops: {}\n"
    placeholder = r.plan_configmap(job, UID, topology_fingerprint="sha256:1")
    assert "data" not in placeholder
    assert placeholder["metadata"]["annotations"]["autopar.dev/plan-state"] == "Pending"
    patched = _merge(placeholder, r.plan_configmap_patch(text, topology_fingerprint="sha256:1"))
    assert patched == r.plan_configmap(job, UID, text, topology_fingerprint="sha256:1")
    assert patched["metadata"]["annotations"]["autopar.dev/plan-state"] == "Ready"
    assert patched["metadata"]["annotations"]["autopar.dev/plan-hash"] == r.plan_hash(text)
    assert r.plan_hash(text) != r.plan_hash(text + " ")


# -- the planner ----------------------------------------------------------------------------------

def _autopar_parser():
    from autopar.cli import _build_parser
    return _build_parser()


def test_planner_job_runs_autopar_plan_with_the_jobs_settings():
    from autopar.planner.zoo import parse_options
    job = make_job(training={"batchSize": 32, "dtype": "float64"},
                   planner={"budgetSeconds": 12.5, "seed": 7, "maxProposals": 400},
                   model={"name": "lenet", "options": {"channels": 3, "image": 32}},
                   devices={"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                            "nodeSelector": {"pool": "gpu"}})
    obj = r.planner_job(job, UID, "autopar:1.0", topology_fingerprint="sha256:ab")
    spec = obj["spec"]
    assert (spec["backoffLimit"], spec["completions"], spec["parallelism"]) == (0, 1, 1)
    assert spec["activeDeadlineSeconds"] == 625 and spec["ttlSecondsAfterFinished"] == 3600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "tiny-planner"
    assert pod["automountServiceAccountToken"] is True
    assert "nodeSelector" not in pod and "affinity" not in pod
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["template"]["metadata"]["labels"]["autopar.dev/component"] == "planner"

    (plan,), (publish,) = pod["initContainers"], pod["containers"]
    argv = plan["command"] + plan["args"]
    assert argv[:2] == ["autopar", "plan"]
    args = _autopar_parser().parse_args(argv[1:])
    assert args.model == "lenet"
    assert parse_options(args.model_opt) == {"channels": 3, "image": 32, "batch": 32}
    assert args.topology == "/etc/autopar/topology/topology.yaml"
    assert (args.budget, args.seed, args.max_proposals, args.dtype) == (12.5, 7, 400, "float64")
    assert args.out == "/plan/plan.yaml"
    mounts = {m["mountPath"]: m for m in plan["volumeMounts"]}
    assert mounts["/etc/autopar/topology"]["readOnly"] and "/plan" in mounts and "/var/cache/autopar" in mounts
    assert {"name": "AUTOPAR_CACHE_DIR", "value": "/var/cache/autopar"} in plan["env"]
    assert "nvidia.com/gpu" not in str(plan["resources"])

    assert publish["command"] + publish["args"] == [
        "autopar", "operator", "publish-plan", "--plan", "/plan/plan.yaml", "--config-map", "tiny-plan",
        "--namespace", "$(POD_NAMESPACE)", "--topology-fingerprint", "sha256:ab"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["topology"]["configMap"]["name"] == "tiny-topology"
    assert volumes["profile-cache"] == {"name": "profile-cache", "emptyDir": {}}
    for c in pod["initContainers"] + pod["containers"]:
        assert c["securityContext"] == r.container_security_context()


def test_planner_job_options():
    job = make_job(model={"name": "lenet", "image": "me/model:2"}, runPolicy={"priorityClassName": "high"})
    obj = r.planner_job(job, UID, "autopar:1.0", profile_cache_claim="cache", deadline_seconds=99,
                        ttl_seconds_after_finished=5, attempt=3, image_pull_secrets=["reg"])
    pod = obj["spec"]["template"]["spec"]
    assert obj["metadata"]["name"] == "tiny-planner-3"
    assert obj["spec"]["activeDeadlineSeconds"] == 99 and obj["spec"]["ttlSecondsAfterFinished"] == 5
    assert {c["image"] for c in pod["initContainers"] + pod["containers"]} == {"me/model:2"}
    assert {"name": "profile-cache", "persistentVolumeClaim": {"claimName": "cache"}} in pod["volumes"]
    assert pod["priorityClassName"] == "high" and pod["imagePullSecrets"] == [{"name": "reg"}]
    assert "schedulerName" not in pod and "kueue" not in str(obj)


def test_plan_args_for_other_algorithms():
    assert r.plan_args(make_job(planner={"algorithm": "mcmc"}))[-5:-3] == ["--algorithm", "mcmc"]
    assert "--algorithm" not in r.plan_args(make_job())
    with pytest.raises(r.ResourceError, match="pinned"):
        r.planner_job(make_job(planner={"algorithm": "pinned", "planRef": {"configMap": "p"}}), UID, "i")


@pytest.mark.parametrize("value", [True, False, 3, -2, 0.001, 1e-07, 2.5, "gelu", (3, 4, 6, 3), [1, 2]])
def test_model_options_survive_the_command_line(value):
    from autopar.planner.zoo import parse_options
    expect = tuple(value) if isinstance(value, list) else value
    assert parse_options([f"k={r.format_option(value)}"]) == {"k": expect}


def test_options_the_command_line_cannot_carry_are_refused():
    with pytest.raises(r.ResourceError):
        r.format_option({"a": 1})
    with pytest.raises(r.ResourceError):
        r.format_option(["a", "b"])


# -- the trainers ---------------------------------------------------------------------------------

def _pod_env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _torchrun(pod: dict):
    from torch.distributed.run import get_args_parser
    c = pod["spec"]["containers"][0]
    argv = c["command"] + c["args"]
    assert argv[0] == "torchrun"
    return get_args_parser().parse_args(argv[1:])


def test_trainer_pod_runs_torchrun_on_its_node():
    job = gpu_job()
    pods = r.trainer_pods(job, UID, ["gpu-a", "gpu-b"], "autopar:1.0")
    for rank, pod in enumerate(pods):
        t = _torchrun(pod)
        assert (t.nnodes, t.nproc_per_node, t.node_rank) == ("2", "2", rank)
        assert t.master_addr == "lenet-h100-trainer-0.lenet-h100-rdzv.ml.svc" and t.master_port == 29500
        assert t.module and t.training_script == "autopar.cli" and t.training_script_args[0] == "train"
        assert t.max_restarts == 0
        spec = pod["spec"]
        env = _pod_env(spec["containers"][0])
        assert env["MASTER_ADDR"] == t.master_addr and env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "4" and env["RANK"] == str(rank) and env["PET_NODE_RANK"] == str(rank)
        assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "2"
        assert spec["hostname"] == f"lenet-h100-trainer-{rank}" and spec["subdomain"] == "lenet-h100-rdzv"
        assert spec["restartPolicy"] == "Never"
        assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 2}
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [["gpu-a", "gpu-b"][rank]]}]}]}
        assert pod["metadata"]["labels"]["autopar.dev/node-rank"] == str(rank)


def test_trainer_args_are_what_the_local_driver_trains():
    """The pod's `autopar train` options, parsed by the real CLI, give the TrainConfig that
    `job.pipeline.train_config` gives the local driver (but for what torchrun and a pod decide)."""
    from autopar.trainer.train import config_from
    job = make_job(training={"steps": 77, "batchSize": 16, "optimizer": "adam", "learningRate": 0.003,
                             "momentum": 0.5, "dtype": "float64", "seed": 11},
                   data={"source": "file", "path": "/data/batches.pt"},
                   model={"name": "lenet", "options": {"channels": 3}}, checkpoint={"everySteps": 5})
    pod = r.trainer_pod(job, UID, 0, "n0", "autopar:1.0", restart_count=1)
    t = _torchrun(pod)
    args = _autopar_parser().parse_args(t.training_script_args)
    from_cli = config_from(args)
    prepared = Prepared(job, Path("/"), model_options(job), graph=None)
    local = config_from(**train_config(prepared, r.PLAN_FILE, topology=r.TOPOLOGY_FILE,
                                       checkpoint_dir=r.CHECKPOINT_ROOT, metrics_port=r.METRICS_PORT, resume=True))
    gaps = {"nproc",              # torchrun's world size
            "device",             # cuda in a GPU pod
            "resume", "resume_if_present"}   # a pod resumes only when a checkpoint is there
    for field in vars(local):
        if field not in gaps:
            assert getattr(from_cli, field) == getattr(local, field), field
    assert from_cli.device == "cuda" and from_cli.resume_if_present and from_cli.checkpoint_every == 5
    assert from_cli.checkpoint_final
    assert from_cli.strategy == "/etc/autopar/plan/plan.yaml"
    assert from_cli.topology == "/etc/autopar/topology/topology.yaml"
    assert from_cli.model_options == {"channels": 3, "batch": 16}


def test_every_train_config_key_has_a_mapping():
    job = make_job()
    cfg = train_config(Prepared(job, Path("/"), model_options(job), graph=None), "x", topology="t",
                       checkpoint_dir=None)
    assert set(cfg) <= set(r.TRAIN_FLAGS)


def test_rank0_serves_metrics_and_reports_progress_the_others_get_no_token():
    job = make_job(devices={"nodes": 3, "gpusPerNode": 4})
    pods = r.trainer_pods(job, UID, ["a", "b", "c"], "img")
    p0, p1 = pods[0]["spec"], pods[1]["spec"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in p0["containers"][0]["ports"]
    assert all(p["name"] != "metrics" for p in p1["containers"][0]["ports"])
    assert "--metrics-port" in p0["containers"][0]["args"] and "--metrics-port" not in p1["containers"][0]["args"]
    assert p0["automountServiceAccountToken"] is True and p1["automountServiceAccountToken"] is False
    (side,) = p0["initContainers"]
    assert side["restartPolicy"] == "Always" and side["name"] == "progress"
    assert side["command"] + side["args"] == ["autopar", "operator", "report-progress", "--job", "tiny",
                                              "--namespace", "$(POD_NAMESPACE)", "--metrics-url",
                                              "http://127.0.0.1:9090/metrics", "--interval", "5"]
    assert "initContainers" not in p1
    env0 = _pod_env(p0["containers"][0])
    assert env0["AUTOPAR_JOB_NAME"] == "tiny" and env0["AUTOPAR_JOB_UID"] == UID
    assert env0["AUTOPAR_METRICS_PORT"] == "9090"
    assert env0["AUTOPAR_METRICS_LINGER"] == "11" and "AUTOPAR_METRICS_LINGER" not in _pod_env(p1["containers"][0])
    assert p0["serviceAccountName"] == p1["serviceAccountName"] == "tiny-trainer"
    quiet = r.trainer_pod(job, UID, 0, "a", "img", progress_sidecar=False)["spec"]
    assert "initContainers" not in quiet and quiet["automountServiceAccountToken"] is False
    assert "AUTOPAR_METRICS_LINGER" not in _pod_env(quiet["containers"][0])    # nobody to wait for


def test_kueue_pod_group_only_with_a_queue():
    with_q = r.trainer_pods(gpu_job(), UID, ["a", "b"], "img")
    for pod in with_q:
        meta = pod["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == "lenet-h100"
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    without = r.trainer_pod(make_job(), UID, 0, "a", "img")
    assert "kueue" not in yaml.safe_dump(without)
    assert "kueue" not in yaml.safe_dump(r.planner_job(gpu_job(), UID, "img"))


def test_scheduler_and_priority_are_passed_through():
    job = make_job(runPolicy={"schedulerName": "volcano", "priorityClassName": "train-high"})
    spec = r.trainer_pod(job, UID, 0, None, "img")["spec"]
    assert spec["schedulerName"] == "volcano" and spec["priorityClassName"] == "train-high"
    assert "affinity" not in spec and "nodeSelector" not in spec
    # GPU nodes carry the nvidia.com/gpu:NoSchedule taint: a GPU pod tolerates it, nothing else
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "tolerations" not in r.trainer_pod(job, UID, 0, None, "img", gpu_resource=None)["spec"]
    plain = r.trainer_pod(make_job(), UID, 0, None, "img")["spec"]
    assert "schedulerName" not in plain and "priorityClassName" not in plain


def test_trainer_security_context_is_restricted():
    pod = r.trainer_pod(make_job(), UID, 0, "n", "img")
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "privileged" not in sc


def test_trainer_mounts_plan_and_topology_read_only():
    pod = r.trainer_pod(make_job(), UID, 1, "n", "img", nnodes=2, plan_configmap="pinned", plan_key="mine.yaml",
                        plan_text_hash="sha256:77")
    spec = pod["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["plan"] == {"name": "plan", "mountPath": "/etc/autopar/plan", "readOnly": True}
    assert mounts["topology"]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["plan"]["configMap"] == {"name": "pinned", "items": [{"key": "mine.yaml", "path": "plan.yaml"}]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert pod["metadata"]["annotations"]["autopar.dev/plan-hash"] == "sha256:77"


def test_restarts_resume_unless_told_otherwise():
    job = make_job()
    assert "--resume" not in r.trainer_pod(job, UID, 0, "n", "img")["spec"]["containers"][0]["args"]
    again = r.trainer_pod(job, UID, 0, "n", "img", restart_count=2)
    assert "--resume-if-present" in again["spec"]["containers"][0]["args"]
    assert again["metadata"]["labels"]["autopar.dev/restart"] == "2"
    assert _pod_env(again["spec"]["containers"][0])["AUTOPAR_RESTART_COUNT"] == "2"
    no = r.trainer_pod(job, UID, 0, "n", "img", restart_count=2, resume=False)
    assert "--resume" not in no["spec"]["containers"][0]["args"]


def test_cpu_pods_request_no_gpu():
    pod = r.trainer_pod(make_job(), UID, 0, "n", "img", device="cpu", gpu_resource=None,
                        resources={"requests": {"cpu": "2"}})
    c = pod["spec"]["containers"][0]
    assert c["resources"] == {"requests": {"cpu": "2"}}
    assert c["args"][c["args"].index("--device") + 1] == "cpu"


def test_bad_ranks_are_refused():
    with pytest.raises(r.ResourceError, match="node rank"):
        r.trainer_pod(make_job(devices={"nodes": 2}), UID, 2, "n", "img")
    with pytest.raises(r.ResourceError, match="image"):
        r.trainer_pod(make_job(), UID, 0, "n", "")


# -- checkpoints ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path, claim, mount, directory", [
    (None, None, "/var/lib/autopar/checkpoints", "/var/lib/autopar/checkpoints"),
    ("pvc://shared", "shared", "/var/lib/autopar/checkpoints", "/var/lib/autopar/checkpoints/tiny"),
    ("pvc://shared.ckpt/runs/a/", "shared.ckpt", "/var/lib/autopar/checkpoints", "/var/lib/autopar/checkpoints/runs/a"),
    ("/mnt/ckpt", None, "/mnt/ckpt", "/mnt/ckpt"),
    ("ckpt/x", None, "/var/lib/autopar/checkpoints", "/var/lib/autopar/checkpoints/ckpt/x"),
])
def test_checkpoint_location(path, claim, mount, directory):
    job = make_job(checkpoint={"path": path} if path else {})
    loc = r.checkpoint_location(job)
    assert (loc.claim, loc.mount_path, loc.directory) == (claim, mount, directory)
    spec = r.trainer_pod(job, UID, 0, "n", "img")["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "checkpoints")
    assert volume == ({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}} if claim
                      else {"name": "checkpoints", "emptyDir": {}})
    args = spec["containers"][0]["args"]
    assert args[args.index("--checkpoint-dir") + 1] == directory
    assert {"name": "checkpoints", "mountPath": mount} in spec["containers"][0]["volumeMounts"]


@pytest.mark.parametrize("path", ["pvc://", "pvc://Bad_Claim", "pvc://c/../../etc", "../up", "/"])
def test_bad_checkpoint_paths_are_refused(path):
    with pytest.raises(r.ResourceError, match="checkpoint.path"):
        r.checkpoint_location(make_job(checkpoint={"path": path}))


# -- Service, RBAC, events ------------------------------------------------------------------------

def test_headless_service_selects_the_trainer_pods():
    job = gpu_job()
    svc = r.trainer_service(job, UID)
    spec = svc["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert {(p["name"], p["port"]) for p in spec["ports"]} == {("rdzv", 29500), ("metrics", 9090)}
    for pod in r.trainer_pods(job, UID, ["a", "b"], "img"):
        assert spec["selector"].items() <= pod["metadata"]["labels"].items()
    planner_pod_labels = r.planner_job(job, UID, "img")["spec"]["template"]["metadata"]["labels"]
    assert not spec["selector"].items() <= planner_pod_labels.items()


def test_progress_role_is_minimal():
    job = make_job()
    role = r.progress_role(job, UID)
    assert role["rules"] == [
        {"apiGroups": ["autopar.dev"], "resources": ["paralleltrainingjobs/status"], "resourceNames": ["tiny"],
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = r.progress_rolebinding(job, UID)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tiny-progress"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tiny-trainer", "namespace": "team-a"}]
    sa = r.trainer_serviceaccount(job, UID)
    assert sa["metadata"]["name"] == "tiny-trainer" and sa["automountServiceAccountToken"] is False


def test_planner_role_names_only_the_plan_configmap():
    job = make_job()
    rules = r.planner_role(job, UID)["rules"]
    assert rules[0] == {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["tiny-plan"],
                        "verbs": ["get", "patch"]}
    assert all("create" not in rule["verbs"] or rule["resources"] == ["events"] for rule in rules)
    binding = r.planner_rolebinding(job, UID)
    assert binding["subjects"][0]["name"] == r.planner_job(job, UID, "i")["spec"]["template"]["spec"][
        "serviceAccountName"]


def test_event():
    job, when = make_job(), datetime(2026, 5, 4, 3, 2, 1, 999, tzinfo=timezone.utc)
    ev = r.event(job, UID, "Planned", "plan found", "Normal", now=when)
    assert ev["apiVersion"] == "v1" and ev["kind"] == "Event"
    assert ev["involvedObject"] == {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                                    "name": "tiny", "namespace": "team-a", "uid": UID}
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2026-05-04T03:02:01Z"
    assert (ev["reason"], ev["message"], ev["type"], ev["count"]) == ("Planned", "plan found", "Normal", 1)
    assert ev["metadata"]["name"] == r.event(job, UID, "Planned", "plan found", now=when)["metadata"]["name"]
    assert ev["metadata"]["name"] != r.event(job, UID, "Planned", "other", now=when)["metadata"]["name"]
    assert ev["metadata"]["name"].startswith("tiny.")
    assert len(r.event(job, UID, "Big", "m" * 5000, "Warning", now=when)["message"]) == 1024
    with pytest.raises(r.ResourceError, match="Normal or Warning"):
        r.event(job, UID, "X", "y", "Error")


def test_builders_do_not_share_mutable_parts():
    text = yaml.safe_dump_all(all_objects(gpu_job()))
    assert "&id" not in text
