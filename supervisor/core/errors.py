"""The one exception tree every public API raises from."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.core.models import TaskInfo


class SupervisorError(Exception):
    """Root of every error sandbox-supervisor raises on purpose.

    ``code`` is a stable, machine-readable name the HTTP API and MCP server reuse.
    """

    code: str = "supervisor_error"


class TaskNotFound(SupervisorError, LookupError):
    """No task with this id in this session (also: a task of another session)."""

    code = "task_not_found"

    def __init__(self, task_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no task {task_id!r} in this session")
        self.task_id = task_id


class SessionNotFound(SupervisorError, LookupError):
    """No session with this id."""

    code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r}")
        self.session_id = session_id


class SessionEnded(SupervisorError):
    """The session has ended; it takes no new tasks."""

    code = "session_ended"


class TaskNotRunning(SupervisorError):
    """The task has already ended; ``info`` carries its final status."""

    code = "task_not_running"

    def __init__(self, info: TaskInfo, message: str | None = None) -> None:
        detail = info.describe_end()
        super().__init__(message or f"task {info.task_id} is not running ({detail})")
        self.info = info


class StdinClosed(SupervisorError):
    """The task's stdin is closed (``stdin="closed"`` or EOF already sent)."""

    code = "stdin_closed"


class WaitTimeout(SupervisorError, TimeoutError):
    """A wait ran out of time before the task ended or the pattern appeared."""

    code = "wait_timeout"


class PolicyError(SupervisorError, ValueError):
    """A policy file or a task spec breaks the rules: names the field and what is allowed."""

    code = "policy_error"


class SpecError(PolicyError):
    """A task spec field is invalid or asks for more than its policy allows."""

    code = "invalid_spec"


class LimitExceeded(SupervisorError):
    """A configured capacity limit (running tasks per session, ...) is reached."""

    code = "limit_exceeded"


class EngineUnavailable(SupervisorError, ConnectionError):
    """The container engine does not answer."""

    code = "engine_unavailable"


class ImageMissing(SupervisorError, LookupError):
    """The policy's image is not present on the engine (build it with ``sbx images build``)."""

    code = "image_missing"


class RuntimeUnavailable(SupervisorError):
    """The policy's container runtime (e.g. runsc) is not usable; we never fall back."""

    code = "runtime_unavailable"


class StateStorageError(SupervisorError, OSError):
    """The state directory cannot be written (full disk, permissions)."""

    code = "state_storage_error"


class EngineError(SupervisorError):
    """The engine refused an operation for a reason not covered by a narrower error."""

    code = "engine_error"


# -- The HTTP API's own refusals -------------------------------------------------------
# The daemon answers these before (or instead of) calling the library; each has its own
# stable code, so a client can map a code back to its class.


class Unauthorized(SupervisorError, PermissionError):
    """No valid bearer token (HTTP 401)."""

    code = "unauthorized"

    def __init__(self, message: str = "missing or invalid bearer token") -> None:
        super().__init__(message)


class ForbiddenHost(SupervisorError, PermissionError):
    """The TCP listener does not answer to this ``Host`` (DNS-rebinding defence; HTTP 403)."""

    code = "forbidden_host"


class ForbiddenOrigin(SupervisorError, PermissionError):
    """The TCP listener refuses requests from this ``Origin`` (HTTP 403)."""

    code = "forbidden_origin"


class NotFound(SupervisorError, LookupError):
    """No such resource: an unknown route, or an admin route asked with a session token.
    Both answer alike, so a 404 tells nothing about what exists (HTTP 404)."""

    code = "not_found"

    def __init__(self, message: str = "no such resource") -> None:
        super().__init__(message)


class MethodNotAllowed(SupervisorError):
    """The route exists, but not with this method; ``allowed`` lists its methods (HTTP 405)."""

    code = "method_not_allowed"

    def __init__(self, method: str, allowed: Iterable[str]) -> None:
        self.allowed = sorted(set(allowed))
        super().__init__(f"{method} is not allowed here (allowed: {', '.join(self.allowed)})")


class InvalidRequest(SupervisorError, ValueError):
    """The request does not fit the API's schema; ``fields`` names each bad field and says
    what is wrong with it (HTTP 422)."""

    code = "invalid_request"

    def __init__(self, fields: Sequence[tuple[str, str]]) -> None:
        self.fields = list(fields)
        super().__init__("; ".join(f"{name}: {why}" for name, why in self.fields))

    @classmethod
    def from_errors(cls, errors: Iterable[Mapping[str, Any]]) -> InvalidRequest:
        """From pydantic's ``ValidationError.errors()`` (or FastAPI's request errors)."""
        return cls(validation_problems(errors))


class RequestTooLarge(SupervisorError, ValueError):
    """The request body is over its route's limit; ``limit`` is that limit in bytes (413)."""

    code = "request_too_large"

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class InputTooLarge(RequestTooLarge):
    """More bytes for a task's stdin in one request than the limit allows (HTTP 413)."""

    code = "input_too_large"


class RequestTimeout(SupervisorError, TimeoutError):
    """The request's head or body did not arrive in time (HTTP 408)."""

    code = "request_timeout"


class TooManyConnections(SupervisorError, ConnectionError):
    """The listener already holds as many connections as it allows (HTTP 503)."""

    code = "too_many_connections"


def validation_problems(errors: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(field, what is wrong) for each pydantic error, worded for people: ``env.A``,
    ``query.limit``, ``header.Last-Event-ID``; ``unknown field`` for extra keys; the
    ``Value error, `` prefix dropped from our own validators' messages."""
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] == "body":
            loc = loc[1:]  # a JSON body's fields are named as they are in the body
        if len(loc) >= 2 and loc[0] == "header":
            loc[1] = "-".join(
                w.upper() if w.lower() == "id" else w.title() for w in loc[1].split("-")
            )
        name = ".".join(loc) or "body"
        kind = err.get("type")
        if kind == "json_invalid":
            name = "body"  # its loc is a character position, not a field
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if kind == "extra_forbidden":
            msg = "unknown field"
        elif kind == "json_invalid":
            ctx = err.get("ctx") or {}
            msg = f"not valid JSON ({ctx['error']})" if "error" in ctx else "not valid JSON"
        out.append((name, msg))
    return out
