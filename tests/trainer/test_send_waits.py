"""The simulator's end-of-step waits for send requests (`planner.sim.trainer_model._wait_send`)
against the requests the trainer's runtime really waits for as its steps end."""

from __future__ import annotations

import random

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.cost.calibration import default_calibration
from autopar.planner.hardware import get_preset
from autopar.planner.ir import import_spec, model_parallel, random_config, Strategy
from autopar.planner.sim import TaskGraphBuilder, simulate_strategy
from autopar.planner.sim.trainer_model import is_send_wait, sync_wait
from autopar.planner.zoo import load_model
from autopar.trainer.comm import ProcessGroups
from autopar.trainer.launch import run_local
from autopar.trainer.optim import OptimizerConfig
from autopar.trainer.session import Trainer
from autopar.trainer.train import Job, TrainConfig

MODEL = ("rnnlm", {"batch": 4, "embed": 16, "hidden": 16, "vocab": 64, "steps": 3})


def _strategies(g, devices: int) -> list[Strategy]:
    rng = random.Random(7)
    return [model_parallel(g, devices)] + [
        Strategy.from_mapping(g, {op.name: random_config(op, devices, rng) for op in g.ops}, f"random-{k}")
        for k in range(2)]


def _waits(rank: int, world: int) -> list[list[int]]:
    """Per strategy, how many send requests this rank waited for at the end of each of 3 steps."""
    from autopar.trainer import runtime

    name, options = MODEL
    spec = load_model(name, **options)
    g = import_spec(spec)
    counts: list[int] = []
    inner = runtime.wait_all

    def counted(pending):
        counts.append(len(pending))
        inner(pending)

    runtime.wait_all = counted
    out = []
    try:
        for s in _strategies(g, world):
            job = Job(TrainConfig(model=name, optimizer=OptimizerConfig("sgd", lr=0.1), log=False), spec, g, s)
            tr = Trainer(job, rank, world, ProcessGroups())
            counts.clear()
            for step in range(3):
                tr.train_step(step)
            out.append(list(counts))
    finally:
        runtime.wait_all = inner
    return out


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_each_rank_waits_at_its_steps_end_for_as_many_sends_as_the_simulator_charges():
    """One ``send_wait_s`` per message the runtime sends (pieces for one peer coalesced, as
    `trainer_model.riders` says), on the sender's program between the buckets' wait and its
    optimizer step, counted as synchronization (the trainer's ``sync`` span holds the wait)."""
    name, options = MODEL
    g = import_spec(load_model(name, **options))
    topo = get_preset("local:2")
    cal = default_calibration(topo.devices[0].product, "gloo", 2)
    assert cal.send_wait_s > 0
    measured = run_local(_waits, 2)
    for k, strategy in enumerate(_strategies(g, 2)):
        b = TaskGraphBuilder(g, topo, CostModel().bind(g), "sgd", runtime=cal)
        _, tl, tg = simulate_strategy(b, strategy)
        for rank in range(2):
            chain = tg.task(sync_wait(rank)).resource
            waits = [key for key in tg if is_send_wait(key) and tg.task(key).resource == chain]
            assert measured[rank][k] == [len(waits)] * 3, (strategy.name, rank)
            assert all(tl.start[key] >= tl.end[sync_wait(rank)] for key in waits)
        if k == 0:
            assert any(measured[rank][k][0] > 0 for rank in range(2))   # the case this test is about
