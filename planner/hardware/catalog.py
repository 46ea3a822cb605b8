"""Device catalog: the compute devices autopar plans for, with their datasheet numbers.

The simulator's analytic cost model needs, per device, the peak arithmetic rate, the memory
bandwidth and the memory capacity (FlexFlow sec. 5 estimates task times from such a model when
no measurement exists; OptCNN sec. 4 does the same with t_c).  The numbers below are the vendors'
datasheet peaks for *dense* math (structured-sparsity figures are halved back), one entry per
product the papers or today's clusters use.

Which rate is `peak_flops` (the float32 training rate):
- K80, P100, V100: plain FP32 CUDA-core rate (these GPUs have no tensor-core FP32 path).
- A100, H100, H200: the **TF32 tensor-core** rate, because PyTorch training in float32 runs its
  matmuls and convolutions as TF32 on these GPUs (cuDNN default; `torch.backends.cuda.matmul.
  allow_tf32` for matmuls).  The plain FP32 rate is kept in `fp32_flops` for reference.
`peak_flops_half` is the FP16/BF16 rate (tensor cores on V100 and later; packed half2 on P100;
Kepler has no faster half path, so the K80 entry repeats its FP32 rate).

Memory capacities: datasheets write "GB" but HBM/GDDR capacities are binary, e.g. an
"A100 80GB" reports 81920 MiB; entries therefore use GiB.  Bandwidths are decimal (GB/s = 1e9).
NVLink bandwidth is per GPU, per direction (datasheets quote the bidirectional sum).

The K80 is a board with two GK210 dies that the system sees as two GPUs; the FlexFlow paper
(sec. 8.1, Figure 6b) counts dies (16 nodes x 4 = 64 "K80 GPUs"), and so do we: the `K80` entry
is one die, i.e. half the board's datasheet figures.

`lookup` accepts what Kubernetes nodes advertise in the `nvidia.com/gpu.product` label
("NVIDIA-A100-SXM4-80GB", "Tesla-P100-SXM2-16GB", "NVIDIA-H100-80GB-HBM3") as well as the
catalog's own keys; a name that names a different memory size or form factor than every entry of
its family is an error rather than a silent approximation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import TopologyError
from .topology import Device

_GiB = 1 << 30


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers of one product.  Rates in FLOP/s, bandwidths in bytes/s, memory in bytes."""

    product: str              # catalog key, stored as Device.product
    family: str               # "A100"; what `lookup` matches a label against
    form_factor: str          # "SXM4", "PCIe", "board", "host"
    fp32_flops: float         # dense FP32 on CUDA cores (or SIMD units for a CPU)
    tf32_flops: float         # dense TF32 on tensor cores; 0 when the product has none
    half_flops: float         # dense FP16/BF16; 0 means "no separate rate, use peak_flops"
    mem_bandwidth: float
    memory: int
    source: str
    kind: str = "gpu"
    nvlink_generation: int = 0
    nvlink_links: int = 0
    nvlink_link_bandwidth: float = 0.0  # per link, per direction
    pcie_generation: int = 3

    @property
    def peak_flops(self) -> float:
        """The float32 training rate: TF32 tensor cores when present, else FP32 (see module doc)."""
        return self.tf32_flops or self.fp32_flops

    @property
    def peak_flops_half(self) -> float:
        return self.half_flops

    @property
    def nvlink_bandwidth(self) -> float:
        """NVLink bandwidth of one GPU, per direction, summed over its links."""
        return self.nvlink_links * self.nvlink_link_bandwidth

    @property
    def memory_gb(self) -> int:
        """Capacity as marketed ("80" for an 80GB part), used to match product labels."""
        return round(self.memory / _GiB)


# The API promised to the planner speaks of GPU specs; the CPU entry shares the type.
GpuSpec = DeviceSpec

_NVLINK1 = 20e9   # NVLink 1.0 (P100): 20 GB/s per link per direction
_NVLINK234 = 25e9  # NVLink 2.0/3.0/4.0 (V100/A100/H100): 25 GB/s per link per direction

GPU_CATALOG: dict[str, DeviceSpec] = {s.product: s for s in (
    DeviceSpec(
        product="K80", family="K80", form_factor="board",
        # Board: 8.73 TFLOPS FP32 at boost (2 x 2496 cores x 2 x 875 MHz), 24 GB, 480 GB/s; per die half.
        fp32_flops=4.37e12, tf32_flops=0.0, half_flops=4.37e12,
        mem_bandwidth=240e9, memory=12 * _GiB, pcie_generation=3,
        source="NVIDIA Tesla K80 GPU Accelerator board specification (BD-07317); one GK210 die = half the board"),
    DeviceSpec(
        product="P100-SXM2-16GB", family="P100", form_factor="SXM2",
        fp32_flops=10.6e12, tf32_flops=0.0, half_flops=21.2e12,
        mem_bandwidth=732e9, memory=16 * _GiB,
        nvlink_generation=1, nvlink_links=4, nvlink_link_bandwidth=_NVLINK1, pcie_generation=3,
        source="NVIDIA Tesla P100 datasheet, 'Tesla P100 for NVLink-optimized servers' (SXM2)"),
    DeviceSpec(
        product="V100-SXM2-32GB", family="V100", form_factor="SXM2",
        fp32_flops=15.7e12, tf32_flops=0.0, half_flops=125e12,
        mem_bandwidth=900e9, memory=32 * _GiB,
        nvlink_generation=2, nvlink_links=6, nvlink_link_bandwidth=_NVLINK234, pcie_generation=3,
        source="NVIDIA Tesla V100 datasheet, 'Tesla V100 for NVLink' (SXM2, 32 GB)"),
    DeviceSpec(
        product="V100-SXM2-16GB", family="V100", form_factor="SXM2",
        fp32_flops=15.7e12, tf32_flops=0.0, half_flops=125e12,
        mem_bandwidth=900e9, memory=16 * _GiB,
        nvlink_generation=2, nvlink_links=6, nvlink_link_bandwidth=_NVLINK234, pcie_generation=3,
        source="NVIDIA Tesla V100 datasheet, 'Tesla V100 for NVLink' (SXM2, 16 GB)"),
    DeviceSpec(
        product="A100-SXM4-80GB", family="A100", form_factor="SXM4",
        fp32_flops=19.5e12, tf32_flops=156e12, half_flops=312e12,
        mem_bandwidth=2039e9, memory=80 * _GiB,
        nvlink_generation=3, nvlink_links=12, nvlink_link_bandwidth=_NVLINK234, pcie_generation=4,
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM; TF32/BF16 dense, not the sparsity figures)"),
    DeviceSpec(
        product="A100-SXM4-40GB", family="A100", form_factor="SXM4",
        fp32_flops=19.5e12, tf32_flops=156e12, half_flops=312e12,
        mem_bandwidth=1555e9, memory=40 * _GiB,
        nvlink_generation=3, nvlink_links=12, nvlink_link_bandwidth=_NVLINK234, pcie_generation=4,
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM; TF32/BF16 dense)"),
    DeviceSpec(
        product="H100-SXM5-80GB", family="H100", form_factor="SXM5",
        # Datasheet: TF32 989 TFLOPS and BF16 1,979 TFLOPS *with sparsity*; dense is half.
        fp32_flops=67e12, tf32_flops=494.5e12, half_flops=989.5e12,
        mem_bandwidth=3.35e12, memory=80 * _GiB,
        nvlink_generation=4, nvlink_links=18, nvlink_link_bandwidth=_NVLINK234, pcie_generation=5,
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM; sparsity figures halved to dense)"),
    DeviceSpec(
        product="H200-SXM-141GB", family="H200", form_factor="SXM",
        fp32_flops=67e12, tf32_flops=494.5e12, half_flops=989.5e12,
        mem_bandwidth=4.8e12, memory=141 * _GiB,
        nvlink_generation=4, nvlink_links=18, nvlink_link_bandwidth=_NVLINK234, pcie_generation=5,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM; sparsity figures halved to dense)"),
)}

# One core of this machine running one worker process of the `local` preset.  Fixed numbers, so
# that plans for `local` are deterministic; `autopar profile` measurements override op costs.
#   fp32: single-thread torch sgemm 1024^3 measured 100-113 GFLOP/s on this machine's Xeon
#         (AVX-512, 2 FMA units: 2 x 16 lanes x 2 FLOP x ~2-3 GHz = 128-190 GFLOP/s peak).
#   half: 0 = use the FP32 rate.  Measured fp16 matmul 85 GFLOP/s, bf16 0.7-1.1 TFLOP/s (AMX);
#         one number cannot serve both, and Device.flops_for treats them alike.
#   memory bandwidth: single-thread 64 MiB tensor copy measured 12-16 GB/s (read + write).
#   memory: 16 GiB shared by the workers (the machine has 24 GiB; the rest is for the OS and the
#         launcher); `local:N` gives each worker 1/N of it.
LOCAL_CPU = DeviceSpec(
    product="CPU-core", family="CPU", form_factor="host", kind="cpu",
    fp32_flops=1.0e11, tf32_flops=0.0, half_flops=0.0,
    mem_bandwidth=1.2e10, memory=16 * _GiB, pcie_generation=0,
    source="estimate for one core of the development machine (Intel Xeon, AVX-512): torch sgemm and "
           "copy benchmarks, single thread; see planner/hardware/catalog.py")

CPU_CATALOG: dict[str, DeviceSpec] = {LOCAL_CPU.product: LOCAL_CPU}

_ALL: dict[str, DeviceSpec] = {**GPU_CATALOG, **CPU_CATALOG}
_FAMILY_RE = re.compile(r"^(K80|P100|V100|A100|H100|H200|CPU)$")
_MEMORY_RE = re.compile(r"^(\d+)GB$")
# Vendor words and sharing suffixes that do not change which chip it is.  "SHARED" is what the
# NVIDIA device plugin appends when time-slicing; the chip is the same, the sharing is not modelled.
_NOISE = {"", "NVIDIA", "TESLA", "SHARED", "HBM2", "HBM2E", "HBM3", "HBM3E", "GDDR5", "CORE"}


def _form_of(token: str) -> str | None:
    if token.startswith("SXM"):
        return "SXM"
    if token in ("PCIE", "NVL"):
        return token
    return None


def known_products() -> list[str]:
    """Catalog keys of every product `lookup` knows."""
    return list(_ALL)


def _known() -> str:
    return ", ".join(_ALL)


def lookup(product: str) -> DeviceSpec:
    """The catalog entry of a product name or `nvidia.com/gpu.product` label value.

    Matching ignores case, vendor words and separators; a memory size ("80GB") or form factor
    ("SXM4", "PCIe") in the name must agree with the entry.  Without a memory size the family's
    first entry is used (e.g. "V100" -> V100-SXM2-32GB).
    """
    if not isinstance(product, str) or not product.strip():
        raise TopologyError(f"device product must be a non-empty name; known products: {_known()}")
    for key, spec in _ALL.items():
        if key.lower() == product.strip().lower():
            return spec
    tokens = [t for t in re.split(r"[-_\s]+", product.strip().upper()) if t not in _NOISE]
    if "MIG" in tokens:
        raise TopologyError(
            f"device product {product!r} is a MIG slice; autopar plans whole GPUs. "
            "Disable MIG on the node or describe the slice's numbers explicitly in a topology file")
    families = [t for t in tokens if _FAMILY_RE.match(t)]
    forms = [f for f in map(_form_of, tokens) if f]
    mems = [int(m.group(1)) for m in map(_MEMORY_RE.match, tokens) if m]
    if len(families) != 1:
        raise TopologyError(f"unknown device product {product!r}; known products: {_known()}. "
                            "For another device give peak_flops, mem_bandwidth and memory in a topology file")
    family = families[0]
    candidates = [s for s in _ALL.values() if s.family == family]
    if forms:
        candidates = [s for s in candidates if _form_of(s.form_factor.upper()) == forms[0]]
    if mems:
        candidates = [s for s in candidates if s.memory_gb == mems[0]]
    if not candidates:
        wanted = " ".join(filter(None, [forms[0] if forms else "", f"{mems[0]} GB" if mems else ""]))
        have = ", ".join(s.product for s in _ALL.values() if s.family == family)
        raise TopologyError(
            f"device product {product!r} ({family} {wanted}) is not in the catalog; the {family} entries are "
            f"{have} and they differ in memory or form factor. Known products: {_known()}. "
            "Give the device's peak_flops, mem_bandwidth and memory explicitly in a topology file")
    return candidates[0]


def make_device(id: int, name: str, node: str, product: str) -> Device:
    """A `Device` with the catalog numbers of `product` (any name `lookup` accepts)."""
    spec = lookup(product)
    return Device(id=id, name=name, node=node, product=spec.product, kind=spec.kind,
                  peak_flops=spec.peak_flops, peak_flops_half=spec.peak_flops_half,
                  mem_bandwidth=spec.mem_bandwidth, memory=spec.memory)
