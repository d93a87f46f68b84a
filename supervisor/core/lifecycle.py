"""Pure task state machine: every task reaches exactly one final outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from supervisor.core.models import StopReason, TaskStatus

StopRequest = Literal["timeout", "idle_timeout", "user_stopped", "session_ended", "workspace_full"]
_KILLED_REASONS: frozenset[str] = frozenset(get_args(StopRequest))


@dataclass(frozen=True)
class Outcome:
    """How a task ended."""

    status: TaskStatus
    reason: StopReason | None
    exit_code: int | None = None
    error_code: str | None = None
    error: str | None = None

    @property
    def ran(self) -> bool:
        """False for tasks that never ran (their terminal event is ``task.failed``)."""
        return self.reason is not None


def status_for(reason: StopReason, exit_code: int | None) -> TaskStatus:
    """completed (exit 0), killed (stopped by someone), failed (anything else)."""
    if reason == "exit":
        return "completed" if exit_code == 0 else "failed"
    if reason in _KILLED_REASONS:
        return "killed"
    return "failed"


class Lifecycle:
    """starting -> running -> stopping -> ended. The first stop request names the reason;
    the first ``finish_*`` call wins and every later one returns None."""

    __slots__ = ("outcome", "started", "stop_reason")

    def __init__(self) -> None:
        self.started = False
        self.stop_reason: StopRequest | None = None
        self.outcome: Outcome | None = None

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    @property
    def status(self) -> TaskStatus:
        if self.outcome is not None:
            return self.outcome.status
        if self.stop_reason is not None and self.started:
            return "stopping"
        return "running" if self.started else "starting"

    def mark_started(self) -> None:
        self.started = True

    def restore(
        self,
        *,
        started: bool,
        stop_reason: StopRequest | None = None,
        outcome: Outcome | None = None,
    ) -> None:
        """Put back what a stored record or a stored terminal event says (a restart)."""
        self.started = started
        self.stop_reason = stop_reason
        self.outcome = outcome

    def request_stop(self, reason: StopRequest) -> bool:
        """Record a stop request; True only for the first one on a task not yet ended."""
        if self.outcome is not None or self.stop_reason is not None:
            return False
        self.stop_reason = reason
        return True

    def finish_exited(self, exit_code: int | None, *, oom_killed: bool) -> Outcome | None:
        """The container exited. A pending stop request names the reason; else OOM; else exit."""
        if self.outcome is not None:
            return None
        reason: StopReason
        if self.stop_reason is not None:
            reason = self.stop_reason
        elif oom_killed:
            reason = "oom_killed"
        else:
            reason = "exit"
        self.outcome = Outcome(status_for(reason, exit_code), reason, exit_code)
        return self.outcome

    def finish_unstarted(self) -> Outcome | None:
        """A stop arrived before the container started: it never ran, but was stopped."""
        if self.outcome is not None or self.stop_reason is None:
            return None
        self.outcome = Outcome("killed", self.stop_reason, None)
        return self.outcome

    def finish_lost(self, detail: str) -> Outcome | None:
        """The container vanished or the engine lost it."""
        if self.outcome is not None:
            return None
        self.outcome = Outcome("failed", "lost", None, "lost", detail)
        return self.outcome

    def finish_failed(self, error_code: str, message: str) -> Outcome | None:
        """The task never ran (missing image, engine down, runtime unusable)."""
        if self.outcome is not None:
            return None
        self.outcome = Outcome("failed", None, None, error_code, message)
        return self.outcome
