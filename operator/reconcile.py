"""What the operator does next for one job, decided from what it observes: a pure function.

    actions = reconcile(Observed(job=..., uid=..., status=..., nodes=..., pods=..., ...), settings)
    for a in actions: a.apply(client)           # the kopf handlers execute them (operator.handlers)

The operator is level-triggered: every call looks at the job's status and at the objects it owns
as they are now, and returns the actions that move the job one step along the pipeline of
`autopar.job.pipeline` — validate, topology, plan, train, report — which `autopar run --local`
drives in-process:

1. **finished** jobs only wait for ``ttlSecondsAfterFinished``, then are deleted;
2. **validate** what the schema cannot check (a zoo model's options); a bad spec fails for good;
3. **suspend** deletes the trainer pods and holds the job (Kueue's contract); resuming restarts
   them from the last checkpoint;
4. the **active deadline** fails the job and deletes its pods;
5. **topology**: the eligible nodes (`operator.discovery`) become the topology ConfigMap; too few
   nodes keep the job Pending with the reasons;
6. **plan**: a planner Job (owned by the job) writes the plan ConfigMap; a pinned plan skips it;
   a planner that fails ends the job with its reason;
7. **train**: the rendezvous Service and one trainer pod per chosen node; when every pod
   succeeds the job succeeds; when one fails, the whole gang restarts from the last checkpoint,
   up to ``backoffLimit``;
8. **re-plan** when the topology's fingerprint changes under a running job (a node lost, GPUs
   added, a link label changed): the trainers stop, a new plan is made for the new topology, and
   training resumes from the last checkpoint under it.

Every child has a deterministic name (`operator.resources`), so running the same decision twice
creates nothing twice (a create that meets 409 Conflict is done).
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import Any

from autopar.job.spec import ParallelTrainingJob

from . import resources as r
from .discovery import DiscoveryError, discover
from .status import FINISHED, is_true, plan_fields, transition


@dataclass(frozen=True)
class Action:
    """One thing to do: ``create`` an object, ``delete`` one (kind/name), ``status`` (merge patch
    of the job's status), ``event``, or ``delete_job`` (the TTL after finish)."""

    verb: str
    obj: dict[str, Any] | None = None
    kind: str | None = None
    name: str | None = None
    patch: dict[str, Any] | None = None

    def __repr__(self) -> str:
        what = self.name or (self.obj or {}).get("metadata", {}).get("name") or ""
        kind = self.kind or (self.obj or {}).get("kind") or ""
        return f"Action({self.verb} {kind} {what})".replace("  ", " ")


@dataclass
class Observed:
    """What the operator sees of one job: the job, its status, and what it owns."""

    job: ParallelTrainingJob
    uid: str
    generation: int = 1
    status: dict[str, Any] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    free_gpus: dict[str, int] | None = None
    topology_configmap: dict[str, Any] | None = None
    plan_configmap: dict[str, Any] | None = None
    planner_job: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    now: _dt.datetime = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc))
    #: filled in by `reconcile` when given: seconds spent on "discovery" (the operator's metric)
    timings: dict[str, float] | None = None


@dataclass(frozen=True)
class Settings:
    """The operator's settings (`autopar operator run`'s options): `image` for the trainer pods
    (a job's model.image wins), `planner_image` for the planner pods (default: `image`; the
    planner needs no CUDA, so a platform team can give it the small operator image)."""

    image: str = "ghcr.io/autopar/autopar:0.1.0"
    profile_cache_claim: str | None = None
    device: str = "cuda"
    planner_image: str | None = None


# -- helpers -------------------------------------------------------------------------------------

def _time(value: str | None) -> _dt.datetime | None:
    if not value:
        return None
    return _dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc)


def _stamp(obs: Observed) -> str:
    return obs.now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(obs: Observed, condition: str, reason: str, message: str, phase: str | None = None,
            **fields: Any) -> list[Action]:
    patch = transition(obs.status, condition, reason, message, phase=phase, generation=obs.generation,
                       at=_stamp(obs))
    patch.update(fields)
    obs.status.update(patch)     # a later transition in the same decision builds on this one
    event_type = "Warning" if condition in ("Failed", "Restarting", "Replanning") else "Normal"
    return [Action("status", patch=patch),
            Action("event", obj=r.event(obs.job, obs.uid, reason, message, event_type, now=obs.now))]


def _pod_phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _restart_label(pod: dict[str, Any]) -> int:
    return int((pod.get("metadata", {}).get("labels") or {}).get(r.LABEL_RESTART, "0"))


def _replacing(old: Any, new: Any) -> Any:
    """A JSON merge patch (RFC 7386) that turns `old` into `new`: keys `new` lacks become null, so
    a lost node does not linger in the status's nested maps."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out = {k: None for k in old if k not in new}
    out.update({k: _replacing(old.get(k), v) for k, v in new.items()})
    return out


def _pod_node(pod: dict[str, Any]) -> str | None:
    """The node a trainer pod was placed on: the one its plan named (or where it was scheduled)."""
    return (pod["metadata"].get("annotations") or {}).get(r.ANN_NODE) or (pod.get("spec") or {}).get("nodeName")


def _delete_pods(obs: Observed) -> list[Action]:
    return [Action("delete", kind="Pod", name=p["metadata"]["name"]) for p in obs.pods
            if not p.get("metadata", {}).get("deletionTimestamp")]


def validation_problem(job: ParallelTrainingJob) -> str | None:
    """What the schema could not check and the operator can: a zoo model's options.  A
    ``package.module:factory`` model lives in the job's image: its planner pod checks it."""
    from autopar.job.pipeline import checked_model_options
    from autopar.job.spec import JobSpecError
    try:
        checked_model_options(job)
    except JobSpecError as e:
        return str(e)
    return None


# -- the decision --------------------------------------------------------------------------------

def reconcile(obs: Observed, settings: Settings = Settings()) -> list[Action]:
    """The actions for `obs`, with the status changes merged into one patch (the last action)."""
    obs = Observed(**{**obs.__dict__, "status": dict(obs.status)})
    actions = _decide(obs, settings)
    patches = [a.patch for a in actions if a.verb == "status"]
    if not patches:
        return actions
    merged: dict[str, Any] = {}
    for p in patches:
        merged.update(p)
    return [a for a in actions if a.verb != "status"] + [Action("status", patch=merged)]


def _decide(obs: Observed, settings: Settings) -> list[Action]:
    job, status = obs.job, obs.status
    obs.pods = [p for p in obs.pods if (p.get("metadata", {}).get("labels") or {}).get(r.LABEL_COMPONENT)
                in (None, "trainer")]      # the trainers only (the planner's pod belongs to its Job)
    phase = status.get("phase") or "Pending"
    policy = job.spec.run_policy

    if phase in FINISHED:
        done = _time(status.get("completionTime"))
        ttl = policy.ttl_seconds_after_finished
        if ttl is not None and done is not None and (obs.now - done).total_seconds() >= ttl:
            return [Action("delete_job")]
        return _delete_pods(obs) if any(_pod_phase(p) in ("Pending", "Running") for p in obs.pods) else []

    problem = validation_problem(job)
    if problem is not None:
        return _status(obs, "Failed", "FailedValidation", f"{problem}; fix the spec and create the job again",
                       phase="Failed")

    if policy.suspend:
        if phase == "Suspended" and not obs.pods:
            return []
        return _delete_pods(obs) + (_status(obs, "Suspended", "Suspended", "suspended: the trainer pods are deleted; "
                                            "resuming restarts them from the last checkpoint", phase="Suspended")
                                    if phase != "Suspended" else [])

    started = _time(status.get("startTime"))
    if policy.active_deadline_seconds is not None and started is not None and \
            (obs.now - started).total_seconds() > policy.active_deadline_seconds:
        return _delete_pods(obs) + _status(obs, "Failed", "DeadlineExceeded",
                                           f"the job ran longer than runPolicy.activeDeadlineSeconds "
                                           f"({policy.active_deadline_seconds} s)", phase="Failed")

    # topology
    t0 = time.perf_counter()
    try:
        found = discover(obs.nodes, job.spec.devices, obs.free_gpus, name=f"{job.name}-topology")
    except DiscoveryError as e:
        if obs.timings is not None:
            obs.timings["discovery"] = time.perf_counter() - t0
        if phase == "Pending" and status.get("message") == str(e):
            return []
        return [Action("status", patch={"phase": "Pending", "message": str(e)})] if phase in ("Pending",) else \
            _delete_pods(obs) + _status(obs, "Replanning", "NodesLost", f"{e}; waiting for nodes", phase="Planning")
    if obs.timings is not None:
        obs.timings["discovery"] = time.perf_counter() - t0
    fingerprint = found.report.fingerprint
    topology = _replacing(status.get("topology"), found.report.summary())
    node_names = list(found.report.nodes)
    actions: list[Action] = []
    topo_fp = (obs.topology_configmap or {}).get("metadata", {}).get("annotations", {}).get(
        r.ANN_TOPOLOGY_FINGERPRINT)
    known_fp = status.get("topologyFingerprint")

    if obs.topology_configmap is None or topo_fp != fingerprint:
        if obs.topology_configmap is not None:
            actions.append(Action("delete", kind="ConfigMap", name=r.topology_configmap_name(job)))
        actions.append(Action("create", obj=r.topology_configmap(job, obs.uid, found.report.document, fingerprint)))

    replanning = known_fp is not None and known_fp != fingerprint
    pinned = job.spec.planner.algorithm == "pinned"
    if replanning:
        attempt = int(status.get("replans") or 0) + 1
        live = [p for p in obs.pods if not p["metadata"].get("deletionTimestamp")
                and _pod_phase(p) in ("Pending", "Running")]
        eligible = {n.name for n in found.selection.candidates}
        if phase == "Training" and live and all(_pod_node(p) in eligible for p in live):
            # the running plan still fits (all its nodes are still there): keep training; plan
            # again, and switch only to a plan faster by more than replanMargin
            if pinned:
                return actions + _status(
                    obs, "Planned", "PlanKept", "the topology changed but the pinned plan's nodes are all still "
                    "there: training continues", topologyFingerprint=fingerprint, topology=topology,
                    devices=_devices(found))
            return actions + _status(
                obs, "Replanning", "TopologyChanged",
                f"the topology changed ({len(node_names)} nodes now); planning again while training continues on the "
                f"current plan, which is replaced only by a plan more than {job.spec.planner.replan_margin:.0%} "
                "faster", phase="Training", topologyFingerprint=fingerprint, topology=topology,
                replans=attempt, devices=_devices(found), replanPending=True, keptPlanHash=None)
        return actions + _delete_pods(obs) + _status(
            obs, "Replanning", "TopologyChanged",
            f"the topology changed ({len(node_names)} nodes now); planning again, then training resumes from "
            "the last checkpoint", phase="Planning", topologyFingerprint=fingerprint,
            topology=topology, replans=attempt, devices=_devices(found),
            planHash=None, replanPending=None)

    if known_fp is None:
        actions += _status(obs, "Planning", "TopologyDiscovered",
                           f"{len(node_names)} node(s), {len(node_names) * job.spec.devices.gpus_per_node} GPU(s): "
                           + ", ".join(node_names), phase="Planning", topologyFingerprint=fingerprint,
                           topology=topology, devices=_devices(found))

    # plan
    attempt = int(status.get("replans") or 0)
    plan_cm = obs.plan_configmap
    plan_ready = plan_cm is not None and (plan_cm.get("metadata", {}).get("annotations") or {}).get(
        r.ANN_PLAN_STATE) == "Ready" and (plan_cm["metadata"]["annotations"].get(
            r.ANN_TOPOLOGY_FINGERPRINT) in (None, fingerprint))
    if pinned:
        plan_ready = True
    elif not plan_ready:
        if plan_cm is None:
            actions.append(Action("create", obj=r.plan_configmap(job, obs.uid, topology_fingerprint=fingerprint)))
        planner = obs.planner_job
        if planner is None:
            # with every planner Job its account, Role and binding (409 when they exist): one that
            # failed to be created is tried again rather than leaving the planner unable to publish
            actions += [Action("create", obj=r.planner_serviceaccount(job, obs.uid)),
                        Action("create", obj=r.planner_role(job, obs.uid)),
                        Action("create", obj=r.planner_rolebinding(job, obs.uid))]
            planner_image = settings.planner_image or settings.image
            actions.append(Action("create", obj=r.planner_job(job, obs.uid, planner_image,
                                                              topology_fingerprint=fingerprint, attempt=attempt,
                                                              profile_cache_claim=settings.profile_cache_claim)))
        elif any(c.get("type") == "Failed" and c.get("status") == "True"
                 for c in (planner.get("status") or {}).get("conditions") or []):
            reason = next((c.get("message") or c.get("reason") for c in planner["status"]["conditions"]
                           if c.get("type") == "Failed"), "the planner pod failed")
            actions += _status(obs, "Failed", "PlannerFailed", f"planning failed: {reason}; see the logs of job "
                                                               f"{planner['metadata']['name']}", phase="Failed")
        return actions

    current_hash = _current_plan_hash(plan_cm, pinned)
    if status.get("planHash") != current_hash and status.get("keptPlanHash") != current_hash:
        fields = _plan_status(job, plan_cm, pinned)
        running = [p for p in obs.pods if not p["metadata"].get("deletionTimestamp")
                   and _pod_phase(p) in ("Pending", "Running")]
        if status.get("replanPending") and running:
            return actions + _switch_or_keep(obs, fields, current_hash)
        actions += _status(obs, "Planned", "PlanReady",
                           f"plan {fields.get('strategy')!r}: simulated {fields.get('simulatedStep')} per step"
                           + (f", {fields['predictedSpeedup']} data parallelism" if fields.get("predictedSpeedup")
                              else ""), **fields)

    # train
    live = [p for p in obs.pods if not p["metadata"].get("deletionTimestamp")]
    # the pods' gang label is the truth when the status read lags behind them (a status patch the
    # watch has not brought back yet, or one that was lost after the pods were created)
    restarts = max([int(status.get("restarts") or 0)] + [_restart_label(p) for p in live])
    # a pod being deleted (an old gang stopping, or one on a lost node) has ended or is ending on
    # purpose, and so has an older gang's pod whose deletion the index does not show yet (its
    # peers died with the pod that failed): only a failure in the current gang restarts it
    current = [p for p in live if _restart_label(p) == restarts]
    failed = [p for p in current if _pod_phase(p) == "Failed"]
    older = [p for p in live if _restart_label(p) < restarts]
    terminating = [p for p in obs.pods if p["metadata"].get("deletionTimestamp")] + older
    if failed:
        if restarts >= policy.backoff_limit:
            return actions + _delete_pods(obs) + _status(
                obs, "Failed", "BackoffLimitExceeded",
                f"trainer pod {failed[0]['metadata']['name']} failed and the gang already restarted "
                f"{restarts} time(s) (runPolicy.backoffLimit {policy.backoff_limit})", phase="Failed")
        return actions + _delete_pods(obs) + _status(
            obs, "Restarting", "TrainerFailed",
            f"trainer pod {failed[0]['metadata']['name']} failed; restarting all {len(node_names)} from the last "
            f"checkpoint ({restarts + 1}/{policy.backoff_limit})", phase="Training", restarts=restarts + 1)
    if current and len(current) == len(node_names) and all(_pod_phase(p) == "Succeeded" for p in current):
        return actions + _status(obs, "Succeeded", "Completed",
                                 f"{job.spec.training.steps} steps on {len(node_names)} node(s)", phase="Succeeded")

    if obs.service is None:
        actions.append(Action("create", obj=r.trainer_service(job, obs.uid)))
    if not current and terminating:
        # the old gang still holds the pod names (and its checkpoints are being written): the new
        # one starts when the last old pod is gone (an older gang's pod still shown live is deleted
        # again: a repeated delete is harmless)
        return actions + [Action("delete", kind="Pod", name=p["metadata"]["name"]) for p in older]
    if not current:
        actions += [Action("create", obj=r.trainer_serviceaccount(job, obs.uid)),
                    Action("create", obj=r.progress_role(job, obs.uid)),
                    Action("create", obj=r.progress_rolebinding(job, obs.uid))]
        ref = job.spec.planner.plan_ref
        kw: dict[str, Any] = {"plan_configmap": ref.config_map, "plan_key": ref.key} if pinned and ref else {}
        # a gang that ran before (restarted, re-planned, suspended and resumed) resumes from the
        # latest checkpoint if there is one
        resume = restarts > 0 or int(status.get("replans") or 0) > 0 or any(
            c.get("type") == "Running" for c in status.get("conditions") or []) or None
        pods = r.trainer_pods(job, obs.uid, node_names, settings.image, restart_count=restarts,
                              resume=resume, device=settings.device,
                              profile_cache_claim=settings.profile_cache_claim, **kw)
        actions += [Action("create", obj=p) for p in pods]
        # a new gang reads the plan ConfigMap as it is now: a plan kept off while the old gang ran
        # is the one it trains
        switched = _plan_status(job, plan_cm, pinned) if status.get("keptPlanHash") == current_hash else {}
        if switched:
            switched["keptPlanHash"] = None
        if not is_true(obs.status, "Running") or restarts or switched:
            actions += _status(obs, "Running", "TrainersStarted",
                               f"{len(pods)} trainer pod(s) on {', '.join(node_names)}", phase="Training", **switched)
    return actions


def _switch_or_keep(obs: Observed, new: dict[str, Any], new_hash: str) -> list[Action]:
    """A plan made for a changed topology while the trainers kept running the old one: restart
    them under it from the last checkpoint if it is faster by more than replanMargin (FlexFlow's
    simulated step times compared, sec. 5), otherwise keep the running plan."""
    margin = obs.job.spec.planner.replan_margin
    old_s, new_s = obs.status.get("simulatedStepSeconds"), new.get("simulatedStepSeconds")
    old_show, new_show = obs.status.get("simulatedStep") or "?", new.get("simulatedStep") or "?"
    if old_s and new_s and new_s < old_s * (1.0 - margin):
        return _delete_pods(obs) + _status(
            obs, "Replanning", "FasterPlan",
            f"the new plan simulates {new_show} per step against {old_show} ({old_s / new_s:.2f}x, more than "
            f"replanMargin {margin:.0%}): the trainers restart from the last checkpoint under it", phase="Training",
            replanPending=None, **new)
    return _status(obs, "Planned", "PlanKept",
                   f"the new plan simulates {new_show} per step against the running plan's {old_show}: not faster "
                   f"by more than replanMargin {margin:.0%}, so training continues on the running plan",
                   replanPending=None, keptPlanHash=new_hash)


def _devices(found) -> str:
    products = found.report.summary().get("products") or {}
    return ", ".join(f"{n}x {p}" for p, n in products.items())


def _current_plan_hash(plan_cm: dict[str, Any] | None, pinned: bool) -> str:
    if pinned:
        return "pinned"
    text = ((plan_cm or {}).get("data") or {}).get(r.PLAN_KEY, "")
    return r.plan_hash(text) if text else ""


def _plan_status(job: ParallelTrainingJob, plan_cm: dict[str, Any] | None, pinned: bool) -> dict[str, Any]:
    """The plan's numbers from the plan file in the ConfigMap (what the search predicted)."""
    import yaml
    data = (plan_cm or {}).get("data") or {}
    text = data.get(r.PLAN_KEY, "")
    doc = yaml.safe_load(text) if text else {}
    predicted = (doc or {}).get("predicted") or {}
    search = (doc or {}).get("search") or {}
    return plan_fields(float(predicted.get("stepSeconds") or 0.0) or None,
                       (predicted.get("baselines") or {}).get("data-parallel"),
                       strategy=((doc or {}).get("metadata") or {}).get("name", "plan"),
                       config_map=(plan_cm or {}).get("metadata", {}).get("name", r.plan_configmap_name(job)),
                       plan_hash=_current_plan_hash(plan_cm, pinned),
                       search_seconds=search.get("seconds"), algorithm=job.spec.planner.algorithm)
