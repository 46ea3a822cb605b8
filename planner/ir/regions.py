"""Hyper-rectangular regions of tensors and their algebra.

A region ("box") is a tuple of half-open ``(lo, hi)`` ranges, one per tensor axis.  The SOAP
space uses equal partitions only (FlexFlow sec. 4), so every task's output region is a box,
and so is the input region it reads (a convolution's window widens it by a halo, see
`planner.ir.graph.AxisMap`).  The bytes a communication task moves are the volume of the
intersection of a producer's output box and a consumer's input box (FlexFlow sec. 5.1).
"""

from __future__ import annotations

from itertools import product
from typing import Iterator, Mapping, Sequence

Range = tuple[int, int]
Box = tuple[Range, ...]


def full_box(shape: Sequence[int]) -> Box:
    return tuple((0, int(s)) for s in shape)


def volume(box: Box) -> int:
    v = 1
    for lo, hi in box:
        if hi <= lo:
            return 0
        v *= hi - lo
    return v


def intersect(a: Box, b: Box) -> Box | None:
    """The common part of two boxes of the same rank, or None when they do not overlap."""
    if len(a) != len(b):
        raise ValueError(f"boxes of rank {len(a)} and {len(b)} cannot intersect: {a} vs {b}")
    out = []
    for (alo, ahi), (blo, bhi) in zip(a, b):
        lo, hi = max(alo, blo), min(ahi, bhi)
        if hi <= lo:
            return None
        out.append((lo, hi))
    return tuple(out)


def contains(outer: Box, inner: Box) -> bool:
    return all(olo <= ilo and ihi <= ohi for (olo, ohi), (ilo, ihi) in zip(outer, inner))


def maximal(boxes) -> list[Box]:
    """The distinct boxes of `boxes` that no other one contains: the same union, hence the same
    cells and holders (`cells`), with fewer boxes."""
    boxes = list(dict.fromkeys(boxes))
    if len(boxes) < 2:
        return boxes
    return [b for b in boxes if not any(o != b and contains(o, b) for o in boxes)]


def split_range(size: int, degree: int, index: int) -> Range:
    """The `index`-th of `degree` equal parts of ``range(size)``; `degree` must divide `size`."""
    if degree <= 0 or size % degree:
        raise ValueError(f"degree {degree} does not divide size {size}")
    step = size // degree
    return (index * step, (index + 1) * step)


def grid_coords(degrees: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Task coordinates of a partition grid in row-major order (the order task ids use)."""
    return product(*(range(d) for d in degrees))


def translate(box: Box, origin: Box) -> tuple[slice, ...]:
    """Slices that cut `box` out of a local tensor that holds the region `origin`."""
    return tuple(slice(lo - olo, hi - olo) for (lo, hi), (olo, _) in zip(box, origin))


def contiguous_in(box: Box, origin: Box) -> bool:
    """Whether `box`, cut out of a row-major tensor that holds the region `origin`, is one run of
    that tensor's memory: every axis before the last one it cuts short spans one index."""
    cut = False
    for (lo, hi), o in zip(reversed(box), reversed(origin)):
        if cut and hi - lo > 1:
            return False
        cut = cut or (lo, hi) != tuple(o)
    return True


def cells(boxes_by_dev: Mapping[int, Sequence[Box]]) -> list[tuple[Box, tuple[int, ...]]]:
    """Split the union of all boxes into elementary cells, each with the devices that hold it.

    Parameter synchronization rests on it, in the simulator (`planner.sim.taskgraph`) and in the
    runtime (`trainer.plan`) alike: devices all-reduce exactly the cells they all hold.  Adjacent
    cells with the same holders are merged along each axis in turn, so that a plain replicated
    parameter is one cell, not many.
    """
    all_boxes = [b for bs in boxes_by_dev.values() for b in bs]
    if not all_boxes:
        return []
    rank = len(all_boxes[0])
    cuts = []
    for a in range(rank):
        pts = sorted({x for b in all_boxes for x in b[a]})
        cuts.append(list(zip(pts, pts[1:])))
    grid: dict[Box, tuple[int, ...]] = {}
    for cell in product(*cuts):
        holders = tuple(sorted(d for d, bs in boxes_by_dev.items()
                               if any(all(lo <= c0 and c1 <= hi for (c0, c1), (lo, hi) in zip(cell, b)) for b in bs)))
        if holders:
            grid[tuple(cell)] = holders
    for axis in range(rank):
        grid = _merge_axis(grid, axis)
    return sorted(grid.items())



def union_volume(boxes: Sequence[Box]) -> int:
    """Elements covered by at least one of `boxes` (overlaps counted once)."""
    if len(boxes) == 1:
        return volume(boxes[0])
    return sum(volume(cell) for cell, _ in cells({0: boxes}))

def _merge_axis(grid: dict[Box, tuple[int, ...]], axis: int) -> dict[Box, tuple[int, ...]]:
    lines: dict[tuple, list[tuple[Range, tuple[int, ...]]]] = {}
    for box, holders in grid.items():
        key = box[:axis] + box[axis + 1:]
        lines.setdefault(key, []).append((box[axis], holders))
    out: dict[Box, tuple[int, ...]] = {}
    for key, segs in lines.items():
        segs.sort()
        run_lo, run_hi, run_h = segs[0][0][0], segs[0][0][1], segs[0][1]
        for (lo, hi), h in segs[1:] + [((None, None), None)]:
            if h == run_h and lo == run_hi:
                run_hi = hi
                continue
            out[key[:axis] + ((run_lo, run_hi),) + key[axis:]] = run_h
            run_lo, run_hi, run_h = lo, hi, h
    return out
