"""Pictures of a strategy and of its simulated step (``--plot FILE.png`` on plan and simulate).

    plot_strategy("plan.png", graph, topology, strategy, timeline, task_graph)

Two panels in one PNG of bounded size (at most `MAX_FIG_INCHES` at `DPI`, whatever the op count):

* **Timeline** of the simulated step, first: one row per device and per busy link (the busiest
  when there are many), a bar per task coloured by kind (forward, backward, transfer,
  synchronization, update).
* **Strategy**, per op while that stays readable, in the style of FlexFlow's Figures 13–14: every
  op is a small square cut into its partition grid — rows are the sample dimension's degree,
  columns the product of the other dimensions' degrees — and each cell has the colour of the
  device its task runs on.  Ops are laid out by *layer*: one row per layer (the ops that share
  parameters, like Figure 14's grey boxes, or the ops one line of model code creates, like the
  steps of an unrolled loop), one column per occurrence.  An NMT of 650 ops becomes a 25 x 40
  grid.  A graph whose grid would not fit (`SMALL_GRAPH_OPS`, `GRID_MAX_ROWS`, `GRID_MAX_COLS`:
  Inception-v3's 317 ops make 210 layers) is drawn **by module** instead: consecutive ops under
  one module path (``Mixed_5b.branch1x1.conv`` → ``Mixed_5b``) make one row, a strip of the
  devices with the share of the group's work each one runs, and the group's commonest degrees.
  The per-task detail of such a graph is in the trace (``autopar simulate --trace``).
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import groupby
from pathlib import Path

from .fileio import atomic_write
from .hardware import DeviceTopology
from .ir import DimKind, Op, OperatorGraph, Strategy

MAX_LINK_ROWS = 24
#: Per-op squares for graphs up to this many ops, or whose layer grid fits these rows and columns.
SMALL_GRAPH_OPS = 60
GRID_MAX_ROWS, GRID_MAX_COLS = 40, 48
#: The most rows of the by-module panel; module paths are cut shorter until the groups fit.
MAX_GROUP_ROWS = 48
DPI = 100
FIG_WIDTH = 16.0
MAX_FIG_INCHES = (24.0, 18.0)  # 2400 x 1800 pixels at DPI
_KIND_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "comm": "#55A868", "sync": "#8172B3",
                "update": "#C44E52", "compute": "#937860"}


def plot_strategy(path: str | Path, graph: OperatorGraph, topology: DeviceTopology, strategy: Strategy,
                  timeline=None, task_graph=None, *, builder=None, title: str | None = None) -> Path:
    """Write the timeline of the simulated step and the strategy picture to `path` (PNG, atomically).

    Pass the `timeline` and `task_graph` of a simulation already done (`simulate_strategy`),
    or let this function simulate (with `builder`, or a default analytic cost model)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if timeline is None or task_graph is None:
        from .cost import CostModel
        from .sim import TaskGraphBuilder, simulate_strategy
        builder = builder if builder is not None else TaskGraphBuilder(graph, topology, CostModel())
        _, timeline, task_graph = simulate_strategy(builder, strategy)
    res_rows = _timeline_rows(topology, timeline, task_graph)
    rows, labels = _layers(graph)
    groups = None if _per_op(graph, rows) else _module_groups(graph)
    h_time, h_strat = _panel_heights(len(res_rows), len(rows) if groups is None else len(groups))
    fig, (ax_time, ax_strat) = plt.subplots(2, 1, figsize=(FIG_WIDTH, h_time + h_strat + 0.8),
                                            gridspec_kw={"height_ratios": [h_time, h_strat]})
    _draw_timeline(ax_time, topology, timeline, task_graph, res_rows)
    if groups is None:
        colors = _device_colors(topology)
        _draw_strategy(ax_strat, graph, strategy, rows, labels, colors)
        _draw_legend(fig, ax_strat, topology, colors)
    else:
        _draw_groups(ax_strat, topology, strategy, groups)
    fig.suptitle(title or f"{graph.name} on {topology.name}: {strategy.name}, simulated step "
                 f"{timeline.makespan * 1e3:.3f} ms", fontsize=12)
    fig.tight_layout(rect=(0, 0, 0.93, 0.97))
    try:
        return atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=DPI), binary=True)
    finally:
        plt.close(fig)


def _panel_heights(timeline_rows: int, strategy_rows: int) -> tuple[float, float]:
    """Inches of the two panels: a fixed share per row, clamped so that the figure with its
    title stays within `MAX_FIG_INCHES` however many rows there are (rows get thinner)."""
    h_time = min(7.5, max(2.2, 0.18 * timeline_rows + 1.3))
    h_strat = min(MAX_FIG_INCHES[1] - 0.8 - h_time, max(2.5, 0.3 * strategy_rows + 1.6))
    return h_time, h_strat


def _per_op(graph: OperatorGraph, rows: list[list[Op]]) -> bool:
    """Whether the per-op layer grid reads at a glance: a small graph, or a compact grid (an
    unrolled RNN's layers × steps)."""
    ncols = max((len(r) for r in rows), default=1)
    return len(graph.ops) <= SMALL_GRAPH_OPS or (len(rows) <= GRID_MAX_ROWS and ncols <= GRID_MAX_COLS)


# -- per op: the layer grid ------------------------------------------------------------------------

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


# -- by module -------------------------------------------------------------------------------

def _module_path(op: Op) -> str | None:
    """The module path torch.fx gives the op (the target ``"nn.Conv2d Mixed_5b.branch1x1.conv"``
    of a module call, `planner.ir.fx_import`), else the module of its first parameter."""
    words = op.target.split(" ")
    if len(words) == 2 and words[1]:
        return words[1]
    return op.params[0].name.rsplit(".", 1)[0] if op.params else None


def _op_paths(graph: OperatorGraph) -> list[str]:
    """A module path per op; a function call (``torch.cat`` in a block's forward) takes the path
    of the op before it, an input its own name."""
    paths: list[str] = []
    for op in graph.ops:
        path = _module_path(op)
        if path is None:
            path = paths[-1] if paths and op.kind != "input" else op.name
        paths.append(path)
    return paths


def _module_groups(graph: OperatorGraph, max_rows: int = MAX_GROUP_ROWS) -> list[tuple[str, list[Op]]]:
    """Runs of consecutive ops that share the first parts of their module path, as (path, ops):
    the longest prefix (at most 3 parts) that gives at most `max_rows` runs; when even the first
    part gives more, neighbouring runs are merged into `max_rows` rows."""
    paths = _op_paths(graph)
    for depth in range(min(3, max(p.count(".") + 1 for p in paths)), 0, -1):
        keys = [".".join(p.split(".")[:depth]) for p in paths]
        runs, i = [], 0
        for key, members in groupby(keys):
            n = len(list(members))
            runs.append((key, list(graph.ops[i:i + n])))
            i += n
        if len(runs) <= max_rows:
            return runs
    step = -(-len(runs) // max_rows)
    return [(f"{part[0][0]} … {part[-1][0]}" if len(part) > 1 else part[0][0], [op for _, ops in part for op in ops])
            for part in (runs[j:j + step] for j in range(0, len(runs), step))]


def _occupancy(ops: list[Op], strategy: Strategy, num_devices: int) -> list[float]:
    """Share of the group's work each device runs: an op's FLOPs (forward and backward) split
    evenly over its tasks, or its tasks counted when the group has no FLOPs."""
    flops = sum(op.flops_fwd + op.flops_bwd for op in ops)
    share = [0.0] * num_devices
    for op in ops:
        cfg = strategy[op.name]
        work = (op.flops_fwd + op.flops_bwd if flops > 0 else 1.0) / len(cfg.devices)
        for d in cfg.devices:
            share[d] += work
    total = sum(share) or 1.0
    return [w / total for w in share]


def _degree_summary(ops: list[Op], strategy: Strategy, top: int = 2) -> str:
    """The group's commonest partitions with their op counts, like ``n4 (12), n2·c2 (3), +1 more``."""
    counts = Counter("·".join(f"{p.name}{d}" for p, d in zip(op.pardims, strategy[op.name].degrees) if d > 1)
                     or "whole" for op in ops)
    parts = [f"{grid} ({n})" if n > 1 else grid for grid, n in counts.most_common(top)]
    return ", ".join(parts) + (f", +{len(counts) - top} more" if len(counts) > top else "")


def _group_label(key: str, ops: list[Op]) -> str:
    return _short(key if len(ops) == 1 else f"{key} ({len(ops)} ops)", 40)


def _draw_groups(ax, topology: DeviceTopology, strategy: Strategy, groups: list[tuple[str, list[Op]]]) -> None:
    """One row per group: the share of its work on each device (columns), darkest on the group's
    busiest device; its commonest partitions on the right."""
    import numpy as np
    from matplotlib import colormaps

    n = topology.num_devices
    share = np.array([_occupancy(ops, strategy, n) for _, ops in groups])
    rel = share / np.maximum(share.max(axis=1, keepdims=True), 1e-30)
    ax.imshow(np.ma.masked_equal(rel, 0.0), aspect="auto", cmap=colormaps["Blues"].with_extremes(bad="white"),
              vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([_group_label(key, ops) for key, ops in groups], fontsize=7)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(range(len(groups)))
    right.set_yticklabels([_degree_summary(ops, strategy) for _, ops in groups], fontsize=7)
    right.set_ylabel("commonest partitions (ops)", fontsize=8)
    _device_columns(ax, topology)
    ops = sum(len(g) for _, g in groups)
    ax.set_title(f"strategy by module: {ops} ops in {len(groups)} runs of one module path — shade: the share of "
                 "the run's FLOPs a device runs, relative to its busiest device\n"
                 "(per-task detail: autopar simulate --trace)", fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
        right.spines[side].set_visible(False)


def _device_columns(ax, topology: DeviceTopology) -> None:
    """Label the columns of the by-module panel with device ids (at most 32 labels) and mark
    where one node's devices end and the next node's begin."""
    n = topology.num_devices
    step = max(1, n // 32)
    ax.set_xticks(range(0, n, step))
    ax.set_xticklabels([str(d) for d in range(0, n, step)], fontsize=7)
    ax.set_xticks([d - 0.5 for d in range(n + 1)], minor=True)
    ax.grid(which="minor", axis="x", color="#e0e0e0", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    for members in topology.devices_by_node.values():
        if members and max(members) < n - 1:
            ax.axvline(max(members) + 0.5, color="#E69F00", linewidth=1.5)
    ax.set_xlabel("device (as in the timeline's rows; orange lines between nodes)", fontsize=8)

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
    step = -(-len(res_rows) // 48)  # every row labelled up to 48 rows, then every step-th
    ax.set_yticks([len(res_rows) - 1 - y + 0.5 for y in range(0, len(res_rows), step)])
    ax.set_yticklabels(labels[::step], fontsize=6 if len(res_rows) > 40 else 7)
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
    hidden_note = f" ({' and '.join(notes)} not shown)" if notes else ""
    ax.set_title("simulated step: timeline per device and link" + hidden_note, fontsize=9)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor=c, label=k) for k, c in _KIND_COLORS.items() if k != "compute"],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
