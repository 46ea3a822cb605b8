"""The profile cache file and its task keys."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.cost.profile_cache import (CACHE_ENV, ProfileCache, default_cache_path, task_key,
                                                task_shapes)
from autopar.planner.errors import CostModelError

from ._cost_graphs import conv, linear, pointwise


def _conv(name="c", n=8, c=16, hw=32, cout=32, k=3, stride=1):
    return conv(name, "x", (n, c, hw, hw), cout, k, stride, k // 2), ((n, c, hw, hw),)


# -- the file ----------------------------------------------------------------------------------------

def test_save_then_load_gives_the_same_entries(tmp_path):
    path = tmp_path / "sub" / "profile.json"
    cache = ProfileCache({"a|k": (1e-4, 2e-4)})
    cache.put("b|k", 3.5e-6, 0.0)
    assert cache.save(path) == path
    back = ProfileCache.load(path)
    assert dict(back.items()) == {"a|k": (1e-4, 2e-4), "b|k": (3.5e-6, 0.0)}
    assert back.get("a|k") == (1e-4, 2e-4) and back.get("missing") is None
    assert back.path == path and len(back) == 2 and "b|k" in back


def test_gpu_entries_keep_the_hosts_issuing_time_beside_the_kernels(tmp_path):
    """A GPU's task has two times: its kernels' on the device and its host's issuing them."""
    from autopar.planner.cost import CostModel
    from autopar.planner.hardware import get_preset
    path = tmp_path / "profile.json"
    cache = ProfileCache()
    cache.put("g|k", 5e-6, 9e-6, host=(3e-5, 4.5e-5))
    cache.put("c|k", 1e-4, 2e-4)
    cache.save(path)
    assert json.loads(path.read_text())["entries"]["g|k"]["host"] == [3e-5, 4.5e-5]
    back = ProfileCache.load(path)
    assert back.get("g|k") == (5e-6, 9e-6) and back.host("g|k") == (3e-5, 4.5e-5) and back.host("c|k") is None
    back.put("g|k", 6e-6, 9e-6)            # measured again without a host time: none is kept
    assert back.host("g|k") is None
    with pytest.raises(CostModelError, match="host"):
        back.put("g|k", 1e-6, 1e-6, host=(float("nan"), 0.0))
    # The cost model hands the host's time on with the estimate.
    op, shapes = _conv()
    dev = get_preset("p100-1x4").devices[0]
    key = task_key(op, (1, 1, 1, 1), dev.product, shapes)
    cache.put(key, 1e-5, 2e-5, host=(4e-5, 6e-5))
    est = CostModel(cache).task_cost(op, (1, 1, 1, 1), dev, shapes)
    assert (est.forward, est.backward, est.host, est.source) == (1e-5, 2e-5, (4e-5, 6e-5), "profile")


def test_a_missing_file_is_an_empty_cache_that_saves_there(tmp_path):
    path = tmp_path / "none.json"
    cache = ProfileCache.load(path)
    assert len(cache) == 0
    cache.put("k", 1.0, 2.0)
    cache.save()
    assert ProfileCache.load(path).get("k") == (1.0, 2.0)


@pytest.mark.parametrize("content,detail", [
    ("{not json", "entries|version|json"),
    ('{"version": 1}', "entries"),
    ('{"version": 1, "entries": {"k": {"forward": "fast", "backward": 1}}}', "forward"),
    ('{"version": 1, "entries": {"k": {"forward": -1, "backward": 1}}}', "forward"),
    ('{"version": 1, "entries": {"k": [1, 2]}}', "entries"),
    ('{"version": 99, "entries": {}}', "version 99"),
])
def test_a_corrupt_file_names_itself_and_says_what_to_do(tmp_path, content, detail):
    path = tmp_path / "profile.json"
    path.write_text(content)
    with pytest.raises(CostModelError) as err:
        ProfileCache.load(path)
    msg = str(err.value)
    assert str(path) in msg and "delete it" in msg and "autopar profile" in msg
    assert any(d in msg.lower() for d in detail.split("|"))


def test_measurements_taken_the_old_way_are_dropped_with_a_notice(tmp_path):
    """A file an older autopar wrote (no measurement method: method 1) keeps its format but its
    numbers were taken another way: they are dropped, said so, and measured again."""
    from autopar.planner.cost.profile_cache import MEASUREMENT_METHOD
    path = tmp_path / "profile.json"
    path.write_text('{"version": 1, "entries": {"k": {"forward": 1e-3, "backward": 2e-3}}}')
    cache = ProfileCache.load(path)
    assert len(cache) == 0 and cache.calibrations() == [] and cache.path == path
    assert "1 op times" in cache.notice and f"now {MEASUREMENT_METHOD}" in cache.notice and str(path) in cache.notice
    cache.put("k", 1.0, 2.0)
    cache.save()
    assert json.loads(path.read_text())["method"] == MEASUREMENT_METHOD
    again = ProfileCache.load(path)
    assert again.get("k") == (1.0, 2.0) and again.notice is None


def test_a_kept_file_from_before_host_keys_is_read_as_its_workers_measured_it(tmp_path):
    """A file of method 6 keyed CPU op times by the product alone, whatever the number of workers
    that measured them side by side.  Replayed (`keep_stale`, as `trainer.rescore` does) with the
    number of workers its run had, its CPU keys say it, back-to-back and cold ones too; a GPU's keys
    and the op part of every key stay as they were.  Without the number they stay as written, and a
    planning load drops them all (they are measured again, with the number in their keys)."""
    path = tmp_path / "profile.json"
    entries = {"CPU-core|linear|a": 1e-3, "CPU-core (back to back)|linear|a": 5e-4,
               "CPU-core (last level cold)|linear|a": 2e-3, "H100-SXM5-80GB|linear|a": 1e-5}
    path.write_text(json.dumps({"version": 1, "method": 6,
                                "entries": {k: {"forward": f, "backward": 2 * f} for k, f in entries.items()}}))
    kept = ProfileCache.load(path, keep_stale=True, host_workers=2)
    assert dict(kept.items()) == {
        "CPU-core (2 per host)|linear|a": (1e-3, 2e-3), "CPU-core (2 per host) (back to back)|linear|a": (5e-4, 1e-3),
        "CPU-core (2 per host) (last level cold)|linear|a": (2e-3, 4e-3), "H100-SXM5-80GB|linear|a": (1e-5, 2e-5)}
    assert set(ProfileCache.load(path, keep_stale=True)) == set(entries)
    assert set(ProfileCache.load(path, keep_stale=True, host_workers=1)) == set(entries)
    assert len(ProfileCache.load(path, host_workers=2)) == 0


def test_host_kind_names_the_workers_side_by_side_on_a_cpu_host():
    """``local:1`` keys its CPU op times by the product alone, ``local:N`` by the product and N; a
    GPU's by its product, however many share a node."""
    from autopar.planner.cost.profile_cache import host_kind, kind_of
    from autopar.planner.hardware import get_preset
    assert host_kind("CPU-core", 1) == "CPU-core" and host_kind("CPU-core", 4) == "CPU-core (4 per host)"
    assert [kind_of(d) for d in get_preset("local:1").devices] == ["CPU-core"]
    assert {kind_of(d) for d in get_preset("local:2").devices} == {"CPU-core (2 per host)"}
    assert {kind_of(d) for d in get_preset("dgx-h100").devices} == {"H100-SXM5-80GB"}


def test_save_is_atomic_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    ProfileCache({"old": (1.0, 1.0)}).save(path)
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        ProfileCache({"new": (2.0, 2.0)}).save(path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary left behind


def test_save_writes_through_a_temporary_in_the_same_directory(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append((os.path.dirname(src), os.fspath(dst)))
        assert json.loads(open(src).read())["entries"]["k"] == {"forward": 1.0, "backward": 2.0}
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    ProfileCache({"k": (1.0, 2.0)}).save(path)
    assert seen == [(str(tmp_path), str(path))]


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    assert default_cache_path() == tmp_path / "c" / "profile.json"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_path() == tmp_path / "home" / ".cache" / "autopar" / "profile.json"


@pytest.mark.parametrize("fwd,bwd", [(-1.0, 1.0), (1.0, float("nan")), (float("inf"), 1.0)])
def test_put_rejects_times_that_are_not_finite_and_non_negative(fwd, bwd):
    with pytest.raises(CostModelError, match="finite and non-negative"):
        ProfileCache().put("k", fwd, bwd)


# -- keys --------------------------------------------------------------------------------------------

def test_key_is_stable_and_ignores_op_names():
    a, shapes = _conv("a")
    b, _ = _conv("b")
    assert task_key(a, (2, 1, 1, 1), "P100-SXM2-16GB", shapes) == task_key(a, (2, 1, 1, 1), "P100-SXM2-16GB", shapes)
    assert task_key(a, (2, 1, 1, 1), "P100-SXM2-16GB", shapes) == task_key(b, (2, 1, 1, 1), "P100-SXM2-16GB", shapes)


@pytest.mark.parametrize("other", [
    lambda: (_conv(n=16), (2, 1, 1, 1), "P100"),          # different input and output shards
    lambda: (_conv(), (4, 1, 1, 1), "P100"),              # different degrees -> different shards
    lambda: (_conv(), (1, 2, 1, 1), "P100"),              # parameter split: different weight shard
    lambda: (_conv(), (2, 1, 1, 1), "V100"),              # different device product
    lambda: (_conv(k=5), (2, 1, 1, 1), "P100"),           # different weight shape and padding
    lambda: ((dataclasses.replace(_conv()[0], kind="conv_transpose2d"), _conv()[1]), (2, 1, 1, 1), "P100"),
])
def test_key_changes_with_what_decides_the_time(other):
    base_op, base_shapes = _conv()
    (op, shapes), degrees, dev = other()
    assert task_key(op, degrees, dev, shapes) != task_key(base_op, (2, 1, 1, 1), "P100", base_shapes)


def test_key_changes_with_attributes():
    op, shapes = _conv()
    other = dataclasses.replace(op, attrs=op.attrs + (("groups", 4),))
    assert task_key(op, (1, 1, 1, 1), "P", shapes) != task_key(other, (1, 1, 1, 1), "P", shapes)


def test_same_shard_from_different_ops_shares_a_key():
    """FlexFlow sec. 5.1: same op type and sizes reuse a measurement (unrolled or repeated layers)."""
    r1 = pointwise("r1", "relu", ["x"], (8, 16, 8, 8))
    r2 = pointwise("r2", "relu", ["y"], (16, 16, 8, 8))
    assert task_key(r1, (1, 1, 1, 1), "P", ((8, 16, 8, 8),)) == task_key(r2, (2, 1, 1, 1), "P", ((16, 16, 8, 8),))


def test_attribute_split_shapes_include_the_halo_of_an_interior_task():
    op, shapes = _conv(hw=32)
    ins, outs, params = task_shapes(op, (1, 1, 4, 1), shapes)
    assert outs == ((8, 32, 8, 32),)
    assert ins == ((8, 16, 10, 32),)  # 8 rows plus one halo row on each side
    assert params == ((32, 16, 3, 3),)


def test_parameter_split_shards_the_weight():
    op = linear("fc", "x", 8, 64, 128)
    _, outs, params = task_shapes(op, (1, 4), ((8, 64),))
    assert outs == ((8, 32),) and params == ((32, 64), (32,))


@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from([2, 4, 8]), c=st.integers(1, 8), hw=st.sampled_from([8, 12, 16]),
       cout=st.integers(1, 8), k=st.sampled_from([1, 3]), dn=st.sampled_from([1, 2]), dh=st.sampled_from([1, 2, 4]))
def test_keys_are_equal_exactly_when_shard_shapes_are(n, c, hw, cout, k, dn, dh):
    a, sa = _conv(n=n, c=c, hw=hw, cout=cout, k=k)
    b, sb = _conv(n=8, c=4, hw=16, cout=4, k=3)
    same_shapes = task_shapes(a, (dn, 1, dh, 1), sa) == task_shapes(b, (2, 1, 2, 1), sb)
    same_attrs = a.attrs == b.attrs
    assert (task_key(a, (dn, 1, dh, 1), "P", sa) == task_key(b, (2, 1, 2, 1), "P", sb)) == (same_shapes and same_attrs)


_KEY_SCRIPT = """
import dataclasses, torch
from tests.planner.cost._cost_graphs import conv
from autopar.planner.cost.profile_cache import task_key
op = conv("c", "x", (8, 16, 32, 32), 32, 3, 1, 1)
op = dataclasses.replace(op, attrs=op.attrs + (("fn", torch.relu), ("how", "module"), ("mod", torch.nn.Conv2d(16, 32, 3)),
                                                  ("obj", object())))
print(task_key(op, (2, 1, 1, 1), "P100", ((8, 16, 32, 32),)))
"""


def test_keys_with_functions_and_modules_in_attrs_are_the_same_in_another_process():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[3]
    theirs = subprocess.run([sys.executable, "-c", _KEY_SCRIPT], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    ours = io.StringIO()
    with contextlib.redirect_stdout(ours):
        exec(_KEY_SCRIPT, {})
    keys = [theirs, ours.getvalue().strip()]
    assert keys[0] == keys[1]
    assert "0x" not in keys[0] and "relu" in keys[0] and "Conv2d(16, 32, kernel_size=(3, 3)" in keys[0]


def test_a_calibration_measured_before_staging_was_timed_is_dropped_but_the_op_times_stay(tmp_path):
    """A measured calibration of ranks that exchange messages, without staging curves, would leave
    the simulator without that cost: it is dropped with a notice and measured again; the op times
    of the same file and a default calibration stay."""
    from autopar.planner.cost import default_calibration
    from autopar.planner.cost.profile_cache import MEASUREMENT_METHOD
    old = default_calibration("CPU-core", "gloo", 2).to_json()
    old.update(source="measured")
    del old["staging"]
    one = {**old, "world": 1}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "method": MEASUREMENT_METHOD,
                                "entries": {"k": {"forward": 1e-3, "backward": 2e-3}},
                                "calibrations": {"CPU-core|gloo|2": old, "CPU-core|gloo|1": one}}))
    cache = ProfileCache.load(path)
    assert cache.get("k") == (1e-3, 2e-3)
    assert cache.calibration("CPU-core", "gloo", 2) is None
    assert cache.calibration("CPU-core", "gloo", 1) is not None     # one rank stages nothing
    assert "CPU-core|gloo|2" in cache.notice and "older autopar" in cache.notice and "op times are kept" in cache.notice


def test_a_calibration_measured_by_an_older_method_is_dropped_but_the_op_times_stay(tmp_path):
    """A measured calibration from before `CALIBRATION_METHOD` (its per-task overheads timed on
    warm chains, no engine start-up apart) is measured again; a current one and a default one stay."""
    from autopar.planner.cost import default_calibration
    from autopar.planner.cost.calibration import CALIBRATION_METHOD
    from autopar.planner.cost.profile_cache import MEASUREMENT_METHOD
    current = {**default_calibration("CPU-core", "gloo", 2).to_json(), "source": "measured"}
    assert current["method"] == CALIBRATION_METHOD
    old = {**current, "world": 3}
    del old["method"], old["bwd_call_s"]
    default = {**default_calibration("CPU-core", "gloo", 4).to_json(), "method": 1}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "method": MEASUREMENT_METHOD,
                                "entries": {"k": {"forward": 1e-3, "backward": 2e-3}},
                                "calibrations": {"CPU-core|gloo|2": current, "CPU-core|gloo|3": old,
                                                 "CPU-core|gloo|4": default}}))
    cache = ProfileCache.load(path)
    assert cache.get("k") == (1e-3, 2e-3)
    assert cache.calibration("CPU-core", "gloo", 3) is None
    kept = cache.calibration("CPU-core", "gloo", 2)
    assert kept is not None and kept.bwd_call_s == current["bwd_call_s"] > 0
    assert cache.calibration("CPU-core", "gloo", 4) is not None
    assert "CPU-core|gloo|3" in cache.notice and "|2" not in cache.notice and "|4" not in cache.notice


# -- the runtime's work per task in a model's own steps ------------------------------------------

def _measured(world=2, method=None):
    from autopar.planner.cost import default_calibration
    cal = dataclasses.replace(default_calibration("CPU-core", "gloo", world), source="measured")
    return cal if method is None else dataclasses.replace(cal, method=method)


def test_a_models_overheads_are_kept_by_calibration_and_graph_and_saved(tmp_path):
    cache = ProfileCache()
    two, one = _measured(2), _measured(1)
    cache.put_calibration(two)
    cache.put_calibration(one)
    cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12)
    assert cache.overheads(two, "sha256:aa") == (30e-6, 40e-6, 12)
    assert cache.overheads(two, "sha256:bb") is None and cache.overheads(one, "sha256:aa") is None
    back = ProfileCache.load(cache.save(tmp_path / "profile.json"))
    assert back.overheads(two, "sha256:aa") == (30e-6, 40e-6, 12)
    other = ProfileCache()
    other.put_runtime_of(back)
    assert other.overheads(two, "sha256:aa") == (30e-6, 40e-6, 12) and len(other.calibrations()) == 2
    # With the seconds of an exchange call that moves nothing, forward and backward; measured again
    # without them (an older autopar's measurement), they go.
    assert cache.exchange_overheads(two, "sha256:aa") is None
    cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12, exchange=(9e-6, 15e-6))
    back = ProfileCache.load(cache.save(tmp_path / "profile.json"))
    assert back.exchange_overheads(two, "sha256:aa") == (9e-6, 15e-6)
    other.put_runtime_of(back)
    assert other.exchange_overheads(two, "sha256:aa") == (9e-6, 15e-6)
    cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12)
    assert cache.exchange_overheads(two, "sha256:aa") is None
    other.put_runtime_of(cache)
    assert other.exchange_overheads(two, "sha256:aa") is None


def test_what_a_models_all_reduces_add_to_its_step_is_kept_with_its_overheads(tmp_path):
    cache = ProfileCache()
    two = _measured(2)
    cache.put_calibration(two)
    cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12)
    assert cache.allreduce_in_step(two, "sha256:aa") is None              # not measured
    cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12, allreduce_in_step=1.8)
    back = ProfileCache.load(cache.save(tmp_path / "profile.json"))
    assert back.allreduce_in_step(two, "sha256:aa") == 1.8 and back.allreduce_in_step(two, "sha256:bb") is None
    other = ProfileCache()
    other.put_runtime_of(back)
    assert other.allreduce_in_step(two, "sha256:aa") == 1.8
    cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12)               # measured again without it
    other.put_runtime_of(cache)
    assert cache.allreduce_in_step(two, "sha256:aa") is None and other.allreduce_in_step(two, "sha256:aa") is None
    for bad in (-0.5, float("nan")):
        with pytest.raises(CostModelError, match="what the all-reduces add to a step must be a finite, non-negative"):
            cache.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12, allreduce_in_step=bad)
    doc = json.loads((tmp_path / "profile.json").read_text())
    doc["overheads"]["CPU-core|gloo|2|fp=sha256:aa"]["allreduce_in_step"] = -1
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match="allreduce_in_step"):
        ProfileCache.load(tmp_path / "profile.json")


def test_a_kept_runs_own_calibration_and_overheads_stay_over_those_it_takes_from_the_profile():
    """`trainer.rescore` prices a kept run with the calibration and the overheads timed between its
    steps, and takes the rest (another model's, another world's) from the run's profile."""
    profile, during = ProfileCache(), ProfileCache()
    two, one = _measured(2), _measured(1)
    timed = dataclasses.replace(two, post_s=1e-3)
    profile.put_calibration(two)
    profile.put_calibration(one)
    profile.put_overheads(two, "sha256:aa", 30e-6, 40e-6, 12, exchange=(9e-6, 15e-6), allreduce_in_step=1.8)
    profile.put_overheads(two, "sha256:bb", 50e-6, 60e-6, 12)
    during.put_calibration(timed)
    during.put_overheads(timed, "sha256:aa", 35e-6, 45e-6, 2, exchange=(10e-6, 16e-6), allreduce_in_step=1.8)
    during.put_runtime_of(profile, keep_own=True)
    assert during.calibration("CPU-core", "gloo", 2).post_s == 1e-3 and len(during.calibrations()) == 2
    assert during.overheads(two, "sha256:aa") == (35e-6, 45e-6, 2)
    assert during.exchange_overheads(two, "sha256:aa") == (10e-6, 16e-6)
    assert during.overheads(two, "sha256:bb") == (50e-6, 60e-6, 12)
    during.put_runtime_of(profile)                      # without keep_own the profile's win
    assert during.calibration("CPU-core", "gloo", 2).post_s == two.post_s
    assert during.overheads(two, "sha256:aa") == (30e-6, 40e-6, 12)
    assert during.exchange_overheads(two, "sha256:aa") == (9e-6, 15e-6)


@pytest.mark.parametrize("exchange", [(1e-6, -1e-6), (float("inf"), 1e-6), (1e-6,), "fast"])
def test_put_overheads_rejects_an_exchange_call_that_is_not_a_measurement(exchange):
    with pytest.raises(CostModelError, match="an exchange call's seconds must be two finite, non-negative numbers"):
        ProfileCache().put_overheads(_measured(), "sha256:aa", 1e-6, 1e-6, 3, exchange=exchange)


@pytest.mark.parametrize("fwd, bwd, steps", [(-1e-6, 1e-6, 3), (1e-6, float("nan"), 3), (1e-6, 1e-6, 0)])
def test_put_overheads_rejects_what_is_not_a_measurement(fwd, bwd, steps):
    with pytest.raises(CostModelError, match="seconds per task must be finite and non-negative"):
        ProfileCache().put_overheads(_measured(), "sha256:aa", fwd, bwd, steps)


def test_a_models_overheads_go_with_a_calibration_measured_again(tmp_path):
    """Overheads stored beside a calibration that is dropped as measured the old way go too (they
    are measured again with it); a file with a negative overhead names the field."""
    from autopar.planner.cost.profile_cache import MEASUREMENT_METHOD
    old = {**_measured().to_json(), "method": 1}
    current = _measured(1).to_json()
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 1, "method": MEASUREMENT_METHOD, "entries": {},
                                "calibrations": {"CPU-core|gloo|2": old, "CPU-core|gloo|1": current},
                                "overheads": {"CPU-core|gloo|2|fp=sha256:aa": {"forward": 1e-5, "backward": 2e-5},
                                              "CPU-core|gloo|1|fp=sha256:aa": {"forward": 3e-5, "backward": 4e-5,
                                                                               "steps": 4}}}))
    cache = ProfileCache.load(path)
    assert cache.overheads(_measured(2), "sha256:aa") is None
    assert cache.overheads(_measured(1), "sha256:aa") == (3e-5, 4e-5, 4)
    path.write_text(json.dumps({"version": 1, "entries": {},
                                "overheads": {"k|fp=x": {"forward": -1.0, "backward": 2e-5}}}))
    with pytest.raises(CostModelError, match=r"corrupt \(overheads.*forward"):
        ProfileCache.load(path)
