"""Fixtures of the trainer's tests."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank():
    """A one-rank gloo world in this process (a `HashStore`, no network), destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
