"""The job spec: every example parses, defaults are written out, and bad manifests are refused
with one message that names the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autopar.job import ALGORITHMS, JobSpecError, load_job, parse_job
from autopar.job.spec import NAMED_STRATEGIES, ParallelTrainingJob

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _job(**spec) -> dict:
    return {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob", "metadata": {"name": "j"},
            "spec": {"model": {"name": "lenet"}, **spec}}


def _error(doc) -> str:
    with pytest.raises(JobSpecError) as e:
        parse_job(doc)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_a_valid_job(path):
    job = load_job(path)
    assert isinstance(job, ParallelTrainingJob)
    assert job.spec.devices.count >= 1


def test_quickstart_is_among_the_examples():
    assert ROOT / "examples" / "quickstart.yaml" in EXAMPLES


def test_defaults_are_filled_in_and_written_out():
    job = parse_job(_job())
    spec = job.to_manifest()["spec"]
    assert spec["training"] == {"steps": 100, "optimizer": "sgd", "learningRate": 0.01, "momentum": 0.9, "seed": 0}
    assert spec["planner"]["algorithm"] == "auto" and spec["planner"]["budgetSeconds"] == 30.0
    assert spec["runPolicy"] == {"backoffLimit": 3, "suspend": False}
    assert spec["devices"]["gpusPerNode"] == 2
    # the written manifest reads back to the same job
    assert parse_job(job.to_manifest()) == job


def test_algorithms_are_the_planners_named_strategies():
    from autopar.planner.search import list_named
    assert set(NAMED_STRATEGIES) | {"optcnn"} == set(list_named())
    assert set(ALGORITHMS) == {"auto", "mcmc", "pinned", *list_named()}


def test_unknown_field_suggests_the_right_one():
    msg = _error(_job(trainig={"steps": 3}))
    assert "spec.trainig: unknown field; did you mean 'training'?" in msg
    assert "runPolicy" in msg


def test_unknown_nested_field_names_its_path():
    msg = _error(_job(training={"step": 3}))
    assert msg.startswith("manifest: spec.training.step: unknown field; did you mean 'steps'?")


def test_enum_error_names_allowed_values():
    msg = _error(_job(planner={"algorithm": "mcmcc"}))
    assert "spec.planner.algorithm: 'mcmcc' is not allowed; choose one of 'auto', 'mcmc', 'optcnn'" in msg
    assert "'data-parallel'" in msg


def test_range_error_names_the_bound():
    assert "spec.training.steps: must be at least 1, got 0" in _error(_job(training={"steps": 0}))
    assert "spec.devices.gpusPerNode: must be at most 64, got 100" in _error(_job(devices={"gpusPerNode": 100}))
    assert "spec.training.learningRate: must be more than 0" in _error(_job(training={"learningRate": 0}))


def test_wrong_type_names_the_field():
    assert "spec.training.steps:" in _error(_job(training={"steps": "many"}))


def test_missing_model():
    doc = _job()
    del doc["spec"]["model"]
    assert "spec.model: required field is missing" in _error(doc)


def test_several_errors_are_reported_together():
    msg = _error(_job(training={"steps": 0}, devices={"nodes": 0}))
    assert "spec.training.steps" in msg and "spec.devices.nodes" in msg


def test_pinned_plan_needs_a_plan_ref():
    msg = _error(_job(planner={"algorithm": "pinned"}))
    assert "spec.planner: algorithm 'pinned' needs planner.planRef" in msg
    ok = parse_job(_job(planner={"algorithm": "pinned", "planRef": {"path": "plan.yaml"}}))
    assert ok.spec.planner.plan_ref.path == "plan.yaml"


def test_plan_ref_names_one_source():
    msg = _error(_job(planner={"algorithm": "pinned", "planRef": {"path": "p.yaml", "configMap": "plans"}}))
    assert "planRef needs exactly one of configMap and path" in msg


def test_file_data_needs_a_path():
    assert "data.source 'file' needs data.path" in _error(_job(data={"source": "file"}))


def test_kind_api_version_and_name():
    assert "kind is 'Job'" in _error({**_job(), "kind": "Job"})
    assert "apiVersion is 'autopar.dev/v1'" in _error({**_job(), "apiVersion": "autopar.dev/v1"})
    assert "metadata.name" in _error({**_job(), "metadata": {"name": "Bad_Name"}})


def test_load_job_reports_yaml_errors_with_the_line(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("apiVersion: autopar.dev/v1alpha1\nkind: ParallelTrainingJob\nspec: [unclosed\n")
    with pytest.raises(JobSpecError, match=r"not valid YAML at line \d+"):
        load_job(p)


def test_load_job_missing_file(tmp_path):
    with pytest.raises(JobSpecError, match="no such file"):
        load_job(tmp_path / "nope.yaml")


def test_load_job_picks_the_job_of_a_multi_document_file(tmp_path):
    p = tmp_path / "all.yaml"
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    p.write_text(yaml.safe_dump_all([other, _job()]))
    assert load_job(p).name == "j"
    p.write_text(yaml.safe_dump_all([other, other]))
    with pytest.raises(JobSpecError, match="expected one ParallelTrainingJob document, found 0"):
        load_job(p)


def test_docs_describe_every_field_of_the_spec():
    from autopar.job import crd
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    text = (ROOT / "docs" / "job.md").read_text()
    fields = [f"{section}.{name}" for section, node in spec.items() for name in node.get("properties", {})]
    missing = [f for f in fields if f"`{f}`" not in text]
    assert not missing, f"docs/job.md does not describe: {', '.join(missing)}"
