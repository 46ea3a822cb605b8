"""The profile cache: measured forward/backward times of op tasks, persisted as JSON.

FlexFlow (sec. 5.1, assumption A1) estimates a task's execution time by running it a few times
on the device and caching the result: "all future tasks with the same operation type and output
size will use the cached value without rerunning the task".  OptCNN (sec. 5.1) measures each
layer under each configuration the same way.  This module is that cache: a key names what
decides a task's time — the device product, the op kind, the shard shapes of the task's inputs,
outputs and parameters, the dtype and the op's attributes — and maps it to two times in
seconds (forward and backward, each the mean of its timed calls).  `autopar profile`
(`planner.cost.profiler`) fills it; `planner.cost.CostModel` reads it and falls back to its
roofline model for keys it does not hold.

Shard shapes come from one *representative task* of the partition grid: the task at coordinate
``d // 2`` along every dimension.  Partitions are equal, so all tasks have the same output and
parameter shards; they differ only in the halo a sliding window adds to their input (a task at
the edge of the image has padding instead of a halo on one side).  The middle task is an
interior one, so its input carries the full halo — the slowest task, which is the one the
critical path waits for.  For an unpartitioned op it is task 0.

File format (``version`` 1)::

    {"version": 1, "entries": {"<key>": {"forward": 1.2e-4, "backward": 2.5e-4}, ...}}

On a GPU an entry also has ``"host": [forward, backward]``: the seconds the host spends issuing
the task's kernels, beside the kernels' own time on the device (the two run side by side, see
`planner.sim.trainer_model`).  CPU entries have none: there the host runs the kernels itself.
On the CPU a task has up to three entries, under three products: ``CPU-core`` (every call after
the core's L2 cache was evicted), ``CPU-core (back to back)`` (the calls made right after those,
with nothing evicted in between: `hot_kind`) and ``CPU-core (last level cold)`` (every call after
the last-level cache was evicted: `cold_kind`); `planner.sim.reuse` prices a step's tasks between
them.  Those are one worker's; times measured with N workers side by side on the host (``local:N``)
are kept under ``CPU-core (N per host)`` and its back-to-back and cold variants (`host_kind`,
`kind_of`), since a second worker slows the first one's ops.

Beside the op times, ``"overheads"`` holds the runtime's own work per task measured in a model's
own steps (`trainer.calibrate.model_overheads`), by ``"<calibration key>|<graph fingerprint>"``:
``{"forward": s, "backward": s, "steps": n, "exchange": [s, s], "allreduce_in_step": r}``,
seconds per forward and per backward task between the runtime's spans and, where measured, per
exchange call that moves nothing between ranks, forward and backward, and what the gradient
buckets' all-reduces added to the model's own data-parallel step over what the calibration's
all-reduce says for them (a ratio).  The simulator charges them for that model in place of the
calibration's chains and all-reduce (`planner.sim.trainer_model.trainer_calibration`); older files
have none, or no ``exchange`` or ``allreduce_in_step``.

The default location is ``$AUTOPAR_CACHE_DIR/profile.json`` or
``~/.cache/autopar/profile.json``.  Saving writes a temporary file next to the target and renames
it over the target (``os.replace``), so a reader never sees a half-written cache.  Two profile
runs saving at the same moment do not merge: the last rename wins.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import CostModelError
from ..fileio import atomic_write
from .calibration import CALIBRATION_METHOD, RuntimeCalibration, calibration_key
from ..hardware.catalog import LOCAL_CPU
from ..hardware.topology import Device
from ..ir.graph import Op
from ..ir.regions import Range

CACHE_ENV = "AUTOPAR_CACHE_DIR"
CACHE_FILE = "profile.json"
FORMAT_VERSION = 1
#: How the measurements were taken.  A file written by an autopar that measured another way keeps
#: its format but not its numbers: `ProfileCache.load` drops them (and says so in `notice`), and
#: they are measured again.  2: ops profiled with the model's own parameter values in workers that
#: keep freed memory; the optimizer timed in the trainer's steps; message latency measured in steps.
#: 3: an op's time is the mean of its timed calls, no longer their median (`profiler._timed_seconds`).
#: 4: on the CPU, other ops' code runs before every call, as in a step (`profiler._Interloper`).
#: 5: the concurrent CPU workers bound to their own cores, as the trainer's gloo ranks
#: (`profiler.bind_to_own_cores`).
#: 6: on the CPU, each timed call is followed by calls back to back, stored apart (`hot_kind`).
#: 7: CPU op times keyed by how many workers measured side by side on the host (`host_kind`); before
#: that a ``local:1`` and a ``local:2`` profile shared their keys.
#: 8: on the CPU, the memory a measured call's autograd graph saves for its backward pass counts in
#: what the profiler keeps alive and faults in beforehand (`profiler.saved_bytes`, `HEAP_SPREAD`); before
#: that a loss over a whole batch paid the kernel's first touch of fresh pages in its timed calls.
MEASUREMENT_METHOD = 8

Shape = tuple[int, ...]

#: Attributes that never change what a task computes (bookkeeping the importer may attach).  The
#: ``module`` path does for an ``opaque`` op (it names the submodule the task calls), so it is kept there.
_IGNORED_ATTRS = frozenset({"source", "module", "module_path", "qualname", "name", "target", "param_names"})


def default_cache_path() -> Path:
    """``$AUTOPAR_CACHE_DIR/profile.json``, else ``~/.cache/autopar/profile.json``."""
    base = os.environ.get(CACHE_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "autopar"
    return root / CACHE_FILE


# -- task shapes --------------------------------------------------------------------------------

def representative_coord(degrees: Sequence[int]) -> tuple[int, ...]:
    """The grid coordinate of the task whose costs stand for all tasks of the op (see module doc)."""
    return tuple(d // 2 for d in degrees)


def representative_ranges(op: Op, degrees: Sequence[int]) -> dict[str, Range]:
    if len(degrees) != len(op.pardims):
        dims = ", ".join(p.name for p in op.pardims) or "none"
        raise CostModelError(f"{op.describe()}: {len(degrees)} degrees {tuple(degrees)} given but it has "
                             f"{len(op.pardims)} parallel dims ({dims})")
    try:
        return op.task_ranges(degrees, representative_coord(degrees))
    except ValueError as e:
        raise CostModelError(f"{op.describe()}: degrees {tuple(degrees)} do not split its dims "
                             f"{[(p.name, p.size) for p in op.pardims]} into equal parts: {e}") from e


def _shape(box) -> Shape:
    return tuple(hi - lo for lo, hi in box)


def task_shapes(op: Op, degrees: Sequence[int], input_shapes: Sequence[Sequence[int]],
                ranges: Mapping[str, Range] | None = None) -> tuple[tuple[Shape, ...], tuple[Shape, ...], tuple[Shape, ...]]:
    """(input shard shapes, output shard shapes, parameter shard shapes) of the representative task.

    Parameter shards are shapes of the parameter's `view` (the shape partitioning works on).
    """
    if len(input_shapes) != len(op.inputs):
        raise CostModelError(f"{op.describe()}: {len(input_shapes)} input shapes given for its "
                             f"{len(op.inputs)} inputs; pass graph_input_shapes(graph, op)")
    if ranges is None:
        ranges = representative_ranges(op, degrees)
    ins = tuple(_shape(op.input_box(i, ranges, s)) for i, s in enumerate(input_shapes))
    outs = tuple(_shape(op.output_box(k, ranges)) for k in range(len(op.outputs)))
    params = tuple(_shape(op.param_box(j, ranges)) for j in range(len(op.params)))
    return ins, outs, params


def op_dtype(op: Op) -> str:
    return op.outputs[0].dtype if op.outputs else "float32"


def _fmt_shapes(shapes: Sequence[Shape]) -> str:
    return ",".join("x".join(map(str, s)) if s else "s" for s in shapes)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable(v: Any) -> Any:
    """A JSON-able form of an attribute value that is the same in every process.

    Functions and methods become their qualified names and objects their type plus a repr with
    memory addresses removed, so a key written by `autopar profile` is found by a later planner.
    """
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Enum):
        return _stable(v.value)
    if isinstance(v, (list, tuple)):
        return [_stable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _stable(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {type(v).__name__: {f.name: _stable(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', None) or ''}.{v.__qualname__}"
    extra = getattr(v, "extra_repr", None)  # torch.nn.Module: its configuration, not its weights
    if callable(extra):
        return f"{type(v).__name__}({extra()})"
    return f"{type(v).__name__}:{_ADDRESS.sub('', repr(v))}"


def attrs_text(op: Op) -> str:
    """The part of a task key that comes from the op's attributes (the same for all its tasks)."""
    return _attrs_text(op)


def _attrs_text(op: Op) -> str:
    kept = {k: _stable(v) for k, v in op.attrs if k not in _IGNORED_ATTRS or (k == "module" and op.kind == "opaque")}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")) if kept else ""


#: What the device product of a key gets for op times measured with the last-level cache evicted
#: before every call (`planner.cost.profile_local(..., cache_level="llc", cold_keys=True)`), kept
#: beside the ordinary ones in the same cache (`CostModel.cold_cost`).
COLD_SUFFIX = " (last level cold)"


def cold_kind(device_kind: str) -> str:
    """The device product under which a cache keeps `device_kind`'s op times measured cold."""
    return device_kind if device_kind.endswith(COLD_SUFFIX) else device_kind + COLD_SUFFIX


#: What the device product of a key gets for op times measured back to back: the calls that follow
#: a timed call on the CPU with nothing evicted in between (`planner.cost.measure_task`), kept beside
#: the ordinary ones in the same cache (`CostModel.hot_cost`).
HOT_SUFFIX = " (back to back)"


def hot_kind(device_kind: str) -> str:
    """The device product under which a cache keeps `device_kind`'s op times measured back to back."""
    return device_kind if device_kind.endswith(HOT_SUFFIX) else device_kind + HOT_SUFFIX


def hot_key(key: str) -> str:
    """The key under which a cache keeps the back-to-back times of the task whose key is `key`."""
    kind, rest = key.split("|", 1)
    return f"{hot_kind(kind)}|{rest}"


def host_kind(product: str, workers: int) -> str:
    """The device product under which a cache keeps the op times of a CPU `product` measured with
    `workers` worker processes side by side on one host: the product alone for one worker,
    ``"CPU-core (2 per host)"`` for two.  Workers side by side share the host's last-level cache and
    memory bandwidth (and, on a virtual machine, whatever its cores share on the host under it), so
    their ops run slower than one worker's: 1.4x in sum over rnnlm's tasks on the 2-core machine of
    docs/simulation.md's thirty-fifth round.  A ``local:1`` profile must not price a ``local:2`` plan."""
    return product if workers <= 1 else f"{product} ({workers} per host)"


def kind_of(device: Device) -> str:
    """The device product under which a cache keeps `device`'s op times: `host_kind` of a CPU
    device's product and `Device.host_workers`, a GPU's product."""
    return host_kind(device.product, device.host_workers) if device.is_cpu else device.product


def task_key(op: Op, degrees: Sequence[int], device_kind: str, input_shapes: Sequence[Sequence[int]]) -> str:
    """The cache key of one task of `op` split by `degrees`, on a device of product `device_kind`.

    Two tasks share a key exactly when they run the same computation on the same sizes: same
    device product, op kind, dtype, input/output/parameter shard shapes and attributes (stride,
    padding, softmax axis, …).  Op names, degrees and positions in the graph are not part of it, so
    the many identical blocks of a ResNet or the unrolled steps of an RNN share one measurement.
    """
    return key_of_shapes(op, device_kind, task_shapes(op, degrees, input_shapes))


def key_of_shapes(op: Op, device_kind: str, shapes: tuple[tuple[Shape, ...], ...], attrs_text: str | None = None) -> str:
    """`task_key` from shard shapes already computed (and the op's `attrs_text`, if known)."""
    ins, outs, params = shapes
    attrs = attrs_text if attrs_text is not None else _attrs_text(op)
    return (f"{device_kind}|{op.kind}|{op_dtype(op)}|in={_fmt_shapes(ins)}|out={_fmt_shapes(outs)}"
            f"|par={_fmt_shapes(params)}|{attrs}")


# -- the cache file ------------------------------------------------------------------------------

class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore")
    forward: float = Field(ge=0, allow_inf_nan=False)
    backward: float = Field(ge=0, allow_inf_nan=False)
    host: tuple[float, float] | None = None     # GPUs: the host's seconds issuing the kernels


class _Overheads(BaseModel):
    model_config = ConfigDict(extra="ignore")
    forward: float = Field(ge=0, allow_inf_nan=False)
    backward: float = Field(ge=0, allow_inf_nan=False)
    steps: int = Field(default=0, ge=0)
    exchange: tuple[float, float] | None = None
    allreduce_in_step: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class _CacheFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: int
    entries: dict[str, _Entry]
    # Runtime calibrations (`planner.cost.calibration`) by "product|backend|world"; older files
    # have none, and older autopars ignore them.
    calibrations: dict[str, dict[str, Any]] = {}
    # `MEASUREMENT_METHOD` of the numbers; files from before it existed are method 1.
    method: int = 1
    # The runtime's work per task in a model's own steps, by "<calibration key>|<graph fingerprint>".
    overheads: dict[str, _Overheads] = {}


#: The first `MEASUREMENT_METHOD` whose CPU keys say how many workers measured side by side.
_HOST_KEYED = 7


def _rekeyed(key: str, workers: int) -> str:
    """`key` of an older file's CPU entry, measured by `workers` workers side by side (`host_kind`)."""
    kind, rest = key.split("|", 1)
    product = LOCAL_CPU.product
    if kind != product and not kind.startswith(product + " ("):
        return key
    return f"{host_kind(product, workers)}{kind[len(product):]}|{rest}"


def _overheads_key(calibration_key: str, fingerprint: str) -> str:
    return f"{calibration_key}|fp={fingerprint}"


def _stale_calibration(doc: Any) -> bool:
    """Whether a stored measured calibration was measured the way an older autopar measured it
    (`CALIBRATION_METHOD`), or, for ranks that exchange messages, before its staging curves were
    (`RuntimeCalibration.staging`): the simulator would miss or misjudge those costs."""
    if not isinstance(doc, dict) or doc.get("source", "measured") != "measured":
        return False
    try:
        method = int(doc.get("method", 1))
    except (TypeError, ValueError):
        return False                  # `RuntimeCalibration.from_json` names the bad field
    return method < CALIBRATION_METHOD or (int(doc.get("world", 1) or 1) >= 2 and not doc.get("staging"))


class ProfileCache:
    """Measured (forward, backward) seconds per task key; see the module docstring."""

    def __init__(self, entries: Mapping[str, tuple[float, float]] | None = None, path: str | os.PathLike | None = None,
                 calibrations: Mapping[str, Any] | None = None):
        self._entries: dict[str, tuple[float, float]] = {}
        self._host: dict[str, tuple[float, float]] = {}
        self._calibrations: dict[str, Any] = {}
        self._overheads: dict[str, tuple[float, float, int]] = {}
        self._exchanges: dict[str, tuple[float, float]] = {}
        self._in_step: dict[str, float] = {}
        self.path = Path(path) if path is not None else None
        #: set by `load` when it dropped measurements taken the old way: one line for people
        self.notice: str | None = None
        for k, (f, b) in (entries or {}).items():
            self.put(k, f, b)
        for c in (calibrations or {}).values():
            self.put_calibration(c if isinstance(c, RuntimeCalibration) else RuntimeCalibration.from_json(c))

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, keep_stale: bool = False,
             host_workers: int | None = None) -> "ProfileCache":
        """Read a cache file; a missing file gives an empty cache that will save to `path`.
        `keep_stale`: keep what an older autopar measured another way too (`MEASUREMENT_METHOD`,
        `CALIBRATION_METHOD`), as it was measured: to replay a kept run (`trainer.rescore`), never to plan.
        `host_workers`, with `keep_stale`: how many workers measured side by side the CPU op times of a
        file older than method 7, which keyed them by the product alone; they are keyed as such
        (`host_kind`).  Without it they keep their keys, which now say one worker."""
        p = Path(path).expanduser() if path is not None else default_cache_path()
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path=p)
        except OSError as e:
            raise CostModelError(f"profile cache {p} cannot be read ({e.strerror}); fix its permissions, "
                                 f"delete it, or point {CACHE_ENV} at another directory") from e
        try:
            doc = _CacheFile.model_validate_json(text)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "top level"
            raise CostModelError(f"profile cache {p} is corrupt ({where}: {first['msg']}); delete it or "
                                 "re-run `autopar profile` to rebuild it") from e
        if doc.version != FORMAT_VERSION:
            raise CostModelError(f"profile cache {p} has format version {doc.version}, this autopar reads "
                                 f"version {FORMAT_VERSION}; delete it or re-run `autopar profile` to rebuild it")
        if doc.method < MEASUREMENT_METHOD and not keep_stale:
            cache = cls(path=p)
            cache.notice = (f"profile cache {p} holds {len(doc.entries)} op times and {len(doc.calibrations)} runtime "
                            f"calibration(s) measured the way an older autopar measured them (method {doc.method}, "
                            f"now {MEASUREMENT_METHOD}); they are measured again")
            return cache
        stale = [] if keep_stale else sorted(k for k, c in doc.calibrations.items() if _stale_calibration(c))
        if doc.method < _HOST_KEYED and host_workers is not None:
            doc.entries = {_rekeyed(k, host_workers): v for k, v in doc.entries.items()}
        try:
            cache = cls({k: (v.forward, v.backward) for k, v in doc.entries.items()}, path=p,
                        calibrations={k: c for k, c in doc.calibrations.items() if k not in stale})
            for k, v in doc.entries.items():
                if v.host is not None:
                    cache.put(k, v.forward, v.backward, host=v.host)
            for k, o in doc.overheads.items():
                if k.split("|fp=", 1)[0] not in stale:      # measured with a calibration measured again
                    cache._overheads[k] = (o.forward, o.backward, o.steps)
                    if o.exchange is not None:
                        cache._exchanges[k] = cache._checked_exchange(k, o.exchange)
                    if o.allreduce_in_step is not None:
                        cache._in_step[k] = o.allreduce_in_step
        except CostModelError as e:
            raise CostModelError(f"profile cache {p}: {e}") from e
        if stale:
            cache.notice = (f"profile cache {p}: runtime calibration(s) {', '.join(stale)} were measured the way an "
                            "older autopar measured them; they are measured again (the op times are kept)")
        return cache

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the cache atomically (temporary file in the same directory, then ``os.replace``)."""
        p = Path(path).expanduser() if path is not None else (self.path or default_cache_path())
        doc: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "method": MEASUREMENT_METHOD,
            "entries": {k: {"forward": f, "backward": b, **({"host": list(self._host[k])} if k in self._host else {})}
                        for k, (f, b) in sorted(self._entries.items())},
            "calibrations": {k: c.to_json() for k, c in sorted(self._calibrations.items())},
        }
        if self._overheads:
            doc["overheads"] = {k: {"forward": f, "backward": b, "steps": n,
                                    **({"exchange": list(self._exchanges[k])} if k in self._exchanges else {}),
                                    **({"allreduce_in_step": self._in_step[k]} if k in self._in_step else {})}
                                for k, (f, b, n) in sorted(self._overheads.items())}
        def dump(fh) -> None:
            json.dump(doc, fh, indent=1)
            fh.write("\n")

        atomic_write(p, dump)
        self.path = p
        return p

    def get(self, key: str) -> tuple[float, float] | None:
        return self._entries.get(key)

    def host(self, key: str) -> tuple[float, float] | None:
        """The host's (forward, backward) seconds issuing the task's kernels, where measured (GPUs)."""
        return self._host.get(key)

    def put(self, key: str, forward: float, backward: float, host: Sequence[float] | None = None) -> None:
        """Store a task's times; `host` (GPUs) the host's seconds issuing its forward and backward."""
        times = [float(forward), float(backward)] + ([float(h) for h in host] if host is not None else [])
        if not all(math.isfinite(t) and t >= 0 for t in times) or (host is not None and len(times) != 4):
            raise CostModelError(f"profile entry {key}: times must be finite and non-negative, "
                                 f"got forward {forward} s and backward {backward} s"
                                 + (f" and host {list(host)}" if host is not None else ""))
        self._entries[key] = (times[0], times[1])
        if host is not None:
            self._host[key] = (times[2], times[3])
        else:
            self._host.pop(key, None)

    def calibration(self, product: str, backend: str, world: int) -> RuntimeCalibration | None:
        """The measured runtime calibration of (device product, backend, world size), if any."""
        return self._calibrations.get(calibration_key(product, backend, world))

    def put_calibration(self, calibration: RuntimeCalibration) -> None:
        self._calibrations[calibration.key] = calibration

    def calibrations(self) -> list[RuntimeCalibration]:
        return [self._calibrations[k] for k in sorted(self._calibrations)]

    def put_runtime_of(self, other: "ProfileCache", keep_own: bool = False) -> None:
        """Take `other`'s runtime calibrations and models' overheads (`overheads`), for a cache of
        op times measured apart from them (another moment's profile of the same machine);
        `keep_own`: those this cache already holds of the same ranks and model stay (a kept run's
        calibration and overheads timed between its steps, `trainer.rescore`)."""
        for c in other.calibrations():
            if not (keep_own and c.key in self._calibrations):
                self.put_calibration(c)
        for k in other._overheads:
            if keep_own and k in self._overheads:
                continue
            self._overheads[k] = other._overheads[k]
            for mine, theirs in ((self._exchanges, other._exchanges), (self._in_step, other._in_step)):
                mine.pop(k, None)
                if k in theirs:
                    mine[k] = theirs[k]

    def overheads(self, calibration: RuntimeCalibration, fingerprint: str) -> tuple[float, float, int] | None:
        """(seconds per forward task, per backward task, steps timed) of the runtime's own work
        between its spans in the steps of the model whose graph has `fingerprint`, on the ranks
        `calibration` describes (`trainer.calibrate.model_overheads`), if measured."""
        return self._overheads.get(_overheads_key(calibration.key, fingerprint))

    def exchange_overheads(self, calibration: RuntimeCalibration, fingerprint: str) -> tuple[float, float] | None:
        """(seconds per forward, per backward exchange call that moves nothing between ranks) in
        the steps of the model whose graph has `fingerprint` (`trainer.calibrate.model_overheads`),
        if measured with its overheads."""
        return self._exchanges.get(_overheads_key(calibration.key, fingerprint))

    def allreduce_in_step(self, calibration: RuntimeCalibration, fingerprint: str) -> float | None:
        """What the gradient buckets' all-reduces added to the data-parallel step of the model whose
        graph has `fingerprint`, over what `calibration`'s all-reduce says for them
        (`trainer.calibrate.model_overheads`), if measured with its overheads."""
        return self._in_step.get(_overheads_key(calibration.key, fingerprint))

    def put_overheads(self, calibration: RuntimeCalibration, fingerprint: str, forward: float, backward: float,
                      steps: int, exchange: tuple[float, float] | None = None,
                      allreduce_in_step: float | None = None) -> None:
        if not all(math.isfinite(t) and t >= 0 for t in (forward, backward)) or steps < 1:
            raise CostModelError(f"runtime overheads of {fingerprint}: seconds per task must be finite and "
                                 f"non-negative over at least one step, got forward {forward} s, backward "
                                 f"{backward} s, {steps} steps")
        if allreduce_in_step is not None and not (math.isfinite(allreduce_in_step) and allreduce_in_step >= 0):
            raise CostModelError(f"runtime overheads of {fingerprint}: what the all-reduces add to a step must be "
                                 f"a finite, non-negative ratio, got {allreduce_in_step!r}")
        key = _overheads_key(calibration.key, fingerprint)
        checked = None if exchange is None else self._checked_exchange(fingerprint, exchange)
        self._overheads[key] = (float(forward), float(backward), int(steps))
        if checked is None:
            self._exchanges.pop(key, None)
        else:
            self._exchanges[key] = checked
        if allreduce_in_step is None:
            self._in_step.pop(key, None)
        else:
            self._in_step[key] = float(allreduce_in_step)

    @staticmethod
    def _checked_exchange(what: str, exchange: Any) -> tuple[float, float]:
        try:
            fwd, bwd = (float(t) for t in exchange)
        except (TypeError, ValueError):
            fwd = bwd = math.nan
        if not all(math.isfinite(t) and t >= 0 for t in (fwd, bwd)):
            raise CostModelError(f"runtime overheads of {what}: an exchange call's seconds must be two finite, "
                                 f"non-negative numbers (forward, backward), got {exchange!r}")
        return fwd, bwd

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def items(self) -> Iterator[tuple[str, tuple[float, float]]]:
        return iter(self._entries.items())

    def __repr__(self) -> str:
        return f"ProfileCache({len(self._entries)} entries, path={str(self.path) if self.path else None})"
