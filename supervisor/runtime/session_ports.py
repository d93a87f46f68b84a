"""What a session gets from its supervisor (services passed in, never a reference back),
and its event log as the port its tasks emit to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from structlog.stdlib import BoundLogger

from supervisor.core.errors import SupervisorError
from supervisor.core.events import BaseEvent, parse_event
from supervisor.core.policy import Policy, PolicySet
from supervisor.core.task_state import Stage, TaskRecord
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
    search_io: Executor | None = None
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


def network_name(session_id: str, instance_id: str) -> str:
    """The session's own Docker network (tasks reach each other by task id on it)."""
    return f"sbx-{session_id}-{instance_id[:8]}"


class SessionTaskPorts:
    """Where a session's tasks store their records (RecordPort) and what they check and
    prepare before a container is created (Preflight): the session's network, once."""

    def __init__(self, services: SessionServices, session_id: str, network: str) -> None:
        self._svc = services
        self._session_id = session_id
        self._network_name = network
        self._network: asyncio.Task[None] | None = None

    async def persist(self, stage: Stage, record: TaskRecord) -> None:
        await self._svc.store.put_task(
            record.info.task_id, self._session_id, stage, record.model_dump_json()
        )

    async def check_runtime(self, runtime: str) -> None:
        await self._svc.check_runtime(runtime)

    async def check_image(self, policy: Policy) -> None:
        await self._svc.check_image(policy)

    async def prepare_network(self, policy: Policy) -> None:
        if policy.network != "bridge":
            return
        if self._network is None:
            labels = self._svc.labels(session_id=self._session_id)
            self._network = asyncio.create_task(
                self._svc.backend.ensure_network(self._network_name, labels)
            )
        await asyncio.shield(self._network)

    async def remove_network(self, log: BoundLogger) -> None:
        """At the session's end: remove its network if one was made."""
        if self._network is None:
            return
        try:
            await self._network
            await self._svc.backend.remove_network(self._network_name)
        except SupervisorError as exc:
            # Labelled as ours: the reconciler removes it once the engine lets it.
            log.warning("network_remove_failed", network=self._network_name, error=str(exc))
