"""The kopf operator: indexes of what the cluster holds, and one reconcile per job and tick.

    autopar operator run --namespace ml --image ghcr.io/you/autopar:0.1.0 --metrics-port 8080

kopf keeps in-memory indexes (`kopf.index`) of the nodes, of the GPUs pods hold on each node, and
of the objects each job owns (pods, ConfigMaps, Jobs, Services, found by the ``autopar.dev/job``
label), so a reconcile lists nothing.  A timer on every ParallelTrainingJob calls
`operator.reconcile.reconcile` with what the indexes hold and executes its actions through the
API server (`operator.kube.KubeClient`): creates (a 409 Conflict means already done), deletes
(background propagation), Events, and the status patch (kopf writes it to ``/status``).  The
decisions are idempotent, so a restarted operator picks up where the job is.

What keeps a tick short when many jobs arrive at once (``autopar bench operator``):

* the indexes are ``async`` handlers, so kopf runs them on its event loop instead of queueing
  every node heartbeat and pod event for the thread pool the ticks run in;
* a tick's independent creates go out together (`_execute_all`): first everything but the trainer
  pods (the pods need their ServiceAccount), then the pods; its Events after them, in order;
* `RecentCreates`: what this operator created in the last seconds is not POSTed again by a tick
  that runs before the watch has brought it into the index (it would only meet 409 Conflict);
  an entry goes when the index shows the object, when the operator deletes it, or after
  `RECENT_SECONDS` -- so a restarted operator, which remembers nothing, creates what is missing;
* ``MAX_WORKERS`` threads for the ticks instead of kopf's default (6 on two cores).

And what keeps it correct: a tick whose job body does not show the decision fields the previous
tick wrote (the watch lags behind kopf's status patch) does nothing (`StatusWrites`), so no step
is taken twice.

/readyz says 200 only once kopf has the initial listing of every index (`_indexes_complete`):
before that kopf handles no job, which with a thousand nodes takes seconds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from autopar.job.spec import GROUP, PLURAL, VERSION, ObjectMeta, ParallelTrainingJob, parse_job

from . import resources as r
from .discovery import NodeInfo, parse_node
from .kube import KubeClient, KubeError, resource_path
from .metrics import OperatorMetrics
from .reconcile import Action, Observed, Settings, reconcile
from .status import FINISHED, transition

TICK_SECONDS = 1.0
#: threads for the sync handlers (the ticks): each mostly waits on the API server; kopf's default
#: is min(32, CPUs + 4), 6 on two cores, which queues the jobs behind each other
MAX_WORKERS = 32
#: threads that send one tick's creates together (shared by all ticks)
REQUEST_WORKERS = 32
#: how long a create of this operator counts as done while the index does not show the object yet
RECENT_SECONDS = 15.0
#: the status fields a tick's decision rests on: a tick whose job body lacks what the previous tick
#: wrote to them waits for the watch to bring it (`StatusWrites`)
DECISION_FIELDS = ("phase", "restarts", "replans", "topologyFingerprint", "planHash")
#: how long a tick waits for its own status write before it takes the body as it is
CONSISTENCY_SECONDS = 10.0
#: kind -> (API group, version, plural) of what the operator creates
KINDS = {
    "ConfigMap": ("", "v1", "configmaps"), "Pod": ("", "v1", "pods"), "Service": ("", "v1", "services"),
    "ServiceAccount": ("", "v1", "serviceaccounts"), "Event": ("", "v1", "events"),
    "Job": ("batch", "v1", "jobs"), "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
}


class RecentCreates:
    """The objects this operator created in the last `ttl` seconds, by job uid, kind and name.

    The index learns of a created object only when the watch brings it, which under load takes
    longer than a tick: without this, the next tick POSTs the same children again (409 Conflict,
    a request the API server must still serve).  Only this process's memory: a restarted operator
    starts empty and creates what is missing, as before."""

    def __init__(self, ttl: float = RECENT_SECONDS, clock=time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._at: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def fresh(self, uid: str, kind: str, name: str) -> bool:
        """Created (or found existing) by this operator less than `ttl` seconds ago."""
        with self._lock:
            at = self._at.get((uid, kind, name))
            if at is None:
                return False
            if self.clock() - at >= self.ttl:
                del self._at[(uid, kind, name)]
                return False
            return True

    def remember(self, uid: str, kind: str, name: str) -> None:
        with self._lock:
            now = self.clock()
            if len(self._at) > 4096:        # old entries of jobs gone without a tick to clear them
                for key in [k for k, at in self._at.items() if now - at >= self.ttl]:
                    del self._at[key]
            self._at[(uid, kind, name)] = now

    def forget(self, uid: str, kind: str, name: str) -> None:
        with self._lock:
            self._at.pop((uid, kind, name), None)

    def seen(self, uid: str, kind: str, names) -> None:
        """The index shows these objects: no need to remember them any more (if one goes away
        later, e.g. the gang's pods are deleted, the next create is sent at once)."""
        with self._lock:
            for name in names:
                self._at.pop((uid, kind, name), None)

    def forget_job(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._at if k[0] == uid]:
                del self._at[key]

    def __len__(self) -> int:
        return len(self._at)


class StatusWrites:
    """The decision fields each job's last tick wrote to its status, until the job body shows them.

    kopf hands a timer the body its watch last delivered, and writes a tick's status patch after
    the tick returns: the next tick, a second later, can still see the status from before it.
    Deciding on that would do the last step again -- a gang failure counted twice, a second
    planner for the same topology change.  So a tick whose body lacks the previous tick's values
    does nothing; after `timeout` seconds (a patch that never landed, or someone else changed the
    status) the body is taken as it is."""

    def __init__(self, timeout: float = CONSISTENCY_SECONDS, clock=time.monotonic) -> None:
        self.timeout, self.clock = timeout, clock
        self._written: dict[str, tuple[dict[str, Any], float]] = {}

    def wrote(self, uid: str, patch: dict[str, Any]) -> None:
        fields = {k: patch[k] for k in DECISION_FIELDS if k in patch}
        if fields:
            self._written[uid] = (fields, self.clock())

    def lagging(self, uid: str, status: dict[str, Any]) -> bool:
        """True while `status` lacks the last write and it is recent."""
        entry = self._written.get(uid)
        if entry is None:
            return False
        fields, at = entry
        if all(status.get(k) == v for k, v in fields.items()) or self.clock() - at >= self.timeout:
            del self._written[uid]
            return False
        return True

    def forget(self, uid: str) -> None:
        self._written.pop(uid, None)


@dataclass
class Runtime:
    """What the handlers share: the API client, the settings, the metrics, what was just created."""

    client: KubeClient | None = None
    settings: Settings = field(default_factory=Settings)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    ready: threading.Event = field(default_factory=threading.Event)
    recent: RecentCreates = field(default_factory=RecentCreates)
    writes: StatusWrites = field(default_factory=StatusWrites)


RUNTIME = Runtime()
log = logging.getLogger("autopar.operator")
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(REQUEST_WORKERS, thread_name_prefix="autopar-request")
        return _POOL


def _plain(body: Any) -> Any:
    """A kopf body (mappings and sequences of views) as plain dicts and lists."""
    if hasattr(body, "items"):
        return {k: _plain(v) for k, v in body.items()}
    if isinstance(body, (list, tuple)):
        return [_plain(v) for v in body]
    return body


# -- indexes -------------------------------------------------------------------------------------

@kopf.index("nodes")
async def nodes_index(body, **_):
    """What discovery reads of each node (`NodeInfo`), parsed once per node event: every tick of
    every job reads all nodes, and a whole Node object (managedFields, images, conditions) is
    several times larger than what autopar uses of it.  Only the fields `parse_node` reads are
    copied (kopf calls this on its event loop for every node heartbeat)."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    node = {"metadata": {"name": meta.get("name"), "labels": _plain(meta.get("labels") or {}),
                         "annotations": _plain(meta.get("annotations") or {})},
            "spec": {"taints": _plain(spec.get("taints") or []), "unschedulable": spec.get("unschedulable")},
            "status": {k: _plain(status.get(k)) for k in ("allocatable", "capacity", "conditions")
                       if status.get(k) is not None}}
    return {None: parse_node(node)}


@kopf.index("pods")
async def gpus_index(spec, status, labels, **_):
    """GPUs requested by live pods, by node (and the job that owns the pod, if one of ours)."""
    node = spec.get("nodeName")
    if not node or (status or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    gpus = 0
    for c in spec.get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = (c.get("resources") or {}).get("requests") or {}
        gpus += int(limits.get(r.GPU_RESOURCE) or requests.get(r.GPU_RESOURCE) or 0)
    return {node: (labels.get(r.LABEL_JOB), gpus)} if gpus else None


def _owned(kind: str):
    async def index(namespace, labels, body, **_):
        return {(namespace, labels[r.LABEL_JOB], kind): _plain(body)}
    return index


pods_index = kopf.index("pods", labels={r.LABEL_JOB: kopf.PRESENT, r.LABEL_COMPONENT: "trainer"},
                        id="pods_index")(_owned("Pod"))
configmaps_index = kopf.index("configmaps", labels={r.LABEL_JOB: kopf.PRESENT},
                              id="configmaps_index")(_owned("ConfigMap"))
jobs_index = kopf.index("batch", "v1", "jobs", labels={r.LABEL_JOB: kopf.PRESENT}, id="jobs_index")(_owned("Job"))
services_index = kopf.index("services", labels={r.LABEL_JOB: kopf.PRESENT}, id="services_index")(_owned("Service"))


def _free_gpus(nodes: list[NodeInfo], gpus_index, job_name: str) -> dict[str, int]:
    """Allocatable GPUs per node minus those live pods hold (this job's own pods do not count)."""
    free = {}
    for node in nodes:
        used = sum(g for owner, g in gpus_index.get(node.name, []) if owner != job_name)
        free[node.name] = max(0, node.allocatable_gpus - used)
    return free


# -- the reconcile ---------------------------------------------------------------------------------

@kopf.on.login()
def login(**kwargs):
    """In a pod its ServiceAccount; elsewhere $KUBECONFIG (set from --kubeconfig)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_):
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="autopar.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="autopar.dev")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # a deleted job's timer stops within a tick, but kopf checks again only after
    # cancellation_polling (60 s by default) before it removes its finalizer: every deletion (TTL,
    # kubectl delete) would wait a minute for the garbage collector (tests/chart/test_rbac_audit.py)
    settings.background.cancellation_polling = TICK_SECONDS
    settings.execution.max_workers = MAX_WORKERS
    if RUNTIME.client is None:
        RUNTIME.client = KubeClient.default()


def _indexes_complete(**_) -> bool:
    """kopf runs no handler of any object until every index holds its initial listing (the
    nodes, the pods, the children): the first event that gets this far says the operator is
    ready (/readyz), i.e. a job created now is handled now.  A filter, not a handler: nothing
    runs, nothing is logged."""
    if not RUNTIME.ready.is_set():
        RUNTIME.ready.set()
    return False


@kopf.on.event("nodes", when=_indexes_complete)
async def indexes_complete(**_):
    """Never called (its filter says no): it makes the node events go as far as the handlers."""


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_SECONDS, idle=None)
def tick(name, namespace, uid, meta, spec, status, patch, nodes_index, gpus_index, pods_index, configmaps_index,
         jobs_index, services_index, **_):
    """Observe one job, decide, act."""
    try:
        job = parse_job({"apiVersion": f"{GROUP}/{VERSION}", "kind": "ParallelTrainingJob",
                         "metadata": {"name": name, "namespace": namespace}, "spec": _plain(spec)})
    except Exception as e:  # noqa: BLE001 - the API server validated it; report once instead of looping
        _unreadable(e, name, namespace, uid, meta, status, patch)
        return
    current = _plain(status) or {}
    if RUNTIME.writes.lagging(uid, current):
        return      # the watch has not brought the previous tick's status yet
    attempt = int(current.get("replans") or 0)

    def one(index, kind, child):
        for obj in index.get((namespace, name, kind), []):
            if obj["metadata"]["name"] == child:
                return obj
        return None

    nodes = list(nodes_index.get(None, []))
    obs = Observed(job=job, uid=uid, generation=int(meta.get("generation") or 1), status=current, nodes=nodes,
                   free_gpus=_free_gpus(nodes, gpus_index, name),
                   topology_configmap=one(configmaps_index, "ConfigMap", r.topology_configmap_name(job)),
                   plan_configmap=one(configmaps_index, "ConfigMap", r.plan_configmap_name(job)),
                   planner_job=one(jobs_index, "Job", r.planner_name(job, attempt)),
                   service=one(services_index, "Service", r.service_name(job)),
                   pods=list(pods_index.get((namespace, name, "Pod"), [])), timings={})
    recent = RUNTIME.recent
    for kind, objs in (("ConfigMap", configmaps_index.get((namespace, name, "ConfigMap"), [])),
                       ("Job", jobs_index.get((namespace, name, "Job"), [])),
                       ("Service", services_index.get((namespace, name, "Service"), [])),
                       ("Pod", obs.pods)):
        if objs:
            recent.seen(uid, kind, [o["metadata"]["name"] for o in objs])
    actions = reconcile(obs, RUNTIME.settings)
    if "discovery" in obs.timings:
        RUNTIME.metrics.discovered(obs.timings["discovery"])
    _execute_all(actions, namespace, name, uid, patch)
    written = next((a.patch for a in actions if a.verb == "status"), {})
    RUNTIME.writes.wrote(uid, written)
    merged = {**current, **written}
    RUNTIME.metrics.observe_job(namespace, name, merged)


def _create_key(action: Action) -> tuple[str, str]:
    return action.obj["kind"], action.obj["metadata"]["name"]


def _execute_all(actions: list[Action], namespace: str, name: str, uid: str, patch) -> None:
    """Execute one decision's actions.  Deletes and the status patch in their order; a run of
    creates together, what is neither a Pod nor a RoleBinding first (a Pod needs its
    ServiceAccount, a RoleBinding its Role), then the Pods and RoleBindings;
    the Events last, one after another in their order.  A create this operator made a moment
    ago (`RecentCreates`) is not sent again."""
    recent = RUNTIME.recent
    events: list[Action] = []
    batch: list[Action] = []

    def run(action: Action) -> None:
        try:
            _execute(action, namespace, name, patch)
            if action.verb == "create":
                recent.remember(uid, *_create_key(action))     # 201 Created or 409: it exists
        except KubeError as e:
            RUNTIME.metrics.handler_failed("tick")
            log.warning("job %s/%s: %r failed: %s", namespace, name, action, e)

    def together(group: list[Action]) -> None:
        if len(group) == 1:
            run(group[0])
        elif group:
            list(_pool().map(run, group))

    def flush() -> None:
        # a Pod needs its ServiceAccount, and a RoleBinding its Role: the API server's RBAC
        # escalation check looks the Role up, and without it answers 404 NotFound to an operator
        # that lacks the bind verb (the chart's ServiceAccount; an admin never sees it), and
        # reconcile does not send the create again (tests/chart/test_rbac_audit.py)
        second = ("Pod", "RoleBinding")
        together([a for a in batch if a.obj["kind"] not in second])
        together([a for a in batch if a.obj["kind"] in second])
        batch.clear()

    for action in actions:
        if action.verb == "event":
            events.append(action)
        elif action.verb == "create":
            if not recent.fresh(uid, *_create_key(action)):
                batch.append(action)
        else:
            flush()
            if action.verb == "delete":
                recent.forget(uid, action.kind, action.name)
            run(action)
    flush()
    for action in events:
        run(action)


def _unreadable(error: Exception, name: str, namespace: str, uid: str, meta, status, patch) -> None:
    """A spec the operator cannot read fails the job once, as a bad zoo option does in `reconcile`:
    the Failed condition, the phase, an Event; later ticks see phase Failed and do nothing."""
    current = _plain(status) or {}
    if current.get("phase") in FINISHED:
        return
    message = f"cannot read the spec: {error}; fix the spec and create the job again"
    for key, value in transition(current, "Failed", "FailedValidation", message, phase="Failed",
                                 generation=int(meta.get("generation") or 1)).items():
        patch.status[key] = value
    # the Event names the job only: a metadata without validation (the spec is what failed)
    who = ParallelTrainingJob.model_construct(metadata=ObjectMeta.model_construct(name=name, namespace=namespace))
    try:
        _execute(Action("event", obj=r.event(who, uid, "FailedValidation", message, "Warning")), namespace, name,
                 patch)
    except KubeError as e:
        RUNTIME.metrics.handler_failed("tick")
        log.warning("job %s/%s: the FailedValidation event failed: %s", namespace, name, e)


def _execute(action: Action, namespace: str, name: str, patch) -> None:
    client = RUNTIME.client
    if action.verb == "status":
        for key, value in action.patch.items():
            patch.status[key] = value
        if action.patch.get("restarts"):
            RUNTIME.metrics.restarted(namespace, name)
        if action.patch.get("replans"):
            RUNTIME.metrics.replanned(namespace, name)
        if action.patch.get("searchSeconds"):
            RUNTIME.metrics.searched(float(action.patch["searchSeconds"]))
        return
    if action.verb in ("create", "event"):
        group, version, plural = KINDS[action.obj["kind"]]
        try:
            client.post(resource_path(namespace, plural, group=group, version=version), action.obj)
        except KubeError as e:
            if e.status != 409:
                raise
        return
    if action.verb == "delete":
        group, version, plural = KINDS[action.kind]
        try:
            client.delete(resource_path(namespace, plural, action.name, group=group, version=version),
                          propagationPolicy="Background")
        except KubeError as e:
            if e.status != 404:
                raise
        return
    if action.verb == "delete_job":
        try:
            client.delete(resource_path(namespace, PLURAL, name, group=GROUP, version=VERSION),
                          propagationPolicy="Background")
        except KubeError as e:
            if e.status != 404:
                raise
        return
    raise ValueError(f"unknown action {action!r}")


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(name, namespace, uid, **_):
    """A deleted job's metrics go with it; its children go with the garbage collector.  (An
    ``on.event`` handler would spare the diff-base annotation kopf writes on every new job, but
    then kopf, left with only the timer, never takes its finalizer off a deleted job.)"""
    RUNTIME.metrics.forget_job(namespace, name)
    RUNTIME.recent.forget_job(uid)
    RUNTIME.writes.forget(uid)


def run(*, namespaces: list[str] | None = None, kubeconfig: str | None = None, image: str | None = None,
        profile_cache_claim: str | None = None, device: str = "cuda", metrics_port: int | None = 8080,
        metrics_address: str = "0.0.0.0", peering: str | None = None, planner_image: str | None = None,
        stop_flag: threading.Event | None = None,
        ready_flag: threading.Event | None = None) -> None:
    """`autopar operator run`: watch the given namespaces (all when none) until stopped.

    With `peering` several replicas share kopf's peering object of that name (cluster-wide
    ClusterKopfPeering, or a KopfPeering in each watched namespace) and only the one of highest
    priority handles; without it the operator is standalone and must be the only replica."""
    RUNTIME.client = KubeClient.default(kubeconfig)
    RUNTIME.settings = Settings(image=image or Settings().image, planner_image=planner_image,
                                profile_cache_claim=profile_cache_claim,
                                device=device)
    server = None
    if metrics_port is not None:
        server = RUNTIME.metrics.serve(metrics_port, metrics_address, ready=RUNTIME.ready.is_set)
        log.info("metrics on %s:%s", metrics_address, server.server_address[1])
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig   # kopf's login_with_kubeconfig reads it
    try:
        kopf.run(standalone=peering is None, peering_name=peering, clusterwide=not namespaces,
                 namespaces=namespaces or (), stop_flag=stop_flag, ready_flag=ready_flag)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
