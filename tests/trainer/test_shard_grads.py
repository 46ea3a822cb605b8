"""A parameter that several ops share under different splits (an RNN's cells, a decoder unrolled
over time, in mixed and searched plans): each use adds its gradient into its own region of the
shard's gradient, with the gradient single-device autograd gives, and no use materializes a
gradient the size of the whole shard (an rnnlm plan spent 23 ms of a 165 ms step doing that)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autopar.planner.ir import ParallelConfig, Strategy, import_spec
from autopar.planner.zoo import ModelSpec, TensorSpec, seeded
from autopar.trainer.comm import ProcessGroups
from autopar.trainer.runtime import Runtime

BATCH, WIDTH = 4, 8


class _Twice(nn.Module):
    """One linear layer applied twice: its weight is shared by two ops."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


class _Sizes(TorchDispatchMode):
    """Names of the ops that produce a tensor of `numel` elements."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel:
            self.ops.append(func.__name__)
        return out


def test_a_shared_parameter_used_in_slices_gets_each_use_added_into_its_region(one_rank):
    module = seeded(0, _Twice).double()
    spec = ModelSpec(name="twice", module=module, inputs=(("x", TensorSpec((BATCH, WIDTH), ("n", "c"), "float64")),),
                     target=("labels", TensorSpec((BATCH,), ("n",), "int64")), loss="cross_entropy", description="")
    graph = import_spec(spec)
    linears = [op for op in graph.ops if op.params]
    assert len(linears) == 2 and {p.name for p in linears[0].params} == {p.name for p in linears[1].params}
    configs = {op.name: ParallelConfig((1,) * len(op.pardims), (0,)) for op in graph.ops}
    # The second use is split over its output features into two tasks on the one device: each
    # reads half of the weight and bias shard that the first use reads whole.
    second = linears[1]
    degrees = tuple(2 if p.kind.name == "PARAMETER" else 1 for p in second.pardims)
    configs[second.name] = ParallelConfig(degrees, (0, 0))
    runtime = Runtime(graph, Strategy.from_mapping(graph, configs, "sliced"), module, rank=0, world_size=1,
                      groups=ProcessGroups())
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([1, 5, 0, 7])

    weight = WIDTH * WIDTH
    sizes = _Sizes(weight)
    with sizes:
        runtime.step({"x": x, "labels": labels})
    # One gradient buffer of the weight's size per step (its zeroing) and one add per use; no
    # use scatters into a full-size zero tensor first.
    assert "slice_backward.default" not in sizes.ops
    assert sizes.ops.count("add_.Tensor") <= 3, sizes.ops

    ref = seeded(0, _Twice).double()
    nn.functional.cross_entropy(ref(x), labels).backward()
    for name, p in ref.named_parameters():
        assert torch.allclose(runtime.shards[name].tensor.grad, p.grad, atol=1e-12), name
