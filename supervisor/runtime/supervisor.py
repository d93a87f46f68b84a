"""The Supervisor: owns the engine connection, the state store, policies and sessions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from supervisor.core.errors import (
    EngineUnavailable,
    SessionNotFound,
    StateStorageError,
    SupervisorError,
)
from supervisor.core.ids import check_session_id, new_session_id
from supervisor.core.labels import LABEL_OWNER, LABEL_TASK, container_labels
from supervisor.core.logs import get_logger
from supervisor.core.paths import default_state_dir
from supervisor.core.policy import Policy, PolicySet, default_policies_dir
from supervisor.core.task_state import TaskRecord
from supervisor.engine.base import Backend
from supervisor.engine.probe import PROBE_LABEL
from supervisor.runtime.engine_checks import EngineChecks
from supervisor.runtime.ownership import heartbeat, lock_state_dir, owner_alive, owner_labels
from supervisor.runtime.session import Session
from supervisor.runtime.session_ports import SessionServices
from supervisor.runtime.stall_watch import StallWatcher
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
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        pdir = Path(policies_dir) if policies_dir is not None else default_policies_dir()
        self.policies = PolicySet(pdir)
        self._docker_host = docker_host
        self._backend = backend
        self._sink_factory = sinks
        self.stop_tasks_on_close = stop_tasks_on_close
        roots = workspace_roots or [
            p for p in os.environ.get("SBX_WORKSPACE_ROOTS", "").split(":") if p
        ]
        self.workspace_roots = [Path(r) for r in roots]
        self.event_retention = event_retention
        self.sink_max_lag = sink_max_lag
        self.require_engine = require_engine
        self.sweep_orphans = sweep_orphans
        self.orphan_grace_s = orphan_grace_s
        self.end_timeout_s = end_timeout_s
        self.min_free_bytes = min_free_bytes
        self.io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sbx-io")
        #: wait_for scans: a pattern searched through hundreds of MB never holds up output
        #: writes; more parallel scans than threads wait their turn.
        self.search_io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sbx-scan")
        self.store = StateStore(self.state_dir / "state.db")
        self.instance_id = ""
        self.stall_watcher: StallWatcher | None = None
        self._sessions: dict[str, Session] = {}
        self._session_lock = asyncio.Lock()
        self._lock_fd: int | None = None
        self._checks: EngineChecks | None = None
        self._started = False
        self._closed = False
        self._owner_labels: dict[str, str] = {}
        self._reconciler: asyncio.Task[None] | None = None
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
            from supervisor.engine.docker import DockerBackend  # noqa: PLC0415 - optional dep

            self._backend = DockerBackend(self._docker_host)
        if self.stall_watcher is None:
            self.stall_watcher = StallWatcher(self._backend, self.io)
        self._checks = EngineChecks(self._backend, self.policies)
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
        await self._restore()
        if self.engine_ok and self.sweep_orphans:
            await self.sweep()
        self._reconciler = asyncio.create_task(self._reconcile_loop(), name="reconcile")
        log.info("supervisor_started", instance_id=instance, state_dir=str(self.state_dir))

    async def aclose(self) -> None:
        """End (or release, see ``stop_tasks_on_close``) all sessions; close everything."""
        if self._closed:
            return
        self._closed = True
        sessions = list(self._sessions.values())
        if self.stop_tasks_on_close:
            await asyncio.gather(*(s.end() for s in sessions), return_exceptions=True)
            # Anything still waiting on an unreachable engine is let go (reaped later).
            await asyncio.gather(*(s.release() for s in sessions), return_exceptions=True)
        else:
            await asyncio.gather(*(s.release() for s in sessions), return_exceptions=True)
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

    # -- labels and orphans ----------------------------------------------------------

    def container_labels(self, **fields: Any) -> dict[str, str]:
        """Owner labels plus ``io.sbx.<field>`` (``session_id`` -> ``io.sbx.session``,
        ``task_id`` -> ``io.sbx.task``, ``timeout_ms`` -> ``io.sbx.timeout-ms``)."""
        return container_labels(self._owner_labels, **fields)

    async def sweep(self) -> int:
        """Stop and remove containers whose owning supervisor is gone. Never touches
        unlabeled containers or those of a live owner. Returns how many were removed."""
        removed = 0
        loop = asyncio.get_running_loop()
        try:
            rows = await self.backend.list_labeled(LABEL_OWNER)
        except EngineUnavailable:
            return 0
        for row in rows:
            if PROBE_LABEL in row.labels:
                continue
            owner = row.labels.get(LABEL_OWNER)
            if owner == self.instance_id:
                if await self.adopt_or_reap(row.id, row.labels):
                    removed += 1
                continue
            alive = await loop.run_in_executor(
                self.io, owner_alive, row.labels, self.orphan_grace_s
            )
            if alive is False:
                log.info("reaping_orphan", container=row.id[:12], owner=owner)
                try:
                    await self.backend.remove(row.id)
                    removed += 1
                except SupervisorError as exc:
                    log.warning("reap_failed", container=row.id[:12], error=str(exc))
        return removed

    async def adopt_or_reap(self, container_id: str, labels: dict[str, str]) -> bool:
        """A container of our own instance: kept when a task (restored from the store) owns
        it, reaped when no record knows it (e.g. a crash between create and record)."""
        task_id = labels.get(LABEL_TASK, "")
        if any(session.owns(task_id) for session in self._sessions.values()):
            return False
        log.info("reaping_unrecorded", container=container_id[:12], task_id=task_id)
        with contextlib.suppress(SupervisorError):
            await self.backend.remove(container_id)
            return True
        return False

    async def find_container(self, task_id: str) -> str | None:
        """Our container for ``task_id``, found by its labels (any state)."""
        rows = await self.backend.list_labeled(f"{LABEL_TASK}={task_id}")
        for row in rows:
            if row.labels.get(LABEL_OWNER) == self.instance_id:
                return row.id
        return None

    async def _restore(self) -> None:
        """Re-open the sessions that were open when the last supervisor on this state dir
        stopped (or died) and re-adopt their tasks."""
        for sid, _created, ended, data in await self.store.all_sessions():
            if ended is not None:
                continue
            session = await self.open_session(sid)
            try:
                digests = json.loads(data or "{}").get("token_sha256", [])
            except ValueError:
                digests = []
            session.token_digests = list(digests)
            restored = 0
            for task_id, _, stage, raw in await self.store.tasks(sid):
                try:
                    record = TaskRecord.model_validate_json(raw)
                except ValueError as exc:
                    log.warning("task_record_unreadable", task_id=task_id, error=str(exc))
                    continue
                session.restore_task(record)
                restored += stage != "ended"
            log.info("session_restored", session_id=sid, resumed_tasks=restored)

    async def _reconcile_loop(self, every_s: float = 10.0) -> None:
        """The engine's event stream drops events: periodically list our labeled containers
        and reap any that no task owns; now and then, sweep other owners' orphans too."""
        ticks = 0
        while not self._closed:
            await asyncio.sleep(every_s)
            ticks += 1
            await asyncio.get_running_loop().run_in_executor(self.io, heartbeat, self.state_dir)
            if not self.engine_ok:
                continue
            try:
                rows = await self.backend.list_labeled(f"{LABEL_OWNER}={self.instance_id}")
            except SupervisorError:
                continue
            for row in rows:
                await self.adopt_or_reap(row.id, row.labels)
            if self.sweep_orphans and ticks % 6 == 0:
                await self.sweep()

    async def check_state_space(self) -> None:
        """Refuse new work while the state volume is (nearly) full (``min_free_bytes``)."""
        loop = asyncio.get_running_loop()
        stat = await loop.run_in_executor(self.io, os.statvfs, self.state_dir)
        free = stat.f_bavail * stat.f_frsize
        if free < self.min_free_bytes:
            raise StateStorageError(
                f"the state volume at {self.state_dir} is full ({free // 1024} KiB free); "
                "new tasks are refused until space returns"
            )

    # -- sessions --------------------------------------------------------------------

    async def open_session(
        self, session_id: str | None = None, *, sinks: Iterable[Sink] = ()
    ) -> Session:
        """The session with this id (created on first use; idempotent)."""
        if self._closed or not self._started:
            raise SupervisorError("supervisor is not running (use `async with Supervisor()`)")
        sid = check_session_id(session_id) if session_id is not None else new_session_id()
        async with self._session_lock:
            session = self._sessions.get(sid)
            if session is None:
                existing = await self.store.get_session(sid)
                created = existing[0] if existing else time.time()
                events = EventLog(
                    sid,
                    self.store,
                    retention_events=self.event_retention,
                    sink_max_lag=self.sink_max_lag,
                )
                await events.load()
                session = Session(self._services(), sid, events, created)
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

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

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
            stalls=self.stall_watcher,
            search_io=self.search_io,
            workspace_roots=self.workspace_roots,
            end_timeout_s=self.end_timeout_s,
        )
