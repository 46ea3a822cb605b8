"""The pipeline's steps, as both drivers call them: validate, plan, the trainer's options, the report."""

from __future__ import annotations

import pytest

from autopar.job import JobSpecError, parse_job
from autopar.job import pipeline
from autopar.planner.cost import CostModel, ProfileCache
from autopar.planner.search import named_strategy
from autopar.trainer.train import config_from

LENET = {"image": 12}


def _job(**spec):
    model = spec.pop("model", {"name": "lenet", "options": LENET})
    return parse_job({"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
                      "metadata": {"name": "t"}, "spec": {"model": model, "training": {"batchSize": 8, "steps": 3},
                                                          **spec}})


def _cost(prepared, tmp_path):
    return CostModel(ProfileCache.load(tmp_path / "profile.json")).bind(prepared.graph)


def test_validate_builds_the_graph_with_the_jobs_batch():
    prepared = pipeline.validate(_job(), ".")
    assert prepared.graph.batch_size == 8 and prepared.world == 2
    assert prepared.options == {"image": 12, "batch": 8}


@pytest.mark.parametrize("spec,field", [
    ({"model": {"name": "lenett"}}, "spec.model.name: unknown model 'lenett'"),
    ({"model": {"name": "lenet", "options": {"hiden": 3}}}, "spec.model.options.hiden: model 'lenet' has no option"),
    ({"model": {"name": "lenet", "options": {"batch": 4}}}, "spec.training.batchSize is 8 but spec.model.options.batch"),
    ({"model": {"name": "nowhere.module:factory"}}, "spec.model: model 'nowhere.module:factory': cannot import"),
    ({"data": {"source": "file", "path": "missing.pt"}}, "spec.data.path: 'missing.pt' is not a file"),
    ({"planner": {"algorithm": "pinned", "planRef": {"path": "none.yaml"}}},
     "spec.planner.planRef.path: 'none.yaml' is not a file"),
    ({"planner": {"algorithm": "pinned", "planRef": {"configMap": "plans"}}},
     "a ConfigMap is only read in a cluster"),
])
def test_validate_names_the_field(tmp_path, spec, field):
    with pytest.raises(JobSpecError) as e:
        pipeline.validate(_job(**spec), tmp_path)
    assert field in str(e.value)


def test_a_named_baseline_is_simulated_beside_data_parallelism(tmp_path):
    prepared = pipeline.validate(_job(planner={"algorithm": "model-parallel"}), ".")
    topology = pipeline.local_topology(prepared)
    outcome = pipeline.make_plan(prepared, topology, _cost(prepared, tmp_path))
    assert outcome.strategy.name == "model-parallel" and outcome.algorithm == "model-parallel"
    assert outcome.predicted_step_s > 0 and outcome.data_parallel_step_s > 0
    assert outcome.predicted_speedup == pytest.approx(outcome.data_parallel_step_s / outcome.predicted_step_s)


def test_the_search_is_never_slower_than_data_parallelism_and_its_plan_file_reads_back(tmp_path):
    from autopar.planner.plan_file import load_plan, read_plan
    prepared = pipeline.validate(_job(planner={"budgetSeconds": 0.5, "maxProposals": 20}), ".")
    topology = pipeline.local_topology(prepared)
    outcome = pipeline.make_plan(prepared, topology, _cost(prepared, tmp_path))
    assert outcome.result is not None and outcome.predicted_speedup >= 1.0
    path = pipeline.write_plan(outcome, tmp_path / "plan.yaml", prepared, topology)
    assert read_plan(path).predicted["stepSeconds"] == pytest.approx(outcome.predicted_step_s)
    assert load_plan(path, prepared.graph, topology).name == outcome.strategy.name


def test_a_pinned_plan_is_read_from_its_path_or_from_configmap_text(tmp_path):
    first = pipeline.validate(_job(planner={"algorithm": "model-parallel"}), ".")
    topology = pipeline.local_topology(first)
    plan_path = pipeline.write_plan(pipeline.make_plan(first, topology, _cost(first, tmp_path)),
                                    tmp_path / "pinned.yaml", first, topology)
    pinned = pipeline.validate(_job(planner={"algorithm": "pinned", "planRef": {"path": "pinned.yaml"}}), tmp_path)
    outcome = pipeline.make_plan(pinned, topology, _cost(pinned, tmp_path))
    assert outcome.strategy.name == "model-parallel" and outcome.algorithm == "pinned"
    in_cluster = pipeline.validate(_job(planner={"algorithm": "pinned", "planRef": {"configMap": "plans"}}),
                                   tmp_path, local=False)
    again = pipeline.make_plan(in_cluster, topology, _cost(in_cluster, tmp_path), plan_text=plan_path.read_text())
    assert again.predicted_step_s == pytest.approx(outcome.predicted_step_s)


def test_a_pinned_plan_for_another_model_is_refused_naming_the_field(tmp_path):
    other = pipeline.validate(_job(model={"name": "lenet", "options": {"image": 16}},
                                   planner={"algorithm": "model-parallel"}), ".")
    topology = pipeline.local_topology(other)
    pipeline.write_plan(pipeline.make_plan(other, topology, _cost(other, tmp_path)), tmp_path / "p.yaml", other,
                        topology)
    pinned = pipeline.validate(_job(planner={"algorithm": "pinned", "planRef": {"path": "p.yaml"}}), tmp_path)
    with pytest.raises(JobSpecError, match=r"^spec.planner.planRef: "):
        pipeline.make_plan(pinned, topology, _cost(pinned, tmp_path))


def test_the_trainer_options_are_a_valid_train_config(tmp_path):
    job = _job(training={"batchSize": 8, "steps": 5, "optimizer": "adam", "learningRate": 0.002, "dtype": "float64",
                         "seed": 3}, checkpoint={"everySteps": 2})
    prepared = pipeline.validate(job, ".")
    kwargs = pipeline.train_config(prepared, "plan.yaml", topology="local:2", checkpoint_dir=str(tmp_path))
    cfg = config_from(**kwargs)
    assert (cfg.steps, cfg.nproc, cfg.dtype, cfg.seed, cfg.checkpoint_every) == (5, 2, "float64", 3, 2)
    assert cfg.optimizer.name == "adam" and cfg.optimizer.lr == 0.002
    assert cfg.model_options == {"image": 12, "batch": 8} and cfg.graceful_stop


def test_report_numbers(tmp_path):
    prepared = pipeline.validate(_job(planner={"algorithm": "data-parallel"}), ".")
    topology = pipeline.local_topology(prepared)
    outcome = pipeline.PlanOutcome(strategy=named_strategy("data-parallel", prepared.graph, topology),
                                   algorithm="data-parallel", predicted_step_s=0.09, data_parallel_step_s=0.09,
                                   search_seconds=0.1)
    trained = {"measured_step_s": 0.1, "measured_cv": 0.05, "step_seconds": [0.5, 0.1, 0.2, 0.09, 0.11, 0.1],
               "traced_steps": [3], "steps": 6, "final_loss": 1.0, "checkpoints": ["c"], "resumed_from_step": None}
    trained.update(predicted_parts_s={"compute": 0.08}, measured_parts_s={"compute": 0.09},
                   furthest_off="compute under by 10.0 ms")
    doc = pipeline.report(prepared, topology, outcome, trained,
                          compare={"measured_step_s": 0.12, "furthest_off": "transfer under by 2.0 ms"})
    assert doc["prediction_error"] == pytest.approx(-0.1)
    assert doc["furthest_off"] == "compute under by 10.0 ms" and doc["measured_parts_s"] == {"compute": 0.09}
    assert doc["data_parallel_furthest_off"] == "transfer under by 2.0 ms"
    from autopar.job.local import format_report
    text = format_report(dict(doc, final_loss=1.0))
    assert "error -10.0 % (simulated / measured - 1); furthest off: compute under by 10.0 ms" in text
    assert "(prediction error -25.0 %; furthest off: transfer under by 2.0 ms): the plan is 1.20× faster" in text
    assert doc["measured_speedup"] == pytest.approx(1.2)
    assert doc["data_parallel_prediction_error"] == pytest.approx(0.09 / 0.12 - 1)
    # quantiles leave out the first step and the traced one: 0.1, 0.09, 0.11, 0.1
    assert doc["measured_p10_s"] == pytest.approx(0.09) and doc["measured_p90_s"] == pytest.approx(0.11)
    assert doc["phase"] == "Succeeded" and doc["job"] == "t" and doc["namespace"] == "default"


def test_a_retimed_run_reports_the_ranks_price_with_the_searchs_beside(tmp_path):
    """`autopar run --retime`: the report's simulated step, its error and the metrics file's gauge are
    the trainings' prices from their ranks' passes; the search's price stays in planned_step_s and
    the speedup it believed in predicted_speedup; the steps after each pass leave the quantiles."""
    prepared = pipeline.validate(_job(planner={"algorithm": "data-parallel"}), ".")
    topology = pipeline.local_topology(prepared)
    outcome = pipeline.PlanOutcome(strategy=named_strategy("data-parallel", prepared.graph, topology),
                                   algorithm="data-parallel", predicted_step_s=0.09, data_parallel_step_s=0.09,
                                   search_seconds=0.1)
    retime = {"passes_before_steps": [2, 4], "settling_steps": [2, 3, 4, 5], "tasks": 3, "timed": 3}
    trained = {"measured_step_s": 0.1, "measured_cv": 0.05, "step_seconds": [0.5, 0.3, 0.3, 0.3, 0.3, 0.1, 0.12],
               "traced_steps": [], "steps": 7, "final_loss": 1.0, "checkpoints": [], "resumed_from_step": None,
               "predicted_step_s": 0.105, "retime": retime}
    doc = pipeline.report(prepared, topology, outcome, trained,
                          compare={"measured_step_s": 0.12, "predicted_step_s": 0.11, "retime": retime})
    assert doc["predicted_step_s"] == 0.105 and doc["planned_step_s"] == 0.09 and doc["retime"] == retime
    assert doc["prediction_error"] == pytest.approx(0.05)
    assert doc["data_parallel_predicted_step_s"] == 0.09 and doc["data_parallel_retimed_step_s"] == 0.11
    assert doc["data_parallel_prediction_error"] == pytest.approx(0.11 / 0.12 - 1)
    assert doc["measured_p10_s"] == pytest.approx(0.1) and doc["measured_p90_s"] == pytest.approx(0.12)
    from autopar.job.local import format_report
    text = format_report(doc)
    assert "retimed     the plan's ops timed in the ranks price it at 105.0 ms; the search's profile at 90.0 ms" in text
    assert "plan        'data-parallel' (data-parallel): simulated 90.0 ms" in text
    assert "(priced 110.0 ms by its ranks: prediction error -8.3 %, the search's profile -25.0 %)" in text
    timed = {**retime, "runtime": {"optimizer": "sgd 16 us per tensor", "overheads": "17 us per forward task",
                                   "ops_only_step_s": 0.095}}
    dp_timed = {**retime, "runtime": {"optimizer": "sgd 16 us per tensor", "ops_only_step_s": 0.108}}
    text = format_report(pipeline.report(prepared, topology, outcome, dict(trained, retime=timed),
                                         compare={"measured_step_s": 0.12, "predicted_step_s": 0.11,
                                                  "retime": dp_timed}))
    assert ("retimed     the plan's ops, optimizer and own work per op timed in the ranks price it at "
            "105.0 ms; the ops alone at 95.0 ms (-5.0 %); the search's profile at 90.0 ms (-10.0 %)") in text
    assert "(priced 110.0 ms by its ranks: prediction error -8.3 %, the ops alone -10.0 %, the search's profile" in text
    plain = pipeline.report(prepared, topology, outcome, dict(trained, retime=None))
    assert plain["predicted_step_s"] == plain["planned_step_s"] == 0.09 and "retimed" not in format_report(plain)
