"""torch.distributed plumbing: process groups created up front, and batched point-to-point exchange.

Every process group a plan needs (parameter synchronization sets, batch-norm statistics sets, the
loss reduction) is created by `ProcessGroups.create` on *all* ranks, in one sorted order, before
the first step: `dist.new_group` is itself a collective over the world, so creating groups lazily
inside a step would let ranks that take different branches deadlock.  Point-to-point messages of
one exchange are issued together with `dist.batch_isend_irecv` (gloo on CPU, NCCL on GPU — the
NCCL path groups them into one ncclGroupStart/End; it is written for CUDA but untested on this
machine, which has no GPU).  On gloo the runtime posts a step's receives ahead of its exchanges
(`RecvAhead`), and an exchange sends only.
"""

from __future__ import annotations

import zlib
from typing import Iterable, Mapping

import torch
import torch.distributed as dist

from autopar.planner.sim import COALESCE_BYTES

from .launch import own_gloo_call, track_gloo_loops


class ProcessGroups:
    """(purpose, device set) -> process group, for every set the plan communicates within.

    Each purpose gets its own groups — ``"sync"`` (gradient buckets, issued asynchronously as soon
    as they are final), ``"bn"`` (batch-norm statistics, issued at the op's place in the global
    order) and ``"world"`` (the loss and run-wide reductions) — so that collectives of different
    kinds, each issued in one consistent order on every rank, never interleave differently on
    two ranks inside one communicator.  Groups are kept across plans (a resumed run under a new
    plan, or a test running several plans in one job): every rank asks for the same groups in the
    same order, so reuse is consistent.
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[str, tuple[int, ...]], object] = {}

    def create(self, wanted: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        world = dist.get_world_size()
        for purpose, ranks in sorted({(p, tuple(sorted(s))) for p, s in wanted if len(s) > 1}):
            if (purpose, ranks) in self._groups:
                continue
            if ranks[-1] >= world:
                raise ValueError(f"device set {ranks} needs {ranks[-1] + 1} ranks; the job has {world}")
            self._groups[(purpose, ranks)] = dist.new_group(list(ranks))
            track_gloo_loops()            # each new gloo group has its own network thread

    def get(self, purpose: str, ranks: tuple[int, ...]):
        try:
            return self._groups[(purpose, tuple(sorted(ranks)))]
        except KeyError:
            raise KeyError(f"no {purpose} process group for devices {ranks}: the plan did not declare it up front") from None


def exchange(rank: int, sends: Mapping[int, torch.Tensor], recv_sizes: Mapping[int, int], dtype: torch.dtype,
             device: torch.device, tag: int, pending: list) -> dict[int, torch.Tensor]:
    """Send `sends[dst]` to every dst and receive `recv_sizes[src]` elements from every src."""
    got = exchange_many({(d, tag): t for d, t in sends.items()},
                        {(s, tag): (n, dtype) for s, n in recv_sizes.items()}, device, pending)
    return {peer: t for (peer, _), t in got.items()}


# Pieces for one peer of one dtype travel as one message up to `COALESCE_BYTES` in all
# (`exchange_many`); larger ones go one by one, where packing them would cost more than it saves.
# The simulator, which posts one receive per such message (`planner.sim.trainer_model.riders`),
# defines the limit.
#: Tags of coalesced messages start here, above any input index a caller uses as a tag.
_COALESCED_TAG = 1 << 24


def exchange_many(sends: Mapping[tuple[int, int], torch.Tensor],
                  recvs: Mapping[tuple[int, int], tuple[int, torch.dtype]], device: torch.device,
                  pending: list, ahead: "RecvAhead | None" = None) -> dict[tuple[int, int], torch.Tensor]:
    """One batch of point-to-point messages keyed by (peer, tag); returns what arrived, by key.

    All of an op's messages (every input, every peer) go in one `dist.batch_isend_irecv`, so an
    op costs one round of waiting however many inputs it redistributes.  Small pieces for one
    peer travel as one message per dtype (up to `COALESCE_BYTES` in all): laid end to end in tag
    order, and what arrives is cut back into them (views of one buffer).  gloo writes a pair's
    second message only after the first, from its communication thread, which on busy cores
    waits for a scheduler tick: in an RNN's model-parallel steps an exchange of two 8 KiB
    messages each way waited 1.43-1.68 ms on average (medians 0.72-1.2 ms), coalesced 1.0-1.39 ms
    (medians 0.28-0.35 ms), and its step went from 131 to 114-119 ms.  Larger pieces go one by
    one: packing them would copy megabytes to save a part of a millisecond; a lone piece is sent
    and received as it is, as before.  Send requests are appended to `pending` (their
    buffers must stay alive until they complete); the caller waits for them later, so a rank
    does not stall on a slow receiver before its next compute.  With `ahead` (a `RecvAhead` that
    knows the step's calls), the receives were posted before the call and only the sends go out.
    """
    if not sends and not recvs:
        return {}
    # Both ends of a pair decide alike: a receiver knows the size and dtype of every piece.
    out_units = _units({k: (t.numel(), t.dtype) for k, t in sends.items()})
    in_units = _units(recvs)
    posted = ahead.take(in_units, recvs) if ahead is not None and in_units else None
    ops = []
    recvd: dict[tuple[int, int], tuple[torch.Tensor, list]] = {}
    recv_works = []
    # One order on both sides of every pair (ascending peer, then tag), as NCCL's grouped p2p needs.
    for key in sorted(set(out_units) | set(in_units)):
        peer, tag = key
        if key in out_units:
            parts = out_units[key]
            buf = (sends[(peer, parts[0][0])].contiguous() if len(parts) == 1
                   else torch.cat([sends[(peer, t)].reshape(-1) for t, _ in parts]))
            ops.append(dist.P2POp(dist.isend, buf, peer, tag=tag))
        if key in in_units:
            parts = in_units[key]
            if posted is not None:
                buf, work = posted[key]
                recv_works.append(work)
            else:
                buf = torch.empty(sum(n for _, n in parts), dtype=recvs[(peer, parts[0][0])][1], device=device)
                ops.append(dist.P2POp(dist.irecv, buf, peer, tag=tag))
            recvd[key] = (buf, parts)
    with own_gloo_call():
        works = dist.batch_isend_irecv(ops) if ops else []
    for op, w in zip(ops, works):
        if op.op is dist.irecv:
            recv_works.append(w)
        else:
            pending.append((w, op.tensor))
    for w in recv_works:
        w.wait()
    out: dict[tuple[int, int], torch.Tensor] = {}
    for (peer, _), (buf, parts) in recvd.items():
        if len(parts) == 1:
            out[(peer, parts[0][0])] = buf
            continue
        at = 0
        for tag, n in parts:
            out[(peer, tag)] = buf[at:at + n]
            at += n
    return out


class RecvAhead:
    """Posts a step's receives before the exchanges that wait for them (gloo only).

    gloo's point-to-point is a rendezvous: a send goes out from the caller's thread only if the
    receiver's "ready" notice for it has already arrived; otherwise the data leaves later, from
    the sender's communication thread, once that notice comes.  When the receiver reaches its
    exchange after the sender has posted and gone on computing, that thread waits for a core:
    on this machine, a 16 KiB message with the sender computing for 5 ms after posting waited
    1.3-1.8 ms on average (90th percentile about 4.3 ms, a scheduler tick) against 0.42 ms when
    the receiver was there first; with the receive posted ahead, 0.19-0.35 ms however late the
    receiver came (1 MiB: 2.1 against 0.63 ms).  A transformer's data-parallel steps waited
    2.1-2.7 ms for each small message of the causal mask that way.

    A runtime's exchanges are the same every step (its plan is static), so the first step only
    records, in order, the messages each exchange receives (`take` returns None and
    `exchange_many` posts its own receives), and `end_step` freezes that list.  From then on
    `begin_step` posts, in the same order, the receives of as many exchanges as fit in `budget`
    bytes (at least one), and each `take` hands its exchange the receives posted for it, after
    posting further ones as the budget frees up.  gloo matches a pair's messages of one tag in
    the order they were posted, and the sender sends them in program order, so posting early
    in program order pairs every message with the same buffer as before.  An exchange that does
    not receive what was recorded is an error: the receives already posted would take another
    exchange's messages.
    """

    def __init__(self, device: torch.device, budget: int = 64 << 20):
        self.device = device
        self.budget = budget
        self._recording: list | None = []
        self._schedule: list[tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...], torch.dtype], ...]] = []
        self._next_take = 0
        self._next_post = 0
        self._posted: dict[int, dict[tuple[int, int], tuple[torch.Tensor, object]]] = {}
        self._bytes = 0

    @property
    def active(self) -> bool:
        """Whether receives are posted ahead (after the first, recording step)."""
        return self._recording is None

    @property
    def posted_ahead(self) -> int:
        """How many exchanges have their receives posted and not yet taken."""
        return len(self._posted)

    def begin_step(self) -> None:
        if self._posted:
            raise RuntimeError("RecvAhead.begin_step: receives of the last step were never taken (a step that "
                               "failed half-way); this runtime cannot go on")
        self._next_take = self._next_post = 0
        if self.active:
            self._post()

    def end_step(self) -> None:
        if self._recording is not None:
            self._schedule, self._recording = self._recording, None
        elif self._next_take != len(self._schedule):
            raise RuntimeError(f"RecvAhead: the step made {self._next_take} receiving exchanges, the first step "
                               f"{len(self._schedule)}")

    def take(self, units: Mapping[tuple[int, int], list[tuple[int, int]]],
             recvs: Mapping[tuple[int, int], tuple[int, torch.dtype]]) -> dict | None:
        sig = tuple((key, tuple(parts), recvs[(key[0], parts[0][0])][1]) for key, parts in sorted(units.items()))
        if self._recording is not None:
            self._recording.append(sig)
            return None
        k = self._next_take
        if k >= len(self._schedule) or self._schedule[k] != sig:
            raise RuntimeError(f"RecvAhead: exchange {k} of the step receives {sig}, but the first step's "
                               f"exchange {k} received {self._schedule[k] if k < len(self._schedule) else 'nothing'}")
        self._next_take = k + 1
        if k >= self._next_post:
            self._post(through=k)
        posted = self._posted.pop(k)
        self._bytes -= sum(buf.numel() * buf.element_size() for buf, _ in posted.values())
        self._post()
        return posted

    def _post(self, through: int = -1) -> None:
        """Post exchanges' receives in order while they fit in the budget, and through `through`."""
        while self._next_post < len(self._schedule):
            sig = self._schedule[self._next_post]
            nbytes = sum(sum(n for _, n in parts) * dtype.itemsize for _, parts, dtype in sig)
            if self._next_post > through and self._posted and self._bytes + nbytes > self.budget:
                return
            got = {}
            with own_gloo_call():
                for (peer, tag), parts, dtype in sig:
                    buf = torch.empty(sum(n for _, n in parts), dtype=dtype, device=self.device)
                    got[(peer, tag)] = (buf, dist.irecv(buf, peer, tag=tag))
            self._posted[self._next_post] = got
            self._bytes += nbytes
            self._next_post += 1


def _units(pieces: Mapping[tuple[int, int], tuple[int, torch.dtype]]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(peer, message tag) -> the (piece tag, elements) it carries, in order: the small pieces of
    one dtype for one peer together under a tag of their own, every other piece alone."""
    groups: dict[tuple[int, torch.dtype], list[tuple[int, int]]] = {}
    for (peer, tag), (n, dtype) in pieces.items():
        groups.setdefault((peer, dtype), []).append((tag, n))
    units: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (peer, dtype), parts in groups.items():
        parts.sort()
        if len(parts) > 1 and sum(n for _, n in parts) * dtype.itemsize <= COALESCE_BYTES:
            units[(peer, _COALESCED_TAG + zlib.crc32(str(dtype).encode()) % _COALESCED_TAG)] = parts
        else:
            units.update({(peer, tag): [(tag, n)] for tag, n in parts})
    return units


def wait_all(pending: list) -> None:
    for w, _ in pending:
        w.wait()
    pending.clear()
