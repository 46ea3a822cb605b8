"""The operator's memory between ticks (`operator.handlers`): what it created a moment ago
(`RecentCreates`) and what it last wrote to a job's status (`StatusWrites`), with a fake clock."""

from __future__ import annotations

from autopar.operator.handlers import RecentCreates, StatusWrites


def test_recent_creates_are_not_sent_twice_until_seen_or_stale():
    """What the operator created is not POSTed again by a tick that runs before the watch brings
    it into the index; once the index shows it, or after the ttl, it is forgotten."""
    now = [0.0]
    recent = RecentCreates(ttl=15.0, clock=lambda: now[0])
    recent.remember("uid", "Pod", "a-trainer-0")
    assert recent.fresh("uid", "Pod", "a-trainer-0") and not recent.fresh("uid", "Pod", "a-trainer-1")
    recent.seen("uid", "Pod", ["a-trainer-0"])
    assert not recent.fresh("uid", "Pod", "a-trainer-0")      # gone later: the next create is sent
    recent.remember("uid", "Role", "a-planner")
    now[0] = 15.0
    assert not recent.fresh("uid", "Role", "a-planner")       # stale: a restarted job's objects get made
    recent.remember("uid", "Role", "a-planner")
    recent.forget_job("uid")
    assert len(recent) == 0


def test_a_tick_waits_for_the_watch_to_bring_its_last_status_write():
    """kopf hands a timer the body its watch last delivered: a tick that still sees the status from
    before the previous tick's patch must not decide again (a gang failure counted twice)."""
    now = [0.0]
    writes = StatusWrites(timeout=10.0, clock=lambda: now[0])
    before = {"phase": "Training", "restarts": 0, "simulatedStepSeconds": 0.05}
    assert not writes.lagging("uid", before)                           # nothing written yet
    writes.wrote("uid", {"restarts": 1, "phase": "Training", "conditions": [], "message": "x"})
    assert writes.lagging("uid", before)
    assert not writes.lagging("other", before)
    now[0] = 3.0
    assert not writes.lagging("uid", {**before, "restarts": 1})        # the watch brought it
    assert not writes.lagging("uid", before)                           # and it is forgotten
    writes.wrote("uid", {"planHash": None, "phase": "Planning"})       # a removed field reads as absent
    assert not writes.lagging("uid", {"phase": "Planning"})
    writes.wrote("uid", {"message": "only fields no decision rests on"})
    assert not writes.lagging("uid", before)
    writes.wrote("uid", {"replans": 2})
    now[0] = 13.0
    assert not writes.lagging("uid", before)                           # a patch that never landed
    writes.wrote("uid", {"replans": 2})
    writes.forget("uid")
    assert not writes.lagging("uid", before)
