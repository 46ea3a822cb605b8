"""Refusing a plan before training starts: wrong model, or an op the runtime cannot shard as configured.

Every check raises `PlanRefusedError` naming the op, its configuration and the reason, so a bad
plan costs a second, not a crashed job:

1. the plan configures exactly the graph's ops with degrees that divide their dims, and places
   every task on a rank of the job (`Strategy.validate`);
2. every op kind has a task kernel (`planner.ir.kernels.KERNEL_KINDS`);
3. random factories (``torch.rand`` and friends) are not split: shards would draw different
   numbers than the whole op, so no plan could train like one device;
4. the model's parameters have values (not a ``meta``-device model) of the graph's dtypes;
5. a dry run of every task on fake tensors (no memory, no compute) returns exactly the output box
   the plan expects — the check that an op "can be sharded under this configuration" is the
   kernel itself, run on the shapes that configuration produces.
"""

from __future__ import annotations

from itertools import product

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autopar.planner.errors import StrategyError
from autopar.planner.ir import OperatorGraph, Strategy

from .errors import PlanRefusedError
from .redistribute import shape_of

_RANDOM_FILLS = ("rand", "randn")


def check_plan(graph: OperatorGraph, strategy: Strategy, world_size: int, module: torch.nn.Module | None = None,
               dry_run: bool = True) -> None:
    """Raise `PlanRefusedError` when `strategy` cannot train `graph` on `world_size` ranks."""
    from autopar.planner.ir import kernels
    try:
        strategy.validate(graph, world_size)
    except StrategyError as e:
        raise PlanRefusedError(f"plan {strategy.name!r} does not fit model {graph.name} on {world_size} rank(s): {e}. "
                               "Make the plan for this model and this number of ranks (autopar plan ... "
                               f"--topology local:{world_size}), or pick a named strategy") from e
    for op in graph.ops:
        cfg = strategy[op.name]
        where = f"{op.describe()} under {cfg.describe(op)}"
        if op.kind not in kernels.KERNEL_KINDS:
            raise PlanRefusedError(f"{where}: the runtime has no task kernel for kind {op.kind!r} "
                                   f"(kernels exist for {', '.join(kernels.KERNEL_KINDS)})")
        if op.kind == "source" and op.attr("fill") in _RANDOM_FILLS and cfg.num_tasks > 1:
            raise PlanRefusedError(f"{where}: a random factory ({op.attr('fill')}) split into {cfg.num_tasks} tasks "
                                   "draws different numbers than the whole op; keep it whole (all degrees 1)")
    if module is not None:
        _check_module(graph, module)
        if dry_run:
            _dry_run(graph, strategy, module, kernels)


def _check_module(graph: OperatorGraph, module: torch.nn.Module) -> None:
    params = dict(module.named_parameters())
    for name, spec in graph.param_specs.items():
        p = params.get(name)
        if p is None:
            raise PlanRefusedError(f"parameter {name} of graph {graph.name} is not a parameter of the model "
                                   f"({type(module).__name__}); import the graph from this model")
        if p.is_meta:
            raise PlanRefusedError(f"parameter {name} is on the meta device (a model built without memory for "
                                   "planning); build the model on the CPU to train it")
        if str(p.dtype).removeprefix("torch.") != spec.dtype or tuple(p.shape) != spec.shape:
            raise PlanRefusedError(f"parameter {name} is {tuple(p.shape)} {p.dtype} in the model but "
                                   f"{spec.shape} {spec.dtype} in the graph; import the graph after converting the model")


def _dry_run(graph: OperatorGraph, strategy: Strategy, module: torch.nn.Module, kernels) -> None:
    params = dict(module.named_parameters())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for op in graph.ops:
        if op.kind == "input":
            continue
        cfg = strategy[op.name]
        for coord in product(*(range(d) for d in cfg.degrees)):
            ranges = op.task_ranges(cfg.degrees, coord)
            try:
                with mode:
                    xs = []
                    for i in range(len(op.inputs)):
                        spec = graph.input_spec(op, i)
                        xs.append(torch.zeros(shape_of(op.input_box(i, ranges, spec.shape)),
                                              dtype=getattr(torch, spec.dtype)))
                    ps = []
                    for j, p in enumerate(op.params):
                        ps.append(torch.zeros(shape_of(op.param_box(j, ranges)), dtype=params[p.name].dtype))
                    stats = None
                    if op.kind == "batch_norm" and op.attr("batch_stats"):
                        c = xs[0].shape[1]
                        stats = (torch.zeros(c, dtype=xs[0].dtype), torch.ones(c, dtype=xs[0].dtype))
                    outs = kernels.forward_task(op, ranges, xs, ps, module=module, bn_stats=stats)
                got = [tuple(o.shape) for o in outs]
                want = [shape_of(op.output_box(k, ranges)) for k in range(len(op.outputs))]
            except Exception as e:  # noqa: BLE001 - any kernel failure is a refusal with its reason
                raise PlanRefusedError(f"{op.describe()} under {cfg.describe(op)}: task {coord} fails on its "
                                       f"shards: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
                                       "Choose other degrees for this op") from e
            if got != want:
                raise PlanRefusedError(f"{op.describe()} under {cfg.describe(op)}: task {coord} produces shapes {got} "
                                       f"but the plan expects {want}; this op cannot be split this way, "
                                       "choose other degrees for it")
