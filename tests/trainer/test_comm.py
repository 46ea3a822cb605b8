"""`exchange_many` sends the small pieces that go to one peer in one exchange as one message per
dtype (gloo wrote a pair's second message only from its communication thread, which on busy cores
waited for a scheduler tick), large pieces one by one, and hands every piece back under its own
key.  Two real ranks exchange through
it in every multi-rank test (test_equivalence); this checks the messages it posts, and that
`RecvAhead` posts a step's receives ahead of their exchanges and pairs every message with the
buffer it would have had."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autopar.trainer.comm import COALESCE_BYTES, RecvAhead, exchange_many, wait_all
from autopar.trainer.launch import run_local


class _Op:
    def __init__(self, op, tensor, peer, tag=0):
        self.op, self.tensor, self.peer, self.tag = op, tensor, peer, tag


class _Done:
    def wait(self):
        pass


def test_small_pieces_for_one_peer_travel_as_one_message_per_dtype_and_large_ones_alone(monkeypatch):
    posted = []

    def batch(ops):
        posted.extend(ops)
        for o in ops:
            if o.op is dist.irecv:  # what the peer's message would carry
                o.tensor.copy_(torch.arange(o.tensor.numel(), dtype=o.tensor.dtype))
        return [_Done() for _ in ops]

    monkeypatch.setattr(dist, "P2POp", _Op)
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    big = COALESCE_BYTES // 4 // 2 + 1          # two such float32 pieces exceed the limit together
    pending: list = []
    sends = {(1, 1): torch.full((3,), 2.0), (1, 0): torch.full((2, 2), 1.0),
             (1, 2): torch.zeros(1, dtype=torch.int64), (2, 0): torch.ones(2, dtype=torch.int64),
             (3, 0): torch.zeros(big), (3, 1): torch.ones(big)}
    recvs = {(1, 0): (2, torch.float32), (1, 1): (3, torch.float32), (1, 2): (2, torch.int64)}
    got = exchange_many(sends, recvs, torch.device("cpu"), pending)

    out = [(o.peer, o.tensor.dtype, o.tensor.numel(), o.tensor[:8].tolist()) for o in posted if o.op is dist.isend]
    assert out == [(1, torch.int64, 1, [0]), (1, torch.float32, 7, [1.0] * 4 + [2.0] * 3),
                   (2, torch.int64, 2, [1, 1]), (3, torch.float32, big, [0.0] * 8), (3, torch.float32, big, [1.0] * 8)]
    into = [(o.peer, o.tensor.dtype, o.tensor.numel()) for o in posted if o.op is dist.irecv]
    assert into == [(1, torch.int64, 2), (1, torch.float32, 5)]
    assert {k: v.tolist() for k, v in got.items()} == {(1, 0): [0.0, 1.0], (1, 1): [2.0, 3.0, 4.0], (1, 2): [0, 1]}
    assert len(pending) == 5
    # A receiver decides as its sender does: the pieces' sizes and dtypes give the same tags.
    sent = {(o.peer, o.tensor.dtype): o.tag for o in posted if o.op is dist.isend}
    recv_tags = {(o.peer, o.tensor.dtype): o.tag for o in posted if o.op is dist.irecv}
    assert sent[(1, torch.float32)] == recv_tags[(1, torch.float32)] != sent[(1, torch.int64)]


# A step of exchanges between two ranks: (the tag of each piece rank 0 sends, its elements,
# its dtype), per exchange.  Exchange 1 carries two small pieces (one coalesced message), exchange 2
# reuses exchange 0's tag (gloo pairs them in posting order), exchange 3 sends nothing to rank 1.
_STEP = [[(0, 3, torch.float32)], [(0, 2, torch.float32), (1, 5, torch.int64)], [(0, 7, torch.float32)], [],
         [(2, COALESCE_BYTES // 4 + 1, torch.float32)]]


def _piece(step: int, k: int, tag: int, n: int, dtype) -> torch.Tensor:
    return (torch.arange(n) + 1000 * step + 100 * k + 10 * tag).to(dtype)


def _ahead_rank(rank: int, world: int, budget: int) -> list:
    device = torch.device("cpu")
    ahead = RecvAhead(device, budget=budget) if rank == 1 else None
    pending: list = []
    seen = []
    for step in range(4):
        if ahead is not None:
            ahead.begin_step()
            seen.append(ahead.posted_ahead)
        for k, pieces in enumerate(_STEP):
            if rank == 0:
                sends = {(1, tag): _piece(step, k, tag, n, dt) for tag, n, dt in pieces}
                exchange_many(sends, {}, device, pending)
                torch.mm(torch.randn(64, 64), torch.randn(64, 64))   # computes on: rank 1 comes late
            else:
                recvs = {(0, tag): (n, dt) for tag, n, dt in pieces}
                got = exchange_many({}, recvs, device, pending, ahead)
                for tag, n, dt in pieces:
                    assert torch.equal(got[(0, tag)], _piece(step, k, tag, n, dt)), (step, k, tag)
        if ahead is not None:
            ahead.end_step()
        wait_all(pending)
        dist.barrier()
    return seen


@pytest.mark.parametrize("budget", [1, 64 << 20])
def test_recv_ahead_posts_a_steps_receives_before_its_exchanges(budget):
    """The first step records; later ones post the receives of all their exchanges as they begin
    (of one at a time with a budget of one byte), and every piece arrives in its own buffer."""
    receiving = sum(1 for pieces in _STEP if pieces)
    assert run_local(_ahead_rank, 2, (budget,))[1] == [0] + [receiving if budget > 1 else 1] * 3


def test_recv_ahead_refuses_an_exchange_the_first_step_did_not_make(monkeypatch):
    monkeypatch.setattr(dist, "irecv", lambda buf, peer, tag=0: _Done())
    ahead = RecvAhead(torch.device("cpu"))
    units = {(1, 0): [(0, 4)]}
    ahead.begin_step()
    assert ahead.take(units, {(1, 0): (4, torch.float32)}) is None          # the first step records
    ahead.end_step()
    ahead.begin_step()
    posted = ahead.take(units, {(1, 0): (4, torch.float32)})
    assert list(posted) == [(1, 0)] and posted[(1, 0)][0].shape == (4,)
    with pytest.raises(RuntimeError, match="exchange 1 of the step receives .* received nothing"):
        ahead.take(units, {(1, 0): (4, torch.float32)})
    ahead.begin_step()
    with pytest.raises(RuntimeError, match="exchange 0 of the step receives"):
        ahead.take({(1, 0): [(0, 5)]}, {(1, 0): (5, torch.float32)})
