"""Net effect of a batch of task-graph edits, compared exactly (for `DeltaSimulator`).

A search proposes a change and usually takes it back; a batch that exactly inverts the previous
one needs no simulation, nor does a batch whose edits cancel out.  A batch's net effect is kept
as two logs that cost O(1) per edit: per touched key, its (resource, duration) before the batch
and after it; per edge (by keys), +1 added or -1 removed, net.  Two graphs that agree on every
task's resource and duration and on every edge are identical for the simulator.
"""

from __future__ import annotations

from ._taskstore import TaskGraph


class Batch:
    """The edits since the last simulation, as net changes."""

    __slots__ = ("tasks", "edges")

    def __init__(self) -> None:
        self.tasks: dict = {}   # key -> (resource, duration, id) before the batch, or None
        self.edges: dict = {}   # (src key, dst key) -> +1 / -1

    def touch(self, g: TaskGraph, i: int) -> None:
        k = g._key[i]
        if k not in self.tasks:
            self.tasks[k] = (g._res[i], g._dur[i], i)

    def absent(self, key) -> None:
        self.tasks.setdefault(key, None)

    def edge(self, ka, kb, sign: int) -> None:
        e = (ka, kb)
        n = self.edges.get(e, 0) + sign
        if n:
            self.edges[e] = n
        else:
            del self.edges[e]

    def net(self, g: TaskGraph) -> tuple[dict, dict]:
        """({key: (before, after)} for tasks whose resource or duration changed, or that came
        or went; {edge: +1/-1}).  `before` keeps the task's id, `after` is (res, dur) or None."""
        tasks = {}
        for k, b in self.tasks.items():
            i = g._id.get(k)
            a = None if i is None else (g._res[i], g._dur[i])
            if a != (b and b[:2]):
                tasks[k] = (b, a)
        return tasks, dict(self.edges)


def undoes(g: TaskGraph, net: tuple[dict, dict], last: tuple[dict, dict]) -> bool:
    """Does the batch with effect `net` restore the graph from before the batch with effect
    `last`, with every task of that graph back under its old id?"""
    tasks, edges = net
    ltasks, ledges = last
    if tasks.keys() != ltasks.keys() or edges.keys() != ledges.keys():
        return False
    if any(edges[e] != -v for e, v in ledges.items()):
        return False
    for k, (b, a) in tasks.items():
        lb, la = ltasks[k]
        if (b and b[:2]) != la or a != (lb and lb[:2]):
            return False
    # Tasks present before `last` must hold their old ids for the kept timeline to fit.
    return all(g._id.get(k) == lb[2] for k, (lb, _) in ltasks.items() if lb is not None)
