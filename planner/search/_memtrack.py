"""Peak memory per device, kept up to date under one-op changes (for MCMC's proposals).

`planner.sim.memory.peak_memory` sums three kinds of contributions: the parameter state each device
holds (per parameter), the output shards of each op's tasks (per op) and the input pieces each
op receives from other devices (per input edge).  A one-op change touches only its own outputs,
its input and output edges (`planner.sim.memory.edge_memory`, receives posted ahead included)
and its parameters, so `MemoryTracker.change` recomputes exactly those
and adjusts the totals; the result equals `peak_memory` of the new strategy (tested).
"""

from __future__ import annotations

from ..ir.graph import OperatorGraph
from ..ir.regions import union_volume, volume
from ..ir.strategy import ParallelConfig, Strategy
from ..sim.memory import edge_memory
from ..sim.taskgraph import OPTIMIZER_STATES, TaskGraphBuilder


class MemoryTracker:
    def __init__(self, builder: TaskGraphBuilder, strategy: Strategy):
        self.builder = builder
        self.graph: OperatorGraph = builder.graph
        self.strategy = strategy
        self.capacity = [d.memory for d in builder.topology.devices]
        self.total = [0] * builder.num_devices
        self._parts: dict[tuple, dict[int, int]] = {}
        self._factor = 2 + OPTIMIZER_STATES[builder.optimizer]
        self._undo: tuple | None = None
        for name in self.graph.param_specs:
            self._set(("param", name), self._param(name))
        for op in self.graph.ops:
            self._set(("out", op.name), self._outputs(op.name))
            for j in range(len(op.inputs)):
                self._set(("edge", op.name, j), self._edge(op.name, j))

    # -- queries -------------------------------------------------------------------------------
    def peak(self) -> dict[int, int]:
        return {d: int(m) for d, m in enumerate(self.total)}

    def overflow(self) -> int:
        """Bytes over capacity, summed over the devices that overflow (0 when the strategy fits)."""
        return sum(max(0, m - c) for m, c in zip(self.total, self.capacity))

    def fits(self) -> bool:
        return all(m <= c for m, c in zip(self.total, self.capacity))

    # -- updates -------------------------------------------------------------------------------
    def change(self, op_name: str, cfg: ParallelConfig) -> None:
        self.change_many({op_name: cfg})

    def change_many(self, changes: dict[str, ParallelConfig]) -> None:
        """New configurations for several ops; every affected contribution is recomputed once
        (a layer move changes 40 steps that share one parameter).  `rollback()` takes it back."""
        g = self.graph
        strategy = self.strategy
        keys: dict[tuple, None] = {}
        for name, cfg in changes.items():
            strategy = strategy.with_config(name, cfg)
            op = g[name]
            keys[("out", name)] = None
            for j in range(len(op.inputs)):
                keys[("edge", name, j)] = None
            for c, j, _ in g.consumers[name]:
                keys[("edge", c, j)] = None
            for p in op.params:
                keys[("param", p.name)] = None
        self._undo = (self.strategy, {k: self._parts.get(k) for k in keys})
        self.strategy = strategy
        for k in keys:
            if k[0] == "out":
                self._set(k, self._outputs(k[1]))
            elif k[0] == "edge":
                self._set(k, self._edge(k[1], k[2]))
            else:
                self._set(k, self._param(k[1]))

    def rollback(self) -> None:
        """Take back the last `change_many` (a rejected proposal)."""
        strategy, parts = self._undo
        for k, part in parts.items():
            self._set(k, part)
        self.strategy, self._undo = strategy, None

    def _set(self, key: tuple, part: dict[int, int] | None) -> None:
        old = self._parts.get(key)
        if old:
            for d, v in old.items():
                self.total[d] -= v
        if part is None:
            self._parts.pop(key, None)
            return
        for d, v in part.items():
            self.total[d] += v
        self._parts[key] = part

    # -- contributions (the same arithmetic as planner.sim.memory.peak_memory) ---------------------
    def _param(self, name: str) -> dict[int, int]:
        spec = self.graph.param_specs[name]
        itemsize = spec.nbytes // max(1, volume(tuple((0, s) for s in spec.shape)))
        return {dev: self._factor * union_volume(boxes) * itemsize
                for dev, boxes in self.builder.holdings(self.strategy, name).items()}

    def _outputs(self, op_name: str) -> dict[int, int]:
        op = self.graph[op_name]
        cfg = self.strategy[op_name]
        ranges = self.builder._task_ranges(op, cfg.degrees)
        out: dict[int, int] = {}
        for t, dev in enumerate(cfg.devices):
            for k, o in enumerate(op.outputs):
                out[dev] = out.get(dev, 0) + volume(op.output_box(k, ranges[t])) * o.itemsize
        return out

    def _edge(self, op_name: str, j: int) -> dict[int, int]:
        op = self.graph[op_name]
        return edge_memory(self.builder, op, j, self.strategy[op_name], self.strategy[op.inputs[j].op])
