"""Plans the runtime cannot run are refused before any rank starts, naming op, configuration and reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from autopar.planner.ir.fx_import import import_model, import_spec
from autopar.planner.ir.graph import WHOLE, DimKind, Op, OperatorGraph, ParDim, TensorRef, TensorSpec
from autopar.planner.ir.strategy import ParallelConfig, Strategy, data_parallel, single_device
from autopar.planner.zoo.registry import get_model
from autopar.trainer.errors import PlanRefusedError
from autopar.trainer.train import train_main
from autopar.trainer.validate import check_plan

from . import _models


@pytest.fixture(scope="module")
def cnn():
    spec = _models.build("cnn")
    return spec, import_spec(spec)


def test_a_plan_for_another_model_is_refused(cnn):
    spec, graph = cnn
    other = import_spec(get_model("lenet", batch=4, image=12))
    with pytest.raises(PlanRefusedError, match=r"does not fit model small_cnn.*no configuration for 9 op\(s\): conv1"):
        check_plan(graph, data_parallel(other, 2), 2, spec.module)


def test_a_degree_that_does_not_divide_its_dim_is_refused(cnn):
    spec, graph = cnn
    bad = data_parallel(graph, 2).with_config("conv1", ParallelConfig((1, 1, 3, 1), (0, 1, 0)))
    with pytest.raises(PlanRefusedError, match=r"conv1.*degree 3 for attribute dim h of size 8"):
        check_plan(graph, bad, 2, spec.module)


def test_a_task_on_a_rank_the_job_does_not_have_is_refused(cnn):
    spec, graph = cnn
    with pytest.raises(PlanRefusedError, match=r"on 2 rank\(s\): op images \[input\]: device 2 does not exist"):
        check_plan(graph, data_parallel(graph, 4), 2, spec.module)


def test_a_split_random_factory_is_refused():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x + torch.randn(x.size(0), 4))
    m = Noisy()
    g = import_model(m, [("x", TensorSpec((4, 4), ("n", "f")))], ("y", TensorSpec((4,), ("n",), "int64")))
    with pytest.raises(PlanRefusedError, match=r"randn.*random factory .*split into 2 tasks"):
        check_plan(g, data_parallel(g, 2), 2, m)
    check_plan(g, single_device(g), 2, m)   # whole, it is fine


def test_an_op_kind_without_a_kernel_is_refused(cnn):
    spec, graph = cnn
    ops = tuple(dataclasses.replace(op, kind="mystery") if op.name == "relu" else op for op in graph.ops)
    g = OperatorGraph(graph.name, ops, graph.batch_size, graph.meta)
    with pytest.raises(PlanRefusedError, match=r"op relu \[mystery\].*no task kernel for kind 'mystery'"):
        check_plan(g, data_parallel(g, 2), 2, spec.module)


def test_a_split_the_kernel_cannot_compute_is_refused_with_its_reason():
    # A hand-made reshape (4, 6) -> (24,) that claims its merged axis can be split: the kernel's
    # dry run on the task's shard shapes shows it cannot.
    x = Op("x", "input", (), (), (TensorSpec((4, 6), ("n", "f"), "float64"),), (ParDim("n", DimKind.SAMPLE, 4),))
    r = Op("r", "reshape", (TensorRef("x"),), ((WHOLE, WHOLE),), (TensorSpec((24,), ("m",), "float64"),),
           (ParDim("m", DimKind.ATTRIBUTE, 24),), attrs=(("operands", ("i0",)),))
    g = OperatorGraph("bogus", (x, r), 4)
    s = Strategy.from_mapping(g, {"x": ParallelConfig((1,), (0,)), "r": ParallelConfig((2,), (0, 1))})
    with pytest.raises(PlanRefusedError, match=r"op r \[reshape\] under m2 on \[0, 1\]: task \(0,\) fails on its shards"):
        check_plan(g, s, 2, nn.Module())


def test_a_model_without_values_is_refused():
    with torch.device("meta"):
        spec = get_model("lenet", batch=4, image=12)
    g = import_spec(spec)
    with pytest.raises(PlanRefusedError, match=r"meta device"):
        check_plan(g, data_parallel(g, 2), 2, spec.module)


def test_train_refuses_before_starting_any_rank(tmp_path):
    graph = import_spec(get_model("lenet", batch=4, image=12))
    with pytest.raises(PlanRefusedError, match=r"device 2 does not exist"):
        train_main(model="lenet", model_options={"batch": 4, "image": 12}, strategy=data_parallel(graph, 4),
                   nproc=2, steps=1, checkpoint_dir=str(tmp_path), checkpoint_every=1, log=False)
    assert list(tmp_path.iterdir()) == []
