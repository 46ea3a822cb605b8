"""How many tasks a strategy's task graph has, or a change adds, without building anything.

Two tasks (forward and backward) per op task, and two per route hop of every piece of a tensor
that crosses devices (the forward transfer and the gradient back, each a task with a part per
link of its route), as `planner.sim.taskgraph` builds them — counted in placements
(`TaskGraph.placements`: a task once per resource it occupies); ring all-reduces (linear in the
replicas) are left out.  The search uses it to skip work
whose build alone would eat its time budget: a random start at 64 GPUs (millions of tasks) or a
proposal that splits every step of an LSTM layer 32 ways (10^5 transfers on a 25k-task graph).
"""

from __future__ import annotations

import math
from typing import Mapping

from ..ir.strategy import ParallelConfig, Strategy
from ..sim.taskgraph import TaskGraphBuilder


def edge_tasks(builder: TaskGraphBuilder, op_name: str, j: int, cfg: ParallelConfig, pcfg: ParallelConfig) -> int:
    """Transfer tasks of input `j` of op `op_name` under `cfg`, its producer under `pcfg`."""
    op = builder.graph[op_name]
    route = builder.topology.route
    pieces = {(pt, cfg.devices[ct]) for pt, ct, _ in builder.overlaps(op, j, cfg.degrees, pcfg.degrees)
              if pcfg.devices[pt] != cfg.devices[ct]}
    return sum(2 * len(route(pcfg.devices[pt], d)) for pt, d in pieces)


def estimate_tasks(builder: TaskGraphBuilder, strategy: Strategy, limit: float = math.inf) -> int:
    """About how many tasks the task graph of `strategy` has; counting stops as soon as the
    count passes `limit` (model parallelism at 64 GPUs has ~10^7: counting them all costs
    seconds)."""
    total = 0
    for op in builder.graph.ops:
        cfg = strategy[op.name]
        total += 2 * len(cfg.devices)
        for j, ref in enumerate(op.inputs):
            total += edge_tasks(builder, op.name, j, cfg, strategy[ref.op])
        if total > limit:
            break
    return total


def change_tasks(builder: TaskGraphBuilder, strategy: Strategy, changes: Mapping[str, ParallelConfig],
                 limit: float = math.inf) -> int:
    """About how many tasks applying `changes` to `strategy` builds: the changed ops' tasks and
    the transfers of every edge into or out of a changed op, under the new configurations
    (counting stops once past `limit`)."""
    g = builder.graph

    def cfg_of(name: str) -> ParallelConfig:
        return changes.get(name) or strategy[name]

    edges = set()
    total = 0
    for name, cfg in changes.items():
        total += 2 * len(cfg.devices)
        edges.update((name, j) for j in range(len(g[name].inputs)))
        edges.update((c, j) for c, j, _ in g.consumers[name])
    for name, j in sorted(edges):
        total += edge_tasks(builder, name, j, cfg_of(name), cfg_of(g[name].inputs[j].op))
        if total > limit:
            break
    return total
