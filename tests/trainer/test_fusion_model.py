"""The simulator's account of the runtime's backward calls (`planner.sim.trainer_model.fused`)
against the runtime's own fusion (`trainer.runtime.Runtime._fusable`): an op the simulator
charges an engine start-up for is exactly an op that runs its own ``autograd.backward`` call."""

from __future__ import annotations

import pathlib
import random

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.hardware import get_preset
from autopar.planner.ir import import_spec, kernels, single_device
from autopar.planner.search import named_strategy
from autopar.planner.sim import TaskGraphBuilder
from autopar.planner.sim.trainer_model import fused, fusion_consumer
from autopar.planner.zoo import load_model
from autopar.trainer import batchnorm
from autopar.trainer.accuracy import MODELS, _random_plan
from autopar.trainer.plan import ExecutionPlan
from autopar.trainer.runtime import Runtime
from autopar.trainer.shards import make_shards

WORLD = 2


def _own_calls_of_the_runtime(graph, strategy, module) -> set[tuple[str, int]]:
    """(op, rank) where the runtime runs the op's own backward calls: the views' fusion, built
    the way `Runtime.__init__` builds them, without a process group."""
    plan = ExecutionPlan(graph, strategy, WORLD)
    out = set()
    for rank in range(WORLD):
        rt = Runtime.__new__(Runtime)
        rt.plan, rt.rank, rt.graph, rt.kernels = plan, rank, graph, kernels
        rt.shards = make_shards(plan, rank, dict(module.named_parameters()), "cpu")
        rt.bn = batchnorm.BatchNormPlan(plan, module)
        for name, v in rt._views(fuse=True).items():
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


@pytest.mark.parametrize("model", [name for name, _ in MODELS])
def test_the_simulator_charges_an_engine_start_up_exactly_where_the_runtime_runs_its_own_call(model, monkeypatch):
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"))
    spec = load_model(model, **dict(MODELS)[model])
    graph = import_spec(spec)
    topo = get_preset(f"local:{WORLD}")
    strategies = [single_device(graph)] + [named_strategy(n, graph, topo) for n in ("data-parallel",
                                                                                     "model-parallel")]
    rng = random.Random(0)
    strategies += [_random_plan(graph, topo, rng, spec.module) for _ in range(3)]
    for strategy in strategies:
        runtime = _own_calls_of_the_runtime(graph, strategy, spec.module)
        simulated = _own_calls_simulated(graph, strategy)
        assert simulated == runtime, (strategy.name, sorted(simulated ^ runtime))
    # Single-device steps fuse most of the model; model parallelism splits it into many calls.
    assert len(_own_calls_simulated(graph, strategies[0])) < len(graph.ops) // 2
