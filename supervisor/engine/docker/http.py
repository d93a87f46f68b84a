"""Raw HTTP/1.1 to the engine over asyncio: request lines, response heads, bodies (length,
chunked, until close), for calls that must not hold a thread (long waits, large logs)."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator

from supervisor.core.errors import EngineError, EngineUnavailable, SupervisorError
from supervisor.engine.endpoint import READ_SIZE, Endpoint


def plain_request(method: str, target: str, body: bytes | None = None) -> bytes:
    """A request (a JSON ``body``, or none), on a connection the engine closes after
    answering."""
    kind = "" if body is None else "Content-Type: application/json\r\n"
    return (
        f"{method} {target} HTTP/1.1\r\nHost: docker\r\n{kind}"
        f"Content-Length: {len(body or b'')}\r\nConnection: close\r\n\r\n".encode()
    ) + (body or b"")


def attach_request(
    api_prefix: str, container_id: str, *, stdin: bool, logs: bool, output: bool = True
) -> bytes:
    """``POST /containers/{id}/attach`` asking the engine to hijack the connection for the
    container's stdio (stdout and stderr unless ``output`` is False, stdin when asked, the
    stored log first with ``logs``). ``api_prefix`` is ``/v<api version>``."""
    query = urllib.parse.urlencode(
        {
            "stream": 1,
            "stdout": int(output),
            "stderr": int(output),
            "stdin": int(stdin),
            "logs": int(logs),
        }
    )
    return (
        f"POST {api_prefix}/containers/{container_id}/attach?{query} HTTP/1.1\r\n"
        "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status code and headers (names lower-cased) of a response."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
        raise EngineUnavailable(f"engine closed the connection: {exc}") from exc
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """The whole body (for small answers)."""
    return b"".join([block async for block in body_blocks(reader, headers)])


async def body_blocks(
    reader: asyncio.StreamReader, headers: dict[str, str]
) -> AsyncIterator[bytes]:
    """The body in blocks as they arrive (content-length, chunked, or until close)."""
    if "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            block = await reader.read(min(remaining, READ_SIZE))
            if not block:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(block)
            yield block
        return
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            while size > 0:
                block = await reader.read(min(size, READ_SIZE))
                if not block:
                    raise asyncio.IncompleteReadError(b"", size)
                size -= len(block)
                yield block
            await reader.readexactly(2)
    while block := await reader.read(READ_SIZE):
        yield block


@contextlib.asynccontextmanager
async def open_request(
    endpoint: Endpoint, api_prefix: str, method: str, path: str, body: bytes | None = None
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A plain request (a JSON ``body``, or none) sent on its own connection, closed
    afterwards. The engine going away at any point (refused, reset, a broken pipe, a
    socket timeout, an answer cut short) is EngineUnavailable, never a raw OSError: callers
    ride out outages by that one type."""
    reader, writer = await endpoint.connect()
    try:
        try:
            writer.write(plain_request(method, f"{api_prefix}{path}", body))
            await writer.drain()
        except OSError as exc:
            raise EngineUnavailable(f"engine dropped {method} {path}: {exc}") from exc
        try:
            yield reader, writer
        except SupervisorError:
            raise
        except (asyncio.IncompleteReadError, OSError) as exc:
            # OSError: ConnectionError (refused, reset, broken pipe) and TimeoutError too.
            raise EngineUnavailable(f"engine dropped {method} {path}: {exc}") from exc
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1)


async def exchange(
    endpoint: Endpoint,
    api_prefix: str,
    method: str,
    path: str,
    *,
    timeout: float | None = None,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    """A plain request on its own connection (for long waits that must not hold a thread,
    and for calls made many at once without a thread each)."""
    async with open_request(endpoint, api_prefix, method, path, body) as (reader, _):

        async def answer() -> tuple[int, bytes]:
            status, headers = await read_head(reader)
            return status, await read_body(reader, headers)

        return await asyncio.wait_for(answer(), timeout)


async def stream_body(
    endpoint: Endpoint, api_prefix: str, method: str, path: str
) -> AsyncIterator[bytes]:
    """A plain request whose body is yielded as it arrives (for bodies too large to hold:
    a container's whole log)."""
    async with open_request(endpoint, api_prefix, method, path) as (reader, _):
        status, headers = await read_head(reader)
        if status == 404:
            raise EngineError(f"{method} {path}: no such container")
        if status != 200:
            body = await read_body(reader, headers)
            raise EngineError(f"{method} {path}: HTTP {status}: {body[:200]!r}")
        async for block in body_blocks(reader, headers):
            yield block
