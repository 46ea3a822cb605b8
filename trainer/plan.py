"""The static execution plan every rank derives from (graph, strategy): who runs what, who sends what.

FlexFlow's runtime (paper sec. 7) partitions every op over its own devices and lets the data
dependencies decide the transfers.  A `torch.distributed` job has no central scheduler, so each
rank computes the *same* plan from the same graph and strategy and follows it: the ops in graph
order forward and in reverse order backward, a fixed list of point-to-point moves per op input,
and a fixed list of gradient all-reduce buckets per op.  Because the plan is a pure function of
its inputs, every rank issues its communication in one global order and no collective can ever be
matched against a different one on another rank.

The moves are the communication tasks of the simulator (`planner.sim.taskgraph`, FlexFlow sec. 5.1):
for every edge producer → consumer and every pair (producer task, consumer device) whose regions
intersect — the consumer's region includes its convolution halo — the intersection moves once,
however many consumer tasks on that device read it.  Gradients move back along the same pieces.
Parameter synchronization follows `_sync_groups`: the devices that hold the same cells of a
parameter all-reduce those cells' gradients (see `trainer/sync.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from autopar.planner.ir import Box, Op, OperatorGraph, Range, Strategy, intersect, volume
from autopar.planner.sim import requires_grad

_FLOAT = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Piece:
    """One region of a producer task's output that a device needs (sent once for all its readers)."""

    src_task: int
    box: Box
    dst_tasks: tuple[int, ...]

    @property
    def numel(self) -> int:
        return volume(self.box)


@dataclass(frozen=True)
class Move:
    """Everything device `src` gives device `dst` for one op input, in a fixed piece order.

    ``src == dst`` is a local move: the pieces are read in place, nothing is sent.
    """

    src: int
    dst: int
    pieces: tuple[Piece, ...]

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.pieces)


@dataclass(frozen=True)
class InputRoute:
    """How input `j` of a consumer op reaches its tasks from the producer's tasks."""

    consumer: str
    j: int
    producer: str
    out_index: int
    moves: tuple[Move, ...]
    # The producer splits a reduction dim: its tasks hold partial sums of the same region, so
    # overlapping pieces add up (and each partial producer gets the whole gradient back).
    sums: bool
    grads: bool  # the gradient of this tensor flows back to the producer


@dataclass(frozen=True)
class TaskInfo:
    op: str
    index: int
    device: int
    ranges: tuple[tuple[str, Range], ...]

    @property
    def range_map(self) -> dict[str, Range]:
        return dict(self.ranges)


@dataclass
class ExecutionPlan:
    """Pure function of (graph, strategy): identical on every rank."""

    graph: OperatorGraph
    strategy: Strategy
    world_size: int
    tasks: dict[str, tuple[TaskInfo, ...]] = field(init=False)
    routes: dict[str, tuple[InputRoute, ...]] = field(init=False)
    requires_grad: dict[str, bool] = field(init=False)

    def __post_init__(self) -> None:
        g, s = self.graph, self.strategy
        self.tasks = {}
        for op in g.ops:
            cfg = s[op.name]
            self.tasks[op.name] = tuple(
                TaskInfo(op.name, t, dev, tuple(sorted(op.task_ranges(cfg.degrees, c).items())))
                for t, (c, dev) in enumerate(zip(cfg.coords(), cfg.devices)))
        # The simulator's rule (`planner.sim.requires_grad`), so both agree on which ops have a backward pass.
        self.requires_grad = dict(zip((op.name for op in g.ops), requires_grad(g)))
        self.routes = {op.name: tuple(self._route(op, j) for j in range(len(op.inputs))) for op in g.ops}

    # -- per-rank views ------------------------------------------------------------------------
    def local_tasks(self, op_name: str, rank: int) -> tuple[TaskInfo, ...]:
        return tuple(t for t in self.tasks[op_name] if t.device == rank)

    def devices(self, op_name: str) -> tuple[int, ...]:
        return tuple(sorted({t.device for t in self.tasks[op_name]}))

    def input_box(self, op: Op, j: int, task: TaskInfo) -> Box:
        return op.input_box(j, task.range_map, self.graph.input_spec(op, j).shape)

    def output_box(self, op: Op, k: int, task: TaskInfo) -> Box:
        return op.output_box(k, task.range_map)

    @cached_property
    def param_holdings(self) -> dict[str, dict[int, tuple[Box, ...]]]:
        """parameter -> device -> the boxes of its view that tasks on the device read."""
        out: dict[str, dict[int, set[Box]]] = {}
        for op in self.graph.ops:
            for j, p in enumerate(op.params):
                for t in self.tasks[op.name]:
                    out.setdefault(p.name, {}).setdefault(t.device, set()).add(op.param_box(j, t.range_map))
        return {p: {d: tuple(sorted(b)) for d, b in sorted(held.items())} for p, held in out.items()}

    @cached_property
    def param_ready_index(self) -> dict[str, int]:
        """parameter -> graph index of its first user: after that op's backward its gradient is final."""
        return {p: min(self.graph.index[u] for u in users) for p, users in self.graph.param_users.items()}

    # -- building ------------------------------------------------------------------------------
    def _route(self, op: Op, j: int) -> InputRoute:
        g = self.graph
        ref = op.inputs[j]
        producer = g[ref.op]
        shape = producer.outputs[ref.index].shape
        ptasks, ctasks = self.tasks[producer.name], self.tasks[op.name]
        pboxes = [producer.output_box(ref.index, t.range_map) for t in ptasks]
        # piece key (src task, dst device, box) -> consumer tasks, in first-seen order
        acc: dict[tuple[int, int, Box], list[int]] = {}
        for ct in ctasks:
            cbox = op.input_box(j, ct.range_map, shape)
            if volume(cbox) == 0:
                continue
            for pt, pbox in zip(ptasks, pboxes):
                inter = intersect(pbox, cbox)
                if inter is not None:
                    acc.setdefault((pt.index, ct.device, inter), []).append(ct.index)
        by_pair: dict[tuple[int, int], list[Piece]] = {}
        for (pt, dd, box), cts in acc.items():
            by_pair.setdefault((ptasks[pt].device, dd), []).append(Piece(pt, box, tuple(cts)))
        moves = tuple(Move(s, d, tuple(sorted(ps, key=lambda p: (p.src_task, p.box))))
                      for (s, d), ps in sorted(by_pair.items()))
        sums = any(d > 1 for p, d in zip(producer.pardims, self.strategy[producer.name].degrees)
                   if p.name in producer.reduction_dims)
        spec = producer.outputs[ref.index]
        grads = self.requires_grad[producer.name] and spec.dtype in _FLOAT
        return InputRoute(op.name, j, producer.name, ref.index, moves, sums, grads)


def bounding_box(boxes) -> Box:
    boxes = list(boxes)
    return tuple((min(b[a][0] for b in boxes), max(b[a][1] for b in boxes)) for a in range(len(boxes[0])))
