"""The Supervisor: owns the engine connection, the state store, policies and sessions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from supervisor.core.container import EngineState
from supervisor.core.errors import (
    EngineUnavailable,
    PolicyError,
    SessionNotFound,
    SupervisorError,
)
from supervisor.core.ids import check_session_id, new_session_id, new_task_id
from supervisor.core.labels import container_labels
from supervisor.core.logs import get_logger
from supervisor.core.paths import default_state_dir
from supervisor.core.policy import Policy, PolicySet
from supervisor.core.stats import MetricsSnapshot, RuntimeStats
from supervisor.core.workspace import WorkspaceSpec
from supervisor.engine.base import Backend
from supervisor.runtime.engine_checks import EngineChecks
from supervisor.runtime.metrics import live_metrics
from supervisor.runtime.ownership import lock_state_dir, owner_labels
from supervisor.runtime.pool import SHARED, PoolPorts, Pools, shared_pool_ports
from supervisor.runtime.reconcile import Reconciler
from supervisor.runtime.restore import restore_sessions
from supervisor.runtime.session import Session
from supervisor.runtime.session_ports import SessionServices
from supervisor.runtime.stall_watch import StallWatcher
from supervisor.runtime.state_space import StateSpace
from supervisor.runtime.workspace import Workspace
from supervisor.runtime.workspaces import RETENTION_S, Workspaces, same_spec
from supervisor.state.eventlog import EventLog
from supervisor.state.sinks import Sink
from supervisor.state.store import StateStore

log = get_logger("supervisor")


SinkFactory = Callable[[str], Iterable[Sink]]


class Supervisor:
    """Entry point of the library. Use as ``async with Supervisor(...) as sup:``.

    ``stop_tasks_on_close``: on ``aclose()`` end every session (the library default, so a
    script leaves nothing behind). The daemon passes False so a restart re-adopts tasks.
    """

    def __init__(
        self,
        state_dir: str | Path | None = None,
        policies_dir: str | Path | None = None,
        *,
        docker_host: str | None = None,
        backend: Backend | None = None,
        sinks: SinkFactory | None = None,
        stop_tasks_on_close: bool = True,
        workspace_roots: Sequence[str | Path] = (),
        event_retention: int = 100_000,
        sink_max_lag: int = 10_000,
        require_engine: bool = True,
        sweep_orphans: bool = True,
        orphan_grace_s: float = 600.0,
        end_timeout_s: float = 30.0,
        min_free_bytes: int = 32 * 1024 * 1024,
        workspace_retention_s: float = RETENTION_S,
        engine_timeout_s: float | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.policies = PolicySet.load(Path(policies_dir) if policies_dir is not None else None)
        self._docker_host = docker_host
        self._backend = backend
        self._sink_factory = sinks
        self.stop_tasks_on_close = stop_tasks_on_close
        roots = workspace_roots or [
            p for p in os.environ.get("SANDVISOR_WORKSPACE_ROOTS", "").split(":") if p
        ]
        #: Directories a workspace may be in (default: the home of the user running us).
        self.workspace_roots = [Path(r) for r in roots] or [Path.home()]
        self.workspace_retention_s = workspace_retention_s
        self.event_retention = event_retention
        self.sink_max_lag = sink_max_lag
        self.require_engine = require_engine
        self.sweep_orphans = sweep_orphans
        self.orphan_grace_s = orphan_grace_s
        self.end_timeout_s = end_timeout_s
        self.min_free_bytes = min_free_bytes
        #: Engine call deadline of a backend made here (None: engine/select.py's default).
        self.engine_timeout_s = engine_timeout_s
        self.io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sandvisor-io")
        self._space = StateSpace(self.state_dir, min_free_bytes, self.io)
        #: wait_for scans: a pattern searched through hundreds of MB never holds up output
        #: writes; more parallel scans than threads wait their turn.
        self.search_io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sandvisor-scan")
        self.store = StateStore(self.state_dir / "state.db")
        self.instance_id = ""
        self.stall_watcher: StallWatcher | None = None
        self._sessions: dict[str, Session] = {}
        #: Ended sessions whose work still runs (an end that met the engine away keeps
        #: trying to remove their containers): let go of at close, like open ones.
        self._winding: list[Session] = []
        self._session_lock = asyncio.Lock()
        self._lock_fd: int | None = None
        self._checks: EngineChecks | None = None
        self._workspaces: Workspaces | None = None
        #: Every warm pool: shared by sessions, or a session's own.
        self.pools = Pools()
        self.stats = RuntimeStats()  # tasks, events, output since start; see metrics()
        self._started = False
        self._closed = False
        self._owner_labels: dict[str, str] = {}
        self._reconciler: asyncio.Task[None] | None = None
        self._reconcile: Reconciler | None = None
        #: Whether the engine keeps containers running through its restarts (from the engine).
        self.live_restore = True

    # -- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise SupervisorError("supervisor is not started")
        return self._backend

    async def start(self) -> None:
        """Lock the state dir, open the store, connect to the engine, sweep orphans."""
        if self._started:
            return
        loop = asyncio.get_running_loop()
        self._lock_fd = await loop.run_in_executor(self.io, lock_state_dir, self.state_dir)
        await self.store.open()
        instance = await self.store.get_meta("instance_id")
        if instance is None:
            instance = secrets.token_hex(8)
            await self.store.set_meta("instance_id", instance)
        self.instance_id = instance
        self._owner_labels = await loop.run_in_executor(
            self.io, owner_labels, instance, self.state_dir
        )
        if self._backend is None:
            from supervisor.engine.select import make_backend  # noqa: PLC0415 - optional dep

            self._backend = make_backend(self._docker_host, engine_timeout=self.engine_timeout_s)
        if self.stall_watcher is None:
            self.stall_watcher = StallWatcher(self._backend, self.io)
        self._checks = EngineChecks(self._backend, self.policies)
        self._workspaces = Workspaces(
            backend=self._backend,
            io=self.io,
            store=self.store,
            state_dir=self.state_dir,
            instance_id=instance,
            labels=self.container_labels,
            roots=self.workspace_roots,
            retention_s=self.workspace_retention_s,
            orphan_grace_s=self.orphan_grace_s,
        )
        await self._workspaces.load()
        self._reconcile = Reconciler(
            backend=self._backend,
            io=self.io,
            instance_id=instance,
            state_dir=self.state_dir,
            grace_s=self.orphan_grace_s,
            owns=self._owns,
            session_live=lambda session_id: session_id in self._sessions,
            engine_ok=lambda: self.engine_ok,
            reap_more=lambda: self.workspaces.reap(list(self._sessions)),
            sweep_orphans=self.sweep_orphans,
        )
        self._started = True
        if not await self._checks.first_ping() and self.require_engine:
            await self.aclose()
            raise EngineUnavailable(
                "the Docker engine does not answer; start it with `make engine` "
                "(or point DOCKER_HOST at one)"
            )
        if self.engine_ok:
            try:
                self.live_restore = await self._backend.live_restore()
            except SupervisorError as exc:
                log.warning("live_restore_unknown", error=str(exc), assumed=self.live_restore)
        self._checks.start_watch()
        await restore_sessions(self.store, self.open_session)
        if self.engine_ok:
            await self.reconciler.first_round()
        self._reconciler = asyncio.create_task(self.reconciler.run(), name="reconcile")
        log.info("supervisor_started", instance_id=instance, state_dir=str(self.state_dir))

    async def aclose(self) -> None:
        """End (or release, see ``stop_tasks_on_close``) all sessions; close everything."""
        if self._closed:
            return
        self._closed = True
        sessions = list(self._sessions.values())
        if self.stop_tasks_on_close:
            await asyncio.gather(*(s.end() for s in sessions), return_exceptions=True)
        # Anything still waiting on an unreachable engine, open sessions' tasks and ended
        # sessions' removals, is let go: the next start's first round reaps it.
        leaving = sessions + [s for s in self._winding if s not in sessions]
        await asyncio.gather(*(s.release() for s in leaving), return_exceptions=True)
        await self.pools.aclose()
        if self._reconciler is not None:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
        if self._checks is not None:
            await self._checks.aclose()
        if self.stall_watcher is not None:
            await self.stall_watcher.aclose()
        if self._backend is not None:
            await self._backend.aclose()
        try:
            await self.store.close()
        except SupervisorError:
            log.exception("state_store_close_failed")
        # Waiting for the worker threads blocks: do it on a thread of its own.
        await asyncio.to_thread(self.io.shutdown, wait=True)
        await asyncio.to_thread(self.search_io.shutdown, wait=True, cancel_futures=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- engine health (runtime/engine_checks.py) -----------------------------------

    @property
    def checks(self) -> EngineChecks:
        if self._checks is None:
            raise SupervisorError("supervisor is not started")
        return self._checks

    @property
    def engine_ok(self) -> bool:
        return self._checks is not None and self._checks.engine_ok

    @property
    def engine_state(self) -> EngineState:
        """``up``, ``wedged`` or ``down`` (the watchdog's, runtime/engine_checks.py)."""
        return self._checks.engine_state if self._checks is not None else "down"

    @property
    def engine_info(self) -> dict[str, str]:
        return self._checks.engine_info if self._checks is not None else {}

    async def ensure_engine(self) -> None:
        """Fail fast with EngineUnavailable when the engine does not answer."""
        await self.checks.ensure_engine()

    async def check_runtime(self, runtime: str) -> None:
        """RuntimeUnavailable when ``runtime`` cannot run containers (never a fallback)."""
        await self.checks.check_runtime(runtime)

    async def check_image(self, policy: Policy) -> None:
        """ImageMissing when the policy's image is absent; PolicyError for a wrong pin."""
        await self.checks.check_image(policy)

    def metrics(self) -> MetricsSnapshot:
        """Counters since start and gauges as of now (runtime/metrics.py)."""
        sessions, policies = self.sessions(), self.policies.all()
        up, state = self.engine_ok, self.engine_state
        return live_metrics(self.stats, sessions, self.pools, policies, up, engine_state=state)

    # -- labels and orphans ----------------------------------------------------------

    def container_labels(self, **fields: Any) -> dict[str, str]:
        """Owner labels plus ``io.sandvisor.<field>`` (``session_id`` -> ``io.sandvisor.session``,
        ``task_id`` -> ``io.sandvisor.task``, ``timeout_ms`` -> ``io.sandvisor.timeout-ms``)."""
        return container_labels(self._owner_labels, **fields)

    @property
    def reconciler(self) -> Reconciler:
        if self._reconcile is None:
            raise SupervisorError("supervisor is not started")
        return self._reconcile

    async def sweep(self) -> int:
        """Remove containers whose owning supervisor is gone (runtime/reconcile.py)."""
        return await self.reconciler.sweep()

    async def adopt_or_reap(self, container_id: str, labels: dict[str, str]) -> bool:
        """Keep a container of ours that a task owns; reap it when no record knows it."""
        return await self.reconciler.adopt_or_reap(container_id, labels)

    async def find_container(self, task_id: str) -> str | None:
        """Our container for ``task_id``, found by its labels (any state)."""
        return await self.reconciler.find_container(task_id)

    async def check_state_space(self) -> None:
        """Refuse new work while the state volume is (nearly) full (``min_free_bytes``)."""
        await self._space.check()

    # -- sessions --------------------------------------------------------------------

    async def open_session(
        self,
        session_id: str | None = None,
        *,
        sinks: Iterable[Sink] = (),
        workspace: WorkspaceSpec | None = None,
        policy: str = "default",
    ) -> Session:
        """The session with this id (created on first use; idempotent). ``workspace``: the
        project its tasks run on, fixed when the session opens; ``policy`` decides whom
        tasks of a root-owned workspace run as (``workspace_root_owner``)."""
        if self._closed or not self._started:
            raise SupervisorError("supervisor is not running (use `async with Supervisor()`)")
        sid = check_session_id(session_id) if session_id is not None else new_session_id()
        async with self._session_lock:
            session = self._sessions.get(sid)
            if session is not None:
                _same_workspace(session, workspace)
            else:
                ws = await self.workspaces.for_session(sid, workspace, self.policies.get(policy))
                existing = await self.store.get_session(sid)
                created = existing[0] if existing else time.time()
                events = EventLog(
                    sid,
                    self.store,
                    retention_events=self.event_retention,
                    sink_max_lag=self.sink_max_lag,
                    on_emit=self.stats.event,
                )
                await events.load()
                session = Session(self._services(), sid, events, created, workspace=ws)
                await self.store.put_session(sid, created, None)
                self._sessions[sid] = session
                if self._sink_factory is not None:
                    for sink in self._sink_factory(sid):
                        session.add_sink(sink)
            for sink in sinks:
                session.add_sink(sink)
            return session

    def session(self, session_id: str) -> Session:
        """An open session; SessionNotFound otherwise."""
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def _forget(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        self._winding = [s for s in self._winding if not s.settled]
        if session is not None and not session.settled:
            self._winding.append(session)
        await self.workspaces.session_ended(session_id)

    @property
    def workspaces(self) -> Workspaces:
        if self._workspaces is None:
            raise SupervisorError("supervisor is not started")
        return self._workspaces

    def workspace(self, session_id: str) -> Workspace:
        """The workspace of a session, open or ended with changes kept; SessionNotFound."""
        ws = self.workspaces.get(session_id)
        if ws is None:
            raise SessionNotFound(session_id)
        return ws

    def _services(self) -> SessionServices:
        return SessionServices(
            backend=self.backend,
            io=self.io,
            store=self.store,
            policies=self.policies,
            state_dir=self.state_dir,
            instance_id=self.instance_id,
            labels=self.container_labels,
            check_runtime=self.check_runtime,
            check_image=self.check_image,
            ensure_engine=self.ensure_engine,
            check_state_space=self.check_state_space,
            find_container=self.find_container,
            live_restore=lambda: self.live_restore,
            on_ended=self._forget,
            pools=self.pools,
            shared_pool_ports=self._shared_pool_ports,
            stalls=self.stall_watcher,
            search_io=self.search_io,
            workspace_roots=self.workspace_roots,
            end_timeout_s=self.end_timeout_s,
            stats=self.stats,
        )

    def prewarm_shared(self, policy_names: Sequence[str] = ("default",)) -> int:
        """Start filling the shared pools of these policies to their floor (``warm_pool``)
        in the background, so the first start is warm too. Policies whose containers name
        a session (a session network) have no shared pool. Returns how many pools fill."""
        filling = 0
        for name in policy_names:
            if name not in self.policies.names():
                continue
            policy = self.policies.get(name)
            pooled = self.engine_ok and self.backend.capabilities.warm_pool  # not on Swarm
            if policy.warm_pool <= 0 or policy.network != "none" or not pooled:
                continue
            self.pools.get(policy, SHARED, self._shared_pool_ports).refill()
            filling += 1
        return filling

    def _shared_pool_ports(self) -> PoolPorts:
        """The pools every session shares: containers that name no session."""
        return shared_pool_ports(
            backend=self.backend,
            check_runtime=self.check_runtime,
            check_image=self.check_image,
            new_task_id=self._new_task_id,
            labels=self.container_labels,
            workspace_roots=self.workspace_roots,
            state_dir=self.state_dir,
        )

    async def _new_task_id(self) -> str:
        """A task id nobody has: no session's task, no pooled container, no record."""
        while True:
            task_id = new_task_id()
            if self._owns(task_id):
                continue
            if not await self.store.task_exists(task_id):
                return task_id

    def _owns(self, task_id: str) -> bool:
        """Whether a container labelled with ``task_id`` is ours to keep: a session's task,
        or a warm container waiting in a pool."""
        return self.pools.holds(task_id) or any(s.owns(task_id) for s in self._sessions.values())


def _same_workspace(session: Session, spec: WorkspaceSpec | None) -> None:
    """Re-opening a session may not change its workspace (fixed when it opened)."""
    if spec is None:
        return
    ws = session.workspace
    if ws is None or not same_spec(ws.spec, spec):
        have = "none" if ws is None else f"{ws.plan.host} ({ws.plan.mode})"
        raise PolicyError(
            f"session {session.session_id!r} is open with workspace {have}; a session's "
            "workspace is fixed when it opens (use another session id)"
        )
