"""Starting ranks: N local worker processes, or one rank of a `torchrun` job.

    autopar train --model lenet --strategy data-parallel --nproc 2 --steps 10     # N local ranks
    torchrun --nproc-per-node 2 -m autopar.cli train --model lenet ...            # same entry point

Local mode starts `nproc` processes that rendezvous over TCP on 127.0.0.1 at a free port
and run one function; each writes its return value to a private file that the parent reads after
every rank has exited cleanly — nothing is reported from a job that did not finish.  Under
torchrun the process reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT and joins the
job itself.  Backend: NCCL when the ranks use CUDA devices (that path is written for GPUs and
untested on this machine), gloo otherwise, one CPU thread per rank.  Local gloo ranks are bound
each to its own share of the cores (`bind_to_own_cores`), and gloo's network threads do not
preempt a rank inside its own gloo calls (`own_gloo_call`).

Gloo ranks are forked from a fork server (``forkserver``), not from the caller: a process that has
traced a model with fake tensors and then run a backward pass (the planner and the profiler do
both) has started autograd's device threads, and a plain ``fork`` of it leaves children whose
backward raises "Unable to handle autograd's threading in combination with fork-based
multiprocessing".  The server is a fresh interpreter that imports torch and the trainer once (about
a second, the first time) and forks every later rank in milliseconds; ranks get the caller's
environment as it is at launch.  NCCL ranks are spawned (CUDA cannot be forked).

A rank that dies takes the job down cleanly: the parent notices the failed process, gives the
others `grace` seconds to fail on their broken connections (gloo raises as soon as a peer's socket
closes; every collective also has the process-group `timeout`), then terminates the rest and
raises `RankFailedError` naming the rank that failed first — the one that died without a Python
exception or raised something other than a communication error.

With ``graceful=True`` (ranks that handle a stop, `trainer.train._StopRequest`) the first Ctrl-C or
SIGTERM the parent gets is forwarded to every rank as that same signal, and the ranks get
`STOP_SECONDS` to finish their step, checkpoint and exit; a second one stops them at once.  (A pod
is stopped with SIGTERM; a terminal's Ctrl-C reaches every process of its group anyway.)
"""

from __future__ import annotations

import datetime as _dt
import os
import signal
import socket
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autopar.planner.cost import bind_to_own_cores, keep_freed_memory, use_huge_pages

from .errors import RankFailedError, TrainerConfigError

#: Seconds the surviving ranks get to exit on their own once one rank has failed.
GRACE_SECONDS = 10.0
#: Seconds ranks that handle Ctrl-C or SIGTERM get to finish their step and checkpoint before they are killed.
STOP_SECONDS = 120.0
DEFAULT_TIMEOUT = 300.0
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return all(v in os.environ for v in _TORCHRUN_VARS)


def pick_backend(device: str | None = None) -> tuple[str, str]:
    """(backend, device kind): NCCL with CUDA devices when asked for or available, else gloo on CPU."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise TrainerConfigError("device cuda was requested but torch sees no CUDA device; use --device cpu")
        return "nccl", "cuda"
    return "gloo", "cpu"


def check_gpus(ranks: int, first: int = 0, fix: str | None = None) -> None:
    """Refuse CUDA ranks ``first .. first + ranks - 1`` where this machine has fewer GPUs: NCCL
    runs one rank per GPU (two ranks on one GPU fail inside NCCL, with a message about
    duplicate GPUs, after the job has started).  `fix` says what to do (default: --nproc)."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if first + ranks > have:
        raise TrainerConfigError(f"{first + ranks} CUDA rank(s) need one GPU each, and torch sees {have} on this "
                                 "machine: " + (fix or f"use --nproc {max(1, have)} (or fewer), or --device cpu"))


def rank_device(kind: str, local_rank: int) -> torch.device:
    if kind == "cuda":
        check_gpus(1, local_rank)
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_rank(rank: int, world: int, addr: str, port: int, backend: str, timeout: float) -> None:
    keep_freed_memory()
    use_huge_pages()
    if backend == "gloo":
        torch.set_num_threads(1)
        bind_to_own_cores(rank, world)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=timeout))
    track_gloo_loops()


#: The name gloo gives the thread of a TCP device's event loop (``gloo/transport/tcp/loop.cc``).
GLOO_LOOP_THREAD = "gloo_tcp_loop"

_loops: list[int] = []          # this process's gloo network threads (`track_gloo_loops`)


def track_gloo_loops() -> int:
    """Find this process's gloo network threads, for `own_gloo_call`; returns how many.

    Every group has its own device and event loop, so `init_rank`, `ProcessGroups.create` and the
    calibration call this again after they make groups.  Only where the default process group is
    gloo's, and on Linux (thread names from ``/proc``); elsewhere it finds none and
    `own_gloo_call` changes nothing.
    """
    tasks = Path("/proc/self/task")
    found = []
    gloo = dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"
    if gloo and hasattr(os, "sched_setscheduler") and tasks.is_dir():
        for task in tasks.iterdir():
            try:
                if (task / "comm").read_text().strip() == GLOO_LOOP_THREAD:
                    found.append(int(task.name))
            except (OSError, ValueError):   # the thread ended meanwhile
                continue
    _loops[:] = found
    return len(found)


def _set_loops(policy: int) -> None:
    for tid in _loops:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError:                     # gone, or not ours to set: the call goes on as before
            pass


class own_gloo_call:
    """While the rank's own thread is inside a gloo call, its network threads do not preempt it.

    gloo's TCP event loop handles a socket only when it can take the connection's lock, and
    otherwise polls again at once.  Woken by a message while the rank's thread was inside a send
    or a posted receive (holding that lock), it took the core from the lock's holder and spun until
    the next scheduler tick gave the core back: 2-6 ms with both ranks waiting, in 13-16 % of the
    exchanges after 0.35 ms of compute and 58-74 % after 1.8 ms (docs/simulation.md, "Tenth
    round").  For the length of the call the loops are ``SCHED_BATCH`` (a woken one does not
    preempt the running thread); after it they are ordinary threads again, which pass a message on
    as soon as it arrives.  Where `track_gloo_loops` found none (no /proc, no such policy, not
    gloo) it changes nothing.  (In ``SCHED_BATCH`` for good, a rank that computed on after
    sending held its message until it next waited.)  With the ranks on their own cores
    (`bind_to_own_cores`) an exchange of 16 KiB each way after 0.35 ms of compute took 0.10 ms on
    average instead of 0.71, and of 1 MiB 0.58 ms instead of 1.34.
    """

    def __enter__(self) -> "own_gloo_call":
        if _loops:                          # else os.SCHED_BATCH may not even exist (not Linux)
            _set_loops(os.SCHED_BATCH)
        return self

    def __exit__(self, *exc: object) -> None:
        if _loops:
            _set_loops(os.SCHED_OTHER)


def init_from_env(backend: str, timeout: float) -> tuple[int, int, int]:
    """Join a torchrun job; returns (rank, world size, local rank)."""
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    keep_freed_memory()
    use_huge_pages()
    if backend == "gloo":
        torch.set_num_threads(1)
        bind_to_own_cores(local, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=timeout))
    track_gloo_loops()
    return rank, world, local


def _is_comm_error(e: BaseException) -> bool:
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = f"{type(e).__name__}: {e}".lower()
    return any(s in text for s in ("connection closed", "connection reset", "broken pipe", "gloo", "nccl",
                                   "timed out", "socket", "peer"))


def _worker(rank: int, fn: Callable, world: int, port: int, backend: str, timeout: float, out_dir: str,
            args: tuple, env: dict[str, str]) -> None:
    # A fork server's children start with the server's environment; a rank gets the caller's.
    os.environ.clear()
    os.environ.update(env)
    out = Path(out_dir)
    try:
        init_rank(rank, world, "127.0.0.1", port, backend, timeout)
        result = fn(rank, world, *args)
        tmp = out / f".result-{rank}.tmp"
        torch.save(result, tmp)
        os.replace(tmp, out / f"result-{rank}.pt")
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then re-raised
        kind = "comm" if _is_comm_error(e) else "error"
        (out / f"error-{rank}.txt").write_text(f"{kind}\n{type(e).__name__}: {e}\n{traceback.format_exc()}")
        raise SystemExit(1)


def run_local(fn: Callable, nproc: int, args: Sequence[Any] = (), *, backend: str = "gloo",
              timeout: float = DEFAULT_TIMEOUT, start_method: str | None = None,
              grace: float = GRACE_SECONDS, graceful: bool = False) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on `nproc` local ranks; return every rank's result in rank order.

    `fn` and `args` are pickled to the ranks (``forkserver`` for gloo, ``spawn`` for NCCL; see the
    module docstring), so `fn` must be a module-level function.  ``start_method="fork"`` is faster
    still, but only safe in a process that has not run autograd since it entered a fake-tensor mode.

    `graceful`: the ranks handle SIGINT and SIGTERM themselves (finish the step, checkpoint, stop);
    the parent forwards the first of either it gets to them, and a second one, or ranks still
    running `STOP_SECONDS` later, end the job (KeyboardInterrupt).  Called from the main thread,
    the parent handles both signals itself while the ranks run, noting them for its loop to act
    on; the previous handlers are back when this returns.  (With Python's own SIGINT handler the
    loop caught the KeyboardInterrupt only in its poll of the ranks; one raised anywhere else in
    the loop ended the job without its ranks' checkpoint, once in a CI run of 2026-11-29.)
    Without it, Ctrl-C kills the ranks and SIGTERM keeps its usual meaning.
    """
    if nproc < 1:
        raise TrainerConfigError(f"--nproc must be at least 1, got {nproc}")
    ctx = mp.get_context(start_method or _default_start_method(backend))
    port = free_port()
    env = dict(os.environ)
    stops: list[int] = []           # SIGINTs and SIGTERMs the parent got (graceful: handled in the loop below)
    old: dict[int, Any] = {}
    if graceful and threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, lambda signum, frame: stops.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run_ranks(ctx, fn, nproc, args, port, backend, timeout, env, grace, graceful, stops)
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def _forward(procs: list, signum: int) -> None:
    for p in procs:
        try:
            os.kill(p.pid, signum)
        except ProcessLookupError:
            pass


def _run_ranks(ctx, fn: Callable, nproc: int, args: Sequence[Any], port: int, backend: str, timeout: float,
               env: dict[str, str], grace: float, graceful: bool, stops: list[int]) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="autopar-ranks-") as out_dir:
        procs = [ctx.Process(target=_worker, args=(r, fn, nproc, port, backend, timeout, out_dir, tuple(args), env),
                             name=f"autopar-rank{r}", daemon=False) for r in range(nproc)]
        for p in procs:
            p.start()
        failed_at = None
        interrupted_at = None
        try:
            while True:
                if interrupted_at is not None and time.monotonic() - interrupted_at > STOP_SECONDS:
                    raise KeyboardInterrupt
                alive = [p for p in procs if p.exitcode is None]
                bad = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if bad and failed_at is None:
                    failed_at = time.monotonic()
                if not alive:
                    break
                if failed_at is not None and time.monotonic() - failed_at > grace:
                    for p in alive:
                        if graceful:     # such ranks note a SIGTERM and go on: end them outright
                            p.kill()
                        else:
                            p.terminate()
                    for p in alive:
                        p.join(5)
                        if p.exitcode is None:
                            p.kill()
                            p.join()
                    break
                alive[0].join(0.05)
                if stops:       # Ctrl-C, or SIGTERM to the parent (a pod being stopped)
                    first, again = stops[0], len(stops) > 1
                    stops.clear()
                    if again or interrupted_at is not None:
                        raise KeyboardInterrupt
                    interrupted_at = time.monotonic()
                    _forward(alive, first)
        except BaseException:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                    p.join()
            raise
        codes = [p.exitcode for p in procs]
        if any(c != 0 for c in codes):
            raise _failure(Path(out_dir), codes)
        return [torch.load(Path(out_dir) / f"result-{r}.pt", weights_only=False) for r in range(nproc)]


_SERVER_PRELOAD = ["torch", "torch.distributed", "autopar.trainer.launch"]


def _default_start_method(backend: str) -> str:
    if backend == "gloo" and "forkserver" in mp.get_all_start_methods():
        # Takes effect when this process's fork server starts, i.e. before its first gloo launch.
        mp.set_forkserver_preload(_SERVER_PRELOAD)
        return "forkserver"
    return "spawn"


def _failure(out: Path, codes: list[int | None]) -> RankFailedError:
    reports: dict[int, tuple[str, str]] = {}
    for r, code in enumerate(codes):
        f = out / f"error-{r}.txt"
        if f.exists():
            kind, _, text = f.read_text().partition("\n")
            reports[r] = (kind, text)
    died = [r for r, c in enumerate(codes) if c not in (0, None) and r not in reports]
    errors = [r for r, (k, _) in reports.items() if k == "error"]
    root = (died or sorted(errors) or sorted(reports) or [r for r, c in enumerate(codes) if c != 0])[0]
    others = [r for r, c in enumerate(codes) if c != 0 and r != root]
    if root in reports:
        first = reports[root][1].splitlines()[0]
        what = f"rank {root} failed: {first}"
        detail = reports[root][1]
    else:
        code = codes[root]
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        what = f"rank {root} died ({how}) without reporting an error"
        detail = ""
    tail = f"; ranks {', '.join(map(str, others))} were stopped" if others else ""
    msg = f"{what}{tail}. Nothing was written for the unfinished run (checkpoints are only ever complete files)."
    if detail:
        msg += f"\n--- rank {root} traceback ---\n{detail.rstrip()}"
    return RankFailedError(root, msg)
