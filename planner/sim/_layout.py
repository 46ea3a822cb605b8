"""Where a task lives in a `TaskGraph`'s flat arrays, and the checks every way of adding one shares.

The task store (`_taskstore`) adds tasks one at a time and the batched edits (`_bulk`) many per
call; both pad keys to `KEY_FIELDS` fields for the compiled pass, give each id `MAX_PARTS` part
slots, and refuse the same bad durations and parts with the same messages.  Those rules live here,
below both, so that the store can call the batched edits without the batched edits importing the
store.
"""

from __future__ import annotations

import math
from operator import index as _as_index

from ..errors import SimulationError

_is_int = int.__instancecheck__

#: Key fields the compiled pass compares; longer keys make a graph use the Python pass.
KEY_FIELDS = 8
#: A missing key field: below every field a key may hold (lower fields make a graph use the
#: Python pass), so a key sorts before its extensions, as Python orders tuples.
KEY_PAD = -(1 << 62)
_PADS = tuple((KEY_PAD,) * (KEY_FIELDS - n) for n in range(KEY_FIELDS + 1))

#: Parts a multi-part task may have (a transfer over a route of up to this many links is one
#: task; `planner.sim._plans` splits longer routes).  Each id has this many part slots in the flat
#: arrays the compiled pass reads.
MAX_PARTS = 8
_NO_PARTS = bytes(8 * MAX_PARTS)


def _parts(key, resource, duration) -> tuple[tuple, tuple]:
    """The (resources, durations) of a multi-part task, checked: 2..MAX_PARTS distinct int
    resources, as many positive finite durations."""
    if type(resource) is not tuple or type(duration) is not tuple:
        raise SimulationError(
            f"task {key!r}: a task with parts gives a tuple of resources and a tuple of as many "
            f"part durations; got resource {resource!r} and duration {duration!r}")
    k = len(resource)
    if not 2 <= k <= MAX_PARTS:
        raise SimulationError(
            f"task {key!r}: {k} parts on {resource!r}; a task has 2 to {MAX_PARTS} parts (give a "
            f"single resource as an int, or split the task into several with consecutive keys)")
    if len(duration) != k:
        raise SimulationError(
            f"task {key!r}: {k} resources {resource!r} but {len(duration)} part durations {duration!r}; "
            f"give one duration per resource")
    try:
        rs = tuple(map(_as_index, resource))
    except TypeError:
        raise SimulationError(f"task {key!r}: resources {resource!r} must be ints") from None
    if len(set(rs)) != k:
        raise SimulationError(
            f"task {key!r}: resources {resource!r} repeat one; each part runs on its own resource")
    return rs, tuple(_check_duration(key, d) for d in duration)


def _check_duration(key, duration) -> float:
    d = float(duration)
    if not 0.0 < d < math.inf:  # also rejects NaN
        raise SimulationError(
            f"task {key!r}: duration {duration!r} s must be positive and finite; the simulator's "
            f"FIFO order and its exactness rest on every task taking time (give a free task a "
            f"tiny duration such as 1e-9 s, or leave it out)")
    return d
