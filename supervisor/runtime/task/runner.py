"""One task's life, composed from small units: launch, capture, supervision, watchers,
stdin, stop; it finishes exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from supervisor.core import task_events
from supervisor.core.container import ContainerRequest, ContainerState
from supervisor.core.errors import SupervisorError, TaskNotRunning, WaitTimeout
from supervisor.core.lifecycle import Outcome, StopRequest
from supervisor.core.logs import get_logger
from supervisor.core.models import PatternMatch, TaskInfo
from supervisor.core.resolve import Effective
from supervisor.core.scan import Pattern
from supervisor.core.task_state import Stage, TaskIdentity, TaskRecord, TaskState
from supervisor.engine.base import AttachedStream
from supervisor.runtime.aio import Background, first_of
from supervisor.runtime.task.capture import Capture, MonitorFeed
from supervisor.runtime.task.launch import Launcher, pooled_command
from supervisor.runtime.task.ports import TaskPorts, WarmStart
from supervisor.runtime.task.readopt import readopt
from supervisor.runtime.task.reattach import Reattacher
from supervisor.runtime.task.search import wait_for_pattern
from supervisor.runtime.task.stdin import StdinWriter, refuse_input
from supervisor.runtime.task.stopper import Stopper
from supervisor.runtime.task.supervise import Supervision, lost_detail
from supervisor.runtime.task.watchers import Watchers

log = get_logger("supervisor.task")

#: How long bookkeeping after a start may wait for the first output (see _record_running).
SETTLE_S = 0.01


#: Stop reasons that skip SIGTERM's grace period: the task is past a limit it must not
#: go further over (the workspace layer's cap: a grace period is more writes).
AT_ONCE: frozenset[StopRequest] = frozenset({"workspace_full"})


class TaskRunner:
    """Drives one task. All public methods are safe to call concurrently with ``run``."""

    def __init__(
        self,
        ports: TaskPorts,
        *,
        ident: TaskIdentity,
        eff: Effective,
        request: ContainerRequest,
        warm: WarmStart | None = None,
        state: TaskState | None = None,
    ) -> None:
        self.ports = ports
        self.ident = ident
        self.eff = eff
        self.request = request
        self._warm = warm
        self.state = state if state is not None else TaskState(ident, time.time())
        self.log = log.bind(session_id=ident.session_id, task_id=ident.task_id)
        self.final = asyncio.Event()
        """Set once the terminal event is emitted and readable from the session's log."""
        self.done = asyncio.Event()
        """Set once the task has ended and its container is removed (or left to a reaper)."""
        self.exited = asyncio.Event()
        self.thawed = asyncio.Event()
        self.thawed.set()
        self.monitor = (
            MonitorFeed(eff.policy.monitor, ident.session_id, ident.task_id, ports.events)
            if ident.spec.kind == "monitor"
            else None
        )
        self.capture = Capture(
            self.state,
            Path(ident.output_path),
            eff.limits.output_cap_bytes,
            ports.io,
            self.log,
            monitor=self.monitor,
            on_checkpoint=lambda: self._background(self.persist("running")),
            stats=ports.stats,
        )
        if state is None:
            # A task accepted just now (not one re-read after a restart): time its start.
            self.capture.first_byte_from = ("warm" if warm else "cold", time.monotonic())
        self.stdin = StdinWriter(ident.task_id)
        self.launcher = Launcher(ports.backend, ports.preflight, self.state, self.persist)
        self.supervision = Supervision(
            ports.backend,
            self.capture,
            Reattacher(ports.backend, self.capture, self.thawed, self.log),
            self.exited,
            self.log,
            on_stream_lost=self._stream_lost,
        )
        self.stopper = Stopper(
            ports.backend,
            lambda: self.state.container_id,
            grace_s=eff.grace_s,
            exited=self.exited,
            thawed=self.thawed,
            log=self.log,
        )
        self.watchers = Watchers(
            self.state,
            eff,
            self.capture,
            ports.events,
            ports.io,
            request_stop=self.request_stop,
            stalls=ports.stalls,
        )
        self._aux = Background()

    # -- snapshots ---------------------------------------------------------------------

    @property
    def task_id(self) -> str:
        return self.ident.task_id

    @property
    def ended(self) -> bool:
        return self.state.lc.ended

    @property
    def seen(self) -> asyncio.Event:
        return self.capture.seen

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def info(self) -> TaskInfo:
        return self.state.info(self._now(), self.capture.counts())

    def record(self, stage: Stage | None = None) -> TaskRecord:
        """The record to store now (a monitor's resume point moves to the last event known
        to be stored, so a restart re-sends exactly what never reached the store)."""
        if self.monitor is not None:
            self.monitor.advance(self.state.capture)
        return self.state.record(stage or self.state.stage, self._now(), self.capture.counts())

    async def persist(self, stage: Stage | None = None) -> None:
        stage = stage or self.state.stage
        try:
            await self.ports.records.persist(stage, self.record(stage))
        except SupervisorError as exc:
            self.log.warning("persist_failed", stage=stage, error=str(exc))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        self._aux.start(work)

    @property
    def container_id(self) -> str | None:
        return self.state.container_id

    @property
    def output_path(self) -> Path:
        return self.capture.path

    # -- the life of a task ----------------------------------------------------------

    async def run(self) -> None:
        """The task's main coroutine. Never raises except on cancellation."""
        await self._guarded(self._run(), "runner_crashed", "supervisor error")

    async def resume(self, stage: str) -> None:
        """Main coroutine of a task re-adopted after a restart (instead of ``run``)."""
        await self._guarded(
            readopt(self, stage), "resume_crashed", "supervisor error while re-adopting"
        )

    async def _guarded(self, work: Coroutine[Any, Any, None], event: str, what: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            # Supervisor shutting down without stopping tasks: keep the container for
            # re-adoption, just release our side.
            await self.release()
            raise
        except Exception as exc:  # a bug must still give the task its terminal event
            self.log.exception(event)
            await self.finish_lost(f"{what}: {exc!r}")

    async def run_fresh(self) -> None:
        """Run a re-adopted task that never got a container, as it was accepted."""
        self.capture.reset_output()
        await self._run()

    async def _run(self) -> None:
        warm, self._warm = self._warm, None
        try:
            if warm is not None:
                self.supervision.stream = warm.stream  # closed with the task
                try:
                    if self.state.lc.stop_reason is None:
                        spec = self.ident.spec
                        await self.launcher.warm(warm, pooled_command(spec.command, spec.env))
                        # Only now may input flow: it must follow the command on the pipe.
                        self.attach_stdin(warm.stream)
                finally:  # opened while the command's first milliseconds run
                    await self.capture.out.open()
            else:
                await self.capture.out.open()
                stream = await self.launcher.create(self.request, self.eff.policy)
                self.supervision.stream = stream
                self.attach_stdin(stream)
            if self.state.lc.stop_reason is not None:
                await self.finish_unstarted()
                return
            if warm is None:
                await self.launcher.start()
        except SupervisorError as exc:
            await self.finish_failed(exc)
            return
        await self.after_start()

    def attach_stdin(self, stream: AttachedStream) -> None:
        """Input may flow from now on."""
        if self.state.stdin_open:
            self.stdin.attach(stream)

    def _stream_lost(self) -> None:
        self.state.stdin_open = False
        self.stdin.close(
            f"task {self.task_id}: its stdin is closed (its output ended: it exited, or the "
            "connection to the engine dropped)"
        )

    async def after_start(self) -> None:
        """The command runs: record it, announce it, arm the watchers, supervise."""
        loop = asyncio.get_running_loop()
        self.state.mark_started(time.time(), loop.time())
        self.capture.last_output_mono = loop.time()
        # Announced before any output event; recorded while the first output is captured
        # (a crash before the record lands re-adopts a "created" task that ran: the same).
        self.ports.events.emit(task_events.started(self.ident))
        await self.supervise(self._record_running())

    async def _record_running(self) -> None:
        """The "running" record (and, after it, the exit watch) waits for the first output
        or a moment: on a small machine they would compete with the command's first
        milliseconds. The watch asks for "not running", so a late one misses nothing."""
        await first_of(self.capture.seen.wait(), timeout=SETTLE_S)
        await self.persist("running")

    async def supervise(self, meanwhile: Coroutine[Any, Any, None] | None = None) -> None:
        """Arm the watchers, capture until the exit, finish."""
        self.watchers.arm()
        if self.state.lc.stop_reason is not None:  # a stop raced the start
            self.stopper.begin()
        cid = self.state.container_id
        assert cid is not None
        state = await self.supervision.run(cid, meanwhile=meanwhile)
        self.state.ended_mono = self._now()
        await self.finish_after_exit(state)

    async def finish_after_exit(self, state: ContainerState | None) -> None:
        detail = lost_detail(
            state,
            outage=self.supervision.engine_outage and not self.ports.live_restore,
            stopping=self.state.lc.stop_reason is not None,
        )
        if state is None or detail is not None:
            await self.finish_lost(detail or "the container disappeared")
            return
        outcome = self.state.lc.finish_exited(state.exit_code, oom_killed=state.oom_killed)
        if outcome is not None:
            await self._conclude(outcome, detail=state.error)

    # -- ending -------------------------------------------------------------------------

    def request_stop(self, reason: StopRequest) -> bool:
        """Ask the task to stop (first reason wins). Returns True if this call started it."""
        if not self.state.lc.request_stop(reason):
            return False
        self.log.info("stop_requested", reason=reason)
        self._background(self.persist())
        if self.state.lc.started:
            self.stopper.begin(at_once=reason in AT_ONCE)
        return True

    async def finish_unstarted(self) -> None:
        outcome = self.state.lc.finish_unstarted()
        if outcome is not None:
            await self._conclude(outcome)

    async def finish_lost(self, detail: str) -> None:
        outcome = self.state.lc.finish_lost(detail)
        if outcome is not None:
            await self._conclude(outcome, detail=detail)

    async def finish_failed(self, exc: SupervisorError) -> None:
        outcome = self.state.lc.finish_failed(exc.code, str(exc))
        if outcome is not None:
            self.log.warning("task_failed", error_code=exc.code, error=str(exc))
            await self._conclude(outcome)

    async def abandon(self, detail: str) -> None:
        """Give the task its terminal event now (``lost``) without waiting for the engine;
        keep trying to kill and remove the container in the background."""
        outcome = self.state.lc.finish_lost(detail)
        if outcome is not None:
            await self._conclude(outcome, detail=detail, remove=False)
        self.done.set()
        self.stopper.reap_later()

    async def _conclude(
        self, outcome: Outcome, detail: str | None = None, *, remove: bool = True
    ) -> None:
        """Emit the one terminal event, persist, remove the container. Survives cancellation."""
        self.state.mark_ended(time.time(), self._now())
        self.watchers.disarm()
        self.stdin.close(f"task {self.task_id} has ended; it takes no input")
        if self.monitor is not None:
            self.monitor.flush_all()
        await self.capture.out.close()
        await self.supervision.close()
        counts = self.capture.counts()
        self.ports.events.emit(
            task_events.ended(
                self.ident,
                outcome,
                running_ms=self.state.running_ms(self._now()),
                output_bytes=counts.task_bytes,
                dropped_bytes=counts.dropped,
                detail=detail,
            )
        )
        self.log.info(
            "task_ended", status=outcome.status, reason=outcome.reason, exit_code=outcome.exit_code
        )
        # wait() and stop() return only once the terminal event can be read from the
        # session's log (a reader right after wait() must find it).
        await asyncio.shield(self.ports.events.caught_up())
        self.final.set()
        await self.persist("ended")
        if remove:
            await asyncio.shield(self.stopper.remove())
        self.done.set()

    async def release(self) -> None:
        """Drop our side (stream, timers, file) without touching the container."""
        self.watchers.disarm()
        self.stopper.cancel()
        self._aux.cancel()
        self.stdin.close(f"task {self.task_id}: the supervisor is shutting down")
        for step, what in (
            (self.supervision.close, "close_stream"),
            (self.capture.out.close, "close_output"),
        ):
            try:
                await step()
            except Exception as exc:  # noqa: BLE001 - shutting down: note it and go on
                self.log.warning("release_step_failed", step=what, error=repr(exc))
        await asyncio.shield(self.persist())

    # -- caller operations ---------------------------------------------------------------

    async def wait_final(self, timeout: float | None = None) -> TaskInfo:
        """Wait until the terminal event has been emitted."""
        try:
            await asyncio.wait_for(self.final.wait(), timeout)
        except TimeoutError:
            raise WaitTimeout(
                f"task {self.task_id} still {self.state.lc.status} after {timeout} s"
            ) from None
        return self.info()

    async def stop(self, reason: StopRequest = "user_stopped") -> TaskInfo:
        if self.ended:
            raise TaskNotRunning(self.info())
        self.request_stop(reason)
        await self.final.wait()
        return self.info()

    async def send_input(self, data: bytes, *, eof: bool = False) -> None:
        if self.ended:
            raise TaskNotRunning(self.info(), f"task {self.task_id} has ended; it takes no input")
        backend = self.ports.backend
        refuse_input(
            self.task_id,
            stdin_open=self.state.stdin_open,
            started_closed=self.eff.stdin == "closed",
            eof=eof and not backend.capabilities.stdin_eof,
            backend=backend.name,
        )
        await self.stdin.send(data, eof=eof)
        if eof:
            self.state.stdin_open = False
        if self.ports.stalls is not None:
            self.ports.stalls.input_sent(self.task_id)
        self.state.stalled = False

    async def wait_output(self, offset: int, timeout_s: float) -> None:
        """Return once the output file grows past ``offset``, the task ends, or time runs out."""
        await self.capture.wait_past(offset, timeout_s, self.final)

    async def wait_for_pattern(
        self, pattern: Pattern, timeout_s: float, from_offset: int = 0
    ) -> PatternMatch:
        """First line at/after ``from_offset`` matching ``pattern`` (searched in the file)."""
        return await wait_for_pattern(
            self.capture.path,
            pattern,
            self,
            self.ports.search_io or self.ports.io,
            timeout_s=timeout_s,
            from_offset=from_offset,
        )
