"""The device catalog: datasheet numbers, which rate is peak_flops, and product-label lookup."""

from __future__ import annotations

import pytest

from autopar.planner.errors import TopologyError
from autopar.planner.hardware.catalog import CPU_CATALOG, GPU_CATALOG, LOCAL_CPU, lookup, make_device

GiB = 1 << 30


@pytest.mark.parametrize("label, product", [
    ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA-A100-SXM-80GB", "A100-SXM4-80GB"),
    ("NVIDIA-A100-SXM4-80GB-SHARED", "A100-SXM4-80GB"),
    ("Tesla-P100-SXM2-16GB", "P100-SXM2-16GB"),
    ("Tesla-V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("Tesla-V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("V100", "V100-SXM2-32GB"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA-H100-80GB-HBM3", "H100-SXM5-80GB"),
    ("NVIDIA-H200", "H200-SXM-141GB"),
    ("NVIDIA-H200-141GB-HBM3e", "H200-SXM-141GB"),
    ("Tesla-K80", "K80"),
    ("a100-sxm4-80gb", "A100-SXM4-80GB"),
    ("cpu", "CPU-core"),
    ("CPU-core", "CPU-core"),
])
def test_lookup_accepts_node_label_spellings(label, product):
    assert lookup(label).product == product


@pytest.mark.parametrize("label, words", [
    ("NVIDIA-GeForce-RTX-4090", ["unknown device product", "A100-SXM4-80GB", "K80", "peak_flops"]),
    ("NVIDIA-A100-PCIE-40GB", ["not in the catalog", "differ in memory or form factor", "A100-SXM4-40GB"]),
    ("NVIDIA-H100-PCIe", ["not in the catalog", "H100-SXM5-80GB"]),
    ("Tesla-V100-SXM2-24GB", ["24 GB", "V100-SXM2-32GB"]),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", ["MIG slice", "Disable MIG"]),
    ("A100-H100", ["unknown device product"]),
    ("", ["non-empty", "K80"]),
])
def test_lookup_of_unknown_product_names_known_products(label, words):
    with pytest.raises(TopologyError) as e:
        lookup(label)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("product", list(GPU_CATALOG) + list(CPU_CATALOG))
def test_every_entry_looks_up_to_itself_and_has_positive_numbers(product):
    spec = lookup(product)
    assert spec.product == product
    assert spec.peak_flops > 0 and spec.mem_bandwidth > 0 and spec.memory > 0
    assert spec.half_flops >= 0 and spec.source


@pytest.mark.parametrize("product", list(GPU_CATALOG))
def test_gpu_entries_cite_a_vendor_document_and_half_is_not_slower(product):
    spec = GPU_CATALOG[product]
    assert "NVIDIA" in spec.source and ("datasheet" in spec.source or "specification" in spec.source)
    assert spec.peak_flops_half >= spec.peak_flops


@pytest.mark.parametrize("product, peak, rate", [
    ("K80", 4.37e12, "fp32"),
    ("P100-SXM2-16GB", 10.6e12, "fp32"),
    ("V100-SXM2-32GB", 15.7e12, "fp32"),
    ("A100-SXM4-80GB", 156e12, "tf32"),
    ("H100-SXM5-80GB", 494.5e12, "tf32"),
    ("H200-SXM-141GB", 494.5e12, "tf32"),
])
def test_peak_flops_is_tf32_exactly_where_tensor_cores_run_float32(product, peak, rate):
    spec = GPU_CATALOG[product]
    assert spec.peak_flops == peak
    assert spec.peak_flops == (spec.tf32_flops if rate == "tf32" else spec.fp32_flops)
    assert spec.fp32_flops <= spec.peak_flops


@pytest.mark.parametrize("product, gen, per_gpu", [
    ("K80", 0, 0.0),
    ("P100-SXM2-16GB", 1, 80e9),
    ("V100-SXM2-32GB", 2, 150e9),
    ("A100-SXM4-80GB", 3, 300e9),
    ("H100-SXM5-80GB", 4, 450e9),
    ("H200-SXM-141GB", 4, 450e9),
])
def test_nvlink_bandwidth_is_per_gpu_per_direction(product, gen, per_gpu):
    spec = GPU_CATALOG[product]
    assert (spec.nvlink_generation, spec.nvlink_bandwidth) == (gen, per_gpu)


@pytest.mark.parametrize("product, mem_gib, bandwidth", [
    ("K80", 12, 240e9), ("P100-SXM2-16GB", 16, 732e9), ("V100-SXM2-32GB", 32, 900e9),
    ("A100-SXM4-80GB", 80, 2039e9), ("H100-SXM5-80GB", 80, 3.35e12), ("H200-SXM-141GB", 141, 4.8e12),
])
def test_memory_capacity_and_bandwidth_match_datasheets(product, mem_gib, bandwidth):
    spec = GPU_CATALOG[product]
    assert spec.memory == mem_gib * GiB and spec.mem_bandwidth == bandwidth


def test_k80_entry_is_one_die_of_the_board():
    # Board datasheet: 8.73 TFLOPS FP32 (boost), 24 GB, 480 GB/s for two GK210 dies.
    k80 = GPU_CATALOG["K80"]
    assert 2 * k80.fp32_flops == pytest.approx(8.73e12, rel=0.01)
    assert 2 * k80.memory == 24 * GiB and 2 * k80.mem_bandwidth == 480e9


def test_make_device_copies_catalog_numbers_under_the_canonical_product():
    d = make_device(3, "node0/gpu3", "node0", "NVIDIA-A100-SXM4-80GB")
    spec = GPU_CATALOG["A100-SXM4-80GB"]
    assert (d.id, d.name, d.node, d.product, d.kind) == (3, "node0/gpu3", "node0", "A100-SXM4-80GB", "gpu")
    assert (d.peak_flops, d.peak_flops_half, d.mem_bandwidth, d.memory) == (
        spec.peak_flops, spec.peak_flops_half, spec.mem_bandwidth, spec.memory)
    assert d.flops_for("bfloat16") == 312e12 and d.flops_for("float32") == 156e12


def test_local_cpu_has_no_half_rate_so_half_precision_uses_fp32_rate():
    d = make_device(0, "localhost/rank0", "localhost", "cpu")
    assert d.kind == "cpu" and LOCAL_CPU.peak_flops_half == 0
    assert d.flops_for("float16") == d.flops_for("float32") == LOCAL_CPU.peak_flops


def test_make_device_rejects_unknown_product():
    with pytest.raises(TopologyError, match="known products"):
        make_device(0, "n/gpu0", "n", "Voodoo-5-6000")
