"""`exchange_many` sends the small pieces that go to one peer in one exchange as one message per
dtype (gloo wrote a pair's second message only from its communication thread, which on busy cores
waited for a scheduler tick), large pieces one by one, and hands every piece back under its own
key.  Two real ranks exchange through
it in every multi-rank test (test_equivalence); this checks the messages it posts."""

from __future__ import annotations

import torch
import torch.distributed as dist

from autopar.trainer.comm import COALESCE_BYTES, exchange_many


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
