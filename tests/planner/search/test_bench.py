"""`autopar bench search` rows have the issue's JSON shape."""

import json

import pytest

from autopar.planner.search.bench import run_search_bench


@pytest.mark.slow
def test_bench_rows_have_the_documented_shape():
    result = run_search_bench(True, models=["lenet"], topologies=["p100-1x4"], budget_s=0.5)
    json.dumps(result)  # serialisable as printed by --json
    (row,) = result["rows"]
    assert row["model"] == "lenet" and row["topology"] == "p100-1x4" and row["devices"] == 4
    assert set(row["simulated"]) == {"data_parallel", "model_parallel", "expert", "placement", "optcnn", "mcmc"}
    assert set(row["search_seconds"]) == {"optcnn", "placement", "mcmc"}
    assert set(row["peak_memory_bytes"]) == set(row["simulated"])
    best = row["simulated"]["mcmc"]
    assert all(best <= v for v in row["simulated"].values() if v is not None)
    assert row["speedup_over_data_parallel"] >= 1.0
    assert any(c["target"].startswith("mcmc <=") and c["ok"] for c in result["checks"])
