"""The cost tables of OptCNN's cost model (OptCNN sec. 5.1, eq. 1), computed in bulk with numpy.

OptCNN estimates a step as the sum, with no overlap between layers, of

* ``t_c(v, c)`` — compute: forward plus backward time of one task of layer v under configuration
  c (partitions are equal, so every task takes as long; on mixed devices the slowest counts);
* ``t_s(v, c)`` — parameter synchronization: the gradients of every parameter shard are reduced
  over the tasks that hold a copy of it, and the optimizer updates it.  The paper's parameter
  server moves the same volume as the ring all-reduce the simulator models, ``2 (r-1)/r`` times
  the shard per replica, so we charge that over the slowest link of the ring plus ``2 (r-1)``
  latencies; shard groups synchronize in parallel;
* ``t_x(e, c_src, c_dst)`` — transfers: every piece of the tensor a consumer task needs that a
  producer task on another device holds (region intersections, halos included) moves over the
  route between them; devices receive in parallel, so the cost is the largest total any one
  consumer task receives (bytes over route bandwidth plus one route latency per message),
  twice: activations forward, gradients backward.

Configurations are `strategy.enumerate_configs` (degrees times aligned device blocks).  A table of
transfers between two ops is computed for all configuration pairs at once: every *row* is one task
of one configuration (its device and its grid coordinates), boxes are computed per row with
vectorised `AxisMap` arithmetic, and the per-pair volumes are a product of per-axis overlaps.
Identical edges (same shapes, dims and maps, as in repeated blocks) share one table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.model import CostModel, graph_input_shapes
from ..hardware.topology import DeviceTopology
from ..ir.graph import AxisMap, Op, OperatorGraph
from ..ir.strategy import ParallelConfig, enumerate_configs


def optcnn_configs(op: Op, num_devices: int, max_tasks: int | None, placements: str = "aligned") -> list[ParallelConfig]:
    """`enumerate_configs` — every aligned block (``placements="aligned"``) or only the first
    block, devices 0..k-1 (``"first"``: the OptCNN paper's configurations are degrees alone).

    With `max_tasks`, configurations are kept in order of preference until their tasks add up to
    `max_tasks` (the tables grow with the square of that sum): the whole op and data parallelism
    always; then configurations on the first block before others (under a no-overlap cost model
    another block only moves the same work), fewer partitioned dimensions before more, and, among
    those, splits of the sample and parameter dimensions before attribute ones.
    """
    cfgs = enumerate_configs(op, num_devices)
    if placements == "first":
        cfgs = [c for c in cfgs if c.devices[0] == 0]
    elif placements != "aligned":
        raise ValueError(f"placements must be 'aligned' or 'first', got {placements!r}")
    if max_tasks is None or sum(c.num_tasks for c in cfgs) <= max_tasks:
        return cfgs
    kinds = [p.kind.value for p in op.pardims]

    def key(c: ParallelConfig):
        parts = [i for i, d in enumerate(c.degrees) if d > 1]
        essential = not parts or (len(parts) == 1 and kinds[parts[0]] == "sample" and c.devices[0] == 0)
        attr = sum(1 for i in parts if kinds[i] == "attribute")
        return (not essential, c.devices[0] != 0, len(parts), attr, -c.num_tasks, c.degrees, c.devices[0])

    keep, used = [], 0
    for c in sorted(cfgs, key=key):
        if used + c.num_tasks > max_tasks and keep and key(c)[0]:
            continue
        keep.append(c)
        used += c.num_tasks
    order = {c: i for i, c in enumerate(cfgs)}
    return sorted(keep, key=order.__getitem__)


@dataclass
class OpRows:
    """Every task of every configuration of one op, as flat arrays."""

    configs: list[ParallelConfig]
    cfg: np.ndarray      # (R,) configuration index of each row
    dev: np.ndarray      # (R,) device of each row
    coord: np.ndarray    # (R, len(pardims)) grid coordinate of each row
    degree: np.ndarray   # (R, len(pardims)) degrees of the row's configuration
    starts: np.ndarray   # (C,) first row of each configuration (rows are grouped by configuration)


def build_rows(op: Op, configs: list[ParallelConfig]) -> OpRows:
    nd = len(op.pardims)
    cfg_ix, devs, coords, degs, starts = [], [], [], [], []
    row = 0
    grids: dict[tuple[int, ...], np.ndarray] = {}
    for i, c in enumerate(configs):
        g = grids.get(c.degrees)
        if g is None:
            g = np.indices(c.degrees).reshape(nd, -1).T if nd else np.zeros((1, 0), dtype=int)
            grids[c.degrees] = g
        k = len(g)
        starts.append(row)
        cfg_ix.append(np.full(k, i))
        devs.append(np.asarray(c.devices))
        coords.append(g)
        degs.append(np.tile(np.asarray(c.degrees, dtype=int).reshape(1, nd), (k, 1)))
        row += k
    return OpRows(configs, np.concatenate(cfg_ix), np.concatenate(devs), np.concatenate(coords).reshape(row, nd),
                  np.concatenate(degs).reshape(row, nd), np.asarray(starts))


def _dim_ranges(op: Op, rows: OpRows, dim: str) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of parallel dim `dim` for every row."""
    for i, p in enumerate(op.pardims):
        if p.name == dim:
            step = p.size // rows.degree[:, i]
            lo = rows.coord[:, i] * step
            return lo, lo + step
    raise KeyError(dim)


def output_boxes(op: Op, rows: OpRows, k: int) -> tuple[np.ndarray, np.ndarray]:
    out = op.outputs[k]
    names = {p.name for p in op.pardims}
    R = len(rows.cfg)
    lo = np.zeros((R, len(out.shape)), dtype=np.int64)
    hi = np.tile(np.asarray(out.shape, dtype=np.int64), (R, 1))
    for a, d in enumerate(out.dims):
        if d in names:
            lo[:, a], hi[:, a] = _dim_ranges(op, rows, d)
    return lo, hi


def input_boxes(op: Op, rows: OpRows, j: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    R = len(rows.cfg)
    lo = np.zeros((R, len(shape)), dtype=np.int64)
    hi = np.zeros((R, len(shape)), dtype=np.int64)
    for a, (m, size) in enumerate(zip(op.input_maps[j], shape)):
        lo[:, a], hi[:, a] = _map_axis(m, op, rows, size)
    return lo, hi


def _map_axis(m: AxisMap, op: Op, rows: OpRows, size: int) -> tuple[np.ndarray, np.ndarray]:
    R = len(rows.cfg)
    if m.dim is None:
        return np.full(R, 0 if m.lo is None else m.lo), np.full(R, size if m.hi is None else m.hi)
    a0, b0 = _dim_ranges(op, rows, m.dim)
    a = a0 * m.stride - m.pad + m.shift
    b = (b0 - 1) * m.stride - m.pad + m.shift + (m.kernel - 1) * m.dilation + 1
    a, b = np.maximum(a, 0), np.minimum(b, size)
    return a, np.maximum(a, b)  # an empty range reads nothing


class Tables:
    """Node and edge costs of OptCNN's model for one (graph, topology, cost model)."""

    def __init__(self, graph: OperatorGraph, topology: DeviceTopology, cost: CostModel, max_tasks: int | None,
                 placements: str = "aligned"):
        self.graph, self.topology, self.cost = graph, topology, cost
        n = topology.num_devices
        self.num_devices = n
        inv = np.zeros((n, n))
        lat = np.zeros((n, n))
        for a in range(n):
            for b in range(n):
                if a != b:
                    inv[a, b] = 1.0 / topology.route_bandwidth(a, b)
                    lat[a, b] = topology.route_latency(a, b)
        self.inv_bw, self.lat = inv, lat
        self._inv32, self._lat32 = inv.astype(np.float32), lat.astype(np.float32)
        self.configs = {}
        self.thinned = 0
        for op in graph.ops:
            cfgs = optcnn_configs(op, n, max_tasks, placements)
            self.configs[op.name] = cfgs
            if max_tasks is not None and sum(c.num_tasks for c in cfgs) > max_tasks - n:
                self.thinned += 1
        self._rows: dict[str, OpRows] = {}
        self._edge_cache: dict[tuple, np.ndarray] = {}
        self._shard_cache: dict[tuple, list] = {}
        self._update_cache: dict[tuple, float] = {}
        self._ring_cache: dict[tuple, tuple[float, float]] = {}
        self.edge_tables_computed = 0

    def rows(self, op: Op) -> OpRows:
        r = self._rows.get(op.name)
        if r is None:
            r = self._rows[op.name] = build_rows(op, self.configs[op.name])
        return r

    # -- t_c ---------------------------------------------------------------------------------
    def compute(self, op: Op) -> np.ndarray:
        shapes = graph_input_shapes(self.graph, op)
        devices = self.topology.devices
        memo: dict[tuple, float] = {}
        out = np.empty(len(self.configs[op.name]))
        for i, c in enumerate(self.configs[op.name]):
            products = {(devices[d].product, devices[d].kind): d for d in c.devices}
            t = 0.0
            for d in products.values():
                key = (c.degrees, d)
                v = memo.get(key)
                if v is None:
                    v = memo[key] = self.cost.task_cost(op, c.degrees, devices[d], shapes).total
                t = max(t, v)
            out[i] = t
        return out

    # -- t_s ---------------------------------------------------------------------------------
    def sync(self, op: Op, params: list[int], share: float = 1.0) -> np.ndarray:
        """Synchronization and update time of `op`'s parameters `params` (indices into op.params),
        times `share` (a parameter shared with ops of other layers is charged in parts)."""
        out = np.zeros(len(self.configs[op.name]))
        if not params:
            return out
        device0 = self.topology.devices[0]
        for i, c in enumerate(self.configs[op.name]):
            total = 0.0
            for j in params:
                worst = 0.0
                for tasks, nbytes in self._shards(op, j, c.degrees):
                    devs = tuple(sorted({c.devices[t] for t in tasks}))
                    t_upd = self._update(nbytes, self.topology.devices[devs[0]] if devs else device0)
                    if len(devs) > 1:
                        t_upd += self._ring(devs, nbytes)
                    worst = max(worst, t_upd)
                total += worst
            out[i] = total * share
        return out

    def _shards(self, op: Op, j: int, degrees: tuple[int, ...]) -> list[tuple[list[int], float]]:
        """(tasks holding it, bytes) for every distinct shard of parameter j under `degrees`."""
        p = op.params[j]
        key = (p.view, p.maps, p.nbytes, op.pardims, degrees)
        hit = self._shard_cache.get(key)
        if hit is None:
            itemsize = p.nbytes // max(1, int(np.prod(p.shape)))
            groups: dict[tuple, list[int]] = {}
            for t, coord in enumerate(np.ndindex(*degrees) if degrees else [()]):
                box = op.param_box(j, op.task_ranges(degrees, coord))
                groups.setdefault(box, []).append(t)
            hit = [(tasks, float(np.prod([hi - lo for lo, hi in box])) * itemsize) for box, tasks in groups.items()]
            self._shard_cache[key] = hit
        return hit

    def _update(self, nbytes: float, device) -> float:
        key = (nbytes, device.product, device.kind)
        v = self._update_cache.get(key)
        if v is None:
            v = self._update_cache[key] = self.cost.update_time(nbytes, device)
        return v

    def _ring(self, devs: tuple[int, ...], nbytes: float) -> float:
        """Ring all-reduce of `nbytes` over `devs`: 2(r-1)/r of it over the slowest ring edge."""
        hit = self._ring_cache.get(devs)
        if hit is None:
            a = np.asarray(devs)
            b = np.roll(a, -1)
            hit = self._ring_cache[devs] = (float(self.inv_bw[a, b].max()), float(self.lat[a, b].max()))
        r = len(devs)
        return 2.0 * (r - 1) / r * nbytes * hit[0] + 2 * (r - 1) * hit[1]

    # -- t_x ---------------------------------------------------------------------------------
    def edge(self, producer: Op, k: int, consumer: Op, j: int) -> np.ndarray:
        """(C_producer, C_consumer) transfer times of output k of `producer` read as input j of `consumer`."""
        out = producer.outputs[k]
        key = (producer.pardims, out, consumer.pardims, consumer.input_maps[j],
               len(self.configs[producer.name]), len(self.configs[consumer.name]),
               self.configs[producer.name][0], self.configs[consumer.name][0])
        hit = self._edge_cache.get(key)
        if hit is not None:
            return hit
        self.edge_tables_computed += 1
        pr, cr = self.rows(producer), self.rows(consumer)
        plo, phi = output_boxes(producer, pr, k)
        clo, chi = input_boxes(consumer, cr, j, out.shape)
        vol = None
        scalar = float(out.itemsize)
        for a in range(len(out.shape)):
            p_whole = (plo[:, a] == 0).all() and (phi[:, a] == out.shape[a]).all()
            if p_whole and (clo[:, a] == clo[0, a]).all() and (chi[:, a] == chi[0, a]).all():
                scalar *= float(chi[0, a] - clo[0, a])  # every task pair overlaps the same way
                continue
            if p_whole:
                # The producer holds the whole axis: the overlap is the consumer's range.
                ov = np.broadcast_to((chi[:, a] - clo[:, a]).astype(np.float32)[None, :], (len(pr.cfg), len(cr.cfg)))
            else:
                ov = (np.minimum(phi[:, a, None], chi[None, :, a]) - np.maximum(plo[:, a, None], clo[None, :, a]))
                ov = np.maximum(ov, 0).astype(np.float32)
            vol = ov.copy() if vol is None else np.multiply(vol, ov, out=vol)
        if vol is None:
            vol = np.ones((len(pr.cfg), len(cr.cfg)), dtype=np.float32)
        vol *= scalar
        # The diagonal of inv_bw and lat is zero: pieces that stay on a device cost nothing.
        pairs = pr.dev[:, None] * self.num_devices + cr.dev[None, :]
        t = vol * self._inv32.ravel()[pairs]
        t += (vol > 0) * self._lat32.ravel()[pairs]
        incoming = np.add.reduceat(t, pr.starts, axis=0)
        table = 2.0 * np.maximum.reduceat(incoming, cr.starts, axis=1).astype(float)
        self._edge_cache[key] = table
        return table
