"""The fake engine agrees with the real one where the runtime relies on it: the same test
body runs against DockerBackend (a busybox command) and FakeBackend (the equivalent script)
and must see the same bytes: live vs replaying attach, stdin EOF, the json-file log's
messages (16 KiB pieces, invalid UTF-8, an unfinished line at exit)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from supervisor.core.container import ContainerRequest, Segment
from supervisor.core.resync import COPIER_CHUNK, split_stamp
from supervisor.engine.base import AttachedStream, Backend
from supervisor.engine.docker import DockerBackend
from supervisor.engine.fake import Exit, FakeEngine, Out, ReadEOF, ReadLine, Script
from tests.conftest import owned_label, require_engine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: Each case: a busybox command and the fake script that does the same.
TALK = (
    "echo before; read x; echo after; cat; exit 3",
    Script(Out("before\n"), ReadLine(), Out("after\n"), ReadEOF(echo=True), Exit(3)),
)
LONG = 2 * COPIER_CHUNK + 1000
LOG = (
    f"printf 'one\\n\\377\\n'; head -c {LONG} /dev/zero | tr '\\0' L; echo; echo err >&2; "
    "printf half",
    Script(Out(b"one\n\xff\n"), Out(b"L" * LONG + b"\n"), Out("err\n", stream=2), Out("half")),
)


def request(command: str) -> ContainerRequest:
    return ContainerRequest(
        name=f"sandvisor-test-fake-agrees-{secrets.token_hex(4)}",
        image="sandvisor/minimal:latest",
        command=["/bin/sh", "-c", command],
        labels=owned_label(),
        user="65534",
        working_dir="/tmp",
        memory_bytes=64 << 20,
        nano_cpus=10**9,
        pids_limit=64,
    )


@pytest.fixture(params=["docker", "fake"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "docker":
        require_engine()
        docker = DockerBackend()
        yield docker
        await docker.aclose()
        return
    async with FakeEngine() as engine:
        for command, script in (TALK, LOG):
            engine.script(lambda req, c=command: req.command[-1] == c, script)
        yield engine.backend()


@pytest.fixture
async def run(backend: Backend) -> AsyncIterator[list[str]]:
    """Container ids to remove after the test."""
    made: list[str] = []
    yield made
    for cid in made:
        await backend.remove(cid)


async def read_all(stream: AttachedStream) -> bytes:
    out: list[Segment] = []
    while (segments := await stream.read()) is not None:
        out.extend(segments)
    return b"".join(bytes(p) for _, p in out)


async def until_logged(backend: Backend, cid: str, data: bytes) -> None:
    """The engine logs asynchronously from what it sends to attach streams."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        logged = b"".join([bytes(p) async for batch in backend.logs(cid) for _, p in batch])
        if logged == data or loop.time() > deadline:
            assert logged == data
            return
        await asyncio.sleep(0.02)


async def test_live_and_replaying_attach_and_stdin_eof(backend: Backend, run: list[str]) -> None:
    cid = await backend.create(request(TALK[0]))
    run.append(cid)
    main = await backend.attach(cid, stdin=True, logs=False)
    await backend.start(cid)
    first = await main.read()
    assert first is not None
    assert b"".join(bytes(p) for _, p in first) == b"before\n"
    await until_logged(backend, cid, b"before\n")
    live = await backend.attach(cid, stdin=False, logs=False)
    replay = await backend.attach(cid, stdin=False, logs=True)
    await main.write(b"go\n")
    await main.write(b"typed")
    with pytest.raises(BrokenPipeError):
        await live.write(b"not on a stream without stdin")
    await main.close_stdin()
    assert (await backend.wait(cid)).exit_code == 3
    assert await read_all(main) == b"after\ntyped"
    assert await read_all(live) == b"after\ntyped"
    assert await read_all(replay) == b"before\nafter\ntyped"
    for stream in (main, live, replay):
        await stream.aclose()


async def test_the_logs_messages(backend: Backend, run: list[str]) -> None:
    cid = await backend.create(request(LOG[0]))
    run.append(cid)
    await backend.start(cid)
    assert (await backend.wait(cid)).exit_code == 0
    stamped = [
        (k, bytes(f)) async for batch in backend.logs(cid, timestamps=True) for k, f in batch
    ]
    messages = [split_stamp(k, f) for k, f in stamped]
    assert all(m is not None for m in messages)
    payloads = {k: [m[2] for m in messages if m and m[0] == k] for k in (1, 2)}
    assert payloads == {
        1: [
            b"one\n",
            "\ufffd\n".encode(),
            b"L" * COPIER_CHUNK,
            b"L" * COPIER_CHUNK,
            b"L" * 1000 + b"\n",
            b"half",
        ],
        2: [b"err\n"],
    }
