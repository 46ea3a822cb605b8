"""One rank's training session: its runtime, optimizer and data, steps, and the full state.

A `Trainer` is what `autopar train` runs on every rank and what the equivalence tests and the
runtime benchmark drive directly.  Every run starts from a private copy of the seed's full model
(or of a checkpoint's), slices its shards from it (`trainer.shards`), and steps `torch.optim` on
them (`trainer.optim`).  `full_state` gathers the unsharded state a checkpoint stores; loading one
slices it again for whatever plan the new run has.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from . import checkpoint as ckpt
from .comm import ProcessGroups, exchange, wait_all
from .data import make_data
from .optim import STATE_KEYS, get_state, get_step, set_state
from .runtime import Runtime
from .shards import gather_full, slice_view


class Trainer:
    """One rank's training state: runtime, optimizer, data; steps, checkpoints, full state."""

    def __init__(self, job, rank: int, world: int, groups: ProcessGroups, device: torch.device | str = "cpu",
                 resume_state: dict | None = None):
        cfg = job.config
        self.job, self.rank, self.world = job, rank, world
        self.device = torch.device(device)
        module = copy.deepcopy(job.spec.module)   # every run starts from the seed's full model
        self.step = 0
        if resume_state is not None:
            ckpt.check_compatible(resume_state, job.graph, cfg.optimizer.name)
            _load_module(module, resume_state)
            self.step = int(resume_state["step"])
        if self.device.type != "cpu":
            module.to(self.device)   # a full replica per device: shards are sliced from it, buffers live on it
        self.module = module
        self.runtime = Runtime(job.graph, job.strategy, module, rank=rank, world_size=world, groups=groups,
                               device=self.device, bucket_bytes=cfg.bucket_bytes, seed=cfg.seed)
        # A rank whose tasks read no parameter (ops on disjoint device subsets) has nothing to step.
        shards = self.runtime.parameters()
        self.optimizer = cfg.optimizer.build(shards) if shards else None
        if resume_state is not None and self.optimizer is not None:
            self._load_optimizer(resume_state)
        self.data = make_data(job.spec, cfg.data, cfg.seed, self.device)
        self.world_group = self.runtime.world_group

    def train_step(self, step: int | None = None) -> torch.Tensor:
        """One optimizer step on the batch of `step` (default: the next); returns this rank's loss part."""
        loss = self.forward_backward(step)
        self.optimizer_step()
        return loss

    def forward_backward(self, step: int | None = None) -> torch.Tensor:
        """Gradients of the batch of `step`, synchronized among the shards' holders."""
        step = self.step if step is None else step
        loss = self.runtime.step(self.data.batch(step), step)
        for t in self.runtime.parameters():
            if t.grad is None:      # no local task touched it this step: a zero gradient, as on one device
                t.grad = torch.zeros_like(t)
        self.step = step + 1
        return loss

    def optimizer_step(self) -> None:
        if self.optimizer is not None:
            with self.runtime.span("optimizer step"):
                self.optimizer.step()

    def global_loss(self, local: torch.Tensor) -> float:
        """The step's loss, summed over the ranks' parts.  Every rank ends its step here, so a rank
        done early waits for the slowest; `autopar train` times the step up to here, and the wait is
        the step's synchronization (the runtime's ``sync`` phase)."""
        t = local.detach().to(torch.float64).clone()
        if self.world > 1:
            with self.runtime.span("sync", "loss"):
                dist.all_reduce(t, group=self.world_group)
        return float(t)

    # -- state ---------------------------------------------------------------------------------
    def full_state(self, dst: int = 0) -> dict | None:
        """The unsharded training state on rank `dst` (None elsewhere); every rank must call it."""
        rt, cfg = self.runtime, self.job.config
        names = list(self.job.graph.param_specs)
        params = rt.gather("param", dst, names)
        shard_of = rt.shards
        states = {}
        for key in STATE_KEYS[cfg.optimizer.name]:
            states[key] = gather_full(rt.plan, self.rank, lambda n, k=key: (
                get_state(self.optimizer, n, shard_of[n].tensor, k) if n in shard_of else None), names, dst, self.device)
        buffers = _gather_buffers(self, dst)
        adam_step = torch.tensor([get_step(self.optimizer) if self.optimizer else 0], dtype=torch.int64,
                                 device=self.device)
        if self.world > 1:
            dist.all_reduce(adam_step, op=dist.ReduceOp.MAX, group=self.world_group)
        if self.rank != dst:
            return None
        return {
            "format": ckpt.FORMAT, "model": self.job.graph.name, "step": self.step,
            "params": {n: t.cpu() for n, t in params.items()},
            "buffers": buffers,
            "optimizer": {**cfg.optimizer.to_dict(), "step": int(adam_step),
                          "state": {k: {n: t.cpu() for n, t in v.items()} for k, v in states.items()}},
            "strategy": self.job.strategy.name, "world_size": self.world,
        }

    def save(self, directory: str) -> str | None:
        state = self.full_state(0)
        if state is None:
            return None
        return str(ckpt.write(directory, state))

    def _load_optimizer(self, state: dict) -> None:
        opt_state = state["optimizer"]
        specs = self.job.graph.param_specs
        for name, shard in self.runtime.shards.items():
            values = {k: slice_view(v[name], specs[name].view, shard.box)
                      for k, v in opt_state["state"].items() if name in v}
            set_state(self.optimizer, self.job.config.optimizer, shard.tensor, values, opt_state["step"])


def _load_module(module: torch.nn.Module, state: dict) -> None:
    with torch.no_grad():
        params = dict(module.named_parameters())
        for n, t in state["params"].items():
            params[n].copy_(t)
        bufs = dict(module.named_buffers())
        for n, t in state.get("buffers", {}).items():
            if n in bufs:
                bufs[n].copy_(t)


def _gather_buffers(tr: Trainer, dst: int) -> dict[str, torch.Tensor] | None:
    """Module buffers on `dst`: batch-norm running statistics from the ranks that hold each channel
    slice (only they updated them), every other buffer from `dst`'s own copy."""
    rt = tr.runtime
    module = tr.module
    bufs = dict(module.named_buffers())
    items = []   # (buffer name, channel slice or None, owner)
    for op_name, path, (lo, hi), owner in rt.bn.running_owners():
        m = module.get_submodule(path)
        if not rt.bn.handles(op_name) or m.running_mean is None:
            continue
        items += [(f"{path}.running_mean", (lo, hi), owner), (f"{path}.running_var", (lo, hi), owner)]
        if lo == 0:
            items.append((f"{path}.num_batches_tracked", None, owner))
    sends, layout, pending = [], {}, []
    out = {n: b.detach().clone().cpu() for n, b in bufs.items()} if tr.rank == dst else None
    for name, sl, owner in items:
        value = bufs[name] if sl is None else bufs[name][sl[0]:sl[1]]
        if owner == tr.rank and owner != dst:
            sends.append(value.to(torch.float64).reshape(-1))
        elif owner != tr.rank and tr.rank == dst:
            layout.setdefault(owner, []).append((name, sl, value.numel()))
    got = exchange(tr.rank, {dst: torch.cat(sends)} if sends else {},
                   {o: sum(n for _, _, n in v) for o, v in layout.items()}, torch.float64, tr.device, 2000, pending)
    wait_all(pending)
    if out is None:
        return None
    for owner, entries in layout.items():
        at = 0
        for name, sl, n in entries:
            piece = got[owner][at:at + n].to(out[name].dtype)
            if sl is None:
                out[name].copy_(piece.view(out[name].shape))
            else:
                out[name][sl[0]:sl[1]] = piece
            at += n
    return out
