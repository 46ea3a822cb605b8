"""What a trainer pod (`operator.resources.trainer_pod`) needs of `autopar train`: a metrics server
its Service can reach (--metrics-addr), a final checkpoint (--checkpoint-final), a first attempt
that resumes only when there is something to resume from (--resume-if-present), and a graceful
stop on SIGTERM — what Kubernetes sends a pod, and torchrun forwards to its workers."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from autopar.trainer.errors import TrainerConfigError
from autopar.trainer.launch import free_port, run_local
from autopar.trainer.metrics import StepMetrics
from autopar.trainer.train import (STOP_SIGNALS, TrainConfig, _StopRequest, add_train_args, config_from, exit_status,
                                   format_summary, resolve_resume, train_main)

LENET = {"batch": 8, "image": 12}
LENET_ARGS = ["--model", "lenet", "-o", "image=12", "-o", "batch=8"]
AUTOPAR = [sys.executable, "-m", "autopar.cli"]


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--model-opt", "-o", action="append", default=[])
    p.add_argument("--json", action="store_true")
    add_train_args(p)
    return p.parse_args(list(argv))


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "AUTOPAR_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}


# -- 1. --metrics-addr ----------------------------------------------------------------------------

def test_metrics_addr_is_an_option_and_defaults_to_the_environment_then_loopback(monkeypatch):
    assert config_from(_parse("--metrics-port", "9090", "--metrics-addr", "0.0.0.0")).metrics_addr == "0.0.0.0"
    assert config_from(_parse("--metrics-port", "9090")).metrics_addr is None    # decided where the server starts
    monkeypatch.delenv("AUTOPAR_METRICS_ADDR", raising=False)
    m = StepMetrics("lenet", "data-parallel", port=0)
    try:
        assert m.addr == "127.0.0.1" and m._server.server_address[0] == "127.0.0.1"
    finally:
        m.close()
    monkeypatch.setenv("AUTOPAR_METRICS_ADDR", "0.0.0.0")      # what trainer_pod sets on rank 0
    m = StepMetrics("lenet", "data-parallel", port=0)
    try:
        assert m.addr == "0.0.0.0" and m._server.server_address[0] == "0.0.0.0"
        m.record(0.01, 1.5, 8)
        body = urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10).read().decode()
        assert "autopar_trainer_steps_total" in body
    finally:
        m.close()
    m = StepMetrics("lenet", "data-parallel", port=0, addr="127.0.0.1")   # the option wins over the environment
    try:
        assert m._server.server_address[0] == "127.0.0.1"
    finally:
        m.close()


@pytest.mark.timeout(120)
def test_a_run_serves_its_metrics_on_the_address_asked_for(tmp_path):
    summary = train_main(model="lenet", model_options=LENET, nproc=1, steps=2, metrics_port=0,
                         metrics_addr="0.0.0.0", log=False)
    assert summary["metrics_addr"] == "0.0.0.0" and summary["metrics_port"] > 0


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_wait_scraped_waits_for_a_scrape_that_began_after_the_last_step():
    m = StepMetrics("lenet", "data-parallel", port=0, addr="127.0.0.1")
    try:
        assert m.wait_scraped(0.0)                          # nothing recorded: nothing to wait for
        m.record(0.01, 1.5, 8, step=1)
        assert not m.wait_scraped(0.2)                      # nobody scraped
        assert "autopar_trainer_steps_total" in _scrape(m.port)
        assert m.wait_scraped(0.0)
        m.record(0.01, 1.4, 8, step=2)
        assert not m.wait_scraped(0.0)                      # the scrape before step 2 does not count
        import threading
        threading.Timer(0.3, _scrape, (m.port,)).start()
        assert m.wait_scraped(30.0)                         # returns once the scrape has begun
    finally:
        m.close()
    assert StepMetrics("lenet", "data-parallel").wait_scraped(5.0)     # no server: nothing to wait for


def test_metrics_linger_is_an_option_and_defaults_to_the_environment_then_zero(monkeypatch, capsys):
    from autopar.trainer.metrics import default_linger
    assert config_from(_parse("--metrics-linger", "11")).metrics_linger == 11.0
    assert config_from(_parse()).metrics_linger is None                  # decided on rank 0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(SystemExit):
            _parse("--metrics-linger", bad)
        assert "is not a number of seconds >= 0" in capsys.readouterr().err
    monkeypatch.delenv("AUTOPAR_METRICS_LINGER", raising=False)
    assert default_linger() == 0.0
    monkeypatch.setenv("AUTOPAR_METRICS_LINGER", "11")                  # what a trainer pod with a sidecar sets
    assert default_linger() == 11.0
    monkeypatch.setenv("AUTOPAR_METRICS_LINGER", "eleven")
    with pytest.raises(ValueError, match=r"\$AUTOPAR_METRICS_LINGER='eleven' is not a number of seconds"):
        default_linger()


@pytest.mark.timeout(120)
def test_a_bad_linger_in_the_environment_stops_the_run_before_it_trains(monkeypatch):
    monkeypatch.setenv("AUTOPAR_METRICS_LINGER", "-3")
    with pytest.raises(TrainerConfigError, match="AUTOPAR_METRICS_LINGER"):
        train_main(model="lenet", model_options=LENET, nproc=1, steps=2, metrics_port=0, log=False)


@pytest.mark.timeout(120)
def test_a_run_that_ends_between_two_scrapes_waits_for_the_next_one(tmp_path):
    """A run shorter than the scrape interval: rank 0 keeps its metrics up after the last step
    until a scrape has seen it, so the scraper reads every step (the operator's progress sidecar
    scrapes every 5 s; a trainer pod with it sets $AUTOPAR_METRICS_LINGER)."""
    import threading
    port = free_port()
    seen: list[str] = []
    done = threading.Event()

    def scraper():            # scrapes until it reads 3 steps or the run has returned
        while not done.is_set():
            try:
                body = _scrape(port)
            except OSError:
                time.sleep(0.05)
                continue
            seen.append(body)
            if 'autopar_trainer_steps_total{model="lenet",strategy="data-parallel"} 3.0' in body:
                return
            time.sleep(0.5)
    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        summary = train_main(model="lenet", model_options=LENET, nproc=1, steps=3, metrics_port=port,
                             metrics_linger=60.0, log=False)
    finally:
        done.set()
        t.join(10)
    assert summary["metrics_port"] == port and len(summary["step_seconds"]) == 3
    assert seen and 'autopar_trainer_steps_total{model="lenet",strategy="data-parallel"} 3.0' in seen[-1]


# -- 2. --checkpoint-final ------------------------------------------------------------------------

def test_checkpoint_final_is_an_option_that_needs_a_directory():
    assert config_from(_parse("--checkpoint-dir", "ck", "--checkpoint-final")).checkpoint_final is True
    assert config_from(_parse("--checkpoint-dir", "ck")).checkpoint_final is False
    with pytest.raises(TrainerConfigError, match="--checkpoint-final needs --checkpoint-dir"):
        config_from(_parse("--checkpoint-final"))


@pytest.mark.timeout(120)
def test_checkpoint_final_writes_the_last_step_too(tmp_path):
    ck = tmp_path / "ck"
    summary = train_main(model="lenet", model_options=LENET, nproc=1, steps=3, checkpoint_dir=str(ck),
                         checkpoint_every=2, checkpoint_final=True, log=False)
    assert summary["checkpoints"] == [str(ck / "step-00000002.pt"), str(ck / "step-00000003.pt")]


# -- 3. --resume-if-present ----------------------------------------------------------------------

def test_resume_if_present_is_an_option_that_needs_a_directory_and_excludes_resume(capsys):
    cfg = config_from(_parse("--checkpoint-dir", "ck", "--resume-if-present"))
    assert cfg.resume_if_present is True and cfg.resume is False
    with pytest.raises(TrainerConfigError, match="--resume-if-present needs --checkpoint-dir"):
        config_from(_parse("--resume-if-present"))
    with pytest.raises(SystemExit):
        _parse("--checkpoint-dir", "ck", "--resume", "--resume-if-present")
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(TrainerConfigError, match="choose one"):
        TrainConfig(checkpoint_dir="ck", resume=True, resume_if_present=True)


def test_resume_if_present_becomes_resume_when_a_checkpoint_is_there(tmp_path):
    cfg = TrainConfig(checkpoint_dir=str(tmp_path / "missing"), resume_if_present=True)
    assert (resolve_resume(cfg).resume, resolve_resume(cfg).resume_if_present) == (False, False)
    (tmp_path / "ck").mkdir()
    cfg = TrainConfig(checkpoint_dir=str(tmp_path / "ck"), resume_if_present=True)
    assert resolve_resume(cfg).resume is False                        # an empty directory: start fresh
    (tmp_path / "ck" / "step-00000004.pt").write_bytes(b"")
    assert resolve_resume(cfg).resume is True
    plain = TrainConfig(checkpoint_dir=str(tmp_path / "ck"), resume=True)
    assert resolve_resume(plain) is plain


@pytest.mark.timeout(180)
def test_resume_if_present_starts_fresh_then_resumes(tmp_path):
    ck = tmp_path / "ck"
    kw = dict(model="lenet", model_options=LENET, nproc=2, checkpoint_dir=str(ck), checkpoint_final=True,
              resume_if_present=True, log=False)
    first = train_main(steps=3, **kw)                  # no directory yet: a fresh start, not an error
    assert first["resumed_from_step"] is None and len(first["losses"]) == 3
    assert first["checkpoints"] == [str(ck / "step-00000003.pt")]
    second = train_main(steps=5, **kw)                 # the restarted attempt finds it
    assert second["resumed_from_step"] == 3 and len(second["losses"]) == 2
    assert second["checkpoints"] == [str(ck / "step-00000005.pt")]


# -- 4. graceful stop on SIGTERM -----------------------------------------------------------------

def _stop_by_signal(rank: int, world: int, signum: int) -> tuple[int, bool, bool]:
    """Rank 1 signals itself; every rank must agree on that signal, then ignore both afterwards."""
    stop = _StopRequest(None)
    if rank == 1:
        os.kill(os.getpid(), signum)
        time.sleep(0.1)
    agreed = stop.agreed()
    stop.restore()
    return agreed, *(signal.getsignal(s) == signal.SIG_IGN for s in STOP_SIGNALS)


def _no_stop(rank: int, world: int) -> tuple[int, bool]:
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stop = _StopRequest(None)
    agreed = stop.agreed()
    stop.restore()
    return agreed, all(signal.getsignal(s) == before[s] for s in STOP_SIGNALS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_ranks_agree_on_a_stop_by_sigterm_or_sigint_and_ignore_late_ones(signum):
    assert run_local(_stop_by_signal, 2, (int(signum),)) == [(int(signum), True, True)] * 2


@pytest.mark.timeout(120)
def test_without_a_signal_no_stop_and_the_handlers_come_back():
    assert run_local(_no_stop, 2) == [(0, True)] * 2


def _stop_when_told(rank: int, world: int, ready: str) -> int:
    """Every rank waits, a step at a time, until the ranks agree on a stop (rank 0 says when it listens)."""
    stop = _StopRequest(None)
    if rank == 0:
        Path(ready).touch()
    for _ in range(1200):
        agreed = stop.agreed()
        if agreed:
            break
        time.sleep(0.05)
    stop.restore()
    return agreed


@pytest.mark.timeout(120)
def test_ctrl_c_to_the_parent_is_noted_by_its_own_handler_and_forwarded_to_the_ranks(tmp_path):
    """A Ctrl-C must never surface as KeyboardInterrupt in the parent's loop, wherever the parent is
    when it comes: the parent holds its own SIGINT handler while the ranks run."""
    ready, seen = tmp_path / "ready", {}
    before = signal.getsignal(signal.SIGINT)

    def ctrl_c() -> None:
        while not ready.exists():
            time.sleep(0.05)
        seen["handler"] = signal.getsignal(signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=ctrl_c, daemon=True)
    thread.start()
    assert run_local(_stop_when_told, 2, (str(ready),), graceful=True) == [int(signal.SIGINT)] * 2
    thread.join(5)
    assert seen["handler"] not in (signal.default_int_handler, signal.SIG_DFL, before)
    assert signal.getsignal(signal.SIGINT) == before


@pytest.mark.timeout(120)
def test_run_local_puts_the_parents_sigterm_handler_back():
    before = signal.getsignal(signal.SIGTERM)
    assert run_local(_no_stop, 1, graceful=True) == [(0, True)]
    assert signal.getsignal(signal.SIGTERM) == before


def test_exit_status_is_128_plus_the_stopping_signal():
    assert exit_status(None) == 0 and exit_status({"stopped_at_step": None}) == 0
    assert exit_status({"stopped_at_step": 4, "stop_signal": "SIGTERM"}) == 143
    assert exit_status({"stopped_at_step": 4, "stop_signal": "SIGINT"}) == 130
    assert exit_status({"stopped_at_step": 4}) == 130        # a summary from before stop_signal existed


def _wait_for_steps(proc: subprocess.Popen, seen: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for line in proc.stderr:            # per-step lines on stderr (no terminal: no progress bar)
        seen.append(line)
        if line.startswith("step "):
            return
        assert time.monotonic() < deadline, "".join(seen)
    raise AssertionError("no step was printed:\n" + "".join(seen))


def _check_stopped(doc: dict, tmp_path: Path) -> int:
    stopped = doc["stopped_at_step"]
    assert 1 <= stopped < 100000 and doc["stop_signal"] == "SIGTERM"
    assert len(doc["losses"]) == stopped
    ckpt = Path(doc["checkpoints"][-1])
    assert ckpt.name == f"step-{stopped:08d}.pt"
    state = torch.load(ckpt if ckpt.is_absolute() else tmp_path / ckpt, weights_only=False)
    assert state["step"] == stopped
    return stopped


@pytest.mark.timeout(90)
def test_sigterm_to_autopar_train_stops_after_a_step_and_leaves_a_checkpoint(tmp_path):
    """SIGTERM to the parent alone (as `docker stop` or a pod without torchrun): it forwards it to
    its ranks, which finish the step, agree, checkpoint and stop; the JSON summary says where."""
    proc = subprocess.Popen([*AUTOPAR, "train", *LENET_ARGS, "--nproc", "2", "--steps", "100000",
                             "--checkpoint-dir", "ck", "--json"], cwd=tmp_path, env=_env(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[str] = []
    try:
        _wait_for_steps(proc, seen)
        proc.send_signal(signal.SIGTERM)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads(stdout)
    stopped = _check_stopped(doc, tmp_path)
    assert "stopped by SIGTERM after step" in format_summary(doc)
    # what the restarted pod runs: it resumes from that checkpoint
    again = train_main(model="lenet", model_options=LENET, nproc=2, steps=stopped + 2,
                       checkpoint_dir=str(tmp_path / "ck"), resume_if_present=True, log=False)
    assert again["resumed_from_step"] == stopped and len(again["losses"]) == 2
    # `autopar train` exits 128 + 15 = 143 after a SIGTERM stop
    assert exit_status(doc) == 143
    assert proc.returncode == 143, "".join(seen) + rest


@pytest.mark.timeout(120)
@pytest.mark.distributed
def test_sigterm_to_torchrun_is_forwarded_to_the_workers_which_stop_after_a_step(tmp_path):
    """A trainer pod's PID 1 is torchrun: it forwards SIGTERM to its workers (and then exits
    non-zero itself, whatever they do); the workers stop gracefully and rank 0 checkpoints."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                             "-m", "autopar.cli", "train", *LENET_ARGS, "--steps", "100000",
                             "--checkpoint-dir", "ck", "--resume-if-present", "--json"],
                            cwd=tmp_path, env=_env(tmp_path), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    seen: list[str] = []
    try:
        _wait_for_steps(proc, seen, timeout=90)
        proc.send_signal(signal.SIGTERM)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads(stdout[stdout.index("{"):])
    assert doc["resumed_from_step"] is None and doc["nproc"] == 2
    _check_stopped(doc, tmp_path)
