"""Pure: one task's changing state, its stored record, and a monitor's resume marks.

The runner's async units read and change a :class:`TaskState`; snapshots
(:meth:`TaskState.info`) and records (:meth:`TaskState.record`) are built here from
values, so both are testable without an engine or a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal, NamedTuple, cast

from pydantic import BaseModel, ConfigDict

from supervisor.core.events import TaskFailed, TaskStopped
from supervisor.core.lifecycle import Lifecycle, Outcome, StopRequest, status_for
from supervisor.core.models import Kind, StdinMode, TaskInfo, TaskSpec
from supervisor.core.policy import Policy

#: Where a task is in its life, as stored: intent -> created -> running -> ended.
Stage = Literal["intent", "created", "running", "ended"]


class CaptureState(BaseModel):
    """How far capture got; persisted so a restarted supervisor resumes without loss."""

    model_config = ConfigDict(extra="forbid")

    stdout_bytes: int = 0
    """Raw stdout bytes received from the engine (captured or dropped)."""
    stderr_bytes: int = 0
    """Raw stderr bytes received from the engine."""
    task_bytes: int = 0
    """Command bytes written to the output file."""
    dropped: int = 0
    """Bytes dropped after the output cap."""
    file_size: int = 0
    """Output file size at this checkpoint (command bytes plus any sandvisor markers)."""
    monitor_ordinal: int = 0
    """Monitor tasks: lines (and pieces) counted up to ``monitor_offset``."""
    monitor_offset: int = 0
    """Monitor tasks: stream position just after the last counted line."""


class TaskRecord(BaseModel):
    """What the store keeps for one task."""

    model_config = ConfigDict(extra="forbid")

    spec: TaskSpec
    """The spec as the caller gave it."""
    stage: str
    """intent -> created -> running -> ended."""
    policy: Policy
    """The policy as it was when the task started: a restart never re-reads a changed file."""
    stop_reason: str | None = None
    """A stop requested before the crash (re-applied after a restart)."""
    info: TaskInfo
    """The last snapshot."""
    container_id: str | None = None
    """The engine's id of the task's container, once created."""
    capture: CaptureState = CaptureState()
    """Capture progress at the last checkpoint."""
    stdin_closed: bool = False
    """True once EOF was sent or the attaching connection was lost (a restart)."""


@dataclass(frozen=True)
class TaskIdentity:
    """What never changes about a task: who it is, what it runs, under which settings."""

    task_id: str
    session_id: str
    spec: TaskSpec
    policy: Policy
    output_path: str
    persistent: bool
    timeout_ms: int | None
    stdin: StdinMode

    @property
    def kind(self) -> Kind:
        return self.spec.kind


class OutputCounts(NamedTuple):
    """What the output file holds: the command's bytes, bytes dropped past the cap, bytes
    that could not be stored (full disk), and the file's size with sandvisor's own markers."""

    task_bytes: int = 0
    dropped: int = 0
    gap_bytes: int = 0
    file_size: int = 0


class TaskState:
    """Everything about a task that changes, in one place. No I/O, no clock of its own:
    times are passed in (wall clock in seconds since the epoch, ``mono`` in loop time)."""

    __slots__ = (
        "capture",
        "container_id",
        "created_at",
        "deadline_at",
        "ended_at",
        "ended_mono",
        "fixed_running_ms",
        "ident",
        "lc",
        "stalled",
        "started_at",
        "started_mono",
        "stdin_open",
    )

    def __init__(self, ident: TaskIdentity, created_at: float) -> None:
        self.ident = ident
        self.lc = Lifecycle()
        self.created_at = created_at
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.deadline_at: float | None = None
        self.started_mono: float | None = None
        self.ended_mono: float | None = None
        #: A running time known from the store (an ended task re-read after a restart).
        self.fixed_running_ms: int | None = None
        self.container_id: str | None = None
        self.stalled = False
        self.stdin_open = ident.stdin == "pipe"
        self.capture = CaptureState()

    @property
    def stage(self) -> Stage:
        if self.lc.ended:
            return "ended"
        if self.lc.started:
            return "running"
        return "created" if self.container_id else "intent"

    def mark_started(self, wall: float, mono: float) -> None:
        """The command runs from now; the deadline counts from here."""
        self.lc.mark_started()
        self.started_at = wall
        self.started_mono = mono
        if self.ident.timeout_ms is not None:
            self.deadline_at = wall + self.ident.timeout_ms / 1000

    def mark_readopted(self, wall: float, mono: float, engine_started_at: float | None) -> None:
        """A container that ran while the supervisor was down: its start time comes from
        the record or the engine; the deadline from the record (never restarted)."""
        self.lc.mark_started()
        self.stdin_open = False  # the engine closed it when our connection dropped
        if self.started_at is None:
            self.started_at = engine_started_at or wall
        self.started_mono = mono - max(0.0, wall - self.started_at)
        if self.deadline_at is None and self.ident.timeout_ms is not None:
            self.deadline_at = self.started_at + self.ident.timeout_ms / 1000

    def mark_ended(self, wall: float, mono: float) -> None:
        self.ended_at = wall
        if self.ended_mono is None:
            self.ended_mono = mono
        self.stalled = False

    def running_ms(self, now_mono: float) -> int:
        if self.fixed_running_ms is not None:
            return self.fixed_running_ms
        if self.started_mono is None:
            return 0
        end = self.ended_mono if self.ended_mono is not None else now_mono
        return int((end - self.started_mono) * 1000)

    def info(self, now_mono: float, out: OutputCounts) -> TaskInfo:
        """A snapshot for callers."""
        o = self.lc.outcome
        ident = self.ident
        spec = ident.spec
        cid = self.container_id
        return TaskInfo(
            task_id=ident.task_id,
            session_id=ident.session_id,
            command=spec.command,
            description=spec.description,
            kind=spec.kind,
            policy=ident.policy.name,
            status=self.lc.status,
            output_path=ident.output_path,
            persistent=ident.persistent,
            timeout_ms=ident.timeout_ms,
            stdin=ident.stdin,
            created_at=self.created_at,
            started_at=self.started_at,
            ended_at=self.ended_at,
            deadline_at=self.deadline_at,
            running_ms=self.running_ms(now_mono),
            reason=o.reason if o else None,
            exit_code=o.exit_code if o else None,
            error=o.error if o else None,
            error_code=o.error_code if o else None,
            container_id=cid[:12] if cid and not o else None,
            output_bytes=out.task_bytes,
            dropped_bytes=out.dropped,
            gap_bytes=out.gap_bytes,
            stalled=self.stalled,
            runtime=ident.policy.runtime,
        )

    def record(self, stage: Stage, now_mono: float, out: OutputCounts) -> TaskRecord:
        """What the store keeps, as of now."""
        capture = self.capture.model_copy(
            update={
                "task_bytes": out.task_bytes,
                "dropped": out.dropped,
                "file_size": out.file_size,
            }
        )
        return TaskRecord(
            spec=self.ident.spec,
            stage=stage,
            policy=self.ident.policy,
            stop_reason=self.lc.stop_reason,
            info=self.info(now_mono, out),
            container_id=self.container_id,
            capture=capture,
            stdin_closed=not self.stdin_open,
        )

    @classmethod
    def from_record(cls, ident: TaskIdentity, record: TaskRecord) -> TaskState:
        """The state a stored record describes. Ended tasks come back final."""
        info = record.info
        state = cls(ident, info.created_at)
        state.started_at = info.started_at
        state.deadline_at = info.deadline_at
        state.container_id = record.container_id
        state.capture = record.capture.model_copy()
        state.stdin_open = not record.stdin_closed and ident.stdin == "pipe"
        stop = cast("StopRequest | None", record.stop_reason)
        if record.stage == "ended" and info.ended:
            state.lc.restore(
                started=info.started_at is not None,
                stop_reason=stop,
                outcome=Outcome(
                    info.status, info.reason, info.exit_code, info.error_code, info.error
                ),
            )
            state.ended_at = info.ended_at
            state.fixed_running_ms = info.running_ms
        else:
            state.lc.restore(started=False, stop_reason=stop)
        return state

    def end_from_event(self, ev: TaskStopped | TaskFailed) -> Outcome:
        """The outcome a stored terminal event says (a crash after it was stored)."""
        if isinstance(ev, TaskStopped):
            outcome = Outcome(
                status_for(ev.reason, ev.exit_code), ev.reason, ev.exit_code, None, ev.detail
            )
            self.fixed_running_ms = ev.running_ms
        else:
            outcome = Outcome("failed", None, None, ev.error_code, ev.message)
        started = isinstance(ev, TaskStopped)
        self.lc.restore(started=started, stop_reason=self.lc.stop_reason, outcome=outcome)
        self.ended_at = ev.ts
        return outcome


class ResumeMarks:
    """Monitor tasks: (seq, ordinal, stream offset) of each emitted ``task.output`` not yet
    known to be stored. A restart re-counts lines from the last stored one, so what never
    reached the store is sent again and nothing is sent twice."""

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[tuple[int, int, int]] = deque()

    def note(self, seq: int, ordinal: int, offset: int) -> None:
        self._marks.append((seq, ordinal, offset))

    def advance(self, stored_seq: int, capture: CaptureState) -> None:
        """Move ``capture``'s resume point to the last mark whose event is stored."""
        marks = self._marks
        while marks and marks[0][0] <= stored_seq:
            _, capture.monitor_ordinal, capture.monitor_offset = marks.popleft()
