"""Measure op tasks on a local device and store their times in the profile cache.

    autopar profile        # the CLI calls profile_local(["resnet101"], workers=4, options={...})

FlexFlow (sec. 5.1) sets a task's execution time by "running the task multiple times on the
device and measuring the average execution time", once per distinct operation type and size;
OptCNN (sec. 5.1) measures each layer under each configuration.  This module does that for
autopar: for every distinct task key (`planner.cost.profile_cache.task_key`) of the requested
(op, degrees) pairs that the cache does not hold yet, it

1. builds random local shards of the representative task's inputs, with the graph's dtypes
   (integer inputs — token ids, class labels — are drawn below the smallest axis of the op's
   float tensors, so they are valid indices whatever they index), and its parameter shards from
   the model's own values (`_param_values`: random unit-variance weights would saturate an
   attention's softmax into denormal numbers that the step never sees);
2. runs the op's task kernel (`planner.ir.kernels.forward_task`, the same code the trainer runs)
   `warmup` times (at least once), then `repeats` timed times, and takes the mean (a step pays
   an op's slow calls too, and the simulator adds task times: `_timed_seconds`); a task so
   slow that the repeats would exceed `budget` seconds is repeated fewer times;
3. times the backward pass the same way, as the trainer runs it: ``torch.autograd.backward`` of
   the outputs with a fixed random output gradient, reusing one forward graph (``retain_graph``)
   so every repeat measures the same work.  Every parameter's ``.grad`` is set to a zero tensor
   of its shape beforehand, so each call *adds* into it, as a step adds into the trainer's
   preallocated gradient buckets (`trainer.sync.GradSync.zero_grad`) — for a weight shared by
   many ops (an unrolled RNN's decoder) that addition is a large part of each use's backward;
   the ``.grad`` of every input that needs a gradient (a float input not produced by a graph
   input) is reset to None before each call, so it is freshly allocated, as in the trainer.
   A standalone call pays a fixed engine start-up (about 10 µs on this machine's idle CPU,
   against 3–5 µs per node) that a training step pays once per autograd call, not once per op
   of a fused chain; `engine_overhead` measures it (chains of 1 and 9 trivial nodes into a leaf
   whose ``.grad`` is preset) and it is subtracted, keeping at least one trivial node's time;
4. stores the two times under the device's product name.  `profile_local` makes `ROUNDS`
   passes over all the tasks, one after another, and keeps each task's median pass: the
   machine's speed moves from second to second, and one pass of a few seconds samples one
   moment of it (five back-to-back one-pass profiles of rnnlm summed its data-parallel ops to
   51.5-64.9 ms; with three passes, 55.6-60.9 ms).

Measurement conditions.  Repeating one op on the same tensors keeps them in the core's private
caches, which a real step does not: other ops evict them between two uses.  Repeating it also
keeps its code warm, which a step does not either: other ops' code runs between two calls.  On
the CPU, every call (warm-up and timed) is therefore preceded, outside the timed region, by a
forward and backward pass of a small fixed module made of the ops models are made of
(`_Interloper`, on tiny tensors), then by a write over a buffer twice the size of the core's L2
cache (read from ``/sys/devices/system/cpu/cpu0/cache/index*/``; 4 MiB assumed when it is not
there; at most 64 MiB).  On CUDA nothing is evicted.  On the CPU, `profile_local` with ``workers`` N > 1 measures
in N worker processes at once (one thread each, as the `local` preset's ranks run), which measure
the same task in lockstep — a barrier before each warm-up and before each set of timed
repetitions — so that, as in an N-rank step, the other cores compete for memory bandwidth and the
shared cache while one measures; the stored time is the median over the workers of their means.
The workers come from a fork server (a process that traced a model with fake tensors and ran a
backward pass cannot be forked safely) and import the model themselves by name.  ``workers=1``,
``concurrent=False`` and CUDA devices measure in the calling process; on the CPU it too keeps
freed memory (`keep_freed_memory`), as the workers and the trainer's ranks do.

Back to back.  Some steps do run a task right after the same task: under data or model
parallelism each rank runs rnnlm's unrolled cells, and then its decoders, eight at a time on the
same weights.  Such a call costs less than one that follows other ops.  In rnnlm's data-parallel
steps (2026-11-29, docs/simulation.md, "Thirty-third round"), the eight decoders' forward calls
took 1.12, 0.87, 0.67, 0.57, 0.56, 0.59, 0.54 and 0.54 ms in turn, where the profile priced each
at 1.05 ms; the first layer's cells took 0.53, 0.30, 0.24, 0.21, 0.20, 0.19, 0.19 and 0.19 ms,
priced at 0.30 ms.  So on the CPU, with the L2 evicted, every call (warm-up and timed) is followed
by `BACK_TO_BACK` calls with nothing evicted in between (a backward call only after its inputs'
gradients are reset), timed apart.  Their mean is stored under `hot_kind` products, where
`CostModel.hot_cost` finds them; `planner.sim.reuse` prices a task at it where the step runs it
right after the same task.  Measured that way in two workers, the decoder's forward took 847 us
after the eviction, then 649, 580 and 560 us; a cell's took 242, then 184, 182 and 182 us.

Timing: ``time.perf_counter`` around each call on CPU (PyTorch CPU ops are synchronous).  On
CUDA two numbers per call (`_cuda_times`): the kernels' seconds on the device, from
``torch.cuda.Event`` pairs around each call while a sleep kernel keeps the GPU busy so that the
host has queued every call before the first runs (events on an idle GPU count the host's launch
latency as kernel time: on an H100 the calibration's 4 us ``tanh`` kernels read as 24 us); and
the host's seconds issuing them, each call timed alone between synchronizations.  The simulator
runs the two on two streams (`planner.sim.trainer_model.op_plan`).  Run on an NVIDIA H100
(docs/simulation.md, "On a GPU").  The local CPU workers of the `local` preset run one thread each, so
`profile_local` pins torch to one thread while it measures.
"""

from __future__ import annotations

import math
import os
import queue
import statistics
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from ..errors import CostModelError, TopologyError
from ..hardware.catalog import LOCAL_CPU, lookup
from ..ir.graph import Op, OperatorGraph
from .model import graph_input_shapes
from .profile_cache import (ProfileCache, cold_kind, hot_key, kind_of, representative_ranges, task_key,
                            task_shapes)

ForwardTask = Callable[[Op, dict, list, list], Any]

#: Where Linux describes cpu0's caches (one ``index<i>`` folder per cache: level, type, size).
CPU_CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
#: Passes over all tasks `profile_local` makes by default, keeping each task's median pass (step 4
#: of the module docstring).
ROUNDS = 3
#: The L2 size assumed when sysfs does not tell it, and the most the eviction buffer may take.
L2_FALLBACK_BYTES = 4 << 20
EVICT_CAP_BYTES = 64 << 20
#: The cache levels `cache_evictor` can leave cold: the core's own L2 (what `profile_local` stores
#: by default), or the last-level cache too (a diagnostic profile, `trainer.accuracy`).
CACHE_LEVELS = ("l2", "llc")
#: The most the last-level eviction buffer may take (twice the last-level cache, up to this).
LLC_EVICT_CAP_BYTES = 128 << 20
#: Calls made back to back after each timed call on the CPU (module doc, "Back to back").
BACK_TO_BACK = 3


@dataclass(frozen=True)
class ProfileRecord:
    key: str
    op: str  # the first op (by graph order) that has this key
    degrees: tuple[int, ...]
    forward: float
    backward: float


@dataclass
class ProfileReport:
    """What one profiling run measured, found already cached, and could not run."""

    device_kind: str
    measured: list[ProfileRecord] = field(default_factory=list)
    cached: int = 0
    skipped: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    seconds: float = 0.0
    engine_overhead: float = 0.0  # seconds taken off every backward time (see module doc)
    remaining: int = 0  # new task keys left unmeasured because of `max_tasks`

    def merge(self, other: "ProfileReport") -> "ProfileReport":
        return ProfileReport(self.device_kind, self.measured + other.measured, self.cached + other.cached,
                             self.skipped + other.skipped, self.seconds + other.seconds,
                             max(self.engine_overhead, other.engine_overhead), self.remaining + other.remaining)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_kind": self.device_kind, "measured": len(self.measured), "cached": self.cached,
            "skipped": [{"op": o, "degrees": list(d), "reason": r} for o, d, r in self.skipped],
            "remaining": self.remaining, "seconds": round(self.seconds, 3), "engine_overhead": self.engine_overhead,
            "entries": [{"op": r.op, "degrees": list(r.degrees), "forward": r.forward, "backward": r.backward,
                         "key": r.key} for r in self.measured],
        }


def device_kind_of(device: torch.device) -> str:
    """The product name task keys use for `device`, matching the names topologies give devices.

    CPU: the `local` preset's worker product (`planner.hardware.catalog.LOCAL_CPU`).  CUDA: the driver's
    name with spaces as dashes, as GPU feature discovery writes the `nvidia.com/gpu.product` node
    label ("Tesla-P100-SXM2-16GB"), resolved to the device catalog's product when it knows it.
    """
    if device.type == "cpu":
        return LOCAL_CPU.product
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        label = torch.cuda.get_device_name(device).replace(" ", "-")
        try:
            return lookup(label).product
        except TopologyError:  # not in the catalog: a topology file names it the same way
            return label
    raise CostModelError(f"cannot profile on device {device}: only cpu and cuda devices are supported")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        torch.cuda.synchronize(device)


def _size_bytes(text: str) -> int:
    """``"2048K"`` -> 2097152 (sysfs writes cache sizes with a K, M or G suffix)."""
    text = text.strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def l2_cache_bytes(root: Path = CPU_CACHE_SYSFS) -> int:
    """The size of cpu0's level-2 (data or unified) cache from sysfs; `L2_FALLBACK_BYTES` if unknown."""
    for index in sorted(root.glob("index*")):
        try:
            if (index / "level").read_text().strip() != "2":
                continue
            kind = index / "type"
            if kind.exists() and kind.read_text().strip() not in ("Data", "Unified"):
                continue
            size = _size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if size > 0:
            return size
    return L2_FALLBACK_BYTES


def last_level_cache_bytes(root: Path = CPU_CACHE_SYSFS) -> int:
    """The size of cpu0's largest (last-level) data or unified cache from sysfs; `L2_FALLBACK_BYTES`
    times 8 if unknown."""
    known = shared_cache_bytes(root)
    return known if known is not None else 8 * L2_FALLBACK_BYTES


def shared_cache_bytes(root: Path = CPU_CACHE_SYSFS) -> int | None:
    """The size of cpu0's largest (last-level) data or unified cache from sysfs, or None where
    Linux does not tell it (`RuntimeCalibration.shared_cache_bytes`)."""
    sizes = []
    for index in sorted(root.glob("index*")):
        try:
            kind = index / "type"
            if kind.exists() and kind.read_text().strip() not in ("Data", "Unified"):
                continue
            sizes.append(_size_bytes((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=None)


_evict_buffer: torch.Tensor | None = None


def bind_to_own_cores(index: int, count: int) -> tuple[int, ...]:
    """Bind this process, and every thread it starts from now on, to its share of the cores it may
    run on: process `index` of `count` local processes gets the `index`-th of `count` equal slices.
    Returns the cores bound to, or ``()`` (nothing changed) where there are fewer cores than
    processes or the system cannot bind.

    The trainer's gloo ranks and the profiler's concurrent workers call it, so that a rank's
    threads (its Python thread, gloo's network loop, the all-reduce workers) share one core, as
    Intel's launcher and torchrun's NUMA binding bind CPU ranks.  Unbound, this machine's scheduler
    put a rank's woken network thread behind the other rank's compute on its core while the other
    core idled, and the message waited for the next tick (docs/simulation.md, "Tenth round").
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return ()
    if count < 1 or not 0 <= index < count or len(cpus) < count:
        return ()
    per = len(cpus) // count
    mine = tuple(cpus[index * per:(index + 1) * per])
    try:
        os.sched_setaffinity(0, mine)
    except OSError:
        return ()
    return mine


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for reuse instead of returning it to the system.

    A training step allocates its activations afresh every step and frees them in the backward
    pass.  By default glibc serves large blocks with ``mmap`` and unmaps them on free (and trims
    its heap), so every step faults in fresh pages for every large tensor: on this machine a
    4 MiB activation took 1.5 ms to produce instead of 0.5 ms, and steady-state steps of a small
    model were 13-15 % slower.  With mmap off and no trimming, the heap grows to the step's peak
    once and is reused.  The trainer's ranks and the profiler's workers both call it, so that ops
    are measured in the memory regime they run in.  A no-op where the C library is not glibc."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallopt(-4, 0)              # M_MMAP_MAX: serve every block from the heap
    mallopt(-1, 2**31 - 1)      # M_TRIM_THRESHOLD: keep up to 2 GiB free at the heap's top


#: PyTorch's CPU allocator asks the kernel for transparent huge pages (2 MiB) for every block of
#: 2 MiB or more where this is "1" (`use_huge_pages`); it reads it once, at a process's first such block.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def use_huge_pages() -> bool:
    """Have PyTorch's CPU allocator back its large blocks with transparent huge pages, unless the
    environment already says otherwise (``THP_MEM_ALLOC_ENABLE=0``); returns whether it will.

    A step touches hundreds of MiB of tensors; with 4 KiB pages each costs TLB misses, and in a
    virtual machine a miss walks two levels of page tables.  Where the kernel gives huge pages
    only on request (``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise``, as on the AMD
    VM of 2026-11-29), one process stepping rnnlm took 42.4-44.7 ms with them against 44.9-48.7 ms
    without, in four alternating pairs, while a streaming add over 32 MiB did not move.  The
    trainer's ranks and the profiler's workers both call it, so that ops are measured in the
    memory regime they run in; it must run before the process's first block of 2 MiB (the
    allocator reads the setting once).  Where the kernel gives them to every large region anyway
    (``always``) it makes every large block start on a huge page; where it never does, nothing."""
    os.environ.setdefault(HUGE_PAGES_ENV, "1")
    return os.environ[HUGE_PAGES_ENV] == "1"


class _Interloper(nn.Module):
    """What runs between two calls of a profiled op on the CPU, standing for the other ops of a step.

    In a step no op follows itself: between two calls of an LSTM cell the host runs the code of
    a dozen other ops, forward and backward, and of the autograd engine and the allocator, and
    finds its own code and branch history evicted as it finds its data evicted.  Repeating one op
    keeps them warm.  This module runs, on tiny tensors (their data is negligible), the code of
    the ops models are made of: a convolution, batch norm, pooling, an embedding, an LSTM cell, a
    linear layer, GELU, layer norm, multi-head attention, concatenation, tanh, sigmoid, softmax
    and a cross-entropy loss, then its backward pass.  Deterministic: its weights come from its
    own generator and it draws no random numbers (no dropout), so it leaves the caller's random
    state as it found it.  Measured on rnnlm's ops (one worker, 2026-11-27): an LSTM cell's
    forward 1.23x its time repeated alone, a slice's 2.3x, an embedding's 1.85x, a linear layer
    with an 8 MiB weight 1.04x: the fixed part of a call grows, the arithmetic does not."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.conv, self.norm2d = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
            self.embed, self.cell = nn.Embedding(32, 16), nn.LSTMCell(16, 16)
            self.linear, self.norm = nn.Linear(16, 16), nn.LayerNorm(16)
            self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
            self.image = torch.randn(2, 3, 10, 10)
            self.tokens = torch.randint(0, 16, (2, 4))

    def forward(self) -> torch.Tensor:
        f = nn.functional
        x = f.max_pool2d(f.relu(self.norm2d(self.conv(self.image))), 2).flatten(1)[:, :16]
        e = self.embed(self.tokens)
        h, _ = self.cell(e[:, 0], (x, x))
        y = self.norm(f.gelu(self.linear(h)))
        a, _ = self.attention(e, e, e)
        z = torch.cat([y, a.mean(1)], 1).tanh().sigmoid()
        return f.cross_entropy(z, self.tokens[:, 0]) + f.softmax(z, -1).sum()

    def run(self) -> None:
        with torch.enable_grad():   # the calibration's chains evict inside no_grad regions too
            self().backward()


_interloper: _Interloper | None = None


def _check_cache_level(level: str) -> None:
    if level not in CACHE_LEVELS:
        raise ValueError(f"cache level {level!r} is not one of {', '.join(CACHE_LEVELS)}: 'l2' leaves the core's "
                         "own caches cold before each timed call, 'llc' the last-level cache too")


def cache_evictor(device: torch.device, level: str = "l2") -> Callable[[], None] | None:
    """A call that leaves this core's caches as the other ops of a step leave them, on the CPU
    (None on other devices; see module doc).

    It runs the `_Interloper` (other ops' code), then adds to every element of a float32 buffer
    of twice the L2 size (at most `EVICT_CAP_BYTES`): a read-modify-write, so every line of the
    buffer passes through the caches (a plain fill may be done with stores that bypass them).
    With `level` ``"llc"`` the buffer is twice the last-level cache (at most
    `LLC_EVICT_CAP_BYTES`), so that every call reads its data from memory: the other bound of
    what a step leaves in the caches, which `trainer.accuracy` profiles too (its
    ``cache_share``).  Both are made once per process.
    """
    global _evict_buffer, _interloper
    _check_cache_level(level)
    if device.type != "cpu":
        return None
    numel = (min(EVICT_CAP_BYTES, 2 * l2_cache_bytes()) if level == "l2"
             else min(LLC_EVICT_CAP_BYTES, 2 * last_level_cache_bytes())) // 4
    if _evict_buffer is None or _evict_buffer.numel() != numel:
        _evict_buffer = torch.zeros(numel, dtype=torch.float32)
    if _interloper is None:
        _interloper = _Interloper()
    buf, others = _evict_buffer, _interloper

    def evict() -> None:
        others.run()
        buf.add_(1.0)

    return evict


def _sleep_rate(device: torch.device) -> float:  # pragma: no cover - needs a GPU
    """Cycles per second of ``torch.cuda._sleep`` on `device` (timed once per process)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    rate = _SLEEP_RATES.get(index)
    if rate is None:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)            # wake the clocks
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = _SLEEP_RATES[index] = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)
    return rate


_SLEEP_RATES: dict[int, float] = {}
#: The most a GPU is kept busy while the host queues the timed calls (`_timed_seconds`).
_COVER_CAP_S = 0.5


def _cuda_times(fn: Callable[[], Any], device: torch.device, repeats: int, prepare: Callable[[], None],
                host: list | None) -> list[float]:  # pragma: no cover - needs a GPU
    """Device seconds of `repeats` calls of `fn`, and (into `host`) the mean host seconds of one.

    A kernel's own time and its host's time to issue it are two numbers on a GPU: the host issues
    and goes on while the kernels run behind it.  Host: each call timed alone, the device idle
    before it and waited for after it, outside the timer.  Device: a sleep kernel keeps the GPU
    busy while the host queues every call between its pair of events, so each pair brackets that
    call's kernels back to back — not the host's launch latency, which an idle GPU's events would
    count (for small ops they measured the host instead of the device)."""
    hosts = []
    for _ in range(repeats):
        prepare()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        hosts.append(time.perf_counter() - t0)
        _sync(device)
    if host is not None:
        host.append(statistics.fmean(hosts))
    with torch.cuda.device(device):
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        t0 = time.perf_counter()
        prepare()
        setup_s = time.perf_counter() - t0
        cover = min(_COVER_CAP_S, 2.0 * repeats * (max(hosts) + setup_s) + 1e-3)
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(cover * _sleep_rate(device)))
        for k, (start, end) in enumerate(pairs):
            if k:
                prepare()
            start.record()
            fn()
            end.record()
        pairs[-1][1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]  # ms -> s


def _timed_seconds(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int,
                   budget: float | None = None, *, setup: Callable[[], None] | None = None,
                   sync: Callable[[], None] | None = None, statistic: str = "mean",
                   host: list | None = None, after: int = 0, again: Callable[[], None] | None = None,
                   hot: list | None = None) -> float:
    """Mean (or, with ``statistic="median"``, median) of `repeats` timed calls after `warmup` (at
    least one) untimed ones.

    A task's time is the mean: a step pays every call of an op in full, its slow calls included,
    and the simulator adds task times, so the median would leave the tail out of every sum (on
    this machine an op's mean over its repeats is 4 % above its median for the typical op, 5-7 %
    on average).  `profile_local` keeps the median of several passes' means, which still shuts
    out a pass that a burst of load on the machine slowed as a whole.

    With a `budget` (seconds), a call so slow that `repeats` of them would exceed it is repeated
    fewer times (at least once): the spread of such calls is small next to their length.
    `setup` runs before every call, warm-up or timed, outside the timed region (cache eviction,
    resetting gradients); `sync` runs before the warm-up and again before the timed repetitions
    (the barrier that keeps concurrent workers in lockstep).

    On a GPU the calls' device time is returned and their host time appended to `host`
    (`_cuda_times`).

    With `after` > 0 (the CPU only), every call, warm-up or timed, is followed by `after` more
    calls back to back, each after `again` (resetting gradients) but not `setup`: a step that runs
    a task right after the same task (`planner.sim.reuse`).  Their mean (or median) is appended to
    `hot`; the time returned is still that of the calls made right after `setup`.
    """
    prepare = setup if setup is not None else (lambda: None)
    between = again if again is not None else (lambda: None)
    after = after if device.type == "cpu" else 0
    follow: list[float] = []

    def more(timed: bool) -> None:
        for _ in range(after):
            between()
            t0 = time.perf_counter()
            fn()
            if timed:
                follow.append(time.perf_counter() - t0)
    if sync is not None:
        sync()
    prepare()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    more(False)
    for _ in range(warmup - 1):
        prepare()
        fn()
        more(False)
    if budget is not None:
        repeats = max(1, min(repeats, int(budget / max(first * (1 + after), 1e-9))))
    _sync(device)
    if sync is not None:
        sync()
    times = []
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        times = _cuda_times(fn, device, repeats, prepare, host)
    else:
        for _ in range(repeats):
            prepare()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            more(True)
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic must be 'mean' or 'median', not {statistic!r}")
    pick = statistics.median if statistic == "median" else statistics.fmean
    if follow and hot is not None:
        hot.append(pick(follow))
    return pick(times)

_TORCH_DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}


def _param_values(spec, shape: tuple[int, ...], module: nn.Module | None, gen: torch.Generator) -> torch.Tensor:
    """A task's shard of parameter `spec`: the model's own values where `module` has the parameter
    (its first elements, in the shard's shape), else normal noise scaled like a default
    initialization (1/sqrt(fan-in)).

    Values matter on a CPU: unit-variance weights in an attention layer saturate its softmax, whose
    backward then multiplies denormal numbers, and x86 cores take microcode assists on each --
    the attention backward of a small transformer measured 5.0 ms that way against 1.25 ms with its
    initialized weights, as the step runs it."""
    real = dict(module.named_parameters()).get(spec.name) if module is not None else None
    n = 1
    for s in shape:
        n *= s
    if real is not None and not real.is_meta and real.numel() >= n:
        return real.detach().reshape(-1)[:n].reshape(shape).to(dtype=_TORCH_DTYPES[spec.dtype]).clone()
    fan_in = shape[-1] if len(shape) > 1 else 1
    return (torch.randn(shape, generator=gen, dtype=torch.float32) / fan_in ** 0.5).to(dtype=_TORCH_DTYPES[spec.dtype])


def _task_tensors(graph: OperatorGraph, op: Op, degrees: tuple[int, ...], device: torch.device,
                  gen: torch.Generator, module: nn.Module | None = None
                  ) -> tuple[dict, list[torch.Tensor], list[torch.Tensor]]:
    ranges = representative_ranges(op, degrees)
    in_shapes, _, par_shapes = task_shapes(op, degrees, graph_input_shapes(graph, op), ranges)
    in_dtypes = [graph.input_spec(op, i).dtype for i in range(len(op.inputs))]
    float_sizes = [s for shape, dt in zip(in_shapes, in_dtypes) if _TORCH_DTYPES[dt].is_floating_point
                   for s in shape] + [s for shape in par_shapes for s in shape]
    index_high = max(1, min(float_sizes, default=1))
    inputs = []
    for i, (shape, dt) in enumerate(zip(in_shapes, in_dtypes)):
        tdt = _TORCH_DTYPES[dt]
        if tdt.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=tdt)
            producer = graph[op.inputs[i].op]
            t.requires_grad_(bool(producer.inputs))  # graph inputs (data) need no gradient
        elif tdt is torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).to(device=device, dtype=tdt)
        else:
            t = torch.randint(0, index_high, shape, generator=gen).to(device=device, dtype=tdt)
        inputs.append(t)
    params = [_param_values(p, tuple(shape), module, gen).to(device=device).requires_grad_(True)
              for shape, p in zip(par_shapes, op.params)]
    return ranges, inputs, params


def engine_overhead(device: torch.device, repeats: int = 50) -> tuple[float, float]:
    """(fixed seconds per ``autograd.backward`` call, seconds per trivial node) on `device`.

    From the medians of backward passes through chains of 1 and 9 scalar multiplications into a
    leaf whose ``.grad`` is preset, as `measure_task` presets the parameters' (so each pass also
    runs the leaf's gradient-accumulation node, a trivial node too): per node = difference / 8,
    fixed = 1-chain time - 2 nodes (the multiplication and the accumulation).  On a GPU these are
    the host's times: the engine's start-up is host work, taken off the host's backward time.
    """
    x = torch.randn(4, device=device, requires_grad=True)
    x.grad = torch.zeros_like(x)
    g = torch.ones(4, device=device)

    def chain(k: int) -> float:
        y = x
        for _ in range(k):
            y = y * 1.5
        host: list[float] = []
        seconds = _timed_seconds(lambda: torch.autograd.backward(y, g, retain_graph=True), device, 5, repeats,
                                 statistic="median", host=host)
        return host[0] if host else seconds

    one, nine = chain(1), chain(9)
    # Timer noise can make the difference tiny or negative; a node costs at least 0.1 µs.
    per_node = max(1e-7, (nine - one) / 8)
    return max(0.0, one - 2 * per_node), per_node


def _outputs(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for t in result if isinstance(t, torch.Tensor)]


def measure_task(graph: OperatorGraph, op: Op, degrees: tuple[int, ...], device: torch.device, *,
                 repeats: int = 10, warmup: int = 3, forward_task: ForwardTask | None = None,
                 module: nn.Module | None = None, budget: float | None = None, seed: int = 0,
                 overhead: tuple[float, float] = (0.0, 0.0), cold: bool = True, cache_level: str = "l2",
                 sync: Callable[[], None] | None = None, host: list | None = None,
                 hot: list | None = None) -> tuple[float, float]:
    """Mean forward and backward seconds of the representative task of `op` split by `degrees`
    (`_timed_seconds`).

    `module` (the model the graph was imported from) is passed on to the kernel for ops that call
    a submodule.  `overhead` is `engine_overhead(device)`: its fixed part is taken off the
    backward time.  The backward pass accumulates into the parameters' preset ``.grad`` and
    allocates the inputs' gradients afresh (see module doc).  `cold` evicts the CPU caches before
    every call (`cache_evictor` at `cache_level`; nothing on other devices).  `sync` is called before each warm-up
    and each set of timed repetitions, four times at most (two when there is no backward pass).
    On a GPU the times are the kernels' on the device, and `host` (a list) receives the host's
    forward and backward seconds issuing them (`_cuda_times`; the engine's fixed start-up, host
    work, is taken off the host's backward there).

    `hot` (a list), on the CPU with the L2 evicted (`cold`, `cache_level` ``"l2"``), receives the
    task's forward and backward seconds back to back: each timed call is followed by
    `BACK_TO_BACK` calls with nothing evicted in between (module doc, "Back to back").
    """
    if forward_task is None:
        from ..ir.kernels import forward_task
    extra: dict[str, Any] = {"module": module} if module is not None else {}
    if device.type != "cpu":  # pragma: no cover - needs a GPU; where kernels create tensors
        extra["device"] = device
    gen = torch.Generator().manual_seed(seed)
    ranges, inputs, params = _task_tensors(graph, op, degrees, device, gen, module)
    evict = cache_evictor(device, cache_level) if cold else None
    kept = _Retained() if cold else None
    saved = 0
    if kept is not None and device.type == "cpu":
        _, out_shapes, _ = task_shapes(op, degrees, graph_input_shapes(graph, op), ranges)
        saved = saved_bytes(lambda: forward_task(op, ranges, inputs, params, **extra), inputs + params)
        outs_bytes = sum(math.prod(s) * o.itemsize for s, o in zip(out_shapes, op.outputs)) + saved
        grads_bytes = sum(t.numel() * t.element_size() for t in inputs if t.requires_grad)
        live = kept.most_bytes(max(outs_bytes, grads_bytes)) + outs_bytes + grads_bytes
        fault_in_heap(HEAP_SPREAD * live + HEAP_SLACK)

    def fwd():
        out = forward_task(op, ranges, inputs, params, **extra)
        if kept is not None:
            kept.add(_outputs(out), also=saved)
        return out

    hosts: list[float] = []
    hots: list[float] = []
    after = BACK_TO_BACK if hot is not None and evict is not None and cache_level == "l2" else 0
    fwd_s = _timed_seconds(fwd, device, warmup, repeats, budget, setup=evict, sync=sync, host=hosts,
                           after=after, hot=hots)
    outs = [o for o in _outputs(fwd()) if o.requires_grad]
    fresh = [t for t in inputs if t.requires_grad]  # leaves whose gradient the step allocates
    accumulated = [p for p in params if p.requires_grad and p.is_floating_point()]
    if not outs or not (fresh or accumulated):
        if host is not None and hosts:
            host[:] = [hosts[0], 0.0]
        if after and hots:
            hot[:] = [hots[0], 0.0]
        return fwd_s, 0.0
    grads = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(device=device, dtype=o.dtype) for o in outs]
    for p in accumulated:  # the trainer's gradient buckets: every backward use adds into them
        p.grad = torch.zeros_like(p)

    def fresh_grads():
        if kept is not None:
            kept.add([t.grad for t in fresh if t.grad is not None])
        for t in fresh:
            t.grad = None

    def before_backward():
        fresh_grads()
        if evict is not None:
            evict()

    def bwd():
        torch.autograd.backward(outs, grads, retain_graph=True)

    fixed, per_node = overhead
    bwd_s = _timed_seconds(bwd, device, warmup, repeats, budget, setup=before_backward, sync=sync, host=hosts,
                           after=after, again=fresh_grads, hot=hots)
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        if host is not None and len(hosts) == 2:
            host[:] = [hosts[0], max(hosts[1] - fixed, per_node)]
        return fwd_s, bwd_s
    if after and len(hots) == 2:
        hot[:] = [hots[0], max(hots[1] - fixed, per_node)]
    return fwd_s, max(bwd_s - fixed, per_node)


#: Heap faulted in beyond what a task's retained results and temporaries need (`measure_task`).
HEAP_SLACK = 64 << 20
#: How much more heap than its live bytes a task's calls spread over (`measure_task`): PyTorch puts a
#: block of 2 MiB or more on a 2 MiB boundary for huge pages (`use_huge_pages`), and glibc cuts such a
#: block from a larger free one, so a freed result's block is not reused as it was and the heap creeps
#: on.  The transformer's cross-entropy over a whole batch, whose calls keep 8 MiB each up to 264 MiB,
#: began faulting in 516 fresh pages a call after 45 calls with 344 MiB faulted in (its forward 4.8 ms a
#: call instead of 1.3), and none with 536 MiB.
HEAP_SPREAD = 2

#: `fault_in_heap` touches at most this fraction (1/HEAP_SHARE) of the machine's memory: a task whose
#: results take more pays the faults rather than risk the memory of the other workers.
HEAP_SHARE = 4

#: Bytes of heap this process has already faulted in and freed (`fault_in_heap`).
_heap_faulted = 0


def _physical_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 8 << 30


def fault_in_heap(nbytes: int) -> None:
    """Have the next `nbytes` of this process's heap mapped: touch a block of that size once and
    free it (once per process and size; a larger request touches again).

    A step's steady state reuses the blocks its first step faulted in (`keep_freed_memory`): in
    rnnlm's and the transformer's steps, 0-5 minor page faults a step but for an occasional 500-2000.
    The profiler keeps each call's results alive (`_Retained`, up to 256 MiB), so every measured
    call allocated where the heap had never been, and paid the kernel's first touch of every page
    in the task's time: the transformer's cross-entropy over a whole batch (8 MiB of logits) took
    18.0 ms backward with 16,000 faults, 1.3 ms with the heap faulted in first (1.2-1.7 ms in its
    steps), and any task with large results measured while a worker's heap was still growing was
    priced high (docs/simulation.md, "Thirty-first round").  Needs `keep_freed_memory`: where
    glibc returns large blocks to the system on free, the touched block is gone again and this
    only costs time."""
    global _heap_faulted
    nbytes = min(nbytes, _physical_bytes() // HEAP_SHARE)
    if nbytes <= _heap_faulted:
        return
    block = torch.empty(nbytes, dtype=torch.uint8)
    block.fill_(0)
    del block
    _heap_faulted = nbytes


def saved_bytes(call: Callable[[], Any], own: Sequence[torch.Tensor]) -> int:
    """Bytes of memory that one `call` (a forward task) newly allocated and keeps alive until its
    backward pass: the tensors autograd saves for it (`torch.autograd.graph.saved_tensors_hooks`),
    each storage once, less the storages of its results (which the caller counts) and of `own` (its
    inputs and parameters, allocated before it).

    A task's results alone can be far smaller than what the step keeps of it: the transformer's
    cross-entropy over a whole batch returns one number and saves its 8 MiB of log-probabilities.
    `measure_task` keeps its calls' results alive, graphs and all (`_Retained`), and faults in the
    heap they take (`fault_in_heap`); counted by its results alone, that loss kept 13-52 graphs of
    8 MiB uncounted, and every backward call then wrote its 8 MiB gradient onto pages the process had
    never touched: 6.0-10.4 ms a call with the L2 evicted and 8.2-12.6 ms back to back, where its
    steps take 1.2-3 ms and its calls with the last-level cache evicted (fewer of them kept) 1.8 ms
    (docs/simulation.md, "Forty-fourth round")."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call()
    for t in list(own) + _outputs(out):
        storages.pop(t.untyped_storage().data_ptr(), None)
    return sum(storages.values())


class _Retained:
    """The last results of a measured call, kept alive so that each call writes its result to
    memory that has not just been used, as in a step.

    A step keeps every forward output for the backward pass, so each op writes into memory the
    step has not touched lately; a profiler that drops each result gets the same warm block back
    from the allocator every call.  On this machine that made a 2 MiB linear 1.0 ms against
    1.2-1.3 ms in steps, and a GELU 0.24 ms against 0.34-0.42 ms.  Results are kept up to
    `max_bytes` (at least `min_items` of them)."""

    def __init__(self, max_bytes: int = 256 << 20, min_items: int = 4):
        self.max_bytes, self.min_items = max_bytes, min_items
        self._items: list[tuple[list[torch.Tensor], int]] = []   # (the tensors, the bytes they keep)
        self._bytes = 0

    def most_bytes(self, item: int) -> int:
        """The most bytes kept at once, the newest result included, when no result is larger than `item`."""
        return max(self.max_bytes, self.min_items * item) + item

    def add(self, tensors: list[torch.Tensor], also: int = 0) -> None:
        """Keep `tensors`, and with them `also` more bytes that they keep alive (what their autograd
        graph saved for the backward pass, `saved_bytes`)."""
        size = sum(t.numel() * t.element_size() for t in tensors) + also
        self._items.append((tensors, size))
        self._bytes += size
        while len(self._items) > self.min_items and self._bytes > self.max_bytes:
            _, old = self._items.pop(0)
            self._bytes -= old


def _check_counts(repeats: int, warmup: int, rounds: int = 1) -> None:
    if repeats < 1 or warmup < 0 or rounds < 1:
        raise CostModelError(f"profiling needs repeats >= 1, warmup >= 0 and rounds >= 1, got repeats={repeats} "
                             f"warmup={warmup} rounds={rounds}")


def _new_work(graph: OperatorGraph, degree_choices: Iterable[tuple[str, Sequence[int]]] | None, kind: str,
              cache: ProfileCache, report: ProfileReport,
              max_tasks: int | None) -> list[tuple[str, Op, tuple[int, ...]]]:
    """(key, op, degrees) of every distinct task key of `degree_choices` the cache lacks, at most
    `max_tasks` of them; counts the cached keys and those left over in `report`."""
    if degree_choices is None:
        degree_choices = [(op.name, (1,) * len(op.pardims)) for op in graph.ops]
    seen: set[str] = set()
    work: list[tuple[str, Op, tuple[int, ...]]] = []
    for name, degrees in degree_choices:
        op = graph[name]
        if not op.inputs:
            continue
        degrees = tuple(degrees)
        key = task_key(op, degrees, kind, graph_input_shapes(graph, op))
        if key in seen:
            continue
        seen.add(key)
        if key in cache:
            report.cached += 1
        else:
            work.append((key, op, degrees))
    if max_tasks is not None and len(work) > max(0, max_tasks):
        report.remaining = len(work) - max(0, max_tasks)
        work = work[:max(0, max_tasks)]
    return work


def profile_ops(graph: OperatorGraph, degree_choices: Iterable[tuple[str, Sequence[int]]] | None,
                device: torch.device, cache: ProfileCache, *, repeats: int = 10, warmup: int = 3,
                device_kind: str | None = None, forward_task: ForwardTask | None = None,
                module: nn.Module | None = None, budget: float | None = 2.0, max_tasks: int | None = None,
                progress: Callable[[int, int, str], None] | None = None, rounds: int = 1,
                cache_level: str = "l2") -> ProfileReport:
    """Measure every distinct task key of `degree_choices` the cache lacks; store their times.

    `degree_choices` lists (op name, degrees) pairs; None means every op unpartitioned.  Ops
    without inputs (graph inputs, constants) are not measured.  An op whose kernel fails is skipped
    and listed in the report with the error, so one unsupported op does not stop a run.  `budget`
    caps the seconds spent timing one direction of one task (slow tasks get fewer repeats);
    `max_tasks` caps how many new keys are measured (the rest are counted in ``remaining``).
    `rounds` measures every task that many times, one pass over all of them after another, and
    keeps the median of the passes (`ROUNDS`).  `cache_level` is the caches left cold before each
    call (`cache_evictor`).  Everything runs in the calling process (`profile_local` measures in
    concurrent workers).
    """
    _check_counts(repeats, warmup, rounds)
    _check_cache_level(cache_level)
    kind = device_kind or device_kind_of(device)
    report = ProfileReport(kind)
    t0 = time.perf_counter()
    work = _new_work(graph, degree_choices, kind, cache, report, max_tasks)
    overhead = engine_overhead(device) if work else (0.0, 0.0)
    report.engine_overhead = overhead[0]
    passes: list[list[tuple[float, float]]] = [[] for _ in work]
    hot_passes: list[list[tuple[float, float]]] = [[] for _ in work]
    failed: dict[int, str] = {}
    for r in range(rounds):
        for n, (key, op, degrees) in enumerate(work):
            if progress is not None:
                progress(r * len(work) + n, rounds * len(work), op.name)
            if n in failed:
                continue
            try:
                host: list[float] = []
                hot: list[float] = []
                f, b = measure_task(graph, op, degrees, device, repeats=repeats, warmup=warmup,
                                    forward_task=forward_task, module=module, budget=budget,
                                    overhead=overhead, cache_level=cache_level, host=host, hot=hot)
                passes[n].append((f, b, *host) if len(host) == 2 else (f, b))
                if len(hot) == 2:
                    hot_passes[n].append((hot[0], hot[1]))
            except Exception as e:  # an op the kernels cannot run yet; keep going, report it
                failed[n] = f"{type(e).__name__}: {e}"
    _store_passes(work, passes, failed, cache, report, hot_passes)
    if progress is not None:
        progress(rounds * len(work), rounds * len(work), "")
    report.seconds = time.perf_counter() - t0
    return report


def _store_passes(work: list, passes: list[list[tuple[float, ...]]], failed: Mapping[int, str],
                  cache: ProfileCache, report: ProfileReport,
                  hot_passes: Sequence[Sequence[tuple[float, float]]] | None = None) -> None:
    """Store each task's median pass (forward and backward apart, and on a GPU the host's times
    too) in `cache` and `report`; a task that failed in a pass is reported skipped with its error
    instead.  `hot_passes[n]` (where given and not empty) are task n's back-to-back times per
    pass: their medians are stored under its `hot_key`."""
    for n, (key, op, degrees) in enumerate(work):
        if n in failed:
            report.skipped.append((op.name, degrees, failed[n]))
            continue
        fwd = statistics.median(p[0] for p in passes[n])
        bwd = statistics.median(p[1] for p in passes[n])
        with_host = [p for p in passes[n] if len(p) == 4]
        host = ((statistics.median(p[2] for p in with_host), statistics.median(p[3] for p in with_host))
                if with_host else None)
        cache.put(key, fwd, bwd, host=host)
        report.measured.append(ProfileRecord(key, op.name, degrees, fwd, bwd))
        hot = hot_passes[n] if hot_passes is not None else ()
        if hot:
            cache.put(hot_key(key), statistics.median(h[0] for h in hot), statistics.median(h[1] for h in hot))


# -- concurrent workers (profile_local on the CPU) -------------------------------------------------

#: Barriers per task in a concurrent run: before the forward warm-up and timed repetitions, and
#: before the backward ones.  A worker that has fewer (a failed task, no backward pass) waits at
#: the rest anyway, so every worker passes the same barriers.
_LOCKSTEP_PHASES = 4
#: Seconds between the parent's checks that its workers are still alive.
_POLL_SECONDS = 0.5


def lockstep_task(graph: OperatorGraph, module: nn.Module | None, kind: str, item: tuple[str, str, tuple[int, ...]],
                  sync: Callable[[], Any], *, repeats: int, warmup: int, budget: float | None,
                  overhead: tuple[float, float], cache_level: str = "l2",
                  hot: list | None = None) -> tuple[float, float, str | None]:
    """(forward, backward, error) of one task `item` (key, op name, degrees) on this process's CPU,
    measured in lockstep with the other processes that call it with the same item: `sync` (a
    barrier all of them pass) is called exactly `_LOCKSTEP_PHASES` times, whatever happens, so a
    task that fails on one process (skipped with the reason, as `profile_ops` skips it) does not
    leave the others waiting.  The concurrent workers of `profile_local` measure with it, and so
    does a profile taken between a job's training steps (`autopar.trainer.accuracy`).  `hot` (a
    list) receives the task's back-to-back times, as `measure_task`'s."""
    key, name, degrees = item
    waited = 0

    def step() -> None:
        nonlocal waited
        sync()
        waited += 1

    try:
        op = graph[name]
        if task_key(op, degrees, kind, graph_input_shapes(graph, op)) != key:
            raise CostModelError(f"this process's import of {graph.name} gives {name} another task key")
        fwd, bwd = measure_task(graph, op, degrees, torch.device("cpu"), repeats=repeats, warmup=warmup,
                                module=module, budget=budget, overhead=overhead, cache_level=cache_level, sync=step,
                                hot=hot)
        out = (fwd, bwd, None)
    except threading.BrokenBarrierError:
        raise
    except Exception as e:  # as profile_ops: the task is skipped with the reason
        out = (0.0, 0.0, f"{type(e).__name__}: {e}")
    while waited < _LOCKSTEP_PHASES:
        step()
    return out


def profile_items(graph: OperatorGraph, workers: int, kind: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(key, op name, degrees) of every distinct task `profile_local` measures for ``local:<workers>``."""
    from ..ir.strategy import degree_choices
    choices = [(op.name, d) for op in graph.ops for d in degree_choices(op, workers)]
    return [(key, op.name, degrees)
            for key, op, degrees in _new_work(graph, choices, kind, ProfileCache(), ProfileReport(kind), None)]


def store_lockstep_passes(graph: OperatorGraph, items: list[tuple[str, str, tuple[int, ...]]],
                          per_rank: Sequence[Sequence[Sequence[tuple[float, float, str | None]]]],
                          cache: ProfileCache, kind: str) -> ProfileReport:
    """Store what several processes measured of `items` in lockstep (`lockstep_task`), as
    `profile_local` stores its workers' passes: per pass the median over the processes, per task
    the median of its passes.  `per_rank[r][n]` lists process r's (forward, backward, error) of
    item n, one per pass, or (forward, backward, error, hot forward, hot backward) with its
    back-to-back times (`lockstep_task`'s `hot`); a task that failed in a pass is reported skipped."""
    report = ProfileReport(kind)
    _store_lockstep([(key, graph[name], degrees) for key, name, degrees in items], per_rank, cache, report)
    return report


def _store_lockstep(work: list, per_rank: Sequence[Sequence[Sequence[tuple[float, float, str | None]]]],
                    cache: ProfileCache, report: ProfileReport) -> None:
    """`store_lockstep_passes` into an existing `report`, for `work` (key, op, degrees)."""
    passes: list[list[tuple[float, float]]] = [[] for _ in work]
    hot: list[list[tuple[float, float]]] = [[] for _ in work]
    failed: dict[int, str] = {}
    for n in range(len(work)):
        for msgs in zip(*(rank[n] for rank in per_rank)):
            errors = sorted(m[2] for m in msgs if m[2] is not None)
            if errors:
                failed.setdefault(n, errors[0])
                continue
            passes[n].append((statistics.median(m[0] for m in msgs), statistics.median(m[1] for m in msgs)))
            if all(len(m) == 5 for m in msgs):
                hot[n].append((statistics.median(m[3] for m in msgs), statistics.median(m[4] for m in msgs)))
        if not passes[n] and n not in failed:
            failed[n] = "never measured"
    _store_passes(work, passes, failed, cache, report, hot)


def _profile_worker(rank: int, model: str, options: dict[str, object], kind: str,
                    items: list[tuple[str, str, tuple[int, ...]]], repeats: int, warmup: int,
                    budget: float | None, barrier: Any, results: Any, cache_level: str = "l2") -> None:
    """One worker process of a concurrent `profile_local`: import `model` itself and measure
    `items` (key, op name, degrees) in lockstep with the other workers, one thread, on the CPU.

    Sends ``(tag, task index, rank, forward, backward, error, *hot)`` tuples to `results`: one
    ``"overhead"`` (index -1, the engine overhead in `forward`), one ``"task"`` per item (``hot``:
    its back-to-back forward and backward, where measured), or a ``"fatal"`` one when it cannot
    go on.
    """
    from ..ir.fx_import import import_spec
    from ..zoo import load_model

    cpu = torch.device("cpu")
    try:
        keep_freed_memory()     # as the trainer's ranks: freed blocks are reused, never faulted in again
        use_huge_pages()
        torch.set_num_threads(1)
        bind_to_own_cores(rank, barrier.parties)    # as the trainer's gloo ranks (`trainer.launch.init_rank`)
        spec = load_model(model, **options)
        graph = import_spec(spec)
        module = spec.module
        barrier.wait()
        overhead = engine_overhead(cpu)
        results.put(("overhead", -1, rank, overhead[0], overhead[1], None))
        for n, item in enumerate(items):
            hot: list[float] = []
            fwd, bwd, error = lockstep_task(graph, module, kind, item, barrier.wait, repeats=repeats, warmup=warmup,
                                            budget=budget, overhead=overhead, cache_level=cache_level, hot=hot)
            results.put(("task", n, rank, fwd, bwd, error, *hot))
    except threading.BrokenBarrierError:  # the parent gave up on the run and aborted the barrier
        return
    except BaseException as e:
        results.put(("fatal", -1, rank, 0.0, 0.0, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1)


def _profile_concurrent(model: str, options: Mapping[str, object], graph: OperatorGraph,
                        choices: list[tuple[str, tuple[int, ...]]], cache: ProfileCache, kind: str, workers: int, *,
                        repeats: int, warmup: int, budget: float | None, max_tasks: int | None,
                        progress: Callable[[int, int, str], None] | None, rounds: int = 1,
                        cache_level: str = "l2") -> ProfileReport:
    """`profile_ops` for `profile_local` on the CPU, measured by `workers` processes at once (module doc).

    The parent finds the new keys on its own import of the model, starts the workers from a fork
    server, reports progress, stores each key's median over the workers' means, and stops the
    workers (raising `CostModelError`) if one of them dies.
    """
    report = ProfileReport(kind)
    t0 = time.perf_counter()
    work = _new_work(graph, choices, kind, cache, report, max_tasks)
    if not work:
        if progress is not None:
            progress(0, 0, "")
        report.seconds = time.perf_counter() - t0
        return report
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    # The fork server imports torch once and forks every worker with it loaded.  This only takes
    # effect if this process's fork server is not running yet (it may already be, from a launch).
    ctx.set_forkserver_preload(["torch"])
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    items = [(key, op.name, degrees) for key, op, degrees in work] * rounds   # `rounds` passes, one after another
    procs = [ctx.Process(target=_profile_worker, name=f"autopar-profile{r}", daemon=True,
                         args=(r, model, dict(options), kind, items, repeats, warmup, budget, barrier, results,
                               cache_level))
             for r in range(workers)]
    inbox: dict[tuple[str, int], list[tuple]] = {}

    def failure(detail: str) -> CostModelError:
        return CostModelError(f"profiling {model} in {workers} concurrent workers failed: {detail}")

    def collect(tag: str, n: int) -> list[tuple]:
        """Every worker's message `tag` for task `n`."""
        while len(inbox.get((tag, n), ())) < workers:
            try:
                msg = results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise failure(", ".join(f"worker {r} exited with code {c}" for r, c in dead))
                continue
            if msg[0] == "fatal":
                raise failure(f"worker {msg[2]}: {msg[5]}")
            inbox.setdefault((msg[0], msg[1]), []).append(msg)
        return inbox.pop((tag, n))

    try:
        for p in procs:
            p.start()
        fixed = [m[3] for m in collect("overhead", -1)]
        report.engine_overhead = statistics.median(fixed)
        per_rank: list[list[list[tuple]]] = [[[] for _ in work] for _ in procs]
        for i in range(len(items)):
            n = i % len(work)
            if progress is not None:
                progress(i, len(items), work[n][1].name)
            for m in collect("task", i):
                per_rank[m[2]][n].append((m[3], m[4], m[5], *m[6:]))
        _store_lockstep(work, per_rank, cache, report)
        for p in procs:
            p.join()
    finally:
        if any(p.exitcode is None for p in procs if p.pid is not None):
            barrier.abort()  # workers waiting at a barrier return
            for p in procs:
                if p.pid is not None:
                    p.join(5)
                    if p.exitcode is None:
                        p.kill()
                        p.join()
        results.close()
    if progress is not None:
        progress(len(items), len(items), "")
    report.seconds = time.perf_counter() - t0
    return report


def profile_local(models: Sequence[str], *, workers: int = 2, options: Mapping[str, object] | None = None,
                  cache: ProfileCache | None = None, repeats: int = 10, warmup: int = 3, budget: float | None = 2.0,
                  max_tasks: int | None = None, device: torch.device | None = None,
                  progress: Callable[[str, int, int, str], None] | None = None,
                  concurrent: bool | None = None, rounds: int = ROUNDS, cache_level: str = "l2",
                  cold_keys: bool = False) -> ProfileReport:
    """`autopar profile`: measure what a plan for the ``local:<workers>`` preset can use.

    For every model (a zoo name or ``package.module:factory``, built with `options` — use the
    options the plan will use, e.g. the same ``batch``, or the keys will not match) every op is
    measured under every degree vector with at most `workers` tasks
    (`planner.ir.strategy.degree_choices`), each distinct task key once.  On the CPU (the default
    `device`) torch runs one thread (a `local` worker's share) and times are stored under the
    preset's device product and the number of its workers (`kind_of`: ``local:1`` and ``local:2``
    keep apart what they measure); on a CUDA `device` under its product (`device_kind_of`).

    `concurrent` (default: on the CPU with more than one worker) measures in `workers` processes
    at once, in lockstep, and stores the median over them (module doc); each imports the model
    by name, so a ``package.module:factory`` model must be importable from a fresh interpreter
    with this process's ``sys.path``.  ``concurrent=False`` measures in this process.  The cache
    (default: `ProfileCache.load()` of the default path) is saved after each model, so an
    interrupted run keeps what it measured.  `max_tasks` caps the new keys measured over all
    models.  `progress(model, i, n, op)` is called per task and pass, in this process.  Every task
    is measured in `rounds` passes over all of them, and the median of the passes is kept
    (`ROUNDS`).  `cache_level` is the caches left cold before each timed call (`cache_evictor`):
    the default ``"l2"`` is what the cost model is built on.  ``"llc"`` with `cold_keys` stores the
    times under `cold_kind` products beside the ordinary ones, where `CostModel.cold_cost` finds
    them (`planner.sim.reuse` prices a step's tasks between the two; `autopar profile` measures
    both on the CPU); ``"llc"`` without it stores them under the ordinary products, for a cache of
    their own (the accuracy benchmark's diagnosis).
    """
    from ..hardware.presets import get_preset
    from ..ir.fx_import import import_spec
    from ..ir.strategy import degree_choices
    from ..zoo import load_model

    _check_counts(repeats, warmup, rounds)
    _check_cache_level(cache_level)
    device = device if device is not None else torch.device("cpu")
    if concurrent is None:
        concurrent = device.type == "cpu" and workers > 1
    elif concurrent and device.type != "cpu":
        raise CostModelError(f"concurrent profiling runs CPU worker processes; measure {device} with concurrent=False")
    kind = kind_of(get_preset(f"local:{workers}").devices[0]) if device.type == "cpu" else device_kind_of(device)
    if cold_keys:
        if cache_level != "llc":
            raise CostModelError(f"cold_keys stores times measured with the last-level cache evicted; "
                                 f"pass cache_level='llc', not {cache_level!r}")
        kind = cold_kind(kind)
    cache = cache if cache is not None else ProfileCache.load()
    total = ProfileReport(kind)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
        if not concurrent:
            keep_freed_memory()  # measured in this process: in the memory regime of the trainer's ranks
            use_huge_pages()
    try:
        for name in models:
            spec = load_model(name, **dict(options or {}))
            graph = import_spec(spec)
            choices = [(op.name, d) for op in graph.ops for d in degree_choices(op, workers)]
            step = None if progress is None else (lambda i, n, op, _m=name: progress(_m, i, n, op))
            left = None if max_tasks is None else max(0, max_tasks - len(total.measured) - len(total.skipped))
            if concurrent:
                report = _profile_concurrent(name, options or {}, graph, choices, cache, kind, workers,
                                             repeats=repeats, warmup=warmup, budget=budget, max_tasks=left,
                                             progress=step, rounds=rounds, cache_level=cache_level)
            else:
                report = profile_ops(graph, choices, device, cache, repeats=repeats, warmup=warmup, device_kind=kind,
                                     module=spec.module.to(device), budget=budget, max_tasks=left, progress=step,
                                     rounds=rounds, cache_level=cache_level)
            total = total.merge(report)
            cache.save()
    finally:
        torch.set_num_threads(threads)
    return total
