"""Input limits against the real engine: the longest command runs, one byte more is refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import docker
import pytest
from pydantic import ValidationError

from supervisor import SpecError, Supervisor, TaskSpec
from supervisor.core.models import MAX_ARG_STRLEN, MAX_COMMAND_BYTES
from tests.conftest import require_engine
from tests.e2e.conftest import start_daemon

pytestmark = pytest.mark.timeout(180)


def command_of(size: int, marker: str) -> str:
    """A command of exactly ``size`` UTF-8 bytes that prints ``marker``: the rest is a
    comment, with a multi-byte character at its end so bytes, not characters, are counted."""
    head = f"echo {marker} #"
    tail = "€"
    pad = size - len(head.encode()) - len(tail.encode())
    command = head + "x" * pad + tail
    assert len(command.encode()) == size
    return command


def pooled_ids(sup: Supervisor) -> set[str]:
    rows = docker.APIClient(version="auto").containers(
        all=True,
        filters={"label": [f"io.sandvisor.owner={sup.instance_id}", "io.sandvisor.kind=pooled"]},
    )
    return {r["Id"] for r in rows}


async def until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_a_command_exactly_at_the_limit_runs(sup: Supervisor) -> None:
    """Issue 14, defect 7: 131,061-131,072 bytes were accepted, then the container failed with
    'argument list too long'. The limit now comes from the kernel's argv string limit."""
    session = await sup.open_session("limits")
    info = await session.start(
        TaskSpec(command=command_of(MAX_COMMAND_BYTES, "cold-ok"), policy="fast")
    )
    final = await session.wait(info.task_id, timeout_s=60)
    assert (final.status, final.exit_code, final.error) == ("completed", 0, None)
    assert Path(final.output_path).read_bytes() == b"cold-ok\n"


async def test_a_command_exactly_at_the_limit_runs_in_a_warm_container(sup: Supervisor) -> None:
    """A pooled container's shell reads the command from stdin, then execs the same
    ``sh -c`` with one more newline: the one limit covers it too."""
    session = await sup.open_session("limits-warm")
    assert await session.prewarm("warm") == 2
    warm = pooled_ids(sup)
    info = await session.start(
        TaskSpec(command=command_of(MAX_COMMAND_BYTES, "warm-ok"), policy="warm")
    )
    await until(lambda: session.task_runner(info.task_id).container_id is not None)
    assert session.task_runner(info.task_id).container_id in warm  # it took a pooled container
    final = await session.wait(info.task_id, timeout_s=60)
    assert (final.status, final.exit_code, final.error) == ("completed", 0, None)
    assert Path(final.output_path).read_bytes() == b"warm-ok\n"
    await session.end()


async def test_one_byte_more_is_refused_with_a_spec_error(sup: Supervisor) -> None:
    session = await sup.open_session("limits-over")
    too_long = command_of(MAX_COMMAND_BYTES + 1, "never")
    with pytest.raises(SpecError) as info:
        await session.start({"command": too_long, "policy": "fast"})
    message = str(info.value)
    assert message.startswith("command: ")
    assert f"longer than {MAX_COMMAND_BYTES} bytes (got {MAX_COMMAND_BYTES + 1}" in message
    assert str(MAX_ARG_STRLEN) in message
    with pytest.raises(ValidationError):
        TaskSpec(command=too_long)
    assert await session.list() == []


@pytest.mark.e2e
def test_over_http_the_limits_answer_422_naming_the_field(
    tmp_path: Path, policies_dir: Path
) -> None:
    """The same refusals through the daemon: 422 with the field, no internal error."""
    require_engine()
    daemon = start_daemon(tmp_path / "daemon-state", policies_dir)
    try:
        with daemon.client() as admin:
            r = admin.post("/sessions", json={"session_id": "limits-http"})
            assert r.status_code == 201, r.text
            tasks = "/sessions/limits-http/tasks"
            r = admin.post(
                tasks, json={"command": command_of(MAX_COMMAND_BYTES + 1, "x"), "policy": "fast"}
            )
            assert r.status_code == 422, r.text
            error = r.json()["error"]
            assert error["code"] == "invalid_request"
            assert f"longer than {MAX_COMMAND_BYTES} bytes" in error["message"]
            assert [f["field"] for f in error["fields"]] == ["command"]
            # Issue 14, defect 8: a lone surrogate gave "Error serializing to JSON".
            body = '{"command": "ls", "policy": "fast", "env": {"FOO": "\\ud800"}}'
            r = admin.post(tasks, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, r.text
            assert "env.FOO: contains a lone" in r.json()["error"]["message"]
            r = admin.post(tasks, json={"command": "echo fine", "policy": "fast"})
            assert r.status_code == 201, r.text
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-3000:]
