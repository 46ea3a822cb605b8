"""The operator's Prometheus metrics and its health endpoint.

    metrics = OperatorMetrics()
    metrics.observe_job("team-a", "quickstart", status)     # after every status write
    server = metrics.serve(8080)                           # /metrics, /healthz, /readyz

Per job (labels ``namespace``, ``job``; the names `autopar.job.metrics` defines for both drivers):
``autopar_job_simulated_step_seconds``, ``autopar_job_actual_step_seconds``,
``autopar_job_prediction_error`` (simulated / measured - 1), ``autopar_job_predicted_speedup``,
``autopar_job_data_parallel_step_seconds``, ``autopar_job_completed_steps``,
``autopar_job_restarts_total``, ``autopar_job_replans_total``, and ``autopar_job_phase``
(label ``phase`` too: 1 for the job's current phase, 0 for the others, as kube-state-metrics'
``kube_pod_status_phase``).  Operator-wide: ``autopar_jobs`` by phase,
``autopar_plan_search_seconds`` (a histogram of planner searches),
``autopar_topology_discovery_seconds`` (a histogram of the topology discovery each reconcile
runs over the nodes) and ``autopar_handler_errors_total`` by handler.  A job's series go away
when the job does (`forget_job`), so a dashboard never shows a deleted job's last value as current.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from autopar.job.metrics import JOB_GAUGES, JOB_LABELS, SPEEDUP_GAUGE
from autopar.job.spec import PHASES

DISCOVERY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.gauges = {field: Gauge(name, help_text, JOB_LABELS, registry=r)
                       for field, (name, help_text) in JOB_GAUGES.items()}
        self.speedup = Gauge(*SPEEDUP_GAUGE, JOB_LABELS, registry=r)
        self.restarts = Counter("autopar_job_restarts", "gang restarts of the job's trainers", JOB_LABELS, registry=r)
        self.replans = Counter("autopar_job_replans", "times the job was planned again", JOB_LABELS, registry=r)
        self.jobs = Gauge("autopar_jobs", "jobs by phase", ("phase",), registry=r)
        self.search = Histogram("autopar_plan_search_seconds", "wall time of a plan search", registry=r,
                                buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800))
        self.errors = Counter("autopar_handler_errors", "handler errors", ("handler",), registry=r)
        self.phase = Gauge("autopar_job_phase", "1 for the job's current phase, 0 for the others",
                           (*JOB_LABELS, "phase"), registry=r)
        self.discovery = Histogram("autopar_topology_discovery_seconds",
                                   "wall time of one topology discovery over the nodes (one per reconcile)",
                                   registry=r, buckets=DISCOVERY_BUCKETS)
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        for phase in PHASES:
            self.jobs.labels(phase).set(0)

    def observe_job(self, namespace: str, name: str, status: dict[str, Any] | None) -> None:
        """Set the job's gauges from its status (camelCase, as stored) and count it by phase."""
        status = status or {}
        for field, gauge in self.gauges.items():
            value = status.get(field)
            if isinstance(value, (int, float)):
                gauge.labels(namespace, name).set(value)
        sim, dp = status.get("simulatedStepSeconds"), status.get("dataParallelStepSeconds")
        if sim and dp:
            self.speedup.labels(namespace, name).set(dp / sim)
        phase = status.get("phase")
        if phase in PHASES:
            with self._lock:
                before = self._phases.get((namespace, name))
                self._phases[(namespace, name)] = phase
                if before != phase:
                    for p in PHASES:
                        self.phase.labels(namespace, name, p).set(1 if p == phase else 0)
                    self._recount()

    def restarted(self, namespace: str, name: str) -> None:
        self.restarts.labels(namespace, name).inc()

    def replanned(self, namespace: str, name: str) -> None:
        self.replans.labels(namespace, name).inc()

    def searched(self, seconds: float) -> None:
        self.search.observe(seconds)

    def discovered(self, seconds: float) -> None:
        self.discovery.observe(seconds)

    def handler_failed(self, handler: str) -> None:
        self.errors.labels(handler).inc()

    def forget_job(self, namespace: str, name: str) -> None:
        """Remove every series of a deleted job."""
        for metric in (*self.gauges.values(), self.speedup, self.restarts, self.replans):
            try:
                metric.remove(namespace, name)
            except KeyError:
                pass
        with self._lock:
            self._phases.pop((namespace, name), None)
            for p in PHASES:
                try:
                    self.phase.remove(namespace, name, p)
                except KeyError:
                    pass
            self._recount()

    def _recount(self) -> None:
        counts = {phase: 0 for phase in PHASES}
        for phase in self._phases.values():
            counts[phase] += 1
        for phase, n in counts.items():
            self.jobs.labels(phase).set(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, address: str = "0.0.0.0", ready: Callable[[], bool] = lambda: True
              ) -> ThreadingHTTPServer:
        """Serve ``/metrics``, ``/healthz`` (the process answers) and ``/readyz`` (`ready()`: the
        operator watches the API server) on a daemon thread; port 0 picks a free one."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    ok = ready()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
                else:
                    self._send(404, b"not found: /metrics, /healthz or /readyz\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # probes every few seconds: keep the log quiet
                pass

        server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=server.serve_forever, name="autopar-metrics", daemon=True).start()
        return server
