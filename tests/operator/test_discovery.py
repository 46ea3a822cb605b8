"""Topology discovery from node labels: products, counts, closeness, filtering, fingerprints, planning."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from autopar.job.spec import DevicesSpec
from autopar.operator import discovery as d
from autopar.planner.errors import TopologyError
from autopar.planner.hardware import known_products

DATA = Path(__file__).parent / "data" / "nodes.yaml"
NODES = {n["metadata"]["name"]: n for n in yaml.safe_load_all(DATA.read_text())}
A3 = ["gke-a3-pool-0", "gke-a3-pool-1", "gke-a3-pool-2", "gke-a3-pool-3"]
P4D = ["ip-10-0-1-11.ec2.internal", "ip-10-0-1-12.ec2.internal", "ip-10-0-1-13.ec2.internal"]
P5 = ["ip-10-0-2-21.ec2.internal", "ip-10-0-2-22.ec2.internal"]
GB200 = ["gb200-0", "gb200-1", "gb200-2"]


def nodes(*names, **changes):
    """Deep copies of fixture nodes; `changes` = {node name: {label: value or None}} (label edits)."""
    out = []
    for n in names:
        node = copy.deepcopy(NODES[n])
        for k, v in changes.get(n.replace("-", "_").replace(".", "_"), {}).items():
            if v is None:
                node["metadata"]["labels"].pop(k, None)
            else:
                node["metadata"]["labels"][k] = v
        out.append(node)
    return out


def first_gpu(topo, node):
    return topo.devices_by_node[node][0]


# -- products and counts ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,product,count,source", [
    ("dgx-h100-a", "H100-SXM5-80GB", 8, d.GPU_PRODUCT),
    ("gke-a3-pool-0", "H100-SXM5-80GB", 8, d.GKE_ACCELERATOR),
    ("gke-a2-1g-0", "A100-SXM4-40GB", 1, d.GKE_ACCELERATOR),
    ("gke-a2-8g-0", "A100-SXM4-40GB", 8, d.GKE_ACCELERATOR),
    (P4D[0], "A100-SXM4-40GB", 8, d.GPU_PRODUCT),
    (P5[0], "H100-SXM5-80GB", 8, d.GPU_PRODUCT),
    ("v100-node", "V100-SXM2-16GB", 4, d.GPU_PRODUCT),
])
def test_products_and_counts_of_real_label_sets(name, product, count, source):
    info = d.parse_node(NODES[name])
    spec, msg = d.resolve_product(info)
    assert spec is not None and spec.product == product, msg
    assert info.gpu_count == count and info.allocatable_gpus == count and info.product_source == source


def test_node_fields():
    a3 = d.parse_node(NODES["gke-a3-pool-0"])
    assert a3.zone == "us-central1-a" and a3.cloud == "gke" and a3.cloud_host == "0a1b2c3d4e5f6071"
    assert a3.cloud_path == (("block", "3f5a7c9e1b2d4f6a"), ("subblock", "8c1e2f3a4b5d6e7f"))
    assert a3.taints == (d.Taint("nvidia.com/gpu", "present", "NoSchedule"),) and a3.ready and not a3.unschedulable
    assert a3.machine is d.MACHINES["a3-highgpu-8g"]
    dgx = d.parse_node(NODES["dgx-h100-a"])
    assert dgx.rdma and dgx.memory_mib == 81559 and dgx.clique is None and dgx.cloud is None
    p4d = d.parse_node(NODES[P4D[0]])
    assert p4d.cloud == "eks" and [lvl for lvl, _ in p4d.cloud_path] == ["layer1", "layer2", "layer3"]
    gb = d.parse_node(NODES["gb200-0"])
    assert gb.clique == "3c9b8f2e-1d4a-4e6b-9f0c-2a7d5e8b1c34.32766" and gb.gpu_count == 4


def test_count_falls_back_to_allocatable_and_overrides_parse():
    node = nodes("dgx-h100-a", dgx_h100_a={d.GPU_COUNT: None, d.NETWORK_BANDWIDTH: "50Gbps",
                                           d.NVLINK_BANDWIDTH: "900GBps", d.NETWORK_LATENCY: "2us"})[0]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "6"
    info = d.parse_node(node)
    assert info.gpu_count == 6 and info.allocatable_gpus == 6
    assert info.network_bandwidth == 50e9 / 8 and info.nvlink_bandwidth == 900e9 and info.network_latency == 2e-6
    assert not info.problems


def test_a_malformed_override_is_a_reason_not_a_crash():
    bad = nodes("dgx-h100-a", dgx_h100_a={d.NETWORK_BANDWIDTH: "fast"})
    sel = d.eligible(bad + nodes("dgx-h100-b"), {"nodes": 1, "gpusPerNode": 8})
    assert "network-bandwidth" in sel.reasons["dgx-h100-a"] and "50Gbps" in sel.reasons["dgx-h100-a"]
    with pytest.raises(d.DiscoveryError, match="network-bandwidth"):
        d.build_topology(bad, 8)


# -- unknown products ------------------------------------------------------------------------------
def test_an_unknown_product_is_reported_never_guessed():
    with pytest.raises(d.UnknownGpuProductError) as e:
        d.build_topology(nodes("gb200-0", "dgx-h100-a"), 4)
    msg = str(e.value)
    assert "'NVIDIA-GB200'" in msg and "gb200-0" in msg and d.GPU_PRODUCT_OVERRIDE in msg
    assert all(p in msg for p in known_products())
    assert e.value.unknown == {"gb200-0": "NVIDIA-GB200"} and isinstance(e.value, TopologyError)
    assert json.dumps(e.value.summary())
    with pytest.raises(d.UnknownGpuProductError, match="NVIDIA-L4"):
        d.build_topology(nodes("l4-node"), 2)


def test_unknown_products_are_left_out_with_the_fix_as_the_reason():
    sel = d.eligible(nodes("l4-node", "v100-node"), {"nodes": 1, "gpusPerNode": 2})
    assert [i.name for i in sel.chosen] == ["v100-node"]
    assert "'NVIDIA-L4'" in sel.reasons["l4-node"] and d.GPU_PRODUCT_OVERRIDE in sel.reasons["l4-node"]


def test_gke_p100_is_the_pcie_board_and_not_silently_the_sxm2_entry():
    node = nodes("gke-a2-8g-0")[0]
    node["metadata"]["labels"] = {d.GKE_ACCELERATOR: "nvidia-tesla-p100"}
    spec, msg = d.resolve_product(d.parse_node(node))
    assert spec is None and "nvidia-tesla-p100" in msg


def test_an_override_names_the_catalog_product_and_a_bad_override_is_reported():
    ok = nodes("gb200-0", gb200_0={d.GPU_PRODUCT_OVERRIDE: "H200-SXM-141GB"})
    topo, report = d.build_topology(ok, 4)
    assert {dev.product for dev in topo.devices} == {"H200-SXM-141GB"}
    assert report.product_labels == {"gb200-0": "H200-SXM-141GB"}
    bad = nodes("gb200-0", gb200_0={d.GPU_PRODUCT_OVERRIDE: "B200"})
    with pytest.raises(d.UnknownGpuProductError, match="autopar.dev/gpu-product='B200' is not a product"):
        d.build_topology(bad, 4)


# -- links -----------------------------------------------------------------------------------------
def test_dgx_h100_pair_nvswitch_inside_ndr_rails_between():
    topo, report = d.build_topology(nodes("dgx-h100-b", "dgx-h100-a"), 8)
    assert topo.nodes == ("dgx-h100-a", "dgx-h100-b") and topo.num_devices == 16
    a0, a1 = topo.devices_by_node["dgx-h100-a"][:2]
    b0 = first_gpu(topo, "dgx-h100-b")
    assert {topo.links[i].kind for i in topo.route(a0, a1)} == {"nvswitch"}
    assert topo.route_bandwidth(a0, a1) == 450e9
    assert "infiniband" in {topo.links[i].kind for i in topo.route(a0, b0)}
    assert topo.route_bandwidth(a0, b0) == 400e9 / 8  # NDR per GPU rail
    assert report.networks["dgx-h100-a"].startswith("8x 400Gb/s infiniband")


def test_pcie_and_nvlink_mesh_products():
    topo, _ = d.build_topology(nodes("v100-node"), 4)
    kinds = {l.kind for l in topo.links}
    assert kinds == {"nvlink"} and topo.route_bandwidth(0, 3) == 50e9  # 6 links // 3 peers x 25 GB/s


def test_nodes_sharing_a_block_are_closer_gke():
    topo, report = d.build_topology(nodes(*A3), 8)
    a = first_gpu(topo, "gke-a3-pool-0")
    same_sub, same_block, other_block = (first_gpu(topo, n) for n in A3[1:])
    lat = [topo.route_latency(a, x) for x in (same_sub, same_block, other_block)]
    assert lat[0] < lat[1] < lat[2]
    nbytes = 64 << 20
    assert topo.transfer_time(a, same_sub, nbytes) < topo.transfer_time(a, other_block, nbytes)
    assert all(topo.route_bandwidth(a, x) >= topo.route_bandwidth(a, other_block)
               for x in (same_sub, same_block))
    assert report.blocks["us-central1-a/3f5a7c9e1b2d4f6a/8c1e2f3a4b5d6e7f"] == ["gke-a3-pool-0", "gke-a3-pool-1"]


def test_nodes_sharing_layer3_are_closer_eks():
    topo, report = d.build_topology(nodes(*P4D), 8)
    a, b, c = (first_gpu(topo, n) for n in P4D)
    assert topo.route_latency(a, b) < topo.route_latency(a, c)
    assert topo.route_bandwidth(a, b) == 100e9 / 8  # 400 Gbps EFA over 4 NICs
    assert "EFA" in report.networks[P4D[0]]


def test_cross_zone_is_farther_than_anything_in_a_zone():
    topo, _ = d.build_topology(nodes(P4D[0], P4D[2], P5[0]), 8)
    a, c, p5 = (first_gpu(topo, n) for n in (P4D[0], P4D[2], P5[0]))
    assert topo.route_latency(a, p5) > 100 * topo.route_latency(a, c)


def test_an_nvlink_clique_spans_nodes():
    gb = nodes(*GB200, **{n.replace("-", "_"): {d.GPU_PRODUCT_OVERRIDE: "H200-SXM-141GB", d.NVLINK_BANDWIDTH: "900GBps"}
                          for n in GB200})
    topo, report = d.build_topology(gb, 4)
    g0, g1, g2 = (first_gpu(topo, n) for n in GB200)
    assert {topo.links[i].kind for i in topo.route(g0, g1)} == {"nvswitch"}
    assert topo.route_bandwidth(g0, g1) == 900e9
    assert "infiniband" in {topo.links[i].kind for i in topo.route(g0, g2)}
    assert topo.route_bandwidth(g0, g2) < topo.route_bandwidth(g0, g1)
    assert list(report.cliques.values()) == [["gb200-0", "gb200-1"]]


def test_network_bandwidth_override_and_ethernet_default():
    plain = [{"metadata": {"name": f"n{i}", "labels": {d.GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}},
              "status": {"allocatable": {"nvidia.com/gpu": "2"}}} for i in range(2)]
    topo, report = d.build_topology(plain, 2)
    assert topo.route_bandwidth(0, 2) == 25e9 / 8 and "ethernet" in {l.kind for l in topo.links}
    plain[1]["metadata"]["labels"][d.NETWORK_BANDWIDTH] = "10Gbps"
    topo2, _ = d.build_topology(plain, 2)
    assert topo2.route_bandwidth(0, 2) == 10e9 / 8


# -- eligibility -----------------------------------------------------------------------------------
def test_selector_taints_tolerations_and_free_gpus_with_reasons():
    pool = nodes(*A3, "dgx-h100-a", "dgx-h100-b")
    pool[0]["spec"]["unschedulable"] = True
    pool[1]["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    pool[4]["spec"] = {"taints": [{"key": "dedicated", "value": "research", "effect": "NoSchedule"}]}
    spec = DevicesSpec(nodes=2, gpus_per_node=4, node_selector={"cloud.google.com/gke-nodepool": "a3-pool"})
    sel = d.eligible(pool, spec, free_gpus={"gke-a3-pool-2": 2})
    r = sel.reasons
    assert "unschedulable" in r["gke-a3-pool-0"]
    assert "not Ready (Ready=False (KubeletNotReady))" in r["gke-a3-pool-1"]
    assert "2 free GPU(s) of 8 allocatable" in r["gke-a3-pool-2"]
    assert "nodeSelector cloud.google.com/gke-nodepool=a3-pool: node has no label" in r["dgx-h100-a"]
    assert "taint dedicated=research:NoSchedule is not tolerated" in r["dgx-h100-a"]
    assert not sel.ok and [i.name for i in sel.candidates] == ["gke-a3-pool-3"] and sel.chosen == ()
    assert "needs 2 node(s)" in sel.message and json.dumps(sel.summary())

    tolerant = DevicesSpec(nodes=1, gpus_per_node=8, tolerations=[{"key": "dedicated", "operator": "Exists"}])
    sel2 = d.eligible(pool[4:], tolerant)
    assert [i.name for i in sel2.chosen] == ["dgx-h100-a"]
    # Without the implicit nvidia.com/gpu toleration GKE's GPU taint keeps the job off.
    sel3 = d.eligible(nodes("gke-a3-pool-3"), {"nodes": 1, "gpusPerNode": 8}, extra_tolerations=())
    assert "taint nvidia.com/gpu=present:NoSchedule is not tolerated" in sel3.reasons["gke-a3-pool-3"]


@pytest.mark.parametrize("effect,ok", [("NoSchedule", False), ("NoExecute", False), ("PreferNoSchedule", True)])
def test_taint_effects(effect, ok):
    node = nodes("dgx-h100-a")[0]
    node["spec"] = {"taints": [{"key": "k", "value": "v", "effect": effect}]}
    assert d.eligible([node], {"nodes": 1, "gpusPerNode": 1}).ok is ok
    assert d.eligible([node], {"nodes": 1, "gpusPerNode": 1, "tolerations": [
        {"key": "k", "operator": "Equal", "value": "v", "effect": effect}]}).ok


def test_tolerations_match_as_kubernetes_does():
    t = d.Taint("k", "v", "NoSchedule")
    assert d.tolerates([{"operator": "Exists"}], t)
    assert d.tolerates([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}], t)
    assert not d.tolerates([{"key": "k", "operator": "Exists", "effect": "NoExecute"}], t)
    assert not d.tolerates([{"key": "k", "value": "w"}], t)
    assert d.tolerates([{"key": "k", "value": "v"}], t)


def test_choice_prefers_the_tightest_group_and_is_order_independent():
    pool = nodes(*A3)
    sel = d.eligible(pool, {"nodes": 2, "gpusPerNode": 8})
    assert [i.name for i in sel.chosen] == ["gke-a3-pool-0", "gke-a3-pool-1"] and "subblock" in sel.group
    sel3 = d.eligible(list(reversed(pool)), {"nodes": 3, "gpusPerNode": 8})
    assert [i.name for i in sel3.chosen] == ["gke-a3-pool-0", "gke-a3-pool-1", "gke-a3-pool-2"]
    assert "block" in sel3.group
    # The subblock pair is busy: the job goes to another pair of the same block before another block.
    busy = d.eligible(pool, {"nodes": 2, "gpusPerNode": 8}, free_gpus={"gke-a3-pool-1": 0})
    assert [i.name for i in busy.chosen] == ["gke-a3-pool-0", "gke-a3-pool-2"]
    gb = nodes(*GB200, **{n.replace("-", "_"): {d.GPU_PRODUCT_OVERRIDE: "H200-SXM-141GB"} for n in GB200})
    assert [i.name for i in d.eligible(gb[::-1], {"nodes": 2, "gpusPerNode": 4}).chosen] == ["gb200-0", "gb200-1"]


# -- fingerprints ----------------------------------------------------------------------------------
def test_fingerprint_is_order_independent_and_tracks_changes():
    base = d.fingerprint(nodes(*A3), 8)
    assert d.fingerprint(nodes(*reversed(A3)), 8) == base
    topo, report = d.build_topology(nodes(A3[2], A3[0], A3[3], A3[1]), 8)
    assert report.fingerprint == topo.fingerprint == base
    assert d.fingerprint(nodes(*A3[:3]), 8) != base
    changed = nodes(*A3, gke_a3_pool_3={d.NETWORK_BANDWIDTH: "400Gbps"})
    assert d.fingerprint(changed, 8) != base
    assert d.fingerprint(nodes(*A3), 4) != base


def test_summary_is_json_and_the_document_parses_back():
    from autopar.planner.hardware import parse_topology
    topo, report = d.build_topology(nodes(*P5, "dgx-h100-a"), 8, name="job-x")
    s = report.summary()
    assert json.loads(json.dumps(s)) == s
    assert s["gpus"] == 24 and s["products"] == {"H100-SXM5-80GB": 24} and s["unknownProducts"] == {}
    assert s["productLabels"] == {"NVIDIA-H100-80GB-HBM3": "H100-SXM5-80GB"}
    again = parse_topology(yaml.safe_load(yaml.safe_dump(report.document)))
    assert again.fingerprint == topo.fingerprint and again.name == "job-x"


def test_a_memory_label_that_disagrees_with_the_product_is_warned_about():
    node = nodes("dgx-h100-a", dgx_h100_a={d.GPU_MEMORY: "40960"})
    assert any("40960" in w for w in d.build_topology(node, 8)[1].warnings)


def test_too_few_gpus_and_no_nodes():
    with pytest.raises(d.DiscoveryError, match="has 1"):
        d.build_topology(nodes("gke-a2-1g-0"), 2)
    with pytest.raises(d.DiscoveryError):
        d.build_topology([], 1)
    with pytest.raises(d.DiscoveryError, match="needs 3 node"):
        d.discover(nodes(*P5), {"nodes": 3, "gpusPerNode": 8})


# -- planning on a discovered topology ---------------------------------------------------------------
def test_a_discovered_topology_can_be_planned_on(tmp_path):
    import torch

    from autopar.planner.cost import CostModel, ProfileCache
    from autopar.planner.ir import import_spec
    from autopar.planner.search import named_strategy
    from autopar.planner.sim import TaskGraphBuilder, simulate_strategy
    from autopar.planner.zoo import load_model

    found = d.discover(nodes(*P4D), {"nodes": 2, "gpusPerNode": 2})
    topo = found.topology
    assert topo.num_devices == 4 and found.report.nodes == tuple(P4D[:2])
    with torch.device("meta"):
        spec = load_model("lenet", batch=16, image=12)
    graph = import_spec(spec)
    cost = CostModel(ProfileCache.load(tmp_path / "profile.json")).bind(graph)

    def step(topology):
        builder = TaskGraphBuilder(graph, topology, cost, "sgd")
        result, _, _ = simulate_strategy(builder, named_strategy("data-parallel", graph, topology))
        return result.step_time

    fast = step(topo)
    # The labels reach the simulator: a 1 Gb/s override makes the gradient all-reduce slower.
    slow_nodes = nodes(*P4D[:2], **{n.replace("-", "_").replace(".", "_"): {d.NETWORK_BANDWIDTH: "1Gbps"}
                                    for n in P4D[:2]})
    slow, _ = d.build_topology(slow_nodes, 2)
    assert 0 < fast < step(slow)


def test_the_message_of_too_few_nodes_stays_small_with_a_thousand_nodes():
    """A status message names a dozen nodes at most, however many were left out."""
    from autopar.operator.discovery import MESSAGE_NODES, eligible
    from tests.controlplane.nodes import dgx_h100
    nodes = []
    for n in dgx_h100(1000):
        n = copy.deepcopy(n)
        n["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
        nodes.append(n)
    sel = eligible(nodes, DevicesSpec(nodes=2, gpus_per_node=8))
    assert not sel.ok and len(sel.excluded) == 1000
    assert len(sel.message) < 4000 and f"and {1000 - MESSAGE_NODES} more node(s) left out" in sel.message
