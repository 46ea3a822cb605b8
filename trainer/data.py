"""Training data: synthetic batches by default, or a tensor file given with ``--data PATH``.

Every rank produces the *global* batch of a step from the step number alone and then takes the
regions its input tasks need, so the data a run sees depends on neither the plan nor the number
of ranks, and a run resumed at step k sees exactly what an uninterrupted run would have seen.

Synthetic data: the model spec's own random inputs and labels (`ModelSpec.example_inputs`,
token ids below the vocabulary), seeded by ``(seed, step)`` and drawn on the rank's device: a
CUDA rank draws its own (different numbers from a CPU rank's, as reproducible), since a global
batch of images drawn on the host took longer than the GPU's whole step.

A dataset file is ``torch.save``'d dict with one tensor per model input and one for the target,
keyed by their names (``{"images": (S, 3, 32, 32) float, "labels": (S,) int64}``), the sample axis
first.  Step k takes samples ``[k·B, (k+1)·B)`` modulo S, B = the model's global batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from .errors import TrainerConfigError


class Batches(Protocol):
    def batch(self, step: int) -> dict[str, torch.Tensor]: ...


class SyntheticData:
    def __init__(self, spec, seed: int = 0, device: torch.device | str = "cpu"):
        self.spec = spec
        self.seed = seed
        self.device = torch.device(device)   # where batches are drawn (CUDA: on the GPU, see ModelSpec)
        self.names = [n for n, _ in spec.inputs] + [spec.target[0]]

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        base = (self.seed * 1_000_003 + step) * 2
        xs = self.spec.example_inputs(self.device, seed=base)
        out = {name: x for (name, _), x in zip(self.spec.inputs, xs)}
        out[self.spec.target[0]] = self.spec.example_target(self.device, seed=base + 1)
        return out


class FileData:
    def __init__(self, spec, path: str | Path):
        p = Path(path)
        if not p.exists():
            raise TrainerConfigError(f"dataset file {p} does not exist")
        try:
            blob = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
            raise TrainerConfigError(f"dataset file {p} is not a torch.save'd dict of tensors: {e}") from e
        specs = dict(spec.inputs)
        specs[spec.target[0]] = spec.target[1]
        if not isinstance(blob, dict) or set(specs) - set(blob):
            have = sorted(blob) if isinstance(blob, dict) else type(blob).__name__
            raise TrainerConfigError(f"dataset file {p} must hold tensors named {sorted(specs)}; it holds {have}")
        self.tensors = {}
        sizes = set()
        for name, s in specs.items():
            t = blob[name]
            if tuple(t.shape[1:]) != tuple(s.shape[1:]):
                raise TrainerConfigError(f"dataset {p}: {name} has per-sample shape {tuple(t.shape[1:])}, the model "
                                         f"expects {tuple(s.shape[1:])}")
            self.tensors[name] = t.to(getattr(torch, s.dtype))
            sizes.add(t.shape[0])
        if len(sizes) != 1:
            raise TrainerConfigError(f"dataset {p}: the tensors have different sample counts {sorted(sizes)}")
        self.samples = sizes.pop()
        self.batch_size = spec.batch_size
        if self.samples < self.batch_size:
            raise TrainerConfigError(f"dataset {p} has {self.samples} samples, fewer than one batch of {self.batch_size}")

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        idx = (torch.arange(self.batch_size) + step * self.batch_size) % self.samples
        return {name: t[idx] for name, t in self.tensors.items()}


def make_data(spec, path: str | None = None, seed: int = 0, device: torch.device | str = "cpu") -> Batches:
    """The run's batches: the dataset file at `path`, else synthetic ones drawn on `device`."""
    return FileData(spec, path) if path else SyntheticData(spec, seed, device)
