"""Plan-file refusals say why: the dtype, op count, batch or model option that differs, and which op
entry of the file has a field of the wrong type (by its name, with the values it allows)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from autopar.planner.errors import PlanFileError
from autopar.planner.hardware.presets import get_preset
from autopar.planner.ir import import_spec
from autopar.planner.ir.graph import fmt_count
from autopar.planner.ir.strategy import data_parallel
from autopar.planner.plan_file import load_plan, read_plan, save_plan
from autopar.planner.search import named_strategy
from autopar.planner.zoo import ModelSpec, TensorSpec, with_dtype


class Tiny(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, width)
        self.fc2 = torch.nn.Linear(width, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def tiny(batch: int = 8, width: int = 16) -> ModelSpec:
    torch.manual_seed(0)
    return ModelSpec("tiny", Tiny(width), (("x", TensorSpec((batch, 8), ("n", "c"))),),
                     ("labels", TensorSpec((batch,), ("n",), "int64")), "cross_entropy", "tiny",
                     options=(("batch", batch), ("width", width)))


TOPO = get_preset("local:2")


def _saved(tmp_path, spec=None, suffix=".yaml"):
    spec = spec or tiny()
    graph = import_spec(spec)
    path = save_plan(data_parallel(graph, 2), tmp_path / f"plan{suffix}", graph, TOPO, model_options=spec.options)
    return path, graph


def test_the_plan_records_dtype_batch_and_options(tmp_path):
    path, graph = _saved(tmp_path)
    doc = read_plan(path)
    assert doc.graph.dtype == "float32" and doc.graph.batch_size == 8
    assert doc.graph.options == {"batch": 8, "width": 16}
    assert load_plan(path, graph, TOPO).configs == data_parallel(graph, 2).configs


def test_a_plan_for_float32_refused_in_float64_says_so(tmp_path):
    path, _ = _saved(tmp_path)
    graph64 = import_spec(with_dtype(tiny(), "float64"))
    assert graph64.dtype == "float64"
    with pytest.raises(PlanFileError) as e:
        load_plan(path, graph64, TOPO)
    msg = str(e.value)
    assert "was made for tiny in float32; this run is float64" in msg
    assert "autopar plan --dtype float64" in msg


def test_a_plan_made_in_float64_loads_in_float64(tmp_path):
    path, graph = _saved(tmp_path, with_dtype(tiny(), "float64"))
    assert graph.param_specs["fc1.weight"].dtype == "float64"
    assert load_plan(path, import_spec(with_dtype(tiny(), "float64")), TOPO).name == "data-parallel"


@pytest.mark.parametrize("other, words", [
    (dict(batch=4), ["another tiny graph", "batch 8 in the plan, 4 in this run"]),
    (dict(width=32), ["another tiny graph", "width=16 in the plan, 32 now"]),
])
def test_other_mismatches_name_what_differs(tmp_path, other, words):
    path, _ = _saved(tmp_path)
    spec = tiny(**other)
    with pytest.raises(PlanFileError) as e:
        load_plan(path, import_spec(spec), TOPO, model_options=spec.options)
    for w in words:
        assert w in str(e.value)


def test_an_old_plan_without_dtype_still_loads_and_a_mismatch_names_the_op_count(tmp_path):
    path, graph = _saved(tmp_path)
    doc = yaml.safe_load(path.read_text())
    for key in ("dtype", "batchSize", "options"):
        del doc["graph"][key]
    path.write_text(yaml.safe_dump(doc))
    assert load_plan(path, graph, TOPO).name == "data-parallel"
    doc["graph"]["ops"] = 99
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanFileError, match=r"made for another tiny graph.*99 ops in the plan"):
        load_plan(path, import_spec(tiny(width=32)), TOPO)


def _edit_op(path, name, **fields):
    doc = yaml.safe_load(path.read_text())
    entry = next(e for e in doc["ops"] if e["op"] == name)
    entry.update(fields)
    path.write_text(yaml.safe_dump(doc))


def test_a_string_degree_names_the_op_the_field_and_the_allowed_degrees(tmp_path):
    path, graph = _saved(tmp_path)
    _edit_op(path, "fc1", degrees={"n": "two"})
    with pytest.raises(PlanFileError) as e:
        load_plan(path, graph, TOPO)
    msg = str(e.value)
    assert "op 'fc1'" in msg and "degrees.n is 'two'" in msg and "allowed 1, 2" in msg
    assert "ops.2" not in msg


def test_schema_errors_without_a_graph_still_name_the_op(tmp_path):
    path, _ = _saved(tmp_path, suffix=".json")
    doc = json.loads(path.read_text())
    doc["ops"][1]["devices"] = ["gpu0", 1]
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError, match=r"op 'fc1' \(entry 2 of ops\): devices\[0\] is 'gpu0'"):
        read_plan(path)


def test_a_missing_field_names_the_op(tmp_path):
    path, graph = _saved(tmp_path)
    doc = yaml.safe_load(path.read_text())
    del doc["ops"][1]["devices"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanFileError, match=r"op 'fc1' \(entry 2 of ops\): field 'devices' is missing"):
        load_plan(path, graph, TOPO)


def test_data_parallel_says_when_the_batch_does_not_divide():
    graph = import_spec(tiny(batch=15))
    strategy = named_strategy("data-parallel", graph, TOPO)
    assert strategy.devices_used() == {0}
    assert strategy.notes == ("batch 15 does not divide over 2 devices: data-parallel runs on 1 device; "
                              "use a batch divisible by 2 (e.g. 14 or 16)",)
    assert named_strategy("data-parallel", import_spec(tiny(batch=16)), TOPO).notes == ()
    # Notes do not make strategies differ, and survive renaming.
    assert strategy.renamed("x").notes == strategy.notes
    assert strategy == strategy.with_notes("other").renamed("data-parallel")


@pytest.mark.parametrize("n, text", [(0, "0"), (950, "950"), (22_404, "22.4k"), (1_234_567, "1.2M"),
                                     (134_000_000, "134.0M"), (2_500_000_000, "2.5B")])
def test_counts_are_readable(n, text):
    assert fmt_count(n) == text


def test_the_summary_of_a_small_model_does_not_say_zero_parameters():
    summary = import_spec(tiny()).summary()
    assert "0.0M" not in summary and "212 parameters" in summary
