"""The job's status: metav1 conditions, phases and the printer columns' strings."""

from __future__ import annotations

import pytest

from autopar.job import JobStatus
from autopar.operator.status import (CONDITIONS, fmt_step, is_true, plan_fields, progress_fields, set_condition,
                                     transition)


def _by_type(conditions):
    return {c["type"]: c for c in conditions}


def test_a_transition_sets_its_condition_and_ends_the_ones_before():
    s = transition({}, "Planning", "TopologyDiscovered", "2 nodes, 16 GPUs", phase="Planning", generation=1,
                   at="2026-11-25T00:00:00Z")
    assert s["phase"] == "Planning" and s["startTime"] == "2026-11-25T00:00:00Z" and s["observedGeneration"] == 1
    s2 = transition(s, "Running", "TrainersStarted", "2 trainer pods", phase="Training", at="2026-11-25T00:01:00Z")
    c = _by_type(s2["conditions"])
    assert c["Running"]["status"] == "True" and c["Planning"]["status"] == "False"
    assert c["Planning"]["lastTransitionTime"] == "2026-11-25T00:01:00Z"
    assert s2.get("startTime") is None          # already started: not rewritten
    done = transition({**s, **s2}, "Succeeded", "Completed", "30 steps", phase="Succeeded", at="2026-11-25T00:02:00Z")
    assert done["completionTime"] == "2026-11-25T00:02:00Z"
    assert _by_type(done["conditions"])["Running"]["status"] == "False"
    assert [x["type"] for x in done["conditions"]] == [t for t in CONDITIONS if t in _by_type(done["conditions"])]


def test_last_transition_time_moves_only_when_the_status_does():
    first = set_condition([], "Running", True, "A", "a", at="t1")
    again = set_condition(first, "Running", True, "B", "b", at="t2")
    assert again[0]["lastTransitionTime"] == "t1" and again[0]["reason"] == "B"
    flipped = set_condition(again, "Running", False, "C", "c", at="t3")
    assert flipped[0]["lastTransitionTime"] == "t3" and not is_true({"conditions": flipped}, "Running")


def test_unknown_condition_and_phase_are_refused():
    with pytest.raises(ValueError, match="unknown condition type"):
        set_condition([], "Exploded", True, "r", "m")
    with pytest.raises(ValueError, match="unknown phase"):
        transition({}, "Planning", "r", "m", phase="Exploding")


def test_printer_strings():
    assert fmt_step(0.0643) == "64.3ms" and fmt_step(1.25) == "1.25s" and fmt_step(0.00085) == "850us"
    assert fmt_step(None) is None
    plan = plan_fields(0.0643, 0.0868, strategy="plan", config_map="j-plan", plan_hash="sha256:1",
                       search_seconds=20.1, algorithm="auto")
    assert plan["predictedSpeedup"] == "1.35x" and plan["simulatedStep"] == "64.3ms"
    progress = progress_fields(12, 0.0788, 0.0643)
    assert progress["actualStep"] == "78.8ms" and progress["predictionError"] == pytest.approx(-0.184, abs=1e-3)


def test_every_field_written_is_in_the_crds_status_schema():
    """The API server prunes status fields its schema does not name."""
    s = transition({}, "Planned", "PlanReady", "m", phase="Planning", generation=3)
    s.update(plan_fields(0.05, 0.06, strategy="p", config_map="c", plan_hash="h", search_seconds=1.0,
                         algorithm="auto"))
    s.update(progress_fields(3, 0.07, 0.05))
    s.update({"topology": {"nodes": 2}, "topologyFingerprint": "sha256:x", "restarts": 0, "replans": 0,
              "devices": "16x H100"})
    known = {f.alias or n for n, f in JobStatus.model_fields.items()}
    assert set(s) <= known, set(s) - known
