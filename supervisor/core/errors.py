"""The one exception tree every public API raises from, and its wire form.

Each class has a stable ``code``; the HTTP API answers ``{"error": {"code", "message", ...}}``
and :func:`from_wire` turns such a body back into the same class, so the CLI and the MCP
server branch on types, never on message text. Every subclass that names its own ``code``
is registered under it (:func:`error_class`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.core.models import TaskInfo

#: code -> the class registered under it.
_BY_CODE: dict[str, type[SupervisorError]] = {}


class SupervisorError(Exception):
    """Root of every error sandbox-supervisor raises on purpose.

    ``code`` is a stable, machine-readable name the HTTP API and MCP server reuse. ``status``
    is the HTTP status the daemon answers with (when rebuilt by :func:`from_wire`: the status
    it did answer with) and ``body`` the JSON body it came in (empty unless rebuilt).
    """

    code: str = "supervisor_error"
    status: int = 500
    retryable: bool = False
    """True when the same call may succeed unchanged a little later (nothing was done)."""
    body: Mapping[str, Any] = MappingProxyType({})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            _register(cls)

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        """This class from a wire body's ``error`` object (``known``: ids from the request)."""
        return cls(message)

    def wire_detail(self) -> dict[str, Any]:
        """What this error adds to ``{"code", "message"}`` on the wire (ids, the task)."""
        return {}

    def to_wire(self) -> dict[str, Any]:
        """The HTTP body for this error: ``{"error": {"code", "message", ...}}``."""
        return {"error": {"code": self.code, "message": str(self), **self.wire_detail()}}


def _register(cls: type[SupervisorError]) -> None:
    taken = _BY_CODE.get(cls.code)
    # The same class defined again (a module reloaded) replaces itself; two classes may not
    # share a code, or a wire body could not say which one it means.
    if taken is not None and (taken.__module__, taken.__qualname__) != (
        cls.__module__,
        cls.__qualname__,
    ):
        raise TypeError(f"error code {cls.code!r} is taken by {taken.__qualname__}")
    _BY_CODE[cls.code] = cls


_register(SupervisorError)


class TaskNotFound(SupervisorError, LookupError):
    """No task with this id in this session (also: a task of another session)."""

    code = "task_not_found"
    status = 404

    def __init__(self, task_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no task {task_id!r} in this session")
        self.task_id = task_id

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        return cls(str(detail.get("task_id") or known.get("task_id") or ""), message)

    def wire_detail(self) -> dict[str, Any]:
        return {"task_id": self.task_id}


class SessionNotFound(SupervisorError, LookupError):
    """No session with this id."""

    code = "session_not_found"
    status = 404

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no session {session_id!r}")
        self.session_id = session_id

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        return cls(str(detail.get("session_id") or known.get("session_id") or ""), message)

    def wire_detail(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class SessionEnded(SupervisorError):
    """The session has ended; it takes no new tasks."""

    code = "session_ended"
    status = 409


class TaskNotRunning(SupervisorError):
    """The task has already ended; ``info`` carries its final status."""

    code = "task_not_running"
    status = 409

    def __init__(self, info: TaskInfo, message: str | None = None) -> None:
        detail = info.describe_end()
        super().__init__(message or f"task {info.task_id} is not running ({detail})")
        self.info = info

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        task = detail.get("task")
        if not isinstance(task, Mapping):
            return None  # a body without the task: the caller falls back to the root class
        # Here, not at the top: the CLI imports this module on every start, pydantic it
        # needs only for this one error.
        from supervisor.core.models import TaskInfo  # noqa: PLC0415

        try:
            info = TaskInfo.model_validate(task)
        except ValueError:  # pydantic's ValidationError: not a task; same fallback
            return None
        return cls(info, message)

    def wire_detail(self) -> dict[str, Any]:
        return {"task": self.info.model_dump(mode="json")}


class StdinClosed(SupervisorError):
    """The task's stdin is closed (``stdin="closed"`` or EOF already sent)."""

    code = "stdin_closed"
    status = 409


class WaitTimeout(SupervisorError, TimeoutError):
    """A wait ran out of time before the task ended or the pattern appeared."""

    code = "wait_timeout"


class PolicyError(SupervisorError, ValueError):
    """A policy file or a task spec breaks the rules: names the field and what is allowed."""

    code = "policy_error"
    status = 400


class SpecError(PolicyError):
    """A task spec field is invalid or asks for more than its policy allows.

    With ``field``, the message is ``"<field>: <problem>"`` and ``problem`` holds the part
    after the name (for callers that name the field their own way, like ``--timeout``)."""

    code = "invalid_spec"

    def __init__(self, problem: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        field = detail.get("field")
        if isinstance(field, str) and message.startswith(f"{field}: "):
            return cls(message.removeprefix(f"{field}: "), field=field)
        return cls(message)

    def wire_detail(self) -> dict[str, Any]:
        return {"field": self.field} if self.field else {}


class LimitExceeded(SupervisorError):
    """A configured capacity limit (running tasks per session, ...) is reached."""

    code = "limit_exceeded"
    status = 429


class EngineUnavailable(SupervisorError, ConnectionError):
    """The container engine does not answer."""

    code = "engine_unavailable"
    status = 503


class EngineUnresponsive(EngineUnavailable):
    """The engine takes connections but an operation did not complete within its deadline
    (a wedged engine, e.g. the libnetwork deadlocks of Docker 20.10). Retryable: the same
    call may succeed once the engine answers again; nothing was started by this call."""

    code = "engine_unresponsive"
    status = 503
    retryable = True

    def __init__(self, call: str, deadline_s: float, message: str | None = None) -> None:
        super().__init__(
            message
            or f"the Docker engine did not complete {call} within its {deadline_s:g} s "
            "deadline (it accepts connections but does not answer: wedged); retry later"
        )
        self.call = call
        self.deadline_s = deadline_s

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        try:
            deadline = float(detail.get("deadline_s") or 0.0)
        except (TypeError, ValueError):
            deadline = 0.0
        return cls(str(detail.get("call") or ""), deadline, message)

    def wire_detail(self) -> dict[str, Any]:
        return {"call": self.call, "deadline_s": self.deadline_s, "retryable": True}


class ImageMissing(SupervisorError, LookupError):
    """The policy's image is not present on the engine.

    Build it with ``sandvisor images build``.
    """

    code = "image_missing"
    status = 424


class RuntimeUnavailable(SupervisorError):
    """The policy's container runtime (e.g. runsc) is not usable; we never fall back."""

    code = "runtime_unavailable"
    status = 503


class PlacementUnavailable(RuntimeUnavailable):
    """No node of the cluster can take the task now: none that is ready, active, answers,
    runs the policy's runtime, has its image and matches its placement. Fails closed."""

    code = "placement_unavailable"


class Unsupported(SupervisorError):
    """The engine backend in use cannot do this (e.g. stdin EOF on Swarm)."""

    code = "unsupported"
    status = 501


class StateStorageError(SupervisorError, OSError):
    """The state directory cannot be written (full disk, permissions)."""

    code = "state_storage_error"
    status = 507


class EngineError(SupervisorError):
    """The engine refused an operation for a reason not covered by a narrower error."""

    code = "engine_error"
    status = 502


class InputNotRead(SupervisorError, TimeoutError):
    """Input sent to a task's stdin was not taken in time: the command is not reading it."""

    code = "stdin_not_read"
    status = 409


# -- errors of the HTTP API itself (answered by the daemon, raised again by the client) ----


class Unauthorized(SupervisorError, PermissionError):
    """The request has no valid bearer token."""

    code = "unauthorized"
    status = 401

    def __init__(self, message: str = "missing or invalid bearer token") -> None:
        super().__init__(message)


class NotFound(SupervisorError, LookupError):
    """No such resource: an unknown route, or one this token may not see (the same answer,
    so a refusal says nothing about what exists)."""

    code = "not_found"
    status = 404

    def __init__(self, message: str = "no such resource") -> None:
        super().__init__(message)


class Forbidden(SupervisorError, PermissionError):
    """The daemon refuses the request whoever asks (DNS-rebinding defence on TCP)."""

    code = "forbidden"
    status = 403


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
    status = 405

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
    status = 413

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
    status = 408


class TooManyConnections(SupervisorError, ConnectionError):
    """The listener already holds as many connections as it allows."""

    code = "too_many_connections"
    status = 503


class HttpError(SupervisorError):
    """An HTTP error with no narrower meaning (also: an answer that is not the API's JSON)."""

    code = "http_error"


class DaemonError(SupervisorError, ConnectionError):
    """The connection to the daemon failed mid-request, or its answer was unreadable."""

    code = "daemon_error"
    status = 502


class DaemonNotRunning(DaemonError):
    """No daemon answers at the expected address."""

    code = "daemon_unavailable"
    status = 503
