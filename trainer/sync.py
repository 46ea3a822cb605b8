"""Parameter shard synchronization: all-reduce each gradient cell among the devices that hold it.

Which devices synchronize what is the simulator's model (`planner.sim._plans._sync_groups`,
FlexFlow sec. 5.1 "parameter synchronization"): the union of the parameter regions every device's
tasks read is cut into cells; a cell held by several devices is all-reduced among exactly those
devices.  Data parallelism gives one cell (the whole parameter) held by all replicas; splitting a
parameter dimension gives one cell per shard, held by the replicas of that shard only; a shard
held by one device needs no synchronization.

The loss is divided by the global batch in every task (`planner.ir.kernels`), so the all-reduce sums.

Ordering.  A parameter's gradient is final on a rank after the backward pass of its *first* user
in graph order (ops that share it — unrolled recurrent steps — have all added their part by
then).  Cells become ready in reverse graph order; they are packed, in that order, into buckets
per device set, and a bucket is issued as an asynchronous all-reduce as soon as it is final: full,
or, for the last one of a device set, holding its last cell (the overlap of communication with
the rest of the backward pass that DDP's buckets give).  The buckets are planned once from the
plan, identically on every rank, so every group sees its all-reduces issued in the same order by
all its members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import torch
import torch.distributed as dist

from autopar.planner.ir import Box, translate, volume
from autopar.planner.sim import DEFAULT_BUCKET_BYTES, plan_buckets as sim_plan_buckets

from .launch import own_gloo_call
from .plan import ExecutionPlan

if TYPE_CHECKING:
    from .shards import Shard



@dataclass(frozen=True)
class SyncEntry:
    param: str
    box: Box  # a cell of the parameter's view, in global coordinates

    @property
    def numel(self) -> int:
        return volume(self.box)


@dataclass(frozen=True)
class Bucket:
    devices: tuple[int, ...]
    entries: tuple[SyncEntry, ...]
    after_op: int  # graph index of the op after whose backward pass the bucket is issued

    @property
    def numel(self) -> int:
        return sum(e.numel for e in self.entries)


def plan_buckets(plan: ExecutionPlan, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """All buckets of a step in issue order (the same list on every rank): the planner's buckets
    (`planner.sim.plan_buckets`), so the simulator times exactly the all-reduces this issues.

    One open bucket per (device set, dtype); cells join in the order their parameters become final.
    """
    return [Bucket(b.devices, tuple(SyncEntry(p, box) for p, box in b.entries), b.after_op)
            for b in sim_plan_buckets(plan.graph, plan.param_holdings, bucket_bytes)]


class GradSync:
    """Issues this rank's buckets as asynchronous all-reduces and writes the sums back.

    Buckets are issued strictly in the planned order, each as soon as it is known to be final:
    either every parameter in it has received all the gradient contributions this rank will make
    (`expected` autograd calls reach it; counted by ``post_accumulate_grad`` hooks, which lets a
    bucket leave in the middle of a long backward call, as DDP's do), or the backward pass has
    passed the bucket's planned position.  Issue order is the same on every rank by construction;
    only the moment differs, and asynchronous all-reduces do not block each other.
    """

    def __init__(self, rank: int, buckets: list[Bucket], groups, shards: Mapping[str, "Shard"],
                 expected: Mapping[str, int] | None = None):
        self.rank = rank
        self.mine = [b for b in buckets if rank in b.devices]
        self.params = [{e.param for e in b.entries} for b in self.mine]
        self.groups = groups
        self.shards = shards
        self.expected = dict(expected or {})
        # A bucket of whole shards owns its gradients' memory: every shard's ``.grad`` is a view into
        # one flat buffer (DDP's gradient_as_bucket_view), so autograd accumulates straight into
        # it and the all-reduce runs in place — no packing or unpacking copies.
        self._flat: dict[int, tuple[torch.Tensor, list[tuple[str, int, int]]]] = {}
        for k, b in enumerate(self.mine):
            if all(e.box == shards[e.param].box for e in b.entries) and len(self.params[k]) == len(b.entries):
                t0 = shards[b.entries[0].param].tensor
                buf = torch.zeros(b.numel, dtype=t0.dtype, device=t0.device)
                spans, at = [], 0
                for e in b.entries:
                    spans.append((e.param, at, at + e.numel))
                    at += e.numel
                self._flat[k] = (buf, spans)
        self._fired: dict[str, int] = {}
        self._ready: set[str] = set()
        self._floor = None
        self._next = 0
        self._inflight: list[tuple[object, Bucket, torch.Tensor, bool]] = []

    def zero_grad(self) -> None:
        """Start a step: bucket-owned gradients are zeroed views, every other gradient is None."""
        owned = set()
        for buf, spans in self._flat.values():
            buf.zero_()
            for name, a, b in spans:
                t = self.shards[name].tensor
                t.grad = buf[a:b].view(t.shape)
                owned.add(name)
        for name, s in self.shards.items():
            if name not in owned:
                s.tensor.grad = None

    def accumulated(self, param: str) -> None:
        """Hook: one autograd call has added its contribution to `param`'s shard gradient."""
        n = self._fired.get(param, 0) + 1
        self._fired[param] = n
        if n >= self.expected.get(param, 1 << 30):
            self._ready.add(param)
            self._advance()

    def after_backward(self, op_index: int) -> None:
        self._floor = op_index
        self._advance()

    def _advance(self) -> None:
        while self._next < len(self.mine):
            b = self.mine[self._next]
            if not ((self._floor is not None and b.after_op >= self._floor) or self.params[self._next] <= self._ready):
                return
            self._issue(self._next)
            self._next += 1

    def _issue(self, k: int) -> None:
        b = self.mine[k]
        if k in self._flat:
            flat, in_place = self._flat[k][0], True
        else:
            views = [self._view(e) for e in b.entries]
            # A bucket that is exactly one whole contiguous shard is reduced in place, too.
            in_place = len(views) == 1 and views[0].is_contiguous() and \
                views[0].numel() == self._grad(b.entries[0].param).numel()
            flat = views[0].view(-1) if in_place else torch.cat([v.reshape(-1) for v in views])
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.groups.get("sync", b.devices), async_op=True)
        self._inflight.append((work, b, flat, in_place))

    def finish(self) -> None:
        """Wait for every all-reduce of the step and unpack the sums into the shard gradients.

        The rank has nothing else to do while it waits, so gloo's network threads do not preempt
        it meanwhile (`own_gloo_call`): a 1 MiB all-reduce waited for with nothing overlapping it
        took 3.1-3.6 ms (median) with them ordinary and 0.5-0.8 ms with them yielding (2 ranks,
        2026-11-27, docs/simulation.md "Eleventh round")."""
        self._floor = -1
        self._advance()
        with own_gloo_call():
            for work, b, flat, in_place in self._inflight:
                work.wait()
                if in_place:
                    continue
                at = 0
                for e in b.entries:
                    v = self._view(e)
                    v.copy_(flat[at:at + e.numel].view(v.shape))
                    at += e.numel
        self._inflight.clear()
        self._fired.clear()
        self._ready.clear()
        self._floor = None
        self._next = 0

    def _grad(self, name: str) -> torch.Tensor:
        t = self.shards[name].tensor
        if t.grad is None:
            t.grad = torch.zeros_like(t)
        return t.grad

    def _view(self, e: SyncEntry) -> torch.Tensor:
        return self._grad(e.param)[translate(e.box, self.shards[e.param].box)]
