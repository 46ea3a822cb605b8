"""Fixtures of the chart tests: the tools, built once (tests/controlplane/build.py)."""

from __future__ import annotations

import pytest

from tests.chart.render import tool


@pytest.fixture(scope="session")
def helm():
    return tool("helm")


@pytest.fixture(scope="session")
def promtool():
    return tool("promtool")


@pytest.fixture(scope="session")
def dashboard_check():
    return tool("dashboard-check")
