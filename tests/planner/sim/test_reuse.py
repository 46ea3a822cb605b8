"""Each op task priced by what the ranks' shared cache holds of its data in the step
(`planner.sim.reuse`): stack distances, the cold shares, tasks run back to back, and where
`simulate_strategy` applies them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch.nn as nn

from autopar.planner.cost import CostModel, ProfileCache, cold_kind, kind_of, task_key
from autopar.planner.cost.calibration import RuntimeCalibration, default_calibration
from autopar.planner.cost.model import graph_input_shapes
from autopar.planner.cost.profile_cache import hot_key, task_shapes
from autopar.planner.hardware import get_preset
from autopar.planner.ir import ParallelConfig, Strategy, TensorSpec, data_parallel, import_model, model_parallel
from autopar.planner.ir.strategy import degree_choices
from autopar.planner.sim import TaskGraphBuilder, simulate_strategy
from autopar.planner.sim.reuse import access_misses, after_own_op, applies, back_to_back, cache_shares

from ..search._graphs import mlp, rnn

MiB = 1 << 20


def test_a_reads_stack_distance_counts_each_tensor_touched_since_once():
    """A read of A after B was touched three times is B's bytes away, not three times them."""
    a, b = ("p", "A", 0), ("p", "B", 0)
    reader = ("op", 0, 0)
    touches = [(0.0, 0, a, 1 * MiB, reader), (1.0, 1, b, 2 * MiB, None), (2.0, 2, b, 2 * MiB, None),
               (3.0, 3, b, 2 * MiB, None), (4.0, 4, a, 1 * MiB, ("op", 1, 0))]
    misses = access_misses(touches, 10.0, 4 * MiB)
    missed, read = misses[("op", 1, 0)]
    assert read == 1 * MiB
    assert missed == pytest.approx(MiB * (1 - math.exp(-2 / 4)))
    # the first read of the step: A was last read at the end of the step before, nothing since
    assert misses[reader] == (0.0, MiB)


def test_a_tensor_just_written_or_fresh_hits_and_a_bigger_cache_misses_less():
    w, act = ("p", "W", 0), ("a", "x", 0, 0)
    touches = [(0.0, 0, act, MiB, None), (0.5, 1, ("p", "other", 0), 8 * MiB, None),
               (1.0, 2, act, MiB, ("f", 0, 0)), (1.0, 3, w, MiB, ("f", 0, 0)),
               (2.0, 4, ("fresh", ("f", 1, 0)), MiB, ("f", 1, 0))]
    small = access_misses(touches, 3.0, 2 * MiB)
    big = access_misses(touches, 64 * MiB, 64 * MiB)
    assert small[("f", 1, 0)] == (0.0, MiB)                      # fresh: always held
    assert 0 < big[("f", 0, 0)][0] < small[("f", 0, 0)][0] < small[("f", 0, 0)][1]
    assert small[("f", 0, 0)][1] == 2 * MiB


def _profiled(g, topo, cold_over_warm: float, strategies) -> ProfileCache:
    """A cache with every task of `strategies` at 1 ms forward and 2 ms backward, and its cold
    times `cold_over_warm` times that, under the cold product."""
    cache = ProfileCache()
    product = kind_of(topo.devices[0])
    for s in strategies:
        for op in g.ops:
            shapes = graph_input_shapes(g, op)
            for degrees in {s[op.name].degrees} | set(degree_choices(op, topo.num_devices)):
                cache.put(task_key(op, degrees, product, shapes), 1e-3, 2e-3)
                cache.put(task_key(op, degrees, cold_kind(product), shapes), 1e-3 * cold_over_warm,
                          2e-3 * cold_over_warm)
    return cache


def _builder(g, topo, cache, shared: int | None, **kw):
    rt = replace(default_calibration(topo.devices[0].product, "gloo", topo.num_devices, cores=4),
                 shared_cache_bytes=shared, jitter=0.0)
    return TaskGraphBuilder(g, topo, CostModel(cache, **kw).bind(g), runtime=rt)


def test_a_step_is_priced_between_its_warm_and_cold_profiles_by_the_shared_caches_size():
    """Under model parallelism, where the ranks' ops wait for each other's exchanges."""
    g, topo = rnn(steps=3), get_preset("local:2")
    s = model_parallel(g, 2)
    cache = _profiled(g, topo, 2.0, [s])
    warm_only = ProfileCache({k: v for k, v in cache.items() if "(last level cold)" not in k})
    plain = simulate_strategy(_builder(g, topo, warm_only, 1 << 10), s)[0].step_time
    off = simulate_strategy(_builder(g, topo, cache, None), s)[0].step_time
    tiny = simulate_strategy(_builder(g, topo, cache, 1), s)[0].step_time
    huge = simulate_strategy(_builder(g, topo, cache, 1 << 50), s)[0].step_time
    some = simulate_strategy(_builder(g, topo, cache, 4 << 10), s)[0].step_time
    assert off == plain                           # no cache size known: the warm profile alone
    assert huge == pytest.approx(plain, rel=1e-6)  # everything held
    assert plain < some < tiny
    # at most every task at its cold time (twice its warm one); what an op reads right after it was
    # written, and an output's gradient, are still held
    compute = 3e-3 * len([op for op in g.ops])
    assert 0.25 * compute < tiny - plain < compute


def test_a_task_its_rank_runs_right_after_one_of_its_own_finds_its_data_as_the_warm_profile_does():
    """Under data parallelism each rank runs its op tasks one after another, and none pays its cold
    share; under model parallelism the tasks that follow the runtime's exchange work (packing,
    posting a receive, unpacking) pay theirs (`reuse.after_own_op`)."""
    g, topo = rnn(steps=3), get_preset("local:2")
    dp, mp = data_parallel(g, 2), model_parallel(g, 2)
    cache = _profiled(g, topo, 2.0, [dp, mp])
    b = _builder(g, topo, cache, 1)
    for s in (dp, mp):
        _, tl, tg = simulate_strategy(b, s)
        after = after_own_op(b, tg, tl)
        shares = cache_shares(b, s, tg, tl, 1)
        assert all(shares.of(name, d)[phase] == 0.0 for name, phase, d in after)
        tasks = {(op.name, phase, d) for op in g.ops if op.inputs for d in s[op.name].devices for phase in (0, 1)}
        paying = tasks - after
        if s is dp:
            assert not paying
        else:
            assert len(paying) >= len(tasks) // 4
            assert any(shares.of(name, d)[phase] > 0.5 for name, phase, d in paying)
    # so data parallelism's step is priced at its warm profile whatever the cache holds, but for the
    # first op task of each rank's pass (after the runtime drew the batch): 1 ms more at most, in parallel
    tiny = simulate_strategy(b, dp)[0].step_time
    huge = simulate_strategy(_builder(g, topo, cache, 1 << 50), dp)[0].step_time
    assert huge <= tiny <= huge + 1e-3 + 1e-9


def test_a_separate_cold_cache_prices_as_the_cold_product_in_the_same_cache():
    """A kept benchmark run's diagnosis profile (cold times under the ordinary product) gives the
    same step as the same times kept beside the warm ones."""
    g, topo = mlp(), get_preset("local:2")
    s = model_parallel(g, 2)
    cache = _profiled(g, topo, 1.5, [s])
    product = kind_of(topo.devices[0])
    warm = ProfileCache({k: v for k, v in cache.items() if not k.startswith(cold_kind(product))})
    cold = ProfileCache({k.replace(cold_kind(product), product, 1): v for k, v in cache.items()
                         if k.startswith(cold_kind(product))})
    together = simulate_strategy(_builder(g, topo, cache, 2 << 10), s)[0].step_time
    apart = simulate_strategy(_builder(g, topo, warm, 2 << 10, cold=cold), s)[0].step_time
    assert together == apart
    assert CostModel(warm).has_cold is False and CostModel(cache).has_cold and CostModel(warm, cold=cold).has_cold


def test_an_input_received_from_another_rank_is_fresh():
    """An op whose only input arrives from the other rank and which has no parameters reads
    nothing the cache could have lost."""
    g, topo = mlp(), get_preset("local:2")
    one = data_parallel(g, 1)
    s = Strategy.from_mapping(g, {**{op.name: one[op.name] for op in g.ops},
                                  "relu": ParallelConfig(one["relu"].degrees, (1,))}, "moved")
    cache = _profiled(g, topo, 2.0, [s])
    b = _builder(g, topo, cache, 1)
    _, tl, tg = simulate_strategy(TaskGraphBuilder(g, topo, CostModel(ProfileCache()).bind(g), runtime=b.runtime), s)
    shares = cache_shares(b, s, tg, tl, 1)
    received = [op for op in g.ops if op.inputs and not op.params
                and all(s[op.name].devices[0] not in s[ref.op].devices for ref in op.inputs)]
    assert received
    for op in received:
        ins, outs, _ = task_shapes(op, s[op.name].degrees, [g[r.op].outputs[r.index].shape for r in op.inputs])
        read, written = sum(math.prod(x) for x in ins), sum(math.prod(x) for x in outs)
        assert shares.of(op.name, s[op.name].devices[0])[0] == pytest.approx(written / (read + written))
    assert any(f > 0.9 for pair in shares.shares.values() for f in pair)


def test_a_write_into_a_block_last_used_a_step_ago_misses():
    """Write-allocate: an op's output goes where the same tensor went a step before, so the write
    misses by the bytes touched since; a backward task pays for its parameters' gradients and for
    the gradients it passes back too."""
    x, y, w = ("a", "x", 0, 0), ("a", "y", 0, 0), ("p", "W", 0)
    f, b = ("op", 0, 0), ("op", 1, 0)
    touches = [(0.0, 0, x, MiB, f), (0.0, 1, w, MiB, f), (1.0, 2, y, 2 * MiB, f),
               (2.0, 3, ("p", "other", 0), 16 * MiB, None),
               (3.0, 4, x, MiB, b), (3.0, 5, ("fresh", b), 2 * MiB, b), (4.0, 6, ("g", "W", 0), MiB, b),
               (4.0, 7, ("da", "x", 0, 0), MiB, b)]
    small, huge = access_misses(touches, 5.0, 4 * MiB), access_misses(touches, 5.0, 1 << 50)
    assert small[f][1] == 4 * MiB and small[b][1] == 5 * MiB     # reads and writes both counted
    # y was last touched a step ago, past the 16 MiB stream: its write misses nearly surely
    assert small[f][0] > 2 * MiB * (1 - math.exp(-16 / 4))
    assert huge[f][0] < 1e-6 * huge[f][1] and huge[b][0] < 1e-6 * huge[b][1]
    assert 0 < small[b][0] < 3 * MiB                              # the fresh output gradient still hits


def test_it_applies_to_cpu_ranks_with_a_known_shared_cache_and_cold_times_only():
    g, topo = mlp(), get_preset("local:2")
    cache = _profiled(g, topo, 2.0, [data_parallel(g, 2)])
    assert applies(_builder(g, topo, cache, 32 * MiB))
    assert not applies(_builder(g, topo, cache, None))
    warm_only = ProfileCache({k: v for k, v in cache.items() if "(last level cold)" not in k})
    assert not applies(_builder(g, topo, warm_only, 32 * MiB))
    assert not applies(TaskGraphBuilder(g, get_preset("p100-1x4"), CostModel(cache).bind(g)))


def test_the_shared_caches_size_goes_through_the_calibrations_json():
    rt = replace(default_calibration("CPU-core", "gloo", 2), shared_cache_bytes=32 * MiB)
    assert RuntimeCalibration.from_json(rt.to_json()).shared_cache_bytes == 32 * MiB
    assert RuntimeCalibration.from_json(default_calibration("CPU-core", "gloo", 2).to_json()).shared_cache_bytes is None



class _Twice(nn.Module):
    """One linear layer applied twice in a row: its two tasks share their key and their weights."""

    def __init__(self, width: int = 8, classes: int = 2):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        return self.out(self.lin(self.lin(x)))


def _twice():
    return import_model(_Twice(), [("x", TensorSpec((4, 8), ("n", "f")))],
                        ("labels", TensorSpec((4,), ("n",), "int64")), name="twice")


def _with_hot(cache: ProfileCache, product: str, over_warm: float) -> ProfileCache:
    """`cache` with its warm times `over_warm` times as long again under the back-to-back product."""
    out = ProfileCache(dict(cache.items()))
    for k, (f, b) in cache.items():
        if k.startswith(product + "|"):
            out.put(hot_key(k), f * over_warm, b * over_warm)
    return out


def test_a_task_run_right_after_the_same_task_is_priced_back_to_back():
    """The second of two tasks with the same key, the same weights and the same direction in a
    row on a rank costs what the profile measured back to back; the first, and a task after one
    split another way, cost the warm price (`reuse.back_to_back`)."""
    g, topo = _twice(), get_preset("local:2")
    product = kind_of(topo.devices[0])
    s = data_parallel(g, 2)
    first, second = [op.name for op in g.ops if op.kind == "linear"][:2]
    split = Strategy.from_mapping(g, {**{op.name: s[op.name] for op in g.ops},
                                      second: model_parallel(g, 2)[second]}, "split")
    warm = _profiled(g, topo, 1.0, [s, split])
    hot = _with_hot(warm, product, 0.25)
    b = _builder(g, topo, hot, 1 << 30)
    _, tl, tg = simulate_strategy(b, s)
    assert back_to_back(b, s, tg, tl) == {(second, 0, d) for d in (0, 1)} | {(first, 1, d) for d in (0, 1)}
    with_hot = simulate_strategy(b, s)[0].step_time
    without = simulate_strategy(_builder(g, topo, warm, 1 << 30), s)[0].step_time
    saved = 0.75e-3 + 1.5e-3                      # one forward and one backward task per rank, at a quarter
    assert without - saved - 1e-9 <= with_hot < without - 0.5 * saved
    _, tl, tg = simulate_strategy(b, split)
    assert not {(first, 1), (second, 0)} & {(name, phase) for name, phase, _ in back_to_back(b, split, tg, tl)}

