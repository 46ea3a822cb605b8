"""Topology presets: the paper's clusters (FlexFlow sec. 8.1, Figure 6), DGX systems, this machine."""

from __future__ import annotations

import itertools

import pytest

from autopar.planner.errors import TopologyError
from autopar.planner.hardware.catalog import LOCAL_CPU
from autopar.planner.hardware.presets import get_preset, is_preset, list_presets
from autopar.planner.hardware.topology import DeviceTopology

GiB = 1 << 30


def _kinds(topo: DeviceTopology, a: int, b: int) -> list[str]:
    return [topo.links[i].kind for i in topo.route(a, b)]


def _endpoints(topo: DeviceTopology, a: int, b: int) -> list[str]:
    return [topo.links[i].dst for i in topo.route(a, b)]


@pytest.mark.parametrize("name, devices, nodes, product", [
    ("p100-4x4", 16, 4, "P100-SXM2-16GB"),
    ("p100-1x4", 4, 1, "P100-SXM2-16GB"),
    ("p100-2x2", 4, 2, "P100-SXM2-16GB"),
    ("k80-16x4", 64, 16, "K80"),
    ("k80-1x4", 4, 1, "K80"),
    ("k80-2x8", 16, 2, "K80"),
    ("dgx-a100", 8, 1, "A100-SXM4-80GB"),
    ("dgx-a100x2", 16, 2, "A100-SXM4-80GB"),
    ("dgx-a100x4", 32, 4, "A100-SXM4-80GB"),
    ("dgx-h100", 8, 1, "H100-SXM5-80GB"),
    ("dgx-h100x2", 16, 2, "H100-SXM5-80GB"),
    ("dgx-h100x4", 32, 4, "H100-SXM5-80GB"),
    ("local", 2, 1, "CPU-core"),
    ("local:4", 4, 1, "CPU-core"),
    ("local:1", 1, 1, "CPU-core"),
])
def test_preset_has_documented_size(name, devices, nodes, product):
    topo = get_preset(name)
    assert topo.num_devices == devices and len(topo.nodes) == nodes
    assert {d.product for d in topo.devices} == {product}
    assert topo.description


@pytest.mark.parametrize("name", list_presets())
def test_every_listed_preset_routes_every_pair_along_connected_links(name):
    topo = get_preset(name)
    assert is_preset(name) and topo.description
    for a, b in itertools.permutations(range(topo.num_devices), 2):
        hops = [topo.links[i] for i in topo.route(a, b)]
        assert hops[0].src == topo.devices[a].name and hops[-1].dst == topo.devices[b].name
        assert all(x.dst == y.src for x, y in zip(hops, hops[1:]))


@pytest.mark.parametrize("name", list_presets() + ["k80-2x2", "p100-3x2"])
def test_consecutive_ids_share_a_node(name):
    topo = get_preset(name)
    per_node = len(topo.devices) // len(topo.nodes)
    for k, node in enumerate(topo.nodes):
        assert topo.devices_by_node[node] == tuple(range(k * per_node, (k + 1) * per_node))


@pytest.mark.parametrize("name", list_presets())
def test_every_link_has_a_reverse_twin(name):
    topo = get_preset(name)
    pairs = {(l.src, l.dst, l.kind, l.bandwidth, l.latency) for l in topo.links}
    assert all((d, s, k, bw, lat) in pairs for s, d, k, bw, lat in pairs)


def test_p100_intra_node_routes_are_one_nvlink_of_20_gbps():
    topo = get_preset("p100-4x4")
    for node in topo.nodes:
        for a, b in itertools.permutations(topo.devices_by_node[node], 2):
            assert _kinds(topo, a, b) == ["nvlink"]
            assert topo.route_bandwidth(a, b) == 20e9


def test_p100_inter_node_routes_cross_edr_infiniband_through_the_nics():
    topo = get_preset("p100-4x4")
    for a, b in [(0, 4), (3, 15), (9, 2)]:
        na, nb = topo.devices[a].node, topo.devices[b].node
        assert _kinds(topo, a, b) == ["pcie", "infiniband", "infiniband", "pcie"]
        assert _endpoints(topo, a, b)[:3] == [f"{na}/nic", "ib-switch", f"{nb}/nic"]
        assert topo.route_bandwidth(a, b) == 12e9  # PCIe 3 x16 below EDR's 12.5 GB/s


def test_k80_board_pairs_stay_under_their_pcie_switch():
    topo = get_preset("k80-16x4")
    for a in range(0, 64, 2):
        node = topo.devices[a].node
        board = f"{node}/pcie{(a % 4) // 2}"
        for x, y in [(a, a + 1), (a + 1, a)]:
            assert _kinds(topo, x, y) == ["pcie", "pcie"]
            assert _endpoints(topo, x, y)[0] == board


def test_k80_boards_of_a_node_meet_at_the_host_and_nodes_at_fdr():
    topo = get_preset("k80-16x4")
    assert "node0/host" in _endpoints(topo, 1, 2) and len(topo.route(1, 2)) == 4
    assert "infiniband" in _kinds(topo, 0, 63)
    assert topo.route_bandwidth(0, 63) == 6.3e9  # the ConnectX-3's PCIe 3 x8 is the bottleneck
    ib = [topo.links[i] for i in topo.route(0, 63) if topo.links[i].kind == "infiniband"]
    assert all(l.bandwidth == pytest.approx(56e9 * 64 / 66 / 8, rel=0.01) for l in ib)


@pytest.mark.parametrize("name, nvswitch, nic_bw", [("dgx-a100x2", 300e9, 25e9), ("dgx-h100x2", 450e9, 50e9)])
def test_dgx_gpus_meet_at_nvswitch_and_use_their_own_nic(name, nvswitch, nic_bw):
    topo = get_preset(name)
    assert _endpoints(topo, 3, 5) == ["node0/nvswitch", "node0/gpu5"]
    assert topo.route_bandwidth(3, 5) == nvswitch
    for j in range(8):
        assert _endpoints(topo, j, 8 + (j + 3) % 8)[:3] == [f"node0/nic{j}", "ib-switch", f"node1/nic{(j + 3) % 8}"]
    assert topo.route_bandwidth(0, 8) == nic_bw


@pytest.mark.parametrize("name, near, far", [
    ("p100-4x4", (0, 1), (0, 4)),
    ("k80-16x4", (0, 1), (0, 2)),
    ("k80-16x4", (0, 2), (0, 4)),
    ("dgx-a100x2", (0, 7), (0, 8)),
    ("dgx-h100x4", (0, 1), (0, 31)),
])
@pytest.mark.parametrize("nbytes", [4, 64 << 10, 16 << 20, 1 << 30])
def test_transfers_between_close_devices_are_faster(name, near, far, nbytes):
    topo = get_preset(name)
    assert topo.transfer_time(*near, nbytes) < topo.transfer_time(*far, nbytes)


def test_dgx_h100_is_faster_than_dgx_a100_between_nodes():
    a, h = get_preset("dgx-a100x2"), get_preset("dgx-h100x2")
    assert h.transfer_time(0, 8, 1 << 26) < a.transfer_time(0, 8, 1 << 26)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_local_workers_are_cpu_cores_over_loopback_sharing_memory(workers):
    topo = get_preset(f"local:{workers}")
    assert all(d.kind == "cpu" and d.memory == LOCAL_CPU.memory // workers for d in topo.devices)
    assert all(d.peak_flops == LOCAL_CPU.peak_flops for d in topo.devices)
    assert {l.kind for l in topo.links} <= {"loopback"}
    assert len(topo.links) == workers * (workers - 1)


def test_cpu_devices_know_how_many_workers_share_their_host():
    """`Device.host_workers`: a CPU device counts the topology's CPU devices on its node (they share
    its caches and memory bandwidth), in a preset and in a subset of it; a GPU counts itself."""
    assert [d.host_workers for d in get_preset("local:4").devices] == [4] * 4
    assert [d.host_workers for d in get_preset("local:4").subset([1, 3]).devices] == [2, 2]
    assert get_preset("local:1").devices[0].host_workers == 1
    assert {d.host_workers for d in get_preset("dgx-h100x2").devices} == {1}


def test_local_defaults_to_two_workers():
    assert get_preset("local").fingerprint == get_preset("local:2").fingerprint


@pytest.mark.parametrize("a, b", [("dgx-a100", "dgx-a100x1"), ("dgx-h100", "dgx-h100x1"), ("P100-4x4", "p100-4x4")])
def test_aliases_build_the_same_topology(a, b):
    assert get_preset(a).fingerprint == get_preset(b).fingerprint


def test_presets_are_deterministic():
    assert get_preset("k80-16x4") == get_preset("k80-16x4")


def test_single_node_presets_have_no_network():
    for name in ("p100-1x4", "k80-1x4", "dgx-a100", "dgx-h100"):
        assert not {"infiniband", "ethernet"} & {l.kind for l in get_preset(name).links}


@pytest.mark.parametrize("name, words", [
    ("p100-4x5", ["at most 4", "5"]),
    ("p100-0x4", ["P100 nodes", "0"]),
    ("k80-2x3", ["pairs", "3"]),
    ("k80-1x18", ["between 1 and 16", "18"]),
    ("dgx-a100x0", ["DGX A100 nodes"]),
    ("local:0", ["local worker processes"]),
    ("v100-4x4", ["unknown topology preset", "p100-4x4", "k80-NxM"]),
])
def test_bad_preset_names_explain_the_allowed_values(name, words):
    with pytest.raises(TopologyError) as e:
        get_preset(name)
    for w in words:
        assert w in str(e.value)
