"""What a session gets from its supervisor (services passed in, never a reference back),
and its event log as the port its tasks emit to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from structlog.stdlib import BoundLogger

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import SupervisorError
from supervisor.core.events import BaseEvent, parse_event
from supervisor.core.models import TaskSpec
from supervisor.core.policy import Policy, PolicySet
from supervisor.core.resolve import Effective, container_request, workspace_mount
from supervisor.core.stats import RuntimeStats
from supervisor.core.task_state import Stage, TaskIdentity, TaskRecord
from supervisor.core.workspace import task_user
from supervisor.engine.base import Backend
from supervisor.runtime.pool import PoolPorts, Pools
from supervisor.runtime.task.ports import StallPort
from supervisor.runtime.workspace import Workspace
from supervisor.state.eventlog import EventLog
from supervisor.state.store import StateStore


def _no_shared() -> PoolPorts:
    raise SupervisorError("this supervisor keeps no shared warm pools")


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
    on_ended: Callable[[str], Awaitable[None]]
    """Called with the session id once the session has ended."""
    pools: Pools = field(default_factory=Pools)
    """Every warm pool of the supervisor (shared ones, and each session's own)."""
    shared_pool_ports: Callable[[], PoolPorts] = field(default=_no_shared)
    """What the pools every session shares need (the supervisor's checks and task ids)."""
    stalls: StallPort | None = None
    search_io: Executor | None = None
    workspace_roots: Sequence[Path] = field(default_factory=list)
    end_timeout_s: float = 30.0
    stats: RuntimeStats | None = None
    """The supervisor's counters, which its tasks add to."""


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


def network_name(session_id: str, instance_id: str, kind: str = "bridge") -> str:
    """The session's own Docker network of a kind (tasks reach each other by task id on it):
    ``bridge`` (with egress) and ``session`` (internal) are separate networks, so a task
    without egress never shares a network that has it."""
    suffix = "" if kind == "bridge" else "-int"
    return f"sandvisor-{session_id}-{instance_id[:8]}{suffix}"


class SessionTaskPorts:
    """Where a session's tasks store their records (RecordPort) and what they check and
    prepare before a container is created (Preflight): the session's network, once."""

    def __init__(
        self, services: SessionServices, session_id: str, workspace: Workspace | None
    ) -> None:
        self._svc = services
        self._session_id = session_id
        self._networks: dict[str, asyncio.Task[None]] = {}
        self._workspace = workspace

    async def persist(self, stage: Stage, record: TaskRecord) -> None:
        await self._svc.store.put_task(
            record.info.task_id, self._session_id, stage, record.model_dump_json()
        )

    async def check_runtime(self, runtime: str) -> None:
        await self._svc.check_runtime(runtime)

    async def check_image(self, policy: Policy) -> None:
        await self._svc.check_image(policy)

    async def check_workspace(self) -> None:
        if self._workspace is not None:
            await self._workspace.check()

    async def prepare(self, policy: Policy) -> None:
        if self._workspace is not None:
            await self._workspace.ensure_volume()
        kind = policy.network
        if kind == "none":
            return
        made = self._networks.get(kind)
        if made is None:
            labels = self._svc.labels(session_id=self._session_id)
            name = network_name(self._session_id, self._svc.instance_id, kind)
            made = self._networks[kind] = asyncio.create_task(
                self._svc.backend.ensure_network(name, labels, internal=kind == "session")
            )
        await asyncio.shield(made)

    async def remove_networks(self, log: BoundLogger) -> None:
        """At the session's end: remove the networks it made."""
        for kind, made in self._networks.items():
            name = network_name(self._session_id, self._svc.instance_id, kind)
            try:
                await made
                await self._svc.backend.remove_network(name)
            except SupervisorError as exc:
                # Labelled with our instance and this session: once the session is no longer
                # open, the reconciler's rounds (and the next start's) remove it as soon as
                # the engine answers and nothing is attached (Reconciler.reap_networks).
                log.warning("network_remove_failed", network=name, error=str(exc))


def task_request(
    svc: SessionServices,
    session_id: str,
    workspace: Workspace | None,
    task_id: str,
    command: str,
    eff: Effective,
    *,
    kind: str,
) -> ContainerRequest:
    """The container for one task of a session, hardened as its policy says: on the
    session's network of the policy's kind, with the session's workspace (at its path, as
    its owner, as the policy decides for a root-owned one)."""
    policy = eff.policy
    kind_net = policy.network
    network = "none" if kind_net == "none" else network_name(session_id, svc.instance_id, kind_net)
    user = working_dir = None
    mounts = None
    if workspace is not None:
        ws_plan = workspace.plan
        user = task_user(ws_plan, policy.name, policy.runtime, policy.workspace_root_owner)
        working_dir = ws_plan.container_path
        mounts = workspace.mount_list()
    return container_request(
        name=f"sandvisor-{task_id}",
        command=command,
        eff=eff,
        labels=svc.labels(
            session_id=session_id,
            task_id=task_id,
            kind=kind,
            policy=policy.name,
            timeout_ms=eff.timeout_ms,
        ),
        network=network,
        workspace=workspace_mount(policy, svc.workspace_roots, svc.state_dir),
        aliases=[task_id] if network != "none" else None,
        mounts=mounts,
        user=user,
        working_dir=working_dir,
    )


def task_identity(
    session_id: str, session_dir: Path, task_id: str, spec: TaskSpec, eff: Effective
) -> TaskIdentity:
    """Who a task of a session is: its ids, spec, settings and output file."""
    return TaskIdentity(
        task_id=task_id,
        session_id=session_id,
        spec=spec,
        policy=eff.policy,
        output_path=str(session_dir / "tasks" / f"{task_id}.output"),
        persistent=eff.persistent,
        timeout_ms=eff.timeout_ms,
        stdin=eff.stdin,
    )
