"""SOAP parallelization configurations and strategies (FlexFlow sec. 4).

A `ParallelConfig` of an op gives a degree for each of its parallelizable dimensions (in the
op's `pardims` order) and one device for each of the resulting tasks.  Tasks are numbered in
row-major order of their grid coordinates (`planner.ir.regions.grid_coords`).  Partitions are equal,
so every degree divides its dimension.  Several tasks of one op may share a device: the task
graph then runs them one after the other there.

A `Strategy` maps every op of a graph to a configuration.  It is immutable; `with_config`
returns a new strategy with one op changed (what an MCMC proposal does, sec. 6.2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Mapping

from ..errors import StrategyError
from .graph import DimKind, Op, OperatorGraph
from .regions import grid_coords


@dataclass(frozen=True)
class ParallelConfig:
    degrees: tuple[int, ...]
    devices: tuple[int, ...]

    @property
    def num_tasks(self) -> int:
        n = 1
        for d in self.degrees:
            n *= d
        return n

    def coords(self) -> Iterator[tuple[int, ...]]:
        return grid_coords(self.degrees)

    def describe(self, op: Op) -> str:
        grid = "×".join(f"{p.name}{d}" for p, d in zip(op.pardims, self.degrees)) or "whole"
        return f"{grid} on {list(self.devices)}"


def check_config(op: Op, cfg: ParallelConfig, num_devices: int) -> None:
    """Raise `StrategyError` naming the op and the numbers when `cfg` does not fit `op`."""
    if len(cfg.degrees) != len(op.pardims):
        dims = ", ".join(p.name for p in op.pardims) or "none"
        raise StrategyError(f"{op.describe()}: {len(cfg.degrees)} degrees given but it has "
                            f"{len(op.pardims)} parallel dims ({dims})")
    for p, d in zip(op.pardims, cfg.degrees):
        if d < 1 or p.size % d or (p.size // d) % p.granule:
            allowed = ", ".join(map(str, p.allowed_degrees(num_devices)))
            raise StrategyError(f"{op.describe()}: degree {d} for {p.kind.value} dim {p.name} of size {p.size} "
                                f"does not give equal parts{f' of whole granules of {p.granule}' if p.granule > 1 else ''}; "
                                f"allowed degrees: {allowed}")
    n = cfg.num_tasks
    if len(cfg.devices) != n:
        grid = "×".join(map(str, cfg.degrees))
        raise StrategyError(f"{op.describe()}: degrees {grid} = {n} tasks but {len(cfg.devices)} devices given")
    for dev in cfg.devices:
        if not 0 <= dev < num_devices:
            raise StrategyError(f"{op.describe()}: device {dev} does not exist; the topology has devices 0..{num_devices - 1}")


@dataclass(frozen=True)
class Strategy:
    """A configuration for every op of a graph, stored in graph op order.

    `notes` are what a user should be told about the strategy (e.g. data parallelism that runs on
    fewer devices than asked because the batch does not divide); commands print them as warnings.
    They do not take part in comparisons, and a changed strategy (`with_config`) drops them.
    """

    op_names: tuple[str, ...]
    configs: tuple[ParallelConfig, ...]
    name: str = "custom"
    notes: tuple[str, ...] = field(default=(), compare=False)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.op_names)}

    def __getitem__(self, op_name: str) -> ParallelConfig:
        try:
            return self.configs[self._index[op_name]]
        except KeyError:
            raise StrategyError(f"strategy {self.name} has no configuration for op {op_name!r}") from None

    def items(self) -> Iterator[tuple[str, ParallelConfig]]:
        return zip(self.op_names, self.configs)

    def with_config(self, op_name: str, cfg: ParallelConfig, name: str | None = None) -> "Strategy":
        i = self._index[op_name]
        configs = self.configs[:i] + (cfg,) + self.configs[i + 1:]
        return Strategy(self.op_names, configs, name or self.name)

    def renamed(self, name: str) -> "Strategy":
        return Strategy(self.op_names, self.configs, name, self.notes)

    def with_notes(self, *notes: str) -> "Strategy":
        """The same strategy with `notes` added."""
        return Strategy(self.op_names, self.configs, self.name, self.notes + tuple(n for n in notes if n not in self.notes))

    @classmethod
    def from_mapping(cls, graph: OperatorGraph, configs: Mapping[str, ParallelConfig], name: str = "custom") -> "Strategy":
        missing = [op.name for op in graph.ops if op.name not in configs]
        if missing:
            raise StrategyError(f"strategy {name}: no configuration for {len(missing)} op(s): {', '.join(missing[:8])}"
                                f"{' …' if len(missing) > 8 else ''}")
        extra = sorted(set(configs) - set(graph.by_name))
        if extra:
            raise StrategyError(f"strategy {name}: configurations for ops the graph does not have: {', '.join(extra[:8])}")
        return cls(tuple(op.name for op in graph.ops), tuple(configs[op.name] for op in graph.ops), name)

    def validate(self, graph: OperatorGraph, num_devices: int) -> None:
        if self.op_names != tuple(op.name for op in graph.ops):
            Strategy.from_mapping(graph, dict(self.items()), self.name)  # raises with the difference
            raise StrategyError(f"strategy {self.name}: ops are not in the graph's order")
        for op, cfg in zip(graph.ops, self.configs):
            check_config(op, cfg, num_devices)

    def devices_used(self) -> set[int]:
        return {d for c in self.configs for d in c.devices}


# -- constructors ---------------------------------------------------------------------------

def _largest_degree(size: int, limit: int, granule: int = 1) -> int:
    units = size // granule
    for d in range(min(limit, units), 0, -1):
        if units % d == 0:
            return d
    return 1


def single_device(graph: OperatorGraph, device: int = 0) -> Strategy:
    cfgs = {op.name: ParallelConfig((1,) * len(op.pardims), (device,)) for op in graph.ops}
    return Strategy.from_mapping(graph, cfgs, "single-device")


def data_parallel(graph: OperatorGraph, num_devices: int) -> Strategy:
    """Every op split along its sample dimension over as many devices as divide the batch.

    When the batch does not divide over all devices, the strategy says so in its `notes`."""
    cfgs = {}
    widest = 0
    for op in graph.ops:
        degrees = [1] * len(op.pardims)
        k = 1
        for i, p in enumerate(op.pardims):
            if p.kind is DimKind.SAMPLE:
                k = _largest_degree(p.size, num_devices, p.granule)
                degrees[i] = k
                widest = max(widest, k)
                break
        cfgs[op.name] = ParallelConfig(tuple(degrees), tuple(range(k)))
    strategy = Strategy.from_mapping(graph, cfgs, "data-parallel")
    if num_devices > 1 and widest == 0:
        strategy = strategy.with_notes(f"graph {graph.name} has no sample (batch) dimension to split: data-parallel "
                                       f"runs on 1 of {num_devices} devices")
    elif num_devices > 1 and widest < num_devices:
        strategy = strategy.with_notes(batch_note(graph.batch_size, num_devices, widest))
    return strategy


def batch_note(batch: int, num_devices: int, used: int) -> str:
    """What to tell a user whose batch does not split over all devices."""
    lower = batch - batch % num_devices
    sizes = " or ".join(str(b) for b in (lower, lower + num_devices) if b > 0)
    return (f"batch {batch} does not divide over {num_devices} devices: data-parallel runs on {used} "
            f"device{'s' if used != 1 else ''}; use a batch divisible by {num_devices} (e.g. {sizes})")


def model_parallel(graph: OperatorGraph, num_devices: int) -> Strategy:
    """The parameters of every layer split evenly over all devices (FlexFlow sec. 8.2.1).

    Ops with parameters are split along their parameter dimension(s) (the largest degree that
    divides them, up to the number of devices).  Ops without parameters (activations, pools,
    concatenations) keep the split of their first input when they have a dimension of the same
    name — a ReLU after a channel-split convolution stays channel-split on the same devices, as in
    any model-parallel implementation — and otherwise run whole on device 0.
    """
    cfgs: dict[str, ParallelConfig] = {}
    for op in graph.ops:
        degrees = [1] * len(op.pardims)
        devices: tuple[int, ...] | None = None
        if op.params:
            remaining = num_devices
            for i, p in enumerate(op.pardims):
                if p.kind is DimKind.PARAMETER and remaining > 1:
                    d = _largest_degree(p.size, remaining, p.granule)
                    degrees[i] = d
                    remaining //= d
        elif op.inputs:
            src = graph[op.inputs[0].op]
            scfg = cfgs[src.name]
            split = [(p.name, d) for p, d in zip(src.pardims, scfg.degrees) if d > 1]
            if len(split) == 1:
                name, d = split[0]
                mine = op.pardim(name)
                if mine is not None and mine.size % d == 0 and (mine.size // d) % mine.granule == 0:
                    degrees[[p.name for p in op.pardims].index(name)] = d
                    devices = scfg.devices
        n = 1
        for d in degrees:
            n *= d
        cfgs[op.name] = ParallelConfig(tuple(degrees), devices if devices is not None else tuple(range(n)))
    return Strategy.from_mapping(graph, cfgs, "model-parallel")


# -- enumeration ----------------------------------------------------------------------------

def degree_choices(op: Op, num_devices: int) -> list[tuple[int, ...]]:
    """Every degree vector of `op` whose task count is at most `num_devices`."""
    out: list[tuple[int, ...]] = [()]
    for p in op.pardims:
        nxt = []
        for prefix in out:
            used = 1
            for d in prefix:
                used *= d
            for d in p.allowed_degrees(num_devices // used):
                nxt.append(prefix + (d,))
        out = nxt
    return out


def enumerate_configs(op: Op, num_devices: int) -> list[ParallelConfig]:
    """Configurations with canonical placements: every degree vector, its k tasks on each aligned
    block of k consecutive devices (blocks start at multiples of k).  Consecutive ids share a node
    in every preset, so blocks respect the machine hierarchy; this is the space OptCNN's dynamic
    programming enumerates (OptCNN sec. 4, which parallelizes each layer over device sets).
    """
    out = []
    for degrees in degree_choices(op, num_devices):
        k = 1
        for d in degrees:
            k *= d
        for start in range(0, num_devices - k + 1, k):
            out.append(ParallelConfig(degrees, tuple(range(start, start + k))))
    return out


def block_config(op: Op, num_devices: int, rng: random.Random) -> ParallelConfig:
    """FlexFlow's random configuration as its implementation draws it: random degrees (uniform
    over the allowed vectors), the tasks on a block of consecutive devices starting at a random
    device, the start rounded down to a multiple of the non-sample degrees so that the tasks
    sharing a sample range sit in one aligned block (on a node, when the node is that large).
    Consecutive ids share a node in every preset, so this is the placement a hierarchy favours;
    other placements are reached by `placement_move`."""
    return _on_random_block(op, rng.choice(degree_choices(op, num_devices)), num_devices, rng)


def block_shift(op: Op, cfg: ParallelConfig, num_devices: int, rng: random.Random) -> ParallelConfig:
    """The same degrees on another block of consecutive devices (a random start, aligned as in
    `block_config`): the operation dimension of the SOAP space, for a whole op at once."""
    return _on_random_block(op, cfg.degrees, num_devices, rng)


def _on_random_block(op: Op, degrees: tuple[int, ...], num_devices: int, rng: random.Random) -> ParallelConfig:
    k = inner = 1
    for p, d in zip(op.pardims, degrees):
        k *= d
        if p.kind is not DimKind.SAMPLE:
            inner *= d
    start = rng.randrange(num_devices - k + 1)
    start -= start % inner
    return ParallelConfig(degrees, tuple(range(start, start + k)))


def placement_move(cfg: ParallelConfig, num_devices: int, rng: random.Random) -> ParallelConfig:
    """The same degrees with one task moved: to a device the op does not use, or swapped with
    another of its tasks.  Symmetric (the reverse move has the same probability); with
    `block_config` it reaches every placement."""
    devs = list(cfg.devices)
    t = rng.randrange(len(devs))
    d = rng.randrange(num_devices)
    if d in devs:
        u = devs.index(d)
        devs[t], devs[u] = devs[u], devs[t]
    else:
        devs[t] = d
    return ParallelConfig(cfg.degrees, tuple(devs))


def random_config(op: Op, num_devices: int, rng: random.Random) -> ParallelConfig:
    """A random configuration: random degrees (uniform over allowed vectors), random distinct
    devices for the tasks (FlexFlow sec. 6.2's proposal draws a configuration at random)."""
    degrees = rng.choice(degree_choices(op, num_devices))
    k = 1
    for d in degrees:
        k *= d
    return ParallelConfig(degrees, tuple(rng.sample(range(num_devices), k)))
