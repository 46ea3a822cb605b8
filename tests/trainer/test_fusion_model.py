"""The simulator's account of the runtime's backward calls (`planner.sim.trainer_model.fused`)
against the runtime's own fusion (`trainer.runtime.Runtime._fusable`): an op the simulator
charges an engine start-up for is exactly an op that runs its own ``autograd.backward`` call; and
a rank the simulator charges an exchange call for is exactly one where the runtime makes it."""

from __future__ import annotations

import pathlib
import random
from dataclasses import replace

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.cost.calibration import default_calibration
from autopar.planner.hardware import get_preset
from autopar.planner.ir import import_spec, kernels, single_device
from autopar.planner.search import named_strategy
from autopar.planner.sim import TaskGraphBuilder
from autopar.planner.sim.trainer_model import _grad_inputs, fused, fusion_consumer
from autopar.planner.zoo import load_model
from autopar.trainer import batchnorm
from autopar.trainer.accuracy import MODELS, _random_plan
from autopar.trainer.plan import ExecutionPlan
from autopar.trainer.runtime import Runtime, exchange_calls
from autopar.trainer.shards import make_shards

WORLD = 2


def _views(graph, strategy, module, rank: int) -> dict:
    """Rank `rank`'s op views, fused, built the way `Runtime.__init__` builds them, without a
    process group."""
    plan = ExecutionPlan(graph, strategy, WORLD)
    rt = Runtime.__new__(Runtime)
    rt.plan, rt.rank, rt.graph, rt.kernels = plan, rank, graph, kernels
    rt.shards = make_shards(plan, rank, dict(module.named_parameters()), "cpu")
    rt.bn = batchnorm.BatchNormPlan(plan, module)
    return rt._views(fuse=True)


def _own_calls_of_the_runtime(graph, strategy, module) -> set[tuple[str, int]]:
    """(op, rank) where the runtime runs the op's own backward calls."""
    out = set()
    for rank in range(WORLD):
        for name, v in _views(graph, strategy, module, rank).items():
            if v.grad and v.tasks and not v.fused_out and not v.input_op:
                out.add((name, rank))
    return out


def _own_calls_simulated(graph, strategy) -> set[tuple[str, int]]:
    b = TaskGraphBuilder(graph, get_preset(f"local:{WORLD}"), CostModel().bind(graph))
    out = set()
    for p, op in enumerate(graph.ops):
        if not b._requires_grad[p] or not op.inputs:
            continue
        edge = fusion_consumer(b, p)
        if edge is not None:
            i, j = edge
            consumer = graph.ops[i]
            if fused(b, i, consumer, j, strategy[consumer.name], strategy[op.name]):
                continue
        out.update((op.name, d) for d in strategy[op.name].devices)
    return out


def _plans(model: str, monkeypatch, seed: int) -> tuple:
    """(spec, graph, plans) of a benchmark model: one device, data and model parallelism, and three
    random plans the runtime can execute."""
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"))
    spec = load_model(model, **dict(MODELS)[model])
    graph = import_spec(spec)
    topo = get_preset(f"local:{WORLD}")
    strategies = [single_device(graph)] + [named_strategy(n, graph, topo) for n in ("data-parallel",
                                                                                     "model-parallel")]
    rng = random.Random(seed)
    strategies += [_random_plan(graph, topo, rng, spec.module) for _ in range(3)]
    return spec, graph, strategies


@pytest.mark.parametrize("model", [name for name, _ in MODELS])
def test_the_simulator_charges_an_engine_start_up_exactly_where_the_runtime_runs_its_own_call(model, monkeypatch):
    spec, graph, strategies = _plans(model, monkeypatch, 0)
    for strategy in strategies:
        runtime = _own_calls_of_the_runtime(graph, strategy, spec.module)
        simulated = _own_calls_simulated(graph, strategy)
        assert simulated == runtime, (strategy.name, sorted(simulated ^ runtime))
    # Single-device steps fuse most of the model; model parallelism splits it into many calls.
    assert len(_own_calls_simulated(graph, strategies[0])) < len(graph.ops) // 2


def _exchange_calls_of_the_runtime(graph, strategy, module) -> list[tuple[str, str, int]]:
    """(direction, op, rank) of every exchange call a rank holding the op's tasks makes."""
    out = []
    for rank in range(WORLD):
        fwd, bwd = exchange_calls(_views(graph, strategy, module, rank))
        out += [("fwd", name, rank) for name in fwd] + [("bwd", name, rank) for name in bwd]
    return sorted(out)


#: Seconds of an exchange call that moves nothing, forward and backward (`RuntimeCalibration.local_exchange_s`).
CALLS = (1e-5, 3e-5)


def _builder(graph) -> TaskGraphBuilder:
    topo = get_preset(f"local:{WORLD}")
    cal = replace(default_calibration(topo.devices[0].product, "gloo", WORLD), local_exchange_s=CALLS)
    return TaskGraphBuilder(graph, topo, CostModel().bind(graph), runtime=cal)


def _exchange_calls_simulated(graph, strategy) -> tuple[list[tuple[str, str, int]], dict]:
    """The simulator's (direction, op, rank) of every exchange call it charges, and the calls'
    seconds on each."""
    tg = _builder(graph).build(strategy)
    seconds: dict[tuple[str, str, int], float] = {}
    for k in tg:
        info = tg.task(k)
        if info.kind == "overhead" and info.label.startswith(("exchange ", "grad exchange ")):
            call = ("bwd" if info.label.startswith("grad ") else "fwd", info.label.split(" ")[-1], k[3])  # the rank
            seconds[call] = seconds.get(call, 0.0) + info.duration
    return sorted(seconds), seconds


def _fusable_grad_inputs(graph, name: str) -> int:
    return sum(fusable for _, fusable in _grad_inputs(_builder(graph), graph.index[name], graph.by_name[name]))


@pytest.mark.parametrize("model", [name for name, _ in MODELS])
def test_the_simulator_charges_an_exchange_call_exactly_where_the_runtime_makes_one(model, monkeypatch):
    """Every rank holding an op's tasks calls its exchange forward, moving something or not, and
    backward where a gradient leaves the consumer's autograd call; the simulator charges each
    once (`planner.sim.trainer_model._local_calls`, `_apart_call`)."""
    spec, graph, strategies = _plans(model, monkeypatch, 1)
    backward = 0
    for strategy in strategies:
        runtime = _exchange_calls_of_the_runtime(graph, strategy, spec.module)
        simulated, seconds = _exchange_calls_simulated(graph, strategy)
        assert simulated == runtime, (strategy.name, sorted(set(simulated) ^ set(runtime)))
        backward += sum(d == "bwd" for d, _, _ in runtime)
        for call, s in seconds.items():
            # One call each; an op with several inputs that may be fused takes a share per input kept apart.
            one = CALLS[call[0] == "bwd"]
            if call[0] == "fwd" or _fusable_grad_inputs(graph, call[1]) < 2:
                assert s == pytest.approx(one), (strategy.name, call)
            else:
                assert 0 < s <= one * (1 + 1e-9), (strategy.name, call)
    assert backward > 0
