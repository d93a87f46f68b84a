"""The one exception tree every public API raises from."""

from __future__ import annotations

from typing import TYPE_CHECKING

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


class InputNotRead(SupervisorError, TimeoutError):
    """Input sent to a task's stdin was not taken in time: the command is not reading it."""

    code = "stdin_not_read"
