"""The session's control plane (`cluster.ControlPlane`), built from Go modules on first use.

Every test in this folder is marked ``controlplane``.  Without a Go toolchain they skip with one
line saying what to install — except under CI (``CI=true``), where a missing toolchain fails, so a
CI run can never pass by skipping them.  A failing test shows the tail of every component's log.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from .cluster import ControlPlane

HERE = Path(__file__).resolve().parent
_NAMESPACES = itertools.count()
ROOT = HERE.parents[1]
CRD = ROOT / "crds" / "paralleltrainingjobs.autopar.dev.yaml"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.controlplane)


@pytest.fixture(scope="session")
def controlplane_binaries() -> dict[str, Path]:
    from .build import GoNotFoundError, ensure_binaries, kwok_stages
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
    bins = {k: v for k, v in controlplane_binaries.items() if k != "kwok-stages"}
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane"), bins,
                         kwok_stages=controlplane_binaries["kwok-stages"])
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
