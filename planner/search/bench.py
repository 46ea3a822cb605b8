"""`autopar bench search`: baselines, OptCNN and MCMC on the papers' models and clusters.

    result = run_search_bench(quick=True)           # the whole table in a few minutes
    result = run_search_bench(quick=False, models=["nmt"], topologies=["p100-4x4"])

Rows: every zoo model on one P100 node (4 GPUs, `p100-1x4`), the paper's P100 cluster (16 GPUs,
`p100-4x4`) and its K80 cluster (64 GPUs, `k80-16x4`).  Each row gives the simulated step time of
every baseline, OptCNN and MCMC (null where a strategy does not apply or does not fit), each
search's wall time, each strategy's largest per-device peak memory, and MCMC's speedups.
``checks`` states the issue's targets and whether each row meets them.

Budgets: ``quick`` gives MCMC `QUICK_BUDGET_S` per row (starts: data parallelism, the expert
strategy, OptCNN's result, for RNNs the layer-blocks strategy and for CNNs with modules of branches
the branches strategy) and the placement search a quarter of that; the full bench
gives `FULL_BUDGET_S` and adds a random start.  The quick bench does not simulate a baseline
whose task graph would exceed `QUICK_MAX_TASKS` tasks (its row shows null and says why in
``notes``).  Everything is seeded.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from ..cost.model import CostModel
from ..hardware.presets import get_preset
from ..zoo import list_models
from .plan import CANDIDATES, PlanResult, plan

TOPOLOGIES = ("p100-1x4", "p100-4x4", "k80-16x4")
QUICK_BUDGET_S = 4.0
FULL_BUDGET_S = 60.0
QUICK_STARTS = ("data-parallel", "expert", "optcnn", "layer-blocks", "branches")
#: In the quick bench a baseline whose task graph would exceed this many tasks is reported as not
#: simulated (model parallelism of Inception-v3 on 64 GPUs has 4.7M tasks: over a minute alone).
QUICK_MAX_TASKS = 1_500_000
FULL_STARTS = ("data-parallel", "expert", "optcnn", "layer-blocks", "branches", "random")
SPEEDUP_MODELS = ("nmt", "rnnlm", "rnntc", "inception_v3")
OPTCNN_MODELS = ("nmt", "inception_v3")


def load_graph(name: str):
    """A zoo model's operator graph at paper scale (fake tensors, meta parameters)."""
    import torch

    from ..ir.fx_import import import_spec
    from ..zoo import get_model
    with torch.device("meta"):
        return import_spec(get_model(name))


def run_search_bench(quick: bool, models: Sequence[str] | None = None, topologies: Sequence[str] | None = None,
                     *, seed: int = 0, budget_s: float | None = None, progress: bool = False,
                     log: Callable[[str], None] | None = None) -> dict:
    """Run the search benchmark; returns ``{"rows": [...], "checks": [...], "settings": {...}}``."""
    models = list(models) if models else list_models()
    topologies = list(topologies) if topologies else list(TOPOLOGIES)
    budget = budget_s if budget_s is not None else (QUICK_BUDGET_S if quick else FULL_BUDGET_S)
    starts = QUICK_STARTS if quick else FULL_STARTS
    rows = []
    t_all = time.perf_counter()
    for model in models:
        graph = load_graph(model)
        for topo_name in topologies:
            topo = get_preset(topo_name)
            t0 = time.perf_counter()
            result = plan(graph, topo, CostModel(), budget_s=budget, seed=seed, starts=starts, progress=progress,
                          max_tasks=QUICK_MAX_TASKS if quick else None)
            rows.append(_row(model, topo_name, result, time.perf_counter() - t0))
            if log:
                r = rows[-1]
                log(f"{model:13s} {topo_name:9s} mcmc {_ms(r['simulated']['mcmc'])} dp {_ms(r['simulated']['data_parallel'])} "
                    f"optcnn {_ms(r['simulated']['optcnn'])} x{r['speedup_over_data_parallel'] or 0:.2f} over DP, "
                    f"{r['wall_seconds']:.1f}s")
    return {"rows": rows, "checks": _checks(rows),
            "settings": {"quick": quick, "seed": seed, "mcmc_budget_s": budget, "starts": list(starts),
                         "seconds": round(time.perf_counter() - t_all, 1)}}


def _ms(v: float | None) -> str:
    return f"{v * 1e3:9.3f}ms" if v is not None else "      n/a  "


def _key(name: str) -> str:
    return name.replace("-", "_")


def _row(model: str, topo: str, r: PlanResult, wall: float) -> dict:
    simulated, seconds, peak = {}, {}, {}
    for name in CANDIDATES:
        c = r.candidates.get(name)
        ok = c is not None and c.step_time is not None and c.fits
        simulated[_key(name)] = c.step_time if ok else None
        peak[_key(name)] = max(c.peak_memory.values()) if c is not None and c.peak_memory else None
        if name in ("optcnn", "placement", "mcmc") and c is not None:
            seconds[name] = round(c.seconds, 3)
    dp, oc, best = simulated["data_parallel"], simulated["optcnn"], simulated["mcmc"]
    return {
        "model": model, "topology": topo, "devices": r.num_devices,
        "simulated": simulated, "search_seconds": seconds, "peak_memory_bytes": peak,
        "speedup_over_data_parallel": (dp / best) if dp and best else None,
        "speedup_over_optcnn": (oc / best) if oc and best else None,
        "plan_source": r.source, "note": r.note, "wall_seconds": round(wall, 2),
        "notes": {_key(k): c.note for k, c in r.candidates.items() if c.step_time is None and c.note},
        "simulator_errors": sum(len(ch.simulator_errors) for ch in r.chains),
        "proposals": sum(ch.proposals for ch in r.chains if ch.space == "soap"),
    }


def _checks(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        sim = row["simulated"]
        best = sim["mcmc"]
        others = {k: v for k, v in sim.items() if k != "mcmc" and v is not None}
        out.append({"row": f"{row['model']}@{row['topology']}", "target": "mcmc <= every baseline and optcnn",
                    "ok": best is not None and all(best <= v * (1 + 1e-12) for v in others.values())})
        if row["devices"] == 16 and row["model"] in SPEEDUP_MODELS:
            s = row["speedup_over_data_parallel"]
            out.append({"row": f"{row['model']}@{row['topology']}", "target": "speedup over data parallelism >= 1.3",
                        "value": s, "ok": s is not None and s >= 1.3})
        if row["model"] in OPTCNN_MODELS:
            s = row["speedup_over_optcnn"]
            out.append({"row": f"{row['model']}@{row['topology']}", "target": "speedup over OptCNN >= 1.1",
                        "value": s, "ok": s is not None and s >= 1.1})
    return out


def bench_table(result: dict):
    """A rich table of the rows (for a terminal)."""
    from rich.table import Table

    t = Table(title="autopar bench search (simulated ms per step)")
    for col in ("model", "topology", "dp", "mp", "expert", "placement", "optcnn", "mcmc", "x dp", "x optcnn", "wall s"):
        t.add_column(col, justify="right" if col not in ("model", "topology") else "left")
    for row in result["rows"]:
        s = row["simulated"]
        f = lambda v: "—" if v is None else f"{v * 1e3:.2f}"
        g = lambda v: "—" if v is None else f"{v:.2f}"
        t.add_row(row["model"], row["topology"], f(s["data_parallel"]), f(s["model_parallel"]), f(s["expert"]),
                  f(s["placement"]), f(s["optcnn"]), f(s["mcmc"]), g(row["speedup_over_data_parallel"]),
                  g(row["speedup_over_optcnn"]), f"{row['wall_seconds']:.1f}")
    return t
