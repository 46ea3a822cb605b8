"""Hyper-rectangular regions of tensors and their algebra.

A region ("box") is a tuple of half-open ``(lo, hi)`` ranges, one per tensor axis.  The SOAP
space uses equal partitions only (FlexFlow sec. 4), so every task's output region is a box,
and so is the input region it reads (a convolution's window widens it by a halo, see
`planner.graph.AxisMap`).  The bytes a communication task moves are the volume of the
intersection of a producer's output box and a consumer's input box (FlexFlow sec. 5.1).
"""

from __future__ import annotations

from itertools import product
from typing import Iterator, Sequence

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
