"""`trainer.parts`: the measured step in the simulator's parts, and the part furthest off."""

from __future__ import annotations

import pytest

from autopar.trainer.parts import busiest_device, furthest_off, measured_parts, rank_parts


def _phases(fwd=0.0, bwd=0.0, exchange=0.0, sync=0.0, opt=0.0):
    return {"fwd": fwd, "bwd": bwd, "exchange": exchange, "grad exchange": 0.0, "sync": sync, "optimizer step": opt}


def test_the_part_furthest_off_is_named_with_its_direction_and_size():
    sim = {"compute": 0.040, "transfer": 0.010, "synchronization": 0.0, "optimizer": 0.002, "overhead": 0.003}
    meas = {"compute": 0.041, "transfer": 0.0132, "synchronization": 0.0, "optimizer": 0.002, "overhead": 0.001}
    assert furthest_off(sim, meas) == "transfer under by 3.2 ms"
    assert furthest_off(meas, sim) == "transfer over by 3.2 ms"


def test_the_busiest_rank_gives_the_parts_on_both_sides():
    idle = [(0.05, _phases(fwd=0.01, exchange=0.035))] * 3
    busy = [(0.05, _phases(fwd=0.03, bwd=0.01, opt=0.004))] * 3
    rank, parts = measured_parts([idle, busy])
    assert rank == 1 and parts["compute"] == pytest.approx(0.04) and parts["overhead"] == pytest.approx(0.006)
    assert busiest_device({0: rank_parts(idle), 1: parts}) == 1


def test_no_steps_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no steps"):
        rank_parts([])
