"""A small HTTP/1.1 client on asyncio streams: the daemon's unix socket or loopback TCP.

Why not httpx: every ``sandvisor`` command is a new process, and importing httpx (TLS, HTTP/2,
proxies, its many modules) took about a third of ``sandvisor ps``. The daemon speaks plain
HTTP/1.1 and answers with a length or chunks, which is all this reads. Each request has a
connection of its own (``Connection: close``): connecting to a unix socket costs
microseconds, and concurrent requests (the MCP server's event follower beside its tool
calls) need no pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from supervisor.interfaces.http_errors import DaemonError, DaemonNotRunning

#: Largest response header block accepted (the daemon sends a few hundred bytes).
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Response:
    """One HTTP answer, its body read in full."""

    status: int
    """HTTP status code."""
    headers: dict[str, str]
    """Header names in lower case."""
    content: bytes
    """The body."""

    def json(self) -> Any:
        """The body as JSON (DaemonError when it is not)."""
        try:
            return json.loads(self.content)
        except ValueError as exc:
            raise DaemonError(f"the daemon answered HTTP {self.status} with no JSON") from exc

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the daemon listens: a unix socket, or ``http(s)://host:port/prefix``."""

    socket_path: Path | None = None
    host: str = "sandvisor"
    port: int = 80
    tls: bool = False
    prefix: str = ""
    host_header: str = "sandvisor"

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DaemonNotRunning(f"{url!r} is not an http:// or https:// URL")
        tls = parts.scheme == "https"
        default = 443 if tls else 80
        try:
            port = parts.port or default
        except ValueError as exc:  # a port that is not a number
            raise DaemonNotRunning(f"{url!r}: {exc}") from exc
        host = parts.netloc.rpartition("@")[2]
        # As browsers and httpx send it: no port when it is the scheme's default.
        if port == default and parts.port is not None:
            host = host.rsplit(":", 1)[0]
        return cls(
            host=parts.hostname,
            port=port,
            tls=tls,
            prefix=parts.path.rstrip("/"),
            host_header=host,
        )

    def __str__(self) -> str:
        if self.socket_path is not None:
            return str(self.socket_path)
        return f"{'https' if self.tls else 'http'}://{self.host_header}{self.prefix}"

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.socket_path is not None:
            return await asyncio.open_unix_connection(self.socket_path, limit=MAX_HEADER_BYTES)
        ssl_context: Any = None
        if self.tls:
            import ssl  # noqa: PLC0415 - only for https URLs; costs every start otherwise

            ssl_context = ssl.create_default_context()
        return await asyncio.open_connection(
            self.host, self.port, ssl=ssl_context, limit=MAX_HEADER_BYTES
        )

    async def reachable(self, timeout_s: float) -> bool:
        """Whether something accepts connections here (no request is sent)."""
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await self._connect()
        except (OSError, TimeoutError):
            return False
        await _close(writer)
        return True

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> Response:
        """Send one request and read the whole answer. DaemonNotRunning when nothing
        accepts the connection; DaemonError when it fails after that."""
        target, sent, body = request_parts(method, path, params, json_body, headers)
        lines = [
            f"{method} {self.prefix}{target} HTTP/1.1",
            f"Host: {self.host_header}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in sent.items()),
        ]
        if "Content-Type" in sent:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            async with asyncio.timeout(connect_timeout_s):
                reader, writer = await self._connect()
        except (OSError, TimeoutError) as exc:
            raise DaemonNotRunning(f"{self}: {exc or type(exc).__name__}") from exc
        try:
            async with asyncio.timeout(read_timeout_s):
                writer.write(head + body)
                await writer.drain()
                return await _read_response(reader, method)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            # ValueError: a malformed answer (also asyncio's LimitOverrunError).
            why = str(exc) or type(exc).__name__
            raise DaemonError(f"lost the connection to the daemon ({self}): {why}") from exc
        finally:
            await _close(writer)


def request_parts(
    method: str,
    path: str,
    params: dict[str, Any] | None,
    json_body: Any,
    headers: dict[str, str] | None,
) -> tuple[str, dict[str, str], bytes]:
    """What every request to the daemon carries: the path with its query (as ``urlencode``
    writes it), the headers (Accept, the caller's, Content-Type when there is a body or the
    method has one) and the JSON body."""
    target = path + ("?" + urlencode(params) if params else "")
    body = b"" if json_body is None else json.dumps(json_body).encode()
    sent = {"Accept": "application/json", **(headers or {})}
    if json_body is not None or method in ("POST", "PUT", "PATCH"):
        sent["Content-Type"] = "application/json"
    return target, sent, body


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    # The request is over either way; a failure to close cleanly (the peer went first)
    # changes nothing for the caller.
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader, method: str) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
    status = int(rest.split(" ", 1)[0])
    headers: dict[str, str] = {}
    for line in header_lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return Response(status, headers, b"")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        content = await _read_chunks(reader)
    elif "content-length" in headers:
        content = await reader.readexactly(int(headers["content-length"]))
    else:
        content = await reader.read()  # until the server closes (we asked it to)
    return Response(status, headers, content)


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            # Trailers (none expected) end with an empty line.
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the CRLF after each chunk
