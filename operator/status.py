"""The job's status as the operator writes it: phase, metav1 conditions, and the plan's and the
run's numbers in the form `kubectl get ptj` prints.

Pure functions over the status dict (``status`` of a ParallelTrainingJob, camelCase as stored):
each returns the merge patch to send, so a handler composes them and writes once.

Conditions follow metav1.Condition (type, status, reason, message, lastTransitionTime,
observedGeneration) and Kubeflow's training jobs: a transition sets its condition True and the
conditions it ends False; ``lastTransitionTime`` changes only when a condition's status does.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from autopar.job.spec import PHASES

#: The condition types, in the order a job meets them.
CONDITIONS = ("Planning", "Planned", "Running", "Restarting", "Replanning", "Suspended", "Succeeded", "Failed")
#: A phase and the condition that says so.
PHASE_CONDITION = {"Planning": "Planning", "Training": "Running", "Suspended": "Suspended",
                   "Succeeded": "Succeeded", "Failed": "Failed"}
#: Conditions a new one ends (set False).
ENDS = {
    "Planning": ("Planned", "Running", "Suspended"),
    "Planned": ("Planning", "Replanning"),
    "Running": ("Planning", "Restarting", "Replanning", "Suspended"),
    "Restarting": ("Running",),
    "Replanning": ("Planned", "Running"),
    "Suspended": ("Running", "Restarting"),
    "Succeeded": ("Planning", "Running", "Restarting", "Replanning"),
    "Failed": ("Planning", "Running", "Restarting", "Replanning"),
}
FINISHED = ("Succeeded", "Failed")


def now() -> str:
    """RFC 3339 in UTC, seconds precision (metav1.Time)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool, reason: str, message: str,
                  generation: int | None = None, at: str | None = None) -> list[dict[str, Any]]:
    """`conditions` with condition `type_` set; its lastTransitionTime moves only if its status changes."""
    if type_ not in CONDITIONS:
        raise ValueError(f"unknown condition type {type_!r}; known: {', '.join(CONDITIONS)}")
    value = "True" if status else "False"
    out, found = [], False
    for c in conditions or []:
        if c.get("type") == type_:
            found = True
            changed = c.get("status") != value
            c = {**c, "status": value, "reason": reason, "message": message,
                 "lastTransitionTime": (at or now()) if changed else c.get("lastTransitionTime") or (at or now())}
            if generation is not None:
                c["observedGeneration"] = generation
        out.append(c)
    if not found:
        c = {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": at or now()}
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    return sorted(out, key=lambda c: CONDITIONS.index(c["type"]) if c["type"] in CONDITIONS else len(CONDITIONS))


def transition(status: dict[str, Any] | None, condition: str, reason: str, message: str, *,
               phase: str | None = None, generation: int | None = None, at: str | None = None) -> dict[str, Any]:
    """The status patch for a transition: `condition` True (and those it ends False), the phase,
    the message; start and completion times when the job starts or finishes."""
    status = status or {}
    stamp = at or now()
    conditions = set_condition(status.get("conditions"), condition, True, reason, message, generation, stamp)
    for ended in ENDS.get(condition, ()):
        if any(c["type"] == ended and c["status"] == "True" for c in conditions):
            conditions = set_condition(conditions, ended, False, reason, message, generation, stamp)
    patch: dict[str, Any] = {"conditions": conditions, "message": message}
    if phase is not None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; known: {', '.join(PHASES)}")
        patch["phase"] = phase
        if phase != "Pending" and not status.get("startTime"):
            patch["startTime"] = stamp
        if phase in FINISHED and not status.get("completionTime"):
            patch["completionTime"] = stamp
    if generation is not None:
        patch["observedGeneration"] = generation
    return patch


def is_true(status: dict[str, Any] | None, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in (status or {}).get("conditions") or [])


def fmt_step(seconds: float | None) -> str | None:
    """A step time for the printer columns: ``64.3ms``, ``1.25s``, ``850us``."""
    if seconds is None:
        return None
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds * 1e6:.0f}us"


def plan_fields(predicted_s: float, data_parallel_s: float | None, *, strategy: str, config_map: str,
                plan_hash: str, search_seconds: float | None, algorithm: str) -> dict[str, Any]:
    """The status fields of a plan (simulated step, data parallelism, speedup, where the plan is)."""
    speedup = data_parallel_s / predicted_s if data_parallel_s and predicted_s else None
    return {"strategy": strategy, "planConfigMap": config_map, "planHash": plan_hash, "algorithm": algorithm,
            "simulatedStepSeconds": predicted_s, "simulatedStep": fmt_step(predicted_s),
            "dataParallelStepSeconds": data_parallel_s,
            "predictedSpeedup": f"{speedup:.2f}x" if speedup else None,
            "searchSeconds": search_seconds}


def progress_fields(step: int, measured_s: float | None, predicted_s: float | None) -> dict[str, Any]:
    """The status fields of a running job's progress (what rank 0 reports)."""
    error = predicted_s / measured_s - 1.0 if measured_s and predicted_s else None
    return {"completedSteps": step, "actualStepSeconds": measured_s, "actualStep": fmt_step(measured_s),
            "predictionError": round(error, 4) if error is not None else None}
