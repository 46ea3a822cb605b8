"""A rank that dies or raises stops the job: the others exit, the error names the failed rank,
and nothing half-written is left behind."""

from __future__ import annotations

import os

import pytest

from autopar.trainer.errors import RankFailedError
from autopar.trainer.launch import run_local
from autopar.trainer.train import FAULT_ENV, train_main


def _raise_on_rank_one(rank: int, world: int) -> int:
    import torch.distributed as dist
    if rank == 1:
        raise ValueError("bad shard on purpose")
    dist.barrier()      # rank 0 waits for a peer that is gone
    return rank


def _ranks(rank: int, world: int, tag: str) -> tuple[int, int, str]:
    return rank, world, tag


def test_results_come_back_in_rank_order():
    assert run_local(_ranks, 3, ("x",)) == [(0, 3, "x"), (1, 3, "x"), (2, 3, "x")]


@pytest.mark.timeout(120)
def test_a_raising_rank_is_named_and_the_others_are_stopped():
    with pytest.raises(RankFailedError) as err:
        run_local(_raise_on_rank_one, 2, grace=5.0, timeout=60.0)
    assert err.value.rank == 1
    assert "rank 1 failed: ValueError: bad shard on purpose" in str(err.value)


@pytest.mark.timeout(180)
def test_a_dying_rank_stops_training_and_leaves_only_complete_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:3")   # rank 1 exits abruptly at the start of step 4
    with pytest.raises(RankFailedError) as err:
        train_main(model="lenet", model_options={"batch": 8, "image": 12}, strategy="data-parallel", nproc=2,
                   steps=6, checkpoint_dir=str(tmp_path), checkpoint_every=1, timeout=60, log=False)
    assert err.value.rank == 1
    assert "rank 1 died" in str(err.value)
    names = sorted(os.listdir(tmp_path))
    assert names == ["latest", "step-00000001.pt", "step-00000002.pt", "step-00000003.pt"]


def test_cuda_ranks_beyond_the_machines_gpus_are_refused_before_anything_starts():
    import torch

    from autopar.trainer.errors import TrainerConfigError
    from autopar.trainer.launch import check_gpus, rank_device
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(TrainerConfigError, match=f"{have + 1} CUDA rank.s. need one GPU each.*--nproc"):
        check_gpus(have + 1)
    with pytest.raises(TrainerConfigError, match="need one GPU each"):
        rank_device("cuda", have)
    check_gpus(have)   # as many as there are: fine
    assert rank_device("cpu", 5) == torch.device("cpu")
