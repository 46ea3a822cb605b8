"""The cost model: roofline estimates, profile lookups, memoization and P100 calibration."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.cost.model import AnalyticModel, CostModel, Estimate, graph_input_shapes, kind_class
from autopar.planner.cost.profile_cache import ProfileCache, task_key
from autopar.planner.errors import CostModelError
from autopar.planner.hardware.topology import Device
from autopar.planner.ir.graph import WHOLE, DimKind, Op, OperatorGraph, ParDim, TensorRef, TensorSpec, same

from ._cost_graphs import conv, linear, pointwise, pool, resnet

P100 = Device(0, "gpu0", "n0", "P100-SXM2-16GB", "gpu", 10.6e12, 21.2e12, 732e9, 16 << 30)
CPU = Device(0, "localhost/rank0", "localhost", "CPU-core", "cpu", 1.0e11, 0.0, 1.2e10, 8 << 30)
AM = AnalyticModel()


def _with(device: Device, **kw) -> Device:
    return dataclasses.replace(device, **kw)


def _cost(op: Op, degrees, device=P100, shapes=None, model=None) -> Estimate:
    return (model or CostModel()).task_cost(op, tuple(degrees), device, shapes)


def _conv(n=64, c=256, hw=28, cout=256, k=3):
    return conv("c", "x", (n, c, hw, hw), cout, k, 1, k // 2), ((n, c, hw, hw),)


def _relu(numel_n=64, c=256, hw=28):
    shape = (numel_n, c, hw, hw)
    return pointwise("r", "relu", ["x"], shape), (shape,)


def _linear(n=64, fin=1024, fout=1024):
    return linear("fc", "x", n, fin, fout), ((n, fin),)


def _ones(op: Op) -> tuple[int, ...]:
    return (1,) * len(op.pardims)


# -- sources and memoization -----------------------------------------------------------------------

def test_estimate_is_analytic_when_no_cache_holds_the_key():
    op, shapes = _conv()
    est = _cost(op, _ones(op), shapes=shapes)
    assert est.source == "analytic" and est.forward > 0 and est.backward > 0


def test_estimate_is_profile_when_the_cache_holds_the_key():
    op, shapes = _conv()
    cache = ProfileCache()
    cache.put(task_key(op, (2, 1, 1, 1), P100.product, shapes), 1.25e-3, 2.5e-3)
    model = CostModel(cache)
    assert model.task_cost(op, (2, 1, 1, 1), P100, shapes) == Estimate(1.25e-3, 2.5e-3, "profile")
    # Another degree vector and another device product are not in the cache.
    assert model.task_cost(op, (4, 1, 1, 1), P100, shapes).source == "analytic"
    assert model.task_cost(op, (2, 1, 1, 1), _with(P100, product="V100-SXM2-32GB"), shapes).source == "analytic"
    assert model.stats() == {"profile": 1, "analytic": 2}


def test_a_profile_of_one_cpu_worker_does_not_price_two_side_by_side():
    """Ops of two workers on one host run slower than one worker's alone (they share its caches and
    memory bandwidth): a ``local:1`` profile prices ``local:1`` tasks and not ``local:2`` ones, and
    the other way round, even with one model for both."""
    from autopar.planner.cost.profile_cache import kind_of
    from autopar.planner.hardware import get_preset
    op, shapes = _linear()
    one, two = get_preset("local:1").devices[0], get_preset("local:2").devices[0]
    cache = ProfileCache()
    cache.put(task_key(op, _ones(op), kind_of(one), shapes), 1e-3, 2e-3)
    model = CostModel(cache)
    assert model.task_cost(op, _ones(op), one, shapes) == Estimate(1e-3, 2e-3, "profile")
    assert model.task_cost(op, _ones(op), two, shapes).source == "analytic"
    cache.put(task_key(op, _ones(op), kind_of(two), shapes), 1.4e-3, 2.8e-3)
    model = CostModel(cache)
    assert model.task_cost(op, _ones(op), two, shapes) == Estimate(1.4e-3, 2.8e-3, "profile")
    assert model.task_cost(op, _ones(op), one, shapes) == Estimate(1e-3, 2e-3, "profile")


def test_memoized_estimates_are_the_same_object():
    op, shapes = _conv()
    model = CostModel()
    first = model.task_cost(op, (2, 1, 1, 1), P100, shapes)
    assert model.task_cost(op, (2, 1, 1, 1), _with(P100, id=3, name="gpu3"), shapes) is first
    assert model.task_cost(op, [2, 1, 1, 1], P100, [list(s) for s in shapes]) == first
    assert model.stats() == {"profile": 0, "analytic": 1}


def test_bind_supplies_input_shapes_and_missing_shapes_are_an_error():
    g = resnet(8, (1, 1, 1, 1), image=64)
    op = g["layer1.0.b.conv"]
    with pytest.raises(CostModelError, match="bind"):
        CostModel().task_cost(op, _ones(op), P100)
    bound = CostModel().bind(g)
    assert bound.task_cost(op, _ones(op), P100) == CostModel().task_cost(op, _ones(op), P100, graph_input_shapes(g, op))


def test_degrees_that_do_not_fit_the_op_are_an_error():
    op, shapes = _conv()
    with pytest.raises(CostModelError, match="4 parallel dims"):
        _cost(op, (2, 1), shapes=shapes)
    with pytest.raises(CostModelError, match="equal parts"):
        _cost(op, (3, 1, 1, 1), shapes=shapes)


def test_unknown_kinds_get_the_generic_class_and_are_reported():
    op, shapes = _relu()
    odd = dataclasses.replace(op, kind="frobnicate")
    model = CostModel()
    assert model.task_cost(odd, _ones(odd), P100, shapes).forward > 0
    assert model.unknown_kinds == {"frobnicate"}
    assert kind_class("Batch-Norm") == kind_class("batch_norm") == (kind_class("layer_norm")[0], True)
    assert kind_class("frobnicate")[1] is False


# -- the roofline ----------------------------------------------------------------------------------

@pytest.mark.parametrize("small,big", [
    (_conv(n=16), _conv(n=64)), (_conv(cout=64), _conv(cout=256)), (_conv(k=1), _conv(k=3)),
    (_linear(fout=256), _linear(fout=4096)), (_relu(hw=14), _relu(hw=56)),
])
def test_more_work_takes_longer(small, big):
    (a, sa), (b, sb) = small, big
    ea, eb = _cost(a, _ones(a), shapes=sa), _cost(b, _ones(b), shapes=sb)
    assert eb.forward > ea.forward and eb.backward > ea.backward


@pytest.mark.parametrize("field_", ["peak_flops", "mem_bandwidth"])
@pytest.mark.parametrize("make", [_conv, _linear, _relu])
def test_faster_devices_are_never_slower(field_, make):
    op, shapes = make()
    slow = _cost(op, _ones(op), shapes=shapes)
    fast = _cost(op, _ones(op), _with(P100, **{field_: getattr(P100, field_) * 2}), shapes)
    assert fast.forward <= slow.forward and fast.backward <= slow.backward


def test_compute_bound_ops_speed_up_with_flops_and_memory_bound_ops_with_bandwidth():
    cop, cs = _conv()
    rop, rs = _relu()
    fast_flops = _with(P100, peak_flops=P100.peak_flops * 2)
    fast_mem = _with(P100, mem_bandwidth=P100.mem_bandwidth * 2)
    assert _cost(cop, _ones(cop), fast_flops, cs).forward < _cost(cop, _ones(cop), P100, cs).forward
    assert _cost(cop, _ones(cop), fast_mem, cs).forward == _cost(cop, _ones(cop), P100, cs).forward
    assert _cost(rop, _ones(rop), fast_mem, rs).forward < _cost(rop, _ones(rop), P100, rs).forward
    assert _cost(rop, _ones(rop), fast_flops, rs).forward == _cost(rop, _ones(rop), P100, rs).forward


@settings(max_examples=40, deadline=None)
@given(n=st.sampled_from([1, 2, 4, 8, 32, 128]), fin=st.integers(1, 4096), fout=st.integers(1, 4096),
       scale=st.sampled_from([1.5, 2.0, 4.0]))
def test_linear_time_is_monotone_in_batch_and_device_peak(n, fin, fout, scale):
    op, shapes = _linear(n=2 * n, fin=fin, fout=fout)
    half_op, half_shapes = _linear(n=n, fin=fin, fout=fout)
    assert _cost(op, (1, 1), shapes=shapes).total >= _cost(half_op, (1, 1), shapes=half_shapes).total
    faster = _with(P100, peak_flops=P100.peak_flops * scale, mem_bandwidth=P100.mem_bandwidth * scale)
    assert _cost(op, (1, 1), faster, shapes).total <= _cost(op, (1, 1), P100, shapes).total


def _late_conv():
    return _conv(n=64, c=512, hw=8, cout=512)


@pytest.mark.parametrize("make,degrees", [
    (_late_conv, (16, 1, 1, 1)), (_late_conv, (1, 16, 1, 1)), (_late_conv, (1, 1, 4, 4)),
    (_linear, (16, 1)), (_linear, (1, 16)),
])
def test_small_shards_are_less_efficient(make, degrees):
    op, shapes = make()
    k = 1
    for d in degrees:
        k *= d
    whole = _cost(op, _ones(op), shapes=shapes)
    part = _cost(op, degrees, shapes=shapes)
    assert part.forward < whole.forward
    assert part.forward * k > whole.forward * 1.05  # k tasks together do the work more slowly


def test_splitting_a_64_batch_16_ways_costs_a_clear_share_of_gemm_efficiency():
    """The last-stage 3×3 ResNet convolution at 4 samples per task, compute only (no launches)."""
    op, shapes = _conv(n=64, c=512, hw=7, cout=512)
    no_launch = AnalyticModel(launch_gpu=0.0)
    whole = _cost(op, _ones(op), shapes=shapes, model=CostModel(analytic=no_launch))
    part = _cost(op, (16, 1, 1, 1), shapes=shapes, model=CostModel(analytic=no_launch))
    efficiency = whole.forward / (16 * part.forward)
    assert 0.5 < efficiency < 0.9


@pytest.mark.parametrize("numel_scale", [2, 4, 8])
def test_memory_bound_time_scales_with_bytes(numel_scale):
    op, shapes = _relu(numel_n=8)
    big, big_shapes = _relu(numel_n=8 * numel_scale)
    launch = AM.launch_gpu
    small_t = _cost(op, _ones(op), shapes=shapes).forward - launch
    big_t = _cost(big, _ones(big), shapes=big_shapes).forward - launch
    assert big_t == pytest.approx(numel_scale * small_t, rel=1e-9)
    # 2 passes (read, write) of float32 at 75% of the bandwidth.
    assert small_t == pytest.approx(2 * 4 * 8 * 256 * 28 * 28 / (P100.mem_bandwidth * AM.mem_eff_gpu), rel=1e-9)


def test_attribute_split_pays_for_the_halo():
    """A 3×3 stride-1 max pool split 4 ways along height re-reads two rows per task."""
    shape = (8, 64, 32, 32)
    op = pool("p", "max_pool2d", "x", shape, 3, 1, 1)
    launch = AM.launch_gpu
    whole = _cost(op, _ones(op), shapes=(shape,)).forward - launch
    part = _cost(op, (1, 1, 4, 1), shapes=(shape,)).forward - launch
    # Middle task: reads 8 + 2 halo rows of 32 and writes 8 rows.
    assert part == pytest.approx(whole * (10 + 8) / (32 + 32), rel=1e-9)
    assert part > whole / 4


def test_sample_split_reads_the_whole_weight_in_every_task():
    op, shapes = _linear(n=8, fin=4096, fout=4096)  # weight-read bound
    sample = _cost(op, (8, 1), shapes=shapes)
    param = _cost(op, (1, 8), shapes=shapes)
    assert param.forward < sample.forward


def test_backward_is_about_twice_forward_for_weighted_ops_and_about_once_otherwise():
    cop, cs = _conv()
    rop, rs = _relu()
    c = _cost(cop, _ones(cop), shapes=cs)
    r = _cost(rop, _ones(rop), shapes=rs)
    assert 1.6 < c.backward / c.forward < 2.6
    assert 1.0 <= r.backward / r.forward < 1.6  # grad out + saved input + grad in vs input + output


def test_views_and_inputs_are_free():
    x = Op("x", "input", (), (), (TensorSpec((8, 16), ("n", "f")),), (ParDim("n", DimKind.SAMPLE, 8),))
    v = Op("v", "flatten", (TensorRef("x"),), ((same("n"), WHOLE),), (TensorSpec((8, 16), ("n", "f")),),
           (ParDim("n", DimKind.SAMPLE, 8),))
    OperatorGraph("g", (x, v), 8)
    assert _cost(x, (2,), shapes=()) == Estimate(0.0, 0.0, "analytic")
    assert _cost(v, (2,), shapes=((8, 16),)) == Estimate(0.0, 0.0, "analytic")


def test_half_precision_uses_the_half_rate():
    op32 = conv("c", "x", (64, 256, 28, 28), 256, 1, 1, 0)
    op16 = conv("c", "x", (64, 256, 28, 28), 256, 1, 1, 0, dtype="float16")
    shapes = ((64, 256, 28, 28),)
    assert _cost(op16, _ones(op16), shapes=shapes).forward < 0.6 * _cost(op32, _ones(op32), shapes=shapes).forward


def test_winograd_speeds_up_3x3_float32_convolutions_on_cuda_core_gpus_only():
    no_wino = CostModel(analytic=AnalyticModel(winograd_speedup=1.0))
    three, shapes = _conv(k=3)
    strided = conv("c", "x", (64, 256, 28, 28), 256, 3, 2, 1)
    tf32_gpu = _with(P100, product="A100-SXM4-80GB", peak_flops=156e12, peak_flops_half=312e12)
    assert _cost(three, _ones(three), shapes=shapes).forward < 0.6 * _cost(three, _ones(three), shapes=shapes, model=no_wino).forward
    for op, dev in [(strided, P100), (three, tf32_gpu), (three, CPU)]:
        assert _cost(op, _ones(op), dev, shapes) == _cost(op, _ones(op), dev, shapes, model=no_wino)


def test_a_tiny_op_costs_about_one_launch_on_the_device_kind():
    op, shapes = _relu(numel_n=1, c=1, hw=2)
    assert _cost(op, _ones(op), P100, shapes).forward == pytest.approx(AM.launch_gpu, rel=0.01)
    assert _cost(op, _ones(op), CPU, shapes).forward == pytest.approx(AM.launch_cpu, rel=0.01)


def test_update_time_is_memory_bound_and_depends_on_the_optimizer():
    model = CostModel()
    mb = 1 << 20
    sgd = model.update_time(256 * mb, P100)
    assert sgd == pytest.approx(AM.update_overhead_gpu + 5 * 256 * mb / (P100.mem_bandwidth * AM.mem_eff_gpu))
    assert model.update_time(512 * mb, P100) > sgd
    assert model.update_time(256 * mb, P100, "adam") > sgd
    assert model.update_time(0, P100) == 0.0
    with pytest.raises(CostModelError, match="unknown optimizer 'lbfgs'"):
        model.update_time(mb, P100, "lbfgs")


# -- calibration -------------------------------------------------------------------------------

def _data_parallel_throughput(graph: OperatorGraph, device: Device) -> float:
    """Images/s of one GPU running its whole per-GPU batch (data parallelism, sync overlapped)."""
    model = CostModel()
    step = sum(model.task_cost(op, _ones(op), device, graph_input_shapes(graph, op)).total for op in graph.ops)
    step += sum(model.update_time(p.nbytes, device) for p in graph.param_specs.values())
    return graph.batch_size / step


@pytest.mark.parametrize("blocks,lo,hi", [
    ((3, 4, 6, 3), 180, 260),   # ResNet-50: published fp32 P100 training 200–250 img/s
    ((3, 4, 23, 3), 95, 140),   # ResNet-101: 100–130 img/s
])
def test_data_parallel_resnet_on_p100_matches_published_throughput(blocks, lo, hi):
    g = resnet(64, blocks)
    assert lo < _data_parallel_throughput(g, P100) < hi


def test_cpu_tasks_that_fit_in_cache_move_bytes_faster_but_time_stays_monotone():
    sizes = [1, 2, 4, 8, 16, 32, 64]
    times = []
    for n in sizes:
        op, shapes = _relu(numel_n=n, c=16, hw=32)  # 64 KiB per sample
        times.append(_cost(op, _ones(op), CPU, shapes).forward - AM.launch_cpu)
    assert all(a < b for a, b in zip(times, times[1:]))
    per_byte = [t / n for t, n in zip(times, sizes)]
    assert per_byte[0] < per_byte[-1] / 2  # 128 KiB of traffic in cache, 8 MiB mostly not


def _zoo_graph(name: str, **options) -> OperatorGraph:
    import torch

    from autopar.planner.ir.fx_import import import_spec
    from autopar.planner.zoo import get_model

    with torch.device("meta"):
        return import_spec(get_model(name, **options))


@pytest.mark.parametrize("name,options,lo,hi", [
    ("resnet101", {"blocks": (3, 4, 6, 3)}, 180, 260),  # ResNet-50: published ~219 img/s
    ("inception_v3", {}, 120, 190),                      # published ~142 img/s
    ("vgg16", {}, 90, 200),                              # published ~154 img/s (Winograd-heavy)
    ("resnet101", {}, 100, 140),                         # published 100–130 img/s
])
def test_data_parallel_zoo_models_on_p100_match_published_throughput(name, options, lo, hi):
    """Published: single-P100 fp32 training, synthetic data (TensorFlow's DGX-1 benchmarks)."""
    g = _zoo_graph(name, batch=64, **options)
    assert lo < _data_parallel_throughput(g, P100) < hi
