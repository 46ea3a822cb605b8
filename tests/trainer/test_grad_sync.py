"""`GradSync.finish`: the step's all-reduces are waited for with gloo's network threads yielding."""

from __future__ import annotations

import contextlib

import torch

import autopar.trainer.sync as sync_mod
from autopar.trainer.sync import GradSync


def test_the_step_waits_for_its_all_reduces_inside_one_own_gloo_call(monkeypatch):
    events: list[str] = []

    @contextlib.contextmanager
    def recording():
        events.append("enter")
        yield
        events.append("exit")

    class Work:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait(self) -> None:
            events.append(f"wait {self.name}")

    monkeypatch.setattr(sync_mod, "own_gloo_call", recording)
    gs = GradSync.__new__(GradSync)   # only the waiting is under test: no plan, no process group
    gs._advance = lambda: events.append("advance")
    gs._inflight = [(Work("a"), None, torch.zeros(1), True), (Work("b"), None, torch.zeros(1), True)]
    gs._fired, gs._ready = {}, set()
    gs.finish()
    assert events == ["advance", "enter", "wait a", "wait b", "exit"]
    assert gs._inflight == [] and gs._floor is None and gs._next == 0
