"""Measured steps as Chrome trace-event JSON: torch.profiler on every rank, merged into one file.

    autopar train --model rnnlm --strategy plan.yaml --nproc 2 --steps 20 --trace measured.json
    autopar simulate --model rnnlm --topology local:2 --strategy plan.yaml --trace simulated.json

Open both in ui.perfetto.dev (or chrome://tracing): the measured file has one process per rank,
named as the simulated file names its devices ("rank 0 (localhost/rank0)"), with the runtime's
spans — ``fwd <op>``, ``bwd <op>``, ``exchange <op>`` (moving an op's inputs), ``grad exchange
<op>``, ``sync`` (waiting for the gradient all-reduces), ``optimizer step`` — over torch's own
operator events and gloo's threads.  Where a prediction is wrong, the two files show which part of
the step it is.

Each rank profiles the traced steps (`StepTracer`), keeps its events, and sends them to rank 0
(`gather_traces`, one ``gather_object``), which merges them (`merge_traces`): every rank's clock is
mapped onto the wall clock by one anchor taken at the start of its first traced step, so ranks on
one machine line up to a few microseconds, and the trace starts at 0.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from .errors import TrainerConfigError

_STEP = "step "


class StepTracer:
    """Profiles the steps in ``range(first, first + count)`` of one rank."""

    def __init__(self, first: int, count: int, device_kind: str = "cpu"):
        if count < 1:
            raise TrainerConfigError(f"--trace-steps must be at least 1, got {count}")
        self.first, self.count = first, count
        self.device_kind = device_kind
        self._prof = None
        self._anchor: tuple[int, str] | None = None  # (wall clock ns, name of the anchored span)
        self.events: list[dict] | None = None

    def traced(self, step: int) -> bool:
        return self.first <= step < self.first + self.count

    def step(self, step: int):
        """Context for one step: starts the profiler at the first traced step, labels the step,
        stops and keeps the events after the last."""
        if not self.traced(step):
            return nullcontext()
        return _TracedStep(self, step)

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU]
        if self.device_kind == "cuda":  # pragma: no cover - needs a GPU
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities)
        with _quiet_stderr(self.device_kind):
            self._prof.__enter__()

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        with _quiet_stderr(self.device_kind):
            prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(prefix="autopar-trace-", suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        finally:
            os.unlink(path)
        self.events = [e for e in doc.get("traceEvents", []) if e.get("ph") != "M" or e.get("name") == "thread_name"]
        if self._anchor is not None:
            wall_ns, name = self._anchor
            start = min((e["ts"] for e in self.events if e.get("name") == name and "ts" in e), default=None)
            if start is not None:
                shift = wall_ns / 1e3 - start  # profiler clock -> wall clock, in microseconds
                for e in self.events:
                    if "ts" in e:
                        e["ts"] = e["ts"] + shift


class _quiet_stderr:
    """Silence the C++ profiler's start/stop lines on a CPU run ("USDT: ... profiler_start", and
    with PyTorch's CUDA build on a machine without a GPU "ERROR: ... gpuGetDeviceCount failed"),
    which libkineto writes to file descriptor 2 whatever its log level; they would land in the
    middle of the training progress.  On a GPU its messages are kept."""

    def __init__(self, device_kind: str):
        self.active = device_kind != "cuda"
        self._saved: int | None = None

    def __enter__(self):
        if self.active:
            import sys
            sys.stderr.flush()
            self._saved = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None


class _TracedStep:
    def __init__(self, tracer: StepTracer, step: int):
        self.tracer, self.step = tracer, step
        self._span = None

    def __enter__(self):
        t = self.tracer
        if t._prof is None:
            t._start()
        name = f"{_STEP}{self.step + 1}"
        if t._anchor is None:
            t._anchor = (time.time_ns(), name)
        self._span = torch.profiler.record_function(name)
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        self._span.__exit__(*exc)
        t = self.tracer
        if self.step == t.first + t.count - 1 or exc[0] is not None:
            t._stop()
        return False


def gather_traces(tracer: StepTracer | None, rank: int, world: int, group=None) -> list[list[dict]] | None:
    """Every rank's events on rank 0 (None elsewhere); every rank must call it."""
    mine = tracer.events if tracer is not None else None
    if world == 1:
        return [mine or []]
    out = [None] * world if rank == 0 else None
    dist.gather_object(mine or [], out, dst=0, group=group)
    return out


def merge_traces(per_rank: list[list[dict]], names: list[str], meta: dict[str, Any]) -> dict[str, Any]:
    """One trace-event document: rank k's events in process k named ``names[k]``, starting at 0."""
    starts = [e["ts"] for events in per_rank for e in events if "ts" in e and e.get("ph") != "M"]
    t0 = min(starts, default=0.0)
    out: list[dict] = []
    for rank, events in enumerate(per_rank):
        out.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": names[rank]}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        for e in events:
            e = dict(e)
            e["pid"] = rank
            if "ts" in e:
                e["ts"] = e["ts"] - t0 if e.get("ph") != "M" else 0
            out.append(e)
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"source": "autopar train", **meta}}
