"""OptCNN's node/edge eliminations (and the final enumeration) find the true minimum."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.search._elimination import EliminationTooLarge, PairwiseProblem, plan_order, solve


def _brute(problem: PairwiseProblem) -> float:
    return min(problem.cost(list(a)) for a in itertools.product(*(range(s) for s in problem.sizes)))


@st.composite
def problems(draw):
    n = draw(st.integers(1, 6))
    sizes = [draw(st.integers(1, 3)) for _ in range(n)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = PairwiseProblem(sizes)
    for v in range(n):
        p.add_unary(v, rng.random(sizes[v]))
    for _ in range(draw(st.integers(0, 12))):
        u, v = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        p.add_pair(u, v, rng.random((sizes[u], sizes[v])))
    return p


@settings(max_examples=150, deadline=None)
@given(problems())
def test_elimination_finds_the_brute_force_minimum(problem):
    assignment, cost, _ = solve(problem)
    assert cost == pytest.approx(_brute(problem))
    assert problem.cost(assignment) == pytest.approx(cost)


def test_series_parallel_graph_reduces_by_node_and_edge_eliminations():
    # a -> {b -> c, d} -> e: the branch b-c collapses by node elimination into a second a-e
    # path, which edge elimination merges with the one through d.
    rng = np.random.default_rng(0)
    p = PairwiseProblem([3] * 5)
    for v in range(5):
        p.add_unary(v, rng.random(3))
    for u, v in [(0, 1), (1, 2), (2, 4), (0, 3), (3, 4)]:
        p.add_pair(u, v, rng.random((3, 3)))
    assignment, cost, stats = solve(p)
    assert stats.final_variables == 0
    assert stats.node_eliminations >= 2 and stats.edge_eliminations >= 1
    assert cost == pytest.approx(_brute(p))


def test_a_clique_is_enumerated_and_counted_as_the_final_graph():
    rng = np.random.default_rng(1)
    p = PairwiseProblem([2] * 4)
    for u, v in itertools.combinations(range(4), 2):
        p.add_pair(u, v, rng.random((2, 2)))
    _, cost, stats = solve(p)
    assert stats.final_variables == 4 and stats.wide_eliminations >= 1
    assert cost == pytest.approx(_brute(p))


def test_too_wide_a_final_graph_is_refused_with_the_numbers():
    p = PairwiseProblem([50] * 5)
    for u, v in itertools.combinations(range(5), 2):
        p.add_pair(u, v, np.zeros((50, 50)))
    _, work, final = plan_order(p)
    assert final == 5 and work > 1e6
    with pytest.raises(EliminationTooLarge, match=r"final graph has 5 layers .* above the limit of 1e\+06"):
        solve(p, max_work=1e6)
