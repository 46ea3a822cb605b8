"""The task graph of a step as autopar's trainer runs it (`autopar.trainer.runtime`).

FlexFlow's simulator (sec. 5) times an idealized runtime: every task starts as soon as its inputs
are ready and its device is free, transfers overlap compute for free, and every parameter is
synchronized on its own.  Measured against our trainer on local ranks that is 1.4–4.4× too
optimistic (docs/simulation.md, "Accuracy").  This module builds the step the trainer really
executes, from the same compute tasks and costs, for topologies whose devices the trainer drives
(`trainer_calibration` says which); everything else keeps FlexFlow's model.

What the trainer does, and how it is modelled:

* **Program order.**  Each rank runs its ops' forward tasks in graph order, then their backward
  tasks in reverse order, one at a time; it waits where an op needs data from a peer.  Each
  device gets a chain: static barrier tasks mark where its program arrives at every op
  (`A` forward, `BA` backward) and the op's tasks on the device sit between them in task order.
  A barrier runs on a virtual resource of its device and lasts 1 ns, so it never queues.  So do
  the program's exchange calls (`_local_calls`), whose runtime work the program waits for in place.
* **Exchanges.**  Every rank calls the exchange of op i's inputs when its program reaches op i
  and waits there for what it receives (`W`, after `A`); a message moves once the producer task
  has finished and its sender has reached op i.  Gradients go back the same way at op i's place
  in the backward pass (`GI` issue, `GW` wait).  Only tensors whose producer needs a gradient
  send one back, as in the trainer.  A message lasts the calibrated point-to-point time for its
  bytes plus the exchange overhead.  Where the input moves both ways between two ranks (each
  sends the other a piece), the message waits for both ranks to reach op i and costs ``p2p``;
  gloo ranks post their receives ahead, so a one-way message leaves as its sender sends it and
  costs ``p2p_oneway`` (on NCCL, which posts a receive with its exchange, every message meets
  both ranks).  Inside steps on this machine, one-way messages of 128-256 KiB took 0.2-0.25 ms
  and two-way exchanges stalled for 2-3 ms a third to a half of the time (docs/simulation.md,
  "Eighth round").  Its sender packs it
  and its receiver places it on their own devices (`_stage`, the calibrated staging), each
  program waiting for its part, and the sender's own call that sends it (``send_call``) before
  its program goes on.  Every receive is posted as the step begins (`_post`: gloo
  ranks post a step's receives ahead, `trainer.comm.RecvAhead`), on the receiver's core before
  its first op, and the sender waits for each send request at the end of its step
  (`_wait_send`).  A rank holding an op's tasks also pays its exchange calls' own work where
  nothing moves between ranks, as the model's own steps timed it (`_local_calls`).
* **Overheads.**  Each forward and backward task costs the calibrated per-task overhead on top
  of its kernel time (`planner.cost.calibration`): on CPU ranks, the runtime's own work between
  its spans as the model's own steps showed it, where `autopar profile` timed them
  (`trainer_calibration`), else as the calibration's chains of tiny ops did.  The runtime runs
  a backward pass as few ``autograd.backward`` calls as it can: an op whose output goes, on one
  rank and one to one, to its only consumer is fused into the consumer's call (`fused`); every
  other op runs its own call per task, and each pays the engine's start-up (``bwd_call_s``) on
  its device's program before the task.  On GPUs, whose kernels run behind the host that issues
  them, each task is a host part and a device part on two streams (`op_plan`).
* **Gradient synchronization** in buckets (`planner.sim.buckets`, the trainer's own plan): a
  bucket's all-reduce starts when every rank of its group has passed the bucket's op in the
  backward pass and issued it (the calibrated ``issue`` on each rank's program, `_issue`), and
  lasts the calibrated all-reduce time for its bytes and group size, on the ring's links — and
  on the ranks' devices too when communication runs on their cores (``comm_uses_cores``).  Where
  the model's own data-parallel steps showed the all-reduces adding more than that
  (`trainer_calibration`), the rest is the backward ops beside it running slower: a task on each
  member rank's program after the issue (`bucket_beside`).  At
  the end each rank waits for its buckets (`S`) and runs its optimizer step over all its shards
  (`O`): the calibrated optimizer time for its tensors and bytes (the cost model's update time
  where the calibration has none).  Before its first op, each rank
  draws the step's synthetic global batch (the calibrated ``draw`` for each of the graph's input
  tensors) and zeroes its bucket buffers (`zero_grad`: the calibrated ``zero`` for their tensors
  and bytes, else the device's memory bandwidth).

Groups, as `planner.sim._plans` builds them, stay pure functions of configurations so delta
simulation edits them like FlexFlow's: the static chain of barriers (never changes), one group
per op (its tasks and their chain edges on every device; a device without tasks of the op gets a
pass-through task so that every edge of the group touches a task of the group), one per input
edge (same-device edges and messages), and one for synchronization and the optimizer (it depends
on every parameter's holdings).
"""

from __future__ import annotations

from dataclasses import replace

from ..cost.calibration import (FORWARD_RECEIVE, FORWARD_SEND, GRADIENT_RECEIVE, GRADIENT_SEND, RuntimeCalibration,
                                default_calibration)
from ..ir.graph import OperatorGraph
from ..ir.regions import contiguous_in, union_volume, volume
from ._layout import MAX_PARTS
from ._plans import _MIN_TRANSFER_BYTES, _VIRTUAL_RESOURCE_BASE, MIN_TASK_SECONDS, _prod
from .buckets import plan_buckets

#: Chain barriers of device d run on virtual resource ``_CHAIN_BASE + d`` (never a device or link);
#: message latencies each on one from ``DELAY_BASE`` on (`TaskGraphBuilder._delay_resource`).
_CHAIN_BASE = _VIRTUAL_RESOURCE_BASE + (1 << 36)
DELAY_BASE = _VIRTUAL_RESOURCE_BASE + (2 << 36)
#: GPUs: the barriers of each device's kernel stream, on a virtual resource per device.
_STREAM_BASE = _VIRTUAL_RESOURCE_BASE + (3 << 36)
_FLOAT = ("float64", "float32", "float16", "bfloat16")
#: The trainer's exchange sends the pieces a rank has for one peer, of one dtype, as one message
#: where there are several and they come to at most this many bytes in all
#: (`autopar.trainer.comm.exchange_many`, which takes this value from here).
COALESCE_BYTES = 256 << 10


def trainer_calibration(topology, cost, graph: OperatorGraph | None = None) -> RuntimeCalibration | None:
    """The runtime calibration to simulate `topology` with the trainer's model, or None for
    FlexFlow's.

    The trainer's model applies where the trainer's own costs are known: CPU worker ranks on one
    machine (``local:N``, gloo), with their measured calibration from the cost model's profile
    cache or else the defaults; and any topology of one device product for which `autopar profile`
    measured a calibration of that world size (``nccl`` on GPUs, the same measurements through
    the same code).  GPU presets nothing was measured on keep FlexFlow's idealized runtime, which
    the paper's figures assume.

    Where the cache also holds the runtime's work per task in `graph`'s own steps on CPU ranks
    (`planner.cost.ProfileCache.overheads`, from `trainer.calibrate.model_overheads`), the
    per-task overheads are those, plus the chains' work inside the spans beyond the kernels
    (``details["fwd_task_phase_only_s"]``, which the measured steps time as compute): the chains'
    bookkeeping, timed with every span evicting the caches, came out at 2-3x the models' own on
    the Xeon VM (docs/simulation.md, "Twenty-third round").  So are its exchange calls that move
    nothing between ranks, where they were measured with them (``local_exchange_s``, `_local_calls`);
    the chains never make such a call, and without the model's own steps they cost nothing.  And a
    gradient bucket's all-reduce costs what the buckets' all-reduces added to the model's own
    data-parallel steps, over what the calibration's all-reduce says for them
    (``allreduce_in_step``): on the AMD VM of 2026-11-29 1.4x (alexnet) to 3.0x (rnnlm), the
    all-reduce's threads sharing the rank's core with the backward pass (docs/simulation.md,
    "Thirtieth round").  The all-reduce itself lasts the calibrated time, and the rest slows the
    backward ops beside it (`RuntimeCalibration.bucket_time`, "Thirty-sixth round")."""
    devices = topology.devices
    if not devices or len({d.product for d in devices}) != 1:
        return None
    product, world = devices[0].product, len(devices)
    cpu = all(d.is_cpu for d in devices)
    cache = getattr(cost, "cache", None)
    measured = cache.calibration(product, "gloo" if cpu else "nccl", world) if cache is not None else None
    if measured is not None:
        own = cache.overheads(measured, graph.fingerprint) if graph is not None and cpu else None
        if own is not None:
            inside = dict(measured.details)
            in_step = cache.allreduce_in_step(measured, graph.fingerprint)
            measured = replace(measured, fwd_task_s=own[0] + float(inside.get("fwd_task_phase_only_s", 0.0)),
                               bwd_task_s=own[1] + float(inside.get("bwd_task_phase_only_s", 0.0)),
                               local_exchange_s=cache.exchange_overheads(measured, graph.fingerprint) or (0.0, 0.0),
                               allreduce_in_step=1.0 if in_step is None else in_step)
        return measured
    if cpu and len(topology.nodes) == 1:
        return default_calibration(product, "gloo", world)
    return None


# -- keys (see the module docstring; stage 0 forward, 1 backward, 2 buckets, 4 the end) -----------

def arrive(i: int, d: int) -> tuple:
    return (0, i, -1, d, 0)


def inputs_in(i: int, d: int) -> tuple:
    return (0, i, -1, d, 1)


def _pass(i: int, d: int) -> tuple:
    return (0, i, -1, d, 2)


def back_arrive(n: int, i: int, d: int) -> tuple:
    return (1, n - i, -1, d, 0)


def _back_pass(n: int, i: int, d: int) -> tuple:
    return (1, n - i, -1, d, 2)


def grads_out(n: int, i: int, d: int) -> tuple:
    return (1, n - i, 2, d, 0)


def grads_in(n: int, i: int, d: int) -> tuple:
    return (1, n - i, 2, d, 1)


def stream_arrive(i: int, d: int) -> tuple:
    """GPUs: device d's kernel stream reaches op i's forward kernels."""
    return (0, i, -1, d, 3)


def stream_back(n: int, i: int, d: int) -> tuple:
    """GPUs: device d's kernel stream reaches op i's backward kernels (i = -1: the end)."""
    return (1, n - i, -1, d, 3)


def _stream_pass(i: int, d: int) -> tuple:
    return (0, i, -1, d, 4)


def _stream_back_pass(n: int, i: int, d: int) -> tuple:
    return (1, n - i, -1, d, 4)


def host_task(key: tuple) -> tuple:
    """GPUs: the host's part of compute task `key` (issuing its kernels)."""
    return (key[0], key[1], 3, key[3])


def engine_call(n: int, i: int, t: int) -> tuple:
    """The autograd engine's start-up for task t of op i's own backward call (`fused`, `edge_plan`)."""
    return (1, n - i, 4, t)


def local_exchange(i: int, d: int) -> tuple:
    """Rank d's own work in its exchange call for op i's inputs, forward (`_local_calls`)."""
    return (0, i, 5, d)


def local_grad_exchange(n: int, i: int, d: int) -> tuple:
    """Rank d's own work in its exchange call for op i's input gradients (`_local_calls`; with the
    input's index after it, `_apart_call`)."""
    return (1, n - i, 5, d)


def bucket_issue(k: int, d: int) -> tuple:
    """Rank d's thread issuing bucket k's all-reduce (`_issue`)."""
    return (2, k, -1, d)


def bucket_beside(k: int, d: int) -> tuple:
    """What bucket k's all-reduce costs the backward ops rank d runs beside it (`_issue`)."""
    return (2, k, -2, d)


def strided_copy(i: int, j: int, pt: int, d: int, ct: int) -> tuple:
    """Rank d's copy of the strided cut of producer task `pt`'s output that input `j` of op `i`'s
    task `ct` reads whole (`_strided`)."""
    return (0, i, 1, j, pt, d, ct, -7)


def is_strided_copy(key: tuple) -> bool:
    return len(key) == 8 and key[-1] == -7


def send_wait(key: tuple) -> tuple:
    """The sender's wait for message `key`'s send request at the end of its step (`_wait_send`)."""
    return key + (-8,)


def is_send_wait(key: tuple) -> bool:
    return len(key) == 7 and key[-1] == -8


def zero_grad(d: int) -> tuple:
    return (-1, 0, d)


def sync_wait(d: int) -> tuple:
    return (4, 0, d)


def optimizer_step(d: int) -> tuple:
    return (4, 1, d)


def sends_waited(d: int) -> tuple:
    """Rank d's program has waited for its step's send requests (`_wait_send`), after `sync_wait`."""
    return (4, 2, d)


def requires_grad(graph: OperatorGraph) -> list[bool]:
    """Per op, whether the trainer runs its backward pass: it has a float parameter or reads a
    float tensor that depends on one (`autopar.trainer.plan._requires_grad`)."""
    out: list[bool] = []
    for op in graph.ops:
        own = any(p.dtype in _FLOAT for p in op.params)
        up = any(out[graph.index[r.op]] and graph[r.op].outputs[r.index].dtype in _FLOAT for r in op.inputs)
        out.append(own or up)
    return out


def fusion_consumer(b, p: int) -> tuple[int, int] | None:
    """(consumer op, input index) of the one edge that may fuse op `p`'s backward into its
    consumer's autograd call, or None when op `p` runs its own call under every configuration.

    The runtime (`autopar.trainer.runtime.Runtime._fusable`) fuses an edge that stays on one rank,
    one to one, into one ``autograd.backward`` call: the producer has one output and one consumer,
    neither end is a batch norm with batch statistics, and the gradient flows back.  An op that is
    not fused into its consumer runs a call per task, and each call pays the engine's start-up
    (`RuntimeCalibration.bwd_call_s`)."""
    g = b.graph
    op = g.ops[p]
    cons = g.consumers[op.name]
    if not b._requires_grad[p] or not op.inputs or len(op.outputs) != 1 or len(cons) != 1:
        return None
    if op.outputs[0].dtype not in _FLOAT or _batch_stats(op) or _batch_stats(g[cons[0][0]]):
        return None
    return g.index[cons[0][0]], cons[0][1]


def _batch_stats(op) -> bool:
    return op.kind == "batch_norm" and bool(op.attr("batch_stats"))


def fused(b, i: int, op, j: int, ccfg, pcfg) -> bool:
    """Whether input `j` of op `i` (its producer's `fusion_consumer`) is fused under these
    configurations: every producer task's whole output is read, on its own device, by exactly one
    consumer task as that task's whole input `j`, and no producer task holds a partial sum."""
    producer = b.graph[op.inputs[j].op]
    out = producer.outputs[op.inputs[j].index]
    if any(d > 1 and pd.name not in out.dims for pd, d in zip(producer.pardims, pcfg.degrees)):
        return False
    pairs = b.overlaps(op, j, ccfg.degrees, pcfg.degrees)
    pts, cts = [pt for pt, _, _ in pairs], [ct for _, ct, _ in pairs]
    if len(set(pts)) != len(pts) or len(set(cts)) != len(cts) or len(pts) != len(pcfg.devices):
        return False
    p_ranges = b._task_ranges(producer, pcfg.degrees)
    c_ranges = b._task_ranges(op, ccfg.degrees)
    for pt, ct, box in pairs:
        if pcfg.devices[pt] != ccfg.devices[ct]:
            return False
        n = volume(box)
        if n != volume(producer.output_box(op.inputs[j].index, p_ranges[pt])) or \
                n != volume(op.input_box(j, c_ranges[ct], out.shape)):
            return False
    return True


# -- groups ---------------------------------------------------------------------------------------

def chain_plan(b) -> tuple:
    """The static barriers of every device's program and the edges between them (on GPUs, of its
    kernel stream too)."""
    n, devs = b.num_ops, range(b.num_devices)
    tasks, edges, keys = [], [], []

    def barrier(key, d, base=_CHAIN_BASE):
        tasks.append((key, base + d, MIN_TASK_SECONDS, "barrier", 0.0, "chain"))
        keys.append(key)

    if b.runtime.launches_async:
        for d in devs:
            for i in range(n + 1):
                barrier(stream_arrive(i, d), d, _STREAM_BASE)
            for i in range(-1, n):
                barrier(stream_back(n, i, d), d, _STREAM_BASE)
            edges.append((stream_arrive(n, d), stream_back(n, n - 1, d)))

    for d in devs:
        for i in range(n + 1):
            barrier(arrive(i, d), d)
        for i in range(n):
            barrier(inputs_in(i, d), d)
            edges.append((arrive(i, d), inputs_in(i, d)))
        for i in range(-1, n):
            barrier(back_arrive(n, i, d), d)
        for i in range(n):
            barrier(grads_out(n, i, d), d)
            barrier(grads_in(n, i, d), d)
            edges.append((grads_out(n, i, d), grads_in(n, i, d)))
            edges.append((grads_in(n, i, d), back_arrive(n, i - 1, d)))
        edges.append((arrive(n, d), back_arrive(n, n - 1, d)))
        # The end of the step: the buckets' wait, then the send requests' (`sync_plan`, `_wait_send`).
        barrier(sync_wait(d), d)
        barrier(sends_waited(d), d)
        edges += [(back_arrive(n, -1, d), sync_wait(d)), (sync_wait(d), sends_waited(d))]
    return tasks, edges, tuple(keys)


def op_plan(b, i: int, op, cfg) -> tuple:
    """Op `i`'s forward and backward tasks under `cfg` (kernel time plus the calibrated
    overhead), and their place in every device's program.

    On GPUs (`RuntimeCalibration.launches_async`), whose kernels run behind the host that issues
    them, each task is two on two streams per device: a host part — the profile's host seconds
    issuing its kernels (`planner.cost.Estimate.host`) plus the calibrated per-task overhead of
    the runtime — in the device's program chain, and a device part — the kernels' own seconds —
    on the device, after its host part and in the device's stream order (`stream_arrive`,
    `stream_back`).  The host runs ahead while the kernels queue, so a step costs the sum of its
    kernels where they are long and the host's issuing where they are short, as Daydream and
    Lumos model a GPU step.  (On an H100, a task costing the longer of an event-timed kernel and a
    calibrated overhead had missed single-device steps by −89 to +23 %: docs/simulation.md.)"""
    rt: RuntimeCalibration = b.runtime
    gpu = rt.launches_async
    n = b.num_ops
    device = b.topology.devices
    shapes = b._in_shapes[op.name]
    grad = b._requires_grad[i]
    name = op.name
    # An op that can never be fused into its consumer runs its own backward call per task; one that
    # can is charged by its consumer's edge where the configurations keep them apart (`edge_plan`).
    call = rt.bwd_call_s if grad and fusion_consumer(b, i) is None else 0.0
    est_on: dict = {}
    tasks, edges, keys = [], [], []
    on: dict[int, list[int]] = {}
    for t, dev in enumerate(cfg.devices):
        est = est_on.get(dev)
        if est is None:
            est = est_on[dev] = b.cost.task_cost(op, cfg.degrees, device[dev], shapes)
        fk, bk = (0, i, 0, t), (1, n - i, 0, t)
        if gpu:
            host_f, host_b = est.host if est.host is not None else (0.0, 0.0)
            hf, hb = host_task(fk), host_task(bk)
            back_host = host_b + rt.bwd_task_s + call if grad else MIN_TASK_SECONDS
            tasks += [(hf, _CHAIN_BASE + dev, max(host_f + rt.fwd_task_s, MIN_TASK_SECONDS), "overhead", 0.0, name),
                      (fk, dev, max(est.forward, MIN_TASK_SECONDS), "forward", 0.0, name),
                      (hb, _CHAIN_BASE + dev, max(back_host, MIN_TASK_SECONDS), "overhead", 0.0, name),
                      (bk, dev, max(est.backward if grad else 0.0, MIN_TASK_SECONDS), "backward", 0.0, name)]
            edges += [(hf, fk), (hb, bk)]
            keys += (hf, hb)
        else:
            back = est.backward + rt.bwd_task_s + call if grad else MIN_TASK_SECONDS
            tasks += [(fk, dev, est.forward + rt.fwd_task_s, "forward", 0.0, name),
                      (bk, dev, max(back, MIN_TASK_SECONDS), "backward", 0.0, name)]
        edges.append((fk, bk))
        keys += (fk, bk)
        on.setdefault(dev, []).append(t)
    program = host_task if gpu else (lambda key: key)   # what a device's program chain runs
    for d in range(b.num_devices):
        ts = on.get(d)
        if ts:
            chains = [[inputs_in(i, d)] + [program((0, i, 0, t)) for t in ts] + [arrive(i + 1, d)],
                      [back_arrive(n, i, d)] + [program((1, n - i, 0, t)) for t in ts] + [grads_out(n, i, d)]]
            if gpu:
                chains += [[stream_arrive(i, d)] + [(0, i, 0, t) for t in ts] + [stream_arrive(i + 1, d)],
                           [stream_back(n, i, d)] + [(1, n - i, 0, t) for t in ts] + [stream_back(n, i - 1, d)]]
        else:
            p, q = _pass(i, d), _back_pass(n, i, d)
            tasks.append((p, _CHAIN_BASE + d, MIN_TASK_SECONDS, "barrier", 0.0, name))
            tasks.append((q, _CHAIN_BASE + d, MIN_TASK_SECONDS, "barrier", 0.0, name))
            keys += (p, q)
            chains = [[inputs_in(i, d), p, arrive(i + 1, d)], [back_arrive(n, i, d), q, grads_out(n, i, d)]]
            if gpu:
                sp, sq = _stream_pass(i, d), _stream_back_pass(n, i, d)
                tasks.append((sp, _STREAM_BASE + d, MIN_TASK_SECONDS, "barrier", 0.0, name))
                tasks.append((sq, _STREAM_BASE + d, MIN_TASK_SECONDS, "barrier", 0.0, name))
                keys += (sp, sq)
                chains += [[stream_arrive(i, d), sp, stream_arrive(i + 1, d)],
                           [stream_back(n, i, d), sq, stream_back(n, i - 1, d)]]
        for chain in chains:
            edges += zip(chain, chain[1:])
    _local_calls(b, i, op, on, grad, tasks, edges, keys)
    return tasks, edges, tuple(keys)


def _grad_inputs(b, i: int, op) -> list[tuple[int, bool]]:
    """(input index, whether its edge may be fused) of every input of op `i` whose gradient flows
    back to its producer (`autopar.trainer.plan.InputRoute.grads`)."""
    out = []
    for j, ref in enumerate(op.inputs):
        p = b.graph.index[ref.op]
        if b._requires_grad[p] and b.graph[ref.op].outputs[ref.index].dtype in _FLOAT:
            out.append((j, fusion_consumer(b, p) == (i, j)))
    return out


def _local_calls(b, i: int, op, on: dict, grad: bool, tasks: list, edges: list, keys: list) -> None:
    """The exchange calls of op `i` on every rank holding its tasks, as part of the program's time
    in the exchange: ``local_exchange_s``, what a call that moves nothing between ranks cost in
    the model's own steps (`trainer_calibration`), forward and backward.  A rank with tasks of an
    op that has inputs makes the call forward even where nothing moves (`autopar.trainer.runtime.
    Runtime._forward` assembles the inputs from the local producers' outputs), and one backward
    where an input's gradient leaves the consumer's autograd call (adding it into its producer's
    accumulator, `autopar.trainer.redistribute.GradAccumulator`).  An edge that may be fused is
    charged by `edge_plan` where the configurations keep it apart (`_apart_call`).  Where messages
    move, the call's own work runs beside their latency, which holds ``exchange_s``.  A call runs
    on its program's own resource, not on the core: where an all-reduce holds the core (a rank's
    gloo thread taking time from what it runs under), a call queued behind it would book the
    all-reduce as the rank's time in an exchange, which its short span does not see.  (Left out,
    the exchange spans held 0.2-0.9 ms of every data-parallel step on the AMD VM that the
    simulated step did not: docs/simulation.md, "Twenty-sixth round".)"""
    rt: RuntimeCalibration = b.runtime
    fwd, bwd = rt.local_exchange_s
    n = b.num_ops
    backward = grad and bwd > 0 and any(not fusable for _, fusable in _grad_inputs(b, i, op))
    for d in on:
        if op.inputs and fwd > 0:
            keys.append(_call(tasks, edges, local_exchange(i, d), d, fwd, f"exchange {op.name}",
                              arrive(i, d), inputs_in(i, d)))
        if backward:
            keys.append(_call(tasks, edges, local_grad_exchange(n, i, d), d, bwd, f"grad exchange {op.name}",
                              grads_out(n, i, d), grads_in(n, i, d)))


def _call(tasks: list, edges: list, key: tuple, d: int, seconds: float, label: str, before: tuple,
          after: tuple) -> tuple:
    """Rank d's exchange call `key` between its program's barriers `before` and `after`, on the
    program's own resource beside the core (`_local_calls`); returns `key`."""
    tasks.append((key, _CHAIN_BASE + d, seconds, "overhead", 0.0, label))
    edges += [(before, key), (key, after)]
    return key


def _message(b, key: tuple, route: tuple, rt: RuntimeCalibration, nbytes: float,
             pair: tuple | None = None, two_way: bool = True) -> tuple[list, list, tuple, tuple]:
    """One message of `nbytes` over `route` (`planner.sim._plans.route_columns`): (tasks, edges,
    first key, last key).

    A message is its latency, then its bytes.  The bytes occupy every link of the route for their
    calibrated wire time (`RuntimeCalibration.wire_time`), queueing there behind other traffic;
    the latency — the rest of the calibrated point-to-point time for its size, plus the
    exchange's overhead — is a delay on a virtual resource of its own, so the messages of one
    exchange wait it side by side, as the trainer's one exchange per op waits once.  (Before
    the wire was calibrated apart, every byte-dependent part of the time, the tail of waiting
    that grows with the size included, queued on the link: an attention's three 256 KiB inputs
    took three tails one after another.)

    With a calibrated ``message_serial_s`` and a `pair` (the exchange and the two ranks: every
    message of that exchange between them, either way, names the same), part of the latency is
    paid one message after another on a virtual resource of the pair's: an exchange of two
    messages each way waits about two of these longer than one of one each way (on local gloo
    ranks the runtime sends a pair's messages of one exchange as one, and the calibration
    measures what one more costs in bytes and packing).  The parallel part is shortened by two of them, so an
    exchange of one message each way costs what the point-to-point curve says.

    A message whose exchange sends nothing back between its two ranks (not `two_way`) costs the
    calibrated one-way time instead (`RuntimeCalibration.message_time`)."""
    _, res, _, labels, _ = route
    serial = rt.message_serial_s if pair is not None else 0.0
    total = rt.message_time(nbytes, two_way)
    on_wire = min(rt.wire_time(nbytes), total)
    latency = max(total - on_wire + rt.exchange_s - 2 * serial, MIN_TASK_SECONDS)
    wire = max(on_wire, MIN_TASK_SECONDS)
    delay = key + (-1,)
    label0 = labels[0] if labels else ""
    tasks = [(delay, b._delay_resource(delay), latency, "comm", 0.0, label0)]
    edges = []
    prev = delay
    if serial > 0:
        queued = key + (-2,)
        tasks.append((queued, b._delay_resource(("pair",) + pair), serial, "comm", 0.0, label0))
        edges.append((delay, queued))
        prev = queued
    first_wire = len(tasks)
    for c, lo in enumerate(range(0, len(res), MAX_PARTS)):
        hi = min(lo + MAX_PARTS, len(res))
        label = labels[lo].split("->")[0] + "->" + labels[hi - 1].split("->")[-1]
        part = res[lo:hi]
        nb = nbytes if c == 0 else 0.0
        k = key + (c,)
        if len(part) == 1:
            tasks.append((k, part[0], wire, "comm", nb, label))
        else:
            tasks.append((k, part, (wire,) * len(part), "comm", nb, label))
        edges.append((prev, k))
    last = tuple(t[0] for t in tasks[first_wire:])
    return tasks, edges, delay, last


def riders(b, i: int, op, j: int, configs) -> frozenset:
    """The flows of input `j` of op `i` whose pieces travel in the message of an earlier input of
    the op, as (phase, producer's device, consumer's device): phase 0 the forward message from the
    first to the second, 1 its gradient back.  `configs` maps op names to configurations.

    The trainer's exchange of an op sends what a rank has for one peer as one piece per input, and
    the pieces for one peer of one dtype as one message where there are several and they come to
    at most `COALESCE_BYTES` (`autopar.trainer.comm.exchange_many`); the receiver posts one receive
    for that message (`_post`).  A split LSTM cell's two inputs, each half on the other rank, come
    as one message: rnnlm's plans that split its cells post 51 receives a step, not the 81 their
    pieces would (docs/simulation.md, "Thirty-eighth round").  Only the posting depends on it: the
    latency of the other pieces of one message is the calibrated ``message_serial_s`` (`_message`).
    Empty where receives are not posted ahead (NCCL) or the op has one input."""
    rt: RuntimeCalibration = b.runtime
    if len(op.inputs) < 2 or rt.post_s <= 0 or not rt.receives_ahead:
        return frozenset()
    ccfg = configs[op.name]
    units: dict[tuple, list[tuple[int, int]]] = {}   # (phase, sd, dd, dtype) -> [(input, bytes)]
    for jj, ref in enumerate(op.inputs):
        pcfg = configs[ref.op]
        out = b.graph[ref.op].outputs[ref.index]
        flows: dict[tuple[int, int], set] = {}
        for pt, ct, box in b.overlaps(op, jj, ccfg.degrees, pcfg.degrees):
            sd, dd = pcfg.devices[pt], ccfg.devices[ct]
            if sd != dd:
                flows.setdefault((sd, dd), set()).add(box)
        grads = b._requires_grad[b.graph.index[ref.op]] and out.dtype in _FLOAT
        for (sd, dd), boxes in flows.items():
            nbytes = sum(map(volume, boxes)) * out.itemsize
            for phase in (0, 1) if grads else (0,):
                units.setdefault((phase, sd, dd, out.dtype), []).append((jj, nbytes))
    return frozenset((phase, sd, dd) for (phase, sd, dd, _), members in units.items()
                     if len(members) > 1 and sum(nb for _, nb in members) <= COALESCE_BYTES
                     and any(jj == j for jj, _ in members[1:]))


def edge_plan(b, i: int, op, j: int, ccfg, pcfg, rides: frozenset = frozenset()) -> tuple:
    """Input `j` of op `i`: same-device edges, and a message per (producer task, consumer
    device) at op i's exchange, with its gradient back at op i's backward exchange.

    The receiver posts a receive for each (peer, input), as the trainer's exchange does: for the
    first producer task on a device only, and for none where `rides` (`riders`) says the flow
    travels in an earlier input's message."""
    rt: RuntimeCalibration = b.runtime
    ref = op.inputs[j]
    p = b.graph.index[ref.op]
    out = b.graph[ref.op].outputs[ref.index]
    itemsize = out.itemsize
    grads = b._requires_grad[p] and out.dtype in _FLOAT
    n = b.num_ops
    pdev, cdev = pcfg.devices, ccfg.devices
    pieces: dict[tuple[int, int], dict] = {}
    edges = []
    readers: dict[int, int] = {}     # producer task -> its local readers and the devices it sends to
    local: dict[tuple[int, int], dict] = {}
    for pt, ct, box in b.overlaps(op, j, ccfg.degrees, pcfg.degrees):
        dd = cdev[ct]
        if pdev[pt] == dd:
            edges.append(((0, p, 0, pt), (0, i, 0, ct)))
            edges.append(((1, n - i, 0, ct), (1, n - p, 0, pt)))
            readers[pt] = readers.get(pt, 0) + 1
            local.setdefault((pt, ct), {})[box] = None
        else:
            if (pt, dd) not in pieces:
                readers[pt] = readers.get(pt, 0) + 1
            pieces.setdefault((pt, dd), {}).setdefault(box, []).append(ct)
    tasks: list = []
    _strided(b, i, op, j, ccfg, pcfg, local, tasks, edges)
    flows = {(pdev[pt], dd) for pt, dd in pieces}
    posted: set[tuple[int, int, int]] = {(phase, sd, dd) for phase, sd, dd in rides}
    for (pt, dd), boxes in pieces.items():
        nbytes = max(float(sum(map(volume, boxes)) * itemsize), _MIN_TRANSFER_BYTES)
        dst = sorted({ct for cts in boxes.values() for ct in cts})
        sd = pdev[pt]
        pair = (min(sd, dd), max(sd, dd))
        # Two-way: the edge also carries pieces from dd to sd, in the same exchange.  A one-way
        # message on ranks that post their receives ahead leaves when its sender gets there.
        two_way = (dd, sd) in flows
        meet = two_way or not rt.receives_ahead
        key = (0, i, 1, j, pt, dd)
        mt, me, first, last = _message(b, key, b._route(sd, dd), rt, nbytes, (0, i) + pair, two_way)
        tasks += mt
        edges += me
        edges += [((0, p, 0, pt), first), (arrive(i, sd), first)] + ([(arrive(i, dd), first)] if meet else [])
        edges += [(k, inputs_in(i, dd)) for k in last]
        copies = _copies(b, op, j, ccfg, pcfg, pt, boxes, readers[pt] > 1)
        _stage(b, tasks, edges, key, first, last, nbytes, (nbytes * copies[0], nbytes * copies[1]),
               FORWARD_SEND, sd, ((0, p, 0, pt), arrive(i, sd)), inputs_in(i, sd), FORWARD_RECEIVE, dd,
               (inputs_in(i, dd),))
        if (0, sd, dd) not in posted:
            posted.add((0, sd, dd))
            _post(b, tasks, edges, key, dd)
            _wait_send(b, tasks, edges, key, sd)
        if grads:
            key = (1, n - i, 1, j, pt, dd)
            mt, me, first, last = _message(b, key, b._route(dd, sd), rt, nbytes, (1, i) + pair, two_way)
            tasks += mt
            edges += me
            edges += [((1, n - i, 0, c), first) for c in dst]
            edges += [(grads_out(n, i, dd), first)] + ([(grads_out(n, i, sd), first)] if meet else [])
            edges += [(k, grads_in(n, i, sd)) for k in last] + [(k, (1, n - p, 0, pt)) for k in last]
            _stage(b, tasks, edges, key, first, last, nbytes, (nbytes * copies[2], nbytes * copies[3]),
                   GRADIENT_SEND, dd,
                   tuple((1, n - i, 0, c) for c in dst) + (grads_out(n, i, dd),), grads_in(n, i, dd),
                   GRADIENT_RECEIVE, sd, (grads_in(n, i, sd), (1, n - p, 0, pt)))
            if (1, sd, dd) not in posted:
                posted.add((1, sd, dd))
                _post(b, tasks, edges, key, sd)
                _wait_send(b, tasks, edges, key, dd)
    gpu = rt.launches_async
    # Whether the configurations keep apart an edge that may be fused (only asked where it costs).
    apart = (rt.bwd_call_s > 0 or (grads and rt.local_exchange_s[1] > 0)) and \
        fusion_consumer(b, p) == (i, j) and not fused(b, i, op, j, ccfg, pcfg)
    if rt.bwd_call_s > 0 and apart:
        # The producer runs its own backward call per task: the engine's start-up, on the program
        # of the task's device just before the task (its host on GPUs).
        for pt, d in enumerate(pdev):
            k, task = engine_call(n, p, pt), (1, n - p, 0, pt)
            tasks.append((k, _CHAIN_BASE + d if gpu else d, rt.bwd_call_s, "overhead", 0.0, ref.op))
            edges += [(back_arrive(n, p, d), k), (k, host_task(task) if gpu else task)]
    if grads and apart:
        _apart_call(b, i, op, j, set(cdev), tasks, edges)
    keys = [t[0] for t in tasks]
    return tasks, edges, tuple(keys)


def _apart_call(b, i: int, op, j: int, holders: set[int], tasks: list, edges: list) -> None:
    """The backward exchange call of op `i` on every rank holding its tasks (`holders`) where
    input `j`, whose edge may be fused, is kept apart by the configurations and op `i` has no
    input that is never fused (`_local_calls` charges those).  There is one call however many of
    the op's inputs are apart; where it has several that may be fused (a stack of single-use
    tensors), an edge cannot know the others' configurations and takes its share, so the call is
    priced in full when all of them are apart."""
    rt: RuntimeCalibration = b.runtime
    seconds = rt.local_exchange_s[1]
    inputs = _grad_inputs(b, i, op)
    if seconds <= 0 or not all(fusable for _, fusable in inputs):
        return
    n = b.num_ops
    for d in sorted(holders):
        _call(tasks, edges, local_grad_exchange(n, i, d) + (j,), d, seconds / len(inputs), f"grad exchange {op.name}",
              grads_out(n, i, d), grads_in(n, i, d))


def _post(b, tasks: list, edges: list, key: tuple, dst: int) -> None:
    """The receiver posting message `key`'s receive ahead as its step begins (the calibrated
    ``post_s``: gloo ranks post every receive of a step before their first op, `trainer.comm.RecvAhead`)."""
    post = b.runtime.post_s
    if post > 0 and b.runtime.receives_ahead:
        k = key + (-5,)
        tasks.append((k, dst, post, "overhead", 0.0, "post receive"))
        edges.append((k, arrive(0, dst)))


def _wait_send(b, tasks: list, edges: list, key: tuple, src: int) -> None:
    """The sender's wait for message `key`'s send request as its step ends: the runtime keeps a
    step's send requests, so that their buffers live, and waits for them all after its buckets
    (`autopar.trainer.runtime.Runtime.step`, in its ``sync`` span), at the calibrated
    ``send_wait_s`` each: a gloo request completes only inside its ``wait()``, so each costs a
    call however long ago its bytes left (14-16 us a send in rnnlm's and a tagger's steps on the
    AMD VM; 0.8-0.9 ms a step for the 54-56 sends of a random rnnlm plan: docs/simulation.md,
    "Thirty-ninth round").  One per message the runtime sends, as `_post` posts one receive: a
    flow that rides in an earlier input's message (`riders`) waits in that message's."""
    seconds = b.runtime.send_wait_s
    if seconds > 0:
        k = send_wait(key)
        tasks.append((k, _CHAIN_BASE + src, seconds, "overhead", 0.0, "wait for a send"))
        edges += [(sync_wait(src), k), (k, sends_waited(src))]


def _strided(b, i: int, op, j: int, ccfg, pcfg, local: dict, tasks: list, edges: list) -> None:
    """A consumer task whose whole input box is one local cut of a producer task's output that is
    not one run of its memory gets a copy of it (`autopar.trainer.redistribute.forward_inputs`,
    as its op was profiled on contiguous inputs): a task on its device at op `i`'s exchange, at
    the cost model's copy time (`local`: (producer task, consumer task) -> the boxes it reads).
    It runs beside the exchange's own call (`_local_calls`), as the model's own data-parallel
    steps timed that call with such copies in it: the exchange lasts the longer of the two."""
    ref = op.inputs[j]
    producer = b.graph[ref.op]
    shape = producer.outputs[ref.index].shape
    pranges, cranges = b._task_ranges(producer, pcfg.degrees), b._task_ranges(op, ccfg.degrees)
    itemsize = producer.outputs[ref.index].itemsize
    for (pt, ct), boxes in local.items():
        if len(boxes) != 1:
            continue
        box = next(iter(boxes))
        pbox = producer.output_box(ref.index, pranges[pt])
        if box == pbox or contiguous_in(box, pbox) or op.input_box(j, cranges[ct], shape) != box:
            continue
        d = ccfg.devices[ct]
        k = strided_copy(i, j, pt, d, ct)
        seconds = b.cost.copy_time(volume(box) * itemsize, b.topology.devices[d])
        tasks.append((k, d, max(seconds, MIN_TASK_SECONDS), "overhead", 0.0, "copy a strided input"))
        edges += [((0, b.graph.index[ref.op], 0, pt), k), (arrive(i, d), k), (k, inputs_in(i, d))]


def _copies(b, op, j: int, ccfg, pcfg, pt: int, boxes: dict, shared: bool) -> tuple[bool, bool, bool, bool]:
    """Whether the trainer copies the bytes of the message of input `j` of `op` from producer task
    `pt` (its `boxes`: each piece and the consumer tasks that read it) as it stages it, in each
    of `STAGING_PARTS` (`autopar.trainer.redistribute`): the sender packs one piece that is one
    run of its output's memory as it is; a consumer task whose input box is the one piece takes
    it as it arrives, else it assembles its box in a buffer of its own; the gradient of one piece
    that one consumer task's whole input gradient, or one run of it, holds goes back as it is;
    and one that is the producer task's whole output gradient is kept as it arrives, unless
    other gradients of that output come to the task too (`shared`: the edge's other readers of
    it), when it is added into a buffer.

    The calibrated staging (`trainer.calibrate.in_situ_job`) assembles every box and adds every
    gradient: in a user's tagger's steps a received MiB that a consumer took whole staged in
    54-67 us, against 875 us calibrated, and such steps were priced 7 ms a rank too slow
    (docs/simulation.md, "Thirty-eighth round")."""
    if len(boxes) != 1:
        return True, True, True, True
    (box, readers), = boxes.items()
    ref = op.inputs[j]
    producer = b.graph[ref.op]
    shape = producer.outputs[ref.index].shape
    pbox = producer.output_box(ref.index, b._task_ranges(producer, pcfg.degrees)[pt])
    cranges = b._task_ranges(op, ccfg.degrees)
    cboxes = [op.input_box(j, cranges[ct], shape) for ct in readers]
    return (not contiguous_in(box, pbox), any(c != box for c in cboxes),
            len(cboxes) != 1 or not contiguous_in(box, cboxes[0]), shared or box != pbox)


def _stage(b, tasks: list, edges: list, key: tuple, first: tuple, last: tuple, nbytes: float,
           copied: tuple[float, float], send_part: int, src: int, src_after: tuple, src_next: tuple,
           recv_part: int, dst: int, dst_next: tuple) -> None:
    """The sender's and the receiver's staging of one message on their own cores (the calibrated
    ``staging`` curves, `RuntimeCalibration.staging_time`): the sender cuts and packs it before
    the message leaves, once it has what it sends and has reached the exchange (`src_after`), and
    its program goes on only after (`src_next`); the receiver places it (or adds a gradient into
    its accumulator) after it arrives and before what needs it (`dst_next`).  `copied`: the bytes
    each of them copies (`_copies`); one that copies none pays the curve's smallest call.
    Nothing is added where the calibration has no staging cost.

    Then the sender's own call that sends it (``send_call``, measured on a one-way chain as the
    sender's call): the message leaves during that call, so its latency already holds it, but the
    sender's program goes on only after it.  In the runtime one call sends all of an exchange's
    messages (`autopar.trainer.comm.exchange_many`), and an edge cannot see the op's other edges:
    each message's call runs on a virtual resource of its own, so that the calls of one exchange
    overlap and its program pays about one.  Where the sender also receives in the exchange, it
    waits for that message meanwhile.  (Left out, the sender-only calls of rnnlm's random plans,
    50-150 us each, 2.4-2.9 ms a step per rank, were missing from their transfer part on the AMD
    VM: docs/simulation.md, "Twenty-seventh round".)"""
    rt: RuntimeCalibration = b.runtime
    pack, place = rt.staging_time(send_part, copied[0]), rt.staging_time(recv_part, copied[1])
    if pack > 0:
        k = key + (-3,)
        tasks.append((k, src, max(pack, MIN_TASK_SECONDS), "overhead", 0.0, "pack"))
        edges += [(q, k) for q in src_after] + [(k, first), (k, src_next)]
        src_after = (k,)
    if rt.send_call is not None:
        k = key + (-6,)
        tasks.append((k, b._delay_resource(k), max(rt.send_call(nbytes), MIN_TASK_SECONDS), "comm", 0.0, "send"))
        edges += [(q, k) for q in src_after] + [(k, src_next)]
    if place > 0:
        k = key + (-4,)
        tasks.append((k, dst, max(place, MIN_TASK_SECONDS), "overhead", 0.0, "place"))
        edges += [(q, k) for q in last] + [(k, nxt) for nxt in dst_next]


def _issue(b, tasks: list, edges: list, keys: list, k: int, bucket, parts: list, beside: float = 0.0) -> None:
    """Each member rank's thread issuing bucket `k`'s all-reduce (the calibrated ``issue``) when
    its program passes the bucket's op, before the program goes on and before the all-reduce (its
    tasks `parts`) starts (`trainer.sync.GradSync._issue`).

    Where the bucket is issued inside the backward pass (from a gradient's hook), its program
    then also pays `beside`: what the all-reduce costs the backward ops its rank runs beside it
    (`RuntimeCalibration.bucket_time`), a task of its own after the issue (`bucket_beside`), so
    that the all-reduce starts when it is issued.  A bucket issued after the backward pass runs
    beside no op of the step."""
    rt: RuntimeCalibration = b.runtime
    n, i = b.num_ops, bucket.after_op - 1
    seconds = rt.issue_time(bucket.nbytes)
    beside = beside if i >= 0 else 0.0
    for d in bucket.devices:
        prev = back_arrive(n, i, d)
        after = grads_out(n, i, d) if i >= 0 else sync_wait(d)
        if seconds > 0:
            key = bucket_issue(k, d)
            tasks.append((key, _CHAIN_BASE + d if rt.launches_async else d, seconds, "overhead", 0.0,
                          f"issue bucket {k}"))
            keys.append(key)
            edges += [(prev, key), (key, after)] + [(key, p) for p in parts]
            prev = key
        if beside > 0:
            key = bucket_beside(k, d)
            tasks.append((key, _CHAIN_BASE + d if rt.launches_async else d, beside, "overhead", 0.0,
                          f"backward beside bucket {k}"))
            keys.append(key)
            edges += [(prev, key), (key, after)]


def batch_draw_time(g, rt: RuntimeCalibration) -> float:
    """Seconds each rank spends drawing a step's synthetic global batch: every input op's tensor
    (the model's inputs and its labels), floating point or integer (`RuntimeCalibration.draw_time`)."""
    seconds = 0.0
    for op in g.ops:
        if op.kind == "input":
            for spec in op.outputs:
                seconds += rt.draw_time(not spec.dtype.startswith(("int", "uint", "bool")), _prod(spec.shape))
    return seconds


def sync_plan(b, holdings: dict) -> tuple:
    """Gradient buckets' all-reduces, each rank's wait for them and its optimizer step, given
    every parameter's holdings (parameter -> device -> boxes)."""
    rt: RuntimeCalibration = b.runtime
    n, g = b.num_ops, b.graph
    tasks, edges, keys = [], [], []
    zeroed = [0.0] * b.num_devices   # bytes of bucket buffers each rank zeroes as the step starts
    views = [0] * b.num_devices      # and the gradients it sets to views of them
    for k, bucket in enumerate(plan_buckets(g, holdings, b.bucket_bytes)):
        for d in bucket.devices:
            zeroed[d] += bucket.nbytes
            views[d] += len(bucket.entries)
        devs = bucket.devices
        r = len(devs)
        seconds, beside = rt.bucket_time(bucket.nbytes, r)
        links: list[int] = []
        for e in range(r):
            for link in b._route(devs[e], devs[(e + 1) % r])[1]:
                if link not in links:
                    links.append(link)
        res = tuple(links) + (tuple(devs) if rt.comm_uses_cores else ())
        parts: list[tuple] = []
        for c, lo in enumerate(range(0, len(res), MAX_PARTS)):
            part = res[lo:lo + MAX_PARTS]
            key = (2, k, c)
            label = f"bucket {k} ({r} ranks, {bucket.nbytes} B)"
            if len(part) == 1:
                tasks.append((key, part[0], seconds, "comm", float(bucket.nbytes), label))
            else:
                tasks.append((key, part, (seconds,) * len(part), "comm", float(bucket.nbytes), label))
            keys.append(key)
            parts.append(key)
            edges += [(back_arrive(n, bucket.after_op - 1, d), key) for d in devs]
            if rt.launches_async:   # the gradients are the kernels' work: the stream must be there too
                edges += [(stream_back(n, bucket.after_op - 1, d), key) for d in devs]
            edges += [(key, sync_wait(d)) for d in devs]
        _issue(b, tasks, edges, keys, k, bucket, parts, beside)
    devices = b.topology.devices
    update_time = b.cost.update_time
    drawn = b._batch_draw_s
    for d in range(b.num_devices):
        o = optimizer_step(d)
        tensors, nbytes, analytic = 0, 0.0, 0.0
        for p, held in holdings.items():
            if d not in held:
                continue
            spec = g.param_specs[p]
            itemsize = spec.nbytes // max(1, _prod(spec.shape))
            shard = union_volume(held[d]) * itemsize
            tensors += 1
            nbytes += shard
            analytic += update_time(shard, devices[d], b.optimizer)
        measured = rt.optimizer_time(b.optimizer, tensors, nbytes) if tensors else 0.0
        seconds = measured if measured is not None else analytic
        z = zero_grad(d)
        zeroing = rt.zero_time(views[d], zeroed[d]) if zeroed[d] else 0.0
        if zeroing is None:
            zeroing = zeroed[d] / devices[d].mem_bandwidth
        tasks.append((z, d, max(drawn + zeroing, MIN_TASK_SECONDS), "overhead", 0.0, "draw the batch, zero grad"))
        tasks.append((o, d, max(seconds, MIN_TASK_SECONDS), "update", 0.0, "optimizer step"))
        keys += (z, o)
        edges.append((sends_waited(d), o))
        if rt.launches_async:   # zeroing and the update are kernels in the stream; the host runs on
            edges += [(z, stream_arrive(0, d)), (stream_back(n, -1, d), o)]
        else:
            edges.append((z, arrive(0, d)))
    return tasks, edges, tuple(keys)


# -- what a simulated step spends its time on ------------------------------------------------------

#: The parts of a step, as the trainer's phase timers split a measured one (`step_parts`).
STEP_PARTS = ("compute", "transfer", "synchronization", "optimizer", "overhead")

#: Bytes of the step's loss that the ranks all-reduce at its end (`trainer.session.Trainer.global_loss`: float64).
LOSS_BYTES = 8


def loss_allreduce_s(b) -> float:
    """Seconds of the all-reduce of the step's loss that ends every rank's step in `autopar train`
    (`trainer.session.Trainer.global_loss`), at the calibrated all-reduce time among all of builder
    `b`'s devices; 0 with one device or without a runtime calibration (the paper's GPU topologies).
    A step that users train and compare with a prediction holds it (`planner.search.plan`,
    `autopar simulate`, `trainer.parts.simulate_parts` without a barrier); the benchmark's steps,
    timed from a barrier to each rank's optimizer step, do not."""
    rt: RuntimeCalibration | None = b.runtime
    return rt.allreduce_time(LOSS_BYTES, b.num_devices) if rt is not None and b.num_devices > 1 else 0.0


def step_parts(b, tg, tl, barrier: bool = True) -> dict[int, dict[str, float]]:
    """Per device, the simulated step (task graph `tg`, timeline `tl` of builder `b`) in the parts
    the trainer's phases time a real one (`autopar.trainer.runtime.PHASES`):

    * ``compute``: the ops' forward and backward tasks less the runtime's per-task overhead,
      which falls between the phases' spans, plus the engine's start-up of an op's own backward
      call, which falls inside them, plus, where communication runs on the ranks' cores, the
      all-reduces' parts on the device's core during the backward pass: a real rank's gloo
      thread takes that time from the ops it runs under, and the phases time it as slower
      compute (less what of it falls while the program waits in an exchange: that is transfer);
      and a bucket's issue where the trainer issues it from a gradient's hook, inside the
      backward call of the op the bucket follows (`trainer.sync.GradSync.accumulated`), so that
      the call's span holds it (rnnlm's data-parallel rows on the AMD VM: 2.3 ms a step), and
      what a bucket's all-reduce costs the backward ops beside it (`bucket_beside`);
    * ``transfer``: the program's time in its ops' exchanges, forward and backward (from reaching
      an exchange to having its inputs, or its gradients, staged: the ``exchange`` and ``grad
      exchange`` spans);
    * ``synchronization``: waiting for the buckets' all-reduces after the backward pass, and then
      for the step's send requests (`_wait_send`; together the ``sync`` span);
    * ``optimizer``: the optimizer step;
    * ``overhead``: the rest of the device's step (the per-task overhead, posting receives,
      zeroing the gradient buckets, issuing a bucket after the backward pass).

    A device's step ends with its optimizer step, which can be before the step's makespan: under
    a plan that places layers, the rank holding the last ones is done while the first ones' backward
    pass still runs.  Where each step starts at a barrier (`barrier`, as `autopar bench accuracy`
    times them), that rank's step ends there, and so do its parts; their sum is its own step.
    Without one (`autopar train`), every rank ends its step in the all-reduce of the step's loss
    (`trainer.session.Trainer.global_loss`), where one done early waits for the slowest: the rest
    of the makespan is synchronization, and so is that all-reduce (`loss_allreduce_s`), and every
    device's parts add up to the step: the makespan and the all-reduce.  (Counting it
    as overhead put 5-7 ms of the peers' backward pass into the overhead of rnnlm's expert rows,
    twice what their rank measured, in every kept run: docs/simulation.md, "Twenty-fifth round";
    until the forty-fourth round it was counted as transfer, on the belief that such a rank went
    on into its next step.)
    """
    rt: RuntimeCalibration = b.runtime
    n = b.num_ops
    grads = b._requires_grad
    out: dict[int, dict[str, float]] = {}
    for d in range(b.num_devices):
        part = dict.fromkeys(STEP_PARTS, 0.0)
        # A wait ends where its barrier does, less the barrier's own nanosecond: the barrier
        # holds the part of a wait the ranks' arrival noise adds (`planner.sim.waits`).
        waits = [(tl.end[arrive(i, d)], tl.end[inputs_in(i, d)] - MIN_TASK_SECONDS) for i in range(n)]
        waits += [(tl.end[grads_out(n, i, d)], tl.end[grads_in(n, i, d)] - MIN_TASK_SECONDS) for i in range(n)]
        part["transfer"] = sum(e - s for s, e in waits)
        end_backward = tl.end[back_arrive(n, -1, d)]
        part["synchronization"] = tl.start[sync_wait(d)] - end_backward
        if rt.comm_uses_cores:
            # An all-reduce's part on this core before the backward pass ends; `spans` gives the
            # part's own window (the task's spans its links' parts too, which run while the core
            # still computes).  Where the program waits in an exchange meanwhile, that time is
            # already transfer, as a real rank's exchange span holds it.
            for key, s, e in tl.spans(d):
                if tg.task(key).kind == "comm":
                    e = min(e, end_backward)
                    if e > s:
                        part["compute"] += e - s - sum(
                            max(0.0, min(e, we) - max(s, ws)) for ws, we in waits if we > ws)
        out[d] = part
    for key in tg:
        info = tg.task(key)
        res = info.resource
        if is_send_wait(key):                   # on the program's own resource, after `sync_wait`
            out[res - _CHAIN_BASE]["synchronization"] += info.duration
            continue
        if isinstance(res, tuple) or res >= b.num_devices:      # a transfer's or an all-reduce's parts
            continue
        if info.kind == "forward":
            out[res]["compute"] += max(0.0, info.duration - (0.0 if rt.launches_async else rt.fwd_task_s))
        elif info.kind == "backward":
            own = 0.0 if rt.launches_async or not grads[n - key[1]] else rt.bwd_task_s
            out[res]["compute"] += max(0.0, info.duration - own)
        elif info.kind == "update":
            out[res]["optimizer"] += info.duration
        elif len(key) == 4 and key[2] == 4:               # an op's own backward call (`engine_call`)
            out[res]["compute"] += info.duration
        elif len(key) == 4 and key == bucket_issue(key[1], res) and sync_wait(res) not in tg.succs(key):   # from a hook
            out[res]["compute"] += info.duration
        elif len(key) == 4 and key == bucket_beside(key[1], res):   # the backward ops beside an all-reduce
            out[res]["compute"] += info.duration
    loss = 0.0 if barrier else loss_allreduce_s(b)
    for d, part in out.items():
        end = tl.end[optimizer_step(d)]
        if not barrier:
            part["synchronization"] += tl.makespan - end + loss
            end = tl.makespan + loss
        part["overhead"] = max(0.0, end - sum(part[p] for p in STEP_PARTS if p != "overhead"))
    return out
