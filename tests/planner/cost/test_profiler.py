"""The profiler: measuring task kernels into the profile cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autopar.planner.cost.model import CostModel, graph_input_shapes
from autopar.planner.cost.profile_cache import ProfileCache, hot_key, kind_of, task_key
from autopar.planner.cost.profiler import (EVICT_CAP_BYTES, L2_FALLBACK_BYTES, LLC_EVICT_CAP_BYTES, ROUNDS,
                                           cache_evictor, last_level_cache_bytes, shared_cache_bytes,
                                           device_kind_of, engine_overhead, l2_cache_bytes, measure_task,
                                           profile_local, profile_ops)
from autopar.planner.errors import CostModelError
from autopar.planner.hardware.topology import Device
from autopar.planner.ir.graph import WHOLE, DimKind, Op, OperatorGraph, ParamSpec, ParDim, TensorRef, TensorSpec, same

CPU = torch.device("cpu")
N, FIN, FOUT = 8, 16, 12


def _tiny_graph() -> OperatorGraph:
    """x (float) -> fc -> relu1 -> relu2 -> loss(labels); relu1 and relu2 are the same task."""
    nf = (ParDim("n", DimKind.SAMPLE, N), ParDim("f", DimKind.ATTRIBUTE, FOUT))
    ops = (
        Op("x", "input", (), (), (TensorSpec((N, FIN), ("n", "f")),), (ParDim("n", DimKind.SAMPLE, N),)),
        Op("y", "input", (), (), (TensorSpec((N,), ("n",), "int64"),), (ParDim("n", DimKind.SAMPLE, N),)),
        Op("fc", "linear", (TensorRef("x"),), ((same("n"), WHOLE),), (TensorSpec((N, FOUT), ("n", "f")),),
           (ParDim("n", DimKind.SAMPLE, N), ParDim("f", DimKind.PARAMETER, FOUT)),
           (ParamSpec("fc.weight", (FOUT, FIN), (FOUT, FIN), (same("f"), WHOLE)),
            ParamSpec("fc.bias", (FOUT,), (FOUT,), (same("f"),))),
           flops_fwd=2.0 * N * FIN * FOUT),
        Op("relu1", "relu", (TensorRef("fc"),), ((same("n"), same("f")),), (TensorSpec((N, FOUT), ("n", "f")),), nf),
        Op("relu2", "relu", (TensorRef("relu1"),), ((same("n"), same("f")),), (TensorSpec((N, FOUT), ("n", "f")),), nf),
        Op("loss", "cross_entropy", (TensorRef("relu2"), TensorRef("y")), ((same("n"), WHOLE), (same("n"),)),
           (TensorSpec((), ()),), (ParDim("n", DimKind.SAMPLE, N),)),
    )
    return OperatorGraph("tiny", ops, N)


def _fake_forward_task(op: Op, ranges, inputs, params):
    """Stands in for planner.ir.kernels.forward_task: the same contract for the kinds above."""
    if op.kind == "linear":
        assert not inputs[0].requires_grad, "a graph input needs no gradient"
        assert all(p.requires_grad for p in params)
        return [F.linear(inputs[0], params[0], params[1])]
    if op.kind == "relu":
        assert inputs[0].requires_grad
        return [torch.relu(inputs[0])]
    if op.kind == "cross_entropy":
        logits, labels = inputs
        assert labels.dtype == torch.int64 and int(labels.max()) < logits.shape[1]
        return [F.cross_entropy(logits, labels, reduction="sum")]
    raise NotImplementedError(f"no kernel for {op.kind}")


def _run(graph, choices, cache, **kw):
    return profile_ops(graph, choices, CPU, cache, repeats=3, warmup=1, device_kind="test-cpu",
                       forward_task=_fake_forward_task, **kw)


def test_profiling_fills_the_cache_with_positive_times():
    g = _tiny_graph()
    cache = ProfileCache()
    choices = [("fc", (1, 1)), ("fc", (2, 1)), ("fc", (1, 3)), ("relu1", (2, 2)), ("loss", (4,))]
    report = _run(g, choices, cache)
    assert len(report.measured) == 5 and not report.skipped and report.cached == 0
    for name, degrees in choices:
        op = g[name]
        fwd, bwd = cache.get(task_key(op, degrees, "test-cpu", graph_input_shapes(g, op)))
        assert fwd > 0 and bwd > 0


def test_cached_estimates_come_from_the_profile():
    g = _tiny_graph()
    cache = ProfileCache()
    _run(g, [("fc", (2, 1))], cache)
    device = Device(0, "w0", "localhost", "test-cpu", "cpu", 1e11, 0.0, 1.2e10, 1 << 30)
    model = CostModel(cache)
    est = model.task_cost(g["fc"], (2, 1), device, graph_input_shapes(g, g["fc"]))
    assert est.source == "profile"
    assert (est.forward, est.backward) == cache.get(task_key(g["fc"], (2, 1), "test-cpu", ((N, FIN),)))
    assert model.task_cost(g["fc"], (1, 1), device, ((N, FIN),)).source == "analytic"


def test_identical_tasks_are_measured_once_and_not_again():
    g = _tiny_graph()
    cache = ProfileCache()
    first = _run(g, [("relu1", (1, 1)), ("relu2", (1, 1)), ("relu2", (2, 1))], cache)
    assert [r.op for r in first.measured] == ["relu1", "relu2"]  # relu2 (1,1) has relu1's key
    again = _run(g, [("relu1", (1, 1)), ("relu2", (2, 1))], cache)
    assert again.measured == [] and again.cached == 2


def test_default_choices_measure_every_op_unpartitioned_but_not_graph_inputs():
    g = _tiny_graph()
    cache = ProfileCache()
    report = _run(g, None, cache)
    assert sorted(r.op for r in report.measured) == ["fc", "loss", "relu1"]
    assert all(r.degrees == (1,) * len(g[r.op].pardims) for r in report.measured)


def test_an_op_without_a_kernel_is_skipped_with_the_reason():
    g = _tiny_graph()

    def partial(op, ranges, inputs, params):
        if op.kind == "relu":
            raise NotImplementedError("relu kernel missing")
        return _fake_forward_task(op, ranges, inputs, params)

    cache = ProfileCache()
    report = profile_ops(g, [("relu1", (1, 1)), ("fc", (1, 1))], CPU, cache, repeats=2, warmup=0,
                         device_kind="test-cpu", forward_task=partial)
    assert report.skipped == [("relu1", (1, 1), "NotImplementedError: relu kernel missing")]
    assert [r.op for r in report.measured] == ["fc"]
    assert set(cache) == {report.measured[0].key, hot_key(report.measured[0].key)}   # and back to back


def test_measure_task_passes_the_task_shards():
    g = _tiny_graph()
    seen = []

    def spy(op, ranges, inputs, params):
        seen.append((dict(ranges), [tuple(t.shape) for t in inputs], [tuple(p.shape) for p in params]))
        return _fake_forward_task(op, ranges, inputs, params)

    fwd, bwd = measure_task(g, g["fc"], (2, 3), CPU, repeats=1, warmup=0, forward_task=spy)
    assert fwd > 0 and bwd > 0
    assert seen[0] == ({"n": (4, 8), "f": (4, 8)}, [(4, FIN)], [(4, FIN), (4,)])


def test_progress_is_reported_per_task():
    g = _tiny_graph()
    calls = []
    _run(g, [("fc", (1, 1)), ("relu1", (1, 1))], ProfileCache(), progress=lambda i, n, name: calls.append((i, n, name)))
    assert calls == [(0, 2, "fc"), (1, 2, "relu1"), (2, 2, "")]


@pytest.mark.parametrize("repeats,warmup", [(0, 1), (3, -1)])
def test_bad_repeat_counts_are_an_error(repeats, warmup):
    with pytest.raises(CostModelError, match="repeats >= 1"):
        profile_ops(_tiny_graph(), None, CPU, ProfileCache(), repeats=repeats, warmup=warmup,
                    forward_task=_fake_forward_task)


def test_cpu_measurements_are_stored_under_the_local_presets_product():
    from autopar.planner.hardware.presets import get_preset
    assert device_kind_of(CPU) == get_preset("local:2").devices[0].product


def test_engine_overhead_is_taken_off_the_backward_time():
    g = _tiny_graph()
    fixed, per_node = engine_overhead(CPU, repeats=5)
    assert fixed >= 0 and per_node >= 0
    # An overhead larger than any measurement leaves the one-trivial-node floor.
    _, bwd = measure_task(g, g["relu1"], (1, 1), CPU, repeats=2, warmup=0, forward_task=_fake_forward_task,
                          overhead=(10.0, 1.5e-6))
    assert bwd == 1.5e-6


def test_profile_local_covers_every_task_a_local_plan_can_use(tmp_path):
    """Real importer and kernels: after `autopar profile`, a local:2 plan costs only measured tasks."""
    from autopar.planner.cost.profiler import profile_local
    from autopar.planner.hardware.presets import get_preset
    from autopar.planner.ir.fx_import import import_spec
    from autopar.planner.ir.strategy import degree_choices
    from autopar.planner.zoo import get_model

    path = tmp_path / "profile.json"
    report = profile_local(["lenet"], workers=2, options={"batch": 2}, cache=ProfileCache.load(path),
                           repeats=1, warmup=0)
    assert report.skipped == [] and len(report.measured) > 0
    assert report.device_kind == "CPU-core (2 per host)" == kind_of(get_preset("local:2").devices[0])
    cache = ProfileCache.load(path)  # saved by profile_local
    assert set(cache) == {r.key for r in report.measured} | {hot_key(r.key) for r in report.measured}
    g = import_spec(get_model("lenet", batch=2))
    model = CostModel(cache).bind(g)
    device = get_preset("local:2").devices[1]
    for op in g.ops:
        for degrees in degree_choices(op, 2):
            est = model.task_cost(op, degrees, device)
            assert est.source == ("profile" if op.inputs else "analytic"), (op.name, degrees)
            assert (model.hot_cost(op, degrees, device) is not None) == bool(op.inputs), (op.name, degrees)
    again = profile_local(["lenet"], workers=2, options={"batch": 2}, cache=cache, repeats=1, warmup=0)
    assert again.measured == [] and again.cached == len(report.measured)


def test_cold_keys_are_for_times_measured_with_the_last_level_cache_evicted():
    from autopar.planner.cost.profiler import profile_local
    with pytest.raises(CostModelError, match="cache_level='llc'"):
        profile_local(["lenet"], workers=2, cache=ProfileCache(), cold_keys=True)


def test_max_tasks_caps_new_measurements_and_counts_the_rest():
    g = _tiny_graph()
    cache = ProfileCache()
    report = _run(g, [("fc", (1, 1)), ("fc", (2, 1)), ("relu1", (1, 1)), ("loss", (1,))], cache, max_tasks=3)
    assert [r.op for r in report.measured] == ["fc", "fc", "relu1"] and report.remaining == 1
    rest = _run(g, [("fc", (1, 1)), ("fc", (2, 1)), ("relu1", (1, 1)), ("loss", (1,))], cache, max_tasks=3)
    assert [r.op for r in rest.measured] == ["loss"] and rest.cached == 3 and rest.remaining == 0


def _snapshots_of(which: str, seen: list):
    """A forward task that records a copy of a leaf's ``.grad`` each time autograd accumulates into it:
    `which` is "param" (the first parameter) or "input" (the first input)."""
    hooked = set()

    def task(op, ranges, inputs, params):
        leaf = params[0] if which == "param" else inputs[0]
        if id(leaf) not in hooked:
            hooked.add(id(leaf))
            leaf.register_post_accumulate_grad_hook(lambda t: seen.append((t.grad.data_ptr(), t.grad.detach().clone())))
        return _fake_forward_task(op, ranges, inputs, params)

    return task


def test_backward_accumulates_into_the_parameters_grad_as_a_step_does():
    """Each timed backward call adds the weight's gradient into one preset ``.grad`` (the trainer's
    bucket view), so the k-th snapshot is k times the first, in the same storage."""
    g = _tiny_graph()
    seen: list = []
    _, bwd = measure_task(g, g["fc"], (1, 1), CPU, repeats=4, warmup=2, forward_task=_snapshots_of("param", seen))
    assert bwd > 0
    assert len(seen) == 1 + 1 + 4  # first call, one more warm-up, four timed
    first = seen[0][1]
    assert first.abs().sum() > 0
    for k, (ptr, grad) in enumerate(seen, start=1):
        assert ptr == seen[0][0], "accumulated in place into the preset tensor"
        torch.testing.assert_close(grad, k * first)


def test_backward_allocates_the_inputs_grad_afresh_each_call():
    g = _tiny_graph()
    seen: list = []
    measure_task(g, g["relu1"], (1, 1), CPU, repeats=3, warmup=1, forward_task=_snapshots_of("input", seen))
    assert len(seen) == 4
    for _, grad in seen:  # reset to None before every call: never accumulated
        torch.testing.assert_close(grad, seen[0][1])


def test_measure_task_syncs_before_each_warmup_and_timed_phase():
    g = _tiny_graph()
    calls = []
    measure_task(g, g["fc"], (1, 1), CPU, repeats=2, warmup=1, forward_task=_fake_forward_task,
                 sync=lambda: calls.append(1))
    assert len(calls) == 4  # forward warm-up, forward timed, backward warm-up, backward timed


def test_l2_size_comes_from_sysfs_with_a_fallback(tmp_path):
    for i, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                              ("2", "Unified", "2048K"), ("3", "Unified", "480M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert l2_cache_bytes(tmp_path) == 2 << 20
    assert l2_cache_bytes(tmp_path / "missing") == L2_FALLBACK_BYTES
    # the shared cache the simulator prices reuse against: the largest, and None where unknown
    assert shared_cache_bytes(tmp_path) == last_level_cache_bytes(tmp_path) == 480 << 20
    assert shared_cache_bytes(tmp_path / "missing") is None
    assert last_level_cache_bytes(tmp_path / "missing") == 8 * L2_FALLBACK_BYTES


def test_caches_are_evicted_on_the_cpu_only():
    import autopar.planner.cost.profiler as profiler
    evict = cache_evictor(CPU)
    assert evict is not None
    before = profiler._evict_buffer.clone()
    evict()
    assert profiler._evict_buffer.numel() * 4 == min(EVICT_CAP_BYTES, 2 * l2_cache_bytes())
    assert torch.equal(profiler._evict_buffer, before + 1)  # every element written
    assert cache_evictor(torch.device("meta")) is None


def test_the_last_level_evictor_writes_twice_the_last_level_cache():
    """``"llc"`` (the accuracy benchmark's diagnostic profile) passes over twice the last-level
    cache, capped, so that every call reads its data from memory; the default stays the L2's."""
    import autopar.planner.cost.profiler as profiler
    try:
        evict = cache_evictor(CPU, "llc")
        before = profiler._evict_buffer.clone()
        evict()
        assert profiler._evict_buffer.numel() * 4 == min(LLC_EVICT_CAP_BYTES, 2 * last_level_cache_bytes())
        assert torch.equal(profiler._evict_buffer, before + 1)
    finally:
        cache_evictor(CPU)
    assert profiler._evict_buffer.numel() * 4 == min(EVICT_CAP_BYTES, 2 * l2_cache_bytes())


def test_an_unknown_cache_level_is_refused_before_anything_is_measured(tmp_path):
    cache = ProfileCache.load(tmp_path / "p.json")
    for call in (lambda: cache_evictor(CPU, "l3"),
                 lambda: profile_local(["lenet"], workers=2, options={"batch": 2}, cache=cache, cache_level="l3")):
        with pytest.raises(ValueError, match="'l3' is not one of l2, llc"):
            call()
    assert len(cache) == 0


def test_every_call_of_a_profile_evicts_the_cache_level_asked_for(tmp_path, monkeypatch):
    import autopar.planner.cost.profiler as profiler
    levels = []
    real = profiler.cache_evictor

    def spy(device, level="l2"):
        levels.append(level)
        return real(device, "l2")         # measured as usual: only the level asked for is checked
    monkeypatch.setattr(profiler, "cache_evictor", spy)
    profile_local(["lenet"], workers=2, options={"batch": 2}, cache=ProfileCache.load(tmp_path / "p.json"),
                  repeats=1, warmup=0, rounds=1, concurrent=False, cache_level="llc")
    assert levels and set(levels) == {"llc"}


def test_the_evictor_runs_other_ops_code_first_and_leaves_the_random_state_alone():
    """Before the data eviction the CPU evictor runs a fixed module of the common ops forward and
    backward (a step's other ops' code), with gradients even inside no_grad (the calibration's
    chains), deterministically, and without drawing from the caller's random generator."""
    import autopar.planner.cost.profiler as profiler
    evict = cache_evictor(CPU)
    others = profiler._interloper
    assert isinstance(others, profiler._Interloper)
    others.zero_grad(set_to_none=True)
    state = torch.random.get_rng_state()
    with torch.no_grad():
        evict()
    assert torch.equal(torch.random.get_rng_state(), state)
    first = others.linear.weight.grad.clone()
    assert first.abs().sum() > 0 and others.conv.weight.grad is not None and others.embed.weight.grad is not None
    evict()
    assert torch.allclose(others.linear.weight.grad, 2 * first)   # the same pass again: the same gradient
    assert profiler._Interloper().linear.weight.equal(others.linear.weight)   # its own seed, every process alike


def test_concurrent_profiling_fills_the_same_keys_as_in_process(tmp_path):
    """workers=2 on the CPU measures in two lockstep worker processes; the keys are those the
    in-process run measures (a superset of workers=1's tasks, kept apart from them: one worker alone
    runs them faster), the times positive, progress reported here."""
    opts = {"batch": 2}
    calls = []
    conc = ProfileCache.load(tmp_path / "concurrent.json")
    report = profile_local(["lenet"], workers=2, options=opts, cache=conc, repeats=1, warmup=0, concurrent=True,
                           progress=lambda m, i, n, op: calls.append((m, i, n, op)))
    single = ProfileCache.load(tmp_path / "single.json")
    alone = profile_local(["lenet"], workers=2, options=opts, cache=single, repeats=1, warmup=0, concurrent=False)
    one = ProfileCache.load(tmp_path / "one.json")
    profile_local(["lenet"], workers=1, options=opts, cache=one, repeats=1, warmup=0)
    assert report.skipped == [] and len(report.measured) == len(alone.measured) > 0
    assert report.device_kind == alone.device_kind and report.engine_overhead >= 0
    assert set(conc) == set(single) and not set(conc) & set(one)
    assert {k.split("|", 1)[1] for k in conc} >= {k.split("|", 1)[1] for k in one}
    assert {k.split("|", 1)[0] for k in one} == {"CPU-core", "CPU-core (back to back)"}
    assert len(ProfileCache.load(tmp_path / "concurrent.json")) == 2 * len(report.measured)  # saved, and back to back
    for rec in report.measured:
        assert rec.forward > 0 and rec.backward >= 0
        assert conc.get(rec.key) == (rec.forward, rec.backward)
        assert conc.get(hot_key(rec.key))[0] > 0
    assert any(rec.backward > 0 for rec in report.measured)
    n = len(report.measured) * ROUNDS            # every task in each pass
    assert calls[0][:3] == ("lenet", 0, n) and calls[-1] == ("lenet", n, n, "")
    assert [c[1] for c in calls] == list(range(n + 1))


def test_in_process_cpu_profiling_keeps_freed_memory_as_the_ranks_do(tmp_path, monkeypatch):
    """Measured in this process (workers=1, or concurrent=False), the CPU profile runs in the
    trainer's memory regime (`keep_freed_memory`): without it every backward faulted in fresh pages
    for its gradients, and a local:1 profile of rnnlm put the backward 48 % above a two-worker one."""
    from autopar.planner.cost import profiler
    calls = []
    monkeypatch.setattr(profiler, "keep_freed_memory", lambda: calls.append("kept"))
    monkeypatch.setattr(profiler, "use_huge_pages", lambda: calls.append("huge"))
    profile_local(["lenet"], workers=1, options={"batch": 2}, cache=ProfileCache.load(tmp_path / "one.json"),
                  repeats=1, warmup=0, rounds=1)
    assert calls == ["kept", "huge"]


_HUGE = """
import json, sys, torch
from autopar.planner.cost import use_huge_pages
on = use_huge_pages()
blocks = [torch.ones(1 << 20) for _ in range(32)]       # 32 blocks of 4 MiB
huge = [int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")][0]
print(json.dumps([on, huge]))
"""


@pytest.mark.parametrize("env, on", [(None, True), ("0", False), ("1", True)])
def test_the_ranks_and_the_profilers_large_tensors_sit_on_huge_pages_unless_the_environment_says_no(env, on):
    """`use_huge_pages` has PyTorch's allocator ask for transparent huge pages for its large blocks
    (``THP_MEM_ALLOC_ENABLE``), unless the environment already turned that off; where the kernel
    gives them on request, a process's 128 MiB of 4 MiB tensors then sits on them."""
    import json
    import os
    import pathlib
    import subprocess
    import sys
    from autopar.planner.cost.profiler import HUGE_PAGES_ENV
    mode = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or not pathlib.Path("/proc/self/smaps_rollup").exists() or "[never]" in mode.read_text():
        pytest.skip("this kernel gives no transparent huge pages")
    env_ = {k: v for k, v in os.environ.items() if k != HUGE_PAGES_ENV}
    if env is not None:
        env_[HUGE_PAGES_ENV] = env
    said, huge = json.loads(subprocess.run([sys.executable, "-c", _HUGE], env=env_, check=True, capture_output=True,
                                           text=True).stdout)
    assert said is on
    if on:
        assert huge >= 64 << 10                 # kB: at least half of the 128 MiB
    elif "[madvise]" in mode.read_text():
        assert huge == 0


_FAULTS = """
import json, resource, sys, torch
from autopar.planner.cost import profiler
from autopar.planner.ir import import_spec
from autopar.planner.zoo import get_model
profiler.keep_freed_memory()                 # as the profiler's workers and the trainer's ranks
torch.set_num_threads(1)
g = import_spec(get_model("transformer", batch=8, seq=64, vocab=4096, d=128, layers=1, heads=4))
after = []
faulted = profiler.fault_in_heap
def fault_in_heap(nbytes):
    faulted(nbytes)
    after.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
profiler.fault_in_heap = fault_in_heap
profiler.measure_task(g, g["loss"], (1, 1), torch.device("cpu"), repeats=6, warmup=1, cache_level="l2")
print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_minflt - after[0], after[0] > 0]))
"""


def test_a_measured_call_finds_the_heap_already_faulted_in_as_a_steps_op_does():
    """The profiler keeps each call's results alive (`_Retained`), so each call allocates where the
    heap has not been yet; a step reuses what its first step faulted in.  `measure_task` faults in
    as much heap as it will keep first (`fault_in_heap`): the calls of a cross-entropy over 8 MiB of
    logits then page-fault (almost) never, where they paid 2,000-3,000 faults each (4 KiB pages:
    here without huge pages) and 18 ms backward instead of 1.3 ms."""
    import json
    import os
    import subprocess
    import sys
    from autopar.planner.cost.profiler import HUGE_PAGES_ENV
    if not sys.platform.startswith("linux"):
        pytest.skip("minor page faults are counted on Linux")
    env = dict(os.environ, **{HUGE_PAGES_ENV: "0"})
    faults, measured = json.loads(subprocess.run([sys.executable, "-c", _FAULTS], env=env, check=True,
                                                 capture_output=True, text=True).stdout)
    assert measured
    assert faults < 1000        # 15 calls of 2,048 pages of logits' gradient each, before


def test_each_task_keeps_its_median_pass(monkeypatch):
    """`rounds` passes over all tasks, one after another; a task keeps the median of its passes'
    forward and backward times; a task that fails in a pass is skipped with the reason (and not
    measured again)."""
    from autopar.planner.cost import profiler
    from autopar.planner.ir.fx_import import import_spec
    from autopar.planner.zoo import get_model
    g = import_spec(get_model("lenet", batch=2))
    flaky = g.ops[-1].name
    calls = []
    per_pass = [(3e-3, 6e-3), (1e-3, 2e-3), (2e-3, 1e-3)]

    def fake(graph, op, degrees, device, **kw):
        calls.append(op.name)
        k = calls.count(op.name) - 1
        if op.name == flaky and k == 1:
            raise RuntimeError("flaky kernel")
        return per_pass[k]
    monkeypatch.setattr(profiler, "measure_task", fake)
    report = profiler.profile_ops(g, None, torch.device("cpu"), ProfileCache(), rounds=3, device_kind="CPU-core")
    names = [rec.op for rec in report.measured]
    assert report.skipped == [(flaky, report.skipped[0][1], "RuntimeError: flaky kernel")]
    per = len(names) + 1
    assert calls[:per] == calls[per:2 * per] and calls[2 * per:] == calls[:per - 1]   # pass after pass
    assert names and all((rec.forward, rec.backward) == (2e-3, 2e-3) for rec in report.measured)
    with pytest.raises(CostModelError, match="rounds >= 1"):
        profiler.profile_ops(g, None, torch.device("cpu"), ProfileCache(), rounds=0)


def test_a_failing_worker_stops_a_concurrent_run():
    from autopar.planner.cost.profiler import _profile_concurrent
    from autopar.planner.ir.fx_import import import_spec
    from autopar.planner.zoo import get_model

    g = import_spec(get_model("lenet", batch=2))
    choices = [(op.name, (1,) * len(op.pardims)) for op in g.ops]
    with pytest.raises(CostModelError, match="worker"):  # the workers cannot load the model
        _profile_concurrent("no_such_model_anywhere", {}, g, choices, ProfileCache(), "test-cpu", 2,
                            repeats=1, warmup=0, budget=None, max_tasks=None, progress=None)


def test_concurrent_profiling_is_for_the_cpu():
    with pytest.raises(CostModelError, match="concurrent"):
        profile_local(["lenet"], workers=2, device=torch.device("meta"), concurrent=True, cache=ProfileCache())


def test_results_are_kept_so_each_call_writes_to_memory_the_last_did_not_use():
    from autopar.planner.cost.profiler import _Retained
    kept = _Retained(max_bytes=3 * 4096, min_items=2)
    tensors = [torch.zeros(1024) for _ in range(6)]      # 4 KiB each
    for t in tensors:
        kept.add([t])
    assert [x[0][0] for x in kept._items] == tensors[-3:]   # the newest, up to max_bytes
    big = _Retained(max_bytes=1, min_items=2)
    for t in tensors:
        big.add([t])
        assert big._bytes <= big.most_bytes(4096) and kept._bytes <= kept.most_bytes(4096)
    assert len(big._items) == 2                           # never fewer than min_items
    assert big.most_bytes(4096) == 3 * 4096 and kept.most_bytes(4096) == 4 * 4096


def test_what_a_result_keeps_alive_for_its_backward_pass_counts_in_what_is_kept():
    """A loss returns one number and saves its log-probabilities: kept by its result's bytes alone,
    every call's graph stayed, past what the profiler had faulted in."""
    from autopar.planner.cost.profiler import _Retained
    kept = _Retained(max_bytes=3 * 4096, min_items=2)
    for _ in range(6):
        kept.add([torch.zeros(())], also=4096)
    assert len(kept._items) == 2 and kept._bytes == 2 * (4096 + 4)   # 4100 bytes an item, up to 12 KiB


def test_saved_bytes_counts_what_autograd_saves_less_the_inputs_and_the_results():
    from autopar.planner.cost.profiler import saved_bytes
    x = torch.randn(64, 256, requires_grad=True)
    y = torch.randint(0, 256, (64,))
    # cross-entropy saves its log-probabilities (64 x 256 floats) and the targets (an input)
    loss = saved_bytes(lambda: torch.nn.functional.cross_entropy(x, y), [x, y])
    assert 64 * 256 * 4 <= loss < 64 * 256 * 4 + 1024
    # a linear layer saves its input and weight, both the caller's own: nothing new
    w = torch.randn(32, 256, requires_grad=True)
    assert saved_bytes(lambda: x @ w.t(), [x, w]) == 0
    # exp saves its result, which the caller counts as the result
    assert saved_bytes(lambda: x.exp(), [x]) == 0
    # no graph, nothing saved
    with torch.no_grad():
        assert saved_bytes(lambda: torch.nn.functional.cross_entropy(x, y), [x, y]) == 0


_FAULTS_PER_CALL = """
import resource, sys, torch
from autopar.planner.cost import profiler
from autopar.planner.ir import import_spec
from autopar.planner.ir.kernels import forward_task
from autopar.planner.zoo import load_model
profiler.keep_freed_memory(); profiler.use_huge_pages(); torch.set_num_threads(1)
spec = load_model("transformer", batch=8, seq=64, vocab=4096, d=32, layers=1, heads=2)
graph = import_spec(spec)
faults = []
def counted(*args, **kwargs):
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    out = forward_task(*args, **kwargs)
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return out
profiler.measure_task(graph, graph["loss"], (1, 1), torch.device("cpu"), repeats=10, warmup=3, module=spec.module,
                      forward_task=counted, hot=[])
print(" ".join(map(str, faults)))
"""


def test_a_loss_over_a_whole_batch_is_timed_without_first_touch_faults():
    """The transformer's loss over a whole batch keeps 8 MiB a call.  Before `saved_bytes` and
    `HEAP_SPREAD` its calls began faulting in 516 fresh pages each after 45 calls (docs/simulation.md,
    "Forty-fourth round").  In a fresh process, as a profile worker."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _FAULTS_PER_CALL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    faults = [int(n) for n in done.stdout.split()]
    assert len(faults) > 45                      # warm-up and timed calls, each followed by three back to back
    assert sum(faults[8:]) < 64, faults          # past the first calls, no call touches fresh pages


def test_the_heap_faulted_in_grows_once_per_size_and_stays_within_a_share_of_memory(monkeypatch):
    from autopar.planner.cost import profiler
    monkeypatch.setattr(profiler, "_heap_faulted", 0)
    monkeypatch.setattr(profiler, "_physical_bytes", lambda: 64 << 20)
    touched = []
    monkeypatch.setattr(profiler.torch, "empty", lambda n, dtype: touched.append(n) or torch.zeros(1, dtype=dtype))
    for n in (1 << 20, 1 << 19, 2 << 20, 1 << 30):
        profiler.fault_in_heap(n)
    assert touched == [1 << 20, 2 << 20, (64 << 20) // profiler.HEAP_SHARE]


def test_a_task_is_profiled_with_the_models_own_parameter_values():
    """Random unit-variance weights saturate an attention's softmax, whose backward then works on
    denormal numbers (several times slower on x86): the profiler takes the module's values."""
    import torch
    from torch import nn

    from autopar.planner.cost.profiler import _param_values, _task_tensors
    from autopar.planner.ir import import_spec
    from autopar.planner.zoo import load_model

    spec = load_model("transformer", batch=2, seq=8, vocab=64, d=16, layers=1, heads=2)
    graph = import_spec(spec)
    op = graph["blocks_0_attn"]
    _, _, params = _task_tensors(graph, op, (2, 1, 1), torch.device("cpu"), torch.Generator().manual_seed(0),
                                 spec.module)
    real = dict(spec.module.named_parameters())[op.params[0].name].detach()
    assert torch.equal(params[0].detach().reshape(-1), real.reshape(-1)[:params[0].numel()])
    assert params[0].requires_grad
    # without the module: noise scaled like a default initialization
    noise = _param_values(op.params[0], (3, 8, 16), None, torch.Generator().manual_seed(0))
    assert noise.shape == (3, 8, 16) and 0.1 < float(noise.std()) * 16 ** 0.5 < 10
    assert isinstance(spec.module, nn.Module)


def test_a_task_time_is_the_mean_of_its_calls_slow_ones_included(monkeypatch):
    """A step pays an op's slow calls too, and the simulator adds task times: the profile keeps the
    mean of the timed calls, not their median (the engine start-up, a fixed cost taken off every
    backward time, keeps the median)."""
    from autopar.planner.cost import profiler
    clock = [0.0]
    monkeypatch.setattr(profiler.time, "perf_counter", lambda: clock[0])
    durations = iter([5e-3] + [1e-3, 1e-3, 1e-3, 9e-3])      # one warm-up, then four timed calls

    def call():
        clock[0] += next(durations)
    assert profiler._timed_seconds(call, CPU, warmup=1, repeats=4) == pytest.approx(3e-3)
    durations = iter([5e-3] + [1e-3, 1e-3, 1e-3, 9e-3])
    assert profiler._timed_seconds(call, CPU, warmup=1, repeats=4, statistic="median") == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="mean.*median"):
        durations = iter([1e-3] * 3)
        profiler._timed_seconds(call, CPU, warmup=1, repeats=2, statistic="p90")


def test_calls_back_to_back_follow_every_call_and_are_timed_apart(monkeypatch):
    """With `after`, every call is followed by that many more, each after `again` but not `setup`
    (nothing evicted in between: a step that runs a task right after the same task); their mean goes
    to `hot`, and the returned time is still that of the calls made after `setup`."""
    from autopar.planner.cost import profiler
    clock = [0.0]
    monkeypatch.setattr(profiler.time, "perf_counter", lambda: clock[0])
    seen: list[str] = []
    durations = iter([9e-3, 1e-3, 1e-3] + [4e-3, 2e-3, 1e-3, 6e-3, 3e-3, 1e-3])   # warm-up, then two timed groups

    def call():
        seen.append("call")
        clock[0] += next(durations)
    hot: list[float] = []
    got = profiler._timed_seconds(call, CPU, warmup=1, repeats=2, setup=lambda: seen.append("setup"),
                                  again=lambda: seen.append("again"), after=2, hot=hot)
    assert got == pytest.approx(5e-3) and hot == [pytest.approx(1.75e-3)]
    assert seen == ["setup", "call", "again", "call", "again", "call"] * 3
    clock[0], durations, hot = 0.0, iter([1e-3, 2e-3]), []       # none asked for: none made, none reported
    assert profiler._timed_seconds(call, CPU, warmup=1, repeats=1, hot=hot) == pytest.approx(2e-3) and hot == []


def test_a_task_is_timed_back_to_back_only_where_its_l2_is_evicted():
    """`measure_task` reports the back-to-back times of a CPU task measured with the L2 evicted
    (the profile's default), and none measured without eviction or with the last level evicted."""
    g = _tiny_graph()
    hot: list[float] = []
    f, b = measure_task(g, g["fc"], (1, 1), CPU, repeats=3, warmup=1, forward_task=_fake_forward_task, hot=hot)
    assert len(hot) == 2 and hot[0] > 0 and hot[1] > 0 and f > 0 and b > 0
    for kwargs in ({"cold": False}, {"cache_level": "llc"}):
        hot = []
        measure_task(g, g["fc"], (1, 1), CPU, repeats=1, warmup=0, forward_task=_fake_forward_task, hot=hot, **kwargs)
        assert hot == [], kwargs


def _lenet():
    from autopar.planner.ir.fx_import import import_spec
    from autopar.planner.zoo import get_model
    spec = get_model("lenet", batch=2)
    return import_spec(spec), spec.module


def test_profile_items_are_the_tasks_profile_local_measures():
    from autopar.planner.cost.profiler import profile_items
    from autopar.planner.ir.strategy import degree_choices
    g, _ = _lenet()
    items = profile_items(g, 2, "CPU-core")
    want = {task_key(op, tuple(d), "CPU-core", graph_input_shapes(g, op)) for op in g.ops if op.inputs
            for d in degree_choices(op, 2)}
    assert [k for k, _, _ in items] == list(dict.fromkeys(k for k, _, _ in items))     # each key once
    assert {k for k, _, _ in items} == want
    assert all(task_key(g[name], d, "CPU-core", graph_input_shapes(g, g[name])) == k for k, name, d in items)


def test_a_lockstep_task_passes_the_barrier_as_often_whether_it_runs_or_fails():
    """Every process that measures an item in lockstep passes the barrier the same number of
    times, so one whose task fails does not leave the others waiting."""
    from autopar.planner.cost.profiler import _LOCKSTEP_PHASES, lockstep_task, profile_items
    g, module = _lenet()
    key, name, degrees = next(i for i in profile_items(g, 2, "CPU-core") if g[i[1]].params)
    calls = []
    f, b, error = lockstep_task(g, module, "CPU-core", (key, name, degrees), lambda: calls.append(1), repeats=2,
                                warmup=1, budget=None, overhead=(0.0, 0.0))
    assert error is None and f > 0 and b > 0 and len(calls) == _LOCKSTEP_PHASES
    hot: list[float] = []
    lockstep_task(g, module, "CPU-core", (key, name, degrees), lambda: None, repeats=2, warmup=1, budget=None,
                  overhead=(0.0, 0.0), hot=hot)
    assert len(hot) == 2 and hot[0] > 0                   # and back to back, where asked
    calls.clear()
    f, b, error = lockstep_task(g, module, "CPU-core", ("another key", name, degrees), lambda: calls.append(1),
                                repeats=2, warmup=1, budget=None, overhead=(0.0, 0.0))
    assert (f, b) == (0.0, 0.0) and "gives " + name + " another task key" in error
    assert len(calls) == _LOCKSTEP_PHASES


def test_lockstep_passes_are_stored_as_the_concurrent_workers_are():
    """Per pass the median over the processes, per task the median of its passes; a task that
    failed on any process in a pass is skipped with the first error."""
    from autopar.planner.cost.profiler import profile_items, store_lockstep_passes
    g, _ = _lenet()
    items = profile_items(g, 2, "CPU-core")[:2]
    ok = [[(1.0, 2.0, None), (3.0, 6.0, None), (2.0, 1.0, None)], [(0.0, 0.0, "RuntimeError: no")] * 3]
    other = [[(3.0, 4.0, None), (5.0, 8.0, None), (2.0, 1.0, None)], [(1.0, 1.0, None)] * 3]
    cache = ProfileCache()
    report = store_lockstep_passes(g, items, [ok, other], cache, "CPU-core")
    assert cache.get(items[0][0]) == (2.0, 3.0)           # passes (2, 3), (4, 7), (2, 1): medians 2 and 3
    assert items[1][0] not in cache and report.skipped == [(items[1][1], items[1][2], "RuntimeError: no")]
    assert [r.key for r in report.measured] == [items[0][0]]
    assert hot_key(items[0][0]) not in cache              # none measured back to back: none stored
    # with their back-to-back times (`lockstep_task`'s `hot`): those stored beside, the same way
    ok = [[(1.0, 2.0, None, 0.5, 1.0), (3.0, 6.0, None, 1.5, 3.0), (2.0, 1.0, None, 1.0, 0.5)]]
    other = [[(3.0, 4.0, None, 1.5, 2.0), (5.0, 8.0, None, 2.5, 4.0), (2.0, 1.0, None, 1.0, 0.5)]]
    cache = ProfileCache()
    store_lockstep_passes(g, items[:1], [ok, other], cache, "CPU-core")
    assert cache.get(items[0][0]) == (2.0, 3.0) and cache.get(hot_key(items[0][0])) == (1.0, 1.5)
