"""Moving tensor regions between two partitionings, forward and backward.

A consumer task reads one box of each input (with its convolution halo, `planner.ir.graph.AxisMap`);
the producer's tasks each hold one box of that tensor.  The pieces that move are exactly the
intersections (FlexFlow sec. 5.1), planned once in `trainer.plan.InputRoute`: one message per
(source device, destination device) carries that pair's pieces back to back, so a piece several
consumer tasks on one device read travels once.  Pieces between tasks on the same device are
read in place, and a consumer box that is exactly one local producer box is that tensor itself;
one that is a strided cut of one gets a contiguous copy, as its op was profiled.

Backward, the gradient of every piece goes back along the reverse path: the destination device
adds up what its consumer tasks computed for the piece (halos overlap), sends one message per
pair, and the producer adds the pieces into its output gradient — overlapping contributions add.

A `RouteView` is one rank's share of a route with every slice precomputed, so a step does no
region arithmetic.  The functions are transport-free — they take and return plain tensors keyed
by peer — so the same code runs under `torch.distributed` (`trainer.comm.exchange`) and in the
single-process tests that play every rank in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from autopar.planner.ir import Box, translate, volume

from .plan import ExecutionPlan, InputRoute, Move

# (op name, task index) -> the task's output tensors, or its input leaves / their gradients
TaskTensors = Mapping[tuple[str, int], Sequence[torch.Tensor | None]]
Slices = tuple[slice, ...]


def shape_of(box: Box) -> tuple[int, ...]:
    return tuple(max(0, hi - lo) for lo, hi in box)


class GradAccumulator:
    """The gradient of one output region of one task, summed from every piece that reaches it.

    The first contribution that covers the whole region is kept without a copy; a later one
    makes the buffer private before adding, so a tensor borrowed from a consumer is never changed.
    """

    __slots__ = ("shape", "dtype", "value", "_owned")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype):
        self.shape = shape
        self.dtype = dtype
        self.value: torch.Tensor | None = None
        self._owned = False

    def add(self, where: Slices | None, piece: torch.Tensor) -> None:
        """Add `piece` at `where` (None: the whole region)."""
        if self.value is None and where is None:
            self.value, self._owned = piece, False
            return
        if self.value is None:
            self.value, self._owned = torch.zeros(self.shape, dtype=self.dtype, device=piece.device), True
        elif not self._owned:
            self.value, self._owned = self.value.clone(), True
        if where is None:
            self.value += piece
        else:
            self.value[where] += piece

    def get(self, device: torch.device | str = "cpu") -> torch.Tensor:
        if self.value is None:
            return torch.zeros(self.shape, dtype=self.dtype, device=device)
        return self.value


@dataclass(frozen=True)
class PieceView:
    src_task: int
    src_where: Slices | None            # in the producer task's output (None: all of it)
    shape: tuple[int, ...]
    numel: int
    readers: tuple[tuple[int, Slices | None], ...]   # (consumer task, where in its input box)


class RouteView:
    """One rank's part of an `InputRoute`, with every slice computed once."""

    def __init__(self, plan: ExecutionPlan, route: InputRoute, rank: int):
        g = plan.graph
        consumer, producer = g[route.consumer], g[route.producer]
        self.route = route
        self.producer, self.consumer, self.out_index, self.j = route.producer, route.consumer, route.out_index, route.j
        self.sums = route.sums
        pboxes = {t.index: plan.output_box(producer, route.out_index, t) for t in plan.tasks[route.producer]}
        self.in_boxes = {t.index: plan.input_box(consumer, route.j, t) for t in plan.local_tasks(route.consumer, rank)}

        def view(mv: Move) -> list[PieceView]:
            out = []
            for p in mv.pieces:
                readers = tuple((ct, _where(p.box, self.in_boxes[ct])) for ct in p.dst_tasks) if mv.dst == rank else ()
                out.append(PieceView(p.src_task, _where(p.box, pboxes[p.src_task]), shape_of(p.box), p.numel, readers))
            return out
        self.sends = [(mv.dst, view(mv)) for mv in route.moves if mv.src == rank and mv.dst != rank]
        self.recvs = [(mv.src, view(mv)) for mv in route.moves if mv.dst == rank and mv.src != rank]
        self.local = [pv for mv in route.moves if mv.src == rank and mv.dst == rank for pv in view(mv)]
        self.send_sizes = {d: sum(p.numel for p in ps) for d, ps in self.sends}
        self.recv_sizes = {s: sum(p.numel for p in ps) for s, ps in self.recvs}
        readers: dict[int, list[PieceView]] = {ct: [] for ct in self.in_boxes}
        for _, ps in self.recvs:
            for p in ps:
                for ct, _ in p.readers:
                    readers[ct].append(p)
        for p in self.local:
            for ct, _ in p.readers:
                readers[ct].append(p)
        # A consumer box that is one whole piece needs no assembly buffer.
        self.direct = {ct: len(ps) == 1 and ps[0].readers and dict(ps[0].readers)[ct] is None
                       for ct, ps in readers.items()}
        for ct, box in self.in_boxes.items():
            covered = sum(p.numel for p in readers[ct])
            if not self.sums and covered != volume(box):
                raise ValueError(f"{consumer.describe()}: input {route.j} of task {ct} would receive {covered} of the "
                                 f"{volume(box)} elements of its box {box}; the tasks of {route.producer} do not tile it")
        self.idle = not (self.sends or self.recvs or self.in_boxes)


def _where(box: Box, origin: Box) -> Slices | None:
    return None if box == origin else translate(box, origin)


def _cut(t: torch.Tensor, where: Slices | None) -> torch.Tensor:
    return t if where is None else t[where]


# -- forward ------------------------------------------------------------------------------------

def forward_sends(v: RouteView, outputs: TaskTensors) -> dict[int, torch.Tensor]:
    """Destination device -> the flat message this rank sends it."""
    return {dst: _pack([_cut(outputs[(v.producer, p.src_task)][v.out_index], p.src_where) for p in ps])
            for dst, ps in v.sends}


def forward_inputs(v: RouteView, outputs: TaskTensors, received: Mapping[int, torch.Tensor],
                   dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """Consumer task -> its input box, assembled from local and received pieces."""
    result: dict[int, torch.Tensor] = {}
    bufs: dict[int, torch.Tensor] = {}
    for ct, box in v.in_boxes.items():
        if not v.direct[ct]:
            fill = torch.zeros if v.sums or volume(box) == 0 else torch.empty
            bufs[ct] = result[ct] = fill(shape_of(box), dtype=dtype, device=device)

    def place(p: PieceView, value: torch.Tensor) -> None:
        for ct, where in p.readers:
            if v.direct[ct]:
                result[ct] = value
            elif v.sums:
                bufs[ct][_slices(where)] += value
            else:
                bufs[ct][_slices(where)].copy_(value)
    for p in v.local:
        value = _cut(outputs[(v.producer, p.src_task)][v.out_index], p.src_where)
        if p.src_where is not None and any(v.direct[ct] for ct, _ in p.readers) and not value.is_contiguous():
            # A consumer that reads a strided cut of a local output as it is runs slower than it
            # was profiled, on one run of memory: a GELU over half the features of 32x64x512
            # floats, forward and backward, took 5.2 ms strided and 3.1 ms on a copy, which took
            # 0.09 ms (one thread, AMD EPYC; docs/simulation.md, "Thirty-eighth round").
            value = value.contiguous()
        place(p, value)
    for src, ps in v.recvs:
        for p, value in zip(ps, _unpack(received[src], ps)):
            place(p, value)
    return result


# -- backward -----------------------------------------------------------------------------------

def backward_sends(v: RouteView, input_grads: TaskTensors, accumulators: Mapping[tuple[str, int], Sequence[GradAccumulator]],
                   dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """Add the gradients of pieces that stay on this rank; return producer device -> message.

    `input_grads[(consumer, task)][j]` is the gradient of the task's input box j (None: zero).
    """
    for p in v.local:
        g = _piece_grad(v, input_grads, p)
        if g is not None:
            accumulators[(v.producer, p.src_task)][v.out_index].add(p.src_where, g)
    out = {}
    for src, ps in v.recvs:
        grads = [_piece_grad(v, input_grads, p) for p in ps]
        out[src] = _pack([g if g is not None else torch.zeros(p.shape, dtype=dtype, device=device)
                          for p, g in zip(ps, grads)])
    return out


def backward_accumulate(v: RouteView, received: Mapping[int, torch.Tensor],
                        accumulators: Mapping[tuple[str, int], Sequence[GradAccumulator]]) -> None:
    for dst, ps in v.sends:
        for p, value in zip(ps, _unpack(received[dst], ps)):
            accumulators[(v.producer, p.src_task)][v.out_index].add(p.src_where, value)


# -- helpers ------------------------------------------------------------------------------------

def _slices(where: Slices | None):
    return where if where is not None else Ellipsis


def _piece_grad(v: RouteView, input_grads: TaskTensors, p: PieceView) -> torch.Tensor | None:
    acc = None
    for ct, where in p.readers:
        g = input_grads[(v.consumer, ct)][v.j]
        if g is None:
            continue
        piece = _cut(g, where)
        acc = piece if acc is None else acc + piece
    return acc


def _pack(pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(pieces) == 1:
        return pieces[0].contiguous().view(-1)
    return torch.cat([p.reshape(-1) for p in pieces])


def _unpack(flat: torch.Tensor, pieces: Sequence[PieceView]) -> list[torch.Tensor]:
    out, at = [], 0
    for p in pieces:
        out.append(flat[at:at + p.numel].view(p.shape))
        at += p.numel
    if at != flat.numel():
        raise RuntimeError(f"a message has {flat.numel()} elements, the plan expects {at}")
    return out
