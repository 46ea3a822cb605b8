"""Topology discovery: Kubernetes Node objects -> the planner's `DeviceTopology` for one job.

Pure functions over Node objects as the API server returns them (plain dicts: ``metadata.labels``,
``spec.taints``, ``spec.unschedulable``, ``status.allocatable``, ``status.conditions``); no
Kubernetes client and no kopf here, so everything is testable without a cluster.

    info = parse_node(node_dict)                      # NodeInfo: what the labels say
    sel = eligible(nodes, job.spec.devices, free)     # which nodes a job may use, and why not the others
    topo, report = build_topology(sel.chosen, gpus_per_node, name=...)
    report.fingerprint == topo.fingerprint; report.summary()  # JSON-able, for the job's status

`discover` does both steps and raises `DiscoveryError` (a `TopologyError`) with the reasons when
too few nodes qualify.

What the labels mean, and where that comes from
-----------------------------------------------
* NVIDIA GPU Feature Discovery (GFD; NVIDIA k8s-device-plugin docs, "GPU Feature Discovery",
  generated labels): ``nvidia.com/gpu.product`` (e.g. ``NVIDIA-H100-80GB-HBM3``; ``-SHARED`` is
  appended under time-slicing, ``-MIG-...`` names MIG slices), ``nvidia.com/gpu.count``,
  ``nvidia.com/gpu.memory`` (MiB per GPU), and ``nvidia.com/gpu.clique`` =
  ``<cluster uuid>.<clique id>``, set only on multi-node NVLink systems (GB200/GB300 NVL): nodes
  with equal values share one NVLink domain.  Not set on a DGX H100, whose NVLink ends at the node.
* The device plugin advertises ``status.allocatable["nvidia.com/gpu"]`` (the count used when
  ``nvidia.com/gpu.count`` is absent, e.g. on GKE, which does not run GFD by default).
* Node Feature Discovery (kubernetes-sigs/node-feature-discovery, "rdma" feature source):
  ``feature.node.kubernetes.io/rdma.available=true`` when an RDMA device is usable.
* Kubernetes well-known labels (kubernetes.io docs, "Well-Known Labels, Annotations and Taints"):
  ``topology.kubernetes.io/zone``, ``kubernetes.io/hostname``, ``node.kubernetes.io/instance-type``.
* GKE ("About GPUs in GKE"; "Topology Aware Scheduling" for A3/A4): ``cloud.google.com/gke-accelerator``
  names the GPU (``nvidia-tesla-a100`` = A100 40GB, ``nvidia-a100-80gb``, ``nvidia-h100-80gb``,
  ``nvidia-h100-mega-80gb``, ``nvidia-h200-141gb``, ...); ``cloud.google.com/gce-topology-block``,
  ``-subblock`` and ``-host`` place a VM in the data-center network: the more of these values two
  VMs share, the fewer switch hops between them.
* EKS ("Place distributed AI/ML workloads with network topology labels"; EC2 User Guide, "How
  Amazon EC2 instance topology works"): ``topology.k8s.aws/network-node-layer-1..3`` (``-4`` on
  instance types with four layers) are the network nodes above the instance, layer 1 the top (least
  selective) and the highest layer the one the instance connects to: nodes sharing it are closest.
* Overrides under ``autopar.dev/`` for what labels cannot tell (labels, or annotations of the same
  key; a label wins):
  ``autopar.dev/gpu-product`` (a catalog product to plan this node's GPUs as, e.g.
  ``H100-SXM5-80GB``; the fix for a product the catalog does not know),
  ``autopar.dev/network-bandwidth`` (the node's total inter-node bandwidth: ``50Gbps``, ``400Gbps``,
  ``12.5GBps``), ``autopar.dev/network-nics`` (NICs it is spread over), ``autopar.dev/network-latency``
  (per NIC hop: ``2us``), ``autopar.dev/nvlink-bandwidth`` (NVLink bandwidth per GPU per direction:
  ``450GBps``; also the NVLink-domain bandwidth of a clique).

How nodes become a topology (numbers, and where they come from)
----------------------------------------------------------------
The function writes a topology file (the schema of `planner/hardware/topology_file.py`) and parses
it with `parse_topology`, so all validation is the planner's; `DiscoveryReport.document` is that
file (for the job's topology ConfigMap).  Devices are ``<node>/gpu<j>``, nodes ordered by locality
(zone, cloud block path, NVLink clique, name) so consecutive device ids are close, and independent
of the order the nodes were listed in (hence a stable fingerprint).

* GPUs: the catalog entry of the product (`autopar.planner.hardware.lookup`).  An unknown product
  raises `UnknownGpuProductError` naming the node, the label value, the known products and the
  ``autopar.dev/gpu-product`` fix; nothing is guessed.
* Inside a node, from the catalog's NVLink fields: NVLink 3+ (A100, H100, H200 SXM: HGX boards with
  NVSwitch) -> every GPU to ``<node>/nvswitch`` at the GPU's NVLink bandwidth (A100 300 GB/s, H100
  450 GB/s per direction), 1 us per hop -- the presets' DGX numbers (`planner/hardware/presets.py`).
  NVLink 1/2 (P100, V100) -> a mesh of whole links: ``max(1, links // (n-1))`` links of 20/25 GB/s
  per GPU pair, 2 us (the presets' P100 figure).  No NVLink -> ``<node>/pcie`` at the product's
  PCIe generation: Gen3 12, Gen4 25, Gen5 50 GB/s, 1 us (presets' measured-bandwidthTest figures).
* NVLink clique (two or more chosen nodes with the same ``nvidia.com/gpu.clique``): their GPUs
  share one ``nvlink-domain:<clique>`` NVSwitch endpoint (kind nvswitch) at the NVLink bandwidth per
  GPU, 1 us per hop, instead of a per-node switch: multi-node NVLink is one switched domain.
* Between nodes (two or more nodes only): GPU j reaches NIC ``j * nics // gpus`` over PCIe (as
  above); every NIC has a duplex link to the switch of its network position.  The NIC bandwidth:
  ``autopar.dev/network-bandwidth`` (split over the NICs) if set; else the node's instance type in
  `MACHINES` (the providers' published per-instance network bandwidth); else, with RDMA, a DGX-style
  rail per GPU (one NIC per GPU, HDR 200 Gb/s for NVLink-3 A100 nodes, NDR 400 Gb/s for NVLink-4
  H100/H200 nodes: the presets ``dgx-a100xN``/``dgx-h100xN``) or one 100 Gb/s EDR NIC for other
  products; without RDMA one 25 Gb/s Ethernet NIC.  Hop latency: RDMA 0.6 us (InfiniBand, presets),
  Ethernet with a TCP stack 10 us (`examples/topologies/v100-2node-ethernet.yaml`);
  ``autopar.dev/network-latency`` overrides.
* Network positions: a tree of switches ``fabric:zone=<z>/<level>=<v>/...`` built from the zone
  and the cloud path (GKE block, subblock; EKS layer 1..4).  A NIC attaches to the switch of its
  node's full path; each switch has an uplink to its parent, non-blocking (its bandwidth is the sum
  of the NICs below it), with `SWITCH_HOP_LATENCY` per hop (RDMA fabrics 0.3 us, Ethernet 1 us:
  assumptions of the order of a data-center switch's port-to-port latency plus cabling) and
  `CROSS_ZONE_LATENCY` 250 us on a zone's uplink (assumption: clouds describe inter-zone round trips
  as low single-digit milliseconds).  So two nodes in the same subblock (EKS: same lowest layer)
  are two hops apart, in another subblock of the same block four, in another block six: a shared
  block always means lower latency, at equal bandwidth.  The tree starts at the nodes' common prefix
  (one zone, one block: no hops above it).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from autopar.job.spec import DevicesSpec
from autopar.planner.errors import TopologyError
from autopar.planner.hardware import DeviceSpec, DeviceTopology, known_products, lookup, parse_topology

# -- label keys ----------------------------------------------------------------------------------
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_CLIQUE = "nvidia.com/gpu.clique"
GPU_RESOURCE = "nvidia.com/gpu"
ZONE = "topology.kubernetes.io/zone"
ZONE_BETA = "failure-domain.beta.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
INSTANCE_TYPE_BETA = "beta.kubernetes.io/instance-type"
RDMA_AVAILABLE = "feature.node.kubernetes.io/rdma.available"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_BLOCK = "cloud.google.com/gce-topology-block"
GKE_SUBBLOCK = "cloud.google.com/gce-topology-subblock"
GKE_HOST = "cloud.google.com/gce-topology-host"
EKS_LAYERS = tuple(f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3, 4))

GPU_PRODUCT_OVERRIDE = "autopar.dev/gpu-product"
NETWORK_BANDWIDTH = "autopar.dev/network-bandwidth"
NETWORK_NICS = "autopar.dev/network-nics"
NETWORK_LATENCY = "autopar.dev/network-latency"
NVLINK_BANDWIDTH = "autopar.dev/nvlink-bandwidth"
OVERRIDES = (GPU_PRODUCT_OVERRIDE, NETWORK_BANDWIDTH, NETWORK_NICS, NETWORK_LATENCY, NVLINK_BANDWIDTH)

#: The toleration autopar's GPU pods need for the ``nvidia.com/gpu`` taint that GKE (and many GPU
#: node pools) put on GPU nodes; GKE's ExtendedResourceToleration admission controller adds it to
#: pods that request ``nvidia.com/gpu``.  `eligible` counts it as tolerated by default, so the pod
#: builder must add it to the planner's and trainers' pods.
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists"}

# -- numbers (see the module docstring) ---------------------------------------------------------
_GBIT = 1e9 / 8
PCIE_BANDWIDTH = {3: 12e9, 4: 25e9, 5: 50e9}   # bytes/s per direction, x16, as planner/hardware/presets.py
PCIE_LATENCY = 1e-6
NVSWITCH_LATENCY = 1e-6
NVLINK_MESH_LATENCY = 2e-6
RDMA_NIC_LATENCY = 0.6e-6        # InfiniBand per hop (presets IB_LATENCY)
ETHERNET_NIC_LATENCY = 10e-6     # TCP over Ethernet per hop (examples/topologies/v100-2node-ethernet.yaml)
SWITCH_HOP_LATENCY = {"infiniband": 0.3e-6, "ethernet": 1e-6}
CROSS_ZONE_LATENCY = 250e-6
DEFAULT_ETHERNET = 25 * _GBIT    # one 25 GbE NIC
DEFAULT_RDMA = 100 * _GBIT       # one EDR-class NIC
RAIL_RDMA = {3: 200 * _GBIT, 4: 400 * _GBIT}  # per-GPU rail by NVLink generation: HDR (A100), NDR (H100/H200)


@dataclass(frozen=True)
class Machine:
    """A cloud instance type: its GPUs and the network its GPUs' traffic uses."""

    product: str          # catalog product
    gpus: int
    network_gbps: float   # total for GPU traffic, Gb/s
    nics: int             # NICs that bandwidth is spread over
    rdma: bool            # EFA / RoCE / InfiniBand (RDMA-class) rather than TCP
    source: str


#: Instance types whose GPUs and network the providers publish (their instance-type pages; the
#: figures are the published maxima, override with autopar.dev/network-bandwidth where yours differ).
MACHINES: dict[str, Machine] = {
    # AWS EC2 accelerated computing instances (P3, P4, P5 pages).  EFA is RDMA-class (SRD).
    "p3.16xlarge": Machine("V100-SXM2-16GB", 8, 25, 1, False, "AWS P3: 8x V100 16GB, 25 Gbps"),
    "p3dn.24xlarge": Machine("V100-SXM2-32GB", 8, 100, 1, True, "AWS P3dn: 8x V100 32GB, 100 Gbps EFA"),
    "p4d.24xlarge": Machine("A100-SXM4-40GB", 8, 400, 4, True, "AWS P4d: 8x A100 40GB, 400 Gbps EFA (4 x 100)"),
    "p4de.24xlarge": Machine("A100-SXM4-80GB", 8, 400, 4, True, "AWS P4de: 8x A100 80GB, 400 Gbps EFA (4 x 100)"),
    "p5.48xlarge": Machine("H100-SXM5-80GB", 8, 3200, 32, True, "AWS P5: 8x H100 80GB, 3200 Gbps EFAv2 (32 x 100)"),
    "p5e.48xlarge": Machine("H200-SXM-141GB", 8, 3200, 32, True, "AWS P5e: 8x H200, 3200 Gbps EFA"),
    "p5en.48xlarge": Machine("H200-SXM-141GB", 8, 3200, 16, True, "AWS P5en: 8x H200, 3200 Gbps EFAv3 (16 x 200)"),
    # Google Cloud accelerator-optimized machine types (A2, A3 pages).
    "a2-highgpu-1g": Machine("A100-SXM4-40GB", 1, 24, 1, False, "GCP A2: 1x A100 40GB, 24 Gbps"),
    "a2-highgpu-2g": Machine("A100-SXM4-40GB", 2, 32, 1, False, "GCP A2: 2x A100 40GB, 32 Gbps"),
    "a2-highgpu-4g": Machine("A100-SXM4-40GB", 4, 50, 1, False, "GCP A2: 4x A100 40GB, 50 Gbps"),
    "a2-highgpu-8g": Machine("A100-SXM4-40GB", 8, 100, 1, False, "GCP A2: 8x A100 40GB, 100 Gbps"),
    "a2-megagpu-16g": Machine("A100-SXM4-40GB", 16, 100, 1, False, "GCP A2: 16x A100 40GB, 100 Gbps"),
    "a2-ultragpu-1g": Machine("A100-SXM4-80GB", 1, 24, 1, False, "GCP A2 Ultra: 1x A100 80GB, 24 Gbps"),
    "a2-ultragpu-2g": Machine("A100-SXM4-80GB", 2, 32, 1, False, "GCP A2 Ultra: 2x A100 80GB, 32 Gbps"),
    "a2-ultragpu-4g": Machine("A100-SXM4-80GB", 4, 50, 1, False, "GCP A2 Ultra: 4x A100 80GB, 50 Gbps"),
    "a2-ultragpu-8g": Machine("A100-SXM4-80GB", 8, 100, 1, False, "GCP A2 Ultra: 8x A100 80GB, 100 Gbps"),
    "a3-highgpu-8g": Machine("H100-SXM5-80GB", 8, 800, 4, False,
                             "GCP A3 High: 8x H100 80GB, GPUDirect-TCPX over 4 x 200 Gbps NICs"),
    "a3-megagpu-8g": Machine("H100-SXM5-80GB", 8, 1600, 8, False,
                             "GCP A3 Mega: 8x H100 80GB, GPUDirect-TCPXO over 8 x 200 Gbps NICs"),
    "a3-ultragpu-8g": Machine("H200-SXM-141GB", 8, 3200, 8, True,
                              "GCP A3 Ultra: 8x H200, 8 x 400 Gbps RDMA (RoCE) NICs"),
}

#: GKE's ``cloud.google.com/gke-accelerator`` values -> what to look up in the catalog ("About GPUs in
#: GKE").  A value not listed is looked up as is (``nvidia-l4`` and ``nvidia-tesla-t4`` are then
#: reported as unknown).  Google's P100 is the PCIe board, which the catalog does not hold.
GKE_ACCELERATORS = {
    "nvidia-tesla-k80": "K80",
    "nvidia-tesla-p100": "P100-PCIE-16GB",
    "nvidia-tesla-v100": "V100-SXM2-16GB",
    "nvidia-tesla-a100": "A100-SXM4-40GB",
    "nvidia-a100-80gb": "A100-SXM4-80GB",
    "nvidia-h100-80gb": "H100-SXM5-80GB",
    "nvidia-h100-mega-80gb": "H100-SXM5-80GB",
    "nvidia-h200-141gb": "H200-SXM-141GB",
}


class DiscoveryError(TopologyError):
    """The cluster's nodes cannot give a job its devices (too few eligible nodes, bad labels)."""


class UnknownGpuProductError(DiscoveryError):
    """Nodes whose GPU product the device catalog does not know; `unknown` maps node -> label value."""

    def __init__(self, message: str, unknown: Mapping[str, str]):
        super().__init__(message)
        self.unknown = dict(unknown)

    def summary(self) -> dict[str, Any]:
        return {"unknownProducts": dict(self.unknown), "knownProducts": known_products(), "message": str(self)}


# -- parsing nodes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True)
class NodeInfo:
    """What autopar reads from one Node object."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    product_label: str | None = None    # the raw product value used
    product_source: str | None = None   # the label (or instance type) it came from
    gpu_count: int = 0                  # nvidia.com/gpu.count, else allocatable nvidia.com/gpu
    allocatable_gpus: int = 0
    memory_mib: int | None = None
    clique: str | None = None
    zone: str | None = None
    hostname: str | None = None
    instance_type: str | None = None
    rdma: bool = False
    cloud: str | None = None            # "gke" or "eks" when cloud topology labels are present
    cloud_path: tuple[tuple[str, str], ...] = ()  # (level, value), outermost first
    cloud_host: str | None = None
    ready: bool = True
    not_ready: str = ""
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    network_bandwidth: float | None = None  # bytes/s, total per node (override)
    network_nics: int | None = None
    network_latency: float | None = None    # seconds per NIC hop (override)
    nvlink_bandwidth: float | None = None   # bytes/s per GPU per direction (override)
    problems: tuple[str, ...] = ()          # malformed labels (the node is then not eligible)

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    @property
    def machine(self) -> Machine | None:
        return MACHINES.get(self.instance_type or "")

    @property
    def locality(self) -> tuple:
        """Sort key that puts close nodes next to each other: zone, cloud path, clique, name."""
        def opt(v):
            return (0, v) if v else (1, "")
        return (opt(self.zone), tuple(v for _, v in self.cloud_path), opt(self.clique), self.name)


_BW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKMGT]?)(bps|Bps|b/s|B/s|bit/s)\s*$")
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s)\s*$")
_SCALE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_bandwidth_label(value: str) -> float:
    """``50Gbps`` -> 6.25e9 bytes/s; ``12.5GBps`` -> 12.5e9.  ValueError if malformed or zero."""
    m = _BW.match(str(value))
    if not m or float(m[1]) <= 0:
        raise ValueError(f"{value!r} is not a bandwidth; write e.g. 50Gbps, 400Gbps or 12.5GBps")
    v = float(m[1]) * _SCALE[m[2]]
    return v / 8 if m[3] in ("bps", "b/s", "bit/s") else v


def parse_latency_label(value: str) -> float:
    """``2us`` -> 2e-6 seconds."""
    m = _TIME.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a latency; write e.g. 2us, 800ns or 1ms")
    return float(m[1]) * _TIME_SCALE[m[2]]


def _int(v: Any) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


def parse_node(node: Mapping[str, Any] | NodeInfo) -> NodeInfo:
    """A `NodeInfo` from a Node object (a dict as the API returns it); a NodeInfo passes through."""
    if isinstance(node, NodeInfo):
        return node
    if not isinstance(node, Mapping):
        raise TypeError(f"expected a Node object (a mapping), got {type(node).__name__}")
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    name = str(meta.get("name") or "")
    if not name:
        raise DiscoveryError("a Node object without metadata.name")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}

    def override(key: str) -> str | None:
        v = labels.get(key, annotations.get(key))
        return v.strip() if isinstance(v, str) and v.strip() else None

    problems: list[str] = []
    allocatable = _int((status.get("allocatable") or {}).get(GPU_RESOURCE)) or 0
    count = _int(labels.get(GPU_COUNT))
    if GPU_COUNT in labels and count is None:
        problems.append(f"label {GPU_COUNT}={labels[GPU_COUNT]!r} is not a number")
    instance_type = labels.get(INSTANCE_TYPE) or labels.get(INSTANCE_TYPE_BETA)
    machine = MACHINES.get(instance_type or "")
    if count is None:
        count = allocatable or _int((status.get("capacity") or {}).get(GPU_RESOURCE)) or 0

    # The product: an explicit override, GFD, GKE's accelerator label, then a known instance type.
    product, source = None, None
    for key, value in ((GPU_PRODUCT_OVERRIDE, override(GPU_PRODUCT_OVERRIDE)), (GPU_PRODUCT, labels.get(GPU_PRODUCT)),
                       (GKE_ACCELERATOR, labels.get(GKE_ACCELERATOR))):
        if value:
            product, source = value, key
            break
    if product is None and machine is not None:
        product, source = machine.product, f"{INSTANCE_TYPE}={instance_type}"

    cloud, path, host = None, (), None
    if labels.get(GKE_BLOCK):
        cloud = "gke"
        path = tuple((lvl, labels[key]) for lvl, key in (("block", GKE_BLOCK), ("subblock", GKE_SUBBLOCK))
                     if labels.get(key))
        host = labels.get(GKE_HOST)
    elif labels.get(EKS_LAYERS[0]):
        cloud = "eks"
        for i, key in enumerate(EKS_LAYERS, 1):
            if not labels.get(key):
                break
            path += ((f"layer{i}", labels[key]),)

    ready, not_ready = False, "no Ready condition"
    for c in status.get("conditions") or ():
        if c.get("type") == "Ready":
            ready = c.get("status") == "True"
            not_ready = "" if ready else f"Ready={c.get('status')}" + (f" ({c['reason']})" if c.get("reason") else "")
    if not status.get("conditions"):
        ready, not_ready = True, ""  # a node object without conditions (tests, KWOK before its first heartbeat)

    taints = tuple(Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule"))
                   for t in spec.get("taints") or ())

    def quantity(key: str, parse):
        v = override(key)
        if v is None:
            return None
        try:
            return parse(v)
        except ValueError as e:
            problems.append(f"{key}: {e}")
            return None

    nics = None
    if override(NETWORK_NICS) is not None:
        nics = _int(override(NETWORK_NICS))
        if nics is None or nics < 1:
            problems.append(f"{NETWORK_NICS}: {override(NETWORK_NICS)!r} is not a positive number")
            nics = None
    memory = _int(labels.get(GPU_MEMORY))
    return NodeInfo(
        name=name, labels=tuple(sorted(labels.items())), product_label=product, product_source=source,
        gpu_count=count, allocatable_gpus=allocatable, memory_mib=memory,
        clique=labels.get(GPU_CLIQUE) or None, zone=labels.get(ZONE) or labels.get(ZONE_BETA) or None,
        hostname=labels.get(HOSTNAME), instance_type=instance_type,
        rdma=labels.get(RDMA_AVAILABLE, "").lower() == "true", cloud=cloud, cloud_path=path, cloud_host=host,
        ready=ready, not_ready=not_ready, unschedulable=bool(spec.get("unschedulable")), taints=taints,
        network_bandwidth=quantity(NETWORK_BANDWIDTH, parse_bandwidth_label), network_nics=nics,
        network_latency=quantity(NETWORK_LATENCY, parse_latency_label),
        nvlink_bandwidth=quantity(NVLINK_BANDWIDTH, parse_bandwidth_label), problems=tuple(problems))


def _known_list() -> str:
    return ", ".join(known_products())


@functools.lru_cache(maxsize=1024)
def _lookup(query: str) -> tuple[DeviceSpec | None, TopologyError | None]:
    """`lookup`, memoized: every tick of every job resolves every node's product label, and the
    catalog's matching is most of what `eligible` costs over a thousand nodes."""
    try:
        return lookup(query), None
    except TopologyError as e:
        return None, e


def resolve_product(info: NodeInfo) -> tuple[DeviceSpec | None, str]:
    """The catalog entry of a node's GPUs, or None and a message saying what is wrong and what to do."""
    if info.product_label is None:
        return None, (f"node {info.name}: no GPU product label ({GPU_PRODUCT} from NVIDIA GPU Feature Discovery, "
                      f"{GKE_ACCELERATOR}, or a known {INSTANCE_TYPE}); install GPU Feature Discovery or label the "
                      f"node {GPU_PRODUCT_OVERRIDE}=<product>; known products: {_known_list()}")
    value = info.product_label
    query = GKE_ACCELERATORS.get(value, value) if info.product_source == GKE_ACCELERATOR else value
    spec, e = _lookup(query)
    if spec is not None:
        return spec, ""
    if info.product_source == GPU_PRODUCT_OVERRIDE:
        return None, (f"node {info.name}: {GPU_PRODUCT_OVERRIDE}={value!r} is not a product of the device "
                      f"catalog; known products: {_known_list()}")
    why = f" ({e})" if "MIG" in str(e) else ""
    return None, (f"node {info.name}: GPU product {value!r} (label {info.product_source}) is not in autopar's "
                  f"device catalog{why}; known products: {_known_list()}. Label the node "
                  f"{GPU_PRODUCT_OVERRIDE}=<a known product> to plan its GPUs as that product "
                  f"(kubectl label node {info.name} {GPU_PRODUCT_OVERRIDE}=H100-SXM5-80GB), or add the "
                  "product to the catalog")


# -- eligibility ---------------------------------------------------------------------------------
def _toleration(t: Any) -> dict[str, Any]:
    if hasattr(t, "model_dump"):
        t = t.model_dump()
    return {"key": t.get("key") or "", "operator": t.get("operator") or "Equal", "value": t.get("value") or "",
            "effect": t.get("effect") or ""}


def tolerates(tolerations: Iterable[Any], taint: Taint) -> bool:
    """Kubernetes' matching ("Taints and Tolerations"): an empty effect matches every effect; operator
    Exists with an empty key matches every taint, with a key that key's taints; Equal needs key and
    value equal."""
    for t in map(_toleration, tolerations):
        if t["effect"] and t["effect"] != taint.effect:
            continue
        if t["operator"] == "Exists" and (not t["key"] or t["key"] == taint.key):
            return True
        if t["operator"] == "Equal" and t["key"] and t["key"] == taint.key and t["value"] == taint.value:
            return True
    return False


#: nodes a message names at most (eligible ones, and those left out with their reasons)
MESSAGE_NODES = 12


@dataclass(frozen=True)
class Selection:
    """The outcome of `eligible`: the chosen nodes, every eligible one, and why the others are out."""

    chosen: tuple[NodeInfo, ...]        # devices.nodes nodes, closest together; () when too few qualify
    candidates: tuple[NodeInfo, ...]    # every eligible node, in locality order
    excluded: tuple[tuple[str, str], ...]  # (node, reason), by node name
    nodes_wanted: int
    gpus_per_node: int
    group: str = ""                     # what the chosen nodes share ("clique ...", "zone ...")

    @property
    def ok(self) -> bool:
        return len(self.chosen) == self.nodes_wanted

    @property
    def reasons(self) -> dict[str, str]:
        return dict(self.excluded)

    @property
    def message(self) -> str:
        if self.ok:
            where = f" ({self.group})" if self.group else ""
            chosen = ", ".join(i.name for i in self.chosen)
            return f"{self.nodes_wanted} node(s) x {self.gpus_per_node} GPU(s): {chosen}{where}"
        names = [i.name for i in self.candidates]
        shown = ", ".join(names[:MESSAGE_NODES]) + (f", and {len(names) - MESSAGE_NODES} more"
                                                     if len(names) > MESSAGE_NODES else "")
        lines = [f"needs {self.nodes_wanted} node(s) with {self.gpus_per_node} free GPU(s) each; "
                 f"{len(self.candidates)} eligible" + (f" ({shown})" if self.candidates else "")]
        lines += [f"{n}: {r}" for n, r in self.excluded[:MESSAGE_NODES]]
        if len(self.excluded) > MESSAGE_NODES:
            # a status message must stay small (a thousand nodes' reasons are ~250 kB)
            lines.append(f"and {len(self.excluded) - MESSAGE_NODES} more node(s) left out")
        return "; ".join(lines)

    def summary(self) -> dict[str, Any]:
        return {"chosen": [i.name for i in self.chosen], "eligible": [i.name for i in self.candidates],
                "excluded": dict(self.excluded), "group": self.group, "message": self.message}


def _why_not(info: NodeInfo, devices: DevicesSpec, free: int, tolerations: Sequence[Any]) -> list[str]:
    why = list(info.problems)
    labels = dict(info.labels)
    for key, want in sorted(devices.node_selector.items()):
        have = labels.get(key)
        if have != want:
            why.append(f"nodeSelector {key}={want}: " + (f"node has {key}={have}" if have is not None
                                                          else f"node has no label {key}"))
    if not info.ready:
        why.append(f"not Ready ({info.not_ready})")
    if info.unschedulable:
        why.append("unschedulable (cordoned)")
    for t in info.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t):
            why.append(f"taint {t} is not tolerated (add a toleration to spec.devices.tolerations)")
    if info.allocatable_gpus <= 0:
        why.append(f"no allocatable {GPU_RESOURCE}")
    elif free < devices.gpus_per_node:
        why.append(f"{free} free GPU(s) of {info.allocatable_gpus} allocatable, the job needs "
                   f"{devices.gpus_per_node} per node")
    if info.allocatable_gpus > 0:
        spec, msg = resolve_product(info)
        if spec is None:
            why.append(msg.removeprefix(f"node {info.name}: "))
    return why


def _choose(cands: list[NodeInfo], n: int) -> tuple[tuple[NodeInfo, ...], str]:
    """n nodes, from the tightest group that holds n: a clique, then the deepest shared cloud level,
    then a zone, then all (in locality order).  Among groups of one level the smallest that fits
    wins (it leaves larger groups whole for other jobs), ties broken by locality order."""
    if len(cands) < n:
        return (), ""
    depth = max((len(i.cloud_path) for i in cands), default=0)
    levels = [lambda i: ("clique", i.clique) if i.clique else None]
    for d in range(depth, 0, -1):
        levels.append(lambda i, d=d: (i.cloud_path[d - 1][0], i.zone or "", *(v for _, v in i.cloud_path[:d]))
                      if len(i.cloud_path) >= d else None)
    levels.append(lambda i: ("zone", i.zone or ""))
    for key in levels:
        groups: dict[tuple, list[NodeInfo]] = {}
        for i in cands:
            k = key(i)
            if k is not None:
                groups.setdefault(k, []).append(i)
        fits = [(len(g), g[0].locality, k, g) for k, g in groups.items() if len(g) >= n]
        if fits:
            _, _, k, g = min(fits, key=lambda f: (f[0], f[1]))
            what = k[0] if k[0] != "zone" else "zone"
            return tuple(g[:n]), f"same {what} {k[-1]}" if k[-1] else ""
    return tuple(cands[:n]), ""


def eligible(nodes: Iterable[Mapping[str, Any] | NodeInfo], devices: DevicesSpec | Mapping[str, Any],
             free_gpus: Mapping[str, int] | None = None, *,
             extra_tolerations: Sequence[Any] = (GPU_TOLERATION,)) -> Selection:
    """The nodes a job with `devices` (its spec.devices) may run on, and `devices.nodes` of them.

    A node qualifies when it has every label of `devices.node_selector`, is Ready and not cordoned,
    every NoSchedule/NoExecute taint is tolerated by `devices.tolerations` (plus `extra_tolerations`,
    by default the ``nvidia.com/gpu`` toleration GPU pods carry, see `GPU_TOLERATION`), it has at
    least `devices.gpus_per_node` free GPUs (`free_gpus[name]`, computed by the caller from the pods
    bound to it; absent: the allocatable count), its overrides parse, and its GPU product is in the
    catalog.  The others are returned with every reason, for the job's status.
    """
    if not isinstance(devices, DevicesSpec):
        devices = DevicesSpec.model_validate(devices)
    tolerations = [*devices.tolerations, *extra_tolerations]
    infos = sorted((parse_node(n) for n in nodes), key=lambda i: i.locality)
    cands, excluded = [], []
    for info in infos:
        free = info.allocatable_gpus if free_gpus is None else int(free_gpus.get(info.name, info.allocatable_gpus))
        why = _why_not(info, devices, free, tolerations)
        if why:
            excluded.append((info.name, "; ".join(why)))
        else:
            cands.append(info)
    chosen, group = _choose(cands, devices.nodes)
    return Selection(chosen=chosen, candidates=tuple(cands), excluded=tuple(sorted(excluded)),
                     nodes_wanted=devices.nodes, gpus_per_node=devices.gpus_per_node, group=group)


# -- building the topology -----------------------------------------------------------------------
@dataclass(frozen=True)
class NodeNetwork:
    kind: str            # infiniband (RDMA-class) or ethernet
    bandwidth: float     # per NIC, bytes/s
    nics: int
    latency: float       # per NIC hop
    source: str

    def describe(self) -> str:
        return f"{self.nics}x {self.bandwidth / _GBIT:g}Gb/s {self.kind} ({self.source})"


def node_network(info: NodeInfo, spec: DeviceSpec) -> NodeNetwork:
    """The NICs of a node's GPU traffic (see the module docstring for the rules and numbers)."""
    machine = info.machine
    rdma = info.rdma or bool(machine and machine.rdma)
    gpus = max(1, info.gpu_count)
    if machine is not None:
        nics, total, source = machine.nics, machine.network_gbps * _GBIT, machine.source
    elif rdma and spec.nvlink_generation >= 3:
        rail = RAIL_RDMA[min(spec.nvlink_generation, 4)]
        nics, total, source = gpus, gpus * rail, f"RDMA, one {rail / _GBIT:g}Gb/s NIC per GPU (DGX rail)"
    elif rdma:
        nics, total, source = 1, DEFAULT_RDMA, "RDMA, default 100Gb/s"
    else:
        nics, total, source = 1, DEFAULT_ETHERNET, "no RDMA, default 25GbE"
    if info.network_nics is not None:
        nics = info.network_nics
    if info.network_bandwidth is not None:
        total, source = info.network_bandwidth, NETWORK_BANDWIDTH
    nics = max(1, min(nics, gpus))  # more NICs than GPUs add nothing a GPU can use alone
    kind = "infiniband" if rdma else "ethernet"
    latency = info.network_latency if info.network_latency is not None else \
        (RDMA_NIC_LATENCY if rdma else ETHERNET_NIC_LATENCY)
    return NodeNetwork(kind, total / nics, nics, latency, source)


def _nvlink_bandwidth(info: NodeInfo, spec: DeviceSpec) -> float:
    return info.nvlink_bandwidth if info.nvlink_bandwidth is not None else spec.nvlink_bandwidth


def _pcie(spec: DeviceSpec) -> float:
    return PCIE_BANDWIDTH.get(spec.pcie_generation, PCIE_BANDWIDTH[3])


def _link(src: str, dst: str, kind: str, bandwidth: float, latency: float) -> dict[str, Any]:
    return {"src": src, "dst": dst, "kind": kind, "bandwidth": float(bandwidth), "latency": float(latency)}


@dataclass(frozen=True)
class DiscoveryReport:
    """What `build_topology` found and decided; `summary()` is JSON-able for the job's status."""

    fingerprint: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    products: dict[str, str]        # node -> catalog product
    product_labels: dict[str, str]  # node -> the label value it came from
    cliques: dict[str, list[str]]   # NVLink clique -> nodes (only cliques of two or more chosen nodes)
    blocks: dict[str, list[str]]    # network position (zone/block/...) -> nodes
    networks: dict[str, str]        # node -> its NICs, described
    warnings: tuple[str, ...]
    document: dict[str, Any] = field(repr=False)  # the topology file

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for p in self.products.values():
            counts[p] = counts.get(p, 0) + self.gpus_per_node
        return {"fingerprint": self.fingerprint, "nodes": list(self.nodes),
                "gpus": len(self.nodes) * self.gpus_per_node, "gpusPerNode": self.gpus_per_node, "products": counts,
                "productLabels": dict(sorted(set((v, self.products[k]) for k, v in self.product_labels.items()))),
                "unknownProducts": {}, "cliques": self.cliques, "blocks": self.blocks, "network": self.networks,
                "warnings": list(self.warnings)}


def _position(info: NodeInfo) -> tuple[tuple[str, str], ...]:
    return (("zone", info.zone or "unknown"),) + info.cloud_path


def _switch(prefix: tuple[tuple[str, str], ...]) -> str:
    return "fabric:" + ("/".join(f"{k}={v}" for k, v in prefix) or "root")


def build_topology(nodes: Iterable[Mapping[str, Any] | NodeInfo], gpus_per_node: int, name: str = "discovered",
                   description: str | None = None) -> tuple[DeviceTopology, DiscoveryReport]:
    """The `DeviceTopology` of `gpus_per_node` GPUs on each of `nodes`, and a report.

    Raises `UnknownGpuProductError` when a node's product is not in the catalog, `DiscoveryError`
    for too few GPUs or duplicate nodes; any inconsistency the planner finds is its `TopologyError`.
    """
    infos = sorted((parse_node(n) for n in nodes), key=lambda i: i.locality)
    if not infos:
        raise DiscoveryError("no nodes to build a topology from")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise DiscoveryError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    names = [i.name for i in infos]
    if len(set(names)) != len(names):
        raise DiscoveryError(f"nodes listed twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    bad = [p for i in infos for p in (f"node {i.name}: {q}" for q in i.problems)]
    if bad:
        raise DiscoveryError("malformed autopar.dev/ labels: " + "; ".join(bad))
    specs: dict[str, DeviceSpec] = {}
    unknown: dict[str, str] = {}
    messages = []
    for i in infos:
        spec, msg = resolve_product(i)
        if spec is None:
            unknown[i.name] = i.product_label or ""
            messages.append(msg)
        else:
            specs[i.name] = spec
    if unknown:
        raise UnknownGpuProductError("unknown GPU products: " + " | ".join(messages), unknown)
    short = [f"{i.name} has {i.gpu_count}" for i in infos if i.gpu_count < gpus_per_node]
    if short:
        raise DiscoveryError(f"{gpus_per_node} GPU(s) per node wanted, but {', '.join(short)}")

    warnings = []
    for i in infos:
        s = specs[i.name]
        if i.memory_mib and abs(i.memory_mib * 2**20 - s.memory) > 0.1 * s.memory:
            warnings.append(f"node {i.name}: {GPU_MEMORY}={i.memory_mib} MiB but {s.product} has "
                            f"{s.memory >> 20} MiB; check {GPU_PRODUCT_OVERRIDE}")

    cliques: dict[str, list[str]] = {}
    for i in infos:
        if i.clique:
            cliques.setdefault(i.clique, []).append(i.name)
    cliques = {c: ns for c, ns in cliques.items() if len(ns) > 1}

    doc_nodes, switches, links = [], [], []
    for i in infos:
        s = specs[i.name]
        gpus = [f"{i.name}/gpu{j}" for j in range(gpus_per_node)]
        doc_nodes.append({"name": i.name, "gpus": {"product": s.product, "count": gpus_per_node}})
        nvlink = _nvlink_bandwidth(i, s)
        if i.clique in cliques:
            hub = f"nvlink-domain:{i.clique}"
            if hub not in switches:
                switches.append(hub)
            links += [_link(g, hub, "nvswitch", nvlink or _pcie(s), NVSWITCH_LATENCY) for g in gpus]
        elif gpus_per_node > 1:
            if nvlink and (s.nvlink_generation >= 3 or i.nvlink_bandwidth is not None or not s.nvlink_links):
                hub = f"{i.name}/nvswitch"
                switches.append(hub)
                links += [_link(g, hub, "nvswitch", nvlink, NVSWITCH_LATENCY) for g in gpus]
            elif nvlink:
                per_pair = s.nvlink_link_bandwidth * max(1, s.nvlink_links // (gpus_per_node - 1))
                links += [_link(a, b, "nvlink", per_pair, NVLINK_MESH_LATENCY)
                          for k, a in enumerate(gpus) for b in gpus[k + 1:]]
            else:
                hub = f"{i.name}/pcie"
                switches.append(hub)
                links += [_link(g, hub, "pcie", _pcie(s), PCIE_LATENCY) for g in gpus]

    networks: dict[str, str] = {}
    blocks: dict[str, list[str]] = {}
    if len(infos) > 1:
        positions = {i.name: _position(i) for i in infos}
        common = min(len(p) for p in positions.values())
        first = next(iter(positions.values()))
        root = next((k for k in range(common) if any(p[k] != first[k] for p in positions.values())), common)
        below: dict[tuple, list[NodeNetwork]] = {}   # switch prefix -> the NICs under it
        for i in infos:
            s = specs[i.name]
            net = node_network(i, s)
            networks[i.name] = net.describe()
            pos = positions[i.name]
            blocks.setdefault("/".join(v for _, v in pos), []).append(i.name)
            used = sorted({j * net.nics // gpus_per_node for j in range(gpus_per_node)})
            nic_names = {k: (f"{i.name}/nic" if net.nics == 1 else f"{i.name}/nic{k}") for k in used}
            switches += [nic_names[k] for k in used]
            links += [_link(f"{i.name}/gpu{j}", nic_names[j * net.nics // gpus_per_node], "pcie", _pcie(s),
                            PCIE_LATENCY) for j in range(gpus_per_node)]
            leaf = _switch(pos)
            links += [_link(nic_names[k], leaf, net.kind, net.bandwidth, net.latency) for k in used]
            for d in range(root, len(pos) + 1):
                below.setdefault(pos[:d], []).extend([net] * len(used))
        for prefix in sorted(below, key=lambda p: (len(p), p)):
            switches.append(_switch(prefix))
        for prefix in sorted(below, key=lambda p: (len(p), p)):
            if len(prefix) <= root:
                continue
            nets = below[prefix]
            kind = "infiniband" if all(n.kind == "infiniband" for n in nets) else "ethernet"
            latency = CROSS_ZONE_LATENCY if prefix[-1][0] == "zone" else SWITCH_HOP_LATENCY[kind]
            links.append(_link(_switch(prefix), _switch(prefix[:-1]), kind, sum(n.bandwidth for n in nets), latency))

    products = {i.name: specs[i.name].product for i in infos}
    desc = description or (f"discovered from {len(infos)} Kubernetes node(s): "
                           + ", ".join(f"{i.name} ({products[i.name]})" for i in infos))
    doc = {"apiVersion": "autopar.dev/v1alpha1", "kind": "Topology",
           "metadata": {"name": name, "description": desc[:1000],
                        "annotations": {"autopar.dev/discovered-from": ",".join(i.name for i in infos)[:4000]}},
           "spec": {"nodes": doc_nodes, "switches": switches, "links": links}}
    topo = parse_topology(doc, source=f"topology discovered from node labels ({name})")
    report = DiscoveryReport(
        fingerprint=topo.fingerprint, nodes=tuple(i.name for i in infos), gpus_per_node=gpus_per_node,
        products=products, product_labels={i.name: i.product_label or "" for i in infos}, cliques=cliques,
        blocks=blocks, networks=networks, warnings=tuple(warnings), document=doc)
    return topo, report


def fingerprint(nodes: Iterable[Mapping[str, Any] | NodeInfo], gpus_per_node: int) -> str:
    """The fingerprint of the topology `build_topology` makes of `nodes` (independent of their order)."""
    return build_topology(nodes, gpus_per_node)[0].fingerprint


@dataclass(frozen=True)
class Discovery:
    selection: Selection
    topology: DeviceTopology
    report: DiscoveryReport


def discover(nodes: Iterable[Mapping[str, Any] | NodeInfo], devices: DevicesSpec | Mapping[str, Any],
             free_gpus: Mapping[str, int] | None = None, name: str = "discovered") -> Discovery:
    """`eligible` then `build_topology` of the chosen nodes; `DiscoveryError` with every reason when
    too few nodes qualify."""
    if not isinstance(devices, DevicesSpec):
        devices = DevicesSpec.model_validate(devices)
    sel = eligible(nodes, devices, free_gpus)
    if not sel.ok:
        raise DiscoveryError(sel.message)
    topo, report = build_topology(sel.chosen, devices.gpus_per_node, name=name)
    return Discovery(sel, topo, report)
