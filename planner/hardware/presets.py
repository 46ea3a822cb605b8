"""Topology presets: the paper's two clusters, DGX A100/H100 systems and this machine.

FlexFlow (sec. 3, Figure 2) plans against a device topology whose edges carry bandwidth and
latency; sec. 8.1 and Figure 6 describe the two clusters of its evaluation, which the presets
`p100-4x4` and `k80-16x4` reproduce.  `get_preset` also parses parametric forms:

    p100-NxM     N nodes x M P100 (M <= 4), NVLink mesh in a node, 100 Gb/s EDR between nodes
    k80-NxM      N nodes x M K80 dies (M = 1 or even), PCIe tree in a node, 56 Gb/s FDR between nodes
    dgx-a100xN   N DGX A100: 8 A100 on NVSwitch, 8 x 200 Gb/s HDR NICs (one per GPU)
    dgx-h100xN   N DGX H100: 8 H100 on NVSwitch, 8 x 400 Gb/s NDR NICs (one per GPU)
    local:N      N worker processes on this machine (gloo over TCP loopback); `local` = `local:2`

Naming and numbering: devices are `node<i>/gpu<j>` (`localhost/rank<j>` for `local`), numbered
node by node so that consecutive ids share a node, and on K80 nodes consecutive pairs share a
board's PCIe switch; strategies rely on aligned blocks of consecutive ids being close.
Passive endpoints: `node<i>/nic[<k>]`, `node<i>/nvswitch`, `node<i>/pcie<b>`, `node<i>/host`,
and one `ib-switch` (a non-blocking fabric: only NIC ports are contended).

Numbers (bandwidths in bytes/s per direction; latencies in seconds per link hop, so a route's
latency is the sum over its hops).  Latencies are small-message figures including the software
that starts a transfer, not wire delays:
- NVLink 1.0 (P100): 20 GB/s per link per direction.  Assumption: the paper's 4-GPU node is fully
  connected with one NVLink per GPU pair (a P100 has 4 links; 3 reach peers).  2 us per transfer
  (order of cudaMemcpyPeer / NCCL p2p small-message latency).
- NVSwitch: A100 300 GB/s and H100 450 GB/s per GPU per direction (12 and 18 links x 25 GB/s;
  NVIDIA DGX A100 / DGX H100 user guides), 1 us per hop, 2 hops GPU->switch->GPU.
- PCIe: ~80 % of theoretical x16 as measured by CUDA bandwidthTest: Gen3 12 GB/s, Gen4 25 GB/s,
  Gen5 50 GB/s; a Gen3 x8 NIC (ConnectX-3) 6.3 GB/s.  1 us per hop.
- InfiniBand data rates: EDR 100 Gb/s = 12.5 GB/s, FDR 56 Gb/s signalling = 54.5 Gb/s of data
  (64b/66b) = 6.8 GB/s, HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s.  0.6 us per hop (NIC->switch,
  switch->NIC), i.e. ~1.2 us end to end like perftest ib_send_lat on EDR/HDR.
  (The paper writes "100GB/s" and "56 GB/s EDR"; EDR is 100 Gb/s and 56 Gb/s is FDR, as the
  OptCNN paper's "100Gb/s EDR" confirms.)
- Loopback (`local`): gloo send/recv between two processes of this machine, one thread each,
  measured 2.4-3.6 GB/s for 16-64 MiB and 85-113 us one way for 4 bytes: 3 GB/s, 100 us.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import TopologyError
from .catalog import LOCAL_CPU, make_device
from .topology import Device, DeviceTopology, Link

NVLINK1_BW = 20e9
NVLINK_LATENCY = 2e-6
NVSWITCH_A100_BW = 300e9
NVSWITCH_H100_BW = 450e9
NVSWITCH_LATENCY = 1e-6
PCIE3_X16_BW = 12e9
PCIE3_X8_BW = 6.3e9
PCIE4_X16_BW = 25e9
PCIE5_X16_BW = 50e9
PCIE_LATENCY = 1e-6
IB_EDR_BW = 100e9 / 8
IB_FDR_BW = 6.8e9
IB_HDR_BW = 200e9 / 8
IB_NDR_BW = 400e9 / 8
IB_LATENCY = 0.6e-6
LOOPBACK_BW = 3e9
LOOPBACK_LATENCY = 100e-6
IB_SWITCH = "ib-switch"

_MAX_NODES = 256
_MAX_LOCAL = 16


@dataclass(frozen=True)
class Fabric:
    """How the devices of one node are connected: `mesh` = a direct link per ordered pair,
    `switch` = every device to a shared `<node>/<kind>` endpoint and back."""

    kind: str
    bandwidth: float
    latency: float = 0.0
    shape: str = "mesh"


@dataclass(frozen=True)
class Network:
    """How nodes are connected: each node has `nics` NICs (device j uses NIC j*nics//count) reached
    over `nic_link`, and every NIC has a duplex link to the one `switch`."""

    kind: str
    bandwidth: float
    latency: float
    nic_link: Fabric
    nics: int = 1
    switch: str = IB_SWITCH


def duplex(a: str, b: str, kind: str, bandwidth: float, latency: float) -> list[Link]:
    """A full-duplex connection: one directed link each way, the reverse right after."""
    return [Link(a, b, kind, bandwidth, latency), Link(b, a, kind, bandwidth, latency)]


def intra_node_links(node: str, names: Sequence[str], fabric: Fabric) -> tuple[list[Link], list[str]]:
    """Links (and new switch endpoints) of one node's fabric."""
    if fabric.shape == "mesh":
        links = []
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                links += duplex(a, b, fabric.kind, fabric.bandwidth, fabric.latency)
        return links, []
    if fabric.shape == "switch":
        hub = f"{node}/{fabric.kind}"
        links = [l for n in names for l in duplex(n, hub, fabric.kind, fabric.bandwidth, fabric.latency)]
        return links, ([hub] if names else [])
    raise TopologyError(f"node {node}: unknown fabric shape {fabric.shape!r}; use 'mesh' or 'switch'")


def nic_names(node: str, nics: int) -> list[str]:
    return [f"{node}/nic"] if nics == 1 else [f"{node}/nic{k}" for k in range(nics)]


def inter_node_links(groups: Sequence[tuple[str, Sequence[str]]], net: Network) -> tuple[list[Link], list[str]]:
    """Links and endpoints (NICs, the switch) joining the nodes of `groups` = [(node, device names)]."""
    if net.nics < 1:
        raise TopologyError(f"network: nics per node must be at least 1, got {net.nics}")
    links: list[Link] = []
    switches: list[str] = []
    for node, names in groups:
        nics = nic_names(node, net.nics)
        switches += nics
        for j, dev in enumerate(names):
            nic = nics[j * net.nics // len(names)]
            links += duplex(dev, nic, net.nic_link.kind, net.nic_link.bandwidth, net.nic_link.latency)
        for nic in nics:
            links += duplex(nic, net.switch, net.kind, net.bandwidth, net.latency)
    return links, switches + [net.switch]


def gpu_cluster(name: str, product: str, nodes: int, per_node: int, intra: Fabric | None,
                net: Network | None, description: str) -> DeviceTopology:
    """`nodes` x `per_node` catalog GPUs named node<i>/gpu<j>, joined by `intra` and `net`."""
    devices: list[Device] = []
    links: list[Link] = []
    switches: list[str] = []
    groups = []
    for i in range(nodes):
        node = f"node{i}"
        names = [f"{node}/gpu{j}" for j in range(per_node)]
        devices += [make_device(i * per_node + j, n, node, product) for j, n in enumerate(names)]
        groups.append((node, names))
        if intra is not None and per_node > 1:
            l, s = intra_node_links(node, names, intra)
            links += l
            switches += s
    if net is not None and nodes > 1:
        l, s = inter_node_links(groups, net)
        links += l
        switches += s
    return DeviceTopology(name=name, devices=tuple(devices), links=tuple(links), switches=tuple(switches),
                          description=description, meta=(("preset", name),))


def _check_count(what: str, n: int, lo: int, hi: int) -> None:
    if not lo <= n <= hi:
        raise TopologyError(f"preset: {what} must be between {lo} and {hi}, got {n}")


def _p100(name: str, nodes: int, per_node: int) -> DeviceTopology:
    _check_count("P100 nodes", nodes, 1, _MAX_NODES)
    # A P100 has 4 NVLinks; beyond 4 GPUs (DGX-1's hybrid cube mesh) a node is no longer all-to-all.
    _check_count("P100 GPUs per node (a fully NVLink-connected P100 node holds at most 4)", per_node, 1, 4)
    return gpu_cluster(
        name, "P100-SXM2-16GB", nodes, per_node,
        Fabric("nvlink", NVLINK1_BW, NVLINK_LATENCY),
        Network("infiniband", IB_EDR_BW, IB_LATENCY, Fabric("pcie", PCIE3_X16_BW, PCIE_LATENCY)),
        f"{nodes} node(s) x {per_node} Tesla P100 SXM2 16GB; one NVLink 1.0 per GPU pair (20 GB/s per "
        "direction); nodes over 100 Gb/s EDR InfiniBand, one switch, GPU->NIC over PCIe 3 x16 "
        "(FlexFlow sec. 8.1, Figure 6a)")


def _k80(name: str, nodes: int, per_node: int) -> DeviceTopology:
    """Figure 6b: the two dies of a K80 board share the board's PCIe switch; the boards of a node
    meet at the host (CPU root complex), which also holds the FDR NIC (PCIe 3 x8)."""
    _check_count("K80 nodes", nodes, 1, _MAX_NODES)
    _check_count("K80 GPUs per node", per_node, 1, 16)
    if per_node > 1 and per_node % 2:
        raise TopologyError(f"preset: K80 GPUs come in pairs (two dies per board); per-node count must be 1 or "
                            f"even, got {per_node}")
    devices: list[Device] = []
    links: list[Link] = []
    switches: list[str] = []
    for i in range(nodes):
        node, host = f"node{i}", f"node{i}/host"
        for j in range(per_node):
            devices.append(make_device(len(devices), f"{node}/gpu{j}", node, "K80"))
        boards = [f"{node}/pcie{b}" for b in range((per_node + 1) // 2)]
        switches += boards + [host] + ([f"{node}/nic"] if nodes > 1 else [])
        for j in range(per_node):
            links += duplex(f"{node}/gpu{j}", boards[j // 2], "pcie", PCIE3_X16_BW, PCIE_LATENCY)
        if per_node > 2 or nodes > 1:
            for b in boards:
                links += duplex(b, host, "pcie", PCIE3_X16_BW, PCIE_LATENCY)
        if nodes > 1:
            links += duplex(host, f"{node}/nic", "pcie", PCIE3_X8_BW, PCIE_LATENCY)
            links += duplex(f"{node}/nic", IB_SWITCH, "infiniband", IB_FDR_BW, IB_LATENCY)
    if nodes > 1:
        switches.append(IB_SWITCH)
    used = {e for l in links for e in (l.src, l.dst)}
    # Endpoints that no link touches (a lone die's host) would only clutter the topology.
    switches = [s for s in switches if s in used]
    return DeviceTopology(
        name=name, devices=tuple(devices), links=tuple(links), switches=tuple(switches),
        description=f"{nodes} node(s) x {per_node} K80 GPU dies; die pairs share a board PCIe switch, boards "
                    "meet at the host; nodes over 56 Gb/s FDR InfiniBand, one switch (FlexFlow sec. 8.1, Figure 6b)",
        meta=(("preset", name),))


def _dgx(name: str, gen: str, nodes: int) -> DeviceTopology:
    _check_count(f"DGX {gen.upper()} nodes", nodes, 1, _MAX_NODES)
    if gen == "a100":
        product, nv, pcie, ib, ib_name = "A100-SXM4-80GB", NVSWITCH_A100_BW, PCIE4_X16_BW, IB_HDR_BW, "200 Gb/s HDR"
    else:
        product, nv, pcie, ib, ib_name = "H100-SXM5-80GB", NVSWITCH_H100_BW, PCIE5_X16_BW, IB_NDR_BW, "400 Gb/s NDR"
    return gpu_cluster(
        name, product, nodes, 8,
        Fabric("nvswitch", nv, NVSWITCH_LATENCY, shape="switch"),
        Network("infiniband", ib, IB_LATENCY, Fabric("pcie", pcie, PCIE_LATENCY), nics=8),
        f"{nodes} DGX {gen.upper()} node(s): 8 {product} on NVSwitch ({nv / 1e9:.0f} GB/s per GPU per direction)"
        + (f"; 8 x {ib_name} InfiniBand NICs per node, GPU j -> NIC j, one non-blocking switch" if nodes > 1 else ""))


def _local(name: str, workers: int) -> DeviceTopology:
    _check_count("local worker processes", workers, 1, _MAX_LOCAL)
    node = "localhost"
    devices = tuple(
        Device(id=r, name=f"{node}/rank{r}", node=node, product=LOCAL_CPU.product, kind=LOCAL_CPU.kind,
               peak_flops=LOCAL_CPU.peak_flops, peak_flops_half=LOCAL_CPU.peak_flops_half,
               mem_bandwidth=LOCAL_CPU.mem_bandwidth, memory=LOCAL_CPU.memory // workers)
        for r in range(workers))
    links, _ = intra_node_links(node, [d.name for d in devices], Fabric("loopback", LOOPBACK_BW, LOOPBACK_LATENCY))
    return DeviceTopology(
        name=name, devices=devices, links=tuple(links),
        description=f"{workers} worker process(es) on this machine, one CPU core each (estimated "
                    f"{LOCAL_CPU.peak_flops / 1e9:.0f} GFLOP/s), gloo over TCP loopback "
                    f"({LOOPBACK_BW / 1e9:.0f} GB/s, {LOOPBACK_LATENCY * 1e6:.0f} us)",
        meta=(("preset", name),))


_FORMS: list[tuple[re.Pattern[str], Callable[[str, re.Match[str]], DeviceTopology]]] = [
    (re.compile(r"p100-(\d+)x(\d+)"), lambda n, m: _p100(n, int(m[1]), int(m[2]))),
    (re.compile(r"k80-(\d+)x(\d+)"), lambda n, m: _k80(n, int(m[1]), int(m[2]))),
    (re.compile(r"dgx-(a100|h100)(?:x(\d+))?"), lambda n, m: _dgx(n, m[1], int(m[2] or 1))),
    (re.compile(r"local(?::(\d+))?"), lambda n, m: _local(n, int(m[1] or 2))),
]

PRESET_FORMS = ("p100-NxM", "k80-NxM", "dgx-a100xN", "dgx-h100xN", "local:N")

_LISTED = ("p100-4x4", "p100-1x4", "k80-16x4", "k80-1x4", "dgx-a100", "dgx-a100x2", "dgx-a100x4",
           "dgx-h100", "dgx-h100x2", "dgx-h100x4", "local")


def list_presets() -> list[str]:
    """Names of the preset topologies (parametric forms in `PRESET_FORMS` accept more)."""
    return list(_LISTED)


def is_preset(name: str) -> bool:
    return any(pat.fullmatch(name.strip().lower()) for pat, _ in _FORMS)


def get_preset(name: str) -> DeviceTopology:
    """The preset topology `name`, e.g. `p100-4x4`, `k80-16x4`, `dgx-h100x2`, `local:4`."""
    key = name.strip().lower()
    for pat, build in _FORMS:
        m = pat.fullmatch(key)
        if m:
            return build(key, m)
    raise TopologyError(f"unknown topology preset {name!r}; presets: {', '.join(_LISTED)}; "
                        f"parametric forms: {', '.join(PRESET_FORMS)}")
