"""One task's life: create, attach, start, capture, enforce its lifetime, finish exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from supervisor.core.container import ContainerRequest, ContainerState, Segment
from supervisor.core.errors import (
    EngineError,
    EngineUnavailable,
    StdinClosed,
    SupervisorError,
    TaskNotRunning,
    WaitTimeout,
)
from supervisor.core.events import (
    BaseEvent,
    TaskFailed,
    TaskPoll,
    TaskStalled,
    TaskStarted,
    TaskStopped,
)
from supervisor.core.faults import crash_point
from supervisor.core.lifecycle import Lifecycle, Outcome, StopRequest, status_for
from supervisor.core.logs import get_logger
from supervisor.core.models import PatternMatch, TaskInfo, TaskSpec
from supervisor.core.monitor import LineChunker
from supervisor.core.policy import Policy
from supervisor.core.resolve import Effective
from supervisor.core.resync import (
    COPIER_CHUNK,
    Message,
    after_anchor,
    drop_known,
    engine_log_bytes,
    logged_prefix_by_lines,
    overlap,
    split_stamp,
)
from supervisor.engine.base import AttachedStream, Backend
from supervisor.runtime.pool import Pooled
from supervisor.state.output import OutputFile, read_range, read_tail, replayed_length

log = get_logger("supervisor.runtime.task.runner")

#: After the container exits, how long the output stream may take to drain.
_DRAIN_S = 10.0
#: How often the capture position is persisted while output flows.
_CHECKPOINT_S = 1.0
#: Re-attach: how long the live stream must be quiet after the pause (and at least, and at
#: most, how long to wait for it) before the engine's log is read.
_QUIET_S = 0.05
_SETTLE_MIN_S = 0.1
_SETTLE_MAX_S = 2.0
#: Re-attach: the longest log tail (in messages) and the most bytes read after the bulk
#: read, with the container paused, before falling back to reading the whole log.
_TAIL_MAX = 1 << 16
_AFTER_MAX = 64 << 20


class _Bulk:
    """What a re-attach read from the engine's log before pausing the container."""

    def __init__(self, skip: dict[int, int]) -> None:
        #: File bytes not yet matched in the log, per stream (counts down while reading).
        self.skip = skip
        #: Log bytes seen, per stream.
        self.consumed = {1: 0, 2: 0}
        #: Log bytes stored in the output file.
        self.written = 0
        #: The last message's time (b"": the log was empty) and how many carried it.
        self.anchor = b""
        self.seen = 0
        #: Whether the rest can be found by time (one stream, every message stamped).
        self.anchored = True
        self.stopped = False

    def take(self, segments: list[Segment]) -> list[Segment]:
        """Account for stamped log messages; return the payloads beyond the file. At a
        message without a time, stop (``stopped``): the rest is read another way."""
        taken: list[Segment] = []
        for kind, frame in segments:
            message = split_stamp(kind, bytes(frame))
            if message is None:
                self.anchored = False
                self.stopped = True
                break
            k, stamp, payload = message
            if k == 2:
                self.anchored = False  # two streams: their times interleave
            if stamp == self.anchor:
                self.seen += 1
            else:
                self.anchor, self.seen = stamp, 1
            self.consumed[k] += len(payload)
            taken.append((k, payload))
        return drop_known(self.skip, taken)


class CaptureState(BaseModel):
    """How far capture got; persisted so a restarted supervisor resumes without loss."""

    model_config = ConfigDict(extra="forbid")

    stdout_bytes: int = 0
    """Raw stdout bytes received from the engine (captured or dropped)."""
    stderr_bytes: int = 0
    task_bytes: int = 0
    """Command bytes written to the output file."""
    dropped: int = 0
    """Bytes dropped after the output cap."""
    file_size: int = 0
    """Output file size at this checkpoint (command bytes plus any sbx markers)."""
    monitor_ordinal: int = 0
    """Monitor tasks: lines (and pieces) counted up to ``monitor_offset``."""
    monitor_offset: int = 0
    """Monitor tasks: stream position just after the last counted line."""


class TaskRecord(BaseModel):
    """What the store keeps for one task."""

    model_config = ConfigDict(extra="forbid")

    spec: TaskSpec
    stage: str
    """intent -> created -> running -> ended."""
    policy: Policy
    """The policy as it was when the task started: a restart never re-reads a changed file."""
    stop_reason: str | None = None
    """A stop requested before the crash (re-applied after a restart)."""
    info: TaskInfo
    container_id: str | None = None
    capture: CaptureState = CaptureState()
    stdin_closed: bool = False
    """True once EOF was sent or the attaching connection was lost (a restart)."""


@dataclass
class RunnerContext:
    """Shared services a runner uses (owned by the session / supervisor)."""

    backend: Backend
    io: Executor
    emit: Callable[[BaseEvent], BaseEvent]
    persist: Callable[[str, TaskRecord], Any]
    watch: Any = None
    """The stall watcher service (or None)."""
    caught_up: Callable[[], Awaitable[None]] | None = None
    """Coroutine: returns once every event emitted so far is stored and published."""
    prepare_network: Callable[[], Any] | None = None
    check_runtime: Callable[[str], Any] | None = None
    """Coroutine raising RuntimeUnavailable when the policy's runtime cannot run containers."""
    check_image: Callable[[Any], Any] | None = None
    """Coroutine raising ImageMissing (or PolicyError for a wrong pin) before create."""
    on_done: Callable[[TaskRunner], None] | None = None
    task_events: Callable[[str, tuple[str, ...]], Any] | None = None
    """Coroutine: stored events of a task with the given types (used when re-adopting)."""
    stored_seq: Callable[[], int] | None = None
    """The highest seq of this session known to be in the store."""
    find_container: Callable[[str], Any] | None = None
    """Coroutine: the id of our container labeled with this task id, if any."""
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
        pooled: Pooled | None = None,
    ) -> None:
        self.ctx = ctx
        self._pooled = pooled
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
        self._out = self._new_output()
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
        self._attached = asyncio.Event()
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
        self._skip = {1: 0, 2: 0}
        #: Cleared while a re-attach holds the container paused (signals wait for it).
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._fixed_running_ms: int | None = None
        #: (seq, ordinal, stream offset) of monitor events not yet known to be stored.
        self._monitor_marks: deque[tuple[int, int, int]] = deque()
        self._engine_outage = False
        #: Whether the engine keeps containers running through its own restarts.
        self._live_restore = bool(ctx.extra.get("live_restore", True))
        self.error: Outcome | None = None

    def _new_output(self) -> OutputFile:
        out = OutputFile(self.output_path, self.eff.limits.output_cap_bytes, self.ctx.io)
        out.on_write = self._on_written
        return out

    def _on_written(self) -> None:
        """Output reached the file: wake readers waiting for it (wait_for, wait_output)."""
        self._output_seen.set()
        self._output_seen = asyncio.Event()

    # -- snapshots -----------------------------------------------------------------

    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def running_ms(self) -> int:
        if self._fixed_running_ms is not None:
            return self._fixed_running_ms
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
            gap_bytes=self._out.gap_bytes,
            stalled=self.stalled,
        )

    def record(self, stage: str) -> TaskRecord:
        self.capture.task_bytes = self._out.task_bytes
        self.capture.dropped = self._out.dropped
        self.capture.file_size = self._out.file_size
        if self._chunker is not None and self.ctx.stored_seq is not None:
            # Resume point: the last monitor event that is durably stored, so a restart
            # re-counts from there and re-sends exactly what never reached the store.
            stored = self.ctx.stored_seq()
            marks = self._monitor_marks
            while marks and marks[0][0] <= stored:
                _, self.capture.monitor_ordinal, self.capture.monitor_offset = marks.popleft()
        return TaskRecord(
            spec=self.spec,
            stage=stage,
            policy=self.eff.policy,
            stop_reason=self.lc.stop_reason,
            info=self.info(),
            container_id=self.container_id,
            capture=self.capture.model_copy(),
            stdin_closed=not self._stdin_open,
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
        if self._pooled is not None:
            await self._run_pooled(self._pooled)
            return
        try:
            if self.ctx.check_runtime is not None:
                await self.ctx.check_runtime(self.eff.policy.runtime)
            if self.ctx.check_image is not None:
                await self.ctx.check_image(self.eff.policy)
            if self.ctx.prepare_network is not None:
                await self.ctx.prepare_network()
            crash_point("before_create")
            self.container_id = await self.ctx.backend.create(self.request)
            crash_point("after_create")
            await self._persist("created")
            self._stream = await self.ctx.backend.attach(
                self.container_id, stdin=self._stdin_open, logs=False
            )
            self._attached.set()
            if self.lc.stop_reason is not None:
                await self._finish_unstarted()
                return
            await self.ctx.backend.start(self.container_id)
            crash_point("after_start")
        except SupervisorError as exc:
            await self._finish_failed(exc)
            return
        await self._after_start()

    async def _run_pooled(self, pooled: Pooled) -> None:
        """A warm container: already started and attached, waiting for its command."""
        self._pooled = None
        self.container_id = pooled.container_id
        if self.lc.stop_reason is not None:
            self._stream = pooled.stream
            await self._finish_unstarted()
            return
        await self._persist("created")
        try:
            await pooled.stream.write(pooled.payload(self.spec.command))
            if self.eff.stdin == "closed":
                self._stdin_open = False
                await pooled.stream.close_stdin()
            # Only now may input flow: it must follow the command line on the same pipe.
            self._stream = pooled.stream
            self._attached.set()
        except (OSError, ConnectionError) as exc:
            self._stream = pooled.stream  # closed with the task
            await self._finish_failed(
                SupervisorError(f"the warm container did not take the command: {exc}")
            )
            return
        await self._after_start()

    async def _after_start(self) -> None:
        self.lc.mark_started()
        self.started_at = time.time()
        self._started_mono = self._loop_time()
        self._last_output_mono = self._started_mono
        if self.eff.timeout_ms is not None:
            self.deadline_at = self.started_at + self.eff.timeout_ms / 1000
        await self._persist("running")
        self._emit_started()
        self._arm_watchers()
        if self.lc.stop_reason is not None:  # stop raced the start
            self._begin_kill()
        await self._supervise()

    def _emit_started(self) -> None:
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

    def _arm_watchers(self) -> None:
        loop = asyncio.get_running_loop()
        if self.deadline_at is not None:
            # Re-armed from the persisted wall-clock deadline after a restart, never restarted.
            remaining = max(0.0, self.deadline_at - time.time())
            self._timers.append(loop.call_later(remaining, self.request_stop, "timeout"))
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
        """Capture until the output ends, then collect the exit. Engine outages are ridden
        out: when the stream breaks while the container lives, capture re-attaches and
        skips what it already has; output produced meanwhile comes from the engine's log."""
        assert self.container_id is not None
        capture = asyncio.create_task(self._capture_all(), name=f"capture-{self.task_id}")
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
        if state is not None and self._engine_outage:
            # The stream may have missed the end: catch up from the engine's log.
            with contextlib.suppress(SupervisorError):
                await self._catch_up()
        crash_point("after_exit")
        if state is None:
            await self._finish_lost("the container disappeared")
            return
        if self._engine_outage and not self._live_restore and self.lc.stop_reason is None:
            await self._finish_lost(
                f"the engine restarted without live-restore and stopped the container "
                f"(exit code {state.exit_code})"
            )
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
                if not self._engine_outage:
                    self.log.warning("engine_unavailable_while_waiting", error=str(exc))
                self._engine_outage = True
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

    async def _capture_all(self) -> None:
        """Read the attached stream; after it ends early (engine lost, connection dropped),
        re-attach with the engine's log replay and skip what is already captured."""
        empty_reattaches = 0
        while True:
            before = self.capture.stdout_bytes + self.capture.stderr_bytes
            if self._stream is not None:
                await self._capture()
                await self._stream.aclose()
                self._stream = None
                self._stdin_open = False
            if self._exited.is_set():
                return
            got = self.capture.stdout_bytes + self.capture.stderr_bytes - before
            empty_reattaches = empty_reattaches + 1 if got == 0 else 0
            state = await self._inspect_patiently()
            if state is None or not state.running or self._exited.is_set():
                return
            if empty_reattaches >= 2:
                # The command closed its stdout and stderr but keeps running: nothing more
                # will come; its exit is still collected.
                return
            self.log.info("capture_reattach")
            try:
                self._stream = await self._reattach()
            except SupervisorError as exc:
                self.log.warning("reattach_failed", error=str(exc))
                self._engine_outage = True
                await asyncio.sleep(0.5)

    async def _inspect_patiently(self) -> ContainerState | None:
        assert self.container_id is not None
        delay = 0.2
        while not self._exited.is_set():
            try:
                return await self.ctx.backend.inspect(self.container_id)
            except EngineUnavailable:
                self._engine_outage = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        return None

    async def _attach_replay(self) -> AttachedStream:
        """Attach with the engine's log replayed first; set how much of it to skip."""
        assert self.container_id is not None
        await self._set_replay_skip()
        return await self.ctx.backend.attach(self.container_id, stdin=False, logs=True)

    async def _reattach(self) -> AttachedStream:
        """Attach again to a container that may still be running, losing and repeating
        nothing.

        Attaching with the log replayed first has a window: the engine replays its log,
        then subscribes to live output, and a line printed in between reaches neither. So
        attach live first, pause the container, let what is in flight arrive, store the part
        of the log from before the live stream began, thaw, and go on with the live stream.
        Where the live stream begins in the log follows from the engine's line-by-line log
        copier (supervisor/resync.py) and is checked against the log's last messages.
        """
        assert self.container_id is not None
        cid = self.container_id
        backend = self.ctx.backend
        state = await backend.inspect(cid)
        if state is not None and state.status == "paused":
            # A re-attach cut short by a supervisor crash left it paused.
            self.log.warning("reattach_unpausing")
            await backend.unpause(cid)
        elif state is None or not state.running:
            # Stopped: its log is complete, so a replay holds everything.
            return await self._attach_replay()
        await self._set_replay_skip()
        skip, self._skip = self._skip, {1: 0, 2: 0}
        # What the log holds already is stored while the command runs; only what it adds
        # from here on is read with the container paused.
        bulk = await self._store_log_bulk(skip)
        live = await backend.attach(cid, stdin=False, logs=False)
        held: list[Segment] = []
        try:
            self._thawed.clear()
            try:
                try:
                    await backend.pause(cid)
                except EngineError as exc:
                    # It stopped meanwhile (then a replay is exact) or cannot be paused.
                    self.log.info("reattach_without_pause", error=str(exc))
                    await live.aclose()
                    return await self._attach_replay()
                paused_at = asyncio.get_running_loop().time()
                try:
                    held, ended = await self._settle(live)
                    from_log = await self._store_log_before(held, bulk, ended=ended)
                finally:
                    await asyncio.shield(self._thaw(cid))
                self.log.info(
                    "reattached",
                    from_log=bulk.written + from_log,
                    live_bytes=sum(len(p) for _, p in held),
                    paused_ms=round((asyncio.get_running_loop().time() - paused_at) * 1000),
                )
            finally:
                self._thawed.set()
        except BaseException:
            await live.aclose()
            raise
        if held:
            await self._consume(held)
        return live

    async def _thaw(self, cid: str) -> None:
        delay = 0.1
        for _ in range(8):
            try:
                await self.ctx.backend.unpause(cid)
                return
            except SupervisorError as exc:
                self.log.warning("reattach_unpause_failed", error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        # Left paused: the next re-attach (the stream ends when the engine goes away) or
        # re-adoption finds it paused and thaws it first.

    async def _settle(self, live: AttachedStream) -> tuple[list[Segment], bool]:
        """After the pause: collect the live output still in flight until it goes quiet.
        Returns it and whether the stream ended (the container stopped)."""
        loop = asyncio.get_running_loop()
        held: list[Segment] = []
        began = loop.time()
        while loop.time() - began < _SETTLE_MAX_S:
            try:
                segments = await asyncio.wait_for(live.read(), _QUIET_S)
            except TimeoutError:
                if loop.time() - began >= _SETTLE_MIN_S:
                    break
                continue
            if segments is None:
                return held, True
            held.extend((kind, bytes(payload)) for kind, payload in segments)
        return held, False

    async def _store_log_bulk(self, skip: dict[int, int]) -> _Bulk:
        """Before the pause: store what the engine's log holds beyond the file (``skip``:
        what the file holds, in log bytes) and note the last message's time as an anchor."""
        assert self.container_id is not None
        bulk = _Bulk(skip)
        async for segments in self.ctx.backend.logs(self.container_id, timestamps=True):
            out = bulk.take(segments)
            if out:
                bulk.written += sum(len(p) for _, p in out)
                await self._consume(out)
            if bulk.stopped:
                # Not stamped as expected: what was taken is stored; the rest is read
                # with the container paused.
                self.log.warning("reattach_unstamped_log")
                break
        return bulk

    async def _stamped_tail(self, messages: int) -> list[Message] | None:
        """The log's last ``messages`` messages with their times (None: unstamped, or
        more than the bytes a paused read may hold)."""
        assert self.container_id is not None
        out: list[Message] = []
        size = 0
        async for segments in self.ctx.backend.logs(
            self.container_id, tail=messages, timestamps=True
        ):
            for kind, frame in segments:
                message = split_stamp(kind, bytes(frame))
                if message is None or size > _AFTER_MAX:
                    return None
                size += len(message[2])
                out.append(message)
        return out

    async def _log_after(self, bulk: _Bulk, messages: int) -> list[Message] | None:
        """With the container paused: the messages the log gained after the bulk read, once
        two reads agree (the copier may still be writing what it held before the pause).
        None when that cannot be told from the messages' times."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _SETTLE_MAX_S
        previous: list[Message] | None = None
        tail = max(messages, 64)
        while True:
            stamped = await self._stamped_tail(tail)
            if stamped is None or any(k == 2 for k, _, _ in stamped):
                return None
            if any(a[1] > b[1] for a, b in itertools.pairwise(stamped)):
                return None  # the engine's clock went back: times cannot place the rest
            whole = len(stamped) < tail
            after = after_anchor(stamped, bulk.anchor, bulk.seen, whole_log=whole)
            if after is None:
                if whole or tail >= _TAIL_MAX:
                    return None
                tail *= 4
                previous = None
                continue
            if sum(len(p) for _, _, p in after) > _AFTER_MAX:
                return None
            if stamped == previous or loop.time() > give_up:
                return after
            previous = stamped
            await asyncio.sleep(_QUIET_S)

    async def _log_tail(self, messages: int, *, timestamps: bool) -> dict[int, bytes]:
        assert self.container_id is not None
        parts: dict[int, list[bytes]] = {1: [], 2: []}
        async for segments in self.ctx.backend.logs(
            self.container_id, tail=messages, timestamps=timestamps
        ):
            for kind, payload in segments:
                parts[2 if kind == 2 else 1].append(bytes(payload))
        return {k: b"".join(v) for k, v in parts.items()}

    def _live_cut(
        self, live: dict[int, bytes], tails: dict[int, bytes], *, ended: bool
    ) -> dict[int, int]:
        """How many bytes at the end of each stream's log the live bytes already hold."""
        cut: dict[int, int] = {}
        for k, data in live.items():
            logged = len(data) if ended else logged_prefix_by_lines(data)
            if logged is None:
                logged = overlap(tails[k], data)
            expected = engine_log_bytes(data[:logged])
            if not tails[k].endswith(expected):
                self.log.warning(
                    "reattach_unverified", stream=k, live_bytes=len(data), in_log=logged
                )
            cut[k] = len(expected)
        return cut

    async def _store_log_before(self, held: list[Segment], bulk: _Bulk, *, ended: bool) -> int:
        """With the container paused: write the engine's log from where the bulk read (or
        the file) ends up to where the live bytes ``held`` begin. Returns how many bytes
        that was."""
        assert self.container_id is not None
        crash_point("reattach_paused")
        live = {
            k: b"".join(bytes(p) for kind, p in held if (2 if kind == 2 else 1) == k)
            for k in (1, 2)
        }
        messages = sum(d.count(b"\n") + len(d) // COPIER_CHUNK + 2 for d in live.values())
        after = await self._log_after(bulk, messages) if bulk.anchored else None
        if after is not None:
            rest = b"".join(p for _, _, p in after)
            cut = self._live_cut(live, {1: rest, 2: b""}, ended=ended)
            rest = rest[bulk.skip[1] : len(rest) - cut[1]]
            if rest:
                await self._consume([(1, rest)])
            return len(rest)
        self.log.info("reattach_reads_whole_log")
        return await self._store_whole_log(live, bulk, messages, ended=ended)

    async def _store_whole_log(
        self, live: dict[int, bytes], bulk: _Bulk, messages: int, *, ended: bool
    ) -> int:
        """The fallback: read the whole log with the container paused."""
        assert self.container_id is not None
        loop = asyncio.get_running_loop()
        # Wait until two reads of the log's last messages (each stamped with its time) agree.
        previous: dict[int, bytes] | None = None
        give_up = loop.time() + _SETTLE_MAX_S
        while True:
            stamped = await self._log_tail(messages, timestamps=True)
            if stamped == previous or loop.time() > give_up:
                break
            previous = stamped
            await asyncio.sleep(_QUIET_S)
        cut = self._live_cut(live, await self._log_tail(messages, timestamps=False), ended=ended)
        # The log minus what the file and the bulk read hold (skip) and minus what the
        # live bytes hold (cut).
        skip = {k: bulk.consumed[k] + bulk.skip[k] for k in (1, 2)}
        pending = {1: bytearray(), 2: bytearray()}
        written = 0
        async for segments in self.ctx.backend.logs(self.container_id):
            out: list[Segment] = []
            for kind, data in drop_known(skip, segments):
                buf = pending[2 if kind == 2 else 1]
                buf += data
                excess = len(buf) - cut[2 if kind == 2 else 1]
                if excess > 0:
                    out.append((kind, bytes(buf[:excess])))
                    del buf[:excess]
            if out:
                written += sum(len(p) for _, p in out)
                await self._consume(out)
        return written

    async def _set_replay_skip(self) -> None:
        """Everything already received: the file's command bytes as the engine's log stores
        them (invalid UTF-8 comes back as U+FFFD) plus what the cap dropped."""
        loop = asyncio.get_running_loop()
        await self._out.flush()  # measure the file, not what is still queued for it
        captured = await loop.run_in_executor(
            self.ctx.io, replayed_length, self.output_path, 0, self._out.task_bytes
        )
        lost = self._out.dropped + self._out.gap_bytes
        # The file holds both streams; the engine keeps them apart.
        stdout = max(0, captured - self.capture.stderr_bytes)
        self._skip = {1: stdout + lost, 2: self.capture.stderr_bytes}

    async def _catch_up(self) -> None:
        """After an outage and the container's exit: fetch output the stream missed."""
        if self.container_id is None:
            return
        stream = await self._attach_replay()
        self._stream = stream
        try:
            await asyncio.wait_for(self._capture(), _DRAIN_S)
        except TimeoutError:
            self.log.warning("catch_up_timeout")
        finally:
            await stream.aclose()
            self._stream = None

    async def _capture(self) -> None:
        stream = self._stream
        if stream is None:
            return
        while True:
            segments = await stream.read()
            if segments is None:
                break
            if self._skip[1] or self._skip[2]:
                segments = drop_known(self._skip, segments)
                if not segments:
                    continue
            await self._consume(segments)

    async def _consume(self, segments: list[Segment]) -> None:
        """Account for and store one batch of the command's output."""
        parts = []
        size = err = 0
        for kind, payload in segments:
            if kind == 2:
                err += len(payload)
            size += len(payload)
            parts.append(payload)
        # One model update per read (pydantic attribute writes are not free).
        capture = self.capture
        if err:
            capture.stderr_bytes += err
        capture.stdout_bytes += size - err
        # Views into the engine's stream, written with one writev: no per-line work and
        # no copies on the background path.
        await self._out.append_parts(parts)
        crash_point("mid_stream", size)
        now = asyncio.get_running_loop().time()
        self._last_output_mono = now
        if self._chunker is not None:
            self._emit_monitor(self._chunker.feed(b"".join(parts), now))
            self._schedule_monitor_flush()
        if now - self._last_checkpoint >= _CHECKPOINT_S:
            self._last_checkpoint = now
            self._aux.append(asyncio.create_task(self._persist("running")))
            self._aux = [t for t in self._aux if not t.done()]

    # -- monitor batching ----------------------------------------------------------

    def _emit_monitor(self, events: list[BaseEvent]) -> None:
        assert self._chunker is not None
        for ev in events:
            logged = self.ctx.emit(ev)
            self._monitor_marks.append((logged.seq, *self._chunker.marks.popleft()))

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
        self._aux.append(asyncio.create_task(self._persist(self._stage())))
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
        await self._thawed.wait()  # a paused container cannot take signals on every runtime
        with contextlib.suppress(SupervisorError):
            await self.ctx.backend.kill(cid, "SIGTERM")
        try:
            await asyncio.wait_for(self._exited.wait(), self.eff.grace_s)
            return
        except TimeoutError:
            pass
        while not self._exited.is_set():
            await self._thawed.wait()
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

    async def abandon(self, detail: str) -> None:
        """Give the task its terminal event now (``lost``) without waiting for the engine;
        keep trying to kill and remove the container in the background."""
        outcome = self.lc.finish_lost(detail)
        if outcome is not None:
            await self._conclude(outcome, detail=detail, remove=False)
        self._done.set()
        if self.container_id is not None:
            self._aux.append(asyncio.create_task(self._reap_when_back()))

    async def _reap_when_back(self) -> None:
        cid = self.container_id
        assert cid is not None
        delay = 1.0
        while True:
            try:
                await self.ctx.backend.kill(cid, "SIGKILL")
                await self.ctx.backend.remove(cid)
                self.log.info("abandoned_container_removed")
                return
            except SupervisorError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _conclude(
        self, outcome: Outcome, detail: str | None = None, *, remove: bool = True
    ) -> None:
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
        if self.ctx.caught_up is not None:
            # wait() and stop() return only once the terminal event can be read from the
            # session's log (a reader right after wait() must find it).
            await asyncio.shield(self.ctx.caught_up())
        self._final.set()
        await self._persist("ended")
        if remove:
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
        for task in self._aux:
            task.cancel()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.aclose()
        with contextlib.suppress(Exception):
            await self._out.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._persist(self._stage()))

    # -- re-adoption after a restart ------------------------------------------------

    def _stage(self) -> str:
        if self.lc.ended:
            return "ended"
        if self.lc.started:
            return "running"
        return "created" if self.container_id else "intent"

    @classmethod
    def from_record(
        cls,
        ctx: RunnerContext,
        record: TaskRecord,
        *,
        eff: Effective,
        request: ContainerRequest,
        output_path: Path,
    ) -> TaskRunner:
        """Rebuild a runner from the store. Ended tasks come back final (readable, listable);
        others are picked up by ``resume()``."""
        info = record.info
        r = cls(
            ctx,
            task_id=info.task_id,
            session_id=info.session_id,
            spec=record.spec,
            eff=eff,
            request=request,
            output_path=output_path,
        )
        r.created_at = info.created_at
        r.started_at = info.started_at
        r.deadline_at = info.deadline_at
        r.container_id = record.container_id
        r.capture = record.capture.model_copy()
        r._out.task_bytes = record.capture.task_bytes
        r._out.dropped = record.capture.dropped
        r._out.file_size = record.capture.file_size
        if record.stop_reason is not None:
            r.lc.stop_reason = record.stop_reason  # type: ignore[assignment]
        if record.stage == "ended" and info.ended:
            r.lc.started = info.started_at is not None
            r.lc.outcome = Outcome(
                info.status, info.reason, info.exit_code, info.error_code, info.error
            )
            r.ended_at = info.ended_at
            r._fixed_running_ms = info.running_ms
            r._final.set()
            r._done.set()
            r._exited.set()
        return r

    async def resume(self, stage: str) -> None:
        """Main coroutine of a re-adopted task (replaces ``run``)."""
        try:
            await self._resume(stage)
        except asyncio.CancelledError:
            await self._release()
            raise
        except Exception as exc:
            self.log.exception("resume_crashed")
            await self._finish_lost(f"supervisor error while re-adopting: {exc!r}")

    async def _resume(self, stage: str) -> None:
        loop = asyncio.get_running_loop()
        # The file is the truth about what was written before the crash.
        size = await loop.run_in_executor(self.ctx.io, _file_size, self.output_path)
        growth = max(0, size - self.capture.file_size)
        await self._out.open(task_bytes=self._out.task_bytes)
        if not self._out.dropped:
            self._out.task_bytes += growth
            self.capture.stdout_bytes += growth
        self._out.file_size = size
        if await self._terminal_already_logged():
            return
        if self.container_id is None and self.ctx.find_container is not None:
            self.container_id = await self.ctx.find_container(self.task_id)
        if self.container_id is None:
            # Crashed before the container existed: run the task now, as accepted.
            self.log.info("readopt_create")
            await self._out.close()
            self._out = self._new_output()
            await self._run()
            return
        state = await self._inspect_patiently()
        if state is None:
            if self.lc.started or stage == "running":
                self.lc.mark_started()
                await self._finish_lost("the container disappeared while the supervisor was down")
            else:
                await self._finish_failed(
                    SupervisorError("the container disappeared before it started")
                )
            return
        if state.status == "created":
            self.log.info("readopt_start")
            await self._start_created()
            return
        # It ran: pick up its output where the file ends.
        self.lc.mark_started()
        self._stdin_open = False  # the engine closed it when our connection dropped
        if self.started_at is None:
            self.started_at = _parse_engine_time(state.started_at) or time.time()
        self._started_mono = loop.time() - max(0.0, time.time() - self.started_at)
        self._last_output_mono = loop.time()
        if self.deadline_at is None and self.eff.timeout_ms is not None:
            self.deadline_at = self.started_at + self.eff.timeout_ms / 1000
        if not await self._has_event("task.started"):
            self._emit_started()
        await self._resume_monitor()
        self._stream = await self._reattach()
        self.log.info("readopted", running=state.running, skip=self._skip[1])
        await self._persist("running")
        if state.running:
            self._arm_watchers()
            if self.lc.stop_reason is not None:
                self._begin_kill()
        await self._supervise()

    async def _start_created(self) -> None:
        """A container created but never started before the crash: attach and start it."""
        assert self.container_id is not None
        try:
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
        await self._after_start()

    async def _has_event(self, kind: str) -> bool:
        if self.ctx.task_events is None:
            return False
        return bool(await self.ctx.task_events(self.task_id, (kind,)))

    async def _terminal_already_logged(self) -> bool:
        """Crashed after the terminal event was stored: finish quietly (no second event)."""
        if self.ctx.task_events is None:
            return False
        events = await self.ctx.task_events(self.task_id, ("task.stopped", "task.failed"))
        if not events:
            return False
        ev = events[-1]
        if ev.type == "task.stopped":
            self.lc.mark_started()
            self.lc.outcome = Outcome(
                status_for(ev.reason, ev.exit_code), ev.reason, ev.exit_code, None, ev.detail
            )
            self._fixed_running_ms = ev.running_ms
        else:
            self.lc.outcome = Outcome("failed", None, None, ev.error_code, ev.message)
        self.ended_at = ev.ts
        await self._out.close()
        self._final.set()
        await self._persist("ended")
        await asyncio.shield(self._remove())
        self._done.set()
        return True

    async def _resume_monitor(self) -> None:
        """Continue ordinals exactly; re-send lines captured but not delivered before the
        crash (consumers de-duplicate by ordinal anyway)."""
        if self._chunker is None or self.ctx.task_events is None:
            return
        delivered = 0
        for ev in await self.ctx.task_events(
            self.task_id, ("task.output", "task.output_suppressed")
        ):
            delivered = max(delivered, getattr(ev, "ordinal", 0), getattr(ev, "last_ordinal", 0))
        cap = self.capture
        self._chunker.resume(
            ordinal=cap.monitor_ordinal, offset=cap.monitor_offset, floor=delivered
        )
        if self._out.dropped:
            return  # the file no longer mirrors the stream past the cap
        loop = asyncio.get_running_loop()
        pending = await loop.run_in_executor(
            self.ctx.io, read_range, self.output_path, cap.monitor_offset, self._out.task_bytes
        )
        if pending:
            self._emit_monitor(self._chunker.feed(pending, loop.time()))

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
        if self._stdin_open and self._stream is None and not self.lc.started:
            # Still starting: the engine attaches stdin before the command runs; wait for it
            # (what is written then is read by the command from its first read on).
            await self._wait_attached(30.0)
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

    async def _wait_attached(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._stream is None and not self.lc.ended and loop.time() < deadline:
            waiters = [
                asyncio.ensure_future(self._attached.wait()),
                asyncio.ensure_future(self._final.wait()),
            ]
            try:
                await asyncio.wait(
                    waiters, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for w in waiters:
                    w.cancel()
        if self._stream is None and not self.lc.ended:
            raise StdinClosed(
                f"task {self.task_id} is still starting after {timeout_s:.0f} s; try again"
            )

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


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _parse_engine_time(value: str | None) -> float | None:
    """Engine timestamps (RFC 3339 with nanoseconds) as epoch seconds."""
    if not value or value.startswith("0001-"):
        return None
    from datetime import datetime  # noqa: PLC0415

    text = value.rstrip("Z")
    main, _, frac = text.partition(".")
    try:
        stamp = datetime.fromisoformat(main + "+00:00").timestamp()
    except ValueError:
        return None
    return stamp + (float("0." + frac[:6]) if frac else 0.0)


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as fh:
            if offset >= os.fstat(fh.fileno()).st_size:
                return b""  # (and never seek absurdly far: some filesystems refuse)
            fh.seek(offset)
            return fh.read(8 << 20)
    except FileNotFoundError:
        return b""
