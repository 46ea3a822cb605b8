"""Parameter shards: the part of every parameter a rank holds, sliced from one full initialisation.

A parameter's *view* (`planner.ir.graph.ParamSpec.view`, e.g. an LSTM weight (4H, I) seen as
(4, H, I)) is the space partitioning works in.  A rank holds, for every parameter its tasks read,
one dense tensor covering the bounding box of the view regions those tasks read (for every
equal-partition configuration the union is the box itself; when two ops sharing a parameter are
partitioned differently the bounding box may also cover cells the rank never reads — those get
no gradient, so SGD and Adam leave them unchanged, and they are never synchronized or saved).

Every rank builds the same full model from the seed and slices its shards from it, so a run under
any plan starts from the same parameters.  `gather_full` is the inverse used by checkpoints and by
the equivalence tests: for every cell of every parameter, its lowest holding rank sends it to the
destination.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from autopar.planner.ir import Box, OperatorGraph, cells, full_box, translate, volume

from .comm import exchange, wait_all
from .plan import ExecutionPlan, bounding_box
from .redistribute import shape_of


@dataclass
class Shard:
    name: str
    box: Box                 # bounding box of the held regions, in view coordinates
    tensor: torch.Tensor     # leaf, shape = shape_of(box)


def make_shards(plan: ExecutionPlan, rank: int, full: Mapping[str, torch.Tensor],
                device: torch.device | str = "cpu") -> dict[str, Shard]:
    """Slice this rank's shards out of the full parameters (named as in ``named_parameters()``)."""
    out: dict[str, Shard] = {}
    for name, held in plan.param_holdings.items():
        boxes = held.get(rank)
        if not boxes:
            continue
        spec = plan.graph.param_specs[name]
        box = bounding_box(boxes)
        src = full[name].detach().reshape(spec.view)
        t = src[tuple(slice(lo, hi) for lo, hi in box)].to(device).clone()
        out[name] = Shard(name, box, t.requires_grad_(src.dtype.is_floating_point))
    return out


def slice_view(full: torch.Tensor, view: tuple[int, ...], box: Box) -> torch.Tensor:
    return full.reshape(view)[tuple(slice(lo, hi) for lo, hi in box)]


def owners(plan: ExecutionPlan, name: str) -> list[tuple[Box, int]]:
    """(cell, lowest holding rank) for every cell of parameter `name`: who reports which values."""
    return [(box, holders[0]) for box, holders in cells(plan.param_holdings[name])]


def gather_full(plan: ExecutionPlan, rank: int, local: Callable[[str], torch.Tensor | None], names: list[str],
                dst: int = 0, device: torch.device | str = "cpu") -> dict[str, torch.Tensor] | None:
    """Assemble full tensors (parameter shape) on `dst` from shard-shaped tensors on their holders.

    `local(name)` returns this rank's shard-shaped tensor for `name` (a parameter, its gradient,
    an optimizer state); None counts as zeros.  Returns the dict on `dst`, None elsewhere.  Every
    rank must call it with the same `names` (it communicates): one message per (source, dtype).
    """
    graph: OperatorGraph = plan.graph
    dev = torch.device(device)
    dtypes = {n: getattr(torch, graph.param_specs[n].dtype) for n in names}
    queued: list[tuple[str, torch.Tensor]] = []
    layout: dict[int, list[tuple[str, Box]]] = {}
    result: dict[str, torch.Tensor] = {}
    for name in names:
        spec = graph.param_specs[name]
        if rank == dst:
            result[name] = torch.zeros(spec.view, dtype=dtypes[name], device=dev)
        mine = local(name) if plan.param_holdings[name].get(rank) else None
        for box, owner in owners(plan, name):
            if owner == rank:
                if mine is None:
                    piece = torch.zeros(shape_of(box), dtype=dtypes[name], device=dev)
                else:
                    piece = mine[translate(box, bounding_box(plan.param_holdings[name][rank]))].to(dtypes[name])
                if rank == dst:
                    result[name][translate(box, full_box(spec.view))] = piece
                else:
                    queued.append((name, piece.reshape(-1)))
            elif rank == dst:
                layout.setdefault(owner, []).append((name, box))
    pending: list = []
    for tag, dtype in enumerate(sorted(set(dtypes.values()), key=str)):
        pieces = [p for n, p in queued if dtypes[n] == dtype]
        sends = {dst: torch.cat(pieces)} if pieces else {}
        sizes = {src: n for src, items in layout.items()
                 if (n := sum(volume(b) for nm, b in items if dtypes[nm] == dtype))}
        got = exchange(rank, sends, sizes, dtype, dev, tag=1000 + tag, pending=pending)
        for src, flat in got.items():
            at = 0
            for name, box in layout[src]:
                if dtypes[name] != dtype:
                    continue
                n = volume(box)
                result[name][translate(box, full_box(graph.param_specs[name].view))] = flat[at:at + n].view(shape_of(box))
                at += n
    wait_all(pending)
    if rank != dst:
        return None
    return {n: t.reshape(graph.param_specs[n].shape) for n, t in result.items()}
