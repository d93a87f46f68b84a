"""What a session gets from its supervisor (services passed in, never a reference back),
and its event log as the port its tasks emit to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.core.events import BaseEvent, parse_event
from supervisor.core.policy import Policy, PolicySet
from supervisor.engine.base import Backend
from supervisor.runtime.task.ports import StallPort
from supervisor.state.eventlog import EventLog
from supervisor.state.store import StateStore


@dataclass
class SessionServices:
    """What a session uses from its supervisor (passed in; no reference back to it)."""

    backend: Backend
    io: Executor
    store: StateStore
    policies: PolicySet
    state_dir: Path
    instance_id: str
    labels: Callable[..., dict[str, str]]
    """``labels(session_id=..., task_id=..., ...)``: the labels of our containers."""
    check_runtime: Callable[[str], Awaitable[None]]
    check_image: Callable[[Policy], Awaitable[None]]
    ensure_engine: Callable[[], Awaitable[None]]
    check_state_space: Callable[[], Awaitable[None]]
    find_container: Callable[[str], Awaitable[str | None]]
    live_restore: Callable[[], bool]
    on_ended: Callable[[str], None]
    """Called with the session id once the session has ended."""
    stalls: StallPort | None = None
    workspace_roots: Sequence[Path] = field(default_factory=list)
    end_timeout_s: float = 30.0


class SessionEvents:
    """The session's event log as a task's EventPort."""

    def __init__(self, events: EventLog, store: StateStore, session_id: str) -> None:
        self._log = events
        self._store = store
        self._session_id = session_id

    def emit(self, event: BaseEvent) -> BaseEvent:
        return self._log.emit(event)

    async def caught_up(self) -> None:
        await self._log.caught_up()

    def stored_seq(self) -> int:
        return self._log.last_seq

    async def task_events(self, task_id: str, types: Sequence[str]) -> list[BaseEvent]:
        await self._log.caught_up()
        rows = await self._store.task_events(self._session_id, task_id, tuple(types))
        return [parse_event(r) for r in rows]
