"""Strategies the equivalence tests train under, built for any graph and rank count.

Each is a family of the SOAP space (FlexFlow sec. 4): pure sample, pure parameter, attribute
(spatial / sequence) partitioning with halos, hybrids of the three, ops on disjoint device
subsets, several tasks of one op on each rank, random configurations (random degrees and
placements) and the plan the search finds.
"""

from __future__ import annotations

import random

from autopar.planner.ir.graph import DimKind, Op, OperatorGraph
from autopar.planner.ir.strategy import ParallelConfig, Strategy, data_parallel, model_parallel, random_config


def _split(op: Op, n: int, order: list[DimKind]) -> tuple[int, ...]:
    """Degrees that use up to `n` tasks, preferring dims of the kinds in `order`."""
    degrees = [1] * len(op.pardims)
    left = n
    for kind in order:
        for i, p in enumerate(op.pardims):
            if p.kind is kind and left > 1:
                d = max(a for a in p.allowed_degrees(left) if left % a == 0)
                degrees[i] = d
                left //= d
    return tuple(degrees)


def _build(graph: OperatorGraph, name: str, pick) -> Strategy:
    cfgs = {}
    for i, op in enumerate(graph.ops):
        degrees, devices = pick(i, op)
        k = 1
        for d in degrees:
            k *= d
        cfgs[op.name] = ParallelConfig(tuple(degrees), tuple(devices[:k]))
    return Strategy.from_mapping(graph, cfgs, name)


def attribute(graph: OperatorGraph, n: int) -> Strategy:
    """Attribute dims (height/width, sequence length) first, then samples."""
    order = [DimKind.ATTRIBUTE, DimKind.SAMPLE]
    return _build(graph, "attribute", lambda i, op: (_split(op, n, order), list(range(n))))


def hybrid(graph: OperatorGraph, n: int) -> Strategy:
    """Ops take turns: sample × parameter, parameter × attribute, attribute × sample, on rotated devices."""
    orders = [[DimKind.SAMPLE, DimKind.PARAMETER], [DimKind.PARAMETER, DimKind.ATTRIBUTE],
              [DimKind.ATTRIBUTE, DimKind.SAMPLE]]

    def pick(i, op):
        if n >= 4:
            per = {DimKind.SAMPLE: 2, DimKind.PARAMETER: 2, DimKind.ATTRIBUTE: 2}
            degrees, left = [1] * len(op.pardims), n
            for kind in orders[i % 3]:
                for j, p in enumerate(op.pardims):
                    if p.kind is kind and left > 1 and degrees[j] == 1:
                        d = max(a for a in p.allowed_degrees(min(per[kind], left)) if left % a == 0)
                        degrees[j], left = d, left // d
                        break
            degrees = tuple(degrees)
        else:
            degrees = _split(op, n, orders[i % 3][:1] + [DimKind.SAMPLE])
        devices = list(range(n))
        return degrees, devices[i % n:] + devices[:i % n]
    return _build(graph, "hybrid", pick)


def disjoint(graph: OperatorGraph, n: int) -> Strategy:
    """The first half of the ops on the first half of the devices, the rest on the other half."""
    half = max(1, n // 2)

    def pick(i, op):
        devices = list(range(half)) if i < len(graph.ops) // 2 else list(range(n - half, n))
        return _split(op, len(devices), [DimKind.SAMPLE, DimKind.PARAMETER]), devices
    return _build(graph, "disjoint", pick)


def stacked(graph: OperatorGraph, n: int) -> Strategy:
    """Up to 2n tasks per op, dealt round-robin: every rank runs several tasks of one op in turn."""
    order = [DimKind.SAMPLE, DimKind.ATTRIBUTE, DimKind.PARAMETER]
    return _build(graph, "stacked", lambda i, op: (_split(op, 2 * n, order), [t % n for t in range(2 * n)]))


def randomized(graph: OperatorGraph, n: int, seed: int) -> Strategy:
    rng = random.Random(seed)
    return Strategy.from_mapping(graph, {op.name: random_config(op, n, rng) for op in graph.ops}, f"random{seed}")


def searched(graph: OperatorGraph, n: int) -> Strategy | None:
    """The plan the search finds for `local:n`, bounded by proposal count so it is reproducible
    (None when the search is not installed)."""
    try:
        from autopar.planner.cost.model import CostModel
        from autopar.planner.hardware.presets import get_preset
        from autopar.planner.search import plan
    except ImportError:
        return None
    result = plan(graph, get_preset(f"local:{n}"), CostModel().bind(graph), budget_s=60.0, seed=0, max_proposals=150,
                  starts=("data-parallel", "random"))
    return result.strategy.renamed("searched")


FAMILIES = {
    "data-parallel": lambda g, n: data_parallel(g, n),
    "model-parallel": lambda g, n: model_parallel(g, n),
    "attribute": attribute,
    "hybrid": hybrid,
    "disjoint": disjoint,
    "stacked": stacked,
    "random": lambda g, n: randomized(g, n, 7),
    "searched": searched,
}
