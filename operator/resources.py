"""The Kubernetes objects the operator creates for a `ParallelTrainingJob`, as plain dicts.

Pure functions of the job (`autopar.job.ParallelTrainingJob`) and its uid: no Kubernetes client,
no kopf, no I/O, so every builder is tested on its own and against a real API server's schema
(tests/operator).  The operator creates what they return, treating 409 Conflict as done: every
name is deterministic.

What a job gets, in the order the operator makes it::

    <job>-topology      ConfigMap   topology.yaml: the DeviceTopology discovered from node labels
    <job>-plan          ConfigMap   plan.yaml: an empty placeholder, filled by the planner pod
    <job>-planner       ServiceAccount + Role + RoleBinding: get/patch that one ConfigMap
    <job>-planner       batch/v1 Job: init container `autopar plan … --out /plan/plan.yaml`,
                        container `autopar operator publish-plan` patches it into <job>-plan
    <job>-trainer       ServiceAccount (token mounted on rank 0 only)
    <job>-progress      Role + RoleBinding: get/patch paralleltrainingjobs/status of this job, create events
    <job>-rdzv          headless Service: DNS for the trainer pods, port 29500 (rendezvous), metrics
    <job>-trainer-<r>   Pod per node r: torchrun … -m autopar.cli train --strategy /etc/autopar/plan/plan.yaml

Every object carries the labels `app.kubernetes.io/name: autopar`, `app.kubernetes.io/instance`,
`app.kubernetes.io/component`, `app.kubernetes.io/managed-by`, `autopar.dev/job` and
`autopar.dev/component`, and one owner reference to the job (controller, blockOwnerDeletion), so
deleting the job deletes them (Events excepted: the API server expires them).

Names are DNS labels (at most 63 characters: a Service name, a pod's hostname and a batch Job's
name must be): ``<job>-<suffix>``, or, when that is too long, the job name cut short plus 8 hex
digits of its hash, ``<job-prefix>-<hash>-<suffix>``; a Service name that would start with a
digit gets the prefix ``ptj-`` (Service names are RFC 1035 labels).

Checkpoints (`checkpoint.path` in a cluster; `checkpoint_location`):

- ``pvc://CLAIM`` or ``pvc://CLAIM/SUB/DIR``: the PersistentVolumeClaim CLAIM of the job's
  namespace is mounted at /var/lib/autopar/checkpoints on every trainer pod and checkpoints go
  to SUB/DIR below it (default: the job's name).  Rank 0 writes them; every rank reads one when
  resuming, so with more than one node the claim must be ReadWriteMany (or the pods share a node).
- any other path, or none: an emptyDir at that path (a relative one below
  /var/lib/autopar/checkpoints): checkpoints live as long as the pod, which is enough for a final
  checkpoint but not to resume after a pod is replaced.

Commands the pods run that `autopar` does not have yet (for the operator to add):

- ``autopar operator publish-plan --plan FILE --config-map NAME --namespace NS
  [--topology-fingerprint FP]``: reads the plan file and applies `plan_configmap_patch` to the
  ConfigMap NAME with the pod's ServiceAccount token (in-cluster config).
- ``autopar operator report-progress --job NAME --namespace NS --metrics-url URL``: rank 0's
  native sidecar; scrapes the trainer's Prometheus metrics on localhost and patches the job's
  status (completedSteps, actualStepSeconds, …) and posts Events with the ``<job>-progress`` Role.
- ``autopar plan --algorithm A``: only emitted for a job whose planner.algorithm is neither
  ``auto`` nor ``pinned`` (``autopar plan`` has no such option yet; `job.pipeline.make_plan` has
  the algorithms).

What the trainer pods rely on in `autopar train`: ``AUTOPAR_METRICS_ADDR=0.0.0.0`` makes rank 0's
metrics reachable through the Service; ``AUTOPAR_METRICS_LINGER`` keeps them up after the last step
until the progress sidecar has scraped it (a short job would otherwise end between two scrapes and
its status would lack the measured step); ``--checkpoint-final`` checkpoints after the last step;
``--resume-if-present`` (on every restart) resumes when a checkpoint exists and starts fresh
otherwise; SIGTERM (a pod's stop, forwarded by torchrun) stops the ranks after a step with a
checkpoint, like Ctrl-C.  The operator must create the ServiceAccounts before the pods (admission
refuses a pod whose ServiceAccount does not exist) and hold every permission its Roles grant (RBAC
refuses to create a Role that escalates).
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

import yaml

from autopar.job.spec import API_VERSION, KIND, PLURAL, GROUP, ParallelTrainingJob
from autopar.planner.errors import AutoparError

# -- constants ------------------------------------------------------------------------------------

RDZV_PORT = 29500                     # torchrun's static rendezvous on rank 0 (Kubeflow's default)
METRICS_PORT = 9090                   # rank 0's Prometheus metrics (`autopar train --metrics-port`)
#: Seconds between the progress sidecar's scrapes (`autopar operator report-progress --interval`).
PROGRESS_INTERVAL_S = 5.0
#: How long rank 0 keeps its metrics up after the last step for the sidecar to see it (`autopar train
#: --metrics-linger`, through $AUTOPAR_METRICS_LINGER): two of its intervals and a second, so a scrape
#: that fails once still leaves another.
METRICS_LINGER_S = 2 * PROGRESS_INTERVAL_S + 1
DEFAULT_IMAGE_PULL_POLICY = "IfNotPresent"
RUN_AS_USER = 1000

TOPOLOGY_DIR = "/etc/autopar/topology"
TOPOLOGY_KEY = "topology.yaml"
TOPOLOGY_FILE = f"{TOPOLOGY_DIR}/{TOPOLOGY_KEY}"
PLAN_DIR = "/etc/autopar/plan"        # the plan ConfigMap, read-only, in trainer pods
PLAN_KEY = "plan.yaml"
PLAN_FILE = f"{PLAN_DIR}/{PLAN_KEY}"
PLANNER_OUT_DIR = "/plan"             # emptyDir shared by the planner pod's two containers
PLANNER_OUT = f"{PLANNER_OUT_DIR}/{PLAN_KEY}"
CACHE_DIR = "/var/cache/autopar"      # the profile cache ($AUTOPAR_CACHE_DIR)
CHECKPOINT_ROOT = "/var/lib/autopar/checkpoints"
SHM_DIR = "/dev/shm"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_APP_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = f"{GROUP}/job"
LABEL_COMPONENT = f"{GROUP}/component"
LABEL_NODE_RANK = f"{GROUP}/node-rank"
LABEL_RESTART = f"{GROUP}/restart"
ANN_TOPOLOGY_FINGERPRINT = f"{GROUP}/topology-fingerprint"
ANN_PLAN_HASH = f"{GROUP}/plan-hash"
ANN_PLAN_STATE = f"{GROUP}/plan-state"       # Pending (placeholder) | Ready
ANN_NODE = f"{GROUP}/node"

KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"

HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
MANAGER = "autopar-operator"
CONFIGMAP_LIMIT = 1024 * 1024         # the API server refuses larger ConfigMaps (etcd's object limit)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_LABEL = 63
_SUFFIX_ROOM = 16                     # "trainer-1023", "planner-12", "topology": one cut for all


class ResourceError(AutoparError, ValueError):
    """A job that cannot be turned into valid Kubernetes objects (the message says what to change)."""


# -- names ----------------------------------------------------------------------------------------

def short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def child_name(job_name: str, suffix: str = "", *, limit: int = _MAX_LABEL, rfc1035: bool = False) -> str:
    """``<job>-<suffix>`` as a DNS label of at most `limit` characters: when too long, the job name
    is cut and 8 hex digits of its hash keep names of different jobs apart
    (``<job-prefix>-<hash>-<suffix>``; every child of one job with a suffix of up to 16
    characters shares the prefix).  With `rfc1035`
    (Service names) the name starts with a letter: ``ptj-`` is put before a leading digit."""
    prefix = "ptj-" if rfc1035 and job_name[:1].isdigit() else ""
    full = prefix + (f"{job_name}-{suffix}" if suffix else job_name)
    if len(full) <= limit:
        return full
    digest = short_hash(job_name)
    tail = f"-{digest}" + (f"-{suffix}" if suffix else "")
    # one cut for every suffix up to _SUFFIX_ROOM characters, so a job's children share a prefix
    keep = limit - len(prefix) - len(digest) - 2 - max(len(suffix), _SUFFIX_ROOM)
    if keep < 1:
        raise ResourceError(f"name suffix {suffix!r} leaves no room for the job name within {limit} characters")
    head = job_name[:keep].rstrip("-") or job_name[:1]
    return prefix + head + tail


def topology_configmap_name(job: ParallelTrainingJob) -> str:
    return child_name(job.name, "topology")


def plan_configmap_name(job: ParallelTrainingJob) -> str:
    return child_name(job.name, "plan")


def planner_name(job: ParallelTrainingJob, attempt: int = 0) -> str:
    """The planner Job's (and its ServiceAccount's and Role's) name; a re-plan may count attempts."""
    return child_name(job.name, "planner" if not attempt else f"planner-{attempt}")


def planner_account_name(job: ParallelTrainingJob) -> str:
    return child_name(job.name, "planner")


def trainer_account_name(job: ParallelTrainingJob) -> str:
    return child_name(job.name, "trainer")


def progress_role_name(job: ParallelTrainingJob) -> str:
    return child_name(job.name, "progress")


def service_name(job: ParallelTrainingJob) -> str:
    return child_name(job.name, "rdzv", rfc1035=True)


def trainer_pod_name(job: ParallelTrainingJob, node_rank: int) -> str:
    """Also the pod's hostname: ``<name>.<service>.<namespace>.svc`` resolves to it."""
    return child_name(job.name, f"trainer-{node_rank}")


def master_addr(job: ParallelTrainingJob) -> str:
    """DNS name of the rank-0 trainer pod (through the headless Service)."""
    return f"{trainer_pod_name(job, 0)}.{service_name(job)}.{job.metadata.namespace}.svc"


# -- metadata -------------------------------------------------------------------------------------

def selector_labels(job: ParallelTrainingJob, component: str | None = None) -> dict[str, str]:
    """The labels that select a job's objects (of one component): stable over restarts."""
    out = {LABEL_JOB: job.name}
    if component:
        out[LABEL_COMPONENT] = component
    return out


def labels(job: ParallelTrainingJob, component: str) -> dict[str, str]:
    return {LABEL_NAME: "autopar", LABEL_INSTANCE: job.name, LABEL_APP_COMPONENT: component,
            LABEL_MANAGED_BY: MANAGER, **selector_labels(job, component)}


def owner_reference(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    """The job as the controlling owner: garbage collection deletes the object with the job, and
    foreground deletion of the job waits for it.  (With the OwnerReferencesPermissionEnforcement
    admission plugin, setting blockOwnerDeletion needs `update` on paralleltrainingjobs/finalizers.)"""
    if not uid:
        raise ResourceError(f"job {job.name!r}: an owner reference needs the job's uid")
    return {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def _meta(job: ParallelTrainingJob, uid: str, name: str, component: str, *,
          extra_labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": job.metadata.namespace,
                            "labels": {**labels(job, component), **(extra_labels or {})},
                            "ownerReferences": [owner_reference(job, uid)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _image(job: ParallelTrainingJob, image: str) -> str:
    """A ``package.module:factory`` model's own image (spec.model.image) wins over the operator's."""
    chosen = job.spec.model.image or image
    if not chosen:
        raise ResourceError(f"job {job.name!r}: no container image (give the operator's image or spec.model.image)")
    return chosen


# -- ConfigMaps -----------------------------------------------------------------------------------

def _check_size(job: ParallelTrainingJob, what: str, data: dict[str, str]) -> None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    if size > CONFIGMAP_LIMIT - 16 * 1024:   # room for the metadata
        raise ResourceError(f"job {job.name!r}: the {what} is {size} bytes; a ConfigMap holds at most about 1 MiB")


def topology_configmap(job: ParallelTrainingJob, uid: str, topology_doc: dict[str, Any],
                       fingerprint: str) -> dict[str, Any]:
    """The discovered topology as a file the planner reads (``--topology`` TOPOLOGY_FILE)."""
    data = {TOPOLOGY_KEY: yaml.safe_dump(topology_doc, sort_keys=False)}
    _check_size(job, "topology", data)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(job, uid, topology_configmap_name(job), "topology",
                              annotations={ANN_TOPOLOGY_FINGERPRINT: fingerprint}),
            "data": data}


def plan_hash(plan_text: str) -> str:
    return "sha256:" + short_hash(plan_text, 16)


def _plan_annotations(plan_text: str | None, topology_fingerprint: str | None) -> dict[str, str]:
    ann = {ANN_PLAN_STATE: "Pending" if plan_text is None else "Ready"}
    if plan_text is not None:
        ann[ANN_PLAN_HASH] = plan_hash(plan_text)
    if topology_fingerprint:
        ann[ANN_TOPOLOGY_FINGERPRINT] = topology_fingerprint
    return ann


def plan_configmap(job: ParallelTrainingJob, uid: str, plan_text: str | None = None, *,
                   topology_fingerprint: str | None = None) -> dict[str, Any]:
    """The plan the trainers read.  Without `plan_text`: the empty placeholder the operator creates
    before the planner runs (annotation ``autopar.dev/plan-state: Pending``), which the planner pod
    may then only patch (its Role names this one ConfigMap: RBAC cannot limit `create` by name)."""
    meta = _meta(job, uid, plan_configmap_name(job), "plan",
                 annotations=_plan_annotations(plan_text, topology_fingerprint))
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    if plan_text is not None:
        doc["data"] = {PLAN_KEY: plan_text}
        _check_size(job, "plan", doc["data"])
    return doc


def plan_configmap_patch(plan_text: str, *, topology_fingerprint: str | None = None) -> dict[str, Any]:
    """The merge patch `autopar operator publish-plan` applies to the placeholder."""
    if len(plan_text.encode()) > CONFIGMAP_LIMIT - 16 * 1024:
        raise ResourceError(f"the plan is {len(plan_text.encode())} bytes; a ConfigMap holds at most about 1 MiB")
    return {"metadata": {"annotations": _plan_annotations(plan_text, topology_fingerprint)},
            "data": {PLAN_KEY: plan_text}}


# -- security -------------------------------------------------------------------------------------

def container_security_context() -> dict[str, Any]:
    """Pod Security Standards' `restricted` profile."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security_context() -> dict[str, Any]:
    """fsGroup makes mounted volumes (the checkpoint claim, the cache) writable by the user."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _tolerations(job: ParallelTrainingJob) -> list[dict[str, Any]]:
    return [t.model_dump(by_alias=True, exclude_none=True) for t in job.spec.devices.tolerations]


def _downward(name: str, field: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}


def _common_env(job: ParallelTrainingJob, uid: str) -> list[dict[str, Any]]:
    return [{"name": "AUTOPAR_JOB_NAME", "value": job.name},
            _downward("AUTOPAR_JOB_NAMESPACE", "metadata.namespace"),
            {"name": "AUTOPAR_JOB_UID", "value": uid},
            _downward("POD_NAME", "metadata.name"),
            _downward("POD_NAMESPACE", "metadata.namespace"),
            {"name": "AUTOPAR_CACHE_DIR", "value": CACHE_DIR},
            {"name": "HOME", "value": "/tmp"},
            {"name": "PYTHONUNBUFFERED", "value": "1"}]


def _cache_volume(profile_cache_claim: str | None) -> dict[str, Any]:
    if profile_cache_claim:
        return {"name": "profile-cache", "persistentVolumeClaim": {"claimName": profile_cache_claim}}
    return {"name": "profile-cache", "emptyDir": {}}


# -- model options on the command line --------------------------------------------------------------

def format_option(value: Any) -> str:
    """A model option as ``-o key=VALUE`` text that `planner.zoo.parse_options` reads back as `value`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ResourceError(f"option value {value!r}: only lists of integers can be given on the command line")
        return ",".join(str(v) for v in value)
    if isinstance(value, (int, float, str)):
        return str(value) if not isinstance(value, float) else repr(value)
    raise ResourceError(f"option value {value!r} ({type(value).__name__}) cannot be given on the command line")


def model_option_args(options: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        out += ["--model-opt", f"{key}={format_option(value)}"]
    return out


def _model_options(job: ParallelTrainingJob) -> dict[str, Any]:
    from autopar.job.pipeline import model_options
    return model_options(job)


# -- the planner ----------------------------------------------------------------------------------

def plan_args(job: ParallelTrainingJob, *, topology: str = TOPOLOGY_FILE, out: str = PLANNER_OUT,
              profile_cache: str | None = None) -> list[str]:
    """``autopar plan`` for the job's planner settings (argv, program name first)."""
    spec = job.spec
    if spec.planner.algorithm == "pinned":
        raise ResourceError(f"job {job.name!r}: algorithm 'pinned' runs no planner; mount planner.planRef instead")
    argv = ["autopar", "plan", "--model", spec.model.name, *model_option_args(_model_options(job)),
            "--topology", topology, "--budget", format_option(float(spec.planner.budget_seconds)),
            "--seed", str(spec.planner.seed)]
    if spec.planner.max_proposals is not None:
        argv += ["--max-proposals", str(spec.planner.max_proposals)]
    if spec.training.dtype is not None:
        argv += ["--dtype", spec.training.dtype]   # a plan is only valid for the dtype it was made for
    if spec.planner.algorithm != "auto":
        argv += ["--algorithm", spec.planner.algorithm]    # not in `autopar plan` yet (module docstring)
    if profile_cache:
        argv += ["--profile-cache", profile_cache]
    argv += ["--out", out, "--json"]
    return argv


def planner_serviceaccount(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    return _serviceaccount(job, uid, planner_account_name(job), "planner")


def planner_role(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    """The planner pod may read and patch the job's plan ConfigMap, and nothing else."""
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [plan_configmap_name(job)],
              "verbs": ["get", "patch"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    return _role(job, uid, planner_account_name(job), "planner", rules)


def planner_rolebinding(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    return _rolebinding(job, uid, planner_account_name(job), "planner", planner_account_name(job))


def planner_job(job: ParallelTrainingJob, uid: str, image: str, *, topology_fingerprint: str | None = None,
                profile_cache_claim: str | None = None, deadline_seconds: int | None = None,
                ttl_seconds_after_finished: int = 3600, attempt: int = 0,
                resources: dict[str, Any] | None = None, image_pull_policy: str = DEFAULT_IMAGE_PULL_POLICY,
                image_pull_secrets: list[str] | None = None) -> dict[str, Any]:
    """A batch/v1 Job that searches the plan and writes it into the plan ConfigMap.

    Its pod: init container ``plan`` runs `autopar plan` on the topology ConfigMap into an emptyDir;
    container ``publish`` runs ``autopar operator publish-plan``, which patches the file into the
    placeholder ConfigMap (`plan_configmap`) with the ``<job>-planner`` ServiceAccount.  A failing
    search fails the pod and so the Job (backoffLimit 0: the operator decides about retries).  The
    pod tolerates the job's taints but has no nodeSelector and no GPU: planning is CPU work.  It
    is not put in the job's Kueue queue either (it would wait behind GPU jobs for no GPU)."""
    img = _image(job, image)
    budget = job.spec.planner.budget_seconds
    deadline = deadline_seconds if deadline_seconds is not None else int(2 * budget) + 600
    env = _common_env(job, uid) + [{"name": "AUTOPAR_PLAN_CONFIGMAP", "value": plan_configmap_name(job)}]
    mounts = [{"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True},
              {"name": "plan-out", "mountPath": PLANNER_OUT_DIR},
              {"name": "profile-cache", "mountPath": CACHE_DIR},
              {"name": "tmp", "mountPath": "/tmp"}]
    res = resources if resources is not None else {"requests": {"cpu": "1", "memory": "2Gi"},
                                                   "limits": {"memory": "8Gi"}}
    publish = ["autopar", "operator", "publish-plan", "--plan", PLANNER_OUT, "--config-map", plan_configmap_name(job),
               "--namespace", "$(POD_NAMESPACE)"]
    if topology_fingerprint:
        publish += ["--topology-fingerprint", topology_fingerprint]
    annotations = {ANN_TOPOLOGY_FINGERPRINT: topology_fingerprint} if topology_fingerprint else None
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": planner_account_name(job),
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "initContainers": [{
            "name": "plan", "image": img, "imagePullPolicy": image_pull_policy,
            "command": plan_args(job)[:1], "args": plan_args(job)[1:],
            "env": env, "volumeMounts": mounts, "resources": res,
            "securityContext": container_security_context()}],
        "containers": [{
            "name": "publish", "image": img, "imagePullPolicy": image_pull_policy,
            "command": publish[:1], "args": publish[1:], "env": copy.deepcopy(env),
            "volumeMounts": [{"name": "plan-out", "mountPath": PLANNER_OUT_DIR, "readOnly": True},
                             {"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            "securityContext": container_security_context()}],
        "volumes": [{"name": "topology", "configMap": {"name": topology_configmap_name(job),
                                                       "items": [{"key": TOPOLOGY_KEY, "path": TOPOLOGY_KEY}]}},
                    {"name": "plan-out", "emptyDir": {}},
                    _cache_volume(profile_cache_claim),
                    {"name": "tmp", "emptyDir": {}}],
    }
    if job.spec.devices.tolerations:
        pod_spec["tolerations"] = _tolerations(job)
    if job.spec.run_policy.priority_class_name:
        pod_spec["priorityClassName"] = job.spec.run_policy.priority_class_name
    if image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in image_pull_secrets]
    name = planner_name(job, attempt)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(job, uid, name, "planner", annotations=annotations),
            "spec": {"backoffLimit": 0, "completions": 1, "parallelism": 1,
                     "activeDeadlineSeconds": deadline, "ttlSecondsAfterFinished": ttl_seconds_after_finished,
                     "template": {"metadata": {"labels": labels(job, "planner"),
                                               **({"annotations": annotations} if annotations else {})},
                                  "spec": pod_spec}}}


# -- the trainers ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointLocation:
    """Where a trainer pod keeps checkpoints: a claim (or None: an emptyDir) mounted at
    `mount_path`, and the directory `autopar train --checkpoint-dir` gets."""

    claim: str | None
    mount_path: str
    directory: str


def checkpoint_location(job: ParallelTrainingJob) -> CheckpointLocation:
    """`checkpoint.path` in a cluster: ``pvc://CLAIM[/SUB/DIR]`` (the claim, checkpoints in SUB/DIR,
    default the job's name), an absolute path (an emptyDir there), a relative one (an emptyDir
    below CHECKPOINT_ROOT), or none (an emptyDir at CHECKPOINT_ROOT)."""
    path = job.spec.checkpoint.path
    if not path:
        return CheckpointLocation(None, CHECKPOINT_ROOT, CHECKPOINT_ROOT)
    if path.startswith("pvc://"):
        claim, _, sub = path[len("pvc://"):].partition("/")
        if not claim or len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim):
            raise ResourceError(f"spec.checkpoint.path {path!r}: 'pvc://CLAIM[/DIR]' needs a PersistentVolumeClaim "
                                "name (lower-case letters, digits, '-' and '.')")
        parts = [p for p in sub.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ResourceError(f"spec.checkpoint.path {path!r}: the directory must stay inside the claim (no '..')")
        rel = "/".join(parts) or job.name
        return CheckpointLocation(claim, CHECKPOINT_ROOT, f"{CHECKPOINT_ROOT}/{rel}")
    p = PurePosixPath(path)
    if ".." in p.parts:
        raise ResourceError(f"spec.checkpoint.path {path!r}: give a path without '..'")
    if p.is_absolute():
        if str(p) == "/":
            raise ResourceError("spec.checkpoint.path '/': give a directory")
        return CheckpointLocation(None, str(p), str(p))
    return CheckpointLocation(None, CHECKPOINT_ROOT, f"{CHECKPOINT_ROOT}/{p}")


#: `job.pipeline.train_config` keys -> `autopar train` options ("flag": takes the value; "switch":
#: store_true; None: not an option).  A key missing here is an error, so a new key of
#: train_config cannot be silently dropped from the trainer pods.
TRAIN_FLAGS: dict[str, tuple[str | None, str]] = {
    "model": ("--model", "flag"),
    "model_options": ("--model-opt", "options"),
    "strategy": ("--strategy", "flag"),
    "nproc": (None, "torchrun"),            # under torchrun the world size is torchrun's
    "steps": ("--steps", "flag"),
    "dtype": ("--dtype", "flag"),
    "optimizer": ("--optimizer", "flag"),
    "lr": ("--lr", "flag"),
    "momentum": ("--momentum", "flag"),
    "seed": ("--seed", "flag"),
    "data": ("--data", "flag"),
    "checkpoint_dir": ("--checkpoint-dir", "flag"),
    "checkpoint_every": ("--checkpoint-every", "flag"),
    "checkpoint_final": ("--checkpoint-final", "switch"),
    "resume": ("--resume-if-present", "switch"),   # a restarted gang resumes when a checkpoint exists
    "topology": ("--topology", "flag"),
    "profile_cache": ("--profile-cache", "flag"),
    "trace": ("--trace", "flag"),
    "graceful_stop": (None, "default"),     # the CLI's default (set_defaults graceful_stop=True)
    "progress": (None, "default"),          # progress bars: off in a pod (log lines)
    "log": (None, "default"),
    "metrics_port": ("--metrics-port", "flag"),
    "retime": ("--retime", "switch"),       # never set for a pod: the passes time CPUs, its ranks run on GPUs
}


def train_args(job: ParallelTrainingJob, *, strategy: str = PLAN_FILE, topology: str = TOPOLOGY_FILE,
               checkpoint_dir: str | None = None, resume: bool = False, metrics_port: int | None = None,
               device: str = "cuda") -> list[str]:
    """``autopar train`` options of the job, from `job.pipeline.train_config` (the local driver's
    mapping), so a trainer pod trains exactly what ``autopar run --local`` would."""
    from autopar.job.pipeline import Prepared, train_config

    # train_config reads the job, its model options and paths, not the model graph; relative data
    # paths resolve against the container's root.
    prepared = Prepared(job, PurePosixPath("/"), _model_options(job), graph=None)  # type: ignore[arg-type]
    cfg = train_config(prepared, strategy, topology=topology, checkpoint_dir=checkpoint_dir,
                       metrics_port=metrics_port, resume=resume)
    argv: list[str] = []
    for key, value in cfg.items():
        if key not in TRAIN_FLAGS:
            raise ResourceError(f"train_config key {key!r} has no `autopar train` option in TRAIN_FLAGS")
        flag, kind = TRAIN_FLAGS[key]
        if flag is None or value is None:
            continue
        if kind == "options":
            argv += model_option_args(value)
        elif kind == "switch":
            argv += [flag] if value else []
        elif key == "checkpoint_every" and not value:
            continue
        else:
            argv += [flag, format_option(value) if isinstance(value, float) else str(value)]
    return argv + ["--device", device, "--json"]


def trainer_serviceaccount(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    return _serviceaccount(job, uid, trainer_account_name(job), "trainer")


def progress_role(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    """Rank 0 (its progress sidecar) may read and patch this one job's status and post Events."""
    rules = [{"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [job.name],
              "verbs": ["get", "patch"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    return _role(job, uid, progress_role_name(job), "trainer", rules)


def progress_rolebinding(job: ParallelTrainingJob, uid: str) -> dict[str, Any]:
    return _rolebinding(job, uid, progress_role_name(job), "trainer", trainer_account_name(job))


def trainer_service(job: ParallelTrainingJob, uid: str, *, metrics_port: int = METRICS_PORT) -> dict[str, Any]:
    """Headless: each trainer pod gets ``<pod>.<service>.<ns>.svc`` (hostname + subdomain), before
    it is ready (publishNotReadyAddresses), which torchrun's rendezvous needs."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(job, uid, service_name(job), "trainer"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector_labels(job, "trainer"),
                     "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"},
                               {"name": "metrics", "port": metrics_port, "targetPort": "metrics",
                                "protocol": "TCP"}]}}


def torchrun_args(job: ParallelTrainingJob, node_rank: int, nnodes: int, nproc_per_node: int) -> list[str]:
    """torchrun's static rendezvous on rank 0's pod; no restarts inside the pod (the operator
    replaces pods, up to runPolicy.backoffLimit)."""
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--node-rank", str(node_rank), "--master-addr", master_addr(job), "--master-port", str(RDZV_PORT),
            "--max-restarts", "0", "-m", "autopar.cli", "train"]


def trainer_pod(job: ParallelTrainingJob, uid: str, node_rank: int, node_name: str | None, image: str, *,
                nnodes: int | None = None, nproc_per_node: int | None = None,
                plan_configmap: str | None = None, plan_key: str = PLAN_KEY, plan_text_hash: str | None = None,
                restart_count: int = 0, resume: bool | None = None, device: str = "cuda",
                gpu_resource: str | None = GPU_RESOURCE, resources: dict[str, Any] | None = None,
                profile_cache_claim: str | None = None, metrics_port: int = METRICS_PORT,
                progress_sidecar: bool = True, shm_size: str = "8Gi",
                termination_grace_seconds: int = 120, image_pull_policy: str = DEFAULT_IMAGE_PULL_POLICY,
                image_pull_secrets: list[str] | None = None) -> dict[str, Any]:
    """Trainer pod `node_rank` of `nnodes` (default: devices.nodes), on node `node_name` (the node
    the plan's device ids name: a required node affinity; None: wherever the scheduler likes).

    `plan_configmap`/`plan_key`: where the plan is (default ``<job>-plan``/plan.yaml; a pinned
    job's planRef.configMap/key); it is mounted read-only at PLAN_FILE.  `restart_count` labels the
    pod and, unless `resume` says otherwise, makes it resume from the latest checkpoint (``autopar
    train --resume`` fails when there is none: pass resume=False then).  Rank 0 also serves the
    metrics port and, with `progress_sidecar`, runs ``autopar operator report-progress`` as a
    native sidecar with the ServiceAccount token (the other ranks get no token)."""
    spec = job.spec
    nnodes = spec.devices.nodes if nnodes is None else nnodes
    nproc = spec.devices.gpus_per_node if nproc_per_node is None else nproc_per_node
    if not 0 <= node_rank < nnodes:
        raise ResourceError(f"job {job.name!r}: node rank {node_rank} is not in 0..{nnodes - 1}")
    if nproc < 1:
        raise ResourceError(f"job {job.name!r}: nproc_per_node must be at least 1, got {nproc}")
    img = _image(job, image)
    rank0 = node_rank == 0
    ckpt = checkpoint_location(job)
    resume = restart_count > 0 if resume is None else resume
    command = torchrun_args(job, node_rank, nnodes, nproc) + train_args(
        job, checkpoint_dir=ckpt.directory, resume=resume, metrics_port=metrics_port if rank0 else None,
        device=device)
    env = _common_env(job, uid) + [
        {"name": "MASTER_ADDR", "value": master_addr(job)},
        {"name": "MASTER_PORT", "value": str(RDZV_PORT)},
        {"name": "WORLD_SIZE", "value": str(nnodes * nproc)},
        {"name": "RANK", "value": str(node_rank)},
        {"name": "PET_MASTER_ADDR", "value": master_addr(job)},
        {"name": "PET_MASTER_PORT", "value": str(RDZV_PORT)},
        {"name": "PET_NNODES", "value": str(nnodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
        {"name": "PET_NODE_RANK", "value": str(node_rank)},
        {"name": "AUTOPAR_RESTART_COUNT", "value": str(restart_count)},
    ]
    if rank0:
        env += [{"name": "AUTOPAR_METRICS_PORT", "value": str(metrics_port)},
                {"name": "AUTOPAR_METRICS_ADDR", "value": "0.0.0.0"}]
        if progress_sidecar:
            env.append({"name": "AUTOPAR_METRICS_LINGER", "value": f"{METRICS_LINGER_S:g}"})
    mounts = [{"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
              {"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True},
              {"name": "checkpoints", "mountPath": ckpt.mount_path},
              {"name": "profile-cache", "mountPath": CACHE_DIR},
              {"name": "dshm", "mountPath": SHM_DIR},
              {"name": "tmp", "mountPath": "/tmp"}]
    res = {k: dict(v) for k, v in (resources or {}).items()}
    if gpu_resource:
        res.setdefault("limits", {})[gpu_resource] = spec.devices.gpus_per_node
    container: dict[str, Any] = {
        "name": "trainer", "image": img, "imagePullPolicy": image_pull_policy,
        "command": command[:1], "args": command[1:], "env": env, "volumeMounts": mounts,
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
        "securityContext": container_security_context()}
    if rank0:
        container["ports"].append({"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"})
    if res:
        container["resources"] = res
    plan_cm = plan_configmap or plan_configmap_name(job)
    volumes = [{"name": "plan", "configMap": {"name": plan_cm, "items": [{"key": plan_key, "path": PLAN_KEY}]}},
               {"name": "topology", "configMap": {"name": topology_configmap_name(job),
                                                  "items": [{"key": TOPOLOGY_KEY, "path": TOPOLOGY_KEY}]}},
               ({"name": "checkpoints", "persistentVolumeClaim": {"claimName": ckpt.claim}} if ckpt.claim
                else {"name": "checkpoints", "emptyDir": {}}),
               _cache_volume(profile_cache_claim),
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
               {"name": "tmp", "emptyDir": {}}]
    name = trainer_pod_name(job, node_rank)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": service_name(job),
        "serviceAccountName": trainer_account_name(job),
        "automountServiceAccountToken": rank0 and progress_sidecar,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
    }
    if rank0 and progress_sidecar:
        report = ["autopar", "operator", "report-progress", "--job", job.name, "--namespace", "$(POD_NAMESPACE)",
                  "--metrics-url", f"http://127.0.0.1:{metrics_port}/metrics", "--interval", f"{PROGRESS_INTERVAL_S:g}"]
        pod_spec["initContainers"] = [{
            "name": "progress", "image": img, "imagePullPolicy": image_pull_policy, "restartPolicy": "Always",
            "command": report[:1], "args": report[1:], "env": _common_env(job, uid),
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            "securityContext": container_security_context()}]
    if spec.devices.node_selector:
        pod_spec["nodeSelector"] = dict(spec.devices.node_selector)
    if node_name:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node_name]}]}]}}}
    tolerations = _tolerations(job)
    if gpu_resource and not any(t.get("key") == gpu_resource and t.get("operator") == "Exists"
                                and t.get("effect") in (None, "NoSchedule") for t in tolerations):
        # GPU nodes are tainted nvidia.com/gpu:NoSchedule (GKE does it; so do most operators);
        # the ExtendedResourceToleration admission plugin adds this where it is enabled.
        tolerations.append({"key": gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.run_policy.scheduler_name:
        pod_spec["schedulerName"] = spec.run_policy.scheduler_name
    if spec.run_policy.priority_class_name:
        pod_spec["priorityClassName"] = spec.run_policy.priority_class_name
    if image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in image_pull_secrets]

    extra = {LABEL_NODE_RANK: str(node_rank), LABEL_RESTART: str(restart_count)}
    annotations: dict[str, str] = {}
    if node_name:
        annotations[ANN_NODE] = node_name
    if plan_text_hash:
        annotations[ANN_PLAN_HASH] = plan_text_hash
    if spec.run_policy.queue_name:
        # Kueue's plain-pod integration: one pod group per job, admitted as a whole.
        extra[KUEUE_QUEUE] = spec.run_policy.queue_name
        extra[KUEUE_POD_GROUP] = job.name
        annotations[KUEUE_POD_GROUP_COUNT] = str(nnodes)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(job, uid, name, "trainer", extra_labels=extra, annotations=annotations or None),
            "spec": pod_spec}


def trainer_pods(job: ParallelTrainingJob, uid: str, node_names: list[str | None], image: str,
                 **kw: Any) -> list[dict[str, Any]]:
    """One trainer pod per entry of `node_names` (node rank = index)."""
    return [trainer_pod(job, uid, r, n, image, nnodes=len(node_names), **kw) for r, n in enumerate(node_names)]


# -- RBAC -----------------------------------------------------------------------------------------

def _serviceaccount(job: ParallelTrainingJob, uid: str, name: str, component: str) -> dict[str, Any]:
    """No token by default: the pods that need one (planner, rank 0) ask for it."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, uid, name, component),
            "automountServiceAccountToken": False}


def _role(job: ParallelTrainingJob, uid: str, name: str, component: str, rules: list[dict]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(job, uid, name, component), "rules": rules}


def _rolebinding(job: ParallelTrainingJob, uid: str, role: str, component: str, account: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(job, uid, role, component),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": job.metadata.namespace}]}


# -- events ---------------------------------------------------------------------------------------

EVENT_TYPES = ("Normal", "Warning")


def event(job: ParallelTrainingJob, uid: str, reason: str, message: str, type: str = "Normal", *,
          now: datetime | None = None, component: str = MANAGER, instance: str | None = None) -> dict[str, Any]:
    """A core/v1 Event about the job (what `kubectl describe ptj` shows).  Its name is the job's
    plus a hash of the uid, reason, message and time, so the same event built twice is one object."""
    if type not in EVENT_TYPES:
        raise ResourceError(f"event type {type!r}: choose Normal or Warning")
    if not reason or len(reason) > 128:
        raise ResourceError(f"event reason {reason!r}: give a CamelCase word of at most 128 characters")
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(microsecond=0)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    message = message if len(message) <= 1024 else message[:1021] + "..."
    name = f"{job.name}.{short_hash(f'{uid}/{reason}/{message}/{stamp}', 16)}"
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": job.metadata.namespace,
                         "labels": {LABEL_NAME: "autopar", LABEL_INSTANCE: job.name, LABEL_JOB: job.name}},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": job.name,
                               "namespace": job.metadata.namespace, "uid": uid},
            "reason": reason, "message": message, "type": type,
            "source": {"component": component},
            "reportingComponent": f"{GROUP}/operator", "reportingInstance": instance or component,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}


__all__ = [
    "CACHE_DIR", "CHECKPOINT_ROOT", "CheckpointLocation", "METRICS_PORT", "PLAN_FILE", "PLAN_KEY", "RDZV_PORT",
    "ResourceError", "TOPOLOGY_FILE", "TOPOLOGY_KEY", "TRAIN_FLAGS", "checkpoint_location", "child_name", "event",
    "labels", "master_addr", "owner_reference", "plan_args", "plan_configmap", "plan_configmap_name",
    "plan_configmap_patch", "plan_hash", "planner_job", "planner_role", "planner_rolebinding",
    "planner_serviceaccount", "progress_role", "progress_rolebinding", "selector_labels", "service_name",
    "topology_configmap", "topology_configmap_name", "torchrun_args", "train_args", "trainer_pod",
    "trainer_pod_name", "trainer_pods", "trainer_service", "trainer_serviceaccount",
]
