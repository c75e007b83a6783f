"""A TCP proxy in front of the real API server that injects network faults on cue.

TLS passes through untouched (the client still verifies the API server), so the
server's answers are real; the proxy only decides whether bytes move:
- `hang()`: stop relaying in both directions, connections stay open (a half-open
  connection, a partition): a call without a timeout waits forever;
- `drop()`: close every connection (an API server restart, a load balancer
  reset): the client sees ServerDisconnectedError or a reset;
- `refuse(n)`: the next n requests are read and answered by closing the
  connection (a server that dies mid-request): aiohttp's ServerDisconnectedError;
- `resume()`: relay again.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

# Bytes read per relay step; any size works, this one keeps a list page to a few reads.
CHUNK_BYTES = 65536


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.connections = 0
        self._refusals = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        self.drop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def hang(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def refuse(self, requests: int) -> None:
        self._refusals = requests

    def drop(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        for source, sink, upstream in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.create_task(self._relay(source, sink, (writer, up_writer), upstream=upstream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _relay(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        *,
        upstream: bool,
    ) -> None:
        graceful = False
        chunks = 0
        try:
            while data := await source.read(CHUNK_BYTES):
                await self._flowing.wait()
                chunks += 1
                # The client's first two flights are the TLS handshake; later ones carry requests.
                if upstream and self._refusals and chunks > 2:
                    self._refusals -= 1
                    graceful = True  # a clean close (FIN) with no answer, as a dying server does
                    break
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in pair:
                self._writers.discard(writer)
                with contextlib.suppress(Exception):
                    if graceful:
                        writer.close()
                    else:
                        writer.transport.abort()
