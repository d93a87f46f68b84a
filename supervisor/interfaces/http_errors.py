"""The HTTP edge: the errors of the HTTP API itself (answered by the daemon, raised again by
the client), the HTTP status of every error class, and a daemon's answer turned back into
the error it stands for. Core's errors carry a code and a message only; everything HTTP
about them is here.

The client (``interfaces.client``) and the daemon (``interfaces.daemon``) both import this
module, so the codes below are registered wherever a wire body can be read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.core import errors as core
from supervisor.core import problems, workspace_errors
from supervisor.core.errors import SupervisorError
from supervisor.core.wire import make_error

__all__ = [
    "DaemonError",
    "DaemonNotRunning",
    "Forbidden",
    "ForbiddenCsrf",
    "ForbiddenHost",
    "ForbiddenOrigin",
    "HttpError",
    "InputTooLarge",
    "MethodNotAllowed",
    "NotFound",
    "RequestTimeout",
    "RequestTooLarge",
    "TooManyConnections",
    "Unauthorized",
    "from_wire",
    "status_of",
]


class Unauthorized(SupervisorError, PermissionError):
    """The request has no valid bearer token."""

    code = "unauthorized"

    def __init__(self, message: str = "missing or invalid bearer token") -> None:
        super().__init__(message)


class NotFound(SupervisorError, LookupError):
    """No such resource: an unknown route, or one this token may not see (the same answer,
    so a refusal says nothing about what exists)."""

    code = "not_found"

    def __init__(self, message: str = "no such resource") -> None:
        super().__init__(message)


class Forbidden(SupervisorError, PermissionError):
    """The daemon refuses the request whoever asks (DNS-rebinding defence on TCP)."""

    code = "forbidden"


class ForbiddenHost(Forbidden):
    """The ``Host`` header is not on the TCP listener's allowlist."""

    code = "forbidden_host"


class ForbiddenOrigin(Forbidden):
    """The ``Origin`` header is not on the TCP listener's allowlist."""

    code = "forbidden_origin"


class ForbiddenCsrf(Forbidden):
    """An API request on the dashboard's cookie without its login's CSRF token."""

    code = "forbidden_csrf"


class MethodNotAllowed(SupervisorError):
    """The route exists but not with this HTTP method; ``allowed`` lists its methods."""

    code = "method_not_allowed"

    def __init__(
        self, method: str = "", allowed: Iterable[str] = (), *, message: str | None = None
    ) -> None:
        self.allowed = sorted(set(allowed))
        super().__init__(
            message or f"{method} is not allowed here (allowed: {', '.join(self.allowed)})"
        )

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        allowed = detail.get("allowed")
        return cls(allowed=[str(a) for a in allowed or [] if isinstance(a, str)], message=message)

    def wire_detail(self) -> dict[str, Any]:
        return {"allowed": self.allowed}


class RequestTooLarge(SupervisorError, ValueError):
    """The request body is over its route's limit; ``limit`` is that limit in bytes."""

    code = "request_too_large"

    def __init__(self, message: str, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        limit = detail.get("limit")
        return cls(message, limit if isinstance(limit, int) else 0)

    def wire_detail(self) -> dict[str, Any]:
        return {"limit": self.limit}


class InputTooLarge(RequestTooLarge):
    """More bytes for a task's stdin in one request than the limit allows."""

    code = "input_too_large"


class RequestTimeout(SupervisorError, TimeoutError):
    """The request's head or body did not arrive in time."""

    code = "request_timeout"


class TooManyConnections(SupervisorError, ConnectionError):
    """The listener already holds as many connections as it allows."""

    code = "too_many_connections"


class HttpError(SupervisorError):
    """An HTTP error with no narrower meaning (also: an answer that is not the API's JSON);
    ``status`` is the one it came with."""

    code = "http_error"

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class DaemonError(SupervisorError, ConnectionError):
    """The connection to the daemon failed mid-request, or its answer was unreadable."""

    code = "daemon_error"


class DaemonNotRunning(DaemonError):
    """No daemon answers at the expected address."""

    code = "daemon_unavailable"


#: The status the daemon answers each class with; a subclass not listed takes its nearest
#: listed parent's (``status_of``).
STATUS: Mapping[type[SupervisorError], int] = {
    core.TaskNotFound: 404,
    core.SessionNotFound: 404,
    core.SessionEnded: 409,
    core.TaskNotRunning: 409,
    core.StdinClosed: 409,
    core.PolicyError: 400,
    core.LimitExceeded: 429,
    core.EngineUnavailable: 503,
    core.ImageMissing: 424,
    core.RuntimeUnavailable: 503,
    core.Unsupported: 501,
    core.StateStorageError: 507,
    core.EngineError: 502,
    core.InputNotRead: 409,
    problems.InvalidRequest: 422,
    workspace_errors.WorkspaceBusy: 409,
    workspace_errors.WorkspaceFull: 507,
    workspace_errors.NoWorkspace: 404,
    workspace_errors.WorkspaceError: 409,
    workspace_errors.WorkspaceConflict: 409,
    workspace_errors.WorkspaceMoved: 409,
    workspace_errors.NoBackup: 404,
    Unauthorized: 401,
    NotFound: 404,
    Forbidden: 403,
    MethodNotAllowed: 405,
    RequestTooLarge: 413,
    RequestTimeout: 408,
    TooManyConnections: 503,
    DaemonError: 502,
    DaemonNotRunning: 503,
}

#: For a class with no listed ancestor (an error added later): the builtin it mixes in says
#: what kind of failure it is.
_BY_KIND: tuple[tuple[type[BaseException], int], ...] = (
    (LookupError, 404),
    (PermissionError, 403),
    (TimeoutError, 504),
    (ConnectionError, 503),
    (ValueError, 400),
)


def status_of(exc: SupervisorError) -> int:
    """The HTTP status for ``exc``: its class's or its nearest listed parent's in ``STATUS``,
    else by its builtin mixin, else 500. An ``HttpError`` keeps the status it came with."""
    if isinstance(exc, HttpError):
        return exc.status
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return next((status for kind, status in _BY_KIND if isinstance(exc, kind)), 500)


def from_wire(
    body: object, status: int, *, task_id: str | None = None, session_id: str | None = None
) -> SupervisorError:
    """The error a daemon's answer ``{"error": {"code", "message", ...}}`` with HTTP
    ``status`` stands for, with ``body`` set. ``task_id``/``session_id``: the ids the request
    named, for errors whose body does not carry them. An answer that is not the API's JSON
    (a proxy's error page) becomes :class:`HttpError` with that status."""
    detail = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(detail, Mapping):
        detail = {}
    code = str(detail.get("code") or HttpError.code)
    message = str(detail.get("message") or "") or f"the daemon answered HTTP {status}"
    if code == HttpError.code:
        exc: SupervisorError = HttpError(message, status)
    else:
        exc = make_error(code, message, detail, task_id=task_id, session_id=session_id)
    exc.body = dict(body) if isinstance(body, Mapping) else {}
    return exc
