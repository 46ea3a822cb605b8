"""The picture of the Grafana dashboard's panels in docs/watching.md, from a real run's metrics.

    .venv/bin/python docs/render_dashboard.py docs/img/quickstart-run docs/img/dashboard.png

Reads a run directory of `autopar run JOB.yaml --local` (``metrics.json``: every step's time and
loss; ``report.json``: the plan's numbers and how long each stage took; ``metrics.prom``: the job's
gauges) and draws the panels of charts/autopar/dashboards/autopar-jobs.json, in the dashboard's
layout and with its titles, as the operator's metrics would have shown that run:

- the time axis is seconds since the run started: profiling and planning (phase Planning), then
  training (phase Training), from ``report.json``'s ``seconds``; the steps end where training
  ends, spaced by their measured times;
- "actual" is what rank 0's progress sidecar reports (`operator.podside.step_seconds`): the mean
  step time since its previous scrape, here every `SCRAPE` seconds; the prediction error is
  simulated / actual - 1 at each scrape, and the last point is the run's median (metrics.prom);
- a local run has no operator: restarts and re-plans are 0, the plan search is the one search
  of this run, and there are no handler errors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "charts" / "autopar" / "dashboards" / "autopar-jobs.json"
#: seconds between two scrapes of rank 0's metrics (the sidecar's --interval is 5 s by default;
#: this run trained for about 3 s, so a shorter one shows more than one point)
SCRAPE = 0.5


def _gauges(prom: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for fam in text_string_to_metric_families(prom) for s in fam.samples}


def series(run: Path) -> dict:
    """What each panel's query returns for the run in `run`, as (times, values)."""
    steps = json.loads((run / "metrics.json").read_text())["step_seconds"]
    report = json.loads((run / "report.json").read_text())
    gauges = _gauges((run / "metrics.prom").read_text())
    sec = report["seconds"]
    planned = sec.get("profile", 0.0) + sec["plan"]
    end = planned + sec["train"]
    first = end - sum(steps)                      # start-up of the ranks comes before the first step
    ends, t = [], first
    for s in steps:
        t += s
        ends.append(t)
    scrapes, actual, done, last_n = [], [], [], 0
    times = [first + SCRAPE * i for i in range(1, int((end - first) / SCRAPE) + 1) if first + SCRAPE * i < end]
    for k in [*times, end]:
        n = sum(1 for e in ends if e <= k + 1e-9)
        if n > last_n:
            scrapes.append(k)
            actual.append(sum(steps[last_n:n]) / (n - last_n))
            done.append(n)
            last_n = n
    simulated = gauges["autopar_job_simulated_step_seconds"]
    return {
        "planned": planned, "first": first, "end": end, "stop": end + 1.0,
        "simulated": ([planned, end + 5.0], [simulated, simulated]),
        "actual": (scrapes, actual),
        "error": (scrapes, [simulated / a - 1.0 for a in actual]),
        "completed": (scrapes, done),
        "speedup": ([planned, end + 5.0], [report["predicted_speedup"]] * 2),
        "median": gauges["autopar_job_actual_step_seconds"],
        "search": sec["plan"],
        "job": f"{report['namespace']}/{report['job']}",
    }


def render(run: Path | str, out: Path | str) -> Path:
    run, out = Path(run), Path(out)
    s = series(run)
    panels = {p["id"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    grid_h = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels.values())
    fig = plt.figure(figsize=(12, 11), dpi=80)
    fig.suptitle(f"{json.loads(DASHBOARD.read_text())['title']}: job {s['job']}, a real `autopar run "
                 "examples/quickstart.yaml --local`", fontsize=11)
    gs = fig.add_gridspec(grid_h, 24, hspace=0.0, wspace=2.0, top=0.97, bottom=0.04, left=0.06, right=0.98)
    job, x_end = s["job"], s["stop"]

    def axis(pid: int):
        g = panels[pid]["gridPos"]
        # the top two rows of a panel hold its title and the tick labels of the panel above
        ax = fig.add_subplot(gs[g["y"] + 2:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        ax.set_title(panels[pid]["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        return ax

    def timeline(ax, whole: bool = False):
        """Seconds since the run started; the panels of the training zoom in on it (the
        dashboard's time picker), the phases show the whole run (grey: profiling and planning)."""
        ax.set_xlim(0 if whole else s["first"] - 0.5, x_end)
        ax.axvspan(0, s["planned"], color="0.93", zorder=0)

    ax = axis(1)
    timeline(ax)
    ax.plot(*[[v * (1e3 if i else 1) for v in xs] for i, xs in enumerate(s["simulated"])], label=f"{job} simulated")
    ax.plot(s["actual"][0], [v * 1e3 for v in s["actual"][1]], marker="o", ms=3, label=f"{job} actual")
    ax.axhline(s["median"] * 1e3, color="C1", ls=":", lw=1, label=f"median of the run {s['median'] * 1e3:.1f} ms")
    ax.set_ylabel("ms", fontsize=7)
    ax.legend(fontsize=7, loc="upper right")

    ax = axis(2)
    timeline(ax)
    ax.plot(s["error"][0], [100 * v for v in s["error"][1]], marker="o", ms=3, color="C3", label=job)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_ylabel("%", fontsize=7)
    ax.legend(fontsize=7, loc="lower left")

    ax = axis(3)
    timeline(ax)
    ax.step(s["completed"][0], s["completed"][1], where="post", marker="o", ms=3, label=job)
    ax.legend(fontsize=7, loc="upper left")

    ax = axis(4)
    timeline(ax)
    ax.plot(*s["speedup"], color="C2", label=job)
    ax.set_ylim(0.9, max(1.5, s["speedup"][1][0] + 0.2))
    ax.legend(fontsize=7, loc="lower left")

    for pid in (5, 6):
        ax = axis(pid)
        ax.axis("off")
        ax.text(0.5, 0.4, "0", fontsize=28, ha="center", va="center", color="C2")
        ax.text(0.5, 0.05, job, fontsize=7, ha="center")

    ax = axis(7)
    timeline(ax, whole=True)
    for phase, (a, b) in {"Planning": (0, s["planned"]), "Training": (s["planned"], s["end"]),
                          "Succeeded": (s["end"], x_end)}.items():
        ax.plot([a, b], [1, 1], lw=6, solid_capstyle="butt", label=phase)
    ax.set_ylim(0, 1.5)
    ax.set_xlabel("s since the run started (the other panels: its last seconds)", fontsize=7)
    ax.legend(fontsize=7, loc="lower left", ncol=3)

    ax = axis(8)
    ax.bar(["p50", "p90"], [s["search"], s["search"]], color=["C0", "C1"])
    ax.set_ylabel("s", fontsize=7)
    ax.text(0.5, s["search"] * 0.5, f"one search: {s['search']:.1f} s", ha="center", fontsize=8)

    ax = axis(9)
    ax.axis("off")
    ax.text(0.5, 0.5, "no data (a local run has no operator)", ha="center", va="center", fontsize=9, color="0.4")

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(render(*sys.argv[1:3]) if len(sys.argv) >= 3 else
          render(ROOT / "docs" / "img" / "quickstart-run", ROOT / "docs" / "img" / "dashboard.png"))
