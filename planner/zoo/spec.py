"""`ModelSpec`: a model together with the inputs, labels and loss it is trained with.

The planner needs more than an `nn.Module` to build an operator graph: the shapes of the
forward inputs (traced with fake tensors, so paper-scale batches cost nothing), the name of every
axis (``n`` is the sample dimension of FlexFlow sec. 4; ``c``/``h``/``w``/``l`` are the channel and
attribute dimensions), and the labels and loss that close the training step.  A zoo model and a
user's model are both just a factory that returns a `ModelSpec`.

Loss convention, uniform for every model: the module returns logits of shape ``(N, C)``
(classifiers) or ``(N, L, C)`` (one prediction per sequence position); the loss is
``"cross_entropy"`` over the classes, with the ``(N, L)`` positions of a 3-D output flattened into
samples first (`ModelSpec.compute_loss`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import AutoparError
from ..ir.graph import TensorSpec

LOSSES = ("cross_entropy",)
#: The float dtypes a model can be converted to (`with_dtype`, ``--dtype``).
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ModelSpec:
    """A model, its forward inputs, its labels and its loss.

    ``inputs`` are the positional arguments of ``module.forward`` in order, each with a name and a
    `TensorSpec` whose ``dims`` name every axis; ``target`` is the labels tensor; ``options`` are the
    effective options the model was built with (defaults filled in).
    """

    name: str
    module: nn.Module
    inputs: tuple[tuple[str, TensorSpec], ...]
    target: tuple[str, TensorSpec]
    loss: str
    description: str
    options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.module, nn.Module):
            raise AutoparError(f"model {self.name!r}: module is a {type(self.module).__name__}, not an nn.Module")
        if not self.inputs:
            raise AutoparError(f"model {self.name!r}: no forward inputs given; list them as (name, TensorSpec) pairs")
        for entry in (*self.inputs, self.target):
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], TensorSpec)):
                raise AutoparError(f"model {self.name!r}: inputs and target must be (name, TensorSpec) pairs, got {entry!r}")
        if self.loss not in LOSSES:
            raise AutoparError(f"model {self.name!r}: unknown loss {self.loss!r}; known: {', '.join(LOSSES)}")

    @property
    def batch_size(self) -> int:
        """Size of the sample dimension ``n`` of the first input."""
        spec = self.inputs[0][1]
        return spec.shape[spec.dims.index("n")] if "n" in spec.dims else spec.shape[0]

    def options_dict(self) -> dict[str, object]:
        return dict(self.options)

    def example_inputs(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Random forward inputs matching `inputs` (token ids drawn below the model's vocabulary),
        drawn on `device` by a generator of its own seeded with `seed`: a CUDA device draws them
        itself (a global batch of images drawn on the host and copied took longer than a GPU's
        step), so its numbers differ from the CPU's, each reproducible."""
        gen = torch.Generator(device=device).manual_seed(seed)
        return tuple(_random_tensor(spec, self._high(name), gen) for name, spec in self.inputs)

    def example_target(self, device: torch.device | str = "cpu", seed: int = 1) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed)
        name, spec = self.target
        return _random_tensor(spec, self._high(name), gen)

    def compute_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy; an ``(N, L, C)`` output is scored per position against ``(N, L)`` labels."""
        if logits.dim() == 3:
            return F.cross_entropy(logits.flatten(0, 1), target.flatten())
        return F.cross_entropy(logits, target)

    def _high(self, name: str) -> int:
        # Integer tensors are token ids or class labels: draw them below the size option that bounds
        # them, so example data is always valid input for embeddings and the loss.
        opts = dict(self.options)
        for key in _BOUNDS.get(name, ()):
            if key in opts:
                return int(opts[key])
        return 2


# Which option bounds the values of an integer tensor of a given name, in order of preference.
_BOUNDS = {
    "tokens": ("vocab",),
    "source": ("src_vocab", "vocab"),
    "target": ("tgt_vocab", "vocab"),
    "labels": ("classes", "tgt_vocab", "vocab"),
}


def _random_tensor(spec: TensorSpec, high: int, gen: torch.Generator) -> torch.Tensor:
    """A tensor of `spec` drawn by `gen` on its device."""
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        return torch.randn(spec.shape, generator=gen, device=gen.device).to(dtype)
    return torch.randint(0, high, spec.shape, generator=gen, dtype=dtype, device=gen.device)


def with_dtype(spec: ModelSpec, dtype: str | None) -> ModelSpec:
    """The spec with its module and its float inputs and target converted to `dtype` (None: unchanged).

    What ``autopar train --dtype`` trains and what ``autopar plan/simulate --dtype`` plan for: the
    graph imported from the result (its fingerprint included) is the same in both.  The module is
    converted in place (``nn.Module.to``); integer inputs (token ids, labels) keep their dtype.
    """
    if dtype is None:
        return spec
    if dtype not in FLOAT_DTYPES:
        raise AutoparError(f"model {spec.name!r}: dtype {dtype!r} is not a float dtype; use one of "
                           f"{', '.join(FLOAT_DTYPES)}")
    spec.module.to(getattr(torch, dtype))

    def conv(entry):
        name, s = entry
        return (name, TensorSpec(s.shape, s.dims, dtype) if s.dtype in FLOAT_DTYPES else s)
    return dataclasses.replace(spec, inputs=tuple(conv(e) for e in spec.inputs), target=conv(spec.target))


def seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """Build a module with ``torch.manual_seed(seed)``, leaving the caller's random state untouched.

    Works under ``with torch.device("meta"):`` too, which is how full-size models are built
    without allocating their parameters.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def check_sizes(model: str, **sizes: int) -> None:
    """Every size option must be a positive integer."""
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise AutoparError(f"model {model!r}: option {key}={value!r} must be a positive integer")


def check_dropout(model: str, p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise AutoparError(f"model {model!r}: option dropout={p!r} must be in [0, 1)")


def conv_out(size: int, kernel: int, stride: int = 1, pad: int = 0) -> int:
    """Output length of a convolution or pooling window (floor mode), as torch computes it."""
    return (size + 2 * pad - kernel) // stride + 1


def check_image(model: str, image: int, final: int, minimum: int) -> None:
    """The feature map must not vanish: `final` is its side after the last downsampling."""
    if final < 1:
        raise AutoparError(
            f"model {model!r}: image={image} is too small, the feature map shrinks to {final} pixels; "
            f"use image >= {minimum}"
        )


def images(batch: int, channels: int, image: int) -> tuple[tuple[str, TensorSpec], ...]:
    return (("images", TensorSpec((batch, channels, image, image), ("n", "c", "h", "w"))),)


def class_labels(batch: int) -> tuple[str, TensorSpec]:
    return ("labels", TensorSpec((batch,), ("n",), "int64"))


def token_ids(name: str, batch: int, length: int) -> tuple[str, TensorSpec]:
    return (name, TensorSpec((batch, length), ("n", "l"), "int64"))
