"""Named strategies: the baselines a search is compared with, usable wherever a strategy is.

`named_strategy("data-parallel", graph, topology)` builds one; `list_named()` tells which names
exist, in the order the CLI lists and simulates them.  The table holds every rule of FlexFlow
sec. 8.2.1 (data and model parallelism, the expert strategies, placement only) and OptCNN's
dynamic programming (OptCNN sec. 5).  It sits on top of the search package: the fixed rules are
`experts.RULES`, the searched ones come from `plan` and `optcnn`, and none of them imports it.
"""

from __future__ import annotations

from ..cost.model import CostModel
from ..errors import StrategyError
from ..hardware.topology import DeviceTopology
from ..ir.graph import OperatorGraph
from ..ir.strategy import Strategy
from .experts import RULES, Rule
from .optcnn import optcnn
from .plan import placement_strategy


def _optcnn(graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    return optcnn(graph, topology, CostModel()).strategy


_NAMED: dict[str, tuple[Rule, str]] = {
    **RULES,
    "placement": (placement_strategy, "device placement only (REINFORCE's space), searched by MCMC from a single "
                  "device and from one layer depth per device"),
    "optcnn": (_optcnn, "OptCNN's layer-wise dynamic programming, optimal under its cost model (sum of "
               "compute, transfer and synchronization, no overlap)"),
}


def list_named() -> dict[str, str]:
    """Every named strategy with a one-line description."""
    return {k: d for k, (_, d) in _NAMED.items()}


def named_strategy(name: str, graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    """The strategy `name` (a key of `list_named`) of `graph` on `topology`, named `name`."""
    try:
        builder, _ = _NAMED[name]
    except KeyError:
        raise StrategyError(f"unknown strategy {name!r}; named strategies: {', '.join(_NAMED)} "
                            "(or give a plan file)") from None
    return builder(graph, topology).renamed(name)
