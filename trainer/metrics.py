"""Training metrics: a Prometheus endpoint on rank 0 and the numbers of the JSON summary.

`StepMetrics` exports, on its own registry (so several runs in one process never clash):

- ``autopar_trainer_step_seconds`` — histogram of measured step times (forward, backward,
  synchronization and optimizer step on rank 0);
- ``autopar_trainer_steps_total`` — counter of finished steps;
- ``autopar_trainer_loss`` and ``autopar_trainer_samples_per_second`` — gauges of the last step;
- ``autopar_trainer_predicted_step_seconds`` — the plan's simulated step time, for comparison
  (under ``--retime``, priced again after each pass over the plan's ops: `trainer.retime`).

``--metrics-port P`` serves them over HTTP (``prometheus_client.start_http_server``) on
``--metrics-addr`` (default ``$AUTOPAR_METRICS_ADDR``, else 127.0.0.1: a pod sets 0.0.0.0 so that
its Service reaches the port); port 0 picks a free port, which `port` reports.

A run can end between two scrapes: a job of a few seconds, or the last steps of any job, would
never be seen by whoever scrapes every few seconds (the operator's progress sidecar: 5 s), and
the job's status would lack its measured step.  ``--metrics-linger S`` (default
``$AUTOPAR_METRICS_LINGER``, else 0; a trainer pod with a progress sidecar sets it) keeps the
server up after the last step until a scrape has begun after it, for at most S seconds
(`StepMetrics.wait_scraped`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Step times on this machine range from milliseconds (small models) to tens of seconds.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: The address the metrics server binds when no --metrics-addr is given (a pod sets 0.0.0.0).
ADDR_ENV = "AUTOPAR_METRICS_ADDR"
DEFAULT_ADDR = "127.0.0.1"


def default_addr() -> str:
    """``$AUTOPAR_METRICS_ADDR`` when set (and not empty), else 127.0.0.1 (this machine only)."""
    return os.environ.get(ADDR_ENV, "").strip() or DEFAULT_ADDR


#: Seconds the metrics server waits after the last step for a scrape that sees it (--metrics-linger).
LINGER_ENV = "AUTOPAR_METRICS_LINGER"


def parse_seconds(text: str) -> float:
    """A finite number of seconds >= 0 from `text`; ValueError saying so otherwise."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{text!r} is not a number of seconds >= 0")
    return seconds


def default_linger() -> float:
    """``$AUTOPAR_METRICS_LINGER`` in seconds when set, else 0 (close at once).  A value that is
    not a number of seconds >= 0 is an error that names the variable."""
    text = os.environ.get(LINGER_ENV, "").strip()
    if not text:
        return 0.0
    try:
        return parse_seconds(text)
    except ValueError as e:
        raise ValueError(f"${LINGER_ENV}={e}; unset it or set e.g. 11") from None


class _ScrapeClock:
    """A collector of no metrics, registered before the others: each scrape collects it first and
    so notes how many steps had been recorded when the scrape began (every later collector of that
    scrape reports at least those)."""

    def __init__(self, recorded) -> None:
        self._recorded = recorded
        self.steps_seen = -1
        self.changed = threading.Condition()

    def describe(self):
        return []

    def collect(self):
        with self.changed:
            self.steps_seen = self._recorded()
            self.changed.notify_all()
        return iter(())


class StepMetrics:
    def __init__(self, model: str, strategy: str, predicted: float | None = None, port: int | None = None,
                 addr: str | None = None):
        self.registry = CollectorRegistry()
        self.times: list[float] = []
        self._scrapes = _ScrapeClock(lambda: len(self.times))
        self.registry.register(self._scrapes)
        labels = {"model": model, "strategy": strategy}
        names = list(labels)
        self.step_seconds = Histogram("autopar_trainer_step_seconds", "measured training step time",
                                      names, registry=self.registry, buckets=_BUCKETS).labels(**labels)
        self.steps = Counter("autopar_trainer_steps", "training steps finished", names,
                             registry=self.registry).labels(**labels)
        self.step = Gauge("autopar_trainer_step", "the last finished step, counted from the start of training "
                          "(a resumed run continues the count)", names, registry=self.registry).labels(**labels)
        self.loss = Gauge("autopar_trainer_loss", "loss of the last step", names, registry=self.registry).labels(**labels)
        self.throughput = Gauge("autopar_trainer_samples_per_second", "samples per second of the last step", names,
                                registry=self.registry).labels(**labels)
        self.predicted = Gauge("autopar_trainer_predicted_step_seconds", "the plan's simulated step time", names,
                               registry=self.registry).labels(**labels)
        if predicted is not None:
            self.predicted.set(predicted)
        self.port: int | None = None
        self.addr: str | None = None
        self._server = None
        if port is not None:
            self.addr = addr or default_addr()
            server, _thread = start_http_server(port, addr=self.addr, registry=self.registry)
            self._server = server
            self.port = server.server_address[1]
        self.losses: list[float] = []
        self.counted: list[bool] = []

    def record(self, seconds: float, loss: float, samples: int, traced: bool = False, step: int | None = None,
               settling: bool = False) -> None:
        """One finished step (`step`: its number from the start of training, 1-based); a `traced`
        step (under torch.profiler) and a `settling` one (right after `autopar train --retime` timed
        the plan's ops, `trainer.retime`) are kept out of `counted_times`."""
        self.step_seconds.observe(seconds)
        self.steps.inc()
        self.step.set(step if step is not None else len(self.times) + 1)
        self.loss.set(loss)
        self.throughput.set(samples / seconds if seconds > 0 else 0.0)
        self.times.append(seconds)
        self.losses.append(loss)
        self.counted.append(not (traced or settling))

    def counted_times(self) -> list[float]:
        """Step times without the profiler's overhead or a retiming pass's aftermath (all of them when
        nothing was traced or retimed)."""
        return [t for t, c in zip(self.times, self.counted) if c]

    def cv(self) -> float | None:
        """Coefficient of variation (stdev / mean) of the counted steps (`counted_times`) after the first."""
        times = (self.counted_times() or self.times)[1:]
        if len(times) < 2:
            return None
        mean = statistics.fmean(times)
        return statistics.stdev(times) / mean if mean > 0 else None

    def wait_scraped(self, timeout: float) -> bool:
        """Wait until a scrape of the server has begun after the last recorded step, at most
        `timeout` seconds; True once one has (at once when nothing serves or nothing was recorded)."""
        if self._server is None or not self.times:
            return True
        deadline = time.monotonic() + timeout
        with self._scrapes.changed:
            while self._scrapes.steps_seen < len(self.times):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._scrapes.changed.wait(left)
        return True

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def median_step(times: list[float]) -> float | None:
    """Median step time, leaving out the first step (allocation and warm-up) when there are others."""
    if not times:
        return None
    return statistics.median(times[1:] if len(times) > 1 else times)
