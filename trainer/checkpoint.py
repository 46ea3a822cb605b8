"""Strategy-independent checkpoints: the full, unsharded training state, written atomically by rank 0.

A checkpoint holds what a single-device run would hold — every parameter whole, the optimizer's
per-parameter state whole (momentum; Adam's moments and step), the model's buffers (batch-norm
running statistics) and the step number — and nothing about the plan.  Any plan, on any number
of ranks, resumes from it by slicing its own shards (`trainer.shards`), and because the data of a
step depends only on the step number (`trainer.data`) the resumed run continues exactly as the
uninterrupted one.

Writing: the holders send their shards' cells to rank 0 (`shards.gather_full`), which writes
``step-00000012.pt`` through a temporary file in the same directory, ``fsync`` and
``os.replace`` — a crash leaves either the previous checkpoint or the new one, never half of one —
and then points ``latest`` at it the same way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from autopar.planner.fileio import atomic_write

from .errors import CheckpointError

FORMAT = "autopar.checkpoint/1"
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.pt"


def _atomic_write(path: Path, write) -> None:
    atomic_write(path, write, binary=True)


def write(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` (from `Trainer.full_state`) as the checkpoint of its step; returns the path."""
    path = checkpoint_path(directory, int(state["step"]))
    _atomic_write(path, lambda f: torch.save(state, f))
    _atomic_write(Path(directory) / "latest", lambda f: f.write(path.name.encode() + b"\n"))
    return path


def latest(directory: str | Path) -> Path | None:
    """The newest complete checkpoint of `directory` (the ``latest`` pointer, else the highest step)."""
    d = Path(directory)
    pointer = d / "latest"
    if pointer.exists():
        p = d / pointer.read_text().strip()
        if p.exists():
            return p
    steps = sorted((int(m[1]), d / n) for n in os.listdir(d) if (m := _NAME.match(n))) if d.is_dir() else []
    return steps[-1][1] if steps else None


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        found = latest(p)
        if found is None:
            raise CheckpointError(f"no checkpoint in {p} (expected step-NNNNNNNN.pt files); start without --resume")
        p = found
    try:
        state = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {p} cannot be read: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not an autopar checkpoint (format {FORMAT})")
    state["path"] = str(p)
    return state


def check_compatible(state: dict[str, Any], graph, optimizer: str) -> None:
    """The checkpoint must hold exactly this model's parameters (any plan, any rank count)."""
    want = {n: tuple(s.shape) for n, s in graph.param_specs.items()}
    have = {n: tuple(t.shape) for n, t in state["params"].items()}
    if want != have:
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        shapes = sorted(n for n in set(want) & set(have) if want[n] != have[n])
        raise CheckpointError(
            f"checkpoint {state.get('path')} (model {state.get('model')}) does not match model {graph.name}: "
            f"missing {missing[:5]}, unexpected {extra[:5]}, different shapes {shapes[:5]}")
    if state["optimizer"]["name"] != optimizer:
        raise CheckpointError(f"checkpoint {state.get('path')} was trained with {state['optimizer']['name']}, "
                              f"this run uses {optimizer}; resume with --optimizer {state['optimizer']['name']}")
