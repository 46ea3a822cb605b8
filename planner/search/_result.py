"""What the planner returns: every candidate it evaluated and the plan, as data, JSON and text."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..ir.strategy import Strategy
from .mcmc import ChainResult
from .optcnn import OptCNNResult


@dataclass(frozen=True)
class Candidate:
    """One strategy the planner evaluated, with its full-simulation time and peak memory."""

    name: str
    strategy: Strategy | None
    step_time: float | None          # None when the strategy does not apply to this graph
    peak_memory: dict[int, int] | None
    fits: bool
    seconds: float                   # wall time to find it (searches) or build it (baselines)
    note: str = ""


@dataclass(frozen=True)
class PlanResult:
    graph: str
    topology: str
    graph_fingerprint: str
    topology_fingerprint: str
    num_devices: int
    strategy: Strategy
    step_time: float
    source: str                      # which candidate or chain produced `strategy`
    peak_memory: dict[int, int]
    candidates: dict[str, Candidate]
    chains: tuple[ChainResult, ...]
    optcnn: OptCNNResult | None
    search_seconds: float
    settings: dict
    note: str = ""
    memory_capacity: dict[int, int] = field(default_factory=dict)

    def speedup_over(self, name: str) -> float | None:
        c = self.candidates.get(name)
        if c is None or c.step_time is None or not self.step_time:
            return None
        return c.step_time / self.step_time

    def baseline_times(self) -> dict[str, float | None]:
        return {k: c.step_time for k, c in self.candidates.items()}

    def to_dict(self) -> dict:
        """What ``autopar plan --json`` prints."""
        return {
            "graph": self.graph, "topology": self.topology, "devices": self.num_devices,
            "graph_fingerprint": self.graph_fingerprint, "topology_fingerprint": self.topology_fingerprint,
            "step_seconds": self.step_time, "source": self.source, "note": self.note,
            "speedup_over_data_parallel": self.speedup_over("data-parallel"),
            "speedup_over_optcnn": self.speedup_over("optcnn"),
            "candidates": {k: {"step_seconds": c.step_time, "fits": c.fits, "search_seconds": round(c.seconds, 3),
                               "peak_memory_bytes": max(c.peak_memory.values()) if c.peak_memory else None,
                               "note": c.note} for k, c in self.candidates.items()},
            "peak_memory_bytes": {str(d): m for d, m in self.peak_memory.items()},
            "memory_capacity_bytes": {str(d): m for d, m in self.memory_capacity.items()},
            "chains": [{"space": c.space, "start": c.start,
                        "start_seconds": c.start_time if math.isfinite(c.start_time) else None,
                        "best_seconds": c.best_time if math.isfinite(c.best_time) else None,
                        "proposals": c.proposals, "accepted": c.accepted, "wall_seconds": round(c.seconds, 3),
                        "too_big": c.too_big, "stopped": c.stopped} for c in self.chains],
            "optcnn": None if self.optcnn is None else {
                "cost_model_seconds": self.optcnn.cost, "layers": self.optcnn.layers, "tying": self.optcnn.tying,
                "final_graph_layers": self.optcnn.stats.final_variables, "wall_seconds": round(self.optcnn.seconds, 3)},
            "search_seconds": round(self.search_seconds, 3),
            "settings": self.settings,
        }

    def report(self) -> str:
        """A few lines for a terminal: the answer, every candidate, peak memory per device."""
        lines = [f"plan for {self.graph} on {self.topology} ({self.num_devices} devices): "
                 f"{self.step_time * 1e3:.3f} ms per step, from {self.source}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for k, c in self.candidates.items():
            t = "n/a" if c.step_time is None else f"{c.step_time * 1e3:.3f} ms"
            extra = "" if c.fits or c.step_time is None else "  (does not fit in memory)"
            why = f"  — {c.note}" if c.step_time is None and c.note else ""
            lines.append(f"  {k:15s} {t:>13s}  ({c.seconds:.1f} s){extra}{why[:120]}")
        lines.append(f"  peak memory {_memory_summary(self.peak_memory, self.memory_capacity)}")
        lines.append(f"  search took {self.search_seconds:.1f} s (seed {self.settings.get('seed')})")
        return "\n".join(lines)


#: Up to this many devices the report lists each one's peak memory; beyond, the fullest and the
#: emptiest (a 64-GPU list fills a screen; `--json` has every device).
MEMORY_LIST_DEVICES = 8


def _memory_summary(peak: dict[int, int], capacity: dict[int, int]) -> str:
    """Peak memory per device against its capacity, as one readable line."""
    if len(peak) <= MEMORY_LIST_DEVICES:
        return "per device (used/capacity): " + ", ".join(
            f"{d}: {_bytes(m)}/{_bytes(capacity.get(d, 0))}" for d, m in peak.items())
    fill = lambda d: peak[d] / capacity[d] if capacity.get(d) else math.inf
    full, empty = max(peak, key=fill), min(peak, key=fill)
    return (f"of {len(peak)} devices (used/capacity): fullest device {full} {_bytes(peak[full])}/"
            f"{_bytes(capacity.get(full, 0))}, emptiest device {empty} {_bytes(peak[empty])}/"
            f"{_bytes(capacity.get(empty, 0))} (every device with --json)")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
