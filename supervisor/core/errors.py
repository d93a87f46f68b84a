"""The one exception tree every public API raises from, and its wire form.

Each class has a stable ``code`` and a message; that is all core knows of them. The HTTP API
answers ``{"error": {"code", "message", ...}}`` with the status
``supervisor.interfaces.http_errors`` gives the class, and the client turns such a body back
into the same class (``http_errors.from_wire``), so the CLI and the MCP server branch on
types, never on message text. Every subclass that names its own ``code`` is registered under
it (``core.wire.error_class``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.core.models import TaskInfo

#: code -> the class registered under it.
_BY_CODE: dict[str, type[SupervisorError]] = {}


class SupervisorError(Exception):
    """Root of every error sandbox-supervisor raises on purpose.

    ``code`` is a stable, machine-readable name the HTTP API and MCP server reuse; ``body``
    is the wire body it was rebuilt from (empty unless rebuilt).
    """

    code: str = "supervisor_error"
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


class TaskNotRunning(SupervisorError):
    """The task has already ended; ``info`` carries its final status."""

    code = "task_not_running"

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


class WaitTimeout(SupervisorError, TimeoutError):
    """A wait ran out of time before the task ended or the pattern appeared."""

    code = "wait_timeout"


class PolicyError(SupervisorError, ValueError):
    """A policy file or a task spec breaks the rules: names the field and what is allowed."""

    code = "policy_error"


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


class EngineUnavailable(SupervisorError, ConnectionError):
    """The container engine does not answer."""

    code = "engine_unavailable"


class EngineUnresponsive(EngineUnavailable):
    """The engine takes connections but an operation did not complete within its deadline
    (a wedged engine, e.g. the libnetwork deadlocks of Docker 20.10). Retryable: the same
    call may succeed once the engine answers again; nothing was started by this call."""

    code = "engine_unresponsive"
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


class RuntimeUnavailable(SupervisorError):
    """The policy's container runtime (e.g. runsc) is not usable; we never fall back."""

    code = "runtime_unavailable"


class PlacementUnavailable(RuntimeUnavailable):
    """No node of the cluster can take the task now: none that is ready, active, answers,
    runs the policy's runtime, has its image and matches its placement. Fails closed."""

    code = "placement_unavailable"


class Unsupported(SupervisorError):
    """The engine backend in use cannot do this (e.g. stdin EOF on Swarm)."""

    code = "unsupported"


class StateStorageError(SupervisorError, OSError):
    """The state directory cannot be written (full disk, permissions)."""

    code = "state_storage_error"


class EngineError(SupervisorError):
    """The engine refused an operation for a reason not covered by a narrower error."""

    code = "engine_error"


class InputNotRead(SupervisorError, TimeoutError):
    """Input sent to a task's stdin was not taken in time: the command is not reading it."""

    code = "stdin_not_read"
