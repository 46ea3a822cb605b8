"""A step's batch depends only on the step number (and seed), whichever plan or rank asks."""

from __future__ import annotations

import pytest
import torch

from autopar.planner.zoo.registry import get_model
from autopar.trainer.data import FileData, SyntheticData, make_data
from autopar.trainer.errors import TrainerConfigError

SPEC = get_model("lenet", batch=4, image=12)


def test_synthetic_batches_are_a_function_of_seed_and_step():
    a, b = SyntheticData(SPEC, seed=0), SyntheticData(SPEC, seed=0)
    assert torch.equal(a.batch(3)["images"], b.batch(3)["images"])
    assert torch.equal(a.batch(3)["labels"], b.batch(3)["labels"])
    assert not torch.equal(a.batch(3)["images"], a.batch(4)["images"])
    assert not torch.equal(a.batch(3)["images"], SyntheticData(SPEC, seed=1).batch(3)["images"])
    assert int(a.batch(0)["labels"].max()) < 10


def test_a_dataset_file_is_read_in_consecutive_batches_that_wrap(tmp_path):
    images = torch.arange(6 * 12 * 12, dtype=torch.float32).view(6, 1, 12, 12)
    labels = torch.arange(6) % 10
    torch.save({"images": images, "labels": labels}, tmp_path / "d.pt")
    data = make_data(SPEC, str(tmp_path / "d.pt"))
    assert data.batch(0)["labels"].tolist() == [0, 1, 2, 3]
    assert data.batch(1)["labels"].tolist() == [4, 5, 0, 1]
    assert torch.equal(data.batch(1)["images"][2], images[0])


def test_a_dataset_with_the_wrong_sample_shape_is_rejected(tmp_path):
    torch.save({"images": torch.zeros(8, 3, 12, 12), "labels": torch.zeros(8, dtype=torch.int64)}, tmp_path / "d.pt")
    with pytest.raises(TrainerConfigError, match=r"images has per-sample shape \(3, 12, 12\), the model expects \(1, 12, 12\)"):
        FileData(SPEC, tmp_path / "d.pt")


def test_a_dataset_missing_the_labels_is_rejected(tmp_path):
    torch.save({"images": torch.zeros(8, 1, 12, 12)}, tmp_path / "d.pt")
    with pytest.raises(TrainerConfigError, match=r"must hold tensors named \['images', 'labels'\]"):
        FileData(SPEC, tmp_path / "d.pt")
