"""autopar's exception hierarchy.

Every error a user can cause (a model that does not trace, a malformed topology or plan file, a
strategy that does not fit the graph) is an `AutoparError` with a message that names the problem
and says what to do.  Third-party exceptions are wrapped with ``raise ... from e`` so the
original traceback is kept.
"""

from __future__ import annotations


class AutoparError(Exception):
    """Base class of every error autopar raises on purpose."""


class GraphImportError(AutoparError):
    """A model could not be turned into an operator graph (tracing or shape propagation failed)."""


class UnsupportedOpError(GraphImportError):
    """An op of the model has no mapping to an autopar op kind and cannot be made opaque."""


class TopologyError(AutoparError):
    """A device topology is malformed or inconsistent (unknown device, no route, bad field)."""


class StrategyError(AutoparError):
    """A parallelization configuration or strategy does not fit its graph or topology."""


class PlanFileError(AutoparError):
    """A plan file is malformed, or was made for another graph or topology."""


class CostModelError(AutoparError):
    """The cost model cannot estimate a task (unknown device kind, corrupt profile cache)."""


class OutOfMemoryError(AutoparError):
    """No strategy (or not the given one) fits the devices' memory."""


class SimulationError(AutoparError):
    """A task graph cannot be simulated as given (bad duration or key, unknown task, stale timeline)."""


class UnknownTaskError(SimulationError, KeyError):
    """A task key that is not in the task graph."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class TaskGraphCycleError(SimulationError):
    """The task graph has a dependency cycle; the message names tasks on it."""
