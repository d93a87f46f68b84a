"""Routes of tasks: start, list, get, find, stop, input, output, tail, wait, wait-for."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from enum import Enum
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse

from supervisor.core.errors import TaskNotFound, WaitTimeout
from supervisor.core.models import Kind, OutputSlice, TaskInfo
from supervisor.interfaces.daemon.bodies import InputBody, StartTask, WaitBody, WaitForBody
from supervisor.interfaces.daemon.deps import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    SessionId,
    TaskId,
    Who,
    session_of,
)
from supervisor.interfaces.daemon.limits import MAX_OFFSET, MAX_WAIT_S
from supervisor.interfaces.daemon.replies import (
    OutputText,
    StartedTask,
    Tail,
    WaitForResult,
    WaitResult,
    error_responses,
)
from supervisor.interfaces.daemon.task_feed import feed_of
from supervisor.runtime.session import MAX_READ, Session
from supervisor.runtime.supervisor import Supervisor

_TASK = "/sessions/{session_id}/tasks/{task_id}"
#: The most a start's ``output`` holds (the rest: ``GET .../output`` from ``next_offset``).
FIRST_OUTPUT_BYTES = 65536
_TASKS: list[str | Enum] = ["tasks"]
_OUTPUT: list[str | Enum] = ["output"]
_RAW_OUTPUT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The slice: JSON (`text`, `base64`) or the bytes themselves (`raw`)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            "X-Next-Offset": {
                "description": "`raw`: where the next read starts",
                "schema": {"type": "integer"},
            },
            "X-EOF": {
                "description": "`raw`: `true` when the task ended and nothing follows",
                "schema": {"type": "string", "enum": ["true", "false"]},
            },
        },
    }
}


_FILE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The output file as it is now, as an attachment",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            "Content-Disposition": {
                "description": '`attachment; filename="<task id>.output"`',
                "schema": {"type": "string"},
            }
        },
    }
}
#: Bytes read per step of a download.
_FILE_STEP = 1024 * 1024


class OutputFileResponse(StreamingResponse):
    """A task's output file (documented as bytes, not JSON)."""

    media_type = "application/octet-stream"


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


async def _file_bytes(session: Session, task_id: str, size: int) -> AsyncIterator[bytes]:
    """The first ``size`` bytes of the output file, a step at a time (never the whole file
    in memory). The size is fixed at the start: a running task's later output is not part
    of this download."""
    offset = 0
    while offset < size:
        sl = await session.read_output(task_id, offset, min(_FILE_STEP, size - offset))
        if not sl.data:
            return
        offset = sl.next_offset
        yield sl.data


def add_task_routes(api: FastAPI, sup: Supervisor) -> None:
    """The task routes over ``sup``. Added to the app itself, not through an APIRouter: the
    request guard matches the app's own routes to find a request's body limit."""
    _lookup_routes(api, sup)
    _control_routes(api, sup)
    _output_routes(api, sup)


def _lookup_routes(api: FastAPI, sup: Supervisor) -> None:
    @api.post(
        "/sessions/{session_id}/tasks",
        tags=_TASKS,
        status_code=201,
        response_model=StartedTask,
        responses=error_responses(400, 404, 409, 413, 424, 429, 502, 503, 507),
    )
    async def start_task(
        session_id: SessionId,
        body: StartTask,
        who: Who,
        wait_output_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S), NUMBER] = 0.0,
    ) -> Response:
        """Start a command in a fresh sandbox; returns at once with the id and output path.
        ``wait_output_s`` > 0: answers once the first output is in the file (or the task
        ended, or that many seconds passed), with up to 64 KiB of it in ``output``: start a
        command and see what it printed first in one round trip."""
        session = session_of(sup, session_id, who)
        info = await session.start(body.to_spec())
        feed_of(sup).announce(info)
        if wait_output_s <= 0:  # the task alone (no ``output`` key)
            return JSONResponse(info.model_dump(mode="json"), status_code=201)
        await session.wait_output(info.task_id, 0, wait_output_s)
        sl = await session.read_output(info.task_id, 0, FIRST_OUTPUT_BYTES)
        # Shaped as StartedTask (the documented answer), without validating it again.
        answer = (await session.get(info.task_id)).model_dump(mode="json")
        answer["output"] = _output_body(sl, "text")
        return JSONResponse(answer, status_code=201)

    @api.get(
        "/sessions/{session_id}/tasks",
        tags=_TASKS,
        response_model=list[TaskInfo],
        responses=error_responses(404),
    )
    async def list_tasks(
        session_id: SessionId,
        who: Who,
        kind: Kind | None = None,
        active: Annotated[bool, Query(), BOOLEAN] = False,
    ) -> list[TaskInfo]:
        """The session's tasks (``active=true``: only those not ended)."""
        return await session_of(sup, session_id, who).list(kind, active_only=active)

    @api.get(_TASK, tags=_TASKS, response_model=TaskInfo, responses=error_responses(404))
    async def get_task(session_id: SessionId, task_id: TaskId, who: Who) -> TaskInfo:
        """One task's status."""
        return await session_of(sup, session_id, who).get(task_id)

    @api.get(
        "/tasks/{task_id}",
        tags=_TASKS,
        response_model=TaskInfo,
        responses=error_responses(404),
    )
    async def find_task(task_id: TaskId, who: Who) -> TaskInfo:
        """Find a task by id in any session (admin), or in the token's own session."""
        for s in sup.sessions():
            if not who.admin and s.session_id != who.session_id:
                continue
            try:
                return await s.get(task_id)
            except TaskNotFound:
                continue
        if who.admin:
            raise TaskNotFound(task_id, f"no task {task_id!r} in any open session")
        raise TaskNotFound(task_id)


def _control_routes(api: FastAPI, sup: Supervisor) -> None:
    @api.post(
        f"{_TASK}/stop",
        tags=_TASKS,
        response_model=TaskInfo,
        responses=error_responses(404, 409, 413, 502, 503),
    )
    async def stop_task(session_id: SessionId, task_id: TaskId, who: Who) -> TaskInfo:
        """SIGTERM, grace period, SIGKILL. 409 with the final status if it already ended."""
        # Returns once the terminal event is readable.
        return await session_of(sup, session_id, who).stop(task_id)

    @api.post(
        f"{_TASK}/input",
        tags=_TASKS,
        status_code=204,
        response_class=Response,
        responses=error_responses(404, 409, 413),
    )
    async def send_input(
        session_id: SessionId, task_id: TaskId, body: InputBody, who: Who
    ) -> Response:
        """Write to the task's stdin (at most 1 MiB per request); ``eof`` closes it after."""
        session = session_of(sup, session_id, who)
        await session.send_input(task_id, body.data(), eof=body.eof)
        return Response(status_code=204)

    @api.post(
        f"{_TASK}/wait",
        tags=_TASKS,
        response_model=WaitResult,
        responses=error_responses(404, 413),
    )
    async def wait_task(
        session_id: SessionId, task_id: TaskId, body: WaitBody, who: Who
    ) -> dict[str, Any]:
        """Wait (server-side, up to ``timeout_s``) for the final status."""
        session = session_of(sup, session_id, who)
        try:
            info = await session.wait(task_id, body.timeout_s)
        except WaitTimeout:
            return {"timed_out": True, "task": await session.get(task_id)}
        # session.wait returns once the terminal event is stored and published, so /events
        # and /notifications never lag this answer.
        return {"timed_out": False, "task": info}


def _output_body(sl: OutputSlice, encoding: Literal["text", "base64"]) -> dict[str, Any]:
    """A slice as OutputText's JSON."""
    body: dict[str, Any] = {"offset": sl.offset, "next_offset": sl.next_offset, "eof": sl.eof}
    if encoding == "base64":
        body["data_b64"] = base64.b64encode(sl.data).decode()
    else:
        body["text"] = sl.text
        body["lossy"] = sl.lossy
    return body


def _output_routes(api: FastAPI, sup: Supervisor) -> None:
    @api.get(
        f"{_TASK}/output",
        tags=_OUTPUT,
        response_model=OutputText,
        responses={**_RAW_OUTPUT, **error_responses(400, 404)},
    )
    async def read_output(
        session_id: SessionId,
        task_id: TaskId,
        who: Who,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET), INTEGER] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_READ), INTEGER] = 65536,
        encoding: Literal["text", "base64", "raw"] = "text",
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S), NUMBER] = 0.0,
    ) -> Response:
        """Bytes at ``offset``. ``text`` decodes UTF-8 with replacement (``lossy`` says so);
        ``base64`` and ``raw`` keep bytes exact. ``wait_s`` waits for output past ``offset``."""
        session = session_of(sup, session_id, who)
        if wait_s > 0:
            # Returns at once when the file already holds bytes past offset or the task has
            # ended: one read either way.
            await session.wait_output(task_id, offset, wait_s)
        sl = await session.read_output(task_id, offset, limit)
        if encoding == "raw":
            return Response(
                sl.data,
                media_type="application/octet-stream",
                headers={"X-Next-Offset": str(sl.next_offset), "X-EOF": str(sl.eof).lower()},
            )
        return JSONResponse(_output_body(sl, encoding))

    @api.get(
        f"{_TASK}/output/file",
        tags=_OUTPUT,
        response_class=OutputFileResponse,
        responses={**_FILE, **error_responses(404)},
    )
    async def output_file(session_id: SessionId, task_id: TaskId, who: Who) -> Response:
        """Download the whole output file (as far as it is written when the request comes)."""
        session = session_of(sup, session_id, who)
        info = await session.get(task_id)
        size = await asyncio.to_thread(_size, info.output_path)
        return OutputFileResponse(
            _file_bytes(session, task_id, size),
            headers={
                "Content-Disposition": f'attachment; filename="{task_id}.output"',
                "Cache-Control": "no-store",
            },
        )

    @api.get(f"{_TASK}/tail", tags=_OUTPUT, response_model=Tail, responses=error_responses(404))
    async def tail(
        session_id: SessionId,
        task_id: TaskId,
        who: Who,
        chars: Annotated[int, Query(ge=1, le=1_000_000), INTEGER] = 4000,
    ) -> dict[str, Any]:
        """The last ``chars`` characters of output."""
        text = await session_of(sup, session_id, who).tail(task_id, chars)
        return {"text": text, "lossy": "\ufffd" in text}

    @api.post(
        f"{_TASK}/wait-for",
        tags=_OUTPUT,
        response_model=WaitForResult,
        response_model_exclude_none=True,
        responses=error_responses(400, 404, 409, 413),
    )
    async def wait_for(
        session_id: SessionId, task_id: TaskId, body: WaitForBody, who: Who
    ) -> dict[str, Any]:
        """First output line matching ``pattern`` (earlier lines count). 409 if the task ended
        without one."""
        session = session_of(sup, session_id, who)
        try:
            match = await session.wait_for(task_id, body.pattern, body.timeout_s, body.from_offset)
        except WaitTimeout:
            return {"matched": False, "timed_out": True}
        return {"matched": True, "timed_out": False, "line": match.line, "offset": match.offset}
