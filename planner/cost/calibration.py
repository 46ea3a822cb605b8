"""What autopar's trainer costs beyond its ops' kernels, measured on the machine it runs on.

The best simulators of distributed training (Lumos, DistSim, Proteus, DistIR calibrated) get
their accuracy from measuring what a per-op profile cannot see: the framework's overhead around
each op, communication as the library really performs it, and the optimizer step.  A
`RuntimeCalibration` holds those numbers for one device product, communication backend and world
size; `autopar profile` measures it (`autopar.trainer.calibrate`) and the profile cache
keeps it beside the op times.  The simulator reads it when it models the trainer's execution
(`planner.sim.trainer_model`).

* **Overheads** — seconds the runtime spends per forward task and per backward task beyond the
  kernel (slicing inputs, building outputs, autograd bookkeeping), and per exchange of an op's
  inputs or gradients (a ``batch_isend_irecv`` round).  Measured as intercepts: the runtime's
  own step on a chain of tiny ops, divided by the ops (DistIR's per-op constant overhead).
* **Point to point** — seconds for one message of n bytes from one rank to another, end to end,
  `Curve`-interpolated between sizes measured at powers of two.
* **One-way messages** (``p2p_oneway``) — seconds for a message of n bytes between two ranks
  whose exchange sends nothing back between them, from the moment its sender sends it to the
  moment its receiver has it, measured inside steps (the median per size:
  `autopar.trainer.calibrate`, stage 6).  On gloo ranks, which post their receives ahead, such a
  message leaves as soon as its sender reaches the exchange, and it is cheap: a transformer's
  one-way 256 KiB messages took 0.24 ms in its steps.  An exchange in which two
  ranks send to each other stalls often (for 2-3 ms, a third to a half of the time on this
  machine), so ``p2p`` is measured on such exchanges and ``p2p_oneway`` apart; None where it was
  not measured (every message then costs ``p2p``).
* **Sending one way** (``send_call``) -- seconds a rank's own call takes to send a message of n
  bytes in an exchange in which it receives nothing (gloo's ``isend`` and the call around it),
  measured on the same one-way chain as the sender's call (the median per size).  The message
  leaves during that call, so its latency holds it; the sender's program pays it too, before it
  goes on (on a 2-vCPU AMD VM 60-70 us up to 32 KiB and 0.55 ms at 2 MiB, 2026-11-29).  None where
  it was not measured.
* **Wire** (``wire``) — the part of that time the bytes hold the link: the median of a message
  between ranks that wait for it, less an empty message's.  The rest of the end-to-end time is
  waiting (a thread waking for a busy core, a tail that grows with the message inside steps), which
  the messages of one exchange do side by side; only their wire time queues one after another.
  On this machine 256 KiB hold the link for 0.03 ms and take 1.1 ms end to end inside steps.
* **All-reduce** — seconds for an all-reduce of n bytes among r ranks, one curve per group size.
* **Optimizer** — seconds of one ``optimizer.step()`` per parameter tensor and per parameter
  byte, for each optimizer (the trainer's ``torch.optim`` with its default foreach kernels).
* **Messages of one exchange** (``message_serial_s``) — what each message of an exchange between
  a pair of ranks adds beyond the first each way: an exchange of k messages costs about ``(k - 2)
  * message_serial_s`` more than one message each way (the trainer sends a pair's messages of
  one exchange as one buffer, so on its calibration this is their bytes and packing).  The simulator queues every message of an
  exchange on one virtual resource per (op, rank pair) for this long, after a latency of its own.
* **Staging** (``staging``) — seconds a rank spends on its own core around one message of n
  bytes beyond what ``exchange_s`` covers for a tiny one: cutting and packing what it sends,
  placing what it receives into an input or adding a received gradient into its accumulator
  (`trainer.redistribute`); one `Curve` for each side of forward and of gradient messages
  (`STAGING_PARTS`).  On this machine, per MiB, about 0.01 ms to send a forward message (a cut
  is often a view), 0.4 ms to place it, 0.17 ms to send a gradient and 0.3 ms to add it; a
  model-parallel tagger spent 4 ms of a 36 ms step there.
* **The batch** (``draw``) — seconds a rank spends drawing one synthetic input tensor, per
  tensor and per element, floating point and integer: before its first op every rank draws the
  step's whole global batch (`autopar.trainer.data.SyntheticData`).  About 5 ns per element on
  one core here: an AlexNet batch of 32 images of 3 x 63 x 63 took 2.2 ms of every step, on every
  rank.  A GPU rank draws on its device.  Training on a dataset file (``--data``) indexes the
  batch instead, a copy of the same elements, which the simulator still prices as a draw.
* **Zeroing the gradient buckets** (``zero``) — seconds per parameter tensor and per byte of the
  runtime's `trainer.sync.GradSync.zero_grad` as every rank starts a step: each bucket's flat
  gradient buffer is zeroed and each of its parameters' ``.grad`` set to a view of it.  Timed in
  the optimizer's data-parallel steps (stage 5), both ranks at once, right after the optimizer step
  that read those gradients: on the 2-vCPU AMD VM about 24 us a tensor and 5.4-6.8 GB/s over 2-34 MB,
  where the local preset's memory bandwidth is 12 GB/s.  None where not measured (the device's
  memory bandwidth).
* **The shared cache** (``shared_cache_bytes``) — the size of the last-level cache the ranks'
  cores share, read from the operating system where the ranks run (sysfs); the simulator prices
  each op between its profile with the L2 evicted and its profile with the last-level cache
  evicted by how much of its data that cache still holds in the step (`planner.sim.reuse`).
  None on GPUs and where it is not known.
* **Arrival noise** (``jitter``, ``latency_var``, ``leave_var``) — how much the moment a rank
  reaches an exchange varies from step to step: the variance (s^2) the offset between two ranks'
  programs gains per second each of them runs since they last met; the variance of a one-way
  message's latency inside steps, by its bytes; and the variance of the offset two ranks leave a
  two-way exchange with, by its messages' bytes (`planner.sim.waits`: a step pays the mean of
  each wait, which is longer than the wait between mean arrivals).  Measured on the in-situ
  chains' exchanges; 0 and None where not measured (the simulator then times mean arrivals).
* ``comm_uses_cores`` — whether communication's work (the backend's threads copying, reducing,
  driving sockets) runs on the cores the ranks compute on: true on CPU ranks when the machine has
  fewer than two cores per rank.  The simulator then charges a transfer to its endpoints' time.

Curves are made monotone (non-decreasing in bytes) by isotonic regression of the measured
medians, so noise never makes a larger message cheaper; between points they are linear, beyond
the last point they extend the last segment's slope.

`default_calibration` gives the numbers this machine's gloo ranks measured (a 2-core Xeon, torch
2.13) for when nothing was calibrated yet; a plan made from them says so (`source`).
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import CostModelError


#: The four staging costs of a `RuntimeCalibration`, in the order of its ``staging`` tuple.
STAGING_PARTS = ("forward_send", "forward_receive", "gradient_send", "gradient_receive")
FORWARD_SEND, FORWARD_RECEIVE, GRADIENT_SEND, GRADIENT_RECEIVE = range(4)


@dataclass(frozen=True)
class Curve:
    """Seconds as a non-decreasing piecewise-linear function of bytes (module docstring)."""

    points: tuple[tuple[float, float], ...]   # (bytes, seconds), bytes ascending, seconds non-decreasing

    def __post_init__(self) -> None:
        if not self.points:
            raise CostModelError("a communication curve needs at least one measured point")
        xs = [x for x, _ in self.points]
        ys = [y for _, y in self.points]
        if any(b <= a for a, b in zip(xs, xs[1:])) or any(b < a for a, b in zip(ys, ys[1:])):
            raise CostModelError(f"communication curve points must have ascending bytes and non-decreasing "
                                 f"seconds, got {self.points!r}; build it with Curve.fit(samples)")
        if any(not math.isfinite(v) or v < 0 for p in self.points for v in p):
            raise CostModelError(f"communication curve points must be finite and non-negative: {self.points!r}")

    @classmethod
    def fit(cls, samples: Iterable[tuple[float, float]]) -> "Curve":
        """The monotone curve closest (least squares) to measured (bytes, seconds) samples: samples
        of one size are averaged, then pool-adjacent-violators makes the sequence non-decreasing."""
        by_size: dict[float, list[float]] = {}
        for b, s in samples:
            by_size.setdefault(float(b), []).append(float(s))
        blocks: list[list[float]] = []   # [first bytes, last bytes, mean seconds, weight]
        for b in sorted(by_size):
            vals = by_size[b]
            blocks.append([b, b, sum(vals) / len(vals), len(vals)])
            while len(blocks) > 1 and blocks[-2][2] > blocks[-1][2]:
                hi = blocks.pop()
                lo = blocks[-1]
                w = lo[3] + hi[3]
                lo[1], lo[2], lo[3] = hi[1], (lo[2] * lo[3] + hi[2] * hi[3]) / w, w
        points = []
        for first, last, mean, _ in blocks:
            points.append((first, mean))
            if last != first:
                points.append((last, mean))
        return cls(tuple(points))

    def flat_after_last(self) -> "Curve":
        """The same curve inside its measured range and constant beyond it (for a cost that does
        not grow with the bytes past what was measured: a line through two noisy points a few
        bytes apart would extrapolate to any value)."""
        last_x, last_y = self.points[-1]
        far = float(1 << 50)
        return self if last_x >= far else Curve(self.points + ((far, last_y),))

    @classmethod
    def linear(cls, latency: float, bandwidth: float) -> "Curve":
        """``latency + bytes / bandwidth`` (an analytic link, for topologies nothing was measured on)."""
        big = float(1 << 30)
        return cls(((0.0, latency), (big, latency + big / bandwidth)))

    def __call__(self, nbytes: float) -> float:
        pts = self.points
        if len(pts) == 1 or nbytes <= pts[0][0]:
            return pts[0][1]
        k = bisect.bisect_right([x for x, _ in pts], nbytes)
        if k >= len(pts):
            (x0, y0), (x1, y1) = pts[-2], pts[-1]
        else:
            (x0, y0), (x1, y1) = pts[k - 1], pts[k]
        return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)

    def to_json(self) -> list[list[float]]:
        return [[x, y] for x, y in self.points]

    @classmethod
    def from_json(cls, doc: Any) -> "Curve":
        return cls(tuple((float(x), float(y)) for x, y in doc))


#: How a calibration's numbers were measured; a stored one measured another way is measured again
#: (`planner.cost.ProfileCache.load`).  1: the runtime's per-task overheads from chains of tiny ops,
#: warm.  2: their work between ops timed with every op evicting the core's caches, as a real
#: model's ops do, and the engine's start-up of an unfused op's own backward call apart
#: (``bwd_call_s``; `autopar.trainer.calibrate`, stage 3); the posting of receives ahead (``post_s``)
#: and the issuing of a bucket's all-reduce (``issue``).  3: one-way messages apart (``p2p_oneway``).
#: 4: the chains' ops evict the caches as the profiler does since its method 4, other ops' code
#: too (`planner.cost.profiler._Interloper`).  5: gloo ranks bound to their own cores, and gloo's
#: network threads kept from preempting a rank inside its own gloo calls (`trainer.launch`).
#: 6: all-reduces timed with gloo's network threads yielding, as the trainer now waits for them.
#: 7: drawing a step's synthetic batch (``draw``).  8: how ranks' arrivals at an exchange vary
#: (``jitter``, ``latency_var``, ``leave_var``).  9: the arrival noise over the in-situ chain's
#: two-way exchanges only (8 put ``leave_var`` 10-15x too high in sd;
#: `autopar.trainer.calibrate.arrival_noise`).  10: point-to-point and all-reduce sizes, and the
#: in-situ chains' batches, taken in turn in every repetition, not one after another
#: (`autopar.trainer.calibrate._interleaved`).  11: one-way messages at the median latency per
#: size, not the mean (`autopar.trainer.calibrate.in_step_curve`).  12: the sender's own call of a
#: one-way message (``send_call``, `autopar.trainer.calibrate.send_calls`).  13: the size of the
#: last-level cache the ranks share (``shared_cache_bytes``, `planner.sim.reuse`).  14: the wait
#: for a step's send requests at its end (``send_wait_s``, `autopar.trainer.calibrate.send_waits`).
#: 15: zeroing the gradient buckets as a step starts (``zero``, `autopar.trainer.calibrate.fit_zero`).
#: 16: the ranks' drift between exchanges (``jitter``) from the interquartile ranges of their
#: offsets, not their variances, which the hypervisor's rare stalls set
#: (`autopar.trainer.calibrate.arrival_noise`).
CALIBRATION_METHOD = 16


@dataclass(frozen=True)
class RuntimeCalibration:
    """The trainer's costs beyond op kernels on one (device product, backend, world size)."""

    product: str
    backend: str
    world: int
    fwd_task_s: float
    bwd_task_s: float
    exchange_s: float
    p2p: Curve
    allreduce: tuple[tuple[int, Curve], ...]      # (group size, curve), ascending group size
    optimizer: tuple[tuple[str, float, float], ...]   # (name, seconds per tensor, seconds per byte)
    comm_uses_cores: bool
    source: str = "measured"                       # "measured" or "default"
    message_serial_s: float = 0.0                  # per message of an exchange, one after another
    staging: tuple[Curve, ...] = ()                # one per `STAGING_PARTS` part; () where not measured
    wire: Curve | None = None                      # the bytes' time on the link; None: p2p less p2p(0)
    bwd_call_s: float = 0.0                        # an unfused op's own autograd call, per task
    post_s: float = 0.0                            # posting one receive ahead (gloo), per message
    send_wait_s: float = 0.0                       # waiting for one send request as the step ends, per message
    issue: Curve | None = None                     # issuing a bucket's all-reduce, by its bytes
    p2p_oneway: Curve | None = None                # a message whose exchange sends nothing back
    send_call: Curve | None = None                 # the sender's own call for such a message, by its bytes
    draw: tuple[tuple[str, float, float], ...] = ()   # (float/int, seconds per tensor, per element)
    zero: tuple[float, float] | None = None        # zeroing the buckets: (seconds per tensor, per byte)
    jitter: float = 0.0                            # variance (s^2) a rank's program gains per second
    latency_var: Curve | None = None               # variance (s^2) of a one-way message's latency, by bytes
    leave_var: Curve | None = None                 # variance (s^2) of two ranks' offset leaving an exchange
    shared_cache_bytes: int | None = None          # the last-level cache the ranks share (`planner.sim.reuse`)
    method: int = CALIBRATION_METHOD               # how it was measured (`CALIBRATION_METHOD`)
    details: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    # An exchange call that moves nothing between ranks, forward and backward, in one model's own
    # steps (`planner.sim.trainer_model.trainer_calibration`); (0, 0) where not measured.
    local_exchange_s: tuple[float, float] = (0.0, 0.0)
    # What a bucket's all-reduce adds to one model's own data-parallel step, over what `allreduce`
    # says for it (`planner.sim.trainer_model.trainer_calibration`); 1 where not measured.
    allreduce_in_step: float = 1.0

    @property
    def measures_arrival_noise(self) -> bool:
        """Whether the arrival noise (``jitter``, ``latency_var``, ``leave_var``) was measured."""
        return self.jitter > 0 or self.latency_var is not None or self.leave_var is not None

    def without_arrival_noise(self) -> "RuntimeCalibration":
        """This calibration with no arrival noise: the simulator then times mean arrivals."""
        return replace(self, jitter=0.0, latency_var=None, leave_var=None)

    def wire_time(self, nbytes: float) -> float:
        """Seconds a message of `nbytes` holds the link (``wire``; without it, the point-to-point
        time beyond an empty message's)."""
        if self.wire is not None:
            return min(self.wire(nbytes), self.p2p(nbytes))
        return max(0.0, self.p2p(nbytes) - self.p2p(0.0))

    def message_time(self, nbytes: float, two_way: bool = True) -> float:
        """Seconds of one message of `nbytes` end to end: ``p2p``, or ``p2p_oneway`` for a message
        whose exchange sends nothing back between its two ranks (where it was measured)."""
        if not two_way and self.p2p_oneway is not None:
            return self.p2p_oneway(nbytes)
        return self.p2p(nbytes)

    @property
    def receives_ahead(self) -> bool:
        """Whether the trainer posts a step's receives before its exchanges (gloo, `trainer.comm.RecvAhead`):
        a message then leaves when its sender sends it, whether or not its receiver is waiting."""
        return self.backend == "gloo"

    @property
    def launches_async(self) -> bool:
        """Whether the device runs kernels behind the host that issues them (CUDA, ``nccl``): the
        simulator then gives each task a host part and a device part on two streams
        (`planner.sim.trainer_model.op_plan`); on CPU ranks the host runs the kernels itself."""
        return self.backend == "nccl"

    def allreduce_time(self, nbytes: float, group: int) -> float:
        """Seconds of an all-reduce of `nbytes` among `group` ranks (the nearest measured group
        size at or above, else the largest)."""
        for size, curve in self.allreduce:
            if size >= group:
                return curve(nbytes)
        return self.allreduce[-1][1](nbytes)

    def bucket_time(self, nbytes: float, group: int) -> tuple[float, float]:
        """(seconds a gradient bucket's all-reduce of `nbytes` among `group` ranks lasts in a step,
        seconds more it costs the backward ops its ranks run beside it).

        In one model's own steps the all-reduces added ``allreduce_in_step`` times what
        `allreduce_time` says for them.  The all-reduce itself lasts `allreduce_time` (at most):
        a step's wait for the last bucket after the backward pass, with nothing beside it, was the
        calibrated time (the tagger on the AMD VM: 3.5-4.6 ms against 3.8 calibrated, its steps
        6-9 ms slower in all).  The rest was the backward pass running slower while gloo's threads
        reduced on the same core (+2 ms of backward there, the forward pass unchanged;
        docs/simulation.md, "Thirty-sixth round")."""
        alone = self.allreduce_time(nbytes, group)
        # A model whose steps showed nothing added (a ratio of 0: noise on a tiny model) still gets
        # an all-reduce that takes some time: the simulator's tasks all do (1 ns, as a free task).
        seconds = max(min(alone, alone * self.allreduce_in_step), 1e-9)
        return seconds, max(0.0, alone * (self.allreduce_in_step - 1.0))

    def issue_time(self, nbytes: float) -> float:
        """Seconds a rank's own thread spends starting the all-reduce of a bucket of `nbytes`
        (``issue``; 0 where it was not measured)."""
        return self.issue(nbytes) if self.issue is not None else 0.0

    def optimizer_time(self, name: str, tensors: int, nbytes: float) -> float | None:
        """Seconds of one step of optimizer `name` over `tensors` parameter tensors of `nbytes`
        bytes in all; None when this calibration has not measured that optimizer."""
        for opt, per_tensor, per_byte in self.optimizer:
            if opt == name:
                return tensors * per_tensor + nbytes * per_byte
        return None

    def draw_time(self, floating: bool, numel: int) -> float:
        """Seconds a rank spends drawing one synthetic input tensor of `numel` elements, floating
        point or integer (``draw``: every rank draws a step's whole global batch before its first
        op, `autopar.trainer.data.SyntheticData`); 0 where it was not measured."""
        kind = "float" if floating else "int"
        for name, per_tensor, per_element in self.draw:
            if name == kind:
                return per_tensor + numel * per_element
        return 0.0

    def zero_time(self, tensors: int, nbytes: float) -> float | None:
        """Seconds a rank spends zeroing gradient buckets of `nbytes` bytes that hold `tensors`
        parameters' gradients as it starts a step (``zero``); None where it was not measured."""
        if self.zero is None:
            return None
        per_tensor, per_byte = self.zero
        return tensors * per_tensor + nbytes * per_byte

    def staging_time(self, part: int, nbytes: float) -> float:
        """Seconds one rank spends staging a message of `nbytes` (`part` indexes `STAGING_PARTS`);
        0 where the calibration has no staging curves."""
        return self.staging[part](nbytes) if self.staging else 0.0

    @property
    def key(self) -> str:
        return calibration_key(self.product, self.backend, self.world)

    def to_json(self) -> dict[str, Any]:
        return {"product": self.product, "backend": self.backend, "world": self.world,
                "fwd_task_s": self.fwd_task_s, "bwd_task_s": self.bwd_task_s, "exchange_s": self.exchange_s,
                "p2p": self.p2p.to_json(), "allreduce": {str(g): c.to_json() for g, c in self.allreduce},
                "optimizer": {name: {"tensor_s": t, "byte_s": b} for name, t, b in self.optimizer},
                "comm_uses_cores": self.comm_uses_cores, "message_serial_s": self.message_serial_s,
                "staging": {name: c.to_json() for name, c in zip(STAGING_PARTS, self.staging)},
                **({"wire": self.wire.to_json()} if self.wire is not None else {}),
                "bwd_call_s": self.bwd_call_s, "post_s": self.post_s, "send_wait_s": self.send_wait_s,
                "method": self.method,
                **({"issue": self.issue.to_json()} if self.issue is not None else {}),
                **({"p2p_oneway": self.p2p_oneway.to_json()} if self.p2p_oneway is not None else {}),
                **({"send_call": self.send_call.to_json()} if self.send_call is not None else {}),
                "draw": {name: {"tensor_s": t, "element_s": e} for name, t, e in self.draw},
                **({"zero": {"tensor_s": self.zero[0], "byte_s": self.zero[1]}} if self.zero is not None else {}),
                "jitter": self.jitter,
                **({"latency_var": self.latency_var.to_json()} if self.latency_var is not None else {}),
                **({"leave_var": self.leave_var.to_json()} if self.leave_var is not None else {}),
                **({"shared_cache_bytes": self.shared_cache_bytes} if self.shared_cache_bytes is not None else {}),
                "source": self.source, "details": dict(self.details)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "RuntimeCalibration":
        try:
            return cls(product=str(doc["product"]), backend=str(doc["backend"]), world=int(doc["world"]),
                       fwd_task_s=float(doc["fwd_task_s"]), bwd_task_s=float(doc["bwd_task_s"]),
                       exchange_s=float(doc["exchange_s"]), p2p=Curve.from_json(doc["p2p"]),
                       allreduce=tuple(sorted((int(g), Curve.from_json(c)) for g, c in doc["allreduce"].items())),
                       optimizer=tuple(sorted((str(k), float(v["tensor_s"]), float(v["byte_s"]))
                                              for k, v in dict(doc.get("optimizer") or {}).items())),
                       comm_uses_cores=bool(doc["comm_uses_cores"]), source=str(doc.get("source", "measured")),
                       message_serial_s=float(doc.get("message_serial_s", 0.0)),
                       staging=_staging_from_json(doc.get("staging")),
                       wire=Curve.from_json(doc["wire"]) if doc.get("wire") else None,
                       bwd_call_s=float(doc.get("bwd_call_s", 0.0)), post_s=float(doc.get("post_s", 0.0)),
                       send_wait_s=float(doc.get("send_wait_s", 0.0)),
                       method=int(doc.get("method", 1)),
                       issue=Curve.from_json(doc["issue"]) if doc.get("issue") else None,
                       p2p_oneway=Curve.from_json(doc["p2p_oneway"]) if doc.get("p2p_oneway") else None,
                       send_call=Curve.from_json(doc["send_call"]) if doc.get("send_call") else None,
                       draw=tuple(sorted((str(k), float(v["tensor_s"]), float(v["element_s"]))
                                         for k, v in dict(doc.get("draw") or {}).items())),
                       zero=(float(doc["zero"]["tensor_s"]), float(doc["zero"]["byte_s"])) if doc.get("zero") else None,
                       jitter=float(doc.get("jitter", 0.0)),
                       latency_var=Curve.from_json(doc["latency_var"]) if doc.get("latency_var") else None,
                       leave_var=Curve.from_json(doc["leave_var"]) if doc.get("leave_var") else None,
                       shared_cache_bytes=int(doc["shared_cache_bytes"]) if doc.get("shared_cache_bytes") else None,
                       details=tuple(sorted(dict(doc.get("details") or {}).items())))
        except (KeyError, TypeError, ValueError) as e:
            raise CostModelError(f"runtime calibration {doc.get('product', '?')}/{doc.get('backend', '?')}: "
                                 f"{type(e).__name__}: {e}; re-run `autopar profile` to measure it again") from e


def _staging_from_json(doc: Any) -> tuple[Curve, ...]:
    if not doc:
        return ()
    if not isinstance(doc, Mapping) or set(doc) != set(STAGING_PARTS):
        raise ValueError(f"staging must map each of {', '.join(STAGING_PARTS)} to a curve")
    return tuple(Curve.from_json(doc[k]) for k in STAGING_PARTS)


#: Where the kernel mounts the control groups, and where it lists this process's (`usable_cores`).
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")


def _cgroup_cores(root: Path, own: str) -> float | None:
    """The CPU time, in cores, that the control groups of this process may use: the smallest
    ``cpu.max`` quota over its cgroup v2 group and every group above it, or cgroup v1's
    ``cpu.cfs_quota_us / cpu.cfs_period_us``.  None where no quota is set or none can be read.
    `own` is ``/proc/self/cgroup``'s text."""
    quotas = []
    for line in own.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":            # cgroup v2
            group = root / path.strip().lstrip("/")
            for folder in (group, *group.parents):
                if not folder.is_relative_to(root):
                    break
                try:
                    quota, period = (folder / "cpu.max").read_text().split()[:2]
                except (OSError, ValueError):
                    continue
                if quota != "max" and float(period) > 0:
                    quotas.append(float(quota) / float(period))
        elif "cpu" in controllers.split(","):                   # cgroup v1
            inner = path.strip().lstrip("/")
            for folder in (root / controllers / inner, root / controllers):
                try:
                    quota = float((folder / "cpu.cfs_quota_us").read_text())
                    period = float((folder / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    continue
                if quota > 0 and period > 0:
                    quotas.append(quota / period)
                break
    return min(quotas, default=None)


def usable_cores(root: Path | None = None, own: Path | None = None) -> int:
    """How many cores this process may run on: the cores of its affinity mask (a container's
    cpuset, ``taskset``), at most the whole cores of its control groups' CPU quota (a Kubernetes
    pod's CPU limit), at least 1.

    ``os.cpu_count()`` counts the machine's cores.  In a pod limited to 2 CPUs on a 64-core node
    it says 64, and the calibration would take gloo's threads to run beside the ranks on cores
    of their own (``comm_uses_cores`` False) while they share the ranks' 2."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota = _cgroup_cores(root or CGROUP_ROOT, (own or OWN_CGROUPS).read_text())
    except OSError:
        quota = None
    if quota is not None:
        cores = min(cores, math.floor(quota))
    return max(1, cores)


def calibration_key(product: str, backend: str, world: int) -> str:
    return f"{product}|{backend}|{world}"


def default_calibration(product: str, backend: str, world: int, cores: int | None = None) -> RuntimeCalibration:
    """Numbers measured on this project's development machine (2-core Xeon, gloo over loopback,
    torch 2.13, one thread per rank), for a machine where `autopar profile` has not measured them
    yet.  Only the shape is portable: calibrate (``autopar profile --topology local:N``)."""
    cores = cores if cores is not None else usable_cores()
    # Inside steps (`autopar.trainer.calibrate`, stage 6): two ranks sending to each other, and one way.
    p2p = Curve.fit([(1 << 10, 630e-6), (16 << 10, 632e-6), (64 << 10, 875e-6), (256 << 10, 1.1e-3), (1 << 20, 1.18e-3),
                     (4 << 20, 1.85e-3), (16 << 20, 6.0e-3)])
    sizes = (1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)   # staging: seconds per message
    ar2 = Curve.fit([(4, 130e-6), (64 << 10, 290e-6), (1 << 20, 820e-6), (4 << 20, 3.8e-3), (16 << 20, 13.8e-3)])
    return RuntimeCalibration(product=product, backend=backend, world=world, fwd_task_s=60e-6, bwd_task_s=40e-6,
                              exchange_s=50e-6, p2p=p2p, allreduce=((2, ar2),),
                              optimizer=(("adam", 20e-6, 0.9e-9), ("sgd", 15e-6, 0.55e-9)),
                              comm_uses_cores=backend == "gloo" and cores < 2 * world, source="default",
                              message_serial_s=35e-6, bwd_call_s=35e-6, post_s=40e-6 if backend == "gloo" else 0.0,
                              # the AMD EPYC VM, 2026-11-30: 14-16 us per send in rnnlm's and a tagger's steps
                              send_wait_s=15e-6 if backend == "gloo" else 0.0,
                              issue=Curve.fit([(64 << 10, 150e-6), (4 << 20, 500e-6)]).flat_after_last(),
                              p2p_oneway=Curve.fit([(2 << 10, 120e-6), (32 << 10, 140e-6), (128 << 10, 220e-6),
                                                    (512 << 10, 345e-6), (2 << 20, 945e-6), (16 << 20, 5.9e-3)]),
                              # the 2-vCPU AMD EPYC VM, 2026-11-29 (one-way chain, stage 6)
                              send_call=Curve.fit([(2 << 10, 65e-6), (32 << 10, 68e-6), (128 << 10, 83e-6),
                                                   (512 << 10, 137e-6), (2 << 20, 565e-6)])
                              if backend == "gloo" else None,
                              staging=tuple(Curve.fit(zip(sizes, us)) for us in (
                                  (4e-6, 5e-6, 5e-6, 8e-6, 13e-6), (45e-6, 57e-6, 86e-6, 142e-6, 550e-6),
                                  (23e-6, 27e-6, 35e-6, 66e-6, 196e-6), (62e-6, 62e-6, 62e-6, 107e-6, 392e-6))),
                              # one thread of a 2-vCPU AMD EPYC (2026-11-27): torch.randn and torch.randint;
                              # a GPU rank draws on its device, in microseconds
                              draw=(("float", 5e-6, 4.9e-9), ("int", 5e-6, 5.5e-9)) if backend == "gloo" else ())
