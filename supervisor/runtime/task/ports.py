"""What a task needs from the world around it, as small typed ports.

The session and the supervisor implement these; component tests pass fakes. Nothing here
refers back to a runner's owner, so the runtime has no import cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from supervisor.core.events import BaseEvent
from supervisor.core.policy import Policy
from supervisor.core.stats import RuntimeStats
from supervisor.core.task_state import Stage, TaskRecord
from supervisor.engine.base import AttachedStream, Backend

StallSignal = Literal["process_state", "heuristic"]


class EventPort(Protocol):
    """The session's event log, as a task uses it."""

    def emit(self, event: BaseEvent) -> BaseEvent:
        """Log an event (its ``seq`` assigned); storing and publishing follow."""
        ...

    async def caught_up(self) -> None:
        """Return once every event emitted so far is stored and published."""
        ...

    def stored_seq(self) -> int:
        """The highest seq known to be in the store."""
        ...

    async def task_events(self, task_id: str, types: Sequence[str]) -> list[BaseEvent]:
        """Stored events of one task with the given types (used when re-adopting)."""
        ...


class RecordPort(Protocol):
    """Where task records go."""

    async def persist(self, stage: Stage, record: TaskRecord) -> None:
        """Store the record (raises SupervisorError when the store cannot take it)."""
        ...


class Preflight(Protocol):
    """Checks before a container is created, and the session's network."""

    async def check_runtime(self, runtime: str) -> None:
        """Raise RuntimeUnavailable when the runtime cannot run containers."""
        ...

    async def check_image(self, policy: Policy) -> None:
        """Raise ImageMissing (or PolicyError for a wrong pin)."""
        ...

    async def prepare(self, policy: Policy) -> None:
        """Create what a container of the session needs first, once: the session's network
        (when the policy has one) and its workspace's volume (overlay mode)."""
        ...

    async def check_workspace(self) -> None:
        """Right before a command runs (a warm container's too, made earlier): raise
        WorkspaceMoved when the project's path now leads elsewhere, and put the
        repositories earlier tasks created out of the host git's way (``rw``)."""
        ...


class Watchable(Protocol):
    """A task as the stall watcher sees it (read-only, plus reporting a stall)."""

    @property
    def task_id(self) -> str: ...

    @property
    def container_id(self) -> str | None: ...

    @property
    def runtime(self) -> str: ...

    @property
    def stall_after_s(self) -> float | None: ...

    @property
    def output_path(self) -> Path: ...

    @property
    def watching(self) -> bool:
        """Started, not ended or stopping, stdin still open: a stall is possible."""
        ...

    @property
    def last_output_mono(self) -> float:
        """Loop time of the last output (the start time before any output)."""
        ...

    @property
    def started_mono(self) -> float: ...

    async def report_stall(self, signal: StallSignal, waiting_s: float) -> None:
        """Emit one ``task.stalled`` for the current episode."""
        ...


class StallPort(Protocol):
    """The stall watching service."""

    def register(self, task: Watchable) -> None: ...

    def unregister(self, task_id: str) -> None: ...

    def input_sent(self, task_id: str) -> None: ...


@dataclass
class WarmStart:
    """A warm container: started and attached, waiting to read its command from stdin."""

    task_id: str
    container_id: str
    stream: AttachedStream
    sentinel: str

    def payload(self, command: str) -> bytes:
        """What to write to its stdin: the command, then the sentinel line."""
        return command.encode("utf-8", "surrogatepass") + f"\n{self.sentinel}\n".encode()


@dataclass
class TaskPorts:
    """Everything a task uses, owned by its session and supervisor."""

    backend: Backend
    io: Executor
    """File writes and reads (output files, tails)."""
    events: EventPort
    records: RecordPort
    preflight: Preflight
    stalls: StallPort | None = None
    find_container: Callable[[str], Awaitable[str | None]] | None = None
    """Our container labelled with a task id, if any (re-adoption)."""
    live_restore: bool = True
    """Whether the engine keeps containers running through its own restarts."""
    search_io: Executor | None = None
    """Where wait_for scans output (its own threads, so long scans never hold up the
    output writers in ``io``); None: ``io``."""
    stats: RuntimeStats | None = None
    """The supervisor's counters (output bytes, start -> first byte); None: not counted."""
