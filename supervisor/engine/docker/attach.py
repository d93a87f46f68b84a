"""The attach stream: a hijacked engine connection read with a BufferedProtocol, no thread
per task, the engine's bytes split into (stream, payload) frames as they arrive."""

from __future__ import annotations

import asyncio
import contextlib

from supervisor.core.container import Segment
from supervisor.core.demux import FrameDemux
from supervisor.core.errors import EngineError, EngineUnavailable
from supervisor.engine.endpoint import Endpoint

#: Attach streams land in buffers of these sizes (a new one when 1/16 is left).
_CHUNK = 1 << 20
_SMALL_CHUNK = 16 * 1024
#: Stop reading from the engine while this much output waits for the capture loop.
_PAUSE_AT = 8 << 20


class AttachProtocol(asyncio.BufferedProtocol):
    """A hijacked attach connection: the engine's bytes land directly in our own buffers
    (no intermediate copies), are split into frames on arrival, and wait as zero-copy views
    until the capture loop takes all of them at once. Reading pauses while too much waits.
    """

    def __init__(self, request: bytes) -> None:
        self._request = request
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.status: int | None = None
        self.head_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Quiet tasks keep a small buffer; a stream that fills one fast gets large ones.
        self._buf = bytearray(_SMALL_CHUNK)
        self._pos = 0
        self._buf_since = 0.0
        self._demux = FrameDemux()
        self._segments: list[Segment] = []
        self._pending = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.eof = False
        self._can_write = asyncio.Event()
        self._can_write.set()

    # -- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buf) - self._pos < len(self._buf) // 16:
            # A fresh buffer (views handed out keep the old one alive until written): large
            # when the last one filled within 50 ms (a flood), small otherwise (a quiet task
            # costs 16 KiB, not 1 MiB).
            now = asyncio.get_running_loop().time()
            fast = now - self._buf_since < 0.05
            self._buf = bytearray(_CHUNK if fast else _SMALL_CHUNK)
            self._pos = 0
            self._buf_since = now
        return memoryview(self._buf)[self._pos :]

    def buffer_updated(self, nbytes: int) -> None:
        data = memoryview(self._buf)[self._pos : self._pos + nbytes]
        self._pos += nbytes
        if self.status is None:
            self._handshake(bytes(data))
            return
        self._take(data)

    def _handshake(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > 65536:
                self._fail(EngineError("attach: the engine's answer has no end of headers"))
            return
        line = bytes(self.head[: self.head.find(b"\r\n")]).decode("latin-1")
        try:
            self.status = int(line.split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail(EngineError(f"attach: unexpected answer {line!r}"))
            return
        rest = bytes(self.head[end + 4 :])
        del self.head[end + 4 :]
        if not self.head_done.done():
            self.head_done.set_result(None)
        if rest and self.status in (101, 200):
            self._take(memoryview(rest))

    def _fail(self, exc: Exception) -> None:
        if not self.head_done.done():
            self.head_done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _take(self, data: memoryview) -> None:
        pieces = self._demux.feed_views(data)
        if pieces:
            self._segments.extend(pieces)
            self._pending += len(data)
            self._wake()
        if self._pending > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._can_write.set()
        if not self.head_done.done():
            self.head_done.set_exception(
                EngineUnavailable(f"attach: the engine closed the connection ({exc})")
            )
        self._wake()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- for the stream -----------------------------------------------------------------

    async def next_segments(self) -> list[Segment] | None:
        while not self._segments:
            if self.eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        segments, self._segments, self._pending = self._segments, [], 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return segments

    async def drain(self) -> None:
        await self._can_write.wait()


class DockerAttach:
    """A hijacked attach connection read with asyncio: no thread per task."""

    def __init__(self, protocol: AttachProtocol, *, stdin: bool) -> None:
        self._protocol = protocol
        self._stdin_open = stdin
        self._closed = False

    async def read(self) -> list[Segment] | None:
        return await self._protocol.next_segments()

    async def write(self, data: bytes) -> None:
        transport = self._protocol.transport
        if not self._stdin_open or self._closed or transport is None or transport.is_closing():
            raise BrokenPipeError("stdin is closed")
        transport.write(data)
        await self._protocol.drain()

    async def close_stdin(self) -> None:
        transport = self._protocol.transport
        if self._stdin_open and not self._closed and transport is not None:
            self._stdin_open = False
            with contextlib.suppress(OSError, RuntimeError):
                if transport.can_write_eof():
                    transport.write_eof()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._protocol.transport is not None:
            self._protocol.transport.close()

    def is_open(self) -> bool:
        transport = self._protocol.transport
        return not (self._closed or self._protocol.eof or transport is None) and not (
            transport.is_closing()
        )


async def open_attach(
    endpoint: Endpoint, request: bytes, container_id: str, *, stdin: bool
) -> DockerAttach:
    """Send an attach ``request`` (see ``http.attach_request``) on a new connection and wait
    for the engine to take it over; raises EngineError when it answers otherwise."""
    protocol = await endpoint.connect_protocol(lambda: AttachProtocol(request))
    try:
        await asyncio.wait_for(asyncio.shield(protocol.head_done), 60)
    except BaseException:
        if protocol.transport is not None:
            protocol.transport.close()
        raise
    if protocol.status not in (101, 200):
        if protocol.transport is not None:
            protocol.transport.close()
        if protocol.status == 404:
            raise EngineError(f"attach: no such container {container_id[:12]}")
        raise EngineError(f"attach {container_id[:12]}: HTTP {protocol.status}")
    return DockerAttach(protocol, stdin=stdin)
