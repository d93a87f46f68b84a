"""The daemon client without a daemon: its small HTTP/1.1 reader against canned answers on
a unix socket, errors raised as their classes, and the output and event followers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from supervisor.core.errors import SessionNotFound, TaskNotFound, TaskNotRunning
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.http import Endpoint
from supervisor.interfaces.http_errors import (
    DaemonError,
    DaemonNotRunning,
    HttpError,
    Unauthorized,
    status_of,
)

#: (method, path, query, body) -> raw HTTP answer.
Handler = Callable[[str, str, dict[str, list[str]], bytes], bytes]


def answer(status: int, body: object = None, headers: dict[str, str] | None = None) -> bytes:
    content = b"" if body is None else json.dumps(body).encode()
    lines = [f"HTTP/1.1 {status} X", f"content-length: {len(content)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + content


class FakeDaemon:
    """A unix-socket server that answers each request with ``handler``'s bytes and keeps
    what it was asked."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.requests: list[tuple[str, str, dict[str, list[str]], dict[str, str], bytes]] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line, *lines = head.split("\r\n")
        method, target, _ = request_line.split(" ")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        url = urlsplit(target)
        query = parse_qs(url.query)
        self.requests.append((method, url.path, query, headers, body))
        writer.write(self.handler(method, url.path, query, body))
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> FakeDaemon:
        self.server = await asyncio.start_unix_server(self._serve, path=self.path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "sandvisor.sock"


def task_json(**fields: Any) -> dict[str, Any]:
    return {
        "task_id": "bg-1",
        "session_id": "s",
        "command": "true",
        "description": "",
        "kind": "background",
        "policy": "default",
        "status": "running",
        "output_path": "/o",
        "persistent": False,
        "timeout_ms": 1000,
        "stdin": "pipe",
        "created_at": 1.0,
        **fields,
    }


async def test_request_shape_and_json_answer(sock: Path) -> None:
    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        return answer(201, task_json())

    async with FakeDaemon(sock, handler) as fake:
        client = SandvisorClient(socket_path=sock, token="t0k")
        info = await client.start("s", {"command": "true"})
        assert info == task_json()
        [(method, path, _, headers, body)] = fake.requests
        assert (method, path) == ("POST", "/sessions/s/tasks")
        assert headers["authorization"] == "Bearer t0k"
        assert headers["host"] == "sandvisor"
        assert headers["connection"] == "close"
        assert json.loads(body) == {"command": "true"}


async def test_errors_come_back_as_their_classes(sock: Path) -> None:
    ended = task_json(status="completed", reason="exit", exit_code=0)
    answers = {
        "/sessions/s/tasks/bg-1/stop": answer(
            409,
            {"error": {"code": "task_not_running", "message": "ended", "task": ended}},
        ),
        "/sessions/s/tasks/bg-2": answer(
            404, {"error": {"code": "task_not_found", "message": "no task 'bg-2'"}}
        ),
        "/sessions/gone/tasks": answer(
            404, {"error": {"code": "session_not_found", "message": "no session 'gone'"}}
        ),
        "/sessions": answer(401, {"error": {"code": "unauthorized", "message": "no token"}}),
    }

    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        return answers.get(path, b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 4\r\n\r\noops")

    async with FakeDaemon(sock, handler):
        client = SandvisorClient(socket_path=sock)
        with pytest.raises(TaskNotRunning) as stopped:
            await client.stop("s", "bg-1")
        assert stopped.value.info.exit_code == 0
        assert (status_of(stopped.value), stopped.value.body["error"]["task"]) == (409, ended)
        with pytest.raises(TaskNotFound) as missing:
            await client.task("s", "bg-2")
        assert (missing.value.task_id, status_of(missing.value)) == ("bg-2", 404)
        with pytest.raises(SessionNotFound) as gone:
            await client.tasks("gone")
        assert gone.value.session_id == "gone"
        with pytest.raises(Unauthorized):
            await client.sessions()
        with pytest.raises(HttpError, match="HTTP 502"):
            await client.tail("s", "bg-1")


async def test_chunked_and_close_delimited_answers(sock: Path) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\n[1, 2\r\n3;ext=1\r\n, 3\r\n1\r\n]\r\n0\r\n\r\n"
    )
    unsized = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[4]"

    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        return chunked if path == "/sessions" else unsized

    async with FakeDaemon(sock, handler):
        client = SandvisorClient(socket_path=sock)
        assert await client.sessions() == [1, 2, 3]  # type: ignore[comparison-overlap]
        assert await client.tasks("s") == [4]  # type: ignore[comparison-overlap]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"garbage\r\n\r\n", "not an HTTP/1.x answer"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", "lost the connection"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header"),
        (b"", "lost the connection"),
    ],
)
async def test_broken_answers_are_daemon_errors(sock: Path, raw: bytes, why: str) -> None:
    async with FakeDaemon(sock, lambda *_: raw):
        with pytest.raises(DaemonError, match=why) as info:
            await SandvisorClient(socket_path=sock).sessions()
        assert not isinstance(info.value, DaemonNotRunning)


async def test_nothing_listening_is_daemon_not_running(sock: Path) -> None:
    client = SandvisorClient(socket_path=sock)
    assert await client.reachable() is False
    with pytest.raises(DaemonNotRunning, match=str(sock)):
        await client.sessions()
    sock.touch()  # a stale socket file: nothing accepts on it
    with pytest.raises(DaemonNotRunning):
        await client.healthz()


async def test_follow_output_reads_until_the_end(sock: Path) -> None:
    pieces = [(b"", False), (b"one\n", False), (b"", False), (b"two\n", True)]

    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        data, eof = pieces.pop(0)
        offset = int(query["offset"][0])
        head = (
            f"HTTP/1.1 200 OK\r\ncontent-length: {len(data)}\r\n"
            f"x-next-offset: {offset + len(data)}\r\nx-eof: {str(eof).lower()}\r\n\r\n"
        )
        return head.encode() + data

    async with FakeDaemon(sock, handler) as fake:
        client = SandvisorClient(socket_path=sock)
        got = [c async for c in client.follow_output("s", "bg-1")]
        assert [(c.data, c.offset, c.next_offset, c.eof) for c in got] == [
            (b"one\n", 0, 4, False),
            (b"two\n", 4, 8, True),
        ]
        queries = [r[2] for r in fake.requests]
        assert all(q["wait_s"] == ["25.0"] and q["encoding"] == ["raw"] for q in queries)


async def test_follow_output_without_follow_stops_at_what_is_there(sock: Path) -> None:
    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        offset = int(query["offset"][0])
        data = b"abc" if offset == 0 else b""
        return (
            f"HTTP/1.1 200 OK\r\ncontent-length: {len(data)}\r\n"
            f"x-next-offset: {offset + len(data)}\r\nx-eof: false\r\n\r\n"
        ).encode() + data

    async with FakeDaemon(sock, handler) as fake:
        got = [
            c.data
            async for c in SandvisorClient(socket_path=sock).follow_output("s", "t", follow=False)
        ]
        assert got == [b"abc"]
        assert [r[2]["wait_s"] for r in fake.requests] == [["0.0"], ["0.0"]]


async def test_follow_events_until_the_session_ends(sock: Path) -> None:
    batches: list[dict[str, Any]] = [
        {"events": [{"seq": 1, "type": "task.started"}], "last_seq": 1, "ended": False},
        {"events": [], "last_seq": 1, "ended": False},
        {"events": [{"seq": 2, "type": "session.ended"}], "last_seq": 2, "ended": True},
    ]

    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        return answer(200, batches.pop(0))

    async with FakeDaemon(sock, handler) as fake:
        got = [b async for b in SandvisorClient(socket_path=sock).follow_events("s", 0)]
        assert [[e["seq"] for e in b] for b in got] == [[1], [2]]
        assert [r[2]["after"] for r in fake.requests] == [["0"], ["1"], ["1"]]


async def test_follow_events_without_follow_reads_what_there_is(sock: Path) -> None:
    batches: list[dict[str, Any]] = [
        {"events": [{"seq": 4, "type": "task.poll"}], "last_seq": 4, "ended": False},
        {"events": [], "last_seq": 4, "ended": False},
    ]

    def handler(method: str, path: str, query: dict[str, list[str]], body: bytes) -> bytes:
        return answer(200, batches.pop(0))

    async with FakeDaemon(sock, handler) as fake:
        client = SandvisorClient(socket_path=sock)
        got = [b async for b in client.follow_events("s", 3, follow=False)]
        assert got == [[{"seq": 4, "type": "task.poll"}]]
        assert [r[2]["wait_s"] for r in fake.requests] == [["0.0"], ["0.0"]]


@pytest.mark.parametrize(
    ("url", "host", "port", "tls", "prefix", "header"),
    [
        ("http://127.0.0.1:8377", "127.0.0.1", 8377, False, "", "127.0.0.1:8377"),
        ("http://localhost:80/api/", "localhost", 80, False, "/api", "localhost"),
        ("https://[::1]:9443", "::1", 9443, True, "", "[::1]:9443"),
        ("http://user:pw@h", "h", 80, False, "", "h"),
    ],
)
def test_endpoint_from_url(
    url: str, host: str, port: int, tls: bool, prefix: str, header: str
) -> None:
    ep = Endpoint.from_url(url)
    assert (ep.host, ep.port, ep.tls, ep.prefix, ep.host_header) == (
        host,
        port,
        tls,
        prefix,
        header,
    )


@pytest.mark.parametrize("url", ["ftp://x", "sandvisor.sock", "http://h:port"])
def test_endpoint_refuses_other_urls(url: str) -> None:
    with pytest.raises(DaemonNotRunning):
        Endpoint.from_url(url)
