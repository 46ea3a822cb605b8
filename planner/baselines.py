"""Named strategies: the baselines a search is compared with, usable wherever a strategy is.

`named_strategy("data-parallel", graph, topology)` builds one; `list_named()` tells which names
exist.  The search (`planner.search`) adds the strategies it finds under their own names.
"""

from __future__ import annotations

from typing import Callable

from .errors import StrategyError
from .graph import OperatorGraph
from .strategy import Strategy, data_parallel, model_parallel, single_device
from .topology import DeviceTopology

_Builder = Callable[[OperatorGraph, DeviceTopology], Strategy]

_NAMED: dict[str, tuple[_Builder, str]] = {
    "data-parallel": (lambda g, t: data_parallel(g, t.num_devices),
                      "every op split along its sample dimension over all devices"),
    "model-parallel": (lambda g, t: model_parallel(g, t.num_devices),
                       "the parameters of every layer split evenly over all devices (FlexFlow 8.2.1)"),
    "single-device": (lambda g, t: single_device(g, 0), "the whole model on device 0"),
}


def register(name: str, builder: _Builder, description: str) -> None:
    _NAMED[name] = (builder, description)


def _load_search() -> None:
    # The search package registers the expert, placement and OptCNN strategies; imported here,
    # lazily, because it imports this module.
    from . import search  # noqa: F401


def list_named() -> dict[str, str]:
    _load_search()
    return {k: d for k, (_, d) in _NAMED.items()}


def named_strategy(name: str, graph: OperatorGraph, topology: DeviceTopology) -> Strategy:
    _load_search()
    try:
        builder, _ = _NAMED[name]
    except KeyError:
        raise StrategyError(f"unknown strategy {name!r}; named strategies: {', '.join(_NAMED)} "
                            "(or give a plan file)") from None
    return builder(graph, topology).renamed(name)
