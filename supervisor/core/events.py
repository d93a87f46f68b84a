"""Typed events. Every event of a session carries a strictly increasing ``seq``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from supervisor.core.models import Kind, StopReason


class BaseEvent(BaseModel):
    """Fields every event has."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    """The event type, e.g. ``task.stopped`` (each subclass fixes it)."""
    seq: int = 0
    """Per-session sequence number; strictly increasing, never reused (0 before logging)."""
    ts: float = 0.0
    """Wall-clock time the event was logged (seconds since the epoch)."""
    session_id: str
    """The session the event belongs to."""
    task_id: str | None = None
    """The task it is about (None for session events)."""


class TaskStarted(BaseEvent):
    """The container is running the command."""

    type: Literal["task.started"] = "task.started"
    command: str
    description: str
    kind: Kind
    policy: str
    output_path: str
    persistent: bool
    timeout_ms: int | None
    """Effective timeout (None when persistent)."""


class TaskOutput(BaseEvent):
    """Monitor tasks: one or more complete stdout lines."""

    type: Literal["task.output"] = "task.output"
    text: str
    """The lines, joined by newlines, without the final newline (UTF-8, lossy)."""
    ordinal: int
    """1-based index of the chunk's last line within the task: de-duplicate on replay."""
    lines: int
    """How many lines the chunk holds."""
    eol: bool = True
    """True when the last line ended with a newline. Rebuild stdout as
    ``text + ("\\n" if eol else "")`` over the chunks in ordinal order."""
    cut: bool = False
    """True when the last line was longer than the chunk limit: it continues in the next
    chunk (each piece counts as a line for ordinals)."""


class TaskOutputSuppressed(BaseEvent):
    """Monitor tasks: lines not sent as events because of the rate limit (still in the file)."""

    type: Literal["task.output_suppressed"] = "task.output_suppressed"
    lines: int
    """How many lines were suppressed."""
    first_ordinal: int
    """Ordinal of the first suppressed line."""
    last_ordinal: int
    """Ordinal of the last suppressed line."""


class TaskPoll(BaseEvent):
    """A periodic look at a running task's output tail."""

    type: Literal["task.poll"] = "task.poll"
    command: str
    description: str
    running_ms: int
    tail: str
    """The last ``poll_tail_chars`` characters of output, as a terminal shows them
    (``core.terminal``: no escape sequences, a progress bar at its last frame)."""
    new_bytes: int
    """Bytes of output since the previous poll."""


class TaskStalled(BaseEvent):
    """The task appears to be waiting for input on its stdin."""

    type: Literal["task.stalled"] = "task.stalled"
    command: str
    description: str
    output_path: str
    signal: Literal["process_state", "heuristic"]
    """``process_state``: the kernel shows a read on the stdin pipe; ``heuristic``: silence,
    idle CPU and a prompt-like tail."""
    last_output: str
    """The last lines of output, as a terminal shows them (``core.terminal``)."""
    waiting_ms: int
    """How long the task has been waiting."""


class TaskStopped(BaseEvent):
    """Terminal: the task ran and has ended. Exactly one terminal event per task."""

    type: Literal["task.stopped"] = "task.stopped"
    command: str
    description: str
    output_path: str
    reason: StopReason
    exit_code: int | None
    running_ms: int
    output_bytes: int
    dropped_bytes: int = 0
    detail: str | None = None
    """Extra context, e.g. why a task was lost."""


class TaskFailed(BaseEvent):
    """Terminal: the task never ran (missing image, engine down, policy refused)."""

    type: Literal["task.failed"] = "task.failed"
    command: str
    description: str
    output_path: str
    error_code: str
    message: str


class SessionEnded(BaseEvent):
    """The session ended; all its tasks have been stopped and removed."""

    type: Literal["session.ended"] = "session.ended"
    tasks_stopped: int


class EventsGap(BaseEvent):
    """Not logged: a consumer missed events (slow sink, retention). ``seq`` is ``last_seq``."""

    type: Literal["events.gap"] = "events.gap"
    first_seq: int
    """First missing seq (inclusive)."""
    last_seq: int
    """Last missing seq (inclusive)."""
    why: Literal["overflow", "retention"]
    """``overflow``: the consumer fell behind; ``retention``: the log no longer holds them."""


Event = Annotated[
    TaskStarted
    | TaskOutput
    | TaskOutputSuppressed
    | TaskPoll
    | TaskStalled
    | TaskStopped
    | TaskFailed
    | SessionEnded
    | EventsGap,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
TERMINAL_TYPES = frozenset({"task.stopped", "task.failed"})


def parse_event(raw: str | bytes) -> Event:
    """Parse one event from its JSON form."""
    return EVENT_ADAPTER.validate_json(raw)


#: The event types an agent is told about (rendered as notifications).
NOTIFY_TYPES = frozenset(
    {
        "task.stopped",
        "task.failed",
        "task.stalled",
        "task.poll",
        "task.output",
        "task.output_suppressed",
    }
)
