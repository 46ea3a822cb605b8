"""Device topologies: compute devices, the links between them and the routes transfers take.

A `DeviceTopology` is a directed network.  Its vertices are compute devices (GPUs, or CPU worker
processes for the `local` preset) plus passive endpoints (PCIe switches, NICs, network
switches); its edges are `Link`s with a kind, a bandwidth and a latency.  Links are directed so
that full-duplex connections carry traffic both ways at full rate.

FlexFlow (sec. 5.1) treats every hardware connection as a *communication device* that runs
transfers in FIFO order.  A transfer between two compute devices travels a route — the links of
the fastest path (networkx shortest path weighted by the time to move 1 MiB).  How the task graph
charges a route to its links is described in `planner/sim/taskgraph.py`.

Presets (the paper's clusters, DGX nodes, this machine) live in `planner/hardware/presets.py`; file I/O in
`planner/hardware/topology_file.py`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable

import networkx as nx

from ..errors import TopologyError

LINK_KINDS = ("nvlink", "nvswitch", "pcie", "qpi", "infiniband", "ethernet", "loopback", "host")


@dataclass(frozen=True)
class Device:
    """A compute device.

    `peak_flops` is the dense throughput for float32 training (FP32 on K80/P100/V100, TF32 tensor
    cores on A100/H100), `peak_flops_half` for float16/bfloat16; `mem_bandwidth` in bytes/s,
    `memory` in bytes.  `host_workers`, for a CPU device, is how many of its topology's CPU devices
    share its node (`DeviceTopology` sets it): worker processes side by side share the host's caches
    and memory bandwidth, so an op's time depends on it and profile keys carry it
    (`planner.cost.profile_cache.kind_of`).
    """

    id: int
    name: str
    node: str
    product: str
    kind: str = "gpu"
    peak_flops: float = 0.0
    peak_flops_half: float = 0.0
    mem_bandwidth: float = 0.0
    memory: int = 0
    host_workers: int = 1

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or self.mem_bandwidth <= 0 or self.memory <= 0:
            raise TopologyError(
                f"device {self.name}: peak_flops ({self.peak_flops}), mem_bandwidth ({self.mem_bandwidth}) "
                f"and memory ({self.memory}) must all be positive")
        if self.host_workers < 1:
            raise TopologyError(f"device {self.name}: host_workers ({self.host_workers}) must be at least 1")

    @property
    def is_cpu(self) -> bool:
        """A CPU device (kind ``cpu``, ``cpu-core``, ...): a rank's core runs its ops, its
        communication and its program, with no stream to launch kernels into."""
        return self.kind.lower().startswith("cpu")

    def flops_for(self, dtype: str) -> float:
        if dtype in ("float16", "bfloat16") and self.peak_flops_half > 0:
            return self.peak_flops_half
        return self.peak_flops


@dataclass(frozen=True)
class Link:
    """A directed connection from endpoint `src` to endpoint `dst` (device names or switch names)."""

    src: str
    dst: str
    kind: str
    bandwidth: float  # bytes per second
    latency: float = 0.0  # seconds

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise TopologyError(f"link {self.src}->{self.dst}: unknown kind {self.kind!r}; known: {', '.join(LINK_KINDS)}")
        if self.bandwidth <= 0:
            raise TopologyError(f"link {self.src}->{self.dst}: bandwidth must be positive, got {self.bandwidth}")
        if self.latency < 0:
            raise TopologyError(f"link {self.src}->{self.dst}: latency must not be negative, got {self.latency}")

    @property
    def label(self) -> str:
        return f"{self.src}->{self.dst}"


@dataclass(frozen=True)
class DeviceTopology:
    """Devices, passive endpoints (switches, NICs) and directed links.

    Device ids must be 0..n-1 in order; strategies place tasks by device id.
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    switches: tuple[str, ...] = ()
    description: str = ""
    meta: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.devices:
            raise TopologyError(f"topology {self.name}: no devices")
        cpus: dict[str, int] = {}
        for d in self.devices:
            if d.is_cpu:
                cpus[d.node] = cpus.get(d.node, 0) + 1
        if any(d.is_cpu and d.host_workers != cpus[d.node] for d in self.devices):
            object.__setattr__(self, "devices", tuple(replace(d, host_workers=cpus[d.node]) if d.is_cpu else d
                                                      for d in self.devices))
        for i, d in enumerate(self.devices):
            if d.id != i:
                raise TopologyError(f"topology {self.name}: device {d.name} has id {d.id}, expected {i} (ids are 0..n-1 in order)")
        names = [d.name for d in self.devices] + list(self.switches)
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise TopologyError(f"topology {self.name}: names used twice: {', '.join(dup)}")
        known = set(names)
        for link in self.links:
            for end in (link.src, link.dst):
                if end not in known:
                    raise TopologyError(
                        f"topology {self.name}: link {link.label} names unknown endpoint {end!r}; "
                        "declare it as a device or under switches")
        if len(self.devices) > 1:
            g = self.network
            for a in self.devices[1:]:
                if not nx.has_path(g, self.devices[0].name, a.name) or not nx.has_path(g, a.name, self.devices[0].name):
                    raise TopologyError(f"topology {self.name}: no route between {self.devices[0].name} and {a.name}; add links")

    # -- structure ---------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    @cached_property
    def nodes(self) -> tuple[str, ...]:
        """Machine names in device order (a node holds one or more devices)."""
        seen: dict[str, None] = {}
        for d in self.devices:
            seen.setdefault(d.node, None)
        return tuple(seen)

    @cached_property
    def devices_by_node(self) -> dict[str, tuple[int, ...]]:
        acc: dict[str, list[int]] = {}
        for d in self.devices:
            acc.setdefault(d.node, []).append(d.id)
        return {k: tuple(v) for k, v in acc.items()}

    @cached_property
    def network(self) -> nx.DiGraph:
        g = nx.DiGraph()
        for d in self.devices:
            g.add_node(d.name)
        for s in self.switches:
            g.add_node(s)
        for i, link in enumerate(self.links):
            w = link.latency + (1 << 20) / link.bandwidth
            # Parallel links between the same endpoints: keep the faster.
            if g.has_edge(link.src, link.dst) and g[link.src][link.dst]["weight"] <= w:
                continue
            g.add_edge(link.src, link.dst, weight=w, link=i)
        return g

    @cached_property
    def _routes(self) -> dict[tuple[int, int], tuple[int, ...]]:
        g = self.network
        out: dict[tuple[int, int], tuple[int, ...]] = {}
        for a in self.devices:
            paths = nx.single_source_dijkstra_path(g, a.name, weight="weight")
            for b in self.devices:
                if a.id == b.id:
                    continue
                path = paths[b.name]
                out[(a.id, b.id)] = tuple(g[u][v]["link"] for u, v in zip(path, path[1:]))
        return out

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Indices into `links` of the path a transfer from device `src` to `dst` takes."""
        if src == dst:
            return ()
        try:
            return self._routes[(src, dst)]
        except KeyError:
            raise TopologyError(f"topology {self.name}: no device pair ({src}, {dst}); it has {len(self.devices)} devices") from None

    def route_bandwidth(self, src: int, dst: int) -> float:
        return min(self.links[i].bandwidth for i in self.route(src, dst)) if src != dst else float("inf")

    def route_latency(self, src: int, dst: int) -> float:
        return sum(self.links[i].latency for i in self.route(src, dst))

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Time of one uncontended transfer: the route's latency plus bytes over its slowest link."""
        if src == dst or nbytes <= 0:
            return 0.0
        return self.route_latency(src, dst) + nbytes / self.route_bandwidth(src, dst)

    # -- identity ----------------------------------------------------------------------------
    @cached_property
    def fingerprint(self) -> str:
        doc = {
            "devices": [[d.name, d.node, d.product, d.kind, d.memory] for d in self.devices],
            "links": sorted([l.src, l.dst, l.kind, l.bandwidth, l.latency] for l in self.links),
            "switches": sorted(self.switches),
        }
        blob = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()[:16]

    def summary(self) -> str:
        prods: dict[str, int] = {}
        for d in self.devices:
            prods[d.product] = prods.get(d.product, 0) + 1
        kinds = sorted({l.kind for l in self.links})
        devs = ", ".join(f"{n}× {p}" for p, n in prods.items())
        return f"{self.name}: {len(self.nodes)} node(s), {devs}; links: {', '.join(kinds) or 'none'}"

    def subset(self, device_ids: Iterable[int], name: str | None = None) -> "DeviceTopology":
        """The topology restricted to some devices (renumbered 0..k-1), keeping every switch."""
        keep = [self.devices[i] for i in device_ids]
        keep_names = {d.name for d in keep}
        devs = tuple(Device(**{**d.__dict__, "id": i}) for i, d in enumerate(keep))
        links = tuple(l for l in self.links
                      if (l.src in keep_names or l.src in self.switches) and (l.dst in keep_names or l.dst in self.switches))
        return DeviceTopology(name=name or f"{self.name}[{len(devs)}]", devices=devs, links=links,
                              switches=self.switches, description=self.description)
