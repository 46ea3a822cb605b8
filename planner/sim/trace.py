"""A simulated step as Chrome trace-event JSON, to open in Perfetto (ui.perfetto.dev) or
chrome://tracing next to the measured trace of `autopar train --trace`.

    doc = simulated_trace(graph, topology, timeline, task_graph)
    json.dump(doc, open("sim.json", "w"))

Layout, chosen to line up with the measured trace the trainer writes (one process per rank):

* one process per device, named like the trainer's ranks ("rank 0 (localhost/rank0)" for the
  ``local`` topology, the device name elsewhere); its thread 0 holds the compute tasks, named
  ``fwd <op>`` and ``bwd <op>`` (the trainer's spans have the same names), and the optimizer
  updates, ``update <parameter>``;
* on a GPU, thread 0 is the kernels' stream and thread 1 ("host") the host issuing them
  (`planner.sim.trainer_model.op_plan`): ``fwd <op>`` and ``bwd <op>`` again, as the measured
  trace's CPU-side spans of a CUDA rank are named, plus the autograd engine's start-up of an
  op's own backward call (``engine call <op>``) and the issuing of gradient buckets.  A step that
  the host paces shows there: the kernels' lane has gaps that the host's lane has not;
* on a CPU rank, thread 1 ("program") holds the calls its program makes beside the core, named
  as their labels: an exchange's own work where nothing moves (``exchange <op>``, ``grad
  exchange <op>``, where the model's own steps timed it) and the wait for each send request at
  the end of the step (``wait for a send``; `planner.sim.trainer_model._wait_send`);
* one process "links" with a thread per link that carried traffic: transfers
  (``send <op> input j``, ``grad <op> input j``) and gradient all-reduce ring steps
  (``allreduce <parameter>``), each on every link of its route.

Times are microseconds from the start of the step (the format's unit).  Every event carries its
task key, kind and bytes in ``args``.  Barrier tasks (the simulator's 1 ns joins of a ring) are
left out, except where a wait barrier holds what the ranks' arrival noise adds to a wait
(`planner.sim.waits`): that shows on the device's thread 2, "mean waits", as ``mean wait <op>``
(``mean grad wait <op>`` in the backward pass).
"""

from __future__ import annotations

from typing import Any

from ..hardware.topology import DeviceTopology
from ..ir.graph import OperatorGraph
from .simulator import TaskGraph, Timeline
from ._plans import MIN_TASK_SECONDS
from .trainer_model import _CHAIN_BASE

_LINKS_PID = 1 << 20
#: A GPU's thread for its host's tasks (thread 0 is its kernels' stream); a CPU rank's for its
#: program's own calls beside its core.
_HOST_TID = 1
_WAIT_TID = 2


def device_process_name(topology: DeviceTopology, device: int) -> str:
    """What a device's process is called in both traces: its rank for the local topology."""
    name = topology.devices[device].name
    return f"rank {device} ({name})" if dict(topology.meta).get("preset", "").startswith("local") else name


def _host_task_name(key: tuple, label: str) -> str:
    """A GPU host's task: issuing an op's kernels (``(stage, i, 3, t)``), an op's own backward
    call (``(1, i, 4, t)``), or another of the host's costs (issuing a bucket), by its label."""
    if len(key) == 4 and key[2] == 3 and key[0] in (0, 1):
        return f"{'fwd' if key[0] == 0 else 'bwd'} {label}"
    if len(key) == 4 and key[2] == 4:
        return f"engine call {label}"
    return label


def _task_name(graph: OperatorGraph, params: list[str], key: tuple, kind: str, label: str) -> str:
    stage = key[0]
    if kind in ("forward", "backward"):
        return f"{'fwd' if kind == 'forward' else 'bwd'} {label}"
    if kind == "update":
        return f"update {label}"
    if kind == "comm" and stage == 2:  # (2, parameter index, group, ring edge, part)
        return f"allreduce {params[key[1]]}"
    if kind == "comm":
        n = len(graph.ops)
        op = graph.ops[key[1] if stage == 0 else n - key[1]].name
        return f"{'send' if stage == 0 else 'grad'} {op} input {key[3]}"
    return f"{kind} {label}"


def simulated_trace(graph: OperatorGraph, topology: DeviceTopology, timeline: Timeline,
                    task_graph: TaskGraph, *, name: str = "") -> dict[str, Any]:
    """The timeline of one simulated step as a Chrome trace-event document (module docstring)."""
    n = topology.num_devices
    params = list(graph.param_specs)  # a ring task's key holds the parameter's index in this order
    events: list[dict[str, Any]] = []
    used_links: set[int] = set()
    hosts: set[int] = set()
    programs: set[int] = set()
    waited: set[int] = set()
    for r in timeline.resources():
        host = _CHAIN_BASE <= r < _CHAIN_BASE + n
        if r < n:
            pid, tid = r, 0
        elif r < n + len(topology.links):
            pid, tid = _LINKS_PID, r - n
        elif host:
            pid, tid = r - _CHAIN_BASE, _HOST_TID   # a GPU's host, a CPU rank's program
        else:
            continue  # the simulator's virtual resources (barriers, message latencies)
        for key, start, end in timeline.spans(r):
            info = task_graph.task(key)
            if info.kind == "barrier":
                if host and end - start > 2 * MIN_TASK_SECONDS and len(key) == 5 and key[4] == 1:
                    op = graph.ops[key[1] if key[0] == 0 else len(graph.ops) - key[1]].name
                    waited.add(pid)
                    events.append({"name": f"mean {'wait' if key[0] == 0 else 'grad wait'} {op}", "cat": "wait",
                                   "ph": "X", "pid": pid, "tid": _WAIT_TID, "ts": start * 1e6,
                                   "dur": (end - start) * 1e6, "args": {"key": list(key)}})
                continue
            if pid == _LINKS_PID:
                used_links.add(tid)
            program = host and topology.devices[pid].is_cpu
            if program:
                programs.add(pid)
                title, cat = info.label, info.kind
            elif host:
                hosts.add(pid)
                title, cat = _host_task_name(key, info.label), "host"
            else:
                title, cat = _task_name(graph, params, key, info.kind, info.label), info.kind
            events.append({"name": title, "cat": cat, "ph": "X",
                           "pid": pid, "tid": tid, "ts": start * 1e6, "dur": max(end - start, 0.0) * 1e6,
                           "args": {"key": list(key), "bytes": info.nbytes, "where": info.label}})
    meta = []
    for d in range(n):
        meta.append({"name": "process_name", "ph": "M", "pid": d, "args": {"name": device_process_name(topology, d)}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": d, "args": {"sort_index": d}})
        meta.append({"name": "thread_name", "ph": "M", "pid": d, "tid": 0,
                     "args": {"name": "kernels" if d in hosts else "compute"}})
        if d in hosts or d in programs:
            meta.append({"name": "thread_name", "ph": "M", "pid": d, "tid": _HOST_TID,
                         "args": {"name": "host" if d in hosts else "program"}})
        if d in waited:
            meta.append({"name": "thread_name", "ph": "M", "pid": d, "tid": _WAIT_TID, "args": {"name": "mean waits"}})
    if used_links:
        meta.append({"name": "process_name", "ph": "M", "pid": _LINKS_PID, "args": {"name": "links"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": _LINKS_PID, "args": {"sort_index": n}})
        for li in sorted(used_links):
            meta.append({"name": "thread_name", "ph": "M", "pid": _LINKS_PID, "tid": li,
                         "args": {"name": topology.links[li].label}})
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"source": "autopar simulate", "model": graph.name, "topology": topology.name,
                          "strategy": name, "step_seconds": timeline.makespan}}
