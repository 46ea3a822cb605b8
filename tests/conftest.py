"""Fixtures shared by every test folder: a profile cache of the session's own, and the session's
real control plane (tests/controlplane).

`controlplane` is one `ControlPlane` per test session, whichever folders use it (the control-plane
tests and the operator's); `crd_installed` adds the ParallelTrainingJob CRD (KWOK plays
every pod except those labelled ``autopar.dev/job``: a test's `tests.controlplane.podrunner.PodRunner`
runs those as local processes); `namespace` gives a
test a fresh namespace.  The binaries are built from Go modules on first use
(`tests/controlplane/build.py`).  Without a Go toolchain the tests that need them skip with one
line saying what to install — except under CI (``CI=true``), where that fails, so a CI run can
never pass by skipping them.  A failing test that used the control plane shows the tail of every
component's log.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from tests.controlplane.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "paralleltrainingjobs.autopar.dev.yaml"
_NAMESPACES = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def _own_profile_cache(tmp_path_factory):
    """Every test, and every process it starts, reads and writes a profile cache of the session's
    own (``$AUTOPAR_CACHE_DIR``), never the one in the home directory: a developer's cache from
    an older autopar makes commands print a notice first, and its op times would make simulated
    numbers depend on the machine's history."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPAR_CACHE_DIR", str(tmp_path_factory.mktemp("autopar-cache")))
        yield


@pytest.fixture(scope="session")
def controlplane_binaries() -> dict[str, Path]:
    from tests.controlplane.build import GoNotFoundError, ensure_binaries, kwok_stages
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    try:
        binaries = dict(ensure_binaries())
        binaries["kwok-stages"] = kwok_stages()
    except GoNotFoundError as e:
        if ci:
            pytest.fail(f"CI must run the control-plane tests: {e}")
        pytest.skip(f"control-plane tests need Go: {e}")
    return binaries


@pytest.fixture(scope="session")
def controlplane(controlplane_binaries, tmp_path_factory):
    from tests.controlplane.podrunner import kwok_stages_without_autopar_pods
    bins = {k: v for k, v in controlplane_binaries.items() if k != "kwok-stages"}
    workdir = tmp_path_factory.mktemp("controlplane")
    # KWOK plays every pod but autopar's, which a test's PodRunner runs as local processes
    stages = kwok_stages_without_autopar_pods(controlplane_binaries["kwok-stages"], workdir / "kwok-stages.yaml")
    plane = ControlPlane(workdir, bins, kwok_stages=stages)
    plane.start()
    sys.stderr.write(f"\ncontrol plane up in {plane.startup_seconds['total']:.1f} s ({plane.server})\n")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def crd_installed(controlplane):
    controlplane.kubectl("apply", "-f", str(CRD))
    controlplane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                         "crd/paralleltrainingjobs.autopar.dev")
    return controlplane


@pytest.fixture
def namespace(controlplane, request):
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:48].strip("-")
    name = f"t{next(_NAMESPACES)}-{stem}".rstrip("-")
    controlplane.kubectl("create", "namespace", name)
    controlplane.wait_for(f"service account default in {name}", lambda: controlplane.kubectl(
        "get", "serviceaccount", "default", "-n", name, check=False).returncode == 0)
    yield name
    controlplane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    plane = item.funcargs.get("controlplane") if hasattr(item, "funcargs") else None
    if plane is None:
        plane = next((v for v in getattr(item, "funcargs", {}).values() if isinstance(v, ControlPlane)), None)
    if report.failed and isinstance(plane, ControlPlane):
        report.sections.append(("control plane logs", plane.log_tails(40)))
