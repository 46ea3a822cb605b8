"""What a step pays for its waits when the ranks' arrivals vary: the mean of each wait.

Algorithm 1 times mean durations, so it prices the wait of rank d for a message from rank q as
``max(0, r - a)``, with ``a`` the moment d's program reaches the exchange and ``r`` the moment
the message is there.  Both moments vary from step to step (the ops' own jitter, the scheduler, a
message's latency tail), and a step pays the mean of the wait, ``E[max(0, r - a)]``, which is
larger wherever the two arrive at about the same time.  In a model-parallel tagger's steps each
rank waited 5.6 ms a step for its peer on average, where the differences of the mean arrivals
say 2.8 ms (docs/simulation.md, "Fourteenth round").

This is statistical static timing analysis, per pair of ranks.  The offset between two ranks'
programs has a variance over the step: 0 as the step begins, it grows by the calibrated
``jitter`` (s^2 per second) for every second each of them runs, and each time one waits for the
other it becomes the variance of the offset they leave with: after a two-way exchange the
calibrated ``leave_var`` for its bytes; after a one-way message, that of the later of the
receiver's arrival and the message's, which varies by the pair's offset and the calibrated
``latency_var`` of a one-way message.  At each wait the moment the program goes on is the maximum
of its own arrival and its messages', whose mean and variance come from Clark's moments of the
maximum of two Gaussians (C. E. Clark, "The greatest of a finite set of random variables",
Operations Research 9(2), 1961), folded over the messages.  Tracking the pair's offset rather
than each rank's time keeps what the two share since they last met out of the wait.  A sender's
own call that sends its messages (``send_call``) runs after its program arrives, while they are
on their way: it bounds the wait's end, and the arrival stays the program's.
Approximations: a wait for several ranks leaves the rank's offsets to the others as they were,
and the mean waits are applied to the simulated timeline as the wait barriers' durations and the
step simulated again, until they settle (`ROUNDS`), rather than inside Algorithm 1 — so full and
delta simulation stay exact and identical, and the search's inner loop (`planner.search`) ranks
plans on mean times.  Every step the simulator reports for the trainer
(`planner.sim.simulate_strategy`) includes the waits.  Gradient buckets' all-reduces, which start
when the last rank issues them, are not corrected: the ranks of the measured plans issued them
within 0.1-0.2 ms of each other.
"""

from __future__ import annotations

import bisect
import math

from .trainer_model import grads_in, inputs_in

#: At most this many times the waits are recomputed on the timeline they lengthened; it stops
#: once no wait moves by more than `SETTLED_S`.  Small models' steps settle in 4-6 rounds.
ROUNDS = 10
SETTLED_S = 1e-7
_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


def clark_max(m1: float, v1: float, m2: float, v2: float) -> tuple[float, float]:
    """Mean and variance of ``max(X, Y)`` for independent Gaussians X ~ N(m1, v1), Y ~ N(m2, v2)
    (Clark 1961, eqs. 2-3)."""
    t2 = v1 + v2
    if t2 <= 1e-24:
        return (m1, v1) if m1 >= m2 else (m2, v2)
    t = math.sqrt(t2)
    a = (m1 - m2) / t
    big = 0.5 * (1.0 + math.erf(a / _SQRT2))
    small = math.exp(-0.5 * a * a) / _SQRT2PI
    mean = m1 * big + m2 * (1.0 - big) + t * small
    second = (m1 * m1 + v1) * big + (m2 * m2 + v2) * (1.0 - big) + (m1 + m2) * t * small
    return mean, max(0.0, second - mean * mean)


def has_arrival_noise(builder) -> bool:
    """Whether `builder` models the trainer with a calibration that measured arrival noise."""
    rt = getattr(builder, "runtime", None)
    return rt is not None and rt.measures_arrival_noise


def _is_data(key: tuple) -> bool:
    """A message's wire part or its placing on the receiver (`trainer_model._message`, `_stage`)."""
    return len(key) == 7 and key[2] == 1 and (key[-1] >= 0 or key[-1] == -4)


def _is_send_call(key: tuple) -> bool:
    """A sender's own call that sends a message (`trainer_model._stage`): the program waits for it
    after it arrived at the exchange, while its messages are on their way."""
    return len(key) == 7 and key[2] == 1 and key[-1] == -6


class _Pair:
    """The variance of the offset between two ranks' programs over the step: events (moment,
    variance there), growing by both programs' `jitter` after each."""

    __slots__ = ("times", "vars", "growth")

    def __init__(self, jitter: float):
        self.times, self.vars, self.growth = [0.0], [0.0], 2.0 * jitter

    def at(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t) - 1
        return self.vars[k] + self.growth * max(0.0, t - self.times[k])

    def reset(self, t: float, var: float) -> None:
        k = bisect.bisect_right(self.times, t)
        self.times.insert(k, t)
        self.vars.insert(k, var)


def mean_waits(b, tg, tl) -> dict[tuple, float]:
    """Per wait barrier of the step (`inputs_in`, `grads_in`) whose program waits for another
    rank's message: seconds its mean wait exceeds the wait timeline `tl` shows.

    Offsets are tracked per pair of ranks, from 0 as the step begins: a pair's variance grows by
    both programs' ``jitter`` as they run, and a wait of one for the other sets it to the variance
    of the offset they leave with.  The messages from one rank wait on one program: the latest
    of them stands for all.  A wait for messages from several ranks leaves the pairs with the
    others as they were."""
    rt = b.runtime
    lat, leave = rt.latency_var, rt.leave_var
    n = b.num_ops
    waits = []
    for d in range(b.num_devices):
        for i in range(n):
            waits.append((tl.start[inputs_in(i, d)], d, inputs_in(i, d)))
            waits.append((tl.start[grads_in(n, i, d)], d, grads_in(n, i, d)))
    waits.sort()
    pairs: dict[tuple[int, int], _Pair] = {}
    out: dict[tuple, float] = {}
    for start, d, w in waits:
        own, messages, sending = [], {}, 0.0
        for p in tg.preds(w):
            if _is_data(p):
                m = p[:6]
                messages[m] = max(messages.get(m, -math.inf), tl.end[p])
            elif _is_send_call(p):
                sending = max(sending, tl.end[p])
            else:
                own.append(p)
        if not messages:
            continue
        a = max(tl.end[p] for p in own)
        # The messages from one peer all wait on its program: the latest of them stands for it.
        latest: dict[int, tuple] = {}
        for m, r in messages.items():
            senders = [p for p in tg.preds(m + (-1,)) if len(p) == 5 and p[2] in (-1, 2) and p[4] == 0]
            theirs = [p for p in senders if p[3] != d]
            if theirs and (theirs[0][3] not in latest or r > latest[theirs[0][3]][1]):
                latest[theirs[0][3]] = (m, r, tl.end[theirs[0]], len(theirs) < len(senders))
        ones, meets = [], []        # arrivals relative to `a`: (mean, variance, the pair's after)
        for q, (m, r, s, meet) in latest.items():
            v = pairs.setdefault((min(d, q), max(d, q)), _Pair(rt.jitter)).at(min(a, s))
            nbytes = tg.task(m + (0,)).nbytes if m + (0,) in tg else 0.0
            if meet:                           # it leaves once both programs are there
                vx = leave(nbytes) if leave is not None else 0.0
                both, vb = clark_max(0.0, 0.0, s - a, v)
                meets.append((both + r - max(a, s), vb + vx / 2, vx))
            else:
                vl = lat(nbytes) if lat is not None else 0.0
                after = clark_max(a - s, v, r - s, vl)[1] + rt.jitter * max(0.0, start - s)
                ones.append((r - a, v + vl, after))
        if not meets and not ones:
            continue
        # A message that waits for both programs arrives after this one's own arrival anyway.
        arrivals = meets + ones
        mean, var = arrivals[0][:2] if meets else (0.0, 0.0)
        for am, av, _ in arrivals[1:] if meets else arrivals:
            mean, var = clark_max(mean, var, am, av)
        out[w] = max(0.0, max(a + mean, sending) - start)
        if len(latest) == 1:
            q = next(iter(latest))
            pairs[(min(d, q), max(d, q))].reset(start, arrivals[0][2])
    return out


def with_mean_waits(b, tg, tl, simulate):
    """The timeline of task graph `tg` with every wait its mean under the calibration's arrival
    noise (`mean_waits`), the wait barriers lengthened by it in `tg` (`simulate`: Algorithm 1),
    recomputed on each new timeline until they settle."""
    base: dict[tuple, float] = {}
    last: dict[tuple, float] = {}
    for _ in range(ROUNDS):
        extra = mean_waits(b, tg, tl)
        if extra.keys() == last.keys() and all(abs(e - last[k]) <= SETTLED_S for k, e in extra.items()):
            break
        for key in set(base) | set(extra):
            if key not in base:
                base[key] = tg.task(key).duration
            tg.set_duration(key, base[key] + extra.get(key, 0.0))
        tl = simulate(tg)
        last = extra
    return tl
