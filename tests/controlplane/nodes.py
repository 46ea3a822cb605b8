"""Simulated GPU nodes for the control plane: Node objects that KWOK keeps Ready, with the labels
a real GPU cluster's nodes carry and allocatable ``nvidia.com/gpu``.

    plane.apply(dgx_h100(4))                       # 4 × DGX H100, one NVLink domain each
    plane.apply(p4d(16, zone="us-east-1a"))        # 16 × AWS p4d.24xlarge
    plane.apply(dgx_h100(2) + l4_pool(2))          # a mixed pool

The labels are those of NVIDIA's GPU Feature Discovery (``nvidia.com/gpu.product``, ``.count``,
``.memory`` in MiB, ``.family``, ``.compute.major``/``.minor``, ``.machine``), of Node Feature
Discovery (``feature.node.kubernetes.io/rdma.available``), ``nvidia.com/gpu.clique`` (only on
multi-node NVLink systems such as GB200 NVL72), the well-known topology labels and the clouds'
(`../shared/notes/kopf-kmock.md` lists where each comes from), plus ``autopar.dev/`` overrides
for what labels cannot tell, such as link bandwidths.
"""

from __future__ import annotations

from typing import Any

KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def gpu_node(name: str, *, product: str, count: int, memory_mib: int, family: str, compute: tuple[int, int],
             machine: str, zone: str = "zone-a", clique: str | None = None, rdma: bool = True,
             cpu: str = "96", memory: str = "1024Gi", taint: bool = True, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """One simulated GPU node."""
    node_labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": zone, "type": "kwok",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": str(compute[0]), "nvidia.com/gpu.compute.minor": str(compute[1]),
        "nvidia.com/gpu.machine": machine,
    }
    if rdma:
        node_labels["feature.node.kubernetes.io/rdma.available"] = "true"
    if clique is not None:
        node_labels["nvidia.com/gpu.clique"] = clique
    node_labels.update(labels or {})
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(count)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": node_labels, "annotations": {**KWOK_ANNOTATION, **(annotations or {})}},
        "spec": {"taints": [GPU_TAINT]} if taint else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources),
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                                "kernelVersion": "fake", "osImage": "fake", "containerRuntimeVersion": "fake",
                                "kubeProxyVersion": "fake", "machineID": name, "systemUUID": name,
                                "bootID": name}},
    }


def dgx_h100(n: int, *, prefix: str = "dgx-h100", zone: str = "zone-a", **kw) -> list[dict[str, Any]]:
    """`n` DGX H100 nodes: 8 × H100 SXM 80 GB, NVLink inside each node, InfiniBand between them."""
    return [gpu_node(f"{prefix}-{i}", product="NVIDIA-H100-80GB-HBM3", count=8, memory_mib=81559, family="hopper",
                     compute=(9, 0), machine="DGXH100", zone=zone, cpu="224", memory="2048Gi", **kw)
            for i in range(n)]


def p4d(n: int, *, prefix: str = "p4d", zone: str = "us-east-1a", labels: dict[str, str] | None = None,
        **kw) -> list[dict[str, Any]]:
    """`n` AWS p4d.24xlarge nodes: 8 × A100 SXM4 40 GB, EFA networking, in one network spine."""
    return [gpu_node(f"{prefix}-{i}", product="NVIDIA-A100-SXM4-40GB", count=8, memory_mib=40960, family="ampere",
                     compute=(8, 0), machine="p4d.24xlarge", zone=zone, cpu="96", memory="1152Gi",
                     labels={"node.kubernetes.io/instance-type": "p4d.24xlarge",
                             "topology.k8s.aws/network-node-layer-1": "nn-spine-0",
                             "topology.k8s.aws/network-node-layer-2": f"nn-block-{i // 8}",
                             "topology.k8s.aws/network-node-layer-3": f"nn-rack-{i // 4}", **(labels or {})}, **kw)
            for i in range(n)]


def gb200_nvl(n: int, *, domain: str = "8a1f3c5e-0000-4000-8000-000000000001", clique: int = 1,
              prefix: str = "gb200", **kw) -> list[dict[str, Any]]:
    """`n` GB200 compute trays of one NVLink domain: 4 GPUs each, sharing ``nvidia.com/gpu.clique``."""
    return [gpu_node(f"{prefix}-{i}", product="NVIDIA-GB200", count=4, memory_mib=189471, family="blackwell",
                     compute=(10, 0), machine="GB200-NVL72", clique=f"{domain}.{clique}", cpu="144",
                     memory="960Gi", **kw)
            for i in range(n)]


def l4_pool(n: int, *, prefix: str = "l4", zone: str = "us-central1-a", labels: dict[str, str] | None = None,
            **kw) -> list[dict[str, Any]]:
    """`n` GKE g2-standard-24 nodes: 2 × L4 24 GB over PCIe, no RDMA; link bandwidth given to
    autopar through an ``autopar.dev/`` override, since no label says it."""
    return [gpu_node(f"{prefix}-{i}", product="NVIDIA-L4", count=2, memory_mib=23034, family="ada-lovelace",
                     compute=(8, 9), machine="g2-standard-24", zone=zone, rdma=False, cpu="24", memory="96Gi",
                     labels={"cloud.google.com/gke-accelerator": "nvidia-l4",
                             "cloud.google.com/gce-topology-block": "block-a",
                             "cloud.google.com/gce-topology-subblock": f"sub-{i // 2}",
                             "cloud.google.com/gce-topology-host": f"host-{i}",
                             "autopar.dev/network-bandwidth": "50Gbps", **(labels or {})}, **kw)
            for i in range(n)]


def cpu_node(name: str, *, zone: str = "zone-a", cpu: str = "32", memory: str = "128Gi",
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One simulated CPU node, untainted: where a real cluster runs the planner pods (they need no GPU)."""
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                   "topology.kubernetes.io/zone": zone, "type": "kwok", **(labels or {})}
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": node_labels, "annotations": dict(KWOK_ANNOTATION)},
            "spec": {},
            "status": {"capacity": dict(resources), "allocatable": dict(resources),
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                                    "kernelVersion": "fake", "osImage": "fake", "containerRuntimeVersion": "fake",
                                    "kubeProxyVersion": "fake", "machineID": name, "systemUUID": name,
                                    "bootID": name}}}
