"""Run the same training on one process (plain PyTorch) and under a plan on N ranks, and compare.

`reference` is the ground truth: the model module itself, ``spec.compute_loss``, ``loss.backward()``
and a `torch.optim` optimizer on the full parameters.  `distributed` trains every case in one
multi-process job (starting processes is the slow part on this machine) through the trainer's
`Trainer`, gathering the full gradients every step and the full state at the end.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from autopar.planner.ir.fx_import import import_spec
from autopar.trainer.comm import ProcessGroups
from autopar.trainer.data import SyntheticData
from autopar.trainer.launch import run_local
from autopar.trainer.optim import OptimizerConfig
from autopar.trainer.session import Trainer
from autopar.trainer.train import Job, TrainConfig

from . import _models, _plans

STEPS = 3
TOL = 1e-9
SGD = OptimizerConfig("sgd", lr=0.1, momentum=0.9)
ADAM = OptimizerConfig("adam", lr=0.01)


@dataclass
class Record:
    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def reference(spec, opt: OptimizerConfig, steps: int = STEPS) -> Record:
    module = copy.deepcopy(spec.module)
    optimizer = opt.build(list(module.parameters()))
    data = SyntheticData(spec)
    names = [n for n, _ in spec.inputs]
    rec = Record()
    for s in range(steps):
        batch = data.batch(s)
        optimizer.zero_grad(set_to_none=True)
        loss = spec.compute_loss(module(*(batch[n] for n in names)), batch[spec.target[0]])
        loss.backward()
        rec.losses.append(float(loss.detach()))
        rec.grads.append({n: p.grad.detach().clone() for n, p in module.named_parameters()})
        optimizer.step()
    rec.params = {n: p.detach().clone() for n, p in module.named_parameters()}
    rec.buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    return rec


def _worker(rank: int, world: int, jobs: list[Job], steps: int) -> list[Record] | None:
    groups = ProcessGroups()
    out = []
    for job in jobs:
        tr = Trainer(job, rank, world, groups)
        rec = Record()
        for s in range(steps):
            loss = tr.global_loss(tr.forward_backward(s))
            grads = tr.runtime.gather("grad")
            tr.optimizer_step()
            rec.losses.append(loss)
            if rank == 0:
                rec.grads.append(grads)
        state = tr.full_state(0)
        if rank == 0:
            rec.params, rec.buffers = state["params"], state["buffers"]
        out.append(rec)
    return out if rank == 0 else None


def distributed(world: int, cases: list[tuple[str, str, OptimizerConfig]], steps: int = STEPS) -> dict:
    """(model, strategy family, optimizer) -> (reference Record, distributed Record) for every case."""
    jobs, keys, refs = [], [], {}
    graphs = {}
    for model, family, opt in cases:
        if model not in graphs:
            spec = _models.build(model)
            graphs[model] = (spec, import_spec(spec))
        spec, graph = graphs[model]
        strategy = _plans.FAMILIES[family](graph, world)
        if strategy is None:
            continue
        jobs.append(Job(TrainConfig(model=model, optimizer=opt), spec, graph, strategy))
        keys.append((model, family, opt.name))
        refs[(model, opt.name)] = refs.get((model, opt.name)) or reference(spec, opt, steps)
    got = run_local(_worker, world, (jobs, steps))[0]
    return {k: (refs[(k[0], k[2])], rec) for k, rec in zip(keys, got)}


def max_diffs(ref: Record, got: Record) -> dict[str, float]:
    """Largest absolute difference of each compared quantity."""
    d = {"loss": max(abs(a - b) for a, b in zip(ref.losses, got.losses))}
    d["grad"] = max((ref.grads[s][n] - got.grads[s][n]).abs().max().item()
                    for s in range(len(ref.grads)) for n in ref.grads[s])
    d["param"] = max((ref.params[n] - got.params[n]).abs().max().item() for n in ref.params)
    bufs = [n for n in ref.buffers if "running" in n or "num_batches" in n]
    d["buffer"] = max(((ref.buffers[n].double() - got.buffers[n].double()).abs().max().item() for n in bufs), default=0.0)
    return d
