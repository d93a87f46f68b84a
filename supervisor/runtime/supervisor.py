"""The Supervisor: owns the engine connection, the state store, policies and sessions."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from supervisor.core.errors import (
    EngineUnavailable,
    ImageMissing,
    PolicyError,
    RuntimeUnavailable,
    SessionNotFound,
    StateStorageError,
    SupervisorError,
)
from supervisor.core.ids import check_session_id, new_session_id
from supervisor.core.logs import get_logger
from supervisor.core.paths import default_state_dir
from supervisor.core.policy import Policy, PolicySet, default_policies_dir
from supervisor.engine.base import Backend
from supervisor.engine.probe import PROBE_LABEL, probe_runtime
from supervisor.runtime.session import Session
from supervisor.state.eventlog import EventLog
from supervisor.state.sinks import Sink
from supervisor.state.store import StateStore

log = get_logger("supervisor")

LABEL_OWNER = "io.sbx.owner"
LABEL_PREFIX = "io.sbx."
_RUNTIME_CACHE_S = 30.0
_IMAGE_CACHE_S = 10.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _pid_start(pid: int) -> str | None:
    """Kernel start time of ``pid`` (clock ticks since boot), or None if it is not alive."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _lock_state(path: str, grace_s: float) -> bool | None:
    """Owner state from its state-dir lock: True (held: alive), False (gone for good: no
    lock file, or not held and untouched for ``grace_s``), None (not held but recently alive:
    it may be restarting and will re-adopt its containers). The probe takes a shared lock for
    an instant; an owner starting at that moment retries its own lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        age = time.time() - os.fstat(fd).st_mtime
        return False if age > grace_s else None
    finally:
        os.close(fd)


def owner_alive(labels: dict[str, str], grace_s: float = 600.0) -> bool | None:
    """Is the supervisor that labeled a container still running? None when we cannot tell.

    Owners are identified by their state dir (its lock is held while a supervisor runs on
    it, and touched as a heartbeat), so a restarted supervisor is the same, live owner; a
    dead owner's containers are left to it for ``grace_s`` before anyone else reaps them."""
    boot = labels.get(LABEL_PREFIX + "owner.boot")
    host = labels.get(LABEL_PREFIX + "owner.host")
    if boot is None:
        return None
    if boot != _boot_id():
        # Same host name but another boot: the machine restarted, the owner is gone.
        return False if host == socket.gethostname() else None
    lock = labels.get(LABEL_PREFIX + "owner.lock")
    if lock:
        return _lock_state(lock, grace_s)
    pid = labels.get(LABEL_PREFIX + "owner.pid")
    start = labels.get(LABEL_PREFIX + "owner.pidstart")
    if pid is None:
        return None
    try:
        actual = _pid_start(int(pid))
    except ValueError:
        return None
    return actual is not None and actual == start


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
        self.store = StateStore(self.state_dir / "state.db")
        self.instance_id = ""
        self.stall_watcher: Any = None
        self._sessions: dict[str, Session] = {}
        self._session_lock = asyncio.Lock()
        self._lock_fd: int | None = None
        self._engine_ok = False
        self._engine_info: dict[str, str] = {}
        self._engine_checked = 0.0
        self._reconnect: asyncio.Task[None] | None = None
        self._runtimes: tuple[float, set[str]] = (0.0, set())
        self._runsc_probe: asyncio.Task[str | None] | None = None
        self._images: dict[str, tuple[float, str | None]] = {}
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
        await loop.run_in_executor(self.io, self._lock_state_dir)
        await self.store.open()
        instance = await self.store.get_meta("instance_id")
        if instance is None:
            instance = secrets.token_hex(8)
            await self.store.set_meta("instance_id", instance)
        self.instance_id = instance
        self._owner_labels = {
            LABEL_OWNER: instance,
            LABEL_PREFIX + "owner.host": socket.gethostname(),
            LABEL_PREFIX + "owner.boot": _boot_id(),
            LABEL_PREFIX + "owner.pid": str(os.getpid()),
            LABEL_PREFIX + "owner.pidstart": _pid_start(os.getpid()) or "",
            LABEL_PREFIX + "owner.lock": str(self.state_dir.resolve() / "supervisor.lock"),
        }
        if self._backend is None:
            from supervisor.engine.docker import DockerBackend  # noqa: PLC0415 - optional dep

            self._backend = DockerBackend(self._docker_host)
        if self.stall_watcher is None:
            from supervisor.runtime.stall_watch import StallWatcher  # noqa: PLC0415 - avoid cycle

            self.stall_watcher = StallWatcher(self._backend, self.io)
        self._started = True
        try:
            self._engine_info = await self._backend.ping()
            self._engine_ok = True
            self._engine_checked = loop.time()
        except EngineUnavailable:
            if self.require_engine:
                await self.aclose()
                raise
            self._start_reconnect()
        if self._engine_ok:
            with contextlib.suppress(SupervisorError):
                self.live_restore = await self._backend.live_restore()
        await self._restore()
        if self._engine_ok and self.sweep_orphans:
            await self.sweep()
        self._reconciler = asyncio.create_task(self._reconcile_loop(), name="reconcile")
        log.info("supervisor_started", instance_id=instance, state_dir=str(self.state_dir))

    def _lock_state_dir(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.state_dir / "supervisor.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        for attempt in range(50):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 49:
                    holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                    os.close(fd)
                    raise StateStorageError(
                        f"state dir {self.state_dir} is in use by another supervisor (pid {holder})"
                    ) from None
                # Another supervisor may be probing whether we are alive: that takes an instant.
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

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
        for task in (self._reconnect, self._reconciler):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.stall_watcher is not None:
            await self.stall_watcher.aclose()
        if self._runsc_probe is not None and not self._runsc_probe.done():
            self._runsc_probe.cancel()
        if self._backend is not None:
            await self._backend.aclose()
        with contextlib.suppress(Exception):
            await self.store.close()
        self.io.shutdown(wait=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- engine health -------------------------------------------------------------

    @property
    def engine_ok(self) -> bool:
        return self._engine_ok

    @property
    def engine_info(self) -> dict[str, str]:
        return dict(self._engine_info)

    def mark_engine_down(self, why: str) -> None:
        if self._engine_ok:
            log.warning("engine_down", error=why)
        self._engine_ok = False
        self._start_reconnect()

    def _start_reconnect(self) -> None:
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = asyncio.create_task(self._reconnect_loop(), name="engine-reconnect")

    async def _reconnect_loop(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                self._engine_info = await asyncio.wait_for(self.backend.ping(), 5)
            except (EngineUnavailable, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self._engine_ok = True
            log.info("engine_back", **self._engine_info)
            return

    async def ensure_engine(self) -> None:
        """Fail fast with EngineUnavailable when the engine does not answer (a sub-millisecond
        ``/_ping`` on its own connection, bounded at 2 s)."""
        loop = asyncio.get_running_loop()
        if await self.backend.alive():
            if not self._engine_ok:
                self._engine_ok = True
                log.info("engine_back")
            self._engine_checked = loop.time()
            return
        self.mark_engine_down("ping failed")
        raise EngineUnavailable(
            "the Docker engine does not answer; start it with `make engine` "
            "(or point DOCKER_HOST at one)"
        )

    async def runtimes(self) -> set[str]:
        loop = asyncio.get_running_loop()
        stamp, cached = self._runtimes
        if loop.time() - stamp < _RUNTIME_CACHE_S and cached:
            return cached
        names = await self.backend.runtimes()
        self._runtimes = (loop.time(), names)
        return names

    async def check_runtime(self, runtime: str) -> None:
        """Raise RuntimeUnavailable when ``runtime`` is not registered or (runsc) cannot start
        a container. Never falls back to another runtime."""
        if runtime == "runc":
            return
        if runtime not in await self.runtimes():
            raise RuntimeUnavailable(
                f"runtime {runtime!r} is not registered with the engine, so this policy cannot "
                "run (it never falls back to runc); install gVisor with `make engine`"
            )
        if runtime == "runsc":
            if self._runsc_probe is None:
                self._runsc_probe = asyncio.create_task(self._probe_runsc())
            problem = await asyncio.shield(self._runsc_probe)
            if problem is not None:
                raise RuntimeUnavailable(
                    f"runtime runsc is registered but cannot start a container ({problem}); "
                    "this policy never falls back to runc"
                )

    async def _probe_runsc(self) -> str | None:

        return await probe_runtime(self.backend, "runsc", self.policies)

    async def check_image(self, policy: Policy) -> None:
        """ImageMissing when the policy's image is absent; PolicyError when a pin mismatches."""
        loop = asyncio.get_running_loop()
        stamp, image_id = self._images.get(policy.image, (0.0, None))
        if image_id is None or loop.time() - stamp > _IMAGE_CACHE_S:
            image_id = await self.backend.image_id(policy.image)
            self._images[policy.image] = (loop.time(), image_id)
        if image_id is None:
            raise ImageMissing(
                f"image {policy.image!r} (policy {policy.name!r}) is not present on the engine; "
                "build it with `sbx images build` or `make images`"
            )
        if policy.image_id is not None and image_id != policy.image_id:
            raise PolicyError(
                f"policy {policy.name!r} pins image_id {policy.image_id} but {policy.image!r} is "
                f"{image_id}; rebuild or update the pin"
            )

    # -- labels and orphans ----------------------------------------------------------

    def container_labels(self, **fields: Any) -> dict[str, str]:
        """Owner labels plus ``io.sbx.<field>`` (``session_id`` -> ``io.sbx.session``,
        ``task_id`` -> ``io.sbx.task``, ``timeout_ms`` -> ``io.sbx.timeout-ms``)."""
        labels = dict(self._owner_labels)
        for key, value in fields.items():
            name = key.removesuffix("_id").replace("_", "-")
            labels[LABEL_PREFIX + name] = "" if value is None else str(value)
        return labels

    async def sweep(self) -> int:
        """Stop and remove containers whose owning supervisor is gone. Never touches
        unlabeled containers or those of a live owner. Returns how many were removed."""
        removed = 0
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
            if owner_alive(row.labels, self.orphan_grace_s) is False:
                log.info("reaping_orphan", container=row.id[:12], owner=owner)
                with contextlib.suppress(SupervisorError):
                    await self.backend.remove(row.id)
                    removed += 1
        return removed

    async def adopt_or_reap(self, container_id: str, labels: dict[str, str]) -> bool:
        """A container of our own instance: kept when a task (restored from the store) owns
        it, reaped when no record knows it (e.g. a crash between create and record)."""
        task_id = labels.get(LABEL_PREFIX + "task", "")
        if any(session.owns(task_id) for session in self._sessions.values()):
            return False
        log.info("reaping_unrecorded", container=container_id[:12], task_id=task_id)
        with contextlib.suppress(SupervisorError):
            await self.backend.remove(container_id)
            return True
        return False

    async def find_container(self, task_id: str) -> str | None:
        """Our container for ``task_id``, found by its labels (any state)."""
        rows = await self.backend.list_labeled(f"{LABEL_PREFIX}task={task_id}")
        for row in rows:
            if row.labels.get(LABEL_OWNER) == self.instance_id:
                return row.id
        return None

    async def _restore(self) -> None:
        """Re-open the sessions that were open when the last supervisor on this state dir
        stopped (or died) and re-adopt their tasks."""
        from supervisor.runtime.task.runner import TaskRecord  # noqa: PLC0415 - avoid import cycle

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
            await asyncio.get_running_loop().run_in_executor(self.io, self._heartbeat)
            if not self._engine_ok:
                continue
            try:
                rows = await self.backend.list_labeled(f"{LABEL_OWNER}={self.instance_id}")
            except SupervisorError:
                continue
            for row in rows:
                await self.adopt_or_reap(row.id, row.labels)
            if self.sweep_orphans and ticks % 6 == 0:
                await self.sweep()

    def _heartbeat(self) -> None:
        """Touch the lock: other supervisors see we were alive just now (see owner_alive)."""
        with contextlib.suppress(OSError):
            os.utime(self.state_dir / "supervisor.lock")

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
                session = Session(self, sid, events, created)
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

    def _forget(self, session: Session) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
