"""The ports the dev stack keeps across restarts are outside the kernel's ephemeral range, where no outgoing
connection can be given one as its source port while the part that owns it is down."""

from __future__ import annotations

import socket

from devstack.ports import EPHEMERAL_RANGE, free_port


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(port < low for port in ports), (low, sorted(ports))
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # raises if it was not free
