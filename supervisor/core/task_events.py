"""Pure: the events a task emits, built from its identity and plain values."""

from __future__ import annotations

from typing import Literal

from supervisor.core.events import TaskFailed, TaskPoll, TaskStalled, TaskStarted, TaskStopped
from supervisor.core.lifecycle import Outcome
from supervisor.core.task_state import TaskIdentity

#: How many of the last output lines a stall notice carries.
STALL_LINES = 20


def started(ident: TaskIdentity) -> TaskStarted:
    """The container runs the command."""
    return TaskStarted(
        session_id=ident.session_id,
        task_id=ident.task_id,
        command=ident.spec.command,
        description=ident.spec.description,
        kind=ident.spec.kind,
        policy=ident.policy.name,
        output_path=ident.output_path,
        persistent=ident.persistent,
        timeout_ms=ident.timeout_ms,
    )


def ended(
    ident: TaskIdentity,
    outcome: Outcome,
    *,
    running_ms: int,
    output_bytes: int,
    dropped_bytes: int,
    detail: str | None = None,
) -> TaskStopped | TaskFailed:
    """The one terminal event: ``task.stopped`` if it ran, else ``task.failed``."""
    spec = ident.spec
    if outcome.ran:
        assert outcome.reason is not None
        return TaskStopped(
            session_id=ident.session_id,
            task_id=ident.task_id,
            command=spec.command,
            description=spec.description,
            output_path=ident.output_path,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
            running_ms=running_ms,
            output_bytes=output_bytes,
            dropped_bytes=dropped_bytes,
            detail=detail or outcome.error,
        )
    return TaskFailed(
        session_id=ident.session_id,
        task_id=ident.task_id,
        command=spec.command,
        description=spec.description,
        output_path=ident.output_path,
        error_code=outcome.error_code or "error",
        message=outcome.error or "the task could not be started",
    )


def stalled(
    ident: TaskIdentity,
    signal: Literal["process_state", "heuristic"],
    tail: str,
    waiting_s: float,
) -> TaskStalled:
    """The task appears to wait for input; carries its last lines."""
    last = "\n".join(tail.split("\n")[-STALL_LINES:])
    return TaskStalled(
        session_id=ident.session_id,
        task_id=ident.task_id,
        command=ident.spec.command,
        description=ident.spec.description,
        output_path=ident.output_path,
        signal=signal,
        last_output=last,
        waiting_ms=int(waiting_s * 1000),
    )


def poll(ident: TaskIdentity, *, running_ms: int, tail: str, new_bytes: int) -> TaskPoll:
    """A periodic look at the output's tail."""
    return TaskPoll(
        session_id=ident.session_id,
        task_id=ident.task_id,
        command=ident.spec.command,
        description=ident.spec.description,
        running_ms=running_ms,
        tail=tail,
        new_bytes=new_bytes,
    )
