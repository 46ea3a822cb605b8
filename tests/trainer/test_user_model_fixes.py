"""What a new user hit with their own model: dropout that --seed did not seed, data parallelism that
silently ran on one device, and plans refused in another dtype without saying why."""

from __future__ import annotations

import pytest

from autopar.trainer.train import TrainConfig, prepare, train_main

# AlexNet with its two dropout layers (p = 0.5), small enough for a 2-core machine.
ALEXNET = {"batch": 8, "image": 63, "classes": 10, "fc": 64, "dropout": 0.5}


def _losses(**kw) -> list[float]:
    summary = train_main(model="alexnet", model_options=ALEXNET, steps=3, log=False, **kw)
    return summary["losses"]


@pytest.mark.slow
@pytest.mark.distributed
def test_dropout_is_seeded_and_the_same_under_every_strategy():
    one = _losses(nproc=1, seed=5)
    dp = _losses(nproc=2, seed=5)
    again = _losses(nproc=2, seed=5)
    mp = _losses(nproc=2, seed=5, strategy="model-parallel")
    other = _losses(nproc=2, seed=6)
    assert dp == again                                   # the same seed: the same run, bit for bit
    assert dp == pytest.approx(one, rel=1e-5, abs=1e-6)  # 2 ranks draw the masks 1 rank draws
    assert mp == pytest.approx(one, rel=1e-5, abs=1e-6)
    assert other != dp


def test_data_parallel_on_a_batch_that_does_not_divide_carries_a_warning():
    job = prepare(TrainConfig(model="lenet", model_options={"batch": 15, "image": 12}, nproc=2), 2)
    assert job.strategy.devices_used() == {0}
    assert job.strategy.notes == ("batch 15 does not divide over 2 devices: data-parallel runs on 1 device; "
                                  "use a batch divisible by 2 (e.g. 14 or 16)",)
