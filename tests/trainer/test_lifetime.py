"""A finished rank's runtime is freed with its trainer, and its process groups with it.

A runtime kept alive into interpreter shutdown keeps its gloo process groups alive there too: a
gloo worker thread that drops the last reference to a tensor of the run's final collective then
needs the GIL of an interpreter that is going away, and the process dies of SIGABRT ("terminate
called without an active exception") after training succeeded. The operator counted that as a
failed gang and restarted it (CI, `test_create_plan_train_succeed_delete`).
"""

from __future__ import annotations

import gc
import weakref

from autopar.planner.ir.fx_import import import_spec
from autopar.planner.ir.strategy import data_parallel
from autopar.planner.zoo.registry import get_model
from autopar.trainer.comm import ProcessGroups
from autopar.trainer.session import Trainer
from autopar.trainer.train import Job, TrainConfig


def test_a_trainer_dropped_after_steps_frees_its_runtime_and_process_groups(one_rank):
    spec = get_model("lenet", batch=4, image=12)
    graph = import_spec(spec)
    job = Job(TrainConfig(model="lenet", steps=2), spec, graph, data_parallel(graph, 1))
    groups = ProcessGroups()
    trainer = Trainer(job, 0, 1, groups)
    for step in range(2):
        trainer.train_step(step)
    assert any(s.tensor._post_accumulate_grad_hooks for s in trainer.runtime.shards.values())
    runtime, groups_ref = weakref.ref(trainer.runtime), weakref.ref(groups)
    del trainer, groups
    gc.collect()
    assert runtime() is None, "the runtime outlived its trainer: " + ", ".join(
        type(r).__name__ for r in gc.get_referrers(runtime()))
    assert groups_ref() is None
