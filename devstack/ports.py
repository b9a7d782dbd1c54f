"""Free loopback ports for the services the dev stack and the tests start (never assume 5432 or 7233).

A port is picked below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`): the kernel gives ports of that
range to outgoing connections as their source ports, so a port picked there could be taken by any client's
connection in the second a supervised part is down, and its restart on the same port (every address in
context.json stays valid) would fail. Below the range, only a program that binds it on purpose can take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: the well-known and registered ports services are configured with (5432, 7233, 8080, ...)


def _ephemeral_floor() -> int | None:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port with a connection lingering on it is skipped
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback port nothing is bound to, below the ephemeral range where there is room (else one the kernel
    picks)."""
    floor = _ephemeral_floor()
    if floor is not None and floor - LOWEST >= 1000:
        for _ in range(100):
            port = random.randrange(LOWEST, floor)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
