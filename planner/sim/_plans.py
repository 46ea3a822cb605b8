"""The tasks and edges of one task group, computed once per configuration (FlexFlow sec. 5.1).

`TaskGraphBuilder` builds a task graph group by group: an op's compute tasks (decided by its
configuration), the transfers of one input edge (by the consumer's and the producer's
configurations), the synchronization and updates of one parameter (by its users'
configurations).  A group's tasks and edges are a pure function of those configurations — keys
come from op and task indices, durations from the cost model's memoized estimates and the fixed
topology — so the builder computes each group once as a *plan*: the tasks as ``(key, resource,
duration, kind, nbytes, label)`` tuples, the edges as key pairs and the keys:
``(tasks, edges, keys)``, and for a parameter a fourth item, the parts it is made of
(`param_plan`).  A plan is added with one `add_tasks` and one `add_edges` call (`planner.sim._bulk`), and kept:
a full simulation of a strategy that differs from earlier ones in a few ops (what a search
produces) rebuilds every other group from its plan, and a search that proposes a configuration
again finds its groups ready.  The memo is bounded by the tasks and edges it holds.

Within a group, tasks are added before edges; the order of tasks decides their ids, which no
timing depends on (ties are broken by key).
"""

from __future__ import annotations

from itertools import chain, count, repeat

from ..ir.regions import Box, cells, union_volume, volume
from ._layout import MAX_PARTS

#: Free ops (graph inputs, views) cost nothing in the cost model; their tasks still take this long
#: because the simulator's FIFO order, and so delta simulation's exactness, need every task to take
#: time (see `planner.sim.simulator`).  A nanosecond changes no step time visibly.
MIN_TASK_SECONDS = 1e-9

#: Barrier tasks of parameter synchronization run on virtual resources numbered from here, far
#: above any device or link index.
_VIRTUAL_RESOURCE_BASE = 1 << 40
_LAST = 1 << 30

#: A transfer smaller than this still costs its latency; below it we do not bother modelling it
#: as a separate message (scalars such as partial losses).
_MIN_TRANSFER_BYTES = 1.0

#: Tasks plus edges the plan memo holds before it starts over (about 100 bytes each; a task
#: graph of 10^5 tasks has some 5 * 10^5 tasks and edges).
PLAN_MEMO_ITEMS = 3_000_000


def fwd_key(i: int, t: int) -> tuple:
    return (0, i, 0, t)


def bwd_key(n_ops: int, i: int, t: int) -> tuple:
    # Backward keys count ops from the end: on a tie, later ops' gradients go first, as in a
    # backward pass issued in reverse program order.
    return (1, n_ops - i, 0, t)


class PlanMemo:
    """Plans by (group, configurations), bounded by the tasks and edges they hold in total."""

    __slots__ = ("_plans", "_items", "limit")

    def __init__(self, limit: int = PLAN_MEMO_ITEMS) -> None:
        self._plans: dict = {}
        self._items = 0
        self.limit = limit

    def get(self, key):
        return self._plans.get(key)

    def put(self, key, plan: tuple) -> tuple:
        size = len(plan[0]) + len(plan[1])
        if self._items + size > self.limit:
            self._plans.clear()  # a search keeps revisiting recent configurations: start over
            self._items = 0
        self._plans[key] = plan
        self._items += size
        return plan

    def forget(self, keys) -> None:
        """Drop these plans (absent ones are ignored); `autopar bench simulator` uses it so a timed
        full build does not find the plans the delta path just computed."""
        for key in keys:
            plan = self._plans.pop(key, None)
            if plan is not None:
                self._items -= len(plan[0]) + len(plan[1])

    def keys(self) -> set:
        return set(self._plans)

    def __len__(self) -> int:
        return len(self._plans)


def op_plan(b, i: int, op, cfg) -> tuple:
    """(tasks, edges, keys) of op `i`'s forward and backward tasks under `cfg`."""
    device = b.topology.devices
    shapes = b._in_shapes[op.name]
    task_cost = b.cost.task_cost
    degrees = cfg.degrees
    back = b.num_ops - i
    name = op.name
    est_on: dict = {}
    tasks, edges, keys = [], [], []
    for t, dev in enumerate(cfg.devices):
        est = est_on.get(dev)
        if est is None:
            est = est_on[dev] = task_cost(op, degrees, device[dev], shapes)
        fk, bk = (0, i, 0, t), (1, back, 0, t)
        tasks.append((fk, dev, max(est.forward, MIN_TASK_SECONDS), "forward", 0.0, name))
        tasks.append((bk, dev, max(est.backward, MIN_TASK_SECONDS), "backward", 0.0, name))
        edges.append((fk, bk))
        keys += (fk, bk)
    return tasks, edges, tuple(keys)


def route_columns(latency: float, hops: tuple) -> tuple:
    """A route as the plans read it: (latency, link resources, bandwidths, labels, one), where
    `one` is the (resource, label) of the transfer's one task when the route has at most
    `MAX_PARTS` links — its link, or the tuple of them with label "first device->last device" —
    and None for a longer route (`_hop_tasks` cuts it into several tasks)."""
    res, bws, labels = zip(*hops) if hops else ((), (), ())
    k = len(res)
    if k == 1:
        one = (res[0], labels[0])
    elif 1 < k <= MAX_PARTS:
        one = (res, labels[0].split("->")[0] + "->" + labels[-1].split("->")[-1])
    else:
        one = None
    return float(latency), res, bws, labels, one


def _one_task(key: tuple, latency: float, route: tuple, nbytes: float) -> tuple:
    """The task of a transfer over a route of at most `MAX_PARTS` links (`route_columns`): each
    link busy for ``latency + bytes / bandwidth``."""
    _, _, bws, _, (res, label) = route
    if type(res) is int:
        return key, res, latency + nbytes / bws[0], "comm", nbytes, label
    return key, res, tuple(map(latency.__add__, map(nbytes.__truediv__, bws))), "comm", nbytes, label


def _hop_tasks(tasks: list, base: tuple, latency: float, route: tuple, nbytes: float) -> list:
    """The link tasks of one transfer over `route` (`route_columns`); returns their keys.  A
    transfer occupies every link of its route, each for ``latency + bytes / bandwidth``, all
    from the producer's end on and queueing FIFO on each link with its other traffic; the
    consumer waits for every link.  That is one task with a part per link (`TaskGraph` tasks
    with parts), keyed ``base + (0,)``; a route longer than `MAX_PARTS` links is cut into tasks
    ``base + (c,)`` of up to `MAX_PARTS` parts, which times the same (they are ready together
    and adjacent in (ready, key) order, see `planner.sim.simulator`).  A route of one link gives a
    task on that link.  Only the first task carries the bytes moved."""
    _, res, bws, labels, one = route
    if one is not None:
        key = base + (0,)
        tasks.append(_one_task(key, latency, route, nbytes))
        return [key]
    keys = []
    k = len(res)
    for c, lo in enumerate(range(0, k, MAX_PARTS)):
        hi = min(lo + MAX_PARTS, k)
        key = base + (c,)
        nb = nbytes if c == 0 else 0.0
        label = labels[lo].split("->")[0] + "->" + labels[hi - 1].split("->")[-1]
        if hi - lo == 1:
            tasks.append((key, res[lo], latency + nbytes / bws[lo], "comm", nb, label))
        else:
            tasks.append((key, res[lo:hi], tuple([latency + nbytes / bw for bw in bws[lo:hi]]), "comm", nb, label))
        keys.append(key)
    return keys


def edge_plan(b, i: int, op, j: int, ccfg, pcfg) -> tuple:
    """(tasks, edges, keys) of input `j` of op `i`: same-device edges, and per cross-device
    transfer its forward link tasks and the gradient's way back (see `TaskGraphBuilder`)."""
    ref = op.inputs[j]
    p = b.graph.index[ref.op]
    itemsize = b.graph[ref.op].outputs[ref.index].itemsize
    n = b.num_ops
    pdev, cdev = pcfg.devices, ccfg.devices
    # The grouping of `TaskGraphBuilder.transfers`, inlined: pieces per (producer task,
    # consumer device), each distinct box counted once.
    pieces: dict[tuple[int, int], dict[Box, list[int]]] = {}
    edges = []
    # Compute-task keys, made once per plan (all-to-all patterns name each many times).
    pf = [(0, p, 0, t) for t in range(len(pdev))]
    pb = [(1, n - p, 0, t) for t in range(len(pdev))]
    cf = [(0, i, 0, t) for t in range(len(cdev))]
    cb = [(1, n - i, 0, t) for t in range(len(cdev))]
    for pt, ct, box in b.overlaps(op, j, ccfg.degrees, pcfg.degrees):
        dd = cdev[ct]
        if pdev[pt] == dd:
            edges.append((pf[pt], cf[ct]))
            edges.append((cb[ct], pb[pt]))
        else:
            per = pieces.get((pt, dd))
            if per is None:
                pieces[(pt, dd)] = {box: [ct]}
            else:
                cts = per.get(box)
                if cts is None:
                    per[box] = [ct]
                else:
                    cts.append(ct)
    tasks, keys = [], []
    routes, route = b._route_columns, b._route
    back = n - i
    for (pt, dd), boxes in pieces.items():
        if len(boxes) == 1:
            (box, dst), = boxes.items()
            nbytes = max(float(volume(box) * itemsize), _MIN_TRANSFER_BYTES)
            if len(dst) > 1:
                dst = sorted(set(dst))
        else:
            nbytes = max(float(sum(map(volume, boxes)) * itemsize), _MIN_TRANSFER_BYTES)
            dst = sorted({ct for cts in boxes.values() for ct in cts})
        sd = pdev[pt]
        there = routes.get((sd, dd)) or route(sd, dd)
        back_route = routes.get((dd, sd)) or route(dd, sd)
        if there[4] is not None and back_route[4] is not None:
            # The common case: one task each way (`_hop_tasks`), keys built whole.
            fk, bk = (0, i, 1, j, pt, dd, 0), (1, back, 1, j, pt, dd, 0)
            tasks.append(_one_task(fk, there[0], there, nbytes))
            tasks.append(_one_task(bk, back_route[0], back_route, nbytes))
            fkeys, bkeys = (fk,), (bk,)
        else:
            fkeys = _hop_tasks(tasks, (0, i, 1, j, pt, dd), there[0], there, nbytes)
            bkeys = _hop_tasks(tasks, (1, back, 1, j, pt, dd), back_route[0], back_route, nbytes)
        src_f, src_b = pf[pt], pb[pt]
        if len(dst) == 1:
            c = dst[0]
            if len(fkeys) == len(bkeys) == 1:
                fk, bk = fkeys[0], bkeys[0]
                edges += ((src_f, fk), (fk, cf[c]), (cb[c], bk), (bk, src_b))
            else:
                edges += chain.from_iterable(zip(zip(repeat(src_f), fkeys), zip(fkeys, repeat(cf[c]))))
                edges += chain.from_iterable(zip(zip(repeat(cb[c]), bkeys), zip(bkeys, repeat(src_b))))
        else:
            dst_f = list(map(cf.__getitem__, dst))
            dst_b = list(map(cb.__getitem__, dst))
            for k in fkeys:
                edges.append((src_f, k))
                edges += [(k, c) for c in dst_f]
            for k in bkeys:
                edges += [(c, k) for c in dst_b]
                edges.append((k, src_b))
        keys += fkeys
        keys += bkeys
    return tasks, edges, tuple(keys)


def param_plan(b, param: str, configs: tuple) -> tuple:
    """(tasks, edges, keys, (core, feeds)) of parameter `param`'s synchronization and updates,
    its users configured by `configs` (in the order of `graph.param_users`).

    The plan has two parts.  Its *core* — the sync groups' barriers and rings and the updates,
    with their edges (`param_core`) — depends only on which cells of the parameter each device
    holds, the union over all users.  Each user's *feed* — an edge from each of its backward
    tasks to the ring start of every sync group its device is in, or to the device's update if
    it is in none — depends on that user's configuration and the core.  Both are memoized
    (`TaskGraphBuilder._param_core`, `_param_feed`), so two plans of one parameter whose users
    differ in one configuration share the core and every other user's feed as the same objects:
    `_diff` in `planner.sim.taskgraph` compares them by identity.  A parameter shared by the 40
    unrolled steps of an LSTM has 40 feeds; a proposal that changes one step's configuration
    touches one of them.
    """
    g = b.graph
    users = g.param_users[param]
    core = b._param_core(param, b._holdings(users, configs, param))
    feed = b._param_feed
    feeds = tuple([feed(param, k, u, cfg, core) for k, (u, cfg) in enumerate(zip(users, configs))])
    edges = list(core[1])
    for f in feeds:
        edges += f
    return core[0], edges, core[2], (core, feeds)


#: Serial numbers of parameter cores: a feed memoized for one core is never taken for another.
_CORE_SERIAL = count()


def param_core(b, param: str, holdings: dict) -> tuple:
    """(tasks, edges, keys, targets, serial): the synchronization and updates of parameter
    `param` when device d holds the boxes ``holdings[d]``; ``targets[d]`` are the tasks a
    backward task on device d feeds (`param_plan`).

    A group's ring starts when every replica's gradient is complete and every device's update
    waits for the whole ring: two barrier tasks (1 ns each, on a virtual resource of their own so
    they never queue) join the group's backward tasks to its ring transfers and the ring
    transfers to the updates, which keeps the edge count linear in the group size.
    """
    g = b.graph
    pi = b._param_index[param]
    spec = g.param_specs[param]
    itemsize = spec.nbytes // max(1, _prod(spec.shape))
    done_on: dict[int, list] = {}
    targets: dict[int, list] = {}
    tasks, edges, keys = [], [], []
    for gi, (devs, nbytes) in enumerate(_sync_groups(holdings, spec)):
        r = len(devs)
        per_edge = 2.0 * (r - 1) / r * nbytes
        vres = _VIRTUAL_RESOURCE_BASE + (pi << 16) + 2 * gi
        start, end = (2, pi, gi, -1), (2, pi, gi, _LAST)
        tasks.append((start, vres, MIN_TASK_SECONDS, "barrier", 0.0, param))
        tasks.append((end, vres + 1, MIN_TASK_SECONDS, "barrier", 0.0, param))
        keys += (start, end)
        for d in devs:
            targets.setdefault(d, []).append(start)
            done_on.setdefault(d, []).append(end)
        mult = 2 * (r - 1)
        for e in range(r):
            ring = b._route(devs[e], devs[(e + 1) % r])
            for k in _hop_tasks(tasks, (2, pi, gi, e), ring[0] * mult, ring, per_edge):
                edges.append((start, k))
                edges.append((k, end))
                keys.append(k)
    devices = b.topology.devices
    update_time = b.cost.update_time
    for dev, boxes in holdings.items():
        held = union_volume(boxes) * itemsize
        k = (3, pi, dev)
        tasks.append((k, dev, max(update_time(held, devices[dev], b.optimizer), MIN_TASK_SECONDS),
                      "update", 0.0, param))
        ends = done_on.get(dev)
        if ends:
            edges += [(e, k) for e in ends]
        else:
            targets[dev] = [k]  # held by no other device: the backward tasks feed the update
        keys.append(k)
    return tasks, edges, tuple(keys), {d: tuple(t) for d, t in targets.items()}, next(_CORE_SERIAL)


def param_feed(b, i: int, cfg, core: tuple) -> list:
    """The edges from op `i`'s backward tasks under `cfg` into a parameter's `core`."""
    back = b.num_ops - i
    targets = core[3]
    return [((1, back, 0, t), k) for t, dev in enumerate(cfg.devices) for k in targets[dev]]


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _sync_groups(boxes_by_dev: dict[int, list[Box]], spec) -> list[tuple[tuple[int, ...], float]]:
    """Devices that hold the same cells of a parameter must all-reduce those cells' gradients.

    Returns (devices, bytes) per distinct device set with more than one device, in a
    deterministic order.  Data parallelism gives one group of all replicas with the whole
    parameter; splitting its parameter dimension gives one group per shard.
    """
    if len(boxes_by_dev) < 2:
        return []
    itemsize = spec.nbytes // max(1, _prod(spec.shape))
    acc: dict[tuple[int, ...], int] = {}
    for cell, holders in cells(boxes_by_dev):
        if len(holders) > 1:
            acc[holders] = acc.get(holders, 0) + volume(cell) * itemsize
    return sorted(acc.items())
