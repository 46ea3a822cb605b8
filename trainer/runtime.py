"""Per-rank execution of a SOAP strategy: forward in graph order, backward in reverse, then sync.

FlexFlow's runtime (paper sec. 7) runs every op partitioned over its own devices and moves tensors
between differently partitioned ops; this is the same on `torch.distributed`.  Each rank:

1. **Forward**, op by op in graph order: receive the input pieces its tasks need
   (`trainer.redistribute`, point to point, batched), assemble every local task's input boxes
   (halos included), and run the op's task kernel (`planner.ir.kernels.forward_task`, the code the
   profiler measures) on them with its parameter shards.  Several tasks of one op on one rank run
   one after another.  Batch norm with batch statistics reduces its partial statistics among the
   ranks that share a channel slice before normalizing (`trainer.batchnorm`).
2. **Backward**, op by op in reverse graph order: every task's inputs are fresh autograd leaves,
   so `torch.autograd.backward` of the task's outputs with their accumulated gradients yields the
   gradients of its input boxes and adds into its parameter shards' ``.grad``; the input
   gradients go back along the reverse paths and add up at the producers.  Shared parameters
   (unrolled steps) accumulate in the same shard before they are synchronized.  An edge that
   stays on the rank one to one (a producer task whose whole output only one local consumer task
   reads — most of a data-parallel model) is not cut: the chain keeps one autograd graph and one
   backward call, which is all the per-op bookkeeping would have computed, minus its overhead.
3. **Sync**: gradient buckets are all-reduced among the holders of each cell, issued as soon as
   their parameters are final (`trainer.sync`).

Every rank follows the same op order and the same static plan (`trainer.plan`), so all
communication is issued in one global order; process groups are created up front.
"""

from __future__ import annotations

import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist

from autopar.planner.ir import Op, OperatorGraph, Strategy, translate

from . import batchnorm
from .comm import ProcessGroups, RecvAhead, exchange_many, wait_all
from .plan import ExecutionPlan, TaskInfo
from .redistribute import (GradAccumulator, RouteView, backward_accumulate, backward_sends, forward_inputs,
                           forward_sends, shape_of)
from .shards import Shard, gather_full, make_shards
from .sync import DEFAULT_BUCKET_BYTES, GradSync, plan_buckets


_NO_SPAN = nullcontext()
#: The parts of a step the runtime times: compute of each op's tasks forward and backward, moving
#: inputs and their gradients between ranks (waiting for peers included), waiting for the gradient
#: all-reduces at the end, and the optimizer step.
PHASES = ("fwd", "bwd", "exchange", "grad exchange", "sync", "optimizer step")


class _Span:
    """`Runtime.span`: wall time of one phase, and a profiler label when asked for."""

    __slots__ = ("rt", "phase", "name", "label", "t0")

    def __init__(self, rt: "Runtime", phase: str, name: str):
        self.rt, self.phase, self.name, self.label = rt, phase, name, None

    def __enter__(self):
        if self.rt.annotate:
            self.label = torch.profiler.record_function(self.name)
            self.label.__enter__()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.rt.phases[self.phase] += time.perf_counter() - self.t0
        if self.label is not None:
            self.label.__exit__(*exc)
        return False


@dataclass
class _OpView:
    """One rank's static share of an op: its tasks, parameter slices, input routes, fusion."""

    op: Op
    index: int
    tasks: tuple[TaskInfo, ...]
    param_slices: dict[int, list[tuple[str, tuple[slice, ...] | None]]]  # task -> (parameter, slice of its shard)
    out_shapes: dict[int, list[tuple[int, ...]]]
    routes: list[RouteView]
    dtypes: list[torch.dtype]                                       # of each input
    fused_in: list[bool]        # input j stays attached to its producer's autograd graph
    fused_out: bool             # this op's backward runs inside its consumer's autograd call
    grad: bool
    batch_norm: bool
    input_op: bool
    random: bool = False        # draws random numbers (dropout): seeded per step, see `Runtime.step`

    @property
    def exchanges(self) -> bool:
        """Whether this rank calls the op's exchange forward: a route moves or assembles something
        here, or only assembles its tasks' inputs from this rank's own producers."""
        return any(not rv.idle for rv in self.routes)

    def grad_routes(self) -> list[tuple[RouteView, torch.dtype]]:
        """The routes whose gradients the op's backward exchange moves or accumulates here: those
        that carry one, outside the autograd call of the op (not fused), and are not idle."""
        return [(rv, dtype) for rv, dtype, fused in zip(self.routes, self.dtypes, self.fused_in)
                if rv.route.grads and not fused and not rv.idle]


def exchange_calls(views: Mapping[str, _OpView]) -> tuple[list[str], list[str]]:
    """The ops whose exchange a rank calls in one step where it holds their tasks, forward and
    backward (`Runtime._forward`, `Runtime._backward_op`): the calls whose own work the simulator
    charges (`autopar.planner.sim.trainer_model._local_calls`, ``local_exchange_s``)."""
    fwd = [name for name, v in views.items() if v.tasks and v.exchanges]
    bwd = [name for name, v in views.items() if v.tasks and v.grad and v.grad_routes()]
    return fwd, bwd


class _Accumulators(dict):
    """(op, task) -> one `GradAccumulator` per output, created on first use."""

    def __init__(self, views: dict[str, _OpView]):
        super().__init__()
        self.views = views

    def __missing__(self, key):
        v = self.views[key[0]]
        accs = [GradAccumulator(shape, getattr(torch, out.dtype))
                for shape, out in zip(v.out_shapes[key[1]], v.op.outputs)]
        self[key] = accs
        return accs


def _accumulated(sync: "weakref.ref[GradSync]", param: str) -> None:
    """A shard's gradient hook: tell the runtime's sync, while the runtime lives."""
    live = sync()
    if live is not None:
        live.accumulated(param)


class _ShardUse(torch.autograd.Function):
    """One task's use of a parameter shard (a slice of it, or all of it) whose backward adds the
    task's gradient into that region of the shard's ``.grad`` in place.

    Autograd's own slicing would scatter every use's gradient into a fresh zero tensor the size of
    the whole shard and add that into ``.grad``: for a parameter several ops share under different
    splits (an RNN's cells, a decoder unrolled over time, in mixed and searched plans), a fill, a
    copy and a full-size add per use.  An rnnlm plan spent 23 ms of a 165 ms step there (8 MiB
    decoder shard, 9 uses); the simulator, whose profile adds each task's gradient into a
    parameter of the task's own size (`planner.cost.measure_task`), charged none of it.  Adding
    into the region costs what the profile measures.  The shard's own ``AccumulateGrad`` never
    runs, so its post-accumulate hook does not fire: every use tells the sync itself
    (`Runtime._expected_calls` counts uses for these parameters)."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, where, name: str, sync):
        ctx.shard, ctx.where, ctx.name, ctx.sync = shard, where, name, sync
        return shard.view_as(shard) if where is None else shard[where]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        t = ctx.shard
        if t.grad is None:
            t.grad = torch.zeros_like(t)
        (t.grad if ctx.where is None else t.grad[ctx.where]).add_(grad)
        _accumulated(ctx.sync, ctx.name)
        return None, None, None, None


class Runtime:
    """One rank's share of a plan: its tasks, its parameter shards and its communication."""

    def __init__(self, graph: OperatorGraph, strategy: Strategy, module: torch.nn.Module, *, rank: int,
                 world_size: int, groups: ProcessGroups, device: torch.device | str = "cpu",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, fuse: bool = True, seed: int = 0):
        from autopar.planner.ir import kernels  # the planner's task kernels (shared with the profiler)
        self.kernels = kernels
        self.graph = graph
        self.strategy = strategy
        self.module = module
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        #: Seed of the random ops (dropout): op i at step k draws from ``kernels.op_seed(seed, k, i)``
        #: the whole op's mask and takes its tasks' regions, so the masks do not depend on the plan.
        self.seed = seed
        self.steps_run = 0
        self.plan = ExecutionPlan(graph, strategy, world_size)
        self.shards: dict[str, Shard] = make_shards(self.plan, rank, dict(module.named_parameters()), self.device)
        self.buckets = plan_buckets(self.plan, bucket_bytes)
        self.bn = batchnorm.BatchNormPlan(self.plan, module)
        self.loss_op = dict(graph.meta).get("loss")
        self.groups = groups
        world = tuple(range(world_size))
        groups.create([("sync", b.devices) for b in self.buckets] + [("bn", d) for d in self.bn.device_sets()]
                      + [("world", world)])
        self.world_group = groups.get("world", world) if world_size > 1 else None
        if world_size > 1:
            # Every rank has created the same groups; NCCL also wants the world communicator set up
            # by a collective before the first (partial) batch of point-to-point operations.
            dist.barrier()
        self.views = self._views(fuse)
        #: Parameters some task on this rank reads a slice of: every use adds its gradient in place.
        self._sliced = {name for v in self.views.values() for uses in v.param_slices.values()
                        for name, where in uses if where is not None}
        self.sync = GradSync(rank, self.buckets, groups, self.shards, self._expected_calls())
        # The hooks reach the sync through a weak reference: a hook holding it (or the runtime) would
        # make a cycle through the shards' tensors that the garbage collector cannot see, keeping
        # the runtime and its process groups alive into interpreter shutdown, where gloo's worker
        # threads, freeing their last tensors, abort the process (a rank "succeeded" with SIGABRT).
        sync = self._sync_ref = weakref.ref(self.sync)
        for name, shard in self.shards.items():
            if shard.tensor.requires_grad and name not in self._sliced:
                shard.tensor.register_post_accumulate_grad_hook(lambda _t, n=name: _accumulated(sync, n))
        self._pending: list = []
        #: gloo's receives are posted ahead of the exchanges that wait for them (`RecvAhead`); NCCL
        #: runs a receive on a stream until its send arrives, so there they go with their exchange.
        self._ahead = (RecvAhead(self.device) if world_size > 1 and dist.is_initialized()
                       and dist.get_backend() == "gloo" else None)
        #: Label the step's phases for torch.profiler (`trainer.trace`); off, they cost nothing.
        self.annotate = False
        #: Wall seconds of the current step by phase (`PHASES`), what `autopar bench accuracy`
        #: compares with the simulated step part by part; reset when a step starts.
        self.phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def span(self, phase: str, detail: str = "") -> "_Span":
        """Time `phase` (one of `PHASES`) into `phases`; while `annotate` is on, also a profiler
        span named ``"<phase> <detail>"``."""
        return _Span(self, phase, f"{phase} {detail}" if detail else phase)

    def _views(self, fuse: bool) -> dict[str, _OpView]:
        plan, rank, g = self.plan, self.rank, self.graph
        views: dict[str, _OpView] = {}
        for i, op in enumerate(g.ops):
            tasks = plan.local_tasks(op.name, rank)
            # A task that reads its whole shard gets the shard itself; a parameter some task here
            # reads a slice of goes through `_ShardUse` in every task (`_task_params`).
            slices = {t.index: [(p.name, None if op.param_box(j, t.range_map) == self.shards[p.name].box
                                 else translate(op.param_box(j, t.range_map), self.shards[p.name].box))
                                for j, p in enumerate(op.params)] for t in tasks}
            shapes = {t.index: [shape_of(op.output_box(k, t.range_map)) for k in range(len(op.outputs))] for t in tasks}
            routes = [RouteView(plan, r, rank) for r in plan.routes[op.name]]
            dtypes = [getattr(torch, g.input_spec(op, j).dtype) for j in range(len(op.inputs))]
            views[op.name] = _OpView(op, i, tasks, slices, shapes, routes, dtypes, [False] * len(routes), False,
                                     plan.requires_grad[op.name], self.bn.handles(op.name), op.kind == "input",
                                     self.kernels.is_random(op))
        if fuse:
            for v in views.values():
                for j, rv in enumerate(v.routes):
                    if self._fusable(rv, views):
                        v.fused_in[j] = True
                        views[rv.producer].fused_out = True
        return views

    def _expected_calls(self) -> dict[str, int]:
        """parameter -> how many ``autograd.backward`` calls of a step add to its shard gradient here.

        One call per unfused task (its chain of fused producers included), one per batch-norm op.
        An overestimate would only delay the bucket to its planned position; it is exact by
        construction: every task maps to the call that runs its backward.  A parameter some task
        reads a slice of is counted per use instead (task and parameter position): each use's
        `_ShardUse` reports itself.
        """
        g = self.graph
        call: dict[tuple[str, int], tuple[str, int]] = {}
        for v in reversed(list(self.views.values())):
            for t in v.tasks:
                if v.batch_norm:
                    call[(v.op.name, t.index)] = (v.op.name, -1)
                elif v.fused_out:
                    consumer, j, _ = g.consumers[v.op.name][0]
                    rv = self.views[consumer].routes[j]
                    ct = next(p.readers[0][0] for p in rv.local if p.src_task == t.index)
                    call[(v.op.name, t.index)] = call[(consumer, ct)]
                else:
                    call[(v.op.name, t.index)] = (v.op.name, t.index)
        calls: dict[str, set] = {}
        for v in self.views.values():
            for j, p in enumerate(v.op.params):
                for t in v.tasks:
                    calls.setdefault(p.name, set()).add((v.op.name, t.index, j) if p.name in self._sliced
                                                        else call[(v.op.name, t.index)])
        return {p: len(c) for p, c in calls.items()}

    def _fusable(self, rv: RouteView, views: dict[str, _OpView]) -> bool:
        """Whether the edge can stay inside one autograd graph on this rank.

        It can when it is purely local and one to one — every local consumer task reads exactly one
        whole local producer task's output and nothing else reads it — and neither end reduces
        statistics across ranks (batch norm's backward has a collective at its own position).
        Such chains (most of a data-parallel model) then need one ``autograd.backward`` call
        instead of one per op; the ops' order of communication is unchanged.
        """
        g = self.graph
        route, prod, cons = rv.route, views[rv.producer], views[rv.consumer]
        if not route.grads or route.sums or prod.batch_norm or cons.batch_norm or prod.input_op:
            return False
        if len(prod.op.outputs) != 1 or len(g.consumers[rv.producer]) != 1 or rv.sends or rv.recvs:
            return False
        if not prod.tasks or not all(rv.direct.values()):
            return False
        if any(p.src_where is not None or len(p.readers) != 1 for p in rv.local):
            return False
        return sorted(p.src_task for p in rv.local) == sorted(t.index for t in prod.tasks)

    # -- parameters -----------------------------------------------------------------------------
    def parameters(self) -> list[torch.Tensor]:
        """This rank's shard tensors (leaves), in graph parameter order: what the optimizer steps."""
        return [self.shards[p].tensor for p in self.graph.param_specs if p in self.shards]

    def named_shards(self) -> dict[str, Shard]:
        return self.shards

    def zero_grad(self) -> None:
        self.sync.zero_grad()

    def gather(self, which: str = "param", dst: int = 0, names: list[str] | None = None) -> dict | None:
        """Full tensors of the parameters (``which="param"``) or their gradients (``"grad"``) on `dst`."""
        names = names or list(self.graph.param_specs)

        def local(n: str):
            s = self.shards.get(n)
            if s is None:
                return None
            return s.tensor.detach() if which == "param" else s.tensor.grad
        return gather_full(self.plan, self.rank, local, names, dst, self.device)

    # -- one step ----------------------------------------------------------------------------------
    def step(self, data: Mapping[str, torch.Tensor], step: int | None = None) -> torch.Tensor:
        """Forward, backward and gradient synchronization of one batch; returns this rank's part of
        the loss (the partial sums of its loss tasks; summed over ranks it is the global mean).
        The shards' gradients are this batch's (set, not accumulated across calls).  `step` (default:
        the number of steps this runtime has run) seeds the random ops with `seed`."""
        self.phases = dict.fromkeys(PHASES, 0.0)
        if self._ahead is not None:
            self._ahead.begin_step()
        self.sync.zero_grad()
        step = self.steps_run if step is None else step
        self.steps_run = step + 1
        acts, leaves = self._forward(data, step)
        loss = self._local_loss(acts)
        self._backward(acts, leaves)
        if self._ahead is not None:
            self._ahead.end_step()
        with self.span("sync"):
            self.sync.finish()
            wait_all(self._pending)
        self.bn.finish_step()
        return loss

    def _local_loss(self, acts) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.loss_op is None:
            return total
        for t in self.views[self.loss_op].tasks:
            total += acts[(self.loss_op, t.index)][0].detach().to(torch.float64).sum()
        return total

    def _forward(self, data: Mapping[str, torch.Tensor], step: int = 0):
        rank = self.rank
        acts: dict[tuple[str, int], list[torch.Tensor]] = {}
        leaves: dict[tuple[str, int], list[torch.Tensor]] = {}
        for v in self.views.values():
            op = v.op
            inputs: dict[int, list] = {t.index: [None] * len(v.routes) for t in v.tasks}
            with torch.no_grad(), (self.span("exchange", op.name) if v.exchanges else _NO_SPAN):
                sends, recvs = {}, {}
                for rv, dtype in zip(v.routes, v.dtypes):
                    if not rv.idle:
                        sends.update({(d, rv.j): t for d, t in forward_sends(rv, acts).items()})
                        recvs.update({(s, rv.j): (n, dtype) for s, n in rv.recv_sizes.items()})
                got = exchange_many(sends, recvs, self.device, self._pending, self._ahead)
                for rv, dtype in zip(v.routes, v.dtypes):
                    if not rv.idle:
                        mine = {s: got[(s, rv.j)] for s in rv.recv_sizes}
                        for ct, x in forward_inputs(rv, acts, mine, dtype, self.device).items():
                            inputs[ct][rv.j] = x
            if not v.tasks:
                continue
            for t in v.tasks:
                xs = inputs[t.index]
                for j, rv in enumerate(v.routes):
                    if not v.fused_in[j]:
                        x = xs[j].detach()
                        if rv.route.grads and x.dtype.is_floating_point:
                            x.requires_grad_(True)
                        xs[j] = x
                leaves[(op.name, t.index)] = xs
            with torch.set_grad_enabled(v.grad), self.span("fwd", op.name):
                if v.input_op:
                    full = data[op.name]
                    for t in v.tasks:
                        box = op.output_box(0, t.range_map)
                        acts[(op.name, t.index)] = [full[tuple(slice(lo, hi) for lo, hi in box)].to(self.device)]
                elif v.batch_norm:
                    outs = self.bn.forward(op, v.tasks, inputs, self._task_params, rank, self.groups, self.kernels)
                    for t in v.tasks:
                        acts[(op.name, t.index)] = outs[t.index]
                else:
                    seed = self.kernels.op_seed(self.seed, step, v.index) if v.random else None
                    for t in v.tasks:
                        outs = self.kernels.forward_task(op, t.range_map, inputs[t.index], self._task_params(op, t),
                                                         module=self.module, device=self.device, seed=seed)
                        acts[(op.name, t.index)] = list(outs)
        return acts, leaves

    def _task_params(self, op: Op, task: TaskInfo) -> list[torch.Tensor]:
        out = []
        for name, where in self.views[op.name].param_slices[task.index]:
            t = self.shards[name].tensor
            if name in self._sliced and t.requires_grad and torch.is_grad_enabled():
                t = _ShardUse.apply(t, where, name, self._sync_ref)
            elif where is not None:
                t = t[where]
            out.append(t)
        return out

    def _backward(self, acts, leaves) -> None:
        rank = self.rank
        accs = _Accumulators(self.views)
        if self.loss_op is not None:
            for t in self.views[self.loss_op].tasks:
                out = acts[(self.loss_op, t.index)][0]
                accs[(self.loss_op, t.index)][0].add(None, torch.ones_like(out))
        input_grads: dict[tuple[str, int], list[torch.Tensor | None]] = {}
        for v in reversed(list(self.views.values())):
            # A rank with no task of the op may still hold producers that receive its gradients.
            if v.grad and (v.tasks or any(not rv.idle for rv in v.routes)):
                self._backward_op(v, acts, leaves, accs, input_grads)
            self.sync.after_backward(v.index)

    def _backward_op(self, v: _OpView, acts, leaves, accs, input_grads) -> None:
        op = v.op
        with self.span("bwd", op.name):
            self._backward_tasks(v, acts, accs)
        for t in v.tasks:
            key = (op.name, t.index)
            input_grads[key] = [x.grad if x.is_leaf and x.requires_grad else None for x in leaves.get(key, ())]
        moving = v.grad_routes()
        with torch.no_grad(), (self.span("grad exchange", op.name) if moving else _NO_SPAN):
            sends, recvs = {}, {}
            for rv, dtype in moving:
                sends.update({(d, rv.j): t for d, t in backward_sends(rv, input_grads, accs, dtype, self.device).items()})
                recvs.update({(d, rv.j): (n, dtype) for d, n in rv.send_sizes.items()})
            got = exchange_many(sends, recvs, self.device, self._pending, self._ahead)
            for rv, _ in moving:
                backward_accumulate(rv, {d: got[(d, rv.j)] for d in rv.send_sizes}, accs)
        for t in v.tasks:
            key = (op.name, t.index)
            acts.pop(key, None)
            leaves.pop(key, None)
            accs.pop(key, None)
            input_grads.pop(key, None)

    def _backward_tasks(self, v: _OpView, acts, accs) -> None:
        """The autograd calls of op `v`'s tasks on this rank (none for an op fused into its consumer)."""
        op = v.op
        if v.batch_norm:
            self.bn.backward(op, v.tasks, acts, accs, self.rank, self.groups)
        elif not v.fused_out:
            for t in v.tasks:
                key = (op.name, t.index)
                if key not in accs:
                    continue
                outs, grads = [], []
                for o, acc in zip(acts[key], accs[key]):
                    if o.requires_grad and acc.value is not None:
                        outs.append(o)
                        grads.append(acc.value)
                if outs:
                    torch.autograd.backward(outs, grads)
