"""Batched task-graph edits (`add_tasks`, `add_edges`, `remove_tasks`) do exactly what the same calls one by one do."""

from __future__ import annotations

import random

import pytest

from autopar.planner.errors import SimulationError, TaskGraphCycleError, UnknownTaskError
from autopar.planner.sim.simulator import DeltaSimulator, TaskGraph


def _edits(journal: list | None) -> list | None:
    """A journal with its batch entries spelled out element by element: the edits it undoes."""
    if journal is None:
        return None
    out = []
    for e in journal:
        if e[0] == 5:
            out += [(0, i) for i in e[1]]
        elif e[0] == 6:
            out += [(2, a, b, e[1] + n) for n, (a, b) in enumerate(zip(e[2], e[3]))]
        else:
            out.append(e)
    return out


def _state(g: TaskGraph) -> dict:
    d = {k: getattr(g, k) for k in ("_key", "_res", "_rix", "_dur", "_kind", "_nbytes", "_label", "_free",
                                    "_rlist", "_version", "_dmin", "_nedges", "_compilable", "_gseq")}
    d["_id"] = list(g._id.items())
    d["_held"] = list(g._held)
    d["_journal"] = _edits(g._journal)
    for k in ("_a_dur", "_a_rix", "_a_key", "_a_alive", "_a_gen", "_e_rec", "_e_alive"):
        d[k] = getattr(g, k).tobytes()
    d["_pred"] = [list(s) for s in g._pred]
    d["_succ"] = [list(s) for s in g._succ]
    return d


def _random_batch(rng: random.Random, start: int, n: int) -> tuple[list, list]:
    tasks = [((rng.randrange(3), start + k), rng.randrange(4), rng.choice([1e-9, 0.5, 2.0]), "compute",
              float(k), f"t{k}") for k in range(n)]
    keys = [t[0] for t in tasks]
    edges = [(keys[a], keys[b]) for a, b in ((rng.randrange(n), rng.randrange(n)) for _ in range(2 * n)) if a < b]
    return tasks, edges


def _apply_one_by_one(tg, tasks, edges) -> None:
    for t in tasks:
        tg.add_task(*t)
    for e in edges:
        tg.add_edge(*e)


def _apply_batched(tg, tasks, edges) -> None:
    tg.add_tasks(tasks)
    tg.add_edges(edges)


@pytest.mark.parametrize("seed", range(6))
def test_batched_edits_equal_single_edits_on_a_task_graph(seed):
    rng = random.Random(seed)
    one, many = TaskGraph(), TaskGraph()
    one._journal, many._journal = [], []
    for step in range(4):
        tasks, edges = _random_batch(rng, 100 * step, 40)
        edges += edges[:3]  # repeated edges change nothing
        _apply_one_by_one(one, tasks, edges)
        _apply_batched(many, tasks, edges)
        gone = [t[0] for t in tasks if rng.random() < 0.3]
        for k in gone:  # freed ids are reused in order
            one.remove_task(k)
            many.remove_task(k)
        assert _state(one) == _state(many)


@pytest.mark.parametrize("track", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_batched_edits_equal_single_edits_through_a_delta_simulator(seed, track):
    rng = random.Random(seed)
    tasks, edges = _random_batch(rng, 0, 60)
    sims = []
    for apply in (_apply_one_by_one, _apply_batched):
        g = TaskGraph()
        _apply_one_by_one(g, tasks, edges)
        sims.append((DeltaSimulator(g, track=track), apply))
    for step in range(5):
        # Re-add some removed tasks (same or another resource: revived ids), plus new ones.
        gone = [t for t in tasks if rng.random() < 0.2 and t[0] in sims[0][0]]
        back = [(t[0], t[1] if rng.random() < 0.7 else t[1] + 1) + t[2:] for t in gone]
        extra, extra_edges = _random_batch(rng, 1000 * (step + 1), 10)
        keys = [t[0] for t in back + extra]
        olds = [k for k in sims[0][0].graph.keys() if k not in {t[0] for t in gone}][:20]
        new_edges = [(a, b) for a, b in zip(olds, keys) if a != b] + extra_edges
        for sim, apply in sims:
            if apply is _apply_batched:
                sim.remove_tasks([t[0] for t in gone])
            else:
                for t in gone:
                    sim.remove_task(t[0])
            apply(sim, back + extra, new_edges)
        (a, _), (b, _) = sims
        assert (a._seeds, a._new, a._removed, a._revive, a._grave) == (b._seeds, b._new, b._removed, b._revive, b._grave)
        assert a._batch.tasks == b._batch.tasks and a._batch.edges == b._batch.edges
        assert _state(a.graph) == _state(b.graph)
        ta, tb = a.resimulate(), b.resimulate()
        assert ta.same_as(tb, tol=0) and a.stats == b.stats
        if step % 2 and a.can_rollback():
            a.rollback()
            b.rollback()
            assert _state(a.graph) == _state(b.graph)


@pytest.mark.parametrize("bad, error, message", [
    (("x", 1), SimulationError, "must be a tuple of ints"),
    (((9,), "r"), SimulationError, "must be an int"),
    (((1,), 0), SimulationError, "already in the task graph"),
])
def test_a_bad_task_stops_a_batch_where_single_calls_stop(bad, error, message):
    tasks = [((1,), 0, 1.0, "compute", 0.0, ""), ((2,), 1, 1.0, "compute", 0.0, ""),
             (bad[0], bad[1], 1.0, "compute", 0.0, ""), ((3,), 0, 1.0, "compute", 0.0, "")]
    one, many = TaskGraph(), TaskGraph()
    with pytest.raises(error, match=message):
        for t in tasks:
            one.add_task(*t)
    with pytest.raises(error, match=message):
        many.add_tasks(tasks)
    assert _state(one) == _state(many) and len(many) == 2


@pytest.mark.parametrize("bad, error", [(((1,), (1,)), TaskGraphCycleError), (((1,), (7,)), UnknownTaskError)])
def test_a_bad_edge_stops_a_batch_where_single_calls_stop(bad, error):
    edges = [((1,), (2,)), ((2,), (3,)), ((1,), (2,)), bad, ((1,), (3,))]  # a repeat, then the bad one
    graphs = []
    for batched in (False, True):
        g = TaskGraph()
        g.add_tasks([((k,), 0, 1.0, "compute", 0.0, "") for k in (1, 2, 3)])
        with pytest.raises(error):
            if batched:
                g.add_edges(edges)
            else:
                for e in edges:
                    g.add_edge(*e)
        graphs.append(g)
    assert _state(graphs[0]) == _state(graphs[1]) and graphs[1].num_edges() == 2


@pytest.mark.parametrize("track", [True, False])
def test_an_unknown_key_stops_a_batched_removal_where_single_calls_stop(track):
    sims = []
    for _ in range(2):
        g = TaskGraph()
        g.add_tasks([((k,), 0, 1.0, "compute", 0.0, "") for k in (1, 2, 3)])
        g.add_edges([((1,), (2,)), ((2,), (3,))])
        sims.append(DeltaSimulator(g, track=track))
    one, many = sims
    with pytest.raises(UnknownTaskError, match=r"no task \(7,\)"):
        for k in [(1,), (7,), (3,)]:
            one.remove_task(k)
    with pytest.raises(UnknownTaskError, match=r"no task \(7,\)"):
        many.remove_tasks([(1,), (7,), (3,)])
    assert _state(one.graph) == _state(many.graph) and len(many) == 2
    assert (one._seeds, one._removed, one._revive) == (many._seeds, many._removed, many._revive)
