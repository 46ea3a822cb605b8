"""Batch norm with exact global statistics under sample and attribute partitioning.

Training-mode batch norm normalizes every channel with the mean and variance over *all* samples
and positions.  When the op is split along n, h or w, the tasks that share a channel slice each see
only part of them (the statistics are "cross-partition", `planner.ir.opkinds._conv`).  Each such
task computes its per-channel partial sums (`kernels.batch_norm_partial_stats`); the partials of
a rank's tasks are added, then all-reduced among the ranks that hold the slice; every task
normalizes with the same global (mean, var).  The running statistics are updated from the global
values exactly as `nn.BatchNorm2d` does, on every rank that holds the slice.

The gradient crosses the same reduction backward: the gradient of the global sums collected from
all local tasks is all-reduced in the same group and fed back through each task's partial sums.
A slice whose tasks all sit on one rank needs no collective and autograd handles it directly.
Groups are per (op, channel slice); a rank issues its slices in ascending order, the same on
every rank, so the all-reduces of different groups can never wait on each other in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from .plan import ExecutionPlan, TaskInfo


@dataclass
class _SliceState:
    """One channel slice of one op on this rank during a step."""

    tasks: list[int]
    partial: torch.Tensor | None = None     # local (sum ‖ sum of squares), attached to the tasks' inputs
    total: torch.Tensor | None = None       # global (sum ‖ sum of squares), a leaf when it crossed ranks
    devices: tuple[int, ...] = ()


@dataclass
class BatchNormPlan:
    plan: ExecutionPlan
    module: torch.nn.Module
    _state: dict[str, dict[tuple[int, int], _SliceState]] = field(default_factory=dict)

    def handles(self, op_name: str) -> bool:
        op = self.plan.graph[op_name]
        return op.kind == "batch_norm" and bool(op.attr("batch_stats"))

    def slices(self, op_name: str) -> dict[tuple[int, int], tuple[int, ...]]:
        """channel range -> the devices whose tasks normalize that channel range."""
        op = self.plan.graph[op_name]
        out: dict[tuple[int, int], set[int]] = {}
        for t in self.plan.tasks[op_name]:
            out.setdefault(_channels(op, t.range_map), set()).add(t.device)
        return {k: tuple(sorted(v)) for k, v in sorted(out.items())}

    def device_sets(self) -> list[tuple[int, ...]]:
        return [devs for op in self.plan.graph.ops if self.handles(op.name)
                for devs in self.slices(op.name).values() if len(devs) > 1]

    # -- forward --------------------------------------------------------------------------------
    def forward(self, op, local: Sequence[TaskInfo], inputs: Mapping[int, list], task_params: Callable,
                rank: int, groups, kernels) -> dict[int, list[torch.Tensor]]:
        slices = self.slices(op.name)
        state: dict[tuple[int, int], _SliceState] = {}
        for t in local:
            state.setdefault(_channels(op, t.range_map), _SliceState([])).tasks.append(t.index)
        counts = {}
        for key in sorted(state):
            st = state[key]
            st.devices = slices[key]
            sums, squares, count = [], [], 0
            for ti in st.tasks:
                s, q, n = kernels.batch_norm_partial_stats(op, inputs[ti][0])
                sums.append(s)
                squares.append(q)
                count += n
            st.partial = torch.cat([sum(sums), sum(squares)])
            if len(st.devices) > 1:
                with torch.no_grad():
                    flat = torch.cat([st.partial.detach(), torch.tensor([float(count)], dtype=st.partial.dtype,
                                                                        device=st.partial.device)])
                    dist.all_reduce(flat, group=groups.get("bn", st.devices))
                st.total = flat[:-1].clone().requires_grad_(st.partial.requires_grad)
                counts[key] = int(round(float(flat[-1])))
            else:
                st.total = st.partial
                counts[key] = count
        outs: dict[int, list[torch.Tensor]] = {}
        for key in sorted(state):
            st = state[key]
            c = st.total.shape[0] // 2
            mean, var = kernels.batch_norm_stats([(st.total[:c], st.total[c:], counts[key])])
            kernels.batch_norm_update_running(op, self.module, mean, var, counts[key], key)
            for ti in st.tasks:
                task = self.plan.tasks[op.name][ti]
                outs[ti] = list(kernels.forward_task(op, task.range_map, inputs[ti], task_params(op, task),
                                                     module=self.module, bn_stats=(mean, var)))
        self._state[op.name] = state
        return outs

    # -- backward -------------------------------------------------------------------------------
    def backward(self, op, local: Sequence[TaskInfo], acts, accs, rank: int, groups) -> None:
        state = self._state.pop(op.name, {})
        outs, grads = [], []
        for t in local:
            key = (op.name, t.index)
            acc = accs[key][0]
            o = acts[key][0]
            if o.requires_grad:
                outs.append(o)
                grads.append(acc.get(o.device))
        if outs:
            torch.autograd.backward(outs, grads)
        for key in sorted(state):
            st = state[key]
            if st.total is st.partial or not st.partial.requires_grad:
                continue
            g = st.total.grad if st.total.grad is not None else torch.zeros_like(st.total)
            g = g.contiguous()
            dist.all_reduce(g, group=groups.get("bn", st.devices))
            torch.autograd.backward([st.partial], [g])

    def finish_step(self) -> None:
        self._state.clear()

    # -- running statistics for checkpoints -----------------------------------------------------
    def running_owners(self) -> list[tuple[str, str, tuple[int, int], int]]:
        """(op, module path, channel slice, lowest holding device) for every BN slice."""
        out = []
        for op in self.plan.graph.ops:
            if op.kind != "batch_norm":
                continue
            for key, devs in self.slices(op.name).items():
                out.append((op.name, op.attr("module"), key, devs[0]))
        return out


def _channels(op, ranges) -> tuple[int, int]:
    out = op.outputs[0]
    return tuple(ranges.get(out.dims[1], (0, out.shape[1])))
