"""Fast checks of build.py: pins agree with the go.mod files, the cache is reused,
and a missing Go toolchain gives GoNotFoundError.  Nothing here compiles Go."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.controlplane import build


@pytest.mark.parametrize("name", sorted(build.COMPONENTS))
def test_build_py_pins_match_go_mod(name):
    build._check_pins(build.COMPONENTS[name])  # raises on drift


def test_k8s_module_replaces_every_staging_module_it_requires():
    requires, replaces = build._gomod_versions(build.HERE / "k8s" / "go.mod")
    staging = {m for m, v in requires.items() if m.startswith("k8s.io/") and v == "v0.0.0"}
    assert staging <= set(replaces), sorted(staging - set(replaces))
    assert set(replaces.values()) == {build.KUBERNETES_STAGING_VERSION}


def test_cached_binaries_are_reused_without_go(tmp_path, monkeypatch):
    for name in build.COMPONENTS:
        p = build.binary_path(name, tmp_path)
        p.parent.mkdir(parents=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "")  # no go: must not be needed
    got = build.ensure_binaries(tmp_path)
    assert got == {n: build.binary_path(n, tmp_path) for n in build.COMPONENTS}
    assert got["etcd"] == tmp_path / f"etcd-{build.ETCD_VERSION}" / "etcd"


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPAR_CONTROLPLANE_CACHE", str(tmp_path))
    assert build.default_cache_dir() == tmp_path
    assert build.binary_path("kwok") == tmp_path / f"kwok-{build.KWOK_VERSION}" / "kwok"


def test_missing_go_raises_go_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # empty dir: no go
    with pytest.raises(build.GoNotFoundError, match=r"Go >= 1\.26"):
        build.ensure_binaries(tmp_path / "cache", ["kwok"])


def test_old_go_raises_go_not_found(tmp_path, monkeypatch):
    fake = tmp_path / "go"
    fake.write_text("#!/bin/sh\necho go1.22.5\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    with pytest.raises(build.GoNotFoundError, match=r"go1\.22\.5.*Go >= 1\.26"):
        build.ensure_binaries(tmp_path / "cache", ["kwok"])


def test_failed_build_names_binary_command_and_output(tmp_path, monkeypatch):
    fake = tmp_path / "go"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = env ]; then echo go1.26.8; exit 0; fi\n'
        'echo "pkg/foo.go:1: undefined: bar"; exit 2\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    with pytest.raises(build.ControlPlaneBuildError) as ei:
        build.ensure_binaries(tmp_path / "cache", ["kube-scheduler"])
    msg = str(ei.value)
    assert "kube-scheduler" in msg and "go build -trimpath" in msg and "undefined: bar" in msg
    d = Path(tmp_path / "cache" / f"kube-scheduler-{build.KUBERNETES_VERSION}")
    assert not any(p.name.endswith(".tmp") for p in d.iterdir())  # temp file cleaned


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (reads the kwok module)")
def test_kwok_stages_are_kwoks_default_stages(tmp_path):
    import yaml

    path = build.kwok_stages(tmp_path)
    assert path == tmp_path / f"kwok-{build.KWOK_VERSION}" / "stages.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    assert {d["kind"] for d in docs} == {"Stage"}
    assert [d["metadata"]["name"] for d in docs] == [
        "node-initialize", "node-heartbeat", "pod-ready", "pod-complete", "pod-delete"]
    assert build.kwok_stages(tmp_path) == path  # second call: the cached copy


def test_cached_binaries_report_the_pinned_versions():
    """Runs only where build.py has already built everything (it never builds here)."""
    paths = {n: build.binary_path(n) for n in build.COMPONENTS}
    if not all(os.access(p, os.X_OK) for p in paths.values()):
        pytest.skip("control-plane binaries not built yet: python tests/controlplane/build.py")
    expected = {
        "etcd": f"etcd Version: {build.ETCD_VERSION.lstrip('v')}",
        "kube-apiserver": f"Kubernetes {build.KUBERNETES_VERSION}",
        "kube-controller-manager": f"Kubernetes {build.KUBERNETES_VERSION}",
        "kube-scheduler": f"Kubernetes {build.KUBERNETES_VERSION}",
        "kubectl": f"Client Version: {build.KUBERNETES_VERSION}",
        "kwok": build.KWOK_VERSION.lstrip("v"),
    }
    for name, path in paths.items():
        out = build._version_output(path)
        assert expected[name] in out, (name, out)
