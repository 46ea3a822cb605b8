"""Gradient buckets: which parameter cells the trainer all-reduces together, and when.

The trainer does not all-reduce parameter by parameter: like DDP it packs gradient cells into
buckets of about `DEFAULT_BUCKET_BYTES` per (device set, dtype) and issues each bucket as one
asynchronous all-reduce as soon as the backward pass has made it final.  The simulator's model of
the trainer (`planner.sim.trainer_model`) times exactly these buckets, and the trainer
(`autopar.trainer.sync`) executes them, so both take them from this one function.

Cells (`planner.ir.regions.cells`) are the pieces of a parameter held by the same set of devices
(FlexFlow sec. 5.1's parameter synchronization); a cell held by one device needs no all-reduce.
A parameter's gradient is final after the backward pass of its *first* user in graph order (ops
that share it, unrolled recurrent steps, have all added their part by then), so cells become
ready in reverse graph order; they join the open bucket of their (device set, dtype) in that
order, and a bucket that reaches the size is closed and issued after that op's backward pass
(``after_op``).  What is left open is final once its last cell is, and is issued then: the
trainer's gradient hooks see that its parameters have all their contributions, however small the
bucket (`autopar.trainer.sync.GradSync`).  Buckets are issued in the order they become final.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ir.graph import DTYPE_BYTES, OperatorGraph
from ..ir.regions import Box, cells, volume

#: Bucket size in bytes: large enough that the per-message latency (~0.1 ms for gloo over
#: loopback) is small against the transfer, small enough that early buckets overlap with compute.
DEFAULT_BUCKET_BYTES = 4 << 20


@dataclass(frozen=True)
class SyncBucket:
    devices: tuple[int, ...]                 # the ranks that all-reduce it, ascending
    entries: tuple[tuple[str, Box], ...]     # (parameter, cell of its view in global coordinates)
    after_op: int                            # graph index of the op after whose backward it is issued
    dtype: str
    nbytes: int


def plan_buckets(graph: OperatorGraph, holdings: Mapping[str, Mapping[int, Sequence[Box]]],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[SyncBucket]:
    """Every bucket of a step in issue order (module docstring); `holdings` gives, per parameter,
    the boxes of its view each device's tasks read."""
    ready: dict[int, list[str]] = {}
    for p, users in graph.param_users.items():
        ready.setdefault(min(graph.index[u] for u in users), []).append(p)
    open_: dict[tuple[tuple[int, ...], str], list[tuple[str, Box]]] = {}
    size: dict[tuple[tuple[int, ...], str], int] = {}
    last: dict[tuple[tuple[int, ...], str], int] = {}   # the op after whose backward the open bucket is final
    out: list[SyncBucket] = []
    for i in range(len(graph.ops) - 1, -1, -1):
        for p in ready.get(i, ()):
            spec = graph.param_specs[p]
            held = holdings.get(p)
            if not held or len(held) < 2:
                continue
            for box, holders in cells(held):
                if len(holders) < 2:
                    continue
                key = (holders, spec.dtype)
                open_.setdefault(key, []).append((p, box))
                size[key] = size.get(key, 0) + volume(box) * DTYPE_BYTES[spec.dtype]
                last[key] = i
                if size[key] >= bucket_bytes:
                    out.append(SyncBucket(holders, tuple(open_.pop(key)), i, spec.dtype, size.pop(key)))
    for key in sorted(open_):
        out.append(SyncBucket(key[0], tuple(open_[key]), last[key], key[1], size[key]))
    # Issue order is the order buckets become final (a stable sort keeps the full buckets' order).
    out.sort(key=lambda b: -b.after_op)
    return out
