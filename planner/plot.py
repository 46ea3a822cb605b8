"""Pictures of a strategy and of its simulated step (``--plot FILE.png`` on plan and simulate).

    plot_strategy("plan.png", graph, topology, strategy, timeline, task_graph)

Two panels in one PNG:

* **Strategy** in the style of FlexFlow's Figures 13–14: every op is a small square cut into its
  partition grid — rows are the sample dimension's degree, columns the product of the other
  dimensions' degrees — and each cell has the colour of the device its task runs on.  Ops are laid
  out by *layer*: one row per layer (the ops that share parameters, like Figure 14's grey boxes,
  or the ops one line of model code creates, like the steps of an unrolled loop or the repeated
  blocks of a ResNet), one column per occurrence, rows in graph order.  An NMT of 650 ops becomes a
  ~30 x 40 grid instead of a 650-node graph.
* **Timeline** of the simulated step: one row per device and per busy link (the busiest when
  there are many), a bar per task coloured by kind (forward, backward, transfer,
  synchronization, update).
"""

from __future__ import annotations

import re
from pathlib import Path

from .hardware.topology import DeviceTopology
from .ir.graph import DimKind, Op, OperatorGraph
from .ir.strategy import Strategy

MAX_LINK_ROWS = 24
_KIND_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "comm": "#55A868", "sync": "#8172B3",
                "update": "#C44E52", "compute": "#937860"}


def plot_strategy(path: str | Path, graph: OperatorGraph, topology: DeviceTopology, strategy: Strategy,
                  timeline=None, task_graph=None, *, builder=None, title: str | None = None) -> Path:
    """Write the strategy picture and the timeline of its simulated step to `path` (PNG).

    Pass the `timeline` and `task_graph` of a simulation already done (`simulate_strategy`),
    or let this function simulate (with `builder`, or a default analytic cost model)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if timeline is None or task_graph is None:
        from .cost.model import CostModel
        from .sim.evaluate import simulate_strategy
        from .sim.taskgraph import TaskGraphBuilder
        builder = builder if builder is not None else TaskGraphBuilder(graph, topology, CostModel())
        _, timeline, task_graph = simulate_strategy(builder, strategy)
    rows, labels = _layers(graph)
    ncols = max((len(r) for r in rows), default=1)
    res_rows = _timeline_rows(topology, timeline, task_graph)
    width = min(40.0, max(12.0, 0.32 * ncols + 4.0))
    h_top = max(2.5, 0.32 * len(rows) + 1.2)
    h_bottom = max(2.0, 0.22 * len(res_rows) + 1.0)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(width, h_top + h_bottom),
                                   gridspec_kw={"height_ratios": [h_top, h_bottom]})
    colors = _device_colors(topology)
    _draw_strategy(ax1, graph, strategy, rows, labels, colors)
    _draw_legend(fig, ax1, topology, colors)
    _draw_timeline(ax2, topology, timeline, task_graph, res_rows)
    fig.suptitle(title or f"{graph.name} on {topology.name}: {strategy.name}, simulated step "
                 f"{timeline.makespan * 1e3:.3f} ms", fontsize=12)
    fig.tight_layout(rect=(0, 0, 0.93, 0.97))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- layout ------------------------------------------------------------------------------------

def _layer_key(graph: OperatorGraph, op: Op) -> tuple[str, str]:
    if op.params:
        first = min(graph.param_users[p.name][0] for p in op.params)
        module = op.params[0].name.rsplit(".", 1)[0]
        return ("param", first), module
    if op.source:
        where = op.source.rsplit("/", 1)[-1]
        return ("source", f"{op.source}:{op.kind}"), f"{op.kind} @ {where}"
    return ("op", op.name), op.name


def _layers(graph: OperatorGraph) -> tuple[list[list[Op]], list[str]]:
    rows: dict[tuple, list[Op]] = {}
    labels: dict[tuple, str] = {}
    for op in graph.ops:
        key, label = _layer_key(graph, op)
        rows.setdefault(key, []).append(op)
        labels.setdefault(key, label)
    keys = list(rows)
    return [rows[k] for k in keys], [_short(labels[k]) + (f" ×{len(rows[k])}" if len(rows[k]) > 1 else "")
                                      for k in keys]


def _short(label: str, limit: int = 34) -> str:
    label = re.sub(r"\s+", " ", label)
    return label if len(label) <= limit else "…" + label[-(limit - 1):]


def _grid(op: Op, degrees: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the partition picture: sample degree down, the rest across."""
    down, across = 1, 1
    for p, d in zip(op.pardims, degrees):
        if p.kind is DimKind.SAMPLE:
            down *= d
        else:
            across *= d
    return down, across


def _device_colors(topology: DeviceTopology) -> list:
    """A colour per device: a qualitative palette up to 20 devices; beyond, a hue per node and a
    shade per GPU inside it, so that a node's devices read as one family."""
    import matplotlib
    n = topology.num_devices
    if n <= 20:
        cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
        return [cmap(i) for i in range(n)]
    cmap = matplotlib.colormaps["turbo"]
    nodes = list(topology.nodes)
    out = []
    for d in topology.devices:
        node = nodes.index(d.node)
        members = topology.devices_by_node[d.node]
        r, g, b, _ = cmap(0.05 + 0.9 * node / max(1, len(nodes) - 1))
        mix = 0.45 * members.index(d.id) / max(1, len(members) - 1)  # lighter for later GPUs
        out.append((r + (1 - r) * mix, g + (1 - g) * mix, b + (1 - b) * mix, 1.0))
    return out


def _draw_strategy(ax, graph, strategy, rows, labels, colors) -> None:
    from matplotlib.patches import Rectangle

    size = 0.8
    for r, ops in enumerate(rows):
        y0 = len(rows) - 1 - r
        for c, op in enumerate(ops):
            cfg = strategy[op.name]
            down, across = _grid(op, cfg.degrees)
            # Task t's cell: its sample coordinate picks the row, the rest the column.
            sample_axes = [i for i, p in enumerate(op.pardims) if p.kind is DimKind.SAMPLE]
            for t, coord in enumerate(cfg.coords()):
                srow = 0
                col = 0
                for i, (p, d) in enumerate(zip(op.pardims, cfg.degrees)):
                    if i in sample_axes:
                        srow = srow * d + coord[i]
                    else:
                        col = col * d + coord[i]
                w, h = size / across, size / down
                ax.add_patch(Rectangle((c + col * w, y0 + (down - 1 - srow) * h), w, h,
                                       facecolor=colors[cfg.devices[t]], edgecolor="white", linewidth=0.3))
            ax.add_patch(Rectangle((c, y0), size, size, fill=False, edgecolor="#333333", linewidth=0.6))
    ax.set_xlim(-0.2, max(3, max((len(r) for r in rows), default=1)))
    ax.set_ylim(-0.2, len(rows))
    ax.set_yticks([len(rows) - 1 - r + size / 2 for r in range(len(rows))])
    ax.set_yticklabels(labels, fontsize=7)
    ncols = max((len(r) for r in rows), default=1)
    step = max(1, ncols // 20)
    ax.set_xticks([c + size / 2 for c in range(0, ncols, step)])
    ax.set_xticklabels([str(c) for c in range(0, ncols, step)], fontsize=7)
    ax.set_xlabel("occurrence in the layer (unrolled step, repeated block)", fontsize=8)
    ax.set_title("strategy: each op's partition grid\n(down: sample degree; across: other dims), colour = device",
                 fontsize=9)
    ax.set_aspect("equal", adjustable="box")  # square ops, like the paper's figures
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_legend(fig, ax, topology, colors) -> None:
    from matplotlib.patches import Patch

    n = topology.num_devices
    if n <= 20:
        handles = [Patch(facecolor=colors[d], label=f"{d}: {topology.devices[d].name}") for d in range(n)]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
                  title="device", title_fontsize=8)
    else:
        nodes = list(topology.nodes)
        step = max(1, len(nodes) // 16)
        handles = [Patch(facecolor=colors[topology.devices_by_node[nd][0]],
                         label=f"{nd}: devices {topology.devices_by_node[nd][0]}-{topology.devices_by_node[nd][-1]}")
                   for nd in nodes[::step]]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
                  title="node (lighter: later GPU)", title_fontsize=8)


# -- timeline ----------------------------------------------------------------------------------

def _timeline_rows(topology, timeline, task_graph) -> list[int]:
    n = topology.num_devices
    busy = timeline.busy()
    # Links are resources n..n+L-1 (planner.sim.taskgraph); anything else is the simulator's own.
    links = sorted((r for r in busy if n <= r < n + len(topology.links)), key=lambda r: -busy[r])[:MAX_LINK_ROWS]
    return [d for d in range(n) if busy.get(d, 0.0) > 0] + sorted(links)


def _draw_timeline(ax, topology, timeline, task_graph, res_rows) -> None:
    n = topology.num_devices
    scale = 1e3  # ms
    for y, r in enumerate(res_rows):
        bars: dict[str, list[tuple[float, float]]] = {}
        for key, s, e in timeline.spans(r):
            info = task_graph.task(key)
            kind = "sync" if info.kind == "comm" and key[0] == 2 else info.kind
            bars.setdefault(kind, []).append((s * scale, (e - s) * scale))
        for kind, spans in bars.items():
            ax.broken_barh(spans, (len(res_rows) - 1 - y + 0.1, 0.8), facecolors=_KIND_COLORS.get(kind, "#999999"),
                           linewidth=0)
    labels = []
    for r in res_rows:
        if r < n:
            labels.append(f"dev {r} {topology.devices[r].name}")
        else:
            labels.append(_short(topology.links[r - n].label, 30))
    ax.set_yticks([len(res_rows) - 1 - y + 0.5 for y in range(len(res_rows))])
    ax.set_yticklabels(labels, fontsize=6 if len(res_rows) > 40 else 7)
    ax.set_xlim(0, timeline.makespan * scale * 1.01)
    ax.set_ylim(0, len(res_rows))
    ax.set_xlabel("time in the simulated step (ms)", fontsize=8)
    shown_devices = sum(1 for r in res_rows if r < n)
    hidden = len([r for r in timeline.busy() if n <= r < n + len(topology.links)]) - (len(res_rows) - shown_devices)
    notes = []
    if shown_devices < n:
        notes.append(f"{n - shown_devices} idle devices")
    if hidden > 0:
        notes.append(f"{hidden} less busy links")
    ax.set_title("timeline per device and link" + (f" ({' and '.join(notes)} not shown)" if notes else ""), fontsize=9)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor=c, label=k) for k, c in _KIND_COLORS.items() if k != "compute"],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
