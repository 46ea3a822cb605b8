"""Plan files round-trip, accept hand edits, and refuse what does not fit with a precise message."""

import json

import pytest
import yaml

from autopar.planner.errors import PlanFileError
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir.strategy import data_parallel, model_parallel
from autopar.planner.plan_file import load_plan, read_plan, save_plan

from .search._graphs import diamond, mlp


@pytest.fixture
def setup():
    return mlp(), get_preset("p100-1x4")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("build", [data_parallel, model_parallel])
def test_plan_round_trips(tmp_path, setup, suffix, build):
    graph, topo = setup
    strategy = build(graph, topo.num_devices)
    path = save_plan(strategy, tmp_path / f"plan{suffix}", graph, topo, predicted_step_s=0.001)
    loaded = load_plan(path, graph, topo)
    assert loaded.configs == strategy.configs and loaded.op_names == strategy.op_names
    assert read_plan(path).predicted["stepSeconds"] == 0.001


def test_a_hand_edited_plan_loads(tmp_path, setup):
    graph, topo = setup
    path = save_plan(data_parallel(graph, 4), tmp_path / "plan.yaml", graph, topo)
    doc = yaml.safe_load(path.read_text())
    fc2 = next(e for e in doc["ops"] if e["op"] == "fc2")
    fc2["degrees"] = {"f": 2}  # the user splits the output features instead
    fc2["devices"] = [3, 1]
    path.write_text(yaml.safe_dump(doc))
    strategy = load_plan(path, graph, topo)
    assert strategy["fc2"].degrees == (1, 2) and strategy["fc2"].devices == (3, 1)


def _edit(path, change):
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))


def _set_op(name, **fields):
    def change(doc):
        entry = next(e for e in doc["ops"] if e["op"] == name)
        entry.update(fields)
    return change


REFUSALS = {
    "wrong api version": (lambda d: d.update(apiVersion="autopar.dev/v2"), r"apiVersion 'autopar.dev/v2'.*expected apiVersion"),
    "missing op": (lambda d: d.update(ops=d["ops"][1:]), r"no entry for 1 op\(s\) of mlp: x"),
    "unknown op": (lambda d: d["ops"].append({"op": "conv9", "devices": [0]}), r"has no op\(s\) conv9"),
    "duplicate op": (lambda d: d["ops"].append(dict(d["ops"][0])), r"op 'x' is listed twice"),
    "unknown dim": (_set_op("fc1", degrees={"h": 2}), r"op fc1 has no parallel dimension 'h'; its dimensions are n, f"),
    "bad degree": (_set_op("fc1", degrees={"f": 3}, devices=[0, 1, 2]), r"degree 3 for parameter dim f of size 8"),
    "too few devices": (_set_op("fc1", degrees={"n": 2}, devices=[0]), r"degrees 2×1 = 2 tasks but 1 devices given"),
    "device out of range": (_set_op("fc1", degrees={}, devices=[7]), r"device 7 does not exist; the topology has devices 0..3"),
    "schema": (lambda d: d["ops"][0].update(color="red"), r"op 'x' \(entry 1 of ops\): unknown field 'color'"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_broken_plan_is_refused_with_a_message_naming_the_problem(tmp_path, setup, case):
    graph, topo = setup
    path = save_plan(data_parallel(graph, 4), tmp_path / "plan.yaml", graph, topo)
    change, message = REFUSALS[case]
    _edit(path, change)
    with pytest.raises(PlanFileError, match=message):
        load_plan(path, graph, topo)


def test_a_plan_for_another_graph_is_refused_naming_the_graph_fingerprint(tmp_path, setup):
    graph, topo = setup
    path = save_plan(data_parallel(graph, 4), tmp_path / "plan.json", graph, topo)
    other = diamond()
    with pytest.raises(PlanFileError, match=r"made for graph 'mlp'.*but the graph is 'diamond'.*the graph fingerprint differs"):
        load_plan(path, other, topo)


def test_a_plan_for_another_topology_is_refused_naming_the_topology_fingerprint(tmp_path, setup):
    graph, topo = setup
    path = save_plan(data_parallel(graph, 4), tmp_path / "plan.json", graph, topo)
    with pytest.raises(PlanFileError, match=r"made for topology 'p100-1x4'.*but the topology is 'k80-1x4'.*topology fingerprint differs"):
        load_plan(path, graph, get_preset("k80-1x4"))


@pytest.mark.parametrize("text,suffix,message", [
    ("ops: [unclosed", ".yaml", r"not valid YAML"),
    ("{", ".json", r"not valid JSON"),
    ("- just a list", ".yaml", r"expected a mapping"),
])
def test_an_unparsable_plan_is_refused(tmp_path, setup, text, suffix, message):
    graph, topo = setup
    path = tmp_path / f"plan{suffix}"
    path.write_text(text)
    with pytest.raises(PlanFileError, match=message):
        load_plan(path, graph, topo)


def test_a_missing_plan_file_is_refused(tmp_path, setup):
    with pytest.raises(PlanFileError, match=r"cannot read it"):
        load_plan(tmp_path / "nope.yaml", *setup)
