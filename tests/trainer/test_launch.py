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


def _placement(rank: int, world: int) -> tuple[tuple[int, ...], dict[str, list[int]], list[int]]:
    """This rank's cores, and the scheduling policy of each of its threads by name after the
    trainer's process groups are made (each group has its own gloo network thread), and the
    network threads' policies while the rank is inside a gloo call."""
    from autopar.trainer.comm import ProcessGroups
    from autopar.trainer.launch import GLOO_LOOP_THREAD, own_gloo_call
    groups = ProcessGroups()
    groups.create([("sync", (0, 1)), ("bn", (0, 1))])

    def policies() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as f:
                out.setdefault(f.read().strip(), []).append(os.sched_getscheduler(int(task)))
        return out

    with own_gloo_call():
        inside = policies()[GLOO_LOOP_THREAD]
    return tuple(sorted(os.sched_getaffinity(0))), policies(), inside


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names come from Linux's /proc")
def test_gloo_ranks_get_their_own_cores_and_gloos_network_threads_yield_to_the_ranks_own_calls():
    from autopar.trainer.launch import GLOO_LOOP_THREAD
    cores = sorted(os.sched_getaffinity(0))
    placed = run_local(_placement, 2)
    for rank, (mine, policies, inside) in enumerate(placed):
        if len(cores) >= 2:
            per = len(cores) // 2
            assert mine == tuple(cores[rank * per:(rank + 1) * per])
        else:
            assert mine == tuple(cores)
        # the world's group and the two made here: three network threads, each of them ordinary
        # outside the rank's own calls and non-preempting inside one
        assert policies[GLOO_LOOP_THREAD] == [os.SCHED_OTHER] * 3
        assert inside == [os.SCHED_BATCH] * 3
        assert set(policies["python"]) == {os.SCHED_OTHER}


def test_binding_to_cores_leaves_a_process_alone_where_there_are_too_few():
    from autopar.planner.cost import bind_to_own_cores
    before = os.sched_getaffinity(0)
    assert bind_to_own_cores(0, len(before) + 1) == ()
    assert bind_to_own_cores(3, 2) == ()
    assert os.sched_getaffinity(0) == before


def _memory(rank: int, world: int) -> tuple[str | None, int]:
    import torch
    blocks = [torch.ones(1 << 20) for _ in range(32)]      # 128 MiB in blocks of 4 MiB
    huge = [int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")]
    del blocks
    return os.environ.get("THP_MEM_ALLOC_ENABLE"), huge[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="huge pages are counted in Linux's /proc")
def test_a_ranks_large_tensors_sit_on_huge_pages_as_the_profilers_do(monkeypatch):
    """Every rank asks PyTorch's allocator for huge pages before it allocates (`init_rank`), as the
    profiler's workers do (`planner.cost.use_huge_pages`), so that ops run in the memory regime
    they were measured in."""
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    got = run_local(_memory, 2)
    assert [env for env, _ in got] == ["1", "1"]
    mode = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(mode) and "[never]" not in open(mode).read():
        assert all(huge >= 64 << 10 for _, huge in got), got
