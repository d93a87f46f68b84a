"""One fake container: its script running as an asyncio task, stdin, the attach streams, and
the json-file log its output goes through (the engine's line-by-line log copier)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from supervisor.core.container import ContainerRequest, ContainerState, Segment
from supervisor.core.demux import STDERR, STDOUT
from supervisor.core.models import POOL_NO_COMMAND
from supervisor.core.resync import COPIER_CHUNK, engine_log_bytes
from supervisor.engine.fake.script import (
    Clock,
    ExecFromStdin,
    Exit,
    Out,
    ReadEOF,
    ReadLine,
    Script,
    Sleep,
    Step,
    UntilKilled,
    WaitFor,
)

#: What the engine reports for a time that has not happened (StartedAt of a created one).
ZERO_TIME = "0001-01-01T00:00:00Z"
#: Exit codes of a shell killed by a signal (128 + the signal's number).
SIGNAL_EXIT = {"SIGTERM": 143, "SIGKILL": 137}


def rfc3339_ns(ns: int) -> str:
    """The engine's fixed-width log time: RFC 3339, UTC, nine fraction digits."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


#: An ``export NAME='value'`` line the runtime puts before a pooled command.
_EXPORT = re.compile(r"export ([A-Za-z_][A-Za-z0-9_]*)='((?:[^']|'\"'\"')*)'\n")


class Changes:
    """Wakes every waiter whenever anything in the fake engine changes; waiters re-check
    their own condition (a broadcast, so no state change can be missed)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def until(self, ready: Callable[[], object]) -> None:
        while not ready():
            await self._event.wait()


class LogMessage(NamedTuple):
    """One message of the json-file log, as ``logs()`` gives it back."""

    stream: int
    time_ns: int
    data: bytes
    """The payload as stored: invalid UTF-8 replaced, a newline only at a line's end."""


class Copier:
    """The engine's log copier for one stream (moby daemon/logger/copier.go): whole lines,
    and the first 16 KiB (``COPIER_CHUNK``) of a line still too long, as a piece without
    newline; what is left of an unfinished line waits for its newline or the stream's end.
    The pieces of one line share the first piece's time."""

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.held = bytearray()
        self._line_ns: int | None = None

    def feed(self, data: bytes, now_ns: int) -> list[LogMessage]:
        self.held += data
        out: list[LogMessage] = []
        while True:
            # The copier's 16 KiB buffer: a newline counts only if it lies within it.
            end = self.held.find(b"\n", 0, COPIER_CHUNK)
            if end >= 0:
                out.append(self._message(end, now_ns, newline=True))
            elif len(self.held) >= COPIER_CHUNK:
                out.append(self._message(COPIER_CHUNK, now_ns, newline=False))
            else:
                return out

    def flush(self, now_ns: int) -> list[LogMessage]:
        """The stream ended (the container exited): log the unfinished line as it is."""
        out = [self._message(len(self.held), now_ns, newline=False)] if self.held else []
        self._line_ns = None
        return out

    def _message(self, size: int, now_ns: int, *, newline: bool) -> LogMessage:
        stamp = now_ns if self._line_ns is None else self._line_ns
        data = engine_log_bytes(bytes(self.held[:size])) + (b"\n" if newline else b"")
        del self.held[: size + (1 if newline else 0)]
        self._line_ns = None if newline else stamp
        return LogMessage(self.stream, stamp, data)


class FakeAttach:
    """An attach stream to a fake container (the AttachedStream Protocol)."""

    def __init__(self, container: FakeContainer, *, stdin: bool) -> None:
        self._container = container
        self._stdin_open = stdin
        self._segments: list[Segment] = []
        self._ended = False
        self._closed = False

    def push(self, stream: int, data: bytes) -> None:
        self._segments.append((stream, data))

    def end(self, *, lose_unread: bool = False) -> None:
        """The engine ended the stream (exit, dropped connection, engine gone)."""
        self._ended = True
        if lose_unread:
            self._segments.clear()
        self._release_stdin()

    def _release_stdin(self) -> None:
        # StdinOnce: when the attach holding stdin goes, the command gets EOF.
        if self._stdin_open:
            self._stdin_open = False
            self._container.close_stdin()

    async def read(self) -> list[Segment] | None:
        await self._container.changes.until(lambda: self._segments or self._ended or self._closed)
        if not self._segments:
            return None
        segments, self._segments = self._segments, []
        return segments

    async def write(self, data: bytes) -> None:
        if not self._stdin_open or self._closed or self._ended:
            raise BrokenPipeError("stdin is closed")
        self._container.feed_stdin(data)

    async def close_stdin(self) -> None:
        if not self._closed:
            self._release_stdin()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._release_stdin()
        self._container.detach(self)

    def is_open(self) -> bool:
        return not (self._closed or self._ended)


class FakeContainer:
    """A container of the fake engine; the attributes are there for tests to read."""

    def __init__(
        self,
        container_id: str,
        request: ContainerRequest,
        script: Script,
        *,
        clock: Clock,
        changes: Changes,
        choose: Callable[[str], Script],
    ) -> None:
        self.id = container_id
        self.request = request
        self.script = script
        self.clock = clock
        self.changes = changes
        self._choose = choose
        self.status = "created"
        self.exit_code: int | None = None
        self.oom_killed = False
        self.error: str | None = None
        self.started_ns: int | None = None
        self.finished_ns: int | None = None
        self.removed = False
        self.vanished = False
        #: Set by FakeEngine.lose: its node is gone (reported as status "lost", this error).
        self.lost: str | None = None
        self.cpu_ns = 0
        #: What a warm container was told to export before its command (the task's env).
        self.exported: dict[str, str] = {}
        #: Everything written to stdout/stderr, exactly, in order.
        self.output: list[Segment] = []
        #: The json-file log (what ``logs()`` and an attach with ``logs=True`` give back).
        self.log: list[LogMessage] = []
        #: Everything the command received on stdin, and whether it got EOF.
        self.stdin = bytearray()
        self.stdin_closed = not request.stdin_open
        #: Signals delivered to PID 1, in order (a refused one is not delivered).
        self.signals: list[str] = []
        self.queued_signals: list[str] = []
        #: The step the script is at (None before the start).
        self.at: Step | None = None
        self._unread = bytearray()
        self._streams: list[FakeAttach] = []
        self._copiers = {STDOUT: Copier(STDOUT), STDERR: Copier(STDERR)}
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def gone(self) -> bool:
        return self.removed or self.vanished

    @property
    def running(self) -> bool:
        return self.status in ("running", "paused")

    def state(self) -> ContainerState:
        return ContainerState(
            id=self.id,
            status="lost" if self.lost is not None else self.status,
            running=self.running and self.lost is None,
            exit_code=self.exit_code if self.status == "exited" else None,
            oom_killed=self.oom_killed,
            error=self.lost if self.lost is not None else self.error,
            started_at=ZERO_TIME if self.started_ns is None else rfc3339_ns(self.started_ns),
            finished_at=ZERO_TIME if self.finished_ns is None else rfc3339_ns(self.finished_ns),
            labels=dict(self.request.labels),
            runtime=self.request.runtime,
        )

    def written(self) -> bytes:
        """Everything written to stdout and stderr, in order (the task's merged output)."""
        return b"".join(bytes(data) for _, data in self.output)

    # -- engine side ---------------------------------------------------------------------

    def start(self) -> None:
        self.status = "running"
        self.started_ns = self.clock.now_ns()
        self._task = asyncio.create_task(self._run(), name=f"fake-{self.name}")
        self.changes.notify()

    def attach(self, *, stdin: bool, logs: bool) -> FakeAttach:
        stream = FakeAttach(self, stdin=stdin)
        if logs:
            for message in self.log:
                stream.push(message.stream, message.data)
        if self.running or self.status == "created":
            self._streams.append(stream)
        else:
            stream.end()  # a stopped container: the replay, then the end
        return stream

    def detach(self, stream: FakeAttach) -> None:
        if stream in self._streams:
            self._streams.remove(stream)
        self.changes.notify()

    def drop_streams(self, *, lose_unread: bool = False) -> None:
        streams, self._streams = self._streams, []
        for stream in streams:
            stream.end(lose_unread=lose_unread)
        self.changes.notify()

    def deliver(self, signal: str) -> None:
        self.signals.append(signal)
        if signal == "SIGTERM" and self.script.ignore_sigterm:
            return
        self.finish(SIGNAL_EXIT.get(signal, 128))

    def finish(self, code: int, *, oom_killed: bool = False) -> None:
        """PID 1 exits: the log gets what the copiers held, the streams end."""
        if not self.running:
            return
        self.status = "exited"
        self.exit_code = code
        self.oom_killed = oom_killed
        self.finished_ns = now = self.clock.now_ns()
        for copier in self._copiers.values():
            self.log.extend(copier.flush(now))
        self.drop_streams()
        self.close_stdin()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self.changes.notify()

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop the script's task without an exit (test teardown, a vanished container)."""
        if self._task is not None:
            self._task.cancel()
        return self._task

    # -- command side --------------------------------------------------------------------

    def emit(self, stream: int, data: bytes) -> None:
        if not data:
            return
        self.output.append((stream, data))
        for attached in self._streams:
            attached.push(stream, data)
        self.log.extend(self._copiers[stream].feed(data, self.clock.now_ns()))
        self.changes.notify()

    def feed_stdin(self, data: bytes) -> None:
        if self.stdin_closed or not data:
            return  # the engine drops input to a closed stdin
        self.stdin += data
        self._unread += data
        self.changes.notify()

    def close_stdin(self) -> None:
        if not self.stdin_closed:
            self.stdin_closed = True
            self.changes.notify()

    async def _thawed(self) -> None:
        await self.changes.until(lambda: self.status != "paused")

    async def _read_line(self) -> bytes:
        await self.changes.until(lambda: b"\n" in self._unread or self.stdin_closed)
        end = self._unread.find(b"\n") + 1 or len(self._unread)
        line = bytes(self._unread[:end])
        del self._unread[:end]
        return line

    async def _run(self) -> None:
        try:
            await self._steps(self.script.steps)
        except Exception as exc:  # noqa: BLE001 - a broken script ends it where tests look
            self.error = f"fake script failed: {exc!r}"
            self.finish(255)
            return
        self.finish(0)

    async def _steps(self, steps: Sequence[Step]) -> None:
        for step in steps:
            await self._thawed()
            # Tests wait for this (the step's own wait, e.g. a FakeClock sleep, is registered
            # before they wake).
            self.at = step
            self.changes.notify()
            if isinstance(step, Out):
                data = step.data.encode() if isinstance(step.data, str) else step.data
                self.emit(step.stream, data)
            elif isinstance(step, ReadLine):
                line = await self._read_line()
                await self._thawed()
                if step.echo:
                    self.emit(STDOUT, line)
            elif isinstance(step, ReadEOF):
                await self._read_to_eof(echo=step.echo)
            elif isinstance(step, Sleep):
                await self.clock.sleep(step.seconds)
            elif isinstance(step, WaitFor):
                await step.event.wait()
            elif isinstance(step, UntilKilled):
                await asyncio.get_running_loop().create_future()
            elif isinstance(step, Exit):
                self.finish(step.code, oom_killed=step.oom_killed)
                return
            elif isinstance(step, ExecFromStdin):
                await self._exec_from_stdin(step.sentinel)
                return

    async def _read_to_eof(self, *, echo: bool) -> None:
        while True:
            await self.changes.until(lambda: self._unread or self.stdin_closed)
            await self._thawed()
            data, self._unread = bytes(self._unread), bytearray()
            if echo:
                self.emit(STDOUT, data)
            if self.stdin_closed and not self._unread:
                return

    async def _exec_from_stdin(self, sentinel: str) -> None:
        lines: list[bytes] = []
        while True:
            line = await self._read_line()
            if not line.endswith(b"\n"):
                self.finish(POOL_NO_COMMAND)  # EOF before the sentinel, as the pool script
                return
            if line[:-1] == sentinel.encode():
                break
            lines.append(line)
        command = b"".join(lines).decode("utf-8", "surrogateescape").removesuffix("\n")
        # The task's own environment comes first as ``export`` lines (runtime/task/launch.py,
        # pooled_command): kept as the container's environment, the rest is the command.
        while (m := _EXPORT.match(command)) is not None:
            self.exported[m.group(1)] = m.group(2).replace("'\"'\"'", "'")
            command = command[m.end() :]
        self.script = self._choose(command)
        await self._steps(self.script.steps)
