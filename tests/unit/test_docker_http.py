"""The Docker backend's raw HTTP: request bytes, response heads, bodies in their three
framings, and a plain exchange with a local server standing in for the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor.core.errors import EngineError, EngineUnavailable
from supervisor.engine.docker import attach_request
from supervisor.engine.docker.http import (
    body_blocks,
    exchange,
    plain_request,
    read_body,
    read_head,
    stream_body,
)
from supervisor.engine.endpoint import Endpoint

pytestmark = pytest.mark.unit


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_attach_request_is_the_upgrade_the_engine_expects() -> None:
    assert attach_request("/v1.43", "abc", stdin=True, logs=False) == (
        b"POST /v1.43/containers/abc/attach?stream=1&stdout=1&stderr=1&stdin=1&logs=0 HTTP/1.1"
        b"\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
    )
    assert b"stdin=0&logs=1" in attach_request("/v1.43", "abc", stdin=False, logs=True)


def test_plain_request_asks_the_engine_to_close() -> None:
    assert plain_request("GET", "/v1.43/_ping") == (
        b"GET /v1.43/_ping HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n"
        b"Connection: close\r\n\r\n"
    )


async def test_head_status_and_lower_cased_headers() -> None:
    reader = reader_of(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A:  b \r\n\r\nrest")
    status, headers = await read_head(reader)
    assert status == 200
    assert headers == {"content-type": "text/plain", "x-a": "b"}
    assert await reader.read() == b"rest"


async def test_a_head_cut_short_means_the_engine_went_away() -> None:
    with pytest.raises(EngineUnavailable):
        await read_head(reader_of(b"HTTP/1.1 200 OK\r\nContent-"))


@pytest.mark.parametrize(
    ("headers", "wire"),
    [
        ({"content-length": "11"}, b"hello world<next response>"),
        ({"transfer-encoding": "chunked"}, b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
        ({}, b"hello world"),
    ],
)
async def test_bodies_in_each_framing(headers: dict[str, str], wire: bytes) -> None:
    assert await read_body(reader_of(wire), headers) == b"hello world"


async def test_a_body_shorter_than_its_length_is_an_error() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await read_body(reader_of(b"short"), {"content-length": "10"})


async def test_chunked_blocks_arrive_as_they_come() -> None:
    wire = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    blocks = [b async for b in body_blocks(reader_of(wire), {"transfer-encoding": "chunked"})]
    assert blocks == [b"abc", b"de"]


async def serve(path: Path, answer: bytes) -> tuple[asyncio.Server, list[bytes]]:
    """A unix server that records each request head and sends ``answer``."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, str(path)), seen


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "engine.sock"


async def test_exchange_sends_the_prefixed_path_and_reads_the_answer(sock: Path) -> None:
    server, seen = await serve(sock, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
    async with server:
        status, body = await exchange(Endpoint(f"unix://{sock}"), "/v1.41", "GET", "/_ping")
    assert (status, body) == (200, b"OK")
    assert seen == [plain_request("GET", "/v1.41/_ping")]


async def test_a_dropped_answer_is_engine_unavailable(sock: Path) -> None:
    server, _ = await serve(sock, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nOK")
    async with server:
        with pytest.raises(EngineUnavailable, match="engine dropped GET /_ping"):
            await exchange(Endpoint(f"unix://{sock}"), "/v1.41", "GET", "/_ping")


async def test_stream_body_yields_blocks_and_names_a_missing_container(sock: Path) -> None:
    server, _ = await serve(sock, b"HTTP/1.1 200 OK\r\n\r\nall of it")
    async with server:
        got = b"".join([b async for b in stream_body(Endpoint(f"unix://{sock}"), "", "GET", "/x")])
    assert got == b"all of it"
    server, _ = await serve(sock, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    async with server:
        with pytest.raises(EngineError, match="no such container"):
            async for _ in stream_body(Endpoint(f"unix://{sock}"), "", "GET", "/x"):
                pass


async def test_no_engine_at_the_address_is_engine_unavailable(sock: Path) -> None:
    with pytest.raises(EngineUnavailable, match="cannot connect"):
        await exchange(Endpoint(f"unix://{sock}"), "", "GET", "/_ping")


class _BrokenWriter:
    """A connection whose write side fails as a stopped engine's does."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        raise self.error

    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


class _OkWriter(_BrokenWriter):
    async def drain(self) -> None:
        pass


class _Stubbed(Endpoint):
    """An endpoint whose connection is given: a reader and a writer made to fail."""

    def __init__(self, reader: asyncio.StreamReader, writer: _BrokenWriter) -> None:
        super().__init__("unix:///nowhere.sock")
        self._pair = (reader, writer)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return self._pair  # type: ignore[return-value]


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError(104, "reset"),
        BrokenPipeError(32, "pipe"),
        TimeoutError(110, "timed out"),
    ],
)
async def test_an_engine_stopping_while_the_request_is_sent_is_engine_unavailable(
    error: OSError,
) -> None:
    endpoint = _Stubbed(asyncio.StreamReader(), _BrokenWriter(error))
    with pytest.raises(EngineUnavailable, match="engine dropped POST /containers/c/wait") as got:
        await exchange(endpoint, "", "POST", "/containers/c/wait")
    assert got.value.__cause__ is error


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError(104, "reset"), ConnectionRefusedError(111, "refused"), TimeoutError()],
)
async def test_an_engine_stopping_while_the_answer_is_read_is_engine_unavailable(
    error: OSError,
) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
    # The head and part of the body arrive; the rest never does: the connection fails
    # once the reader waits for more (the first time it yields to the loop).
    asyncio.get_running_loop().call_soon(reader.set_exception, error)
    with pytest.raises(EngineUnavailable, match="engine dropped POST /containers/c/wait") as got:
        await exchange(_Stubbed(reader, _OkWriter(error)), "", "POST", "/containers/c/wait")
    assert got.value.__cause__ is error
