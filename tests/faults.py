"""A real network fault between Berth and a dependency: a loopback TCP proxy that can be cut and restored.

PostgreSQL and the Temporal server are real and shared by the whole test session, so a test cannot kill them. It
can put this proxy between one client (an engine, a Temporal client) and the server and cut it: every open
connection is reset and new ones are refused, which is what a client sees when the server dies or the network
partitions (ECONNRESET mid-statement, then ECONNREFUSED), nothing simulated on the client's side. It can also
`stall`: connections stay open and nothing passes, which is what a client sees of a server too loaded to answer
(its own deadline fires, as gRPC's DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        await self._listen()
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Reset every connection and refuse new ones until `restore`."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            transport = writer.transport
            if transport is not None:
                transport.abort()  # an RST, as a dead peer's kernel answers
        self._writers.clear()

    async def restore(self) -> None:
        if self._server is None:
            await self._listen()

    def stall(self) -> None:
        """Hold every byte, both ways, until `flow`; connections stay open."""
        self._flowing.clear()

    def flow(self) -> None:
        self._flowing.set()

    async def stop(self) -> None:
        await self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers |= {client_writer, server_writer}
        pumps = [
            asyncio.ensure_future(self._pump(client_reader, server_writer)),
            asyncio.ensure_future(self._pump(server_reader, client_writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
            self._tasks.discard(pump)
        for writer in (client_writer, server_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
