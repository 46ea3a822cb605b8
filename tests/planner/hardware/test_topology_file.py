"""Topology files: units, validation errors that name the field, generators, round trips, examples."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.errors import TopologyError
from autopar.planner.hardware.presets import get_preset, list_presets
from autopar.planner.hardware.topology import Device, DeviceTopology, Link
from autopar.planner.hardware.topology_file import (dump_topology, load_topology, parse_bandwidth, parse_duration, parse_flops,
                                                    parse_size, parse_topology, resolve_topology, save_topology)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "topologies"
GiB = 1 << 30


# -- units -------------------------------------------------------------------------------------
@pytest.mark.parametrize("parse, text, value", [
    (parse_bandwidth, "100Gb/s", 12.5e9),
    (parse_bandwidth, "56Gbps", 7e9),
    (parse_bandwidth, "12.5GB/s", 12.5e9),
    (parse_bandwidth, "10 GB/s", 1e10),
    (parse_bandwidth, "800MB/s", 8e8),
    (parse_bandwidth, "25GiB/s", 25 * GiB),
    (parse_bandwidth, "3e9", 3e9),
    (parse_bandwidth, 3e9, 3e9),
    (parse_bandwidth, 300, 300.0),
    (parse_duration, "2us", 2e-6),
    (parse_duration, "2µs", 2e-6),
    (parse_duration, "1.5us", 1.5e-6),
    (parse_duration, "0.6us", 0.6e-6),
    (parse_duration, "1.5ms", 1.5e-3),
    (parse_duration, "800ns", 8e-7),
    (parse_duration, "0.5s", 0.5),
    (parse_duration, 3e-6, 3e-6),
    (parse_duration, 0, 0.0),
    (parse_size, "80GiB", 80 * GiB),
    (parse_size, "40GB", 40 * 10**9),
    (parse_size, "16000MiB", 16000 << 20),
    (parse_size, "1.5KiB", 1536),
    (parse_size, 1024, 1024),
    (parse_size, 2**60 + 1, 2**60 + 1),
    (parse_size, "4096", 4096),
    (parse_flops, "19.5TFLOP/s", 19.5e12),
    (parse_flops, "156TFLOPS", 156e12),
    (parse_flops, "100GFLOP/s", 1e11),
    (parse_flops, "2PFLOPS", 2e15),
    (parse_flops, 1e12, 1e12),
])
def test_quantities_parse_with_and_without_units(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("parse, text, words", [
    (parse_bandwidth, "12 parsecs", ["bandwidth", "unknown unit 'parsecs'"]),
    (parse_bandwidth, "GB/s", ["bandwidth", "'GB/s'"]),
    (parse_bandwidth, "12GB", ["unknown unit 'GB'"]),
    (parse_bandwidth, "-5GB/s", ["bandwidth"]),
    (parse_bandwidth, True, ["bandwidth", "True"]),
    (parse_bandwidth, [1], ["bandwidth"]),
    (parse_duration, "2 fortnights", ["duration", "unknown unit"]),
    (parse_duration, "2GB/s", ["duration"]),
    (parse_size, "1.5B", ["whole number of bytes"]),
    (parse_size, "80GiB/s", ["size", "unknown unit"]),
    (parse_flops, "5TB/s", ["compute rate", "unknown unit"]),
    (parse_bandwidth, float("inf"), ["not a finite number"]),
    (parse_duration, float("nan"), ["not a finite number"]),
    (parse_size, "1e300TB", ["too large"]),
])
def test_malformed_quantities_raise_topology_error_naming_the_expectation(parse, text, words):
    with pytest.raises(TopologyError) as e:
        parse(text)
    for w in words:
        assert w in str(e.value)


# -- validation --------------------------------------------------------------------------------
def _doc() -> dict:
    return {
        "apiVersion": "autopar.dev/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": "t"},
        "spec": {
            "nodes": [
                {"name": "node0", "gpus": {"product": "P100-SXM2-16GB", "count": 2}},
                {"name": "node1", "devices": [{"name": "node1/gpu0", "product": "Custom-X", "peakFlops": "10TFLOP/s",
                                               "memBandwidth": "500GB/s", "memory": "16GiB"}]},
            ],
            "switches": ["sw"],
            "links": [
                {"src": "node0/gpu0", "dst": "node0/gpu1", "kind": "nvlink", "bandwidth": "20GB/s", "latency": "2us"},
                {"src": "node0/gpu0", "dst": "sw", "kind": "pcie", "bandwidth": "12GB/s"},
                {"src": "node0/gpu1", "dst": "sw", "kind": "pcie", "bandwidth": "12GB/s"},
                {"src": "node1/gpu0", "dst": "sw", "kind": "ethernet", "bandwidth": "25Gb/s", "latency": "10us"},
            ],
        },
    }


def _set(doc: dict, path: str, value) -> dict:
    """`doc` with the field at dotted `path` (ints index lists) set; value None deletes it."""
    doc = copy.deepcopy(doc)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = doc
    for p in parents:
        target = target[p]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return doc


def test_base_document_is_valid():
    topo = parse_topology(_doc())
    assert topo.num_devices == 3 and topo.devices[2].product == "Custom-X"
    assert topo.devices[2].peak_flops == 10e12 and topo.devices[2].peak_flops_half == 0.0


@pytest.mark.parametrize("path, value, words", [
    ("apiVersion", "autopar.dev/v1", ["apiVersion", "autopar.dev/v1alpha1"]),
    ("kind", "Strategy", ["kind", "'Topology'"]),
    ("metadata.name", "", ["metadata.name"]),
    ("metadata.name", None, ["metadata.name", "Field required"]),
    ("spec", None, ["spec", "Field required"]),
    ("spec.nodes", [], ["spec.nodes"]),
    ("spec.nodes.0.name", "", ["spec.nodes[0].name"]),
    ("spec.nodes.0.devices", [{"name": "x", "product": "K80"}], ["spec.nodes[0]", "exactly one of gpus"]),
    ("spec.nodes.1.devices", [], ["spec.nodes[1].devices"]),
    ("spec.nodes.0.gpus.count", 0, ["spec.nodes[0].gpus.count", "greater than or equal to 1"]),
    ("spec.nodes.0.gpus.product", "Voodoo-5", ["spec.nodes[0].gpus.product", "known products"]),
    ("spec.nodes.1.devices.0.peakFlops", None, ["spec.nodes[1].devices[0]", "Custom-X", "peakFlops must be given"]),
    ("spec.nodes.1.devices.0.peakFlops", 0, ["spec.nodes[1].devices[0].peakFlops", "greater than 0"]),
    ("spec.nodes.1.devices.0.memory", "1.5B", ["spec.nodes[1].devices[0].memory", "whole number of bytes"]),
    ("spec.nodes.1.devices.0.memBandwidth", "fast", ["spec.nodes[1].devices[0].memBandwidth", "bandwidth such as"]),
    ("spec.nodes.1.devices.0.name", "node0/gpu1", ["spec.nodes[1].devices[0].name", "already used by spec.nodes[0]"]),
    ("spec.switches", ["node0/gpu0"], ["spec.switches[0]", "'node0/gpu0'", "already used"]),
    ("spec.links.3.bandwidth", "12 parsecs", ["spec.links[3].bandwidth", "unknown unit 'parsecs'"]),
    ("spec.links.3.bandwidth", -1, ["spec.links[3].bandwidth", "greater than 0"]),
    ("spec.links.0.latency", "-2us", ["spec.links[0].latency", "duration"]),
    ("spec.links.0.latency", -2e-6, ["spec.links[0].latency", "greater than or equal to 0"]),
    ("spec.links.0.kind", "carrier-pigeon", ["spec.links[0].kind", "nvlink"]),
    ("spec.links.0.bidirectional", "sometimes", ["spec.links[0].bidirectional"]),
    ("spec.links.1.dst", "node7/gpu0", ["spec.links[1].dst", "unknown endpoint 'node7/gpu0'", "spec.switches"]),
    ("spec.links.1.src", "sw", ["spec.links[1]", "src and dst are both 'sw'"]),
    ("spec.links.0.bandwith", "20GB/s", ["spec.links[0]", "unknown field 'bandwith'", "bandwidth"]),
    ("spec.fabrics", {}, ["unknown field 'fabrics'", "fabric"]),
    ("spec.fabric", {"interNode": {"bandwidth": "100Gb/s"}}, ["spec.fabric.interNode.nicLink", "Field required"]),
    ("spec.fabric", {"intraNode": {"kind": "nvlink", "bandwidth": "20GB/s", "shape": "ring"}},
     ["spec.fabric.intraNode.shape", "'mesh' or 'switch'"]),
    ("spec.fabric", {"intraNode": {"kind": "nvlink", "bandwidth": "20GB/s"},
                     "interNode": {"bandwidth": "100Gb/s", "switch": "node0/gpu0", "nicLink": {"bandwidth": "12GB/s"}}},
     ["spec.fabric.interNode", "'node0/gpu0' is already used"]),
    ("spec.links.3", None, ["spec:", "no route"]),
])
def test_invalid_document_error_names_the_field(path, value, words):
    with pytest.raises(TopologyError) as e:
        parse_topology(_set(_doc(), path, value), source="cluster.yaml")
    message = str(e.value)
    assert message.startswith("cluster.yaml: ")
    for w in words:
        assert w in message


def test_all_problems_of_a_document_are_reported_together():
    doc = _set(_set(_doc(), "spec.links.0.bandwidth", "x"), "spec.links.2.kind", "smoke-signal")
    with pytest.raises(TopologyError) as e:
        parse_topology(doc)
    assert "spec.links[0].bandwidth" in str(e.value) and "spec.links[2].kind" in str(e.value)


@pytest.mark.parametrize("doc, words", [
    ([1, 2], ["expected a mapping", "list"]),
    (None, ["expected a mapping", "NoneType"]),
])
def test_document_that_is_not_a_mapping_is_rejected(doc, words):
    with pytest.raises(TopologyError) as e:
        parse_topology(doc)
    assert all(w in str(e.value) for w in words)


# -- semantics ---------------------------------------------------------------------------------
def test_explicit_device_fields_override_catalog_and_catalog_fills_the_rest():
    doc = _set(_doc(), "spec.nodes.1.devices.0", {"name": "node1/gpu0", "product": "NVIDIA-A100-SXM4-40GB", "memory": "32GiB"})
    dev = parse_topology(doc).devices[2]
    assert (dev.product, dev.memory, dev.peak_flops, dev.mem_bandwidth) == ("A100-SXM4-40GB", 32 * GiB, 156e12, 1555e9)


def test_unidirectional_link_is_one_direction_only():
    doc = _doc()
    doc["spec"]["links"].append({"src": "node1/gpu0", "dst": "node0/gpu0", "kind": "infiniband",
                                 "bandwidth": "100Gb/s", "bidirectional": False})
    topo = parse_topology(doc)
    assert [topo.links[i].kind for i in topo.route(2, 0)] == ["infiniband"]
    assert [topo.links[i].kind for i in topo.route(0, 2)] == ["pcie", "ethernet"]


def test_explicit_link_replaces_generated_link_between_same_endpoints():
    doc = _set(_doc(), "spec.fabric", {"intraNode": {"kind": "nvlink", "bandwidth": "20GB/s", "latency": "2us"}})
    doc["spec"]["links"][0]["bandwidth"] = "40GB/s"
    topo = parse_topology(doc)
    between = [l for l in topo.links if {l.src, l.dst} == {"node0/gpu0", "node0/gpu1"}]
    assert len(between) == 2 and {l.bandwidth for l in between} == {40e9}


def test_inter_node_fabric_is_only_generated_for_two_or_more_nodes():
    doc = {"apiVersion": "autopar.dev/v1alpha1", "kind": "Topology", "metadata": {"name": "one"},
           "spec": {"nodes": [{"name": "n", "gpus": {"product": "H100-SXM5-80GB", "count": 8}}],
                    "fabric": {"intraNode": {"kind": "nvswitch", "bandwidth": "450GB/s", "latency": "1us"},
                               "interNode": {"bandwidth": "400Gb/s", "nicLink": {"bandwidth": "50GB/s"}}}}}
    topo = parse_topology(doc)
    assert topo.switches == ("n/nvswitch",) and {l.kind for l in topo.links} == {"nvswitch"}


# -- round trips -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_presets() + ["k80-2x1", "local:1", "p100-2x1"])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_saving_then_loading_a_preset_gives_an_equal_topology(name, suffix, tmp_path):
    topo = get_preset(name)
    back = load_topology(save_topology(topo, tmp_path / f"topo{suffix}"))
    assert back == topo and back.fingerprint == topo.fingerprint


def test_dump_uses_units_and_gpu_shorthand():
    doc = dump_topology(get_preset("p100-4x4"))
    assert doc["spec"]["nodes"][0] == {"name": "node0", "gpus": {"product": "P100-SXM2-16GB", "count": 4}}
    first = doc["spec"]["links"][0]
    assert (first["bandwidth"], first["latency"], first["bidirectional"]) == ("20GB/s", "2us", True)
    json.dumps(doc)  # plain data only


_positive = st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(bw=_positive, lat=st.one_of(st.just(0.0), st.floats(min_value=1e-12, max_value=10.0)),
       flops=_positive, mem=st.integers(min_value=1, max_value=1 << 50), product=st.sampled_from(["A100-SXM4-80GB", "Z"]))
def test_round_trip_preserves_arbitrary_numbers_exactly(bw, lat, flops, mem, product):
    devs = (Device(0, "a", "n0", product, peak_flops=flops, mem_bandwidth=bw, memory=mem),
            Device(1, "b", "n1", product, peak_flops=flops, mem_bandwidth=bw, memory=mem))
    topo = DeviceTopology("t", devs, (Link("a", "b", "ethernet", bw, lat), Link("b", "a", "ethernet", bw * 2, lat)))
    assert parse_topology(json.loads(json.dumps(dump_topology(topo)))) == topo


# -- files and resolution ----------------------------------------------------------------------
@pytest.mark.parametrize("name, text, words", [
    ("bad.yaml", "spec: [unclosed\n", ["bad.yaml", "line", "invalid YAML"]),
    ("bad.json", '{"apiVersion": }', ["bad.json", "line 1", "invalid JSON"]),
    ("list.yaml", "- 1\n- 2\n", ["list.yaml", "expected a mapping"]),
])
def test_unreadable_files_raise_topology_error_with_location(name, text, words, tmp_path):
    (tmp_path / name).write_text(text)
    with pytest.raises(TopologyError) as e:
        load_topology(tmp_path / name)
    assert all(w in str(e.value) for w in words)


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(TopologyError, match="cannot read topology file"):
        load_topology(tmp_path / "nope.yaml")


def test_resolve_takes_presets_and_files(tmp_path):
    assert resolve_topology("p100-4x4").num_devices == 16
    assert resolve_topology(" local:3 ").num_devices == 3
    path = save_topology(get_preset("k80-1x4"), tmp_path / "k.yml")
    assert resolve_topology(str(path)) == get_preset("k80-1x4")


@pytest.mark.parametrize("spec, words", [
    ("tpu-v4x8", ["unknown topology 'tpu-v4x8'", "p100-4x4", "local:N", "topology file"]),
    ("missing.yaml", ["cannot read topology file", "missing.yaml"]),
])
def test_resolve_explains_unknown_names(spec, words):
    with pytest.raises(TopologyError) as e:
        resolve_topology(spec)
    assert all(w in str(e.value) for w in words)


# -- examples ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, devices, nodes, links", [
    ("a100-2node.yaml", 16, 2, {"nvswitch", "pcie", "infiniband"}),
    ("v100-2node-ethernet.yaml", 4, 2, {"nvlink", "pcie", "ethernet"}),
    ("l4-workstation.yaml", 2, 1, {"pcie"}),
    ("one-h100.yaml", 1, 1, set()),
])
def test_example_topologies_load_and_round_trip(name, devices, nodes, links, tmp_path):
    topo = load_topology(EXAMPLES / name)
    assert (topo.num_devices, len(topo.nodes), {l.kind for l in topo.links}) == (devices, nodes, links)
    assert load_topology(save_topology(topo, tmp_path / name)) == topo


def test_every_example_topology_is_covered_by_a_test():
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {"a100-2node.yaml", "v100-2node-ethernet.yaml",
                                                          "l4-workstation.yaml", "one-h100.yaml"}


def test_the_one_gpu_example_names_the_product_the_profiler_keys_an_h100_by():
    # `planner.cost.device_kind_of` resolves the driver's name through the catalog the same way
    from autopar.planner.hardware.catalog import lookup
    topo = load_topology(EXAMPLES / "one-h100.yaml")
    assert topo.devices[0].product == lookup("NVIDIA-H100-80GB-HBM3").product == "H100-SXM5-80GB"


def test_a100_example_equals_the_dgx_a100x2_preset():
    assert load_topology(EXAMPLES / "a100-2node.yaml").fingerprint == get_preset("dgx-a100x2").fingerprint


def test_v100_example_routes_between_nodes_over_ethernet():
    topo = load_topology(EXAMPLES / "v100-2node-ethernet.yaml")
    assert [topo.links[i].kind for i in topo.route(0, 3)] == ["pcie", "ethernet", "ethernet", "pcie"]
    assert topo.route_bandwidth(0, 3) == 25e9 / 8
    assert topo.devices[0].memory == 16 * GiB and topo.devices[2].memory == 32 * GiB
