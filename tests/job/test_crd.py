"""The CRD: committed file = generated file, a structural schema with the models' defaults, and
CEL rules that agree with the models' validators (evaluated here with cel-python; the API server
runs them in the control-plane tests)."""

from __future__ import annotations

from pathlib import Path

import celpy
import pytest
import yaml

from autopar.job import JobSpec, crd, crd_yaml, parse_job
from autopar.job.crd import PRINTER_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "paralleltrainingjobs.autopar.dev.yaml"


def _schema() -> dict:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nodes(node: dict, path: str = ""):
    yield path, node
    for k, v in node.get("properties", {}).items():
        yield from _nodes(v, f"{path}.{k}")
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_what_the_model_generates():
    assert COMMITTED.read_text() == crd_yaml(), (
        "crds/paralleltrainingjobs.autopar.dev.yaml differs from the spec models; regenerate it with "
        "`autopar crd > crds/paralleltrainingjobs.autopar.dev.yaml`")


def test_names_follow_the_design():
    c = crd()
    assert c["metadata"]["name"] == "paralleltrainingjobs.autopar.dev"
    names = c["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("ParallelTrainingJob", "paralleltrainingjobs",
                                                                     ["ptj"])
    version = c["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}


def test_schema_is_structural():
    for path, node in _nodes(_schema()):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs"):
            assert banned not in node, f"{path} has {banned}"
        if node.get("type") == "object" and "properties" not in node:
            assert node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node or \
                path == ".metadata", f"{path}: an object without properties must say what it holds"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound) in (None, True), f"{path}: {bound} must be a boolean in OpenAPI v3.0"


def test_strings_lists_and_maps_of_the_spec_are_bounded():
    """CEL's cost estimate needs bounds on whatever `self == oldSelf` compares."""
    for path, node in _nodes(_schema()["properties"]["spec"], "spec"):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path} has no maxLength"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path} has no maxItems"
        if node.get("type") == "object" and "properties" not in node:
            assert "maxProperties" in node, f"{path} has no maxProperties"


def test_defaults_are_the_models_defaults():
    spec = _schema()["properties"]["spec"]
    model_default = JobSpec.model_validate({"model": {"name": "lenet"}}).model_dump(by_alias=True)
    for section, fields in model_default.items():
        props = spec["properties"][section]["properties"]
        for name, value in fields.items():
            if section == "model" or value is None or value in ({}, []):
                continue
            assert props[name].get("default") == value, f"spec.{section}.{name}: CRD default differs from the model"
    assert spec["required"] == ["model"]
    for section in ("training", "data", "devices", "planner", "checkpoint", "runPolicy"):
        assert spec["properties"][section]["default"] == {k: v for k, v in model_default[section].items()
                                                          if v is not None}


def test_enums_and_ranges_come_from_the_model():
    props = _schema()["properties"]["spec"]["properties"]
    assert "mcmc" in props["planner"]["properties"]["algorithm"]["enum"]
    assert props["training"]["properties"]["steps"]["minimum"] == 1
    assert props["devices"]["properties"]["gpusPerNode"]["maximum"] == 64
    lr = props["training"]["properties"]["learningRate"]
    assert lr["minimum"] == 0 and lr["exclusiveMinimum"] is True


def test_printer_columns_point_into_the_status():
    status = _schema()["properties"]["status"]["properties"]
    names = [c["name"] for c in PRINTER_COLUMNS]
    assert names[:5] == ["Phase", "Devices", "Simulated", "Actual", "Speedup"] and names[-1] == "Age"
    for column in PRINTER_COLUMNS:
        path = column["jsonPath"].split(".")
        if path[1] == "status":
            assert path[2] in status, column


# -- CEL -----------------------------------------------------------------------------------------

def _rules(node_path: str) -> list[dict]:
    node = _schema()
    for part in node_path.split("."):
        node = node["properties"][part]
    return node.get("x-kubernetes-validations", [])


def _cel(rule: str, self, old=None) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(rule))
    activation = {"self": celpy.json_to_cel(self)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return bool(program.evaluate(activation))


def _manifest(spec: dict) -> dict:
    job = parse_job({"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                     "metadata": {"name": "j"}, "spec": {"model": {"name": "lenet"}, **spec}})
    return job.to_manifest()["spec"]


@pytest.mark.parametrize("planner,ok", [
    ({"algorithm": "pinned"}, False),
    ({"algorithm": "pinned", "planRef": {"path": "plan.yaml"}}, True),
    ({"algorithm": "auto"}, True),
])
def test_pinned_rule_agrees_with_the_model(planner, ok):
    rule = next(r["rule"] for r in _rules("spec.planner") if "pinned" in r["rule"])
    assert _cel(rule, planner) is ok
    if ok:
        parse_job({"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob", "metadata": {"name": "j"},
                   "spec": {"model": {"name": "lenet"}, "planner": planner}})
    else:
        with pytest.raises(Exception, match="pinned"):
            _manifest({"planner": planner})


def test_plan_ref_and_data_rules():
    ref = _rules("spec.planner.planRef")[0]["rule"]
    assert _cel(ref, {"path": "p"}) and _cel(ref, {"configMap": "c", "key": "plan.yaml"})
    assert not _cel(ref, {"path": "p", "configMap": "c"}) and not _cel(ref, {"key": "plan.yaml"})
    data = next(r["rule"] for r in _rules("spec.data") if "file" in r["rule"])
    assert _cel(data, {"source": "synthetic"}) and _cel(data, {"source": "file", "path": "d.pt"})
    assert not _cel(data, {"source": "file"})


def test_spec_cannot_change_after_creation_except_suspend():
    old = _manifest({"runPolicy": {"activeDeadlineSeconds": 60}})
    for section in ("model", "training", "data", "devices", "planner", "checkpoint"):
        rule = next(r for r in _rules(f"spec.{section}") if r["rule"] == "self == oldSelf")
        assert _cel(rule["rule"], old[section], old[section])
        assert "cannot change" in rule["message"]
    changed = _manifest({"training": {"steps": 7}, "runPolicy": {"activeDeadlineSeconds": 60}})
    rule = next(r["rule"] for r in _rules("spec.training") if r["rule"] == "self == oldSelf")
    assert not _cel(rule, changed["training"], old["training"])

    policy = _schema()["properties"]["spec"]["properties"]["runPolicy"]
    assert not any(r["rule"] == "self == oldSelf" for r in policy["properties"]["suspend"].get(
        "x-kubernetes-validations", []))
    deadline = policy["properties"]["activeDeadlineSeconds"]["x-kubernetes-validations"][0]["rule"]
    assert not _cel(deadline, 120, 60)
    presence = policy["x-kubernetes-validations"][0]["rule"]
    suspended = {**old["runPolicy"], "suspend": True}
    assert _cel(presence, suspended, old["runPolicy"])
    removed = {k: v for k, v in old["runPolicy"].items() if k != "activeDeadlineSeconds"}
    assert not _cel(presence, removed, old["runPolicy"])


def test_committed_file_is_valid_yaml_with_a_header():
    text = COMMITTED.read_text()
    assert text.startswith("# The ParallelTrainingJob CRD")
    assert yaml.safe_load(text) == crd()
