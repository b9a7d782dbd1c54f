"""The real-VM prerequisites check asks virtlogd itself, not its socket file: /run can outlive the daemon (a machine
restored from a snapshot), and libvirtd only finds out when a guest starts, failing every start."""

from __future__ import annotations

import socket
from pathlib import Path

from devstack.real_vms import virtlogd_problem


def test_a_socket_file_with_no_one_listening_is_reported_as_virtlogd_not_answering(tmp_path: Path) -> None:
    path = tmp_path / "virtlogd-sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))
    assert path.exists()

    problem = virtlogd_problem(str(path))

    assert problem is not None
    assert problem.startswith(f"virtlogd does not answer at {path} (Connection refused)")


def test_a_listening_socket_is_virtlogd_answering(tmp_path: Path) -> None:
    path = tmp_path / "virtlogd-sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen(1)

        assert virtlogd_problem(str(path)) is None
