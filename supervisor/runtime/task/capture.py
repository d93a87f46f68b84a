"""Capture: the command's output from the engine's stream into the output file, counted;
and, for monitors, into line events that can be resumed exactly after a crash."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from structlog.stdlib import BoundLogger

from supervisor.core.container import Segment
from supervisor.core.events import BaseEvent
from supervisor.core.faults import crash_point
from supervisor.core.monitor import LineChunker
from supervisor.core.policy import Monitor
from supervisor.core.resync import drop_known
from supervisor.core.stats import RuntimeStats, StartPath
from supervisor.core.task_state import CaptureState, OutputCounts, ResumeMarks, TaskState
from supervisor.engine.base import AttachedStream
from supervisor.runtime.aio import first_of
from supervisor.runtime.task.ports import EventPort
from supervisor.state.output import OutputFile, replayed_length

#: How often the capture position is persisted while output flows.
CHECKPOINT_S = 1.0


class MonitorFeed:
    """Monitor tasks: stdout lines become ``task.output`` events (batched, rate-limited);
    each emitted event's resume mark is kept until the event is known to be stored."""

    def __init__(self, cfg: Monitor, session_id: str, task_id: str, events: EventPort) -> None:
        self.chunker = LineChunker(cfg, session_id, task_id)
        self.marks = ResumeMarks()
        self._events = events
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._closed = False

    def feed(self, data: bytes, now: float) -> None:
        self._emit(self.chunker.feed(data, now))
        self._schedule()

    def resume(self, *, ordinal: int, offset: int, floor: int) -> None:
        """Continue counting from a stored mark; ordinals up to ``floor`` were delivered."""
        self.chunker.resume(ordinal=ordinal, offset=offset, floor=floor)

    def advance(self, capture: CaptureState) -> None:
        """Move the stored resume point to the last event known to be stored."""
        self.marks.advance(self._events.stored_seq(), capture)

    def flush_all(self) -> None:
        """At the end: emit everything held, the partial line included."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._emit(self.chunker.flush_all())

    def _emit(self, events: list[BaseEvent]) -> None:
        for ev in events:
            logged = self._events.emit(ev)
            ordinal, offset = self.chunker.marks.popleft()
            self.marks.note(logged.seq, ordinal, offset)

    def _schedule(self) -> None:
        due = self.chunker.next_flush_at()
        if due is None or self._closed:
            return
        if self._timer is not None:
            if self._due <= due:
                return  # the pending tick comes first; it reschedules
            self._timer.cancel()
        self._due = due
        self._timer = asyncio.get_running_loop().call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        self._emit(self.chunker.tick(asyncio.get_running_loop().time()))
        self._schedule()


class Capture:
    """Owns the output file and the capture counters. ``consume`` takes one batch of the
    engine's segments; ``run`` reads a stream to its end, skipping what is already stored
    (``skip``, after a re-attach). Never blocks the loop: the file is written behind."""

    def __init__(
        self,
        state: TaskState,
        path: Path,
        cap: int,
        io: Executor,
        log: BoundLogger,
        *,
        monitor: MonitorFeed | None,
        on_checkpoint: Callable[[], None],
        stats: RuntimeStats | None = None,
    ) -> None:
        self.state = state
        self.path = path
        self.io = io
        self.log = log
        self.monitor = monitor
        self._on_checkpoint = on_checkpoint
        self._cap = cap
        self.out = self._new_output()
        #: Bytes per stream to drop from the next stream (already stored).
        self.skip = {1: 0, 2: 0}
        #: Reads that brought data, skipped ones included: a drain that still makes
        #: progress is not stuck.
        self.reads = 0
        self.last_output_mono = 0.0
        self._last_checkpoint = 0.0
        self._seen = asyncio.Event()
        self.stats = stats
        #: A fresh task's start path and acceptance time (``time.monotonic()``), until its
        #: first output is counted; None for a task re-adopted after a restart.
        self.first_byte_from: tuple[StartPath, float] | None = None

    def _new_output(self) -> OutputFile:
        out = OutputFile(self.path, self._cap, self.io)
        out.on_write = self._written
        out.task_bytes = self.state.capture.task_bytes
        out.dropped = self.state.capture.dropped
        out.file_size = self.state.capture.file_size
        return out

    def reset_output(self) -> None:
        """A fresh writer (the old one was closed), e.g. to run a re-adopted task anew."""
        self.out = self._new_output()

    # -- reading ---------------------------------------------------------------------

    def counts(self) -> OutputCounts:
        out = self.out
        return OutputCounts(out.task_bytes, out.dropped, out.gap_bytes, out.file_size)

    @property
    def received(self) -> int:
        """Bytes received from the engine so far (both streams)."""
        cap = self.state.capture
        return cap.stdout_bytes + cap.stderr_bytes

    def _written(self) -> None:
        """Output reached the file: wake readers waiting for it (wait_for, wait_output)."""
        self._seen.set()
        self._seen = asyncio.Event()

    @property
    def seen(self) -> asyncio.Event:
        """Set at the next write that lands in the file (a fresh event after each)."""
        return self._seen

    async def wait_past(self, offset: int, timeout_s: float, final: asyncio.Event) -> None:
        """Return once the file grows past ``offset``, ``final`` is set, or time runs out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.out.file_size <= offset and not final.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await first_of(self._seen.wait(), final.wait(), timeout=remaining)

    # -- writing ---------------------------------------------------------------------

    async def run(self, stream: AttachedStream) -> None:
        """Store everything the stream delivers until it ends."""
        if not self._last_checkpoint:
            # The first checkpoint a period after the start, not with the first output
            # (where it would compete with that output's write; the file is the truth).
            self._last_checkpoint = asyncio.get_running_loop().time()
        while True:
            segments = await stream.read()
            if segments is None:
                return
            self.reads += 1
            if self.skip[1] or self.skip[2]:
                segments = drop_known(self.skip, segments)
                if not segments:
                    continue
            await self.consume(segments)

    async def consume(self, segments: list[Segment]) -> None:
        """Account for and store one batch of the command's output."""
        parts = []
        size = err = 0
        for kind, payload in segments:
            if kind == 2:
                err += len(payload)
            size += len(payload)
            parts.append(payload)
        # One model update per read (pydantic attribute writes are not free).
        capture = self.state.capture
        if err:
            capture.stderr_bytes += err
        capture.stdout_bytes += size - err
        stats = self.stats
        if stats is not None:
            stats.output(size)
            if self.first_byte_from is not None and size:
                path, accepted = self.first_byte_from
                self.first_byte_from = None
                stats.first_byte(path, time.monotonic() - accepted)
        # Views into the engine's stream, written with one writev: no per-line work and
        # no copies on the background path.
        await self.out.append_parts(parts)
        crash_point("mid_stream", size)
        now = asyncio.get_running_loop().time()
        self.last_output_mono = now
        self.state.stalled = False  # new output ends a stall episode
        if self.monitor is not None:
            self.monitor.feed(b"".join(parts), now)
        if now - self._last_checkpoint >= CHECKPOINT_S:
            self._last_checkpoint = now
            self._on_checkpoint()

    async def set_replay_skip(self) -> None:
        """Everything already received, as the engine's log holds it: the file's command
        bytes (invalid UTF-8 comes back as U+FFFD) plus what the cap dropped, per stream."""
        loop = asyncio.get_running_loop()
        await self.out.flush()  # measure the file, not what is still queued for it
        captured = await loop.run_in_executor(
            self.io, replayed_length, self.path, 0, self.out.task_bytes
        )
        lost = self.out.dropped + self.out.gap_bytes
        stderr = self.state.capture.stderr_bytes
        # The file holds both streams; the engine keeps them apart.
        stdout = max(0, captured - stderr)
        self.skip = {1: stdout + lost, 2: stderr}
