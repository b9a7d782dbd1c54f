"""A loopback TCP balancer for `berth up --api-processes N`: one address in front of N API processes, as a Service or
a load balancer puts one in front of several replicas. Each connection goes to the next backend in turn; a backend
that refuses (killed, restarting) is skipped for the next one, so clients see no error while one API is down. When
every backend refuses at once (one killed while another restarts, or its port not yet listening) the balancer tries
them again for a moment (`patience`), as a load balancer retries a connect, before closing the client's connection.

It runs in the `berth up` process, on a thread of its own, for as long as the stack runs: it holds no state beyond
the connections it pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading


class LoopbackBalancer:
    def __init__(self, port: int, backends: list[int], patience: float = 2.0) -> None:
        self.port, self.backends, self.patience = port, backends, patience
        self._turn = itertools.cycle(range(len(backends)))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self.connections = [0] * len(backends)  # connections handed to each backend, for tests and logs

    def start(self) -> LoopbackBalancer:
        started = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
            )
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="api-balancer", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise OSError(f"the API balancer could not listen on 127.0.0.1:{self.port}")
        return self

    def stop(self) -> None:
        if self._loop is None or self._server is None:
            return
        loop, server = self._loop, self._server

        async def close() -> None:
            server.close()
            # The connections still piped end with the balancer, as they would with a load balancer switched off.
            piping = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in piping:
                task.cancel()
            await asyncio.gather(*piping, return_exceptions=True)
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:  # every API is down: close, as a load balancer with no healthy backend does
            client_writer.close()
            return
        reader, writer = upstream
        try:
            await asyncio.gather(_pipe(client_reader, writer), _pipe(reader, client_writer))
        finally:
            for end in (writer, client_writer):
                with contextlib.suppress(ConnectionError, OSError):
                    end.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.patience
        while True:
            for _ in range(len(self.backends)):
                index = next(self._turn)
                try:
                    connected = await asyncio.open_connection("127.0.0.1", self.backends[index])
                except OSError:
                    continue  # refused: that API is down or restarting; the next one takes it
                self.connections[index] += 1
                return connected
            if loop.time() >= give_up:
                return None
            await asyncio.sleep(0.05)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until its end, then half-close the other side (the answer may still be coming back). If
    this side fails instead (a backend killed mid-request resets its connection), close the other side outright:
    nothing more can come, and the client must see the connection end, not wait for an answer forever."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        writer.close()
        return
    with contextlib.suppress(ConnectionError, OSError):
        if writer.can_write_eof():
            writer.write_eof()
