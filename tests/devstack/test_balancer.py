"""The loopback balancer of `berth up --api-processes N`: connections to the one address go to each backend in
turn, both ways; a backend that refuses (killed, restarting) is skipped, so a client sees no error while one is
down; with none up, the connection is closed."""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from devstack.balancer import LoopbackBalancer
from devstack.ports import free_port


class Backend:
    """A TCP server on loopback that answers each connection with its name and what it was sent."""

    def __init__(self, name: str, port: int = 0) -> None:
        self.name = name
        self.server = socket.create_server(("127.0.0.1", port))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                sent = connection.recv(1024)
                connection.sendall(f"{self.name}:".encode() + sent)

    def stop(self) -> None:
        if self.server.fileno() == -1:
            return
        with contextlib.suppress(OSError):  # Linux: shutting a listening socket down wakes the accept() it blocks in
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=5)


def ask(port: int, text: str) -> str:
    """What the balancer's address answers; "" when it closes the connection without an answer (it may close before
    the request is even sent, and the kernel then says the connection is reset or not connected)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        try:
            connection.sendall(text.encode())
            connection.shutdown(socket.SHUT_WR)  # the request is whole; the answer may still be coming
            return b"".join(iter(lambda: connection.recv(1024), b"")).decode()
        except (ConnectionResetError, BrokenPipeError):
            return ""
        except OSError as error:
            if error.errno == errno.ENOTCONN:
                return ""
            raise


@pytest.fixture
def backends() -> Iterator[list[Backend]]:
    servers = [Backend("a"), Backend("b")]
    yield servers
    for server in servers:
        server.stop()


def test_connections_take_turns_and_a_refusing_backend_is_skipped(backends: list[Backend]) -> None:
    balancer = LoopbackBalancer(free_port(), [b.port for b in backends]).start()
    try:
        assert [ask(balancer.port, f"q{n}") for n in range(4)] == ["a:q0", "b:q1", "a:q2", "b:q3"]
        backends[0].stop()  # killed: its port refuses
        assert [ask(balancer.port, f"r{n}") for n in range(3)] == ["b:r0", "b:r1", "b:r2"]
        assert balancer.connections == [2, 5]
        backends[1].stop()
        assert ask(balancer.port, "s") == ""  # no API up: closed, as a load balancer with no healthy backend does
    finally:
        balancer.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", balancer.port), timeout=1).close()  # stopped: nothing listens


def test_a_connection_made_while_every_backend_restarts_waits_for_the_first_back() -> None:
    """One API killed while the other restarts: for that moment both refuse. The balancer keeps trying for its
    patience, so the client is answered by the first back rather than shown a closed connection."""
    ports = [free_port(), free_port()]
    balancer = LoopbackBalancer(free_port(), ports, patience=5.0).start()
    late: list[Backend] = []
    timer = threading.Timer(0.5, lambda: late.append(Backend("b", ports[1])))
    try:
        timer.start()
        assert ask(balancer.port, "q") == "b:q"  # asked while nothing listened; answered once b came back
    finally:
        timer.join()
        for backend in late:
            backend.stop()
        balancer.stop()


def test_with_no_backend_up_for_its_patience_the_connection_is_closed() -> None:
    balancer = LoopbackBalancer(free_port(), [free_port()], patience=0.2).start()
    try:
        assert ask(balancer.port, "q") == ""
    finally:
        balancer.stop()


class Dying:
    """A backend killed mid-request: it takes the connection, reads the request, and resets it unanswered (what the
    kernel does to a killed process's connections)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.server.accept()
        connection.recv(1024)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        connection.close()

    def stop(self) -> None:
        self.server.close()
        self.thread.join(timeout=5)


def _closed_by_the_balancer(connection: socket.socket) -> bool:
    """The balancer ended this client's connection: end of stream or a reset, not silence."""
    connection.settimeout(5)
    try:
        return connection.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_stopping_ends_every_connection_and_leaves_no_handler_pending(
    backends: list[Backend], caplog: pytest.LogCaptureFixture
) -> None:
    """`berth up --api-processes 2` stopped with Ctrl-C printed "Task was destroyed but it is pending!" for a
    connection handler: the stack had stopped cleanly, and the message said otherwise. Here, at each stop, one
    connection is piped to a backend that holds it open, one waits for a backend that never comes, and a few arrive
    in the very moment of the stop. Each client sees its connection end, and asyncio reports nothing: no handler was
    left pending when the loop closed, none ended with an error."""
    held = Backend("held")  # waits for a request that does not come: the connection stays piped
    caplog.set_level(logging.WARNING, logger="asyncio")
    try:
        for _ in range(10):
            balancer = LoopbackBalancer(free_port(), [held.port], patience=30).start()
            waiting = LoopbackBalancer(free_port(), [free_port()], patience=30).start()
            clients = [
                socket.create_connection(("127.0.0.1", port), timeout=5) for port in (balancer.port, waiting.port)
            ]
            time.sleep(0.1)  # both handlers running
            clients += [socket.create_connection(("127.0.0.1", port), timeout=5) for port in [waiting.port] * 3]
            balancer.stop()
            waiting.stop()
            try:
                assert all(_closed_by_the_balancer(client) for client in clients)
            finally:
                for client in clients:
                    client.close()
        gc.collect()  # a pending task the loop dropped is reported when it is collected
    finally:
        held.stop()
    assert [record.getMessage() for record in caplog.records] == []


def test_a_backend_dying_mid_request_ends_the_clients_connection() -> None:
    """The client must see its connection end, not wait for an answer that cannot come: the request is kept open
    (no half-close), as an HTTP client keeps it while it waits."""
    dying = Dying()
    balancer = LoopbackBalancer(free_port(), [dying.port]).start()
    try:
        with socket.create_connection(("127.0.0.1", balancer.port), timeout=5) as connection:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: berth\r\n\r\n")
            try:
                answer = connection.recv(1024)  # a timeout (5 s) fails the test: the client was left waiting
            except ConnectionResetError:
                answer = b""
        assert answer == b""
    finally:
        balancer.stop()
        dying.stop()
