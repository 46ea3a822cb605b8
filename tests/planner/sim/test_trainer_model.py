"""The trainer's model of a step (`planner.sim.trainer_model`): program order on every device,
messages that wait for both ranks, buckets, and the optimizer step after every bucket."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from autopar.planner.cost import CostModel
from autopar.planner.cost.calibration import default_calibration
from autopar.planner.hardware import get_preset
from autopar.planner.ir import data_parallel, model_parallel, random_config, Strategy
from autopar.planner.sim import TaskGraphBuilder, simulate, simulate_strategy
from autopar.planner.sim.trainer_model import is_strided_copy, optimizer_step

from ..search._graphs import diamond, mlp, rnn

GRAPHS = {"mlp": mlp, "diamond": diamond, "rnn": lambda: rnn(steps=3)}


def _random(graph, n, seed):
    rng = random.Random(seed)
    return Strategy.from_mapping(graph, {op.name: random_config(op, n, rng) for op in graph.ops}, "random")


def _moved(g, name="fc2"):
    """Every op of `g` on rank 0 but `name`, on rank 1: its input goes one way forward, its
    gradient one way back."""
    from autopar.planner.ir import ParallelConfig
    one = {op.name: data_parallel(g, 1)[op.name] for op in g.ops}
    return Strategy.from_mapping(g, {**one, name: ParallelConfig(one[name].degrees, (1,))}, "moved")


def test_the_trainers_model_is_used_for_local_ranks_only():
    g = mlp()
    assert TaskGraphBuilder(g, get_preset("local:2"), CostModel()).runtime is not None
    assert TaskGraphBuilder(g, get_preset("p100-1x4"), CostModel()).runtime is None
    flexflow = TaskGraphBuilder(g, get_preset("local:2"), CostModel(), runtime=None).build(data_parallel(g, 2))
    assert not any(k[0] in (0, 1) and flexflow.task(k).kind == "barrier" for k in flexflow)  # no program chain


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("seed", range(4))
def test_every_device_runs_its_tasks_in_program_order(name, seed):
    g = GRAPHS[name]()
    topo = get_preset("local:3")
    b = TaskGraphBuilder(g, topo, CostModel().bind(g))
    tg = b.build(_random(g, 3, seed))
    tl = simulate(tg)
    for d in range(3):
        compute = [k for k in tl.order(d) if tg.task(k).kind in ("forward", "backward")]
        # Forward keys (0, op, 0, task) in graph order, then backward keys (1, n - op, 0, task):
        # key order is the trainer's program order, and the device ran them in it.
        assert compute == sorted(compute)
        starts = [tl.start[k] for k in compute]
        assert starts == sorted(starts)


def _flows(g, strategy, tg) -> dict:
    """(stage, op, input) -> the (sender, receiver) device pairs of its messages, from the message
    keys (stage, op, 1, input, producer task, receiver device, ...)."""
    n = len(g.ops)
    flows: dict = {}
    for k in tg:
        if tg.task(k).kind == "comm" and k[0] in (0, 1) and len(k) >= 6 and k[2] == 1:
            i = k[1] if k[0] == 0 else n - k[1]
            sd = strategy[g.ops[i].inputs[k[3]].op].devices[k[4]]
            flows.setdefault((k[0], i, k[3]), set()).add((sd, k[5]) if k[0] == 0 else (k[5], sd))
    return flows


@pytest.mark.parametrize("seed", range(3))
def test_a_two_way_message_waits_for_both_ranks_a_one_way_message_for_its_sender(seed):
    """Gloo ranks post their receives ahead, so a message leaves when its sender reaches the
    exchange; only an exchange in which the two ranks send to each other meets at the op.  Each
    costs its curve: ``p2p`` two ways, ``p2p_oneway`` one way."""
    g = mlp()
    cal = default_calibration("CPU-core", "gloo", 2)
    b = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), runtime=cal)
    strategy = model_parallel(g, 2) if seed == 0 else _random(g, 2, seed)
    res, tl, tg = simulate_strategy(b, strategy)
    n = len(g.ops)
    flows = _flows(g, strategy, tg)
    kinds = set()
    for k in tg:
        if not (tg.task(k).kind == "comm" and k[0] in (0, 1) and len(k) == 7 and k[2] == 1 and k[-1] == -1):
            continue
        stage, i = k[0], (k[1] if k[0] == 0 else n - k[1])
        sd = strategy[g.ops[i].inputs[k[3]].op].devices[k[4]]
        src, dst = (sd, k[5]) if stage == 0 else (k[5], sd)
        two_way = (k[5], sd) in flows[(0, i, k[3])]
        kinds.add(two_way)
        arrive = (lambda d: (0, i, -1, d, 0)) if stage == 0 else (lambda d: (1, n - i, 2, d, 0))
        assert tl.start[k] >= tl.end[arrive(src)] - 1e-12             # the sender got there
        assert (arrive(dst) in tg.preds(k)) == two_way                  # the receiver too, two ways only
        wire = tg.task(k[:-1] + (0,))
        latency = tg.task(k).duration
        serial = tg.task(k[:-1] + (-2,)).duration if k[:-1] + (-2,) in tg else 0.0
        total = cal.message_time(wire.nbytes, two_way)
        assert latency + wire.duration + 2 * serial == pytest.approx(max(total, 0) + cal.exchange_s, rel=1e-6, abs=2e-9)
    assert kinds    # the plans move data
    assert cal.message_time(1 << 20, False) < cal.message_time(1 << 20, True)


def test_a_one_way_message_can_arrive_before_its_receiver_reaches_the_op():
    """Everything on rank 0 but the last layer, on rank 1: its input leaves rank 0 as soon
    as rank 0 sends it, and only NCCL ranks (which post a receive with its exchange) meet first."""
    from dataclasses import replace
    g = mlp()
    i = [op.name for op in g.ops].index("fc2")
    moved = _moved(g)
    for backend, meets in (("gloo", False), ("nccl", True)):
        cal = replace(default_calibration("CPU-core", "gloo", 2), backend=backend)
        tg = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), runtime=cal).build(moved)
        msgs = [k for k in tg if tg.task(k).kind == "comm" and k[0] == 0 and k[1] == i and k[-1] == -1]
        assert msgs and cal.receives_ahead != meets
        for k in msgs:
            assert ((0, i, -1, 1, 0) in tg.preds(k)) == meets
            assert (0, i, -1, 0, 0) in tg.preds(k)


def test_the_messages_of_one_exchange_between_two_ranks_queue_one_after_another():
    """Every message of op i's exchange between ranks a and b, either way, waits its turn on one
    resource of the pair for ``message_serial_s``; the latency of its own is shortened by two
    of them, so one message each way costs the point-to-point time."""
    from dataclasses import replace
    g = mlp()
    cal = replace(default_calibration("CPU-core", "gloo", 2), message_serial_s=50e-6, p2p_oneway=None)
    b = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), runtime=cal)
    res, tl, tg = simulate_strategy(b, model_parallel(g, 2))
    queued = [k for k in tg if tg.task(k).kind == "comm" and k[-1] == -2]
    assert queued
    by_pair: dict = {}
    for k in queued:
        task = tg.task(k)
        assert task.duration == pytest.approx(50e-6)
        by_pair.setdefault(task.resource, []).append(k)
        own = tg.task(k[:-1] + (-1,))
        assert own.duration == pytest.approx(cal.p2p(0.0) + cal.exchange_s - 100e-6)
    for resource, keys in by_pair.items():
        assert len({(k[0], k[1]) for k in keys}) == 1          # one exchange's messages per resource
        spans = sorted((tl.start[k], tl.end[k]) for k in keys)
        assert all(b0 >= a1 - 1e-12 for (_, a1), (b0, _) in zip(spans, spans[1:]))   # one after another
    plain = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), runtime=replace(cal, message_serial_s=0.0))
    assert not [k for k in plain.build(model_parallel(g, 2)) if k[-1] == -2]


def test_only_a_messages_wire_time_queues_on_the_link_the_rest_of_its_time_is_waited_side_by_side():
    """With a calibrated ``wire`` curve a message holds its link for the wire time of its bytes,
    and its latency task is the rest of the point-to-point time for its size (plus the exchange
    overhead): one message costs what the curve says either way, and the messages of one
    exchange queue only their wire time.  Without it, everything beyond an empty message queues."""
    from dataclasses import replace
    from autopar.planner.cost import Curve
    g = mlp()
    base = replace(default_calibration("CPU-core", "gloo", 2), staging=(), message_serial_s=0.0,
                   p2p=Curve(((0.0, 100e-6), (1e6, 1.1e-3))), p2p_oneway=None)
    wired = replace(base, wire=Curve(((0.0, 0.0), (1e6, 0.1e-3))))
    topo = get_preset("local:2")
    steps = {}
    for name, cal in (("plain", base), ("wired", wired)):
        res, tl, tg = simulate_strategy(TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal), model_parallel(g, 2))
        wires = {k[:-1]: tg.task(k) for k in tg if tg.task(k).kind == "comm" and k[-1] == 0}
        assert wires
        for key, wire in wires.items():
            latency = tg.task(key + (-1,)).duration
            assert wire.duration == pytest.approx(max(cal.wire_time(wire.nbytes), 1e-9), abs=1e-9)
            assert latency + wire.duration == pytest.approx(cal.p2p(wire.nbytes) + cal.exchange_s, abs=2e-9)
            if name == "wired" and wire.nbytes > 0:
                assert wire.duration == pytest.approx(wire.nbytes * 1e-10) and latency > base.p2p(0.0)
        steps[name] = res.step_time
    assert steps["wired"] <= steps["plain"] + 1e-12
    assert base.wire_time(5e5) == pytest.approx(0.5e-3) and wired.wire_time(5e5) == pytest.approx(0.05e-3)
    assert replace(base, wire=Curve(((0.0, 0.0), (1e6, 5e-3)))).wire_time(1e6) == pytest.approx(1.1e-3)  # capped


def test_each_message_is_packed_by_its_sender_and_placed_by_its_receiver_on_their_cores():
    """With staging curves, every message gets a pack task on the sending rank's device before it
    leaves and a place task on the receiving rank's device after it arrives, lasting the curve's
    time for its bytes, or its smallest call where the trainer copies none of them
    (`trainer_model._copies`); the sender's program waits for its packing and the receiver's for its
    placing, so the step grows; without curves there are none."""
    from dataclasses import replace
    from autopar.planner.cost import Curve
    from autopar.planner.cost.calibration import STAGING_PARTS
    g = mlp()
    base = replace(default_calibration("CPU-core", "gloo", 2), staging=())
    curves = tuple(Curve(((0.0, (k + 1) * 10e-6), (1e6, (k + 1) * 10e-6 + 1e-3))) for k in range(len(STAGING_PARTS)))
    cal = replace(base, staging=curves)
    topo = get_preset("local:2")
    b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal)
    res, tl, tg = simulate_strategy(b, model_parallel(g, 2))
    wires = {k[:-1]: tg.task(k) for k in tg if tg.task(k).kind == "comm" and k[-1] == 0}
    assert wires
    n = len(g.ops)
    for key, wire in wires.items():
        forward = key[0] == 0
        pack, place = tg.task(key + (-3,)), tg.task(key + (-4,))
        send_part, recv_part = (0, 1) if forward else (2, 3)
        assert pack.duration in (cal.staging_time(send_part, wire.nbytes), cal.staging_time(send_part, 0))
        assert place.duration in (cal.staging_time(recv_part, wire.nbytes), cal.staging_time(recv_part, 0))
        assert pack.kind == place.kind == "overhead"
        assert {pack.resource, place.resource} == {0, 1}
        assert tl.end[key + (-3,)] <= tl.start[key + (-1,)] + 1e-12           # packed before it leaves
        assert tl.start[key + (-4,)] >= tl.end[key + (0,)] - 1e-12            # placed after it arrived
        i = key[1] if forward else n - key[1]
        dst = place.resource
        after = (0, i, -1, dst, 1) if forward else (1, n - i, 2, dst, 1)
        assert tl.end[key + (-4,)] <= tl.start[after] + 1e-12                  # before the program goes on
    plain_res, _, plain_tg = simulate_strategy(TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=base),
                                               model_parallel(g, 2))
    assert not [k for k in plain_tg if k[-1] in (-3, -4)]
    assert res.step_time > plain_res.step_time


def test_a_senders_own_call_holds_its_program_not_its_message():
    """``send_call``: the sender's program goes on only after its call that sends a message (after
    packing it), on a virtual resource of the message's own; the message leaves as before, and
    the receiver does not pay it.  Without the curve there is no such task."""
    from dataclasses import replace

    from autopar.planner.cost import Curve
    g = mlp()
    topo = get_preset("local:2")
    cal = replace(default_calibration("CPU-core", "gloo", 2), send_call=Curve(((0.0, 300e-6), (1e6, 1.3e-3))))
    res, tl, tg = simulate_strategy(TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal), _moved(g))
    n = len(g.ops)
    calls = [k for k in tg if len(k) == 7 and k[2] == 1 and k[-1] == -6]
    assert {k[0] for k in calls} == {0, 1}                   # the activation forward, its gradient back
    for k in calls:
        key, task = k[:-1], tg.task(k)
        nbytes = tg.task(key + (0,)).nbytes
        assert task.duration == pytest.approx(cal.send_call(nbytes)) and task.resource >= topo.num_devices
        sender = tg.task(key + (-3,)).resource                  # who packed it
        i = key[1] if key[0] == 0 else n - key[1]
        goes_on = (0, i, -1, sender, 1) if key[0] == 0 else (1, n - i, 2, sender, 1)
        assert tl.start[k] >= tl.end[key + (-3,)] - 1e-12 and tl.start[goes_on] >= tl.end[k] - 1e-12
        assert k not in tg.preds(key + (-1,))                   # the message does not wait for it
    _, plain_tl, plain_tg = simulate_strategy(
        TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=replace(cal, send_call=None)), _moved(g))
    assert not [k for k in plain_tg if len(k) == 7 and k[-1] == -6]
    # Rank 0 sends fc2's input and goes on later by its call (it has nothing else to wait for there).
    i = [op.name for op in g.ops].index("fc2")
    (forward,) = [k for k in calls if k[0] == 0 and k[1] == i]
    assert tl.end[(0, i, -1, 0, 1)] - plain_tl.end[(0, i, -1, 0, 1)] == pytest.approx(tg.task(forward).duration)


def test_a_senders_own_call_does_not_move_its_arrival_at_an_exchange_whose_waits_are_priced_at_their_mean():
    """With arrival noise, a wait is priced from the program's arrival at the exchange
    (`planner.sim.waits`), which is when its messages leave; the sender's own call after it only
    bounds the wait's end.  At a two-way exchange both ranks reach at the same moments with the
    call as without it, and whose incoming message takes far longer than the call, the priced
    wait is the same."""
    from dataclasses import replace

    from autopar.planner.cost import Curve
    from autopar.planner.sim.waits import mean_waits
    g = rnn(steps=3)
    flat = Curve.fit([(1, 9e-8), (1 << 30, 9e-8)])
    noisy = replace(default_calibration("CPU-core", "gloo", 2), jitter=2e-5, latency_var=flat, leave_var=flat)
    topo, strategy = get_preset("local:2"), model_parallel(g, 2)
    runs = []
    for call in (None, Curve(((0.0, 20e-6), (1e9, 40e-6)))):
        b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=replace(noisy, send_call=call))
        tg = b.build(strategy)
        tl = simulate(tg)
        runs.append((mean_waits(b, tg, tl), tg, tl))
    (plain, _, plain_tl), (priced, tg, tl) = runs
    same = [w for w in priced if w[0] == 0 and [p for p in tg.preds(w) if len(p) == 7 and p[-1] == -6]
            and all(tl.end[(0, w[1], -1, d, 0)] == pytest.approx(plain_tl.end[(0, w[1], -1, d, 0)], abs=1e-12)
                    for d in (0, 1))]
    assert same                                      # a two-way exchange both reach as before
    for w in same:
        assert priced[w] > 0 and priced[w] == pytest.approx(plain[w], rel=1e-9, abs=1e-12)


def test_the_optimizer_steps_after_every_bucket_of_its_rank():
    g = rnn(steps=3)
    cal = default_calibration("CPU-core", "gloo", 2)
    b = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), runtime=cal, bucket_bytes=64)
    res, tl, tg = simulate_strategy(b, data_parallel(g, 2))
    buckets = [k for k in tg if k[0] == 2]
    assert len(buckets) > 1                    # small buckets: several all-reduces
    for d in (0, 1):
        step = (4, 1, d)
        assert tg.task(step).kind == "update"
        assert all(tl.start[step] >= tl.end[k] for k in buckets)
    assert res.step_time == max(tl.end[(4, 1, d)] for d in (0, 1))


def test_a_calibrated_optimizer_replaces_the_analytic_update():
    g = mlp()
    cal = default_calibration("CPU-core", "gloo", 2)
    b = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), runtime=cal)
    tg = b.build(data_parallel(g, 2))
    params = g.param_specs
    expected = cal.optimizer_time("sgd", len(params), sum(p.nbytes for p in params.values()))
    assert tg.task((4, 1, 0)).duration == pytest.approx(expected)


def test_a_measured_nccl_calibration_puts_a_gpu_topology_on_the_trainers_model():
    from dataclasses import replace

    from autopar.planner.cost import ProfileCache
    topo = get_preset("p100-1x4")
    cache = ProfileCache()
    assert TaskGraphBuilder(mlp(), topo, CostModel(cache)).runtime is None      # nothing measured: FlexFlow's
    cal = replace(default_calibration(topo.devices[0].product, "nccl", 4), source="measured")
    cache.put_calibration(cal)
    assert TaskGraphBuilder(mlp(), topo, CostModel(cache)).runtime == cal


def _gpu_step(g, forward: float, host: float, runtime_s: float = 0.0) -> float:
    """The simulated single-device step of `g` on a GPU whose every task's kernels take `forward`
    seconds (backward too) and whose host takes `host` seconds to issue them."""
    from dataclasses import replace

    from autopar.planner.cost.model import Estimate
    from autopar.planner.ir import single_device

    class Fixed(CostModel):
        def task_cost(self, op, degrees, device, input_shapes=None):
            return Estimate(forward, forward, "profile", (host, host))

    topo = get_preset("p100-1x4")
    cal = replace(default_calibration(topo.devices[0].product, "nccl", 4), fwd_task_s=runtime_s,
                  bwd_task_s=runtime_s, optimizer=(("sgd", 0.0, 0.0),), source="measured")
    assert cal.launches_async
    res, _, _ = simulate_strategy(TaskGraphBuilder(g, topo, Fixed().bind(g), "sgd", runtime=cal), single_device(g))
    return res.step_time


def test_on_gpus_the_host_runs_ahead_of_the_kernels_it_issues():
    """Two streams per GPU: the host issues each task (its host seconds plus the runtime's overhead)
    and goes on; the kernels run behind it in program order.  A step costs about the slower
    stream's sum, not the sum of both."""
    from autopar.planner.sim import requires_grad
    g = mlp()
    tasks = len(g.ops) + sum(requires_grad(g))
    ms = 1e-3
    device_bound = _gpu_step(g, forward=ms, host=1e-6)
    host_bound = _gpu_step(g, forward=1e-6, host=ms)
    assert device_bound == pytest.approx(tasks * ms, rel=0.02)
    assert host_bound == pytest.approx(tasks * ms, rel=0.02)
    # Equal streams overlap: about one task longer than either, far from their sum.
    both = _gpu_step(g, forward=ms, host=ms)
    assert tasks * ms < both <= (tasks + 1.05) * ms
    # The runtime's calibrated per-task cost is host work.
    assert _gpu_step(g, forward=1e-6, host=0.5 * ms, runtime_s=0.5 * ms) == pytest.approx(host_bound, rel=0.02)


def test_on_cpu_ranks_a_task_costs_its_kernel_plus_the_runtimes_overhead():
    from dataclasses import replace

    from autopar.planner.cost.model import Estimate
    from autopar.planner.ir import single_device
    from autopar.planner.sim import requires_grad

    class Fixed(CostModel):
        def task_cost(self, op, degrees, device, input_shapes=None):
            return Estimate(1e-3, 1e-3, "profile", (5.0, 5.0))   # a host time means nothing here

    g = mlp()
    topo = get_preset("local:1")
    cal = replace(default_calibration(topo.devices[0].product, "gloo", 1), fwd_task_s=1e-4, bwd_task_s=1e-4,
                  optimizer=(("sgd", 0.0, 0.0),))
    assert not cal.launches_async
    res, _, _ = simulate_strategy(TaskGraphBuilder(g, topo, Fixed().bind(g), "sgd", runtime=cal), single_device(g))
    tasks = len(g.ops) + sum(requires_grad(g))
    assert res.step_time == pytest.approx(tasks * 1.1e-3, rel=0.02)


def test_an_op_not_fused_into_its_consumer_pays_the_engines_start_up_for_its_own_backward_call():
    """A chain on one rank is one autograd call (the loss op's); split over two ranks every op
    runs its own, and each costs the calibrated ``bwd_call_s`` on its device's program."""
    from dataclasses import replace

    from autopar.planner.cost.model import Estimate
    from autopar.planner.ir import ParallelConfig, single_device
    from autopar.planner.sim import requires_grad

    class Fixed(CostModel):
        def task_cost(self, op, degrees, device, input_shapes=None):
            return Estimate(1e-3, 1e-3, "profile", None)

    g = mlp()
    topo = get_preset("local:2")

    def busy(strategy, call: float) -> tuple[float, float]:
        """(step seconds, seconds of work on the devices)."""
        cal = replace(default_calibration(topo.devices[0].product, "gloo", 2), fwd_task_s=0.0, bwd_task_s=0.0,
                      bwd_call_s=call, optimizer=(("sgd", 0.0, 0.0),), staging=())
        res, _, tg = simulate_strategy(TaskGraphBuilder(g, topo, Fixed().bind(g), "sgd", runtime=cal), strategy)
        return res.step_time, sum(tg.task(k).duration for k in tg if tg.task(k).resource in (0, 1))

    one = single_device(g)
    (s1, w1), (s0, w0) = busy(one, 1e-3), busy(one, 0.0)
    assert s1 - s0 == pytest.approx(1e-3, rel=1e-3) and w1 - w0 == pytest.approx(1e-3, rel=1e-3)  # the loss op's
    # Alternating ranks: no edge stays on one rank, so every op with a backward pass calls on its own.
    place = {"fc1": 1, "relu": 0, "fc2": 1, "loss": 0}
    alternating = Strategy.from_mapping(g, {op.name: ParallelConfig((1,) * len(op.pardims), (place.get(op.name, 0),))
                                            for op in g.ops}, "alternating")
    own = sum(1 for op, grad in zip(g.ops, requires_grad(g)) if grad and op.inputs)
    assert own == len(place)
    (s1, w1), (s0, w0) = busy(alternating, 1e-3), busy(alternating, 0.0)
    assert w1 - w0 == pytest.approx(own * 1e-3, rel=1e-3)
    assert s1 - s0 >= (own - 1) * 1e-3 * 0.99      # the ranks take turns: nearly all of it is on the path


def test_every_receive_is_posted_on_its_receivers_core_before_the_step_begins():
    """gloo ranks post a step's receives ahead (`trainer.comm.RecvAhead`): one ``post_s`` per
    message on the receiving device, before that device's first op."""
    from dataclasses import replace

    g = mlp()
    topo = get_preset("local:2")
    strategy = model_parallel(g, 2)
    cal = replace(default_calibration(topo.devices[0].product, "gloo", 2), post_s=1e-3)
    res, tl, tg = simulate_strategy(TaskGraphBuilder(g, topo, CostModel().bind(g), "sgd", runtime=cal), strategy)
    posts = [k for k in tg if tg.task(k).label == "post receive"]
    messages = [k for k in tg if len(k) == 7 and k[-1] == -1]        # each message's latency
    assert posts and len(posts) == len(messages)
    for k in posts:
        d = tg.task(k).resource
        first = min(tl.start[f] for f in tg if f[:1] == (0,) and len(f) == 4 and tg.task(f).kind == "forward"
                    and tg.task(f).resource == d)
        assert tg.task(k).duration == 1e-3 and tl.start[k] + 1e-3 <= first + 1e-12
    no_posts = simulate_strategy(TaskGraphBuilder(g, topo, CostModel().bind(g), "sgd",
                                                  runtime=replace(cal, post_s=0.0)), strategy)[0]
    assert res.step_time > no_posts.step_time


def _alternating_cells(g):
    """rnn's cells on ranks 0, 1, 0 and every other op on rank 0: cell_1 receives its step's input
    and both of cell's outputs from rank 0 and sends both gradients back; cell_2 receives both of
    cell_1's outputs from rank 1."""
    from autopar.planner.ir import ParallelConfig
    place = {"cell_1": 1}
    return Strategy.from_mapping(g, {op.name: ParallelConfig((1,) * len(op.pardims), (place.get(op.name, 0),))
                                     for op in g.ops}, "alternating cells")


def test_an_ops_inputs_from_one_peer_come_as_one_message_with_one_receive_posted(monkeypatch):
    """The trainer's exchange sends the pieces a rank has for one peer, of one dtype, as one
    message up to `COALESCE_BYTES` (`trainer.comm.exchange_many`), and the receiver posts one
    receive for it: one ``post_s`` per (op, direction, sender, receiver), not one per input."""
    from autopar.planner.sim import trainer_model

    g = rnn(steps=3)
    topo = get_preset("local:2")
    cal = replace(default_calibration(topo.devices[0].product, "gloo", 2), post_s=1e-3)
    strategy = _alternating_cells(g)

    def posts():
        b = TaskGraphBuilder(g, topo, CostModel().bind(g), "sgd", runtime=cal)
        res, _, tg = simulate_strategy(b, strategy)
        return res.step_time, sorted((k[0], k[1], tg.task(k).resource) for k in tg
                                     if tg.task(k).label == "post receive")

    n = len(g.ops)
    step, got = posts()
    i1, i2 = g.index["cell_1"], g.index["cell_2"]
    # cell_1: one forward message from rank 0 (three inputs), one gradient message back (two:
    # the step's input needs none); cell_2: one forward message (two inputs) and one back; out,
    # on rank 0 with cell_2, none.
    assert got == sorted([(0, i1, 1), (1, n - i1, 0), (0, i2, 0), (1, n - i2, 1)])
    monkeypatch.setattr(trainer_model, "COALESCE_BYTES", 0)           # every piece a message of its own
    apart_step, apart = posts()
    assert len(apart) == 3 + 2 + 2 + 2 and apart_step > step


def test_a_producer_moved_in_a_delta_session_reposts_its_consumers_other_inputs():
    """Whether an input's piece rides in another input's message depends on every producer of
    the op (`trainer_model.riders`): moving one producer rebuilds the consumer's other edges, and
    the session's timeline stays the one a full build gives."""
    from autopar.planner.ir import ParallelConfig
    from autopar.planner.sim import DeltaSession

    g = rnn(steps=3)
    topo = get_preset("local:2")
    cal = replace(default_calibration(topo.devices[0].product, "gloo", 2), post_s=1e-3)
    b = TaskGraphBuilder(g, topo, CostModel().bind(g), "sgd", runtime=cal)
    session = DeltaSession(b, _alternating_cells(g))
    for name, dev in (("getitem_3", 1), ("cell", 1), ("getitem_3", 0), ("cell", 0)):
        session.change(name, ParallelConfig(session.strategy[name].degrees, (dev,)))
        full = simulate(b.build(session.strategy))
        assert session.timeline().same_as(full), f"after moving {name} to rank {dev}"


def _stage_tasks(g, strategy, cal):
    from autopar.planner.cost.calibration import STAGING_PARTS
    _, _, tg = simulate_strategy(TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g), "sgd", runtime=cal),
                                 strategy)
    return {(k[0], k[1], tg.task(k).label): tg.task(k).duration for k in tg
            if tg.task(k).label in ("pack", "place")}, STAGING_PARTS, tg


def test_a_message_is_staged_with_a_copy_only_where_the_trainer_copies_it():
    """`trainer.redistribute` copies a message's bytes only where a piece is not one run of its
    tensor, a consumer assembles its box, or a gradient is added into a buffer; elsewhere it
    stages it as it is, and the simulator charges the calibration's smallest call."""
    g = mlp(batch=256, width=512)
    cal = default_calibration("CPU-core", "gloo", 2)
    stage, parts, _ = _stage_tasks(g, model_parallel(g, 2), cal)     # fc1, relu, fc2 split by features
    fs, fr, gs, gr = (parts.index(p) for p in ("forward_send", "forward_receive", "gradient_send",
                                               "gradient_receive"))
    n, fc1, fc2 = len(g.ops), g.index["fc1"], g.index["fc2"]
    half = 256 * 256 * 4

    def small(part):
        return cal.staging_time(part, 0)

    # x goes whole from rank 0 to fc1's task on rank 1, which reads it as it is.
    assert stage[(0, fc1, "pack")] == small(fs) and stage[(0, fc1, "place")] == small(fr)
    # Each rank sends its whole relu half as it is; fc2's task assembles both halves.
    assert stage[(0, fc2, "pack")] == small(fs)
    assert stage[(0, fc2, "place")] == cal.staging_time(fr, half) > small(fr)
    # Back, a block of columns of fc2's input gradient is cut out, and added into a relu half
    # that the rank's own fc2 task adds into too.
    assert stage[(1, n - fc2, "pack")] == cal.staging_time(gs, half) > small(gs)
    assert stage[(1, n - fc2, "place")] == cal.staging_time(gr, half) > small(gr)
    moved, _, _ = _stage_tasks(g, _moved(g), cal)             # fc2 alone on rank 1: relu's output whole
    assert {v for (_, i, _), v in moved.items() if i in (fc2, n - fc2)} <= {small(p) for p in range(4)}


def test_a_task_that_reads_a_strided_cut_of_a_local_output_pays_a_copy_of_it():
    """A consumer task whose whole input is a cut of a local output that is not one run of its
    memory gets a contiguous copy (`trainer.redistribute.forward_inputs`): the cost model's copy
    time on its device, inside its op's exchange."""
    from autopar.planner.ir import ParallelConfig

    g = mlp(batch=256, width=512)
    one = data_parallel(g, 1)
    strategy = Strategy.from_mapping(g, {**{op.name: one[op.name] for op in g.ops},
                                         "relu": ParallelConfig((1, 2), (0, 1))}, "relu split by features")
    cal = default_calibration("CPU-core", "gloo", 2)
    _, _, tg = _stage_tasks(g, strategy, cal)
    copies = [k for k in tg if tg.task(k).label == "copy a strided input"]
    relu = g.index["relu"]
    assert [(k[1], tg.task(k).resource) for k in copies] == [(relu, 0)]       # rank 1's half is a message
    device = get_preset("local:2").devices[0]
    assert tg.task(copies[0]).duration == CostModel().copy_time(256 * 256 * 4, device) > 0


def test_gloo_ranks_hold_the_buffers_of_the_gradients_they_will_receive_at_the_forward_peak():
    """Receives are posted as the step begins (`trainer.comm.RecvAhead`): a piece sent forward
    whose gradient comes back costs its sender that many bytes at the peak too; on NCCL ranks
    and in FlexFlow's model nothing is posted ahead."""
    from dataclasses import replace

    from autopar.planner.sim import peak_memory
    from autopar.planner.sim.memory import edge_memory

    g = mlp()
    topo = get_preset("local:2")
    strategy = model_parallel(g, 2)
    gloo = TaskGraphBuilder(g, topo, CostModel().bind(g))
    plain = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=None)
    nccl = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=replace(gloo.runtime, backend="nccl"))
    sent: dict[int, int] = {}
    for op in g.ops:
        for j, ref in enumerate(op.inputs):
            spec = g[ref.op].outputs[ref.index]
            if spec.dtype != "float32" or not gloo._requires_grad[g.index[ref.op]]:
                continue
            for tr in gloo.transfers(op, j, strategy[op.name], strategy[ref.op], spec.itemsize)[0]:
                sent[tr.src_dev] = sent.get(tr.src_dev, 0) + int(tr.nbytes)
    assert sum(sent.values()) > 0
    base = peak_memory(plain, strategy)
    assert peak_memory(nccl, strategy) == base
    assert peak_memory(gloo, strategy) == {d: base[d] + sent.get(d, 0) for d in base}
    labels = next(op for op in g.ops if op.name == "loss")       # int64 labels send no gradient back
    j = next(j for j, ref in enumerate(labels.inputs) if ref.op == "labels")
    assert edge_memory(gloo, labels, j, strategy["loss"], strategy["labels"]) == \
        edge_memory(plain, labels, j, strategy["loss"], strategy["labels"])


def test_a_simulated_step_splits_into_the_parts_the_trainers_phases_time():
    """`step_parts`: the parts add up to the step on every device; a single device moves nothing
    and synchronizes nothing, model parallelism spends time in exchanges, and data parallelism in
    its buckets' all-reduces: the mlp's first layer has parameters, so its bucket is final only as
    the backward pass ends (the rnn's leaves slices' backward after it, which the all-reduce
    holds up on the ranks' cores instead)."""
    from autopar.planner.ir import single_device
    from autopar.planner.sim import STEP_PARTS, loss_allreduce_s, step_parts

    g = rnn(steps=3)
    topo = get_preset("local:2")
    b = TaskGraphBuilder(g, topo, CostModel().bind(g))

    def parts(strategy, b=b):
        res, tl, tg = simulate_strategy(b, strategy)
        out = step_parts(b, tg, tl)
        for d, p in out.items():
            assert set(p) == set(STEP_PARTS) and min(p.values()) >= 0
            assert sum(p.values()) == pytest.approx(tl.end[optimizer_step(d)], rel=1e-9)
        for p in step_parts(b, tg, tl, barrier=False).values():    # and the loss's all-reduce
            assert sum(p.values()) == pytest.approx(res.step_time + loss_allreduce_s(b), rel=1e-9)
        assert max(sum(p.values()) for p in out.values()) == pytest.approx(res.step_time, rel=1e-9)
        return out

    one = parts(single_device(g))[0]
    # One device moves nothing; its exchanges only copy the strided cuts of x its steps' getitems read.
    _, _, tg = simulate_strategy(b, single_device(g))
    copies = sum(tg.task(k).duration for k in tg if is_strided_copy(k))
    assert one["transfer"] == pytest.approx(copies, rel=1e-6) and one["synchronization"] == pytest.approx(0, abs=1e-6)
    assert min(one["compute"], one["overhead"], one["optimizer"]) > 0
    assert max(p["transfer"] for p in parts(model_parallel(g, 2)).values()) > 0
    m = mlp()
    dp = parts(data_parallel(m, 2), TaskGraphBuilder(m, topo, CostModel().bind(m)))
    assert min(p["synchronization"] for p in dp.values()) > 0


def test_a_ranks_exchange_calls_that_move_nothing_are_its_transfer():
    """On one rank the runtime still calls every op's exchange forward (assembling its inputs) and,
    where a gradient leaves its consumer's autograd call, backward (adding it into the producer's
    accumulator): each costs the model's own ``local_exchange_s``, inside the exchange, so it is
    transfer, and all of it is on the step's path."""
    from autopar.planner.ir import single_device
    from autopar.planner.sim import step_parts

    g = rnn(steps=3)
    topo = get_preset("local:2")
    cal = default_calibration(topo.devices[0].product, "gloo", 2)
    calls = (2e-5, 5e-5)

    def run(local):
        b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=replace(cal, local_exchange_s=local))
        res, tl, tg = simulate_strategy(b, single_device(g))
        labels = [tg.task(k).label for k in tg if tg.task(k).kind == "overhead"]   # one rank
        return res.step_time, step_parts(b, tg, tl)[0]["transfer"], labels

    step0, transfer0, labels0 = run((0.0, 0.0))
    step1, transfer1, labels1 = run(calls)
    fwd = sum(label.startswith("exchange ") for label in labels1)
    bwd = sum(label.startswith("grad exchange ") for label in labels1)
    # Without the calls, the exchanges only copy the strided cuts of x that the getitems read.
    assert not any(label.startswith(("exchange ", "grad exchange ")) for label in labels0)
    assert transfer0 == pytest.approx(labels0.count("copy a strided input") * CostModel().copy_time(
        4 * 4 * 4, topo.devices[0]), rel=1e-6) and transfer0 > 0
    assert fwd == sum(1 for op in g.ops if op.inputs) and 0 < bwd < fwd
    # A copy runs beside its exchange's call (`trainer_model._strided`), which the model's own steps
    # timed with their copies in it: the exchange lasts the longer of the two.
    assert fwd * calls[0] + bwd * calls[1] <= transfer1 + 1e-12 <= fwd * calls[0] + bwd * calls[1] + transfer0
    assert step1 - step0 == pytest.approx(transfer1 - transfer0, rel=1e-6)


def test_a_rank_done_before_the_step_ends_has_parts_up_to_its_own_end():
    """Layers placed, the first half on device 0 and the rest on device 1: device 1's backward
    pass is done while device 0's still runs.  Where steps start at a barrier (the benchmark),
    device 1's parts end with its own optimizer step, before the makespan, and none of device 0's
    backward pass is its overhead; without the barrier (`autopar train`), it waits for its peer
    in the all-reduce of the step's loss that ends every step, and that wait is synchronization,
    as is the all-reduce itself (its calibrated time for 8 B between the 2 ranks).  Its other
    parts are the same either way."""
    from autopar.planner.ir import ParallelConfig
    from autopar.planner.sim import STEP_PARTS, loss_allreduce_s, step_parts

    g = mlp()
    half = len(g.ops) // 2
    placed = Strategy.from_mapping(g, {op.name: ParallelConfig((1,) * len(op.pardims), (int(k >= half),))
                                       for k, op in enumerate(g.ops)}, "layers placed")
    b = TaskGraphBuilder(g, get_preset("local:2"), CostModel().bind(g))
    res, tl, tg = simulate_strategy(b, placed)
    ends = {d: tl.end[optimizer_step(d)] for d in (0, 1)}
    assert ends[1] < ends[0] == pytest.approx(res.step_time, rel=1e-9)
    timed, steady = step_parts(b, tg, tl), step_parts(b, tg, tl, barrier=False)
    loss = loss_allreduce_s(b)
    assert loss == b.runtime.allreduce_time(8, 2) > 0
    for d in (0, 1):
        assert sum(timed[d].values()) == pytest.approx(ends[d], rel=1e-9)
        assert sum(steady[d].values()) == pytest.approx(res.step_time + loss, rel=1e-9)
        assert (steady[d]["synchronization"] - timed[d]["synchronization"]
                == pytest.approx(res.step_time - ends[d] + loss, abs=1e-12))
        for p in set(STEP_PARTS) - {"synchronization"}:
            assert steady[d][p] == pytest.approx(timed[d][p], abs=1e-12)


def test_an_all_reduce_on_the_ranks_cores_counts_once_in_the_parts():
    """Where gloo's all-reduce runs on the ranks' cores, its part on a core can start after its
    parts on the links, while the core still computes (alexnet's expert plan: the convolutions'
    bucket is ready before the last convolution's backward pass ends).  `step_parts` counts the
    core's own part, from its own start, as compute (a real rank's phases time it so), so the
    parts add up to the step without swallowing the overhead (it was 0.0 ms in every benchmark
    run of the twelfth round), and synchronization is the wait after the backward pass."""
    import copy
    from dataclasses import replace

    from autopar.planner.search import named_strategy
    from autopar.planner.sim import step_parts
    from autopar.planner.sim.trainer_model import back_arrive, is_send_wait, sync_wait
    from autopar.planner.zoo import load_model
    from autopar.planner.ir import import_spec

    g = import_spec(load_model("alexnet", batch=8, image=63, classes=10, fc=256))
    topo = get_preset("local:2")
    cal = default_calibration("CPU-core", "gloo", 2)
    assert cal.comm_uses_cores
    b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal)
    res, tl, tg = simulate_strategy(b, named_strategy("expert", g, topo))
    late = [(key, dict((r, s) for r, s, _ in tl.parts(key))) for key in tg
            if tg.task(key).kind == "comm" and isinstance(tg.task(key).resource, tuple)
            and set(range(b.num_devices)) <= set(tg.task(key).resource)]
    assert any(starts[0] > tl.start[key] for key, starts in late)      # the case this test is about
    unshared = copy.copy(b)                 # the same timeline, read as if the cores ran no all-reduce
    unshared.runtime = replace(cal, comm_uses_cores=False)
    bare = step_parts(unshared, tg, tl)
    for d, p in step_parts(b, tg, tl).items():
        end_backward = tl.end[back_arrive(b.num_ops, -1, d)]
        on_core = sum(max(0.0, min(e, end_backward) - s) for key, s, e in tl.spans(d) if tg.task(key).kind == "comm")
        assert on_core > 0
        assert p["compute"] - bare[d]["compute"] == pytest.approx(on_core, rel=1e-9)
        # the buckets' wait, then the send requests' (`trainer_model._wait_send`)
        waited = sum(tg.task(k).duration for k in tg if is_send_wait(k)
                     and tg.task(k).resource == tg.task(sync_wait(d)).resource)
        assert waited > 0
        assert p["synchronization"] == pytest.approx(tl.start[sync_wait(d)] - end_backward + waited, rel=1e-9)
        assert sum(v for k, v in p.items() if k != "overhead") <= res.step_time + 1e-12
        assert sum(p.values()) == pytest.approx(res.step_time, rel=1e-9) and p["overhead"] > 0


def test_a_bucket_issued_from_a_gradient_hook_is_compute_in_the_parts():
    """The trainer issues a bucket's all-reduce from the hook of its last gradient, inside the
    backward call of the op it follows, so the call's span holds the issue: `step_parts` counts it
    as compute.  Only a bucket issued after the backward pass (before the wait for the buckets) is
    overhead.  With the all-reduces off the cores, the compute part grows by exactly the longer
    issue of every hook-issued bucket."""
    from dataclasses import replace

    from autopar.planner.cost.calibration import Curve
    from autopar.planner.sim import step_parts
    from autopar.planner.sim.trainer_model import bucket_issue, sync_wait

    g = mlp()
    topo = get_preset("local:2")
    base = replace(default_calibration("CPU-core", "gloo", 2), comm_uses_cores=False)
    computes, hooked = [], []
    for seconds in (1e-6, 1e-3):
        cal = replace(base, issue=Curve(((0.0, seconds),)))
        b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal, bucket_bytes=100)
        res, tl, tg = simulate_strategy(b, data_parallel(g, 2))
        issues = [k for k in tg if len(k) == 4 and k == bucket_issue(k[1], k[3])]
        hooked.append(sorted(k for k in issues if sync_wait(k[3]) not in tg.succs(k)))
        assert len(issues) >= 2 * 2 and hooked[-1]                  # several buckets, on both ranks
        computes.append(step_parts(b, tg, tl))
    assert hooked[0] == hooked[1]
    for d in (0, 1):
        mine = sum(1 for k in hooked[0] if k[3] == d)
        assert computes[1][d]["compute"] - computes[0][d]["compute"] == pytest.approx(mine * (1e-3 - 1e-6), rel=1e-9)


def test_every_rank_draws_the_whole_batch_before_its_first_op():
    """Each rank draws the step's synthetic global batch (the model's inputs and labels) before its
    first op: with a calibrated ``draw`` every device's step-start task and its overhead part grow
    by the draw time of the graph's input tensors, whatever the plan."""
    from dataclasses import replace

    from autopar.planner.sim import step_parts
    from autopar.planner.sim.trainer_model import batch_draw_time, zero_grad
    from autopar.planner.zoo import load_model
    from autopar.planner.ir import import_spec

    g = import_spec(load_model("lenet", batch=8, image=20))
    inputs = {op.name: op.outputs[0] for op in g.ops if op.kind == "input"}
    assert {s.dtype for s in inputs.values()} == {"float32", "int64"}    # images and labels
    base = replace(default_calibration("CPU-core", "gloo", 2), draw=())
    drawing = replace(base, draw=(("float", 1e-5, 1e-8), ("int", 2e-5, 3e-8)))
    expected = sum(1e-5 + 1e-8 * _numel(s) if s.dtype == "float32" else 2e-5 + 3e-8 * _numel(s)
                   for s in inputs.values())
    assert batch_draw_time(g, drawing) == pytest.approx(expected) and batch_draw_time(g, base) == 0.0
    topo = get_preset("local:2")
    for strategy in (data_parallel(g, 2), model_parallel(g, 2)):
        runs = []
        for cal in (base, drawing):
            b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal)
            res, tl, tg = simulate_strategy(b, strategy)
            runs.append((tg, step_parts(b, tg, tl)))
        for d in (0, 1):
            # (without a draw, an empty zeroing task still lasts the simulator's least task time)
            assert runs[1][0].task(zero_grad(d)).duration - runs[0][0].task(zero_grad(d)).duration == pytest.approx(
                expected, abs=1e-8)
            assert runs[1][1][d]["overhead"] - runs[0][1][d]["overhead"] == pytest.approx(expected, abs=1e-8)


def test_each_rank_zeroes_its_buckets_at_the_calibrated_rate():
    """A rank zeroes its gradient buckets as its step starts: with a calibrated ``zero`` its
    step-start task lasts ``tensors * per_tensor + bytes * per_byte`` of the buckets it holds
    (data parallelism: every parameter, on both ranks); without one, their bytes at the device's
    memory bandwidth.  A plan that replicates no parameter zeroes nothing either way."""
    from autopar.planner.sim.trainer_model import zero_grad
    from autopar.planner.zoo import load_model
    from autopar.planner.ir import import_spec

    g = import_spec(load_model("lenet", batch=8, image=20))
    topo = get_preset("local:2")
    base = replace(default_calibration("CPU-core", "gloo", 2), draw=(), zero=None)
    zeroing = replace(base, zero=(3e-6, 2e-10))
    tensors, nbytes = len(g.param_specs), sum(p.nbytes for p in g.param_specs.values())
    assert nbytes > 0
    seconds = {}
    for name, strategy in (("dp", data_parallel(g, 2)), ("mp", model_parallel(g, 2))):
        for tag, cal in (("base", base), ("zero", zeroing)):
            b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal)
            res, tl, tg = simulate_strategy(b, strategy)
            seconds[name, tag] = [tg.task(zero_grad(d)).duration for d in (0, 1)]
    for d in (0, 1):
        assert seconds["dp", "zero"][d] == pytest.approx(tensors * 3e-6 + nbytes * 2e-10, rel=1e-9)
        assert seconds["dp", "base"][d] == pytest.approx(nbytes / topo.devices[d].mem_bandwidth, rel=1e-9)
        assert seconds["mp", "zero"][d] == seconds["mp", "base"][d] < 1e-6
    assert zeroing.zero_time(tensors, nbytes) == pytest.approx(tensors * 3e-6 + nbytes * 2e-10)
    assert base.zero_time(tensors, nbytes) is None


def _numel(spec) -> int:
    n = 1
    for x in spec.shape:
        n *= x
    return n


def test_each_rank_issues_a_buckets_all_reduce_on_its_program_before_it_starts():
    """`trainer.sync.GradSync._issue` runs on the rank's own thread when its backward pass reaches
    the bucket: one ``issue`` task per member device, before the all-reduce and before the program
    goes on."""
    from dataclasses import replace

    from autopar.planner.cost.calibration import Curve

    g = rnn(steps=3)
    topo = get_preset("local:2")
    cal = replace(default_calibration(topo.devices[0].product, "gloo", 2), issue=Curve.fit([(1, 1e-3)]))
    b = TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=cal)
    res, tl, tg = simulate_strategy(b, data_parallel(g, 2))
    buckets = [k for k in tg if k[0] == 2 and len(k) == 3]
    issues = [k for k in tg if k[0] == 2 and len(k) == 4 and k[2] == -1]
    assert buckets and len(issues) == 2 * len({k[1] for k in buckets})
    for k in issues:
        assert tg.task(k).resource == k[3] and tg.task(k).duration == 1e-3
        for part in (p for p in buckets if p[1] == k[1]):
            assert tl.start[part] >= tl.end[k] - 1e-12
    none = simulate_strategy(TaskGraphBuilder(g, topo, CostModel().bind(g), runtime=replace(cal, issue=None)),
                             data_parallel(g, 2))[0]
    assert res.step_time > none.step_time


def test_a_bucket_all_reduce_lasts_its_calibrated_time_and_slows_the_backward_ops_beside_it():
    """Where `autopar profile` measured what the buckets' all-reduces add to a model's own
    data-parallel step, over what the calibration's all-reduce says (``allreduce_in_step``), each
    bucket's all-reduce of that model still lasts the calibrated time (a step's wait for the last
    bucket is that), and the rest is what it costs the backward ops beside it: a task on each
    member rank's program after the bucket's issue from a gradient's hook, booked as compute.  A
    ratio under 1 shortens the all-reduce itself.
    Other models, and a cache without the ratio, keep the calibrated time and nothing beside."""
    from dataclasses import replace

    from autopar.planner.cost import ProfileCache
    from autopar.planner.sim import step_parts
    from autopar.planner.sim.trainer_model import bucket_beside, sync_wait
    g, other = rnn(steps=3), mlp()
    topo = get_preset("local:2")
    cal = replace(default_calibration(topo.devices[0].product, "gloo", 2), source="measured")
    cache = ProfileCache()
    cache.put_calibration(cal)
    cache.put_overheads(cal, g.fingerprint, 30e-6, 35e-6, 12, allreduce_in_step=2.5)
    cache.put_overheads(cal, other.fingerprint, 30e-6, 35e-6, 12)
    assert cal.bucket_time(1 << 20, 2) == (cal.allreduce_time(1 << 20, 2), 0.0)
    # steps that showed the all-reduces add nothing (a ratio of 0) still simulate: 1 ns, nothing beside
    assert replace(cal, allreduce_in_step=0.0).bucket_time(1 << 20, 2) == (1e-9, 0.0)
    assert replace(cal, allreduce_in_step=2.5).bucket_time(1 << 20, 2) == pytest.approx(
        (cal.allreduce_time(1 << 20, 2), 1.5 * cal.allreduce_time(1 << 20, 2)))

    def simulated(graph, c, ratio=None):
        b = TaskGraphBuilder(graph, topo, CostModel(c).bind(graph), bucket_bytes=100)
        if ratio is not None:
            b = TaskGraphBuilder(graph, topo, CostModel(c).bind(graph), bucket_bytes=100,
                                 runtime=replace(b.runtime, allreduce_in_step=ratio))
        res, tl, tg = simulate_strategy(b, data_parallel(graph, 2))
        return b, res, tl, tg, {k: tg.task(k) for k in tg if k[0] == 2 and len(k) == 3}

    def seconds(t):       # one duration per resource the all-reduce holds: the links, and the ranks' cores
        return list(t.duration) if isinstance(t.duration, tuple) else [t.duration]
    b, res, tl, tg, mine = simulated(g, cache)
    assert b.runtime.allreduce_in_step == 2.5 and mine
    hooked = 0
    for (_, k, _), t in mine.items():
        alone = cal.allreduce_time(t.nbytes, 2)
        assert seconds(t) == pytest.approx([alone] * len(seconds(t)))
        for key in (bucket_beside(k, d) for d in (0, 1)):
            assert tg.task(key).resource == key[3] and tg.task(key).duration == pytest.approx(1.5 * alone)
            assert sync_wait(key[3]) not in tg.succs(key)        # inside the backward pass
        hooked += 1
    assert hooked >= 2
    _, plain, tl1, tg1, _ = simulated(g, cache, ratio=1.0)
    parts, parts1 = step_parts(b, tg, tl), step_parts(b, tg1, tl1)
    for d in (0, 1):
        extra = sum(tg.task(k).duration for k in tg if len(k) == 4 and k == bucket_beside(k[1], d))
        assert extra > 0 and parts[d]["compute"] - parts1[d]["compute"] >= extra - 1e-9
    assert res.step_time > plain.step_time
    _, _, _, tg_half, halved = simulated(g, cache, ratio=0.5)
    for t in halved.values():
        assert seconds(t) == pytest.approx([0.5 * cal.allreduce_time(t.nbytes, 2)] * len(seconds(t)))
    assert not any(len(k) == 4 and k[0] == 2 and k[2] == -2 for k in tg_half)
    b, _, _, tg2, theirs = simulated(other, cache)
    assert b.runtime.allreduce_in_step == 1.0 and theirs
    for t in theirs.values():
        assert seconds(t) == pytest.approx([cal.allreduce_time(t.nbytes, 2)] * len(seconds(t)))
    assert not any(len(k) == 4 and k[0] == 2 and k[2] == -2 for k in tg2)
    cache.put_overheads(cal, g.fingerprint, 30e-6, 35e-6, 12)       # measured again without it: gone
    assert simulated(g, cache)[0].runtime.allreduce_in_step == 1.0


def test_a_models_own_overheads_replace_the_chains_for_that_model_only():
    """Where `autopar profile` timed the runtime's work between its spans in a model's own steps,
    the simulator charges that per task, plus the chains' work inside the spans; other models
    keep the chains' figures."""
    from dataclasses import replace

    from autopar.planner.cost import ProfileCache
    cal = replace(default_calibration("CPU-core", "gloo", 2), source="measured", fwd_task_s=100e-6, bwd_task_s=70e-6,
                  details=(("bwd_task_phase_only_s", 1e-6), ("fwd_task_phase_only_s", 12e-6)))
    cache = ProfileCache()
    cache.put_calibration(cal)
    g, other = mlp(), diamond()
    cache.put_overheads(cal, g.fingerprint, 30e-6, 35e-6, 12)
    topo = get_preset("local:2")
    own = TaskGraphBuilder(g, topo, CostModel(cache).bind(g)).runtime
    assert own.fwd_task_s == pytest.approx(42e-6) and own.bwd_task_s == pytest.approx(36e-6)
    assert own.bwd_call_s == cal.bwd_call_s and own.p2p == cal.p2p and own.local_exchange_s == (0.0, 0.0)
    assert TaskGraphBuilder(other, topo, CostModel(cache).bind(other)).runtime == cal
    # Measured with them, so are its exchange calls that move nothing.
    cache.put_overheads(cal, g.fingerprint, 30e-6, 35e-6, 12, exchange=(8e-6, 20e-6))
    assert TaskGraphBuilder(g, topo, CostModel(cache).bind(g)).runtime.local_exchange_s == (8e-6, 20e-6)
    assert TaskGraphBuilder(other, topo, CostModel(cache).bind(other)).runtime.local_exchange_s == (0.0, 0.0)
    cache.put_overheads(cal, g.fingerprint, 30e-6, 35e-6, 12)
    step = {}
    for name, c in (("own", cache), ("chains", ProfileCache())):
        if name == "chains":
            c.put_calibration(cal)
        b = TaskGraphBuilder(g, topo, CostModel(c).bind(g))
        step[name] = simulate(b.build(data_parallel(g, 2))).makespan
    assert step["own"] < step["chains"]
