"""Memoized round trips: the least time from a forward task's end to its backward task's ready
time over every configuration of the later ops, per (op, configuration, task).

For a task tau of op v under configuration c, every consumer w and every configuration c' of w:
a task tau' of w that reads tau (the builder's overlaps) ends its forward task at least
``xf + pf(tau')`` after tau's forward task (``xf``: the transfer from tau's device, 0 on the same
device), its backward task is ready at least ``RT(w, c', tau')`` later and ends ``pb(tau')``
after that, and tau's backward task waits for it and for the gradient's way back (``xb``).  So

    RT(v, c, tau) = max over consumers w of  min over c' of  max over tau' reading tau of
                    xf + pf(tau') + RT(w, c', tau') + pb(tau') + xb

is a lower bound on ``ready(backward tau) - end(forward tau)`` whatever the later ops'
configurations (the minimum over c' covers the one the completion picks; other inputs of w and
other consumers only delay things; a consumer configuration none of whose tasks reads tau gives 0).
Computed backwards over the ops once per search: one `TaskGraphBuilder.transfers` per (producer
configuration, consumer configuration) pair of every edge.  This is the "tail" of FlexFlow's
critical path made configuration-aware: a partial strategy that forces its successors into costly
layouts pays for it in its bound before they are placed.
"""

from __future__ import annotations

from ..ir.regions import volume
from ..ir.strategy import ParallelConfig
from ._exhaustive_static import Static

#: Above this many (producer, consumer) configuration pairs the table is not built (the bound
#: falls back to the configuration-independent round trip `Static.rt`).
MAX_PAIRS = 3_000_000


def round_trips(S: Static, configs: list[list[ParallelConfig]]) -> list[dict[ParallelConfig, list[float]]] | None:
    """``rt[v][c][tau]`` as in the module docstring, or None when there are too many pairs."""
    pairs = sum(len(configs[v]) * len(configs[w]) for v in range(S.N) for w, _ in S.cons[v])
    if pairs > MAX_PAIRS:
        return None
    b, g = S.b, S.g
    devices = b.topology.devices
    rt: list[dict[ParallelConfig, list[float]]] = [{} for _ in range(S.N)]
    for v in range(S.N - 1, -1, -1):
        for c in configs[v]:
            rt[v][c] = [0.0] * len(c.devices)
        for w, j in S.cons[v]:
            op = S.ops[w]
            ref = op.inputs[j]
            itemsize = g[ref.op].outputs[ref.index].itemsize
            through = {}                        # pf + RT + pb of each task of each consumer configuration
            for c2 in configs[w]:
                times = [S.task_time(w, c2.degrees, devices[d]) for d in c2.devices]
                through[c2] = [f + r + bw for (f, bw), r in zip(times, rt[w][c2])]
            pieces = {}                         # (consumer degrees, producer degrees) -> (pt, ct, bytes)
            for c in configs[v]:
                best = None
                for c2 in configs[w]:
                    cand = _candidate(S, b, op, j, c, c2, through[c2], itemsize, pieces)
                    best = cand if best is None else [min(a, x) for a, x in zip(best, cand)]
                mine = rt[v][c]
                for t, x in enumerate(best or ()):
                    if x > mine[t]:
                        mine[t] = x
    return rt


def _candidate(S: Static, b, op, j: int, c: ParallelConfig, c2: ParallelConfig, here: list[float],
               itemsize: int, pieces: dict) -> list[float]:
    """Per producer task: the slowest round trip through a consumer task reading it under c2."""
    cand = [0.0] * len(c.devices)
    if len(set(c2.devices)) == len(c2.devices):
        # One consumer task per device: every transfer carries exactly one overlap box.
        key = (c2.degrees, c.degrees)
        got = pieces.get(key)
        if got is None:
            got = pieces[key] = [(pt, ct, max(1.0, float(volume(box) * itemsize)))
                                 for pt, ct, box in b.overlaps(op, j, c2.degrees, c.degrees)]
        pdev, cdev = c.devices, c2.devices
        for pt, ct, nbytes in got:
            if pdev[pt] == cdev[ct]:
                x = here[ct]
            else:
                xf, xb = S.xfer_times(pdev[pt], cdev[ct], nbytes)
                x = here[ct] + xf + xb
            if x > cand[pt]:
                cand[pt] = x
        return cand
    transfers, local = b.transfers(op, j, c2, c, itemsize)
    for pt, ct in local:
        cand[pt] = max(cand[pt], here[ct])
    for tr in transfers:
        xf, xb = S.xfer_times(tr.src_dev, tr.dst_dev, tr.nbytes)
        pt = tr.src_tasks[0]
        for ct in tr.dst_tasks:
            cand[pt] = max(cand[pt], here[ct] + xf + xb)
    return cand

