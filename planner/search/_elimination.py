"""Exact minimisation of a sum of unary and pairwise costs by variable elimination.

OptCNN (sec. 5.2, Algorithm 1, Theorems 1–2) finds the optimal strategy of its cost model with
two graph reductions and a final enumeration:

* **edge elimination** — two edges between the same layers become one whose cost table is the
  sum of both (`_Problem.add_pair` merges factors with the same scope);
* **node elimination** — a layer with one in-edge and one out-edge disappears; the new edge's
  table holds, for every pair of neighbour configurations, the cheapest configuration of the
  removed layer (eq. 2) and remembers which it was, so that undoing the elimination recovers an
  optimal configuration (Theorem 1);
* **enumeration** of the graph that is left, then undoing the eliminations in reverse order.

Here a layer's in- and out-edges are not told apart (the cost of an edge does not care about its
direction), so a layer with exactly two neighbours is eliminated whatever its edges' directions,
and a layer with one neighbour (a leaf: a graph input, a constant, a label tensor) folds its
cheapest configuration into its neighbour's unary cost — both are the same dynamic programming
step as eq. 2, with the same optimality argument.  What is left is enumerated by eliminating the
remaining layers one at a time in min-fill order (bucket elimination): a layer with k neighbours
leaves a table over those k, the exact generalisation of eq. 2.  On a final graph of n layers
this costs at most what enumerating its C^n strategies costs, and on the graphs of real models
(CNNs reduce to two layers, as the paper reports; layer graphs of RNNs to a handful) far less.

The solver is independent of what the variables mean: `planner.search.optcnn` builds the tables.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..errors import AutoparError

#: Entries of all joint tables together that one solve may build (~2 s of numpy); chunks keep
#: memory below `_CHUNK` entries per step.
DEFAULT_MAX_WORK = 2e8
_CHUNK = 4_000_000


class EliminationTooLarge(AutoparError):
    """The final graph is too wide to enumerate within the work limit."""


@dataclass
class EliminationStats:
    variables: int = 0
    pair_factors: int = 0
    edge_eliminations: int = 0   # factors merged into an existing one of the same scope
    leaf_eliminations: int = 0   # a variable with one neighbour
    node_eliminations: int = 0   # a variable with two neighbours (OptCNN's node elimination)
    wide_eliminations: int = 0   # three or more neighbours: the enumeration of the final graph
    final_variables: int = 0     # variables left when no leaf, node or edge elimination applies
    max_table: int = 0           # largest joint table built
    work: float = 0.0            # entries of all joint tables together
    order: list = field(default_factory=list)


@dataclass
class _Factor:
    scope: tuple[int, ...]  # variable ids, sorted
    table: np.ndarray


class PairwiseProblem:
    """Variables 0..n-1 with `sizes[v]` choices; cost = sum of unary and pairwise tables."""

    def __init__(self, sizes: list[int]):
        if any(s < 1 for s in sizes):
            raise ValueError(f"every variable needs at least one choice, got sizes {sizes}")
        self.sizes = list(sizes)
        self.unary = [np.zeros(s) for s in sizes]
        self.pairs: dict[tuple[int, int], np.ndarray] = {}
        self.merged = 0

    def add_unary(self, v: int, costs: np.ndarray) -> None:
        self.unary[v] = self.unary[v] + np.asarray(costs, dtype=float)

    def add_pair(self, u: int, v: int, table: np.ndarray) -> None:
        """Add a table of shape (sizes[u], sizes[v]); a second table on the same pair is summed
        into the first (OptCNN's edge elimination)."""
        table = np.asarray(table, dtype=float)
        if u == v:
            self.add_unary(u, np.diagonal(table))
            return
        if u > v:
            u, v, table = v, u, table.T
        if table.shape != (self.sizes[u], self.sizes[v]):
            raise ValueError(f"pair ({u}, {v}) table has shape {table.shape}, expected {(self.sizes[u], self.sizes[v])}")
        key = (u, v)
        if key in self.pairs:
            self.pairs[key] = self.pairs[key] + table
            self.merged += 1
        else:
            self.pairs[key] = table

    def cost(self, assignment: list[int]) -> float:
        total = sum(float(self.unary[v][c]) for v, c in enumerate(assignment))
        for (u, v), t in self.pairs.items():
            total += float(t[assignment[u], assignment[v]])
        return total


def plan_order(problem: PairwiseProblem) -> tuple[list[tuple[int, tuple[int, ...]]], float, int]:
    """The elimination order (variable, its neighbours when eliminated), the total work (entries
    of all joint tables) and the size of the final graph, from the structure alone."""
    n = len(problem.sizes)
    sizes = problem.sizes
    adj: dict[int, set[int]] = {v: set() for v in range(n)}
    for u, v in problem.pairs:
        adj[u].add(v)
        adj[v].add(u)

    def key(v: int) -> tuple:
        k = 1
        for u in adj[v]:
            k *= sizes[u]
        d = len(adj[v])
        # Leaves first (a C x C step instead of node elimination's C x C x C), then OptCNN's node
        # eliminations, then the enumeration of what is left (wider eliminations).  Within a
        # phase the smallest table wins.
        return (0 if d <= 1 else (1 if d == 2 else 2), k, v)

    heap = [key(v) for v in range(n)]
    heapq.heapify(heap)
    current = {k[2]: k for k in heap}
    alive = set(range(n))
    order: list[tuple[int, tuple[int, ...]]] = []
    work = 0.0
    final = 0
    counted = False
    while alive:
        k = heapq.heappop(heap)
        v = k[2]
        if v not in alive or current[v] != k:
            continue
        if k[0] > 1 and not counted:
            final, counted = len(alive), True
        nb = tuple(sorted(adj[v]))
        work += k[1] * sizes[v]
        order.append((v, nb))
        alive.discard(v)
        for u in nb:
            adj[u].discard(v)
            adj[u].update(w for w in nb if w != u)
        for u in nb:
            current[u] = key(u)
            heapq.heappush(heap, current[u])
    return order, work, final


def solve(problem: PairwiseProblem, max_work: float = DEFAULT_MAX_WORK) -> tuple[list[int], float, EliminationStats]:
    """An optimal assignment, its cost and what the elimination did.

    Raises `EliminationTooLarge` (before computing anything) when the eliminations would build
    joint tables of more than `max_work` entries in total.
    """
    n = len(problem.sizes)
    sizes = problem.sizes
    order, work, final = plan_order(problem)
    if work > max_work:
        widest = max((len(nb) for _, nb in order), default=0)
        raise EliminationTooLarge(
            f"OptCNN's final graph has {final} layers and enumerating it needs {work:.3g} table entries "
            f"(widest elimination: a layer with {widest} neighbours), above the limit of {max_work:.3g}; "
            "reduce the configurations per op (max_tasks) or the number of devices")
    stats = EliminationStats(variables=n, pair_factors=len(problem.pairs), edge_eliminations=problem.merged,
                             final_variables=final, work=work)
    factors: dict[tuple[int, ...], np.ndarray] = {(v,): problem.unary[v] for v in range(n)}
    factors.update(problem.pairs)
    by_var: dict[int, set[tuple[int, ...]]] = {v: set() for v in range(n)}
    for scope in factors:
        for v in scope:
            by_var[v].add(scope)
    constant = 0.0
    undo: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    for best, nb in order:
        scopes = list(by_var[best])
        stats.max_table = max(stats.max_table, int(np.prod([sizes[u] for u in nb + (best,)])))
        table, arg = _min_out(nb + (best,), [(sc, factors[sc]) for sc in scopes], sizes)
        for sc in scopes:
            del factors[sc]
            for u in sc:
                if u != best:
                    by_var[u].discard(sc)
        by_var[best].clear()
        undo.append((best, nb, arg))
        stats.order.append(best)
        if not nb:
            constant += float(table)
        elif nb in factors:
            factors[nb] = factors[nb] + table
            if len(nb) > 1:
                stats.edge_eliminations += 1
        else:
            factors[nb] = table
            for u in nb:
                by_var[u].add(nb)
        if len(nb) == 1:
            stats.leaf_eliminations += 1
        elif len(nb) == 2:
            stats.node_eliminations += 1
        elif len(nb) > 2:
            stats.wide_eliminations += 1
    assignment = [0] * n
    for v, nb, arg in reversed(undo):
        assignment[v] = int(arg[tuple(assignment[u] for u in nb)]) if nb else int(arg)
    return assignment, constant, stats


def _min_out(joint: tuple[int, ...], parts: list[tuple[tuple[int, ...], np.ndarray]], sizes: list[int]):
    """Sum the factors over `joint` (the last variable is eliminated) and minimise it out.

    Returns (min table over joint[:-1], argmin table).  Chunked along the first axis so that no
    intermediate holds more than `_CHUNK` entries per row block.
    """
    shape = tuple(sizes[v] for v in joint)
    pos = {v: i for i, v in enumerate(joint)}

    def aligned(scope: tuple[int, ...], t: np.ndarray) -> np.ndarray:
        # Put the factor's axes in joint order and give missing axes length 1 for broadcasting.
        order = sorted(range(len(scope)), key=lambda i: pos[scope[i]])
        t = np.transpose(t, order)
        view = [1] * len(joint)
        for i in order:
            view[pos[scope[i]]] = sizes[scope[i]]
        return t.reshape(view)

    al = [aligned(s, t) for s, t in parts]
    if len(joint) == 1:
        total = np.zeros(shape)
        for a in al:
            total = total + a
        return float(total.min()), np.int64(int(total.argmin()))
    rows = shape[0]
    per_row = int(np.prod(shape[1:]))
    step = max(1, _CHUNK // max(1, per_row))
    out = np.empty(shape[:-1])
    arg = np.empty(shape[:-1], dtype=np.int32)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        block = np.zeros((r1 - r0,) + shape[1:])
        for a in al:
            block += a[r0:r1] if a.shape[0] != 1 else a
        arg[r0:r1] = block.argmin(axis=-1)
        out[r0:r1] = np.take_along_axis(block, arg[r0:r1][..., None], axis=-1)[..., 0]
    return out, arg
