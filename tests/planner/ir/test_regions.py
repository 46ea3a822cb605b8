"""Regions of tensors (`planner.ir.regions`): which cuts are one run of a row-major tensor's memory."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.ir.regions import contiguous_in, translate


@st.composite
def _cut(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    origin = tuple((0, s) for s in shape)
    box = []
    for s in shape:
        lo = draw(st.integers(0, s - 1))
        box.append((lo, draw(st.integers(lo + 1, s))))
    return shape, origin, tuple(box)


@settings(max_examples=200, deadline=None)
@given(_cut())
def test_a_cut_is_contiguous_exactly_where_torch_finds_its_view_contiguous(case):
    shape, origin, box = case
    view = torch.empty(shape)[translate(box, origin)]
    assert contiguous_in(box, origin) == view.is_contiguous()


def test_rows_of_a_matrix_are_one_run_and_a_block_of_columns_is_not():
    whole = ((0, 4), (0, 8))
    assert contiguous_in(((1, 3), (0, 8)), whole)
    assert contiguous_in(((2, 3), (2, 5)), whole)       # a piece of one row
    assert not contiguous_in(((0, 4), (0, 4)), whole)
