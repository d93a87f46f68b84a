"""Response bodies of the HTTP API, as pydantic models: they make the OpenAPI document exact
(and let schemathesis check every answer against it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from supervisor.core.events import Event
from supervisor.core.models import TaskInfo
from supervisor.state.workspace import ChangeKind, FileType


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldProblem(_Reply):
    """One bad field of a request."""

    field: str
    """Where: ``command``, ``env.A``, ``query.limit``, ``header.Last-Event-ID``, ``body``."""
    message: str
    """What is wrong, and what is allowed."""


class ErrorDetail(_Reply):
    """What went wrong."""

    code: str
    """Stable, machine-readable: ``unauthorized``, ``task_not_found``, ``invalid_request``..."""
    message: str
    """For people: names the field, the limit or the state."""
    fields: list[FieldProblem] | None = None
    """``invalid_request``: each bad field."""
    task: TaskInfo | None = None
    """``task_not_running``: the task's final status."""
    limit: int | None = None
    """``request_too_large``, ``input_too_large``: the limit in bytes."""
    allowed: list[str] | None = None
    """``method_not_allowed``: the route's methods (also in the ``Allow`` header)."""
    session_id: str | None = None
    """``session_not_found``: the session asked for."""
    task_id: str | None = None
    """``task_not_found``: the task asked for."""
    field: str | None = None
    """``invalid_spec``: the spec field at fault, when one is."""
    paths: list[str] | None = None
    """``workspace_conflict``, ``workspace_unsafe_path``: every path concerned."""
    task_ids: list[str] | None = None
    """``workspace_busy``: the session's tasks still running."""
    roots: list[str] | None = None
    """``workspace_outside_roots``: the daemon's allowed workspace roots."""


class ErrorBody(_Reply):
    """Every error answer: ``{"error": {"code", "message", ...}}``."""

    error: ErrorDetail


class EngineHealth(BaseModel):
    """The engine as last seen (version fields as the engine reports them)."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    """True when the engine answers and its operations complete (``state`` is ``up``)."""
    state: Literal["up", "wedged", "down"]
    """``wedged``: it takes connections but its operations do not complete in time (a
    deadlocked engine); ``down``: it does not answer."""
    detail: str | None = None
    """Why it is not up (absent when it is)."""


class EngineStatus(_Reply):
    """The data of ``engine.state`` on the event streams asked with ``engine=true`` (what the
    dashboard's banner shows): sent when the stream opens and again on each change."""

    state: Literal["up", "wedged", "down"]
    """As in ``/healthz``: ``wedged``, it takes connections but its operations do not
    complete in time (starts are refused with ``engine_unresponsive``); ``down``, it does not
    answer (``engine_unavailable``)."""
    detail: str | None = None
    """Why it is not up (None when it is)."""
    version: str | None = None
    """The engine's version as last seen (the admin only, as in ``/healthz``)."""
    warning: str | None = None
    """For an engine with known deadlocks (Docker 20.10 or older): what doctor says about
    them (the admin only)."""


class PoolHealth(_Reply):
    """The warm pools: containers started ahead, each waiting for one task's command."""

    containers: int
    """Ready containers, every policy and scope together."""
    ready: dict[str, int]
    """Ready containers per policy (the shared pool and sessions' own pools summed)."""


class Liveness(_Reply):
    """What ``/healthz`` tells a caller without the admin token: the daemon answers."""

    ok: Literal[True]


class Health(_Reply):
    """Engine state and load (the admin token only)."""

    status: Literal["ok", "degraded"]
    engine: EngineHealth
    sessions: int
    """Open sessions."""
    running_tasks: int
    """Tasks not yet ended, across sessions."""
    pool: PoolHealth
    """Warm containers that are not tasks yet (they count against no session)."""


class Owner(_Reply):
    """Who owns a workspace's root directory on the host."""

    uid: int
    gid: int


class WorkspaceInfo(_Reply):
    """A session's workspace."""

    path: str
    """The project directory on the host (its realpath)."""
    container_path: str
    """Where tasks see it and run in: the same path, or ``/workspace`` (see warning)."""
    mode: Literal["overlay", "ro", "rw"]
    owner: Owner
    """Owner of the directory: tasks run as this uid:gid (as the policy's
    ``workspace_root_owner`` says when it is root)."""
    warning: str | None = None
    """Why tasks do not see the workspace at its own path, when they do not."""


class SessionInfo(_Reply):
    """One session."""

    session_id: str
    created_at: float
    """Seconds since the epoch."""
    ended: bool
    tasks: int
    """Tasks started in this session (ended ones included)."""
    running: int
    """Tasks not yet ended."""
    last_seq: int
    """Seq of the session's newest event."""
    workspace: WorkspaceInfo | None = None
    """The project its tasks run on; null without one. Pending changes:
    ``GET /sessions/{id}/workspace/changes`` (listing them walks the session's layer)."""


class CreatedSession(SessionInfo):
    """A session and a new token for it (the only time the token is shown)."""

    token: str
    """Bearer token that sees and touches only this session."""


class EndedSession(_Reply):
    """What ending a session did."""

    session_id: str
    ended: Literal[True]
    tasks_stopped: int
    """Tasks that were still running and were stopped."""
    workspace_kept: bool = False
    """The session's overlay holds changes, kept (default: 7 days) until applied or
    discarded through ``/sessions/{id}/workspace/...`` with the admin token."""


class ChangeInfo(_Reply):
    """One change a session's tasks made to its overlay workspace."""

    path: str
    """Relative to the workspace root; bytes that are not UTF-8 shown as ``\\xNN`` (the
    exact name is then in ``path_b64``)."""
    path_b64: str | None = None
    """The exact name, base64, when it is not UTF-8."""
    kind: ChangeKind
    """added, modified (bytes or symlink target), deleted, replaced (type changed, or a
    directory replaced as a whole), mode (permission bits only)."""
    file_type: FileType
    """The new entry's type (the old one's for deleted)."""
    size: int
    """Bytes of the new file (the old one's for deleted); a symlink's target length."""
    old_type: FileType | None
    old_mode: int | None
    """Permission bits of the host's entry, when there is one."""
    new_mode: int | None
    old_size: int | None
    binary: bool
    ignored: bool
    """Matched by .gitignore or the default ignores (node_modules, .venv, ...): apply
    leaves it out."""
    conflict: bool
    """The host's entry changed since the session started: apply refuses it unless forced."""
    conflict_reason: str | None
    target: str | None
    """The new symlink's target."""
    target_b64: str | None = None
    old_target: str | None
    old_target_b64: str | None = None
    note: str | None
    """Anything else: special files apply skips, hard links, mount points."""
    applicable: bool
    """Whether apply can carry it over (devices, fifos and sockets cannot)."""
    digest: str | None = None
    """What apply would write at this path, as one hash (sha256 of the kind, the type, the
    new mode and the new bytes or link target). Passed back to apply as ``reviewed``, it
    makes apply write exactly what was reviewed, or refuse."""


class ChangesPage(_Reply):
    """A page of a session's changes, sorted by path."""

    changes: list[ChangeInfo]
    """At most ``limit`` changes, the first ones after ``after``."""
    total: int
    """Every change of the listing (the ignored ones only with ``ignored=true``)."""
    next: str | None
    """The ``after`` of the next page; null when this page is the last. A path, or
    ``b64:`` and the base64 of its bytes for a name that is not UTF-8 or begins with
    ``b64:``."""


class Discarded(_Reply):
    """What discarding a workspace's changes did."""

    session_id: str
    discarded: Literal[True]


class OutputText(_Reply):
    """A slice of output (``encoding=text`` or ``base64``)."""

    offset: int
    next_offset: int
    """Where the next read starts."""
    eof: bool
    """The task ended and nothing follows ``next_offset``."""
    text: str | None = None
    """``encoding=text``: UTF-8, invalid bytes replaced by U+FFFD."""
    lossy: bool | None = None
    """``encoding=text``: true when bytes were replaced."""
    data_b64: str | None = None
    """``encoding=base64``: the exact bytes."""


class StartedTask(TaskInfo):
    """A started task; with ``wait_output_s``, also its first output."""

    output: OutputText | None = None
    """Asked for with ``wait_output_s``: the output from offset 0 as of the answer (text,
    as ``GET .../output`` gives it). Empty when nothing came within the wait; ``eof`` when
    the task has already ended."""


class Tail(_Reply):
    """The last characters of output."""

    text: str
    lossy: bool
    """True when invalid UTF-8 was replaced."""


class WaitResult(_Reply):
    """The task's status after a server-side wait."""

    timed_out: bool
    task: TaskInfo


class WaitForResult(_Reply):
    """The first matching line, or a timeout."""

    matched: bool
    timed_out: bool
    line: str | None = None
    """The matching line, without its newline."""
    offset: int | None = None
    """Byte offset of the line's start."""


class Events(_Reply):
    """Events in seq order."""

    events: list[Event]
    last_seq: int
    """Seq of the last event returned (``after`` when none)."""
    ended: bool
    """The session has ended: no event follows."""


class Notification(_Reply):
    """One agent-facing notification."""

    seq: int
    type: str
    task_id: str | None
    xml: str | None = None
    """The ``<task-notification>`` (or ``<background_task_poll>``...) block."""
    event: Event | None = None
    """``format=json``: the event itself."""
    status: str | None = None
    """``format=json``, terminal events: completed, failed or killed."""
    summary: str | None = None
    """``format=json``: one sentence for people."""


class Notifications(_Reply):
    """Notifications after ``after`` (``format=json``)."""

    notifications: list[Notification]
    last_seq: int
    ended: bool


class Pending(_Reply):
    """What a consumer has not acknowledged yet."""

    notifications: list[Notification]
    cursor: int
    """Acknowledge this seq once these are delivered."""
    acked: int
    """The consumer's current cursor."""


class Acked(_Reply):
    """A consumer's cursor after an acknowledgement."""

    consumer: str
    acked: int


class LoginLink(_Reply):
    """A one-time dashboard login link."""

    url: str
    """Open it in a browser: it logs that browser in (once) as the caller (the admin, or
    one session) and leads to the dashboard."""
    expires_at: float
    """Until when it works if nobody uses it (seconds since the epoch)."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the error statuses a route answers besides the
    common ones (the app's document gives each the error schema, as JSON)."""
    return {status: {"description": ERROR_DESCRIPTIONS[status]} for status in statuses}


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Refused by the policy (policy_error, invalid_spec, workspace_outside_roots, "
    "workspace_unsafe_path)",
    401: "Missing or invalid bearer token or dashboard cookie (unauthorized)",
    403: "TCP listener: Host or Origin not allowed, a dashboard request on the cookie "
    "without its login's CSRF token, or one that changes state without an Origin "
    "(forbidden_host, forbidden_csrf, forbidden_origin)",
    404: "No such session, task or resource (session_not_found, task_not_found, not_found, "
    "no_workspace, workspace_no_backup)",
    405: "The route exists with other methods (method_not_allowed; see the Allow header)",
    408: "The request's head or body did not arrive in time (request_timeout)",
    409: "The task or session already ended, stdin is closed, the workspace's tasks still "
    "run or host files changed meanwhile (task_not_running, session_ended, stdin_closed, "
    "workspace_busy, workspace_conflict, workspace_error)",
    413: "The body is over the route's limit, or the input over its cap "
    "(request_too_large, input_too_large)",
    422: "The request does not fit the schema (invalid_request; fields names each one)",
    424: "The policy's image is missing (image_missing)",
    429: "The session runs as many tasks as its policy allows (limit_exceeded)",
    502: "The engine refused the operation (engine_error)",
    503: "The engine or the policy's runtime is unavailable, the engine did not answer "
    "within its deadline (retryable), or the listener is full (engine_unavailable, "
    "engine_unresponsive, runtime_unavailable, too_many_connections)",
    507: "The state directory cannot be written (state_storage_error)",
}
