"""The garbage-collection regime of building, editing and searching task graphs.

A task graph is some 10^5 GC-tracked containers and a search keeps several alive while it makes
thousands of edits; CPython's cyclic collector would spend a large share of that time walking
objects that hold no cycles.  `gc_paused` holds it off while one graph is built or edited;
`frozen_heap` (with `refreeze`) keeps it off everything a search holds for as long as it runs.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Hold off the cyclic garbage collector while a task graph is built or edited.

    A task graph is mostly GC-tracked containers (two adjacency sets per task), and building one
    allocates 10^5 of them: every few thousand allocations the collector runs, and every so often
    it traverses every live object — the graph being built, the simulator's graph, the builder's
    plans — which cost about a third of an MCMC proposal's time on the larger zoo graphs.  What
    the builder and the simulator allocate holds no reference cycles (sets of ints, tuples, flat
    lists), so nothing is left for the collector to find; it resumes, and catches up with
    anything else, when the outermost pause ends."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_frozen_depth = 0


@contextmanager
def frozen_heap():
    """Keep the cyclic garbage collector off everything alive when a search starts, and off
    each task graph a search builds and each change a `DeltaSession` makes (`refreeze`), for as
    long as the search runs.

    A search keeps 10^5–10^6 long-lived containers (task graphs, plan memos, the traced model,
    torch's modules) and every proposal adds and drops thousands more, so every few dozen
    proposals CPython's oldest-generation collection walks them all: 0.1–0.5 s each, a tenth of
    an nmt chain's time at 16 GPUs.  Collecting once and then `gc.freeze()`-ing what survives
    leaves later collections only the young objects.  A change of 10^4 tasks allocates some 10^5
    young containers (adjacency sets, plan entries): freezing them too (`gc.freeze` is O(1))
    spares the collections that traversed them after every change, some 15 % of the time of
    random changes of nmt on 64 GPUs.
    Objects frozen stay subject to reference counting, so what the search drops is freed as
    usual; cyclic garbage made during the search and frozen with a change waits for the end,
    when everything is unfrozen."""
    global _frozen_depth
    if _frozen_depth or not gc.isenabled():
        _frozen_depth += 1
        try:
            yield
        finally:
            _frozen_depth -= 1
        return
    gc.collect()
    gc.freeze()
    _frozen_depth = 1
    try:
        yield
    finally:
        _frozen_depth = 0
        gc.unfreeze()


def refreeze() -> None:
    """Inside `frozen_heap`, freeze what was built since (a new task graph); else nothing."""
    if _frozen_depth:
        gc.freeze()
