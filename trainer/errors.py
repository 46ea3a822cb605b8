"""Errors the trainer raises on purpose; all are `AutoparError`s with messages a user can act on."""

from __future__ import annotations

from autopar.planner.errors import AutoparError, StrategyError


class TrainerError(AutoparError):
    """A training run could not start or did not finish."""


class TrainerConfigError(TrainerError):
    """An option of the run is invalid (unknown optimizer, bad step count, missing file)."""


class PlanRefusedError(StrategyError):
    """The plan cannot run on this model: an op the runtime cannot shard as configured, or a plan
    made for another model.  Raised before training starts; the message names op, config, reason."""


class CheckpointError(TrainerError):
    """A checkpoint is missing, corrupt, or was written for another model."""


class RankFailedError(TrainerError):
    """A rank of the job died or raised; the others were stopped."""

    def __init__(self, rank: int | None, message: str):
        super().__init__(message)
        self.rank = rank
