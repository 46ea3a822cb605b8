"""torch.distributed plumbing: process groups created up front, and batched point-to-point exchange.

Every process group a plan needs (parameter synchronization sets, batch-norm statistics sets, the
loss reduction) is created by `ProcessGroups.create` on *all* ranks, in one sorted order, before
the first step: `dist.new_group` is itself a collective over the world, so creating groups lazily
inside a step would let ranks that take different branches deadlock.  Point-to-point messages of
one exchange are issued together with `dist.batch_isend_irecv` (gloo on CPU, NCCL on GPU — the
NCCL path groups them into one ncclGroupStart/End; it is written for CUDA but untested on this
machine, which has no GPU).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
import torch.distributed as dist


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


def exchange_many(sends: Mapping[tuple[int, int], torch.Tensor],
                  recvs: Mapping[tuple[int, int], tuple[int, torch.dtype]], device: torch.device,
                  pending: list) -> dict[tuple[int, int], torch.Tensor]:
    """One batch of point-to-point messages keyed by (peer, tag); returns what arrived, by key.

    All of an op's messages (every input, every peer) go in one `dist.batch_isend_irecv`, so an
    op costs one round of waiting however many inputs it redistributes.  Send requests are
    appended to `pending` (their buffers must stay alive until they complete); the caller waits
    for them later, so a rank does not stall on a slow receiver before its next compute.
    """
    if not sends and not recvs:
        return {}
    ops = []
    recvd: dict[tuple[int, int], torch.Tensor] = {}
    # One order on both sides of every pair (ascending peer, then tag), as NCCL's grouped p2p needs.
    for key in sorted(set(sends) | set(recvs)):
        peer, tag = key
        if key in sends:
            ops.append(dist.P2POp(dist.isend, sends[key].contiguous(), peer, tag=tag))
        if key in recvs:
            n, dtype = recvs[key]
            buf = torch.empty(n, dtype=dtype, device=device)
            recvd[key] = buf
            ops.append(dist.P2POp(dist.irecv, buf, peer, tag=tag))
    works = dist.batch_isend_irecv(ops)
    recv_works = []
    for op, w in zip(ops, works):
        if op.op is dist.irecv:
            recv_works.append(w)
        else:
            pending.append((w, op.tensor))
    for w in recv_works:
        w.wait()
    return recvd


def wait_all(pending: list) -> None:
    for w, _ in pending:
        w.wait()
    pending.clear()
