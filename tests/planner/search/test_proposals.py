"""MCMC's proposals (FlexFlow sec. 6.2 as its implementation draws them): every proposal is a
valid configuration of the op; fresh ones sit on aligned blocks of consecutive devices; moves keep
the degrees; placement moves are their own inverse with the same probability; and together the
proposals reach every placement."""

import random
from collections import Counter

import pytest

from autopar.planner.ir.graph import DimKind
from autopar.planner.ir.strategy import (ParallelConfig, block_config, block_shift, check_config, data_parallel,
                                         placement_move)
from autopar.planner.search.mcmc import SoapSpace

from ._graphs import diamond, mlp, rnn

GRAPHS = {"mlp": mlp, "diamond": diamond, "rnn": rnn}


def _inner(op, degrees) -> int:
    n = 1
    for p, d in zip(op.pardims, degrees):
        if p.kind is not DimKind.SAMPLE:
            n *= d
    return n


@pytest.mark.parametrize("devices", [4, 8, 16])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_proposal_is_a_valid_configuration(name, devices):
    graph = GRAPHS[name]()
    space = SoapSpace(devices)
    rng = random.Random(devices)
    current = data_parallel(graph, devices)
    for _ in range(200):
        op = rng.choice(graph.ops)
        cfg = space.random(op, rng, current[op.name])
        check_config(op, cfg, devices)
        current = current.with_config(op.name, cfg)


@pytest.mark.parametrize("devices", [4, 16])
def test_fresh_configurations_sit_on_aligned_blocks_of_consecutive_devices(devices):
    graph = mlp()
    rng = random.Random(1)
    for _ in range(300):
        op = rng.choice(graph.ops)
        for cfg in (block_config(op, devices, rng), block_shift(op, block_config(op, devices, rng), devices, rng)):
            start, k = cfg.devices[0], len(cfg.devices)
            assert cfg.devices == tuple(range(start, start + k)) and start + k <= devices
            assert start % _inner(op, cfg.degrees) == 0


def test_a_placement_move_changes_one_task_or_swaps_two_and_keeps_the_degrees():
    rng = random.Random(2)
    cfg = ParallelConfig((2, 2), (0, 1, 2, 3))
    for _ in range(200):
        new = placement_move(cfg, 8, rng)
        assert new.degrees == cfg.degrees and len(set(new.devices)) == 4
        moved = [t for t in range(4) if new.devices[t] != cfg.devices[t]]
        assert len(moved) in (0, 1, 2)
        if len(moved) == 2:
            a, b = moved
            assert (new.devices[a], new.devices[b]) == (cfg.devices[b], cfg.devices[a])


def test_placement_moves_are_symmetric():
    """P(x -> y) == P(y -> x), estimated over many draws from both sides."""
    x = ParallelConfig((2,), (0, 1))
    y = ParallelConfig((2,), (0, 3))
    rng = random.Random(3)
    n = 40_000
    xy = sum(placement_move(x, 4, rng) == y for _ in range(n)) / n
    yx = sum(placement_move(y, 4, rng) == x for _ in range(n)) / n
    assert xy == pytest.approx(1 / 8, abs=0.01) and yx == pytest.approx(1 / 8, abs=0.01)


def test_the_proposals_reach_every_placement_of_an_op():
    graph = mlp()
    op = next(o for o in graph.ops if len(o.pardims) >= 1 and o.params)
    space = SoapSpace(4)
    rng = random.Random(4)
    cfg = data_parallel(graph, 4)[op.name]
    seen = Counter()
    for _ in range(20_000):
        cfg = space.random(op, rng, cfg)
        if len(cfg.devices) == 2:
            seen[cfg.devices] += 1
    assert len(seen) == 4 * 3  # every ordered pair of distinct devices
