"""What the operator's pods run against the API server, with their own ServiceAccount's token.

- ``autopar operator publish-plan`` (`publish_plan`): the planner pod's second container.  It checks
  that the file the search wrote is a plan document, then merge-patches it into the placeholder
  ConfigMap ``<job>-plan`` (`resources.plan_configmap_patch`: data plan.yaml, annotations
  plan-state Ready, plan-hash, topology-fingerprint).  The planner's Role allows get/patch of that
  one ConfigMap, so a wrong name is a 403, and a deleted job (its ConfigMap collected) a 404.
- ``autopar operator report-progress`` (`report_progress`): rank 0's native sidecar.  Every
  `interval` seconds it scrapes the trainer's Prometheus endpoint (`autopar.trainer` StepMetrics:
  ``autopar_trainer_steps_total``, the ``autopar_trainer_step_seconds`` histogram,
  ``autopar_trainer_predicted_step_seconds``) and merge-patches the job's status subresource with
  `status.progress_fields` when they changed.  The measured step is the mean over the steps since
  the previous scrape (the histogram's sum and count differences), so warm-up steps fade out; on
  the first scrape, the mean of all steps so far.  Before the trainer serves metrics the sidecar
  waits (a native sidecar starts first, and the kubelet stops it when the trainer exits); once
  the endpoint has answered and then stays gone for `gone_after` seconds, the trainer has
  stopped: exit 0.  SIGTERM (`stop`) ends it at once, with status 0.

Errors are one line: a 403 or 404 names the object and the Role that should allow the request
and ends the command (exit status 3 for report-progress, `KubeError` for publish-plan); other
API errors (the server restarting, 429, 5xx) are retried.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autopar.job.spec import GROUP, PLURAL, VERSION
from autopar.planner.errors import AutoparError
from autopar.planner.plan_file import read_plan

from .kube import KubeClient, KubeError, resource_path
from .resources import ANN_PLAN_HASH, PROGRESS_INTERVAL_S, plan_configmap_patch, plan_hash
from .status import progress_fields

log = logging.getLogger("autopar.operator.podside")

METRIC_STEPS = "autopar_trainer_steps"                       # a counter: samples are ..._total
METRIC_STEP = "autopar_trainer_step"                         # a gauge: the step from the start of training
METRIC_STEP_SECONDS = "autopar_trainer_step_seconds"         # a histogram: ..._sum, ..._count
METRIC_PREDICTED = "autopar_trainer_predicted_step_seconds"  # a gauge (0 when the plan had none)
METRIC_LOSS = "autopar_trainer_loss"
#: API statuses that no retry fixes: the command ends.
FATAL = (400, 403, 404, 422)
#: Exit statuses of report_progress.
EXIT_OK, EXIT_NOTHING, EXIT_REFUSED = 0, 1, 3


class PodsideError(AutoparError):
    """A pod-side command that cannot do its job (the message says why)."""


# -- publish-plan ---------------------------------------------------------------------------------

def publish_plan(client: KubeClient, namespace: str, config_map: str, plan_path: str | Path,
                 topology_fingerprint: str | None = None, *, retries: int = 4, backoff: float = 1.0) -> str:
    """Patch the plan file into ConfigMap `namespace/config_map`; returns the plan's hash.

    Raises `PlanFileError` for a file that is not a plan document, `ResourceError` for one too
    large for a ConfigMap, `KubeError` when the API server refuses (after `retries` tries for
    errors that may pass)."""
    path = Path(plan_path)
    read_plan(path)                                   # a plan document, or PlanFileError
    text = path.read_text()
    patch = plan_configmap_patch(text, topology_fingerprint=topology_fingerprint)
    digest = plan_hash(text)
    where = resource_path(namespace, "configmaps", config_map)
    what = f"publishing the plan to configmap {namespace}/{config_map}"
    try:
        out = _retrying(lambda: client.patch(where, patch, "merge"), retries, backoff, what)
    except KubeError as e:
        raise e.context(what, _hint(e, f"the planner's Role allows get/patch of configmap {config_map} only",
                                    f"the operator creates configmap {config_map} before the planner runs; "
                                    "was the job deleted?")) from None
    got = ((out or {}).get("metadata") or {}).get("annotations", {}).get(ANN_PLAN_HASH)
    if got != digest:
        raise PodsideError(f"{what}: the API server answered with plan hash {got!r}, expected {digest}")
    return digest


# -- report-progress ------------------------------------------------------------------------------

@dataclass
class Scrape:
    """The trainer's numbers at one scrape (sums over label sets: one per trainer process)."""

    steps: int
    seconds_sum: float
    seconds_count: float
    predicted: float | None
    loss: float | None = None
    step: int | None = None        # autopar_trainer_step: counted from the start of training


def parse_metrics(text: str) -> Scrape:
    """The trainer's metrics from Prometheus text exposition; PodsideError when it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    steps = ssum = scount = 0.0
    step: float | None = None           # the step number from the start of training (resumes included)
    predicted: float | None = None
    loss: float | None = None
    seen = False
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        raise PodsideError(f"the metrics are not Prometheus text exposition ({e})") from e
    for fam in families:
        for s in fam.samples:
            if s.name == f"{METRIC_STEPS}_total":
                steps += s.value
                seen = True
            elif s.name == METRIC_STEP and math.isfinite(s.value):
                step = max(step or 0.0, s.value)
            elif s.name == f"{METRIC_STEP_SECONDS}_sum":
                ssum += s.value
            elif s.name == f"{METRIC_STEP_SECONDS}_count":
                scount += s.value
            elif s.name == METRIC_PREDICTED and s.value > 0 and math.isfinite(s.value):
                predicted = s.value
            elif s.name == METRIC_LOSS and math.isfinite(s.value):
                loss = s.value
    if not seen:
        raise PodsideError(f"the metrics have no {METRIC_STEPS}_total: not an autopar trainer's endpoint")
    return Scrape(int(steps), ssum, scount, predicted, loss, int(step) if step is not None else None)


def step_seconds(now: Scrape, before: Scrape | None) -> float | None:
    """The mean step time since `before` (all steps when None or when the counters went back)."""
    if before is not None and now.seconds_count > before.seconds_count and now.seconds_sum >= before.seconds_sum:
        return (now.seconds_sum - before.seconds_sum) / (now.seconds_count - before.seconds_count)
    return now.seconds_sum / now.seconds_count if now.seconds_count > 0 else None


def scrape(url: str, timeout: float = 5.0) -> Scrape:
    """GET the metrics; OSError when the endpoint does not answer, PodsideError when it is not the trainer's."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse_metrics(resp.read().decode("utf-8", "replace"))


def report_progress(client: KubeClient, namespace: str, job: str, metrics_url: str,
                    interval: float = PROGRESS_INTERVAL_S,
                    once: bool = False, gone_after: float = 60.0, *, stop: threading.Event | None = None,
                    clock: Callable[[], float] = time.monotonic) -> int:
    """Scrape `metrics_url` and patch job `namespace/job`'s status until the trainer stops; the
    exit status: 0 (the trainer stopped, or `once` reported), 1 (`once` and nothing to report),
    3 (the API server refused: no permission or no such job)."""
    stop = stop or threading.Event()
    where = resource_path(namespace, PLURAL, job, group=GROUP, version=VERSION, subresource="status")
    before: Scrape | None = None
    last_fields: dict[str, Any] | None = None
    last_seen: float | None = None
    measured: float | None = None
    warned = False
    while True:
        try:
            now = scrape(metrics_url, timeout=max(1.0, min(interval, 10.0)))
        except (OSError, PodsideError) as e:
            why = e.reason if isinstance(e, urllib.error.URLError) else e
            if once:
                log.error("report-progress: no metrics from %s (%s)", metrics_url, why)
                return EXIT_NOTHING
            if last_seen is not None and clock() - last_seen >= gone_after:
                log.info("report-progress: %s gone for %.0f s: the trainer has stopped", metrics_url, gone_after)
                return EXIT_OK
            if last_seen is not None or not warned:
                log.info("report-progress: no metrics from %s yet (%s)", metrics_url, why)
                warned = True
        else:
            last_seen = clock()
            # A scrape that saw no step end since the last one keeps the last window: the mean of
            # every step so far (warm-up included) would replace it until the next step ended.
            fresh = before is None or (now.seconds_count, now.seconds_sum) != (before.seconds_count,
                                                                               before.seconds_sum)
            window = step_seconds(now, before) if fresh else None
            measured = window if window is not None else measured
            before = now
            fields = progress_fields(now.step if now.step is not None else now.steps, measured, now.predicted)
            if fields != last_fields:
                try:
                    client.patch(where, {"status": fields}, "merge")
                except KubeError as e:
                    if e.status in FATAL:
                        log.error("report-progress: %s", e.context(
                            f"patching the status of {PLURAL}/{job} in {namespace}",
                            _hint(e, f"the <job>-progress Role allows get/patch of {PLURAL}/status of {job} only",
                                  f"no {PLURAL} {job} in {namespace}: was the job deleted?")))
                        return EXIT_REFUSED
                    log.warning("report-progress: %s (will retry)", e)
                    if once:
                        return EXIT_NOTHING
                else:
                    last_fields = fields
                    log.info("report-progress: step %d, %s per step%s", fields["completedSteps"],
                             fields["actualStep"] or "?",
                             f", prediction error {fields['predictionError']:+.1%}"
                             if fields["predictionError"] is not None else "")
            if once:
                return EXIT_OK
        if stop.wait(interval):
            return EXIT_OK


# -- helpers --------------------------------------------------------------------------------------

def _hint(e: KubeError, forbidden: str, missing: str) -> str:
    return forbidden if e.status in (401, 403) else missing if e.status == 404 else ""


def _retrying(call: Callable[[], Any], retries: int, backoff: float, what: str) -> Any:
    """`call()`, again after `backoff`, 2×`backoff`, … while it fails with an error that may pass
    (unreachable, 409, 429, 5xx)."""
    for attempt in range(max(1, retries)):
        try:
            return call()
        except KubeError as e:
            passing = e.status == 0 or e.status in (409, 429) or e.status >= 500
            if not passing or attempt == retries - 1:
                raise
            log.warning("%s: %s; retrying", what, e)
            time.sleep(backoff * 2 ** attempt)
    raise AssertionError("unreachable")


# -- the CLI's side -------------------------------------------------------------------------------

def _setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="autopar: %(message)s")


def _namespace(args: Any, client: KubeClient) -> str:
    ns = getattr(args, "namespace", None) or client.namespace
    if not ns:
        raise PodsideError("no namespace: give --namespace (in a pod, $(POD_NAMESPACE))")
    return ns


def publish_plan_main(args: Any) -> int:
    """``autopar operator publish-plan``: args.plan, args.config_map, args.namespace,
    args.topology_fingerprint, args.kubeconfig, args.json."""
    _setup_logging()
    client = KubeClient.default(getattr(args, "kubeconfig", None))
    ns = _namespace(args, client)
    digest = publish_plan(client, ns, args.config_map, args.plan, args.topology_fingerprint)
    if getattr(args, "json", False):
        import json
        print(json.dumps({"configMap": args.config_map, "namespace": ns, "planHash": digest}))
    else:
        print(f"published {args.plan} to configmap {ns}/{args.config_map} ({digest})")
    return 0


def report_progress_main(args: Any) -> int:
    """``autopar operator report-progress``: args.job, args.namespace, args.metrics_url,
    args.interval, args.gone_after, args.once, args.kubeconfig.  SIGTERM stops it (status 0)."""
    import signal
    _setup_logging()
    client = KubeClient.default(getattr(args, "kubeconfig", None))
    ns = _namespace(args, client)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return report_progress(client, ns, args.job, args.metrics_url, interval=args.interval, once=args.once,
                           gone_after=args.gone_after, stop=stop)


__all__ = ["EXIT_NOTHING", "EXIT_OK", "EXIT_REFUSED", "PodsideError", "Scrape", "parse_metrics", "publish_plan",
           "publish_plan_main", "report_progress", "report_progress_main", "scrape", "step_seconds"]
