"""A control plane starts from its binaries, serves, and stops without leaving a process or a
listening port behind (a second one, beside the session's)."""

from __future__ import annotations

import os
import socket

from .cluster import ControlPlane


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_serve_and_stop_cleanly(controlplane_binaries, tmp_path):
    bins = {k: v for k, v in controlplane_binaries.items() if k != "kwok-stages"}
    plane = ControlPlane(tmp_path, bins, kwok_stages=controlplane_binaries["kwok-stages"])
    plane.start()
    try:
        assert all(plane.alive().values()), plane.alive()
        assert set(plane.procs) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
        raw = plane.kubectl("get", "--raw", "/version").stdout
        assert '"gitVersion": "v1.37.2"' in raw
        pids = [p.pid for p in plane.procs.values()]
        ports = [plane.etcd_port, plane.etcd_peer_port, plane.api_port]
        assert all(_listening(p) for p in ports)
    finally:
        plane.stop()
    assert not any(_alive(pid) for pid in pids), "a component outlived stop()"
    assert not any(_listening(p) for p in ports), "a port is still open after stop()"
    assert all((tmp_path / f"{name}.log").exists() for name in plane.procs)
