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
import functools
import itertools
import threading


class LoopbackBalancer:
    def __init__(self, port: int, backends: list[int], patience: float = 2.0) -> None:
        self.port, self.backends, self.patience = port, backends, patience
        self._turn = itertools.cycle(range(len(backends)))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # each connection's handler, held until it ends
        self.connections = [0] * len(backends)  # connections handed to each backend, for tests and logs

    def start(self) -> LoopbackBalancer:
        started = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
            )
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="api-balancer", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise OSError(f"the API balancer could not listen on 127.0.0.1:{self.port}")
        return self

    def stop(self) -> None:
        """Stop listening, end every connection still piped (as a load balancer switched off does) and close the loop.

        Every connection handler has ended before the loop closes: one still pending would be destroyed with the loop,
        and asyncio reports that as "Task was destroyed but it is pending!", which reads as a failure where there is
        none."""
        if self._loop is None or self._server is None:
            return
        loop, server = self._loop, self._server
        asyncio.run_coroutine_threadsafe(_end_everything(server), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()

    def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """Start a new connection's handler as a task the balancer holds and watches itself.

        Given a coroutine function, asyncio's stream server would make that task and, in Python 3.11, ask it for its
        exception once done: for a handler cancelled at a stop, that logs an error ("Exception in callback ...
        CancelledError") although nothing went wrong."""
        handler = asyncio.get_running_loop().create_task(self._handle(client_reader, client_writer))
        self._handlers.add(handler)
        handler.add_done_callback(functools.partial(self._handled, client_writer))

    def _handled(self, client_writer: asyncio.StreamWriter, handler: asyncio.Task[None]) -> None:
        """A handler ended: let it go, and close its client's connection, which the handler did not do itself when it
        was cancelled before it began (a connection that arrived in the moment of a stop)."""
        self._handlers.discard(handler)
        with contextlib.suppress(ConnectionError, OSError):
            client_writer.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """Pipe one client's connection to the next backend that takes it, both ways, until both ends are done."""
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


async def _end_everything(server: asyncio.base_events.Server) -> None:
    """Close the listening socket, then cancel and wait for every task on the balancer's loop until none is left.

    Every task there is the balancer's: the handlers of the connections being piped, their pipes, and the accepting of
    a connection that arrived just before the close. Such a connection's handler is created on a later turn of the
    loop (when asyncio has made the connection), after a first look at the tasks, so one look is not enough."""
    server.close()
    this = asyncio.current_task()
    while running := [task for task in asyncio.all_tasks() if task is not this]:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    await server.wait_closed()


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
