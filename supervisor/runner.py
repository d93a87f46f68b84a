"""One task's life: create, attach, start, capture, enforce its lifetime, finish exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict

from supervisor.backend.base import AttachedStream, Backend, ContainerRequest, ContainerState
from supervisor.errors import (
    EngineError,
    EngineUnavailable,
    StdinClosed,
    SupervisorError,
    TaskNotRunning,
    WaitTimeout,
)
from supervisor.events import (
    BaseEvent,
    TaskFailed,
    TaskPoll,
    TaskStalled,
    TaskStarted,
    TaskStopped,
)
from supervisor.lifecycle import Lifecycle, Outcome, StopRequest
from supervisor.models import PatternMatch, TaskInfo, TaskSpec
from supervisor.monitor import LineChunker
from supervisor.output import OutputFile, read_tail
from supervisor.resolve import Effective

log = structlog.get_logger("supervisor.runner")

#: After the container exits, how long the output stream may take to drain.
_DRAIN_S = 10.0
#: How often the capture position is persisted while output flows.
_CHECKPOINT_S = 1.0


class CaptureState(BaseModel):
    """How far capture got; persisted so a restarted supervisor resumes without loss."""

    model_config = ConfigDict(extra="forbid")

    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_newlines: int = 0
    task_bytes: int = 0
    file_size: int = 0


class TaskRecord(BaseModel):
    """What the store keeps for one task."""

    model_config = ConfigDict(extra="forbid")

    spec: TaskSpec
    stage: str
    """intent -> created -> running -> ended."""
    info: TaskInfo
    container_id: str | None = None
    capture: CaptureState = CaptureState()
    monitor_ordinal: int = 0


@dataclass
class RunnerContext:
    """Shared services a runner uses (owned by the session / supervisor)."""

    backend: Backend
    io: Executor
    emit: Callable[[BaseEvent], BaseEvent]
    persist: Callable[[str, TaskRecord], Any]
    watch: Any = None
    """The stall watcher service (or None)."""
    prepare_network: Callable[[], Any] | None = None
    check_runtime: Callable[[str], Any] | None = None
    """Coroutine raising RuntimeUnavailable when the policy's runtime cannot run containers."""
    check_image: Callable[[Any], Any] | None = None
    """Coroutine raising ImageMissing (or PolicyError for a wrong pin) before create."""
    on_done: Callable[[TaskRunner], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class TaskRunner:
    """Drives one task. All public methods are safe to call concurrently with ``run``."""

    def __init__(
        self,
        ctx: RunnerContext,
        *,
        task_id: str,
        session_id: str,
        spec: TaskSpec,
        eff: Effective,
        request: ContainerRequest,
        output_path: Path,
    ) -> None:
        self.ctx = ctx
        self.task_id = task_id
        self.session_id = session_id
        self.spec = spec
        self.eff = eff
        self.request = request
        self.output_path = output_path
        self.lc = Lifecycle()
        self.log = log.bind(session_id=session_id, task_id=task_id)
        self.container_id: str | None = None
        self._stream: AttachedStream | None = None
        self._out = OutputFile(output_path, eff.limits.output_cap_bytes, ctx.io)
        self.capture = CaptureState()
        now = time.time()
        self.created_at = now
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._started_mono: float | None = None
        self._ended_mono: float | None = None
        self.deadline_at: float | None = None
        self._final = asyncio.Event()
        self._done = asyncio.Event()
        self._exited = asyncio.Event()
        self._output_seen = asyncio.Event()
        self._stdin_open = eff.stdin == "pipe"
        self._timers: list[asyncio.TimerHandle] = []
        self._aux: list[asyncio.Task[Any]] = []
        self._kill_task: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._last_output_mono = 0.0
        self._bytes_at_last_poll = 0
        self._chunker: LineChunker | None = None
        if spec.kind == "monitor":
            self._chunker = LineChunker(eff.policy.monitor, session_id, task_id)
        self.stalled = False
        self._last_checkpoint = 0.0
        self.error: Outcome | None = None

    # -- snapshots -----------------------------------------------------------------

    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def running_ms(self) -> int:
        if self._started_mono is None:
            return 0
        end = self._ended_mono if self._ended_mono is not None else self._loop_time()
        return int((end - self._started_mono) * 1000)

    def info(self) -> TaskInfo:
        o = self.lc.outcome
        return TaskInfo(
            task_id=self.task_id,
            session_id=self.session_id,
            command=self.spec.command,
            description=self.spec.description,
            kind=self.spec.kind,
            policy=self.eff.policy.name,
            status=self.lc.status,
            output_path=str(self.output_path),
            persistent=self.eff.persistent,
            timeout_ms=self.eff.timeout_ms,
            stdin=self.eff.stdin,
            created_at=self.created_at,
            started_at=self.started_at,
            ended_at=self.ended_at,
            deadline_at=self.deadline_at,
            running_ms=self.running_ms(),
            reason=o.reason if o else None,
            exit_code=o.exit_code if o else None,
            error=o.error if o else None,
            error_code=o.error_code if o else None,
            container_id=self.container_id[:12] if self.container_id and not o else None,
            output_bytes=self._out.task_bytes,
            dropped_bytes=self._out.dropped,
            stalled=self.stalled,
        )

    def record(self, stage: str) -> TaskRecord:
        self.capture.task_bytes = self._out.task_bytes
        self.capture.file_size = self._out.file_size
        return TaskRecord(
            spec=self.spec,
            stage=stage,
            info=self.info(),
            container_id=self.container_id,
            capture=self.capture.model_copy(),
            monitor_ordinal=self._chunker.ordinal if self._chunker else 0,
        )

    async def _persist(self, stage: str) -> None:
        try:
            await self.ctx.persist(stage, self.record(stage))
        except SupervisorError as exc:
            self.log.warning("persist_failed", stage=stage, error=str(exc))

    @property
    def ended(self) -> bool:
        return self.lc.ended

    @property
    def done(self) -> asyncio.Event:
        return self._done

    @property
    def stdin_open(self) -> bool:
        return self._stdin_open and not self.lc.ended

    @property
    def last_output_mono(self) -> float:
        """Loop time of the last output (the start time before any output)."""
        return self._last_output_mono

    @property
    def started_mono(self) -> float:
        return self._started_mono or 0.0

    async def report_stall(
        self, signal: Literal["process_state", "heuristic"], waiting_s: float
    ) -> None:
        """Emit one ``task.stalled`` for the current episode (called by the stall watcher)."""
        if self.lc.ended or self.lc.stop_reason is not None:
            return
        tail = await read_tail(self.output_path, 2000, self.ctx.io)
        lines = tail.split("\n")
        last = "\n".join(lines[-20:])
        if self.lc.ended:
            return
        self.stalled = True
        self.log.info("task_stalled", signal=signal, waiting_s=round(waiting_s, 2))
        self.ctx.emit(
            TaskStalled(
                session_id=self.session_id,
                task_id=self.task_id,
                command=self.spec.command,
                description=self.spec.description,
                output_path=str(self.output_path),
                signal=signal,
                last_output=last,
                waiting_ms=int(waiting_s * 1000),
            )
        )

    # -- the life of a task --------------------------------------------------------

    async def run(self) -> None:
        """The task's main coroutine. Never raises except on cancellation."""
        try:
            await self._run()
        except asyncio.CancelledError:
            # Supervisor shutting down without stopping tasks: keep the container for
            # re-adoption, just release our side.
            await self._release()
            raise
        except Exception as exc:  # a bug must still give the task its terminal event
            self.log.exception("runner_crashed")
            await self._finish_lost(f"supervisor error: {exc!r}")
        finally:
            if self.ctx.on_done is not None and self.lc.ended:
                self.ctx.on_done(self)

    async def _run(self) -> None:
        await self._out.open()
        await self._persist("intent")
        try:
            if self.ctx.check_runtime is not None:
                await self.ctx.check_runtime(self.eff.policy.runtime)
            if self.ctx.check_image is not None:
                await self.ctx.check_image(self.eff.policy)
            if self.ctx.prepare_network is not None:
                await self.ctx.prepare_network()
            self.container_id = await self.ctx.backend.create(self.request)
            await self._persist("created")
            self._stream = await self.ctx.backend.attach(
                self.container_id, stdin=self._stdin_open, logs=False
            )
            if self.lc.stop_reason is not None:
                await self._finish_unstarted()
                return
            await self.ctx.backend.start(self.container_id)
        except SupervisorError as exc:
            await self._finish_failed(exc)
            return
        self.lc.mark_started()
        self.started_at = time.time()
        self._started_mono = self._loop_time()
        self._last_output_mono = self._started_mono
        if self.eff.timeout_ms is not None:
            self.deadline_at = self.started_at + self.eff.timeout_ms / 1000
        self.ctx.emit(
            TaskStarted(
                session_id=self.session_id,
                task_id=self.task_id,
                command=self.spec.command,
                description=self.spec.description,
                kind=self.spec.kind,
                policy=self.eff.policy.name,
                output_path=str(self.output_path),
                persistent=self.eff.persistent,
                timeout_ms=self.eff.timeout_ms,
            )
        )
        await self._persist("running")
        self._arm_watchers()
        if self.lc.stop_reason is not None:  # stop raced the start
            self._begin_kill()
        await self._supervise()

    def _arm_watchers(self) -> None:
        loop = asyncio.get_running_loop()
        if self.eff.timeout_ms is not None:
            self._timers.append(
                loop.call_later(self.eff.timeout_ms / 1000, self.request_stop, "timeout")
            )
        if self.eff.idle_timeout_ms is not None:
            self._timers.append(loop.call_later(self.eff.idle_timeout_ms / 1000, self._idle_check))
        if self.eff.poll_every_s is not None:
            self._poller = asyncio.create_task(self._poll_loop(self.eff.poll_every_s))
        if self.ctx.watch is not None and self.eff.stall_after_s is not None:
            self.ctx.watch.register(self)

    def _idle_check(self) -> None:
        if self.lc.ended or self.eff.idle_timeout_ms is None:
            return
        idle_s = self.eff.idle_timeout_ms / 1000
        quiet = self._loop_time() - self._last_output_mono
        if quiet >= idle_s:
            self.request_stop("idle_timeout")
        else:
            self._timers.append(
                asyncio.get_running_loop().call_later(idle_s - quiet, self._idle_check)
            )

    async def _poll_loop(self, every_s: float) -> None:
        while not self.lc.ended:
            await asyncio.sleep(every_s)
            if self.lc.ended or self.lc.stop_reason is not None:
                return
            new = self._out.task_bytes + self._out.dropped - self._bytes_at_last_poll
            if new == 0 and self.eff.poll_only_on_change:
                continue
            self._bytes_at_last_poll += new
            tail = await read_tail(self.output_path, self.eff.poll_tail_chars, self.ctx.io)
            if self.lc.ended:
                return
            self.ctx.emit(
                TaskPoll(
                    session_id=self.session_id,
                    task_id=self.task_id,
                    command=self.spec.command,
                    description=self.spec.description,
                    running_ms=self.running_ms(),
                    tail=tail,
                    new_bytes=new,
                )
            )

    async def _supervise(self) -> None:
        assert self.container_id is not None
        capture = asyncio.create_task(self._capture(), name=f"capture-{self.task_id}")
        try:
            state = await self._wait_exit()
        except BaseException:
            capture.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await capture
            raise
        self._exited.set()
        self._ended_mono = self._loop_time()
        try:
            await asyncio.wait_for(asyncio.shield(capture), _DRAIN_S)
        except TimeoutError:
            self.log.warning("capture_drain_timeout")
            capture.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await capture
        if state is None:
            await self._finish_lost("the container disappeared")
            return
        await self._finish_exited(state)

    async def _wait_exit(self) -> ContainerState | None:
        """Wait for the container to stop; ride out engine outages (None = container gone)."""
        assert self.container_id is not None
        delay = 0.2
        while True:
            try:
                return await self.ctx.backend.wait(self.container_id)
            except EngineUnavailable as exc:
                self.log.warning("engine_unavailable_while_waiting", error=str(exc))
            except EngineError as exc:
                state = None
                with contextlib.suppress(SupervisorError):
                    state = await self.ctx.backend.inspect(self.container_id)
                if state is None:
                    self.log.warning("container_vanished", error=str(exc))
                    return None
                if not state.running:
                    return state
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _capture(self) -> None:
        stream = self._stream
        if stream is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            segments = await stream.read()
            if segments is None:
                break
            for kind, payload in segments:
                if kind == 2:
                    self.capture.stderr_bytes += len(payload)
                else:
                    self.capture.stdout_bytes += len(payload)
                    self.capture.stdout_newlines += payload.count(b"\n")
            data = segments[0][1] if len(segments) == 1 else b"".join(p for _, p in segments)
            await self._out.append(data)
            now = loop.time()
            self._last_output_mono = now
            if self._chunker is not None:
                self._emit_monitor(self._chunker.feed(data, now))
                self._schedule_monitor_flush()
            self._output_seen.set()
            self._output_seen = asyncio.Event()
            if now - self._last_checkpoint >= _CHECKPOINT_S:
                self._last_checkpoint = now
                self._aux.append(asyncio.create_task(self._persist("running")))
                self._aux = [t for t in self._aux if not t.done()]

    # -- monitor batching ----------------------------------------------------------

    def _emit_monitor(self, events: list[BaseEvent]) -> None:
        for ev in events:
            self.ctx.emit(ev)

    def _schedule_monitor_flush(self) -> None:
        assert self._chunker is not None
        due = self._chunker.next_flush_at()
        if due is None:
            return
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_at(due, self._monitor_tick))

    def _monitor_tick(self) -> None:
        if self._chunker is None or self.lc.ended:
            return
        self._emit_monitor(self._chunker.tick(self._loop_time()))
        self._schedule_monitor_flush()

    # -- ending ----------------------------------------------------------------------

    def request_stop(self, reason: StopRequest) -> bool:
        """Ask the task to stop (first reason wins). Returns True if this call started it."""
        if not self.lc.request_stop(reason):
            return False
        self.log.info("stop_requested", reason=reason)
        if self.lc.started:
            self._begin_kill()
        return True

    def _begin_kill(self) -> None:
        if self._kill_task is None:
            self._kill_task = asyncio.create_task(
                self._kill_sequence(), name=f"kill-{self.task_id}"
            )

    async def _kill_sequence(self) -> None:
        """SIGTERM, a grace period, then SIGKILL (retried while the engine is away)."""
        cid = self.container_id
        if cid is None:
            return
        with contextlib.suppress(SupervisorError):
            await self.ctx.backend.kill(cid, "SIGTERM")
        try:
            await asyncio.wait_for(self._exited.wait(), self.eff.grace_s)
            return
        except TimeoutError:
            pass
        while not self._exited.is_set():
            try:
                await self.ctx.backend.kill(cid, "SIGKILL")
            except SupervisorError as exc:
                self.log.warning("sigkill_failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), 1.0)

    def _stop_watchers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._poller is not None:
            self._poller.cancel()
        if self.ctx.watch is not None:
            self.ctx.watch.unregister(self)

    async def _flush_monitor(self) -> None:
        if self._chunker is not None:
            self._emit_monitor(self._chunker.flush_all())

    async def _finish_exited(self, state: ContainerState) -> None:
        outcome = self.lc.finish_exited(state.exit_code, oom_killed=state.oom_killed)
        if outcome is None:
            return
        await self._conclude(outcome, detail=state.error)

    async def _finish_unstarted(self) -> None:
        outcome = self.lc.finish_unstarted()
        if outcome is not None:
            await self._conclude(outcome)

    async def _finish_lost(self, detail: str) -> None:
        outcome = self.lc.finish_lost(detail)
        if outcome is not None:
            await self._conclude(outcome, detail=detail)

    async def _finish_failed(self, exc: SupervisorError) -> None:
        outcome = self.lc.finish_failed(exc.code, str(exc))
        if outcome is not None:
            self.log.warning("task_failed", error_code=exc.code, error=str(exc))
            await self._conclude(outcome)

    async def _conclude(self, outcome: Outcome, detail: str | None = None) -> None:
        """Emit the one terminal event, persist, remove the container. Survives cancellation."""
        self.ended_at = time.time()
        if self._ended_mono is None:
            self._ended_mono = self._loop_time()
        self._stop_watchers()
        self.stalled = False
        await self._flush_monitor()
        await self._out.close()
        if self._stream is not None:
            await self._stream.aclose()
        common = {
            "session_id": self.session_id,
            "task_id": self.task_id,
            "command": self.spec.command,
            "description": self.spec.description,
            "output_path": str(self.output_path),
        }
        if outcome.ran:
            assert outcome.reason is not None
            self.ctx.emit(
                TaskStopped(
                    **common,
                    reason=outcome.reason,
                    exit_code=outcome.exit_code,
                    running_ms=self.running_ms(),
                    output_bytes=self._out.task_bytes,
                    dropped_bytes=self._out.dropped,
                    detail=detail or outcome.error,
                )
            )
        else:
            self.ctx.emit(
                TaskFailed(
                    **common,
                    error_code=outcome.error_code or "error",
                    message=outcome.error or "the task could not be started",
                )
            )
        self.log.info(
            "task_ended", status=outcome.status, reason=outcome.reason, exit_code=outcome.exit_code
        )
        self._final.set()
        await self._persist("ended")
        await asyncio.shield(self._remove())
        self._done.set()

    async def _remove(self) -> None:
        cid = self.container_id
        if cid is None:
            return
        for attempt in range(5):
            try:
                await self.ctx.backend.remove(cid)
                return
            except SupervisorError as exc:
                self.log.warning("remove_failed", attempt=attempt, error=str(exc))
                await asyncio.sleep(0.5 * (attempt + 1))

    async def _release(self) -> None:
        """Drop our side (stream, timers, file) without touching the container."""
        self._stop_watchers()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.aclose()
        with contextlib.suppress(Exception):
            await self._out.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._persist("running" if self.lc.started else "created"))

    # -- caller operations ----------------------------------------------------------

    async def wait_final(self, timeout: float | None = None) -> TaskInfo:
        """Wait until the terminal event has been emitted."""
        try:
            await asyncio.wait_for(self._final.wait(), timeout)
        except TimeoutError:
            raise WaitTimeout(
                f"task {self.task_id} still {self.lc.status} after {timeout} s"
            ) from None
        return self.info()

    async def stop(self, reason: StopRequest = "user_stopped") -> TaskInfo:
        if self.lc.ended:
            raise TaskNotRunning(self.info())
        self.request_stop(reason)
        await self._final.wait()
        return self.info()

    async def send_input(self, data: bytes, *, eof: bool = False) -> None:
        if self.lc.ended:
            raise TaskNotRunning(self.info(), f"task {self.task_id} has ended; it takes no input")
        if not self._stdin_open or self._stream is None:
            raise StdinClosed(
                f"task {self.task_id} has no open stdin "
                f"({'started with stdin=closed' if self.eff.stdin == 'closed' else 'EOF was sent'})"
            )
        try:
            if data:
                await self._stream.write(data)
            if eof:
                self._stdin_open = False
                await self._stream.close_stdin()
        except (BrokenPipeError, ConnectionError, OSError) as exc:
            self._stdin_open = False
            raise StdinClosed(f"task {self.task_id}: stdin is closed ({exc})") from exc
        if self.ctx.watch is not None:
            self.ctx.watch.input_sent(self)

    async def wait_output(self, offset: int, timeout_s: float) -> None:
        """Return once the output file grows past ``offset``, the task ends, or time runs out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._out.file_size <= offset and not self.lc.ended:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            seen, final = self._output_seen, self._final
            waiters = [asyncio.ensure_future(seen.wait()), asyncio.ensure_future(final.wait())]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    async def wait_for_pattern(
        self, pattern: re.Pattern[bytes], timeout_s: float, from_offset: int = 0
    ) -> PatternMatch:
        """First line at/after ``from_offset`` matching ``pattern`` (searched in the file)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        offset = from_offset
        carry = b""
        while True:
            seen = self._output_seen
            ended = self.lc.ended or self._exited.is_set()
            data = await loop.run_in_executor(self.ctx.io, _read_from, self.output_path, offset)
            if data:
                buf = carry + data
                base = offset - len(carry)
                lines = buf.split(b"\n")
                complete, carry = lines[:-1], lines[-1]
                pos = base
                for line in complete:
                    if pattern.search(line):
                        return PatternMatch(line=line.decode("utf-8", "replace"), offset=pos)
                    pos += len(line) + 1
                offset += len(data)
                # An endless line: search it as it stands.
                if len(carry) > 1 << 20 and pattern.search(carry):
                    return PatternMatch(line=carry.decode("utf-8", "replace"), offset=pos)
                continue
            if ended:
                if self._exited.is_set() and not self.lc.ended:
                    await self._final.wait()
                    continue
                if carry and pattern.search(carry):
                    return PatternMatch(
                        line=carry.decode("utf-8", "replace"), offset=offset - len(carry)
                    )
                raise TaskNotRunning(
                    self.info(),
                    f"task {self.task_id} ended ({self.info().describe_end()}) without printing "
                    f"a line matching {pattern.pattern.decode('utf-8', 'replace')!r}",
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise WaitTimeout(
                    f"no line matching {pattern.pattern.decode('utf-8', 'replace')!r} in the "
                    f"output of task {self.task_id} within {timeout_s} s"
                )
            waiters = [
                asyncio.ensure_future(seen.wait()),
                asyncio.ensure_future(self._final.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(8 << 20)
    except FileNotFoundError:
        return b""
