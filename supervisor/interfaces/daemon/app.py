"""The HTTP API (FastAPI) over one Supervisor: sessions, tasks, output, events, notifications.

No ``from __future__ import annotations`` here: FastAPI resolves dependency annotations at
runtime, and the ``Who`` alias is local to ``create_app``.
"""

import base64
import functools
import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from supervisor.core.errors import (
    EngineError,
    EngineUnavailable,
    ImageMissing,
    LimitExceeded,
    PolicyError,
    RuntimeUnavailable,
    SessionEnded,
    SessionNotFound,
    StateStorageError,
    StdinClosed,
    SupervisorError,
    TaskNotFound,
    TaskNotRunning,
    WaitTimeout,
)
from supervisor.core.events import NOTIFY_TYPES, BaseEvent
from supervisor.core.models import Kind, TaskInfo, TaskSpec
from supervisor.core.render import render_json, render_xml
from supervisor.core.validation import spec_error
from supervisor.interfaces.daemon.auth import Auth, Principal
from supervisor.runtime.session import Session
from supervisor.runtime.supervisor import Supervisor

#: The OpenAPI description of the API.
API_DESCRIPTION = (
    "sandbox-supervisor: every background command an agent launches, in its own hardened "
    "container.\n\nEvery route except /healthz needs `Authorization: Bearer <token>`."
)
MAX_WAIT_S = 300.0
#: Live tokens per session; minting more revokes the oldest.
MAX_TOKENS_PER_SESSION = 16
#: Largest seq a request may name (what an SQLite integer holds).
MAX_SEQ = 2**63 - 1
#: Largest byte offset a request may name. Output files are capped at 64 GiB by policy; some
#: filesystems refuse to seek past 16 TiB (ext4: EINVAL, which surfaced as a 500).
MAX_OFFSET = 2**40
#: Longest duration string accepted before range checks (keeps the arithmetic finite).
_MAX_DURATION_S = 10.0**9
_STATUS: dict[type[SupervisorError], int] = {
    TaskNotFound: 404,
    SessionNotFound: 404,
    PolicyError: 400,
    TaskNotRunning: 409,
    SessionEnded: 409,
    StdinClosed: 409,
    LimitExceeded: 429,
    EngineUnavailable: 503,
    RuntimeUnavailable: 503,
    ImageMissing: 424,
    StateStorageError: 507,
    EngineError: 502,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_duration(value: str | float | int, field_name: str) -> float:
    """Seconds from ``500ms``/``30s``/``5m``/``1h`` or a plain number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{field_name}: {value!r} is not a duration (use 500ms, 30s, 5m or 1h)")
    seconds = float(match.group(1)) * _UNIT_MS[match.group(2)] / 1000
    # A long digit string parses to inf; int(inf) would escape as an OverflowError (a 500).
    if not math.isfinite(seconds) or seconds > _MAX_DURATION_S:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise ValueError(f"{field_name}: {shown!r} is far too long")
    return seconds


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


class ApiError(Exception):
    """An error the API answers with directly (auth, hosts)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


# -- request bodies ---------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_Body):
    """Open (or re-open) a session and get a token for it."""

    session_id: str | None = None
    """1-64 letters, digits, ``_.-``; omitted: a random id."""


#: Duration string field -> (TaskSpec field it stands for, seconds-to-unit factor).
_DURATION_FIELDS: dict[str, tuple[str, int]] = {
    "timeout": ("timeout_ms", 1000),
    "poll_every": ("poll_every_s", 1),
    "stall_after": ("stall_after_s", 1),
    "idle_timeout": ("idle_timeout_ms", 1000),
}


@functools.cache
def _spec_field(name: str) -> TypeAdapter[Any]:
    """Validates one TaskSpec field on its own (its type and range)."""
    annotation = TaskSpec.model_fields[name].annotation
    assert annotation is not None
    return TypeAdapter(annotation)


def _converted(short: str, value: str) -> float | int:
    long, factor = _DURATION_FIELDS[short]
    number = parse_duration(value, short) * factor
    return int(number) if long.endswith("_ms") else number


class StartTask(TaskSpec):
    """A TaskSpec; durations may also be given as strings (``timeout: "10m"``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: str | None = None
    """Alternative to timeout_ms: ``500ms``, ``30s``, ``5m``, ``1h``."""
    poll_every: str | None = None
    """Alternative to poll_every_s, e.g. ``5m``."""
    stall_after: str | None = None
    """Alternative to stall_after_s, e.g. ``3s``."""
    idle_timeout: str | None = None
    """Alternative to idle_timeout_ms, e.g. ``2m``."""

    @field_validator("timeout", "poll_every", "stall_after", "idle_timeout")
    @classmethod
    def _duration(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Parse and range-check here, so a bad duration is a 422 naming this field."""
        if value is None or info.field_name is None:
            return value
        long, _ = _DURATION_FIELDS[info.field_name]
        number = _converted(info.field_name, value)
        try:
            _spec_field(long).validate_python(number)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            raise ValueError(f"{value!r} is {number} as {long}: {why}") from None
        return value

    @model_validator(mode="after")
    def _no_double(self) -> "StartTask":
        pairs = [
            ("timeout", "timeout_ms"),
            ("poll_every", "poll_every_s"),
            ("stall_after", "stall_after_s"),
            ("idle_timeout", "idle_timeout_ms"),
        ]
        for short, long in pairs:
            if getattr(self, short) is not None and getattr(self, long) is not None:
                raise ValueError(f"give either {short} or {long}, not both")
        return self

    def to_spec(self) -> dict[str, Any]:
        data = self.model_dump(
            exclude_unset=True, exclude={"timeout", "poll_every", "stall_after", "idle_timeout"}
        )
        for short, (long, _) in _DURATION_FIELDS.items():
            value = getattr(self, short)
            if value is not None:
                data[long] = _converted(short, value)
        return data


class InputBody(_Body):
    """Bytes for the task's stdin: ``text`` (UTF-8) or ``data_b64``; ``eof`` closes stdin after."""

    text: str | None = None
    data_b64: str | None = None
    eof: bool = False

    @model_validator(mode="after")
    def _one(self) -> "InputBody":
        if self.text is not None and self.data_b64 is not None:
            raise ValueError("give either text or data_b64, not both")
        return self

    def data(self) -> bytes:
        if self.data_b64 is not None:
            try:
                return base64.b64decode(self.data_b64, validate=True)
            except ValueError as exc:
                raise ValueError(f"data_b64: not valid base64 ({exc})") from exc
        return (self.text or "").encode("utf-8", "surrogatepass")


class WaitBody(_Body):
    timeout_s: Annotated[float, Field(gt=0, le=MAX_WAIT_S)] = 30.0
    """How long the server waits (at most 300 s; clients loop for longer)."""


class WaitForBody(_Body):
    pattern: Annotated[str, Field(min_length=1, max_length=10_000)]
    """A regular expression searched in each output line."""
    timeout_s: Annotated[float, Field(gt=0, le=MAX_WAIT_S)] = 30.0
    from_offset: Annotated[int, Field(ge=0, le=MAX_OFFSET)] = 0


class AckBody(_Body):
    consumer: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    seq: Annotated[int, Field(ge=0)]


# -- app --------------------------------------------------------------------------------


@dataclass
class AppConfig:
    """How the app is exposed."""

    allowed_hosts: set[str] = field(default_factory=set)
    """Host header values accepted (TCP only; empty: any, for the unix socket)."""
    allowed_origins: set[str] = field(default_factory=set)


class _HostOriginGuard(BaseHTTPMiddleware):
    """DNS-rebinding defence for the TCP listener: Host and Origin must be on the allowlist."""

    def __init__(self, app: Any, config: AppConfig) -> None:
        super().__init__(app)
        self.config = config

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if self.config.allowed_hosts:
            host = request.headers.get("host", "")
            if host not in self.config.allowed_hosts:
                return JSONResponse(
                    error_body("forbidden_host", f"Host {host!r} is not allowed"), status_code=403
                )
        origin = request.headers.get("origin")
        # Browsers reach only the TCP listener; the unix socket app has no allowlists.
        if (
            self.config.allowed_hosts
            and origin is not None
            and origin not in self.config.allowed_origins
        ):
            return JSONResponse(
                error_body("forbidden_origin", f"Origin {origin!r} is not allowed"),
                status_code=403,
            )
        return await call_next(request)


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def task_json(info: TaskInfo) -> dict[str, Any]:
    return info.model_dump(mode="json")


def create_app(sup: Supervisor, auth: Auth, config: AppConfig | None = None) -> FastAPI:
    """Build the API for ``sup``. The caller owns the supervisor's lifetime."""
    config = config or AppConfig()
    app = FastAPI(
        title="sandbox-supervisor",
        version="0.1.0",
        description=API_DESCRIPTION,
    )
    app.add_middleware(_HostOriginGuard, config=config)

    # -- errors --------------------------------------------------------------------------

    @app.exception_handler(SupervisorError)
    async def _sup_error(request: Request, exc: SupervisorError) -> JSONResponse:
        status = next((s for t, s in _STATUS.items() if isinstance(exc, t)), 500)
        extra: dict[str, Any] = {}
        if isinstance(exc, TaskNotRunning):
            extra["task"] = task_json(exc.info)
        return JSONResponse(error_body(exc.code, str(exc), **extra), status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(error_body(exc.code, str(exc)), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes answer exactly like admin-only routes refused to a session token
        # (and like unknown ids), so a 404 says nothing about what exists.
        if exc.status_code == 404:
            return JSONResponse(error_body("not_found", "no such resource"), status_code=404)
        if exc.status_code == 400:
            # FastAPI's "error parsing the body" (e.g. JSON that is not UTF-8). Like a
            # malformed body: authentication first, then the same 422 as a JSON decode error.
            if auth.check(_bearer(request.headers.get("authorization"))) is None:
                return await _api_error(
                    request, ApiError(401, "unauthorized", "missing or invalid bearer token")
                )
            message = f"body: {exc.detail}"
            return JSONResponse(
                error_body(
                    "invalid_request", message, fields=[{"field": "body", "message": exc.detail}]
                ),
                status_code=422,
            )
        code = "method_not_allowed" if exc.status_code == 405 else "http_error"
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI parses a JSON body before it resolves dependencies: without this, an
        # unauthenticated request with a malformed body would learn 422 instead of 401.
        if auth.check(_bearer(request.headers.get("authorization"))) is None:
            return await _api_error(
                request, ApiError(401, "unauthorized", "missing or invalid bearer token")
            )
        fields = []
        parts = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
            name = ".".join(loc) or "body"
            if err.get("type") == "json_invalid":
                name = "body"  # its loc is a character position, not a field
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            if err.get("type") == "extra_forbidden":
                msg = "unknown field"
            fields.append({"field": name, "message": msg})
            parts.append(f"{name}: {msg}")
        return JSONResponse(
            error_body("invalid_request", "; ".join(parts), fields=fields), status_code=422
        )

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", str(exc)), status_code=422)

    # -- auth helpers -----------------------------------------------------------------

    async def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        who = auth.check(_bearer(authorization))
        if who is None:
            raise ApiError(401, "unauthorized", "missing or invalid bearer token")
        return who

    Who = Annotated[Principal, Depends(principal)]

    def admin_only(who: Principal) -> None:
        if not who.admin:
            # A session token must not learn whether other sessions exist.
            raise ApiError(404, "not_found", "no such resource")

    async def admin(who: Who) -> Principal:
        """A dependency, so the refusal comes before the body is validated (no 422 leak)."""
        admin_only(who)
        return who

    Admin = Annotated[Principal, Depends(admin)]

    def session_of(session_id: str, who: Principal) -> Session:
        if not who.admin and who.session_id != session_id:
            raise SessionNotFound(session_id)
        return sup.session(session_id)

    def session_info(session: Session) -> dict[str, Any]:
        return {
            "session_id": session.session_id,
            "created_at": session.created_at,
            "ended": session.ended,
            "tasks": session.task_count(),
            "running": session.running_count(),
            "last_seq": session.event_log.last_seq,
        }

    # -- health ---------------------------------------------------------------------------

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        """Engine state and load; 200 when the engine answers, 503 otherwise."""
        ok = True
        try:
            await sup.ensure_engine()
        except EngineUnavailable:
            ok = False
        body = {
            "status": "ok" if ok else "degraded",
            "engine": {"ok": ok, **sup.engine_info},
            "sessions": len(sup.sessions()),
            "running_tasks": sum(s.running_count() for s in sup.sessions()),
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    # -- sessions -------------------------------------------------------------------------

    @app.post("/sessions", status_code=201, tags=["sessions"])
    async def create_session(body: CreateSession, who: Admin) -> dict[str, Any]:
        """Admin only: open a session (idempotent per id) and mint a token for it."""
        try:
            session = await sup.open_session(body.session_id)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"session_id: {exc}") from exc
        token, digest = auth.new_session_token(session.session_id)
        session.token_digests.append(digest)
        # Each call mints a token; keep the newest few live so "ensure the session exists"
        # loops cannot grow this forever (older tokens of the session are revoked).
        for old in session.token_digests[:-MAX_TOKENS_PER_SESSION]:
            auth.forget(old)
        del session.token_digests[:-MAX_TOKENS_PER_SESSION]
        await sup.store.set_session_data(
            session.session_id, json.dumps({"token_sha256": session.token_digests})
        )
        return {**session_info(session), "token": token}

    @app.get("/sessions", tags=["sessions"])
    async def list_sessions(who: Who) -> list[dict[str, Any]]:
        """Admin: every open session. A session token: just its own."""
        return [
            session_info(s) for s in sup.sessions() if who.admin or s.session_id == who.session_id
        ]

    @app.get("/sessions/{session_id}", tags=["sessions"])
    async def get_session(session_id: str, who: Who) -> dict[str, Any]:
        return session_info(session_of(session_id, who))

    async def _end(session_id: str, who: Principal) -> dict[str, Any]:
        session = session_of(session_id, who)
        running = session.running_count()
        await session.end()
        auth.revoke(session_id)
        return {"session_id": session_id, "ended": True, "tasks_stopped": running}

    @app.delete("/sessions/{session_id}", tags=["sessions"])
    async def end_session(session_id: str, who: Who) -> dict[str, Any]:
        """Stop every task, remove the containers, revoke the session's tokens."""
        return await _end(session_id, who)

    @app.post("/sessions/{session_id}/end", tags=["sessions"])
    async def end_session_post(session_id: str, who: Who) -> dict[str, Any]:
        """Same as DELETE /sessions/{id}."""
        return await _end(session_id, who)

    # -- tasks ------------------------------------------------------------------------------

    @app.post("/sessions/{session_id}/tasks", status_code=201, tags=["tasks"])
    async def start_task(session_id: str, body: StartTask, who: Who) -> dict[str, Any]:
        """Start a command in a fresh sandbox; returns at once with the id and output path."""
        session = session_of(session_id, who)
        try:
            spec = TaskSpec.model_validate(body.to_spec())
        except ValueError as exc:
            from pydantic import ValidationError  # noqa: PLC0415

            if isinstance(exc, ValidationError):
                raise spec_error(exc) from exc
            raise
        return task_json(await session.start(spec))

    @app.get("/sessions/{session_id}/tasks", tags=["tasks"])
    async def list_tasks(
        session_id: str,
        who: Who,
        kind: Kind | None = None,
        active: bool = False,
    ) -> list[dict[str, Any]]:
        session = session_of(session_id, who)
        return [task_json(t) for t in await session.list(kind, active_only=active)]

    @app.get("/sessions/{session_id}/tasks/{task_id}", tags=["tasks"])
    async def get_task(session_id: str, task_id: str, who: Who) -> dict[str, Any]:
        return task_json(await session_of(session_id, who).get(task_id))

    @app.get("/tasks/{task_id}", tags=["tasks"])
    async def find_task(task_id: str, who: Who) -> dict[str, Any]:
        """Find a task by id in any session (admin), or in the token's own session."""
        for s in sup.sessions():
            if not who.admin and s.session_id != who.session_id:
                continue
            try:
                return task_json(await s.get(task_id))
            except TaskNotFound:
                continue
        if who.admin:
            raise TaskNotFound(task_id, f"no task {task_id!r} in any open session")
        raise TaskNotFound(task_id)

    @app.post("/sessions/{session_id}/tasks/{task_id}/stop", tags=["tasks"])
    async def stop_task(session_id: str, task_id: str, who: Who) -> dict[str, Any]:
        """SIGTERM, grace period, SIGKILL. 409 with the final status if it already ended."""
        session = session_of(session_id, who)
        info = await session.stop(task_id)  # returns once the terminal event is readable
        return task_json(info)

    @app.post("/sessions/{session_id}/tasks/{task_id}/input", status_code=204, tags=["tasks"])
    async def send_input(session_id: str, task_id: str, body: InputBody, who: Who) -> Response:
        session = session_of(session_id, who)
        await session.send_input(task_id, body.data(), eof=body.eof)
        return Response(status_code=204)

    @app.get("/sessions/{session_id}/tasks/{task_id}/output", tags=["output"])
    async def read_output(
        session_id: str,
        task_id: str,
        who: Who,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        limit: Annotated[int, Query(ge=1, le=8 * 1024 * 1024)] = 65536,
        encoding: Literal["text", "base64", "raw"] = "text",
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> Response:
        """Bytes at ``offset``. ``text`` decodes UTF-8 with replacement (``lossy`` says so);
        ``base64`` and ``raw`` keep bytes exact. ``wait_s`` waits for output past ``offset``."""
        session = session_of(session_id, who)
        sl = await session.read_output(task_id, offset, limit)
        if not sl.data and not sl.eof and wait_s > 0:
            await session.wait_output(task_id, offset, wait_s)
            sl = await session.read_output(task_id, offset, limit)
        if encoding == "raw":
            return Response(
                sl.data,
                media_type="application/octet-stream",
                headers={"X-Next-Offset": str(sl.next_offset), "X-EOF": str(sl.eof).lower()},
            )
        body: dict[str, Any] = {"offset": sl.offset, "next_offset": sl.next_offset, "eof": sl.eof}
        if encoding == "base64":
            body["data_b64"] = base64.b64encode(sl.data).decode()
        else:
            body["text"] = sl.text
            body["lossy"] = sl.lossy
        return JSONResponse(body)

    @app.get("/sessions/{session_id}/tasks/{task_id}/tail", tags=["output"])
    async def tail(
        session_id: str,
        task_id: str,
        who: Who,
        chars: Annotated[int, Query(ge=1, le=1_000_000)] = 4000,
    ) -> dict[str, Any]:
        text = await session_of(session_id, who).tail(task_id, chars)
        return {"text": text, "lossy": "\ufffd" in text}

    @app.post("/sessions/{session_id}/tasks/{task_id}/wait", tags=["tasks"])
    async def wait_task(session_id: str, task_id: str, body: WaitBody, who: Who) -> dict[str, Any]:
        """Wait (server-side, up to ``timeout_s``) for the final status."""
        session = session_of(session_id, who)
        try:
            info = await session.wait(task_id, body.timeout_s)
        except WaitTimeout:
            return {"timed_out": True, "task": task_json(await session.get(task_id))}
        # session.wait returns once the terminal event is stored and published, so /events
        # and /notifications never lag this answer.
        return {"timed_out": False, "task": task_json(info)}

    @app.post("/sessions/{session_id}/tasks/{task_id}/wait-for", tags=["tasks"])
    async def wait_for(
        session_id: str, task_id: str, body: WaitForBody, who: Who
    ) -> dict[str, Any]:
        """First output line matching ``pattern`` (earlier lines count). 409 if the task ended
        without one."""
        session = session_of(session_id, who)
        try:
            match = await session.wait_for(task_id, body.pattern, body.timeout_s, body.from_offset)
        except WaitTimeout:
            return {"matched": False, "timed_out": True}
        return {"matched": True, "timed_out": False, "line": match.line, "offset": match.offset}

    # -- events ---------------------------------------------------------------------------

    async def _read(session: Session, after: int, limit: int, wait_s: float) -> list[BaseEvent]:
        log = session.event_log
        await log.caught_up()  # everything emitted before the request is readable
        events = await log.read_after(after, limit)
        if not events and wait_s > 0 and not log.closed:
            await log.wait_beyond(after, wait_s)
            events = await log.read_after(after, limit)
        return events

    @app.get("/sessions/{session_id}/events", tags=["events"])
    async def events(
        session_id: str,
        who: Who,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> dict[str, Any]:
        """Events with seq > ``after`` in seq order; long-polls up to ``wait_s`` when none."""
        session = session_of(session_id, who)
        batch = await _read(session, after, limit, wait_s)
        return {
            "events": [e.model_dump(mode="json") for e in batch],
            "last_seq": batch[-1].seq if batch else after,
            "ended": session.event_log.closed,
        }

    @app.get("/sessions/{session_id}/events/stream", tags=["events"])
    async def event_stream(
        session_id: str,
        who: Who,
        after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> StreamingResponse:
        """Server-sent events, ``id: <seq>``; reconnect with ``Last-Event-ID`` to resume."""
        session = session_of(session_id, who)
        cursor = after or 0
        if last_event_id is not None:
            try:
                cursor = int(last_event_id)
            except ValueError as exc:
                raise ApiError(422, "invalid_request", "Last-Event-ID: not a seq") from exc
            if not 0 <= cursor <= MAX_SEQ:
                # A negative cursor would replay a bogus retention gap starting below seq 1.
                raise ApiError(
                    422, "invalid_request", f"Last-Event-ID: {cursor} is not a seq (>= 0)"
                )

        async def stream() -> AsyncIterator[bytes]:
            nonlocal cursor
            log = session.event_log
            yield b": connected\n\n"
            while True:
                batch = await log.read_after(cursor, 500)
                if batch:
                    for ev in batch:
                        data = ev.model_dump_json()
                        yield f"id: {ev.seq}\nevent: {ev.type}\ndata: {data}\n\n".encode()
                        cursor = ev.seq
                    continue
                if log.closed:
                    return
                if not await log.wait_beyond(cursor, 15.0):
                    yield b": keep-alive\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    def _render(ev: BaseEvent, fmt: str) -> dict[str, Any]:
        item: dict[str, Any] = {"seq": ev.seq, "type": ev.type, "task_id": ev.task_id}
        if fmt == "xml":
            item["xml"] = render_xml(ev)
        else:
            item.update(render_json(ev))
        return item

    def _notifications(batch: list[BaseEvent]) -> list[BaseEvent]:
        return [e for e in batch if e.type in NOTIFY_TYPES]

    @app.get("/sessions/{session_id}/notifications", tags=["events"])
    async def notifications(
        session_id: str,
        who: Who,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
        format: Literal["xml", "json"] = "xml",
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    ) -> Response:
        """Agent-facing renderings of events after ``after``: ``<task-notification>`` and
        ``<background_task_poll>`` blocks (``format=xml``, plain text) or JSON."""
        session = session_of(session_id, who)
        batch = await _read(session, after, limit, wait_s)
        last = batch[-1].seq if batch else after
        items = _notifications(batch)
        if format == "xml":
            text = "\n".join(x for x in (render_xml(e) for e in items) if x)
            ended = str(session.event_log.closed and last >= session.event_log.last_seq)
            return PlainTextResponse(
                text,
                headers={"X-Sbx-Last-Seq": str(last), "X-Sbx-Ended": ended.lower()},
                media_type="application/xml",
            )
        return JSONResponse(
            {
                "notifications": [_render(e, "json") for e in items],
                "last_seq": last,
                "ended": session.event_log.closed and last >= session.event_log.last_seq,
            }
        )

    @app.get("/sessions/{session_id}/notifications/pending", tags=["events"])
    async def pending(
        session_id: str,
        who: Who,
        consumer: Annotated[str, Query(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")],
        format: Literal["xml", "json"] = "xml",
        limit: Annotated[int, Query(ge=1, le=10_000)] = 200,
    ) -> dict[str, Any]:
        """Notifications ``consumer`` has not acknowledged yet. Deliver them, then POST
        .../ack with ``cursor``: nothing reaches the agent twice, nothing is lost."""
        session = session_of(session_id, who)
        acked = await sup.store.get_cursor(session_id, consumer)
        await session.event_log.caught_up()
        batch = await session.event_log.read_after(acked, limit)
        cursor = batch[-1].seq if batch else acked
        items = [_render(e, format) for e in _notifications(batch)]
        return {"notifications": items, "cursor": cursor, "acked": acked}

    @app.post("/sessions/{session_id}/notifications/ack", tags=["events"])
    async def ack(session_id: str, body: AckBody, who: Who) -> dict[str, Any]:
        """Record that ``consumer`` delivered everything up to ``seq`` (never moves back)."""
        session = session_of(session_id, who)
        if body.seq > session.event_log.last_seq:
            raise ApiError(
                422,
                "invalid_request",
                f"seq: {body.seq} is beyond the last event ({session.event_log.last_seq})",
            )
        await sup.store.set_cursor(session_id, body.consumer, body.seq)
        return {
            "consumer": body.consumer,
            "acked": await sup.store.get_cursor(session_id, body.consumer),
        }

    return app
