"""`autopar train --trace`: every rank's profiled steps in one Chrome trace-event file, with the
runtime's spans named as the simulated trace names its tasks, and the traced steps kept out of
the measured median."""

from __future__ import annotations

import json
import statistics

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.hardware import get_preset
from autopar.planner.ir import import_spec
from autopar.planner.search import named_strategy
from autopar.planner.sim import TaskGraphBuilder, simulate_strategy, simulated_trace
from autopar.planner.zoo import get_model
from autopar.trainer.errors import TrainerConfigError
from autopar.trainer.train import train_main

LENET = {"batch": 8, "image": 12}


def _spans(doc: dict, pid: int, prefix: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] == pid and e["name"].startswith(prefix)]


def test_a_traced_run_writes_one_trace_with_every_ranks_spans(tmp_path):
    path = tmp_path / "measured.json"
    summary = train_main(model="lenet", model_options=LENET, strategy="model-parallel", nproc=2, steps=5,
                         trace=str(path), trace_steps=2, log=False)
    assert summary["trace"] == str(path) and summary["traced_steps"] == [2, 3]
    doc = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0 (localhost/rank0)", 1: "rank 1 (localhost/rank1)"}
    graph = import_spec(get_model("lenet", **LENET))
    computed = [op.name for op in graph.ops if op.kind not in ("input",)]
    for rank in (0, 1):
        steps = _spans(doc, rank, "step ")
        assert sorted(e["name"] for e in steps) == ["step 2", "step 3"]
        fwd = {e["name"][4:] for e in _spans(doc, rank, "fwd ")}
        assert fwd and fwd <= {op.name for op in graph.ops}
        assert _spans(doc, rank, "bwd ") and _spans(doc, rank, "optimizer step")
    # Model parallelism moves activations between the ranks: the exchanges are in the trace.
    assert _spans(doc, 0, "exchange ") or _spans(doc, 1, "exchange ")
    assert {e["name"][4:] for r in (0, 1) for e in _spans(doc, r, "fwd ")} >= set(computed) - {"loss"}
    starts = [e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert min(starts) == pytest.approx(0.0, abs=1.0)
    # The two traced steps are out of the median: it is the median of steps 4 and 5.
    assert summary["measured_step_s"] == statistics.median(summary["step_seconds"][3:])


def test_trace_steps_below_one_are_refused():
    with pytest.raises(TrainerConfigError, match="--trace-steps must be at least 1"):
        train_main(model="lenet", model_options=LENET, nproc=1, steps=2, trace="t.json", trace_steps=0, log=False)


def test_the_simulated_trace_names_tasks_as_the_runtime_names_its_spans():
    graph = import_spec(get_model("lenet", **LENET))
    topo = get_preset("local:2")
    builder = TaskGraphBuilder(graph, topo, CostModel())
    strategy = named_strategy("model-parallel", graph, topo)
    res, tl, tg = simulate_strategy(builder, strategy)
    doc = simulated_trace(graph, topo, tl, tg, name="model-parallel")
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names[0] == "rank 0 (localhost/rank0)" and names[1] == "rank 1 (localhost/rank1)"
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert {e["name"] for e in events if e["pid"] in (0, 1)} >= {f"fwd {op.name}" for op in graph.ops}
    assert any(e["name"].startswith("send ") for e in events)
    assert max(e["ts"] + e["dur"] for e in events) == pytest.approx(res.step_time * 1e6)
    assert doc["otherData"]["step_seconds"] == res.step_time


def test_a_gpus_simulated_trace_has_its_hosts_lane_beside_its_kernels():
    """On a GPU the simulator runs the host issuing kernels and the kernels on two streams; the
    trace shows both, the host's spans named as the measured trace's CPU-side spans of a CUDA rank.
    CPU ranks have one lane."""
    from pathlib import Path

    from autopar.planner.cost import ProfileCache
    from autopar.planner.cost.calibration import default_calibration
    from autopar.planner.hardware import load_topology
    graph = import_spec(get_model("lenet", **LENET))
    topo = load_topology(Path(__file__).parents[2] / "examples" / "topologies" / "one-h100.yaml")
    cache = ProfileCache()   # what `autopar profile` on that GPU stores: its calibration for one rank
    cache.put_calibration(default_calibration(topo.devices[0].product, "nccl", 1))
    builder = TaskGraphBuilder(graph, topo, CostModel(cache))
    res, tl, tg = simulate_strategy(builder, named_strategy("single-device", graph, topo))
    doc = simulated_trace(graph, topo, tl, tg, name="single-device")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert threads == {(0, 0): "kernels", (0, 1): "host"}
    assert doc["otherData"]["strategy"] == "single-device"
    host = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["tid"] == 1]
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["tid"] == 0]
    computed = {op.name for op in graph.ops if op.inputs}
    assert {e["name"] for e in host} >= {f"fwd {name}" for name in computed} | {f"bwd {name}" for name in computed}
    assert all(e["cat"] == "host" for e in host)
    first = {e["name"]: e["ts"] for e in sorted(host, key=lambda e: -e["ts"])}
    for e in kernels:   # a kernel starts once its host has issued it
        if e["name"] in first and e["name"].startswith("fwd "):
            assert e["ts"] >= first[e["name"]]
    # A CPU rank has no host: its compute is thread 0, and the calls its program makes beside
    # the core (here the wait for each send request at the step's end) thread 1, "program".
    cpu = get_preset("local:2")
    _, tl, tg = simulate_strategy(TaskGraphBuilder(graph, cpu, CostModel()), named_strategy("model-parallel", graph, cpu))
    doc = simulated_trace(graph, cpu, tl, tg)
    ranks = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] in (0, 1)]
    program = [e for e in ranks if e["tid"] == 1]
    assert program and {e["name"] for e in program} == {"wait for a send"}
    assert all(e["tid"] == 0 for e in ranks if e not in program) and not any(e["cat"] == "host" for e in ranks)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert names[(0, 0)] == "compute" and {names[(pid, 1)] for pid in (0, 1) if (pid, 1) in names} == {"program"}
