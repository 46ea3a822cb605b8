"""Delta simulation of random one-op changes gives exactly the timeline of full simulation, for
every zoo model on several topologies (FlexFlow sec. 5.3: "the full and delta simulation
algorithms always produce the same timeline").

Models are built small so that a full simulation after every change stays cheap; the structure
(ops, shared parameters, branches, halos, attention) is the same as at paper scale.  The slow
variant makes thousands of changes per case.
"""

from __future__ import annotations

import random
from functools import lru_cache

import pytest

from autopar.planner.cost.model import CostModel
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.fx_import import import_spec
from autopar.planner.ir.strategy import data_parallel, random_config
from autopar.planner.sim.simulator import simulate
from autopar.planner.sim.taskgraph import DeltaSession, TaskGraphBuilder
from autopar.planner.zoo import get_model

SMALL = {
    "lenet": dict(batch=8),
    "alexnet": dict(batch=8, image=67, fc=64, classes=10),
    "vgg16": dict(batch=4, image=32, fc=32, classes=10),
    "inception_v3": dict(batch=4, image=75, classes=10),
    "resnet101": dict(batch=4, image=32, blocks=(1, 1, 2, 1), width=8, classes=10),
    "rnntc": dict(batch=8, vocab=64, embed=16, hidden=16, layers=2, steps=4, classes=2),
    "rnnlm": dict(batch=8, vocab=64, embed=16, hidden=16, layers=2, steps=4),
    "nmt": dict(batch=8, src_vocab=64, tgt_vocab=64, embed=16, hidden=16, layers=2, src_len=4, tgt_len=4),
    "transformer": dict(batch=4, vocab=64, seq=8, d=16, heads=2, layers=2),
}
# FlexFlow's idealized runtime on GPU presets; the trainer's model (program order, exchanges,
# buckets; `planner.sim.trainer_model`) on local CPU ranks, and on GPUs with a measured NCCL
# calibration ("+nccl": host and kernel streams, `trainer_model.op_plan`).
TOPOLOGIES = ["p100-1x4", "k80-2x2", "local:2", "local:3", "p100-1x4+nccl"]


@lru_cache(maxsize=None)
def _graph(model):
    spec = get_model(model, **SMALL[model])
    return import_spec(spec)


def _builder(graph, topology: str) -> TaskGraphBuilder:
    from dataclasses import replace

    from autopar.planner.cost.calibration import default_calibration
    name, _, backend = topology.partition("+")
    topo = get_preset(name)
    if not backend:
        return TaskGraphBuilder(graph, topo, CostModel().bind(graph))
    cal = replace(default_calibration(topo.devices[0].product, backend, topo.num_devices), source="measured")
    return TaskGraphBuilder(graph, topo, CostModel().bind(graph), runtime=cal)


def _walk(model: str, topology: str, changes: int, seed: int) -> int:
    graph = _graph(model)
    builder = _builder(graph, topology)
    topo = builder.topology
    session = DeltaSession(builder, data_parallel(graph, topo.num_devices))
    rng = random.Random(seed)
    for step in range(changes):
        op = rng.choice(graph.ops)
        old = session.strategy[op.name]
        session.change(op.name, random_config(op, topo.num_devices, rng))
        full = simulate(builder.build(session.strategy))
        assert session.timeline().same_as(full), f"{model} on {topology}: timelines differ after change {step} ({op.name})"
        assert session.step_time == full.makespan
        u = rng.random()
        if u < 0.4 and session.strategy[op.name] != old:
            # Taken back, as a rejected proposal: the old timeline comes back without simulating,
            # by a rollback of the simulator's journal or (without one) by re-adding the old tasks.
            sim = session.sim
            if u >= 0.2:
                sim._last_journal = None
            # A rollback needs the last batch's journal (gone after an edge-pool compaction, or
            # when the change itself was a rollback); re-adding needs the timeline before it.
            expected = "rollback" if sim.can_rollback() else "undo" if sim._prev is not None else None
            session.change(op.name, old)
            assert expected is None or sim.stats["mode"] == expected
            full = simulate(builder.build(session.strategy))
            assert session.timeline().same_as(full), f"{model} on {topology}: undo {step} ({op.name}) differs"
    return changes


def test_small_models_exist_with_these_options():
    for model in SMALL:
        assert len(_graph(model).ops) > 3


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("model", sorted(SMALL))
def test_delta_equals_full_on_random_one_op_changes(model, topology):
    _walk(model, topology, changes=30, seed=sum(map(ord, model + topology)))


@pytest.mark.slow
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("model", sorted(SMALL))
def test_delta_equals_full_on_thousands_of_changes(model, topology):
    _walk(model, topology, changes=2000, seed=7)
