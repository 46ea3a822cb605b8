"""SGD with momentum and Adam stepping on the local parameter shards.

Both optimizers are elementwise: a shard updated on its own is bit-for-bit the same slice of the
full update, so the runtime uses `torch.optim.SGD` / `torch.optim.Adam` themselves over the shard
tensors (the same code a single-device run uses) and only adds what sharding needs: reading and
writing the per-element state (momentum buffer; Adam's two moments and step count) as shard-shaped
tensors, which checkpoints gather into full, strategy-independent tensors and scatter back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import TrainerConfigError

#: Per-element state tensors of each optimizer (what a checkpoint stores per parameter).
STATE_KEYS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in STATE_KEYS:
            raise TrainerConfigError(f"unknown optimizer {self.name!r}; choose one of: {', '.join(STATE_KEYS)}")
        if not self.lr > 0:
            raise TrainerConfigError(f"learning rate must be positive, got {self.lr}")

    def build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The torch optimizer over `params` (shards or, for a reference run, full parameters)."""
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        return torch.optim.Adam(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "lr": self.lr, "momentum": self.momentum, "betas": list(self.betas),
                "eps": self.eps, "weight_decay": self.weight_decay}


def get_state(opt: torch.optim.Optimizer, name: str, p: torch.Tensor, key: str) -> torch.Tensor | None:
    """Shard-shaped state tensor `key` of parameter `p` (None before the first step)."""
    return opt.state.get(p, {}).get(key)


def get_step(opt: torch.optim.Optimizer) -> int:
    """Adam's step count (the same for every parameter that has taken a step); 0 for SGD."""
    for st in opt.state.values():
        if "step" in st:
            return int(st["step"])
    return 0


def set_state(opt: torch.optim.Optimizer, cfg: OptimizerConfig, p: torch.Tensor, values: dict[str, torch.Tensor],
              step: int) -> None:
    """Install shard-shaped state for `p`, as the optimizer would have built it."""
    st: dict[str, Any] = {}
    for key in STATE_KEYS[cfg.name]:
        if key in values:
            st[key] = values[key].to(dtype=p.dtype, device=p.device).clone()
    if cfg.name == "sgd" and cfg.momentum == 0:
        st.pop("momentum_buffer", None)
    if cfg.name == "adam":
        if not st:
            return
        # torch.optim.Adam keeps the step as a float tensor of its scalar dtype (float32 unless the
        # default dtype is float64); matching it keeps the bias correction bit-identical.
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        st["step"] = torch.tensor(float(step), dtype=scalar)
    if st:
        opt.state[p] = st
