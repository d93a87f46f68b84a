"""Writing to a task's stdin: bounded in size and time, in order, failed at once when the
task ends. A command that does not read its stdin cannot make a caller (or the daemon's
memory) wait forever."""

from __future__ import annotations

import asyncio
from typing import Any

from supervisor.core.errors import InputNotRead, SpecError, StdinClosed, Unsupported
from supervisor.engine.base import AttachedStream
from supervisor.runtime.aio import first_of

#: Largest input one call may send.
MAX_INPUT_BYTES = 1 << 20
#: How long a write may wait for the command to take its input.
INPUT_TIMEOUT_S = 10.0
#: How long input sent while the task starts waits for its stdin to be attached.
ATTACH_WAIT_S = 30.0


def refuse_input(
    task_id: str, *, stdin_open: bool, started_closed: bool, eof: bool, backend: str
) -> None:
    """Raise before anything is written when the task cannot take this input: its stdin is
    closed (StdinClosed), or ``eof`` is asked of a backend that cannot close a running
    task's stdin (Unsupported; the caller can resend without it)."""
    if not stdin_open:
        why = "started with stdin=closed" if started_closed else "EOF was sent"
        raise StdinClosed(f"task {task_id} has no open stdin ({why})")
    if eof:
        raise Unsupported(
            f"task {task_id}: the {backend} backend cannot give a command EOF on stdin (it "
            "never closes a running task's stdin); send the input without eof, or start "
            "the task with stdin=closed or with its input in the command (e.g. printf ... | cmd)"
        )


class StdinWriter:
    """The task's end of its stdin pipe, once attached."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.stream: AttachedStream | None = None
        self._attached = asyncio.Event()
        self._lock = asyncio.Lock()
        #: The last write, while the command has not taken all of it.
        self._undrained: asyncio.Future[None] | None = None
        self._ended = asyncio.Event()
        self._why = ""

    def attach(self, stream: AttachedStream) -> None:
        """Input may flow from now on (the command reads it from its first read on)."""
        self.stream = stream
        self._attached.set()

    async def send(self, data: bytes, *, eof: bool, timeout_s: float = INPUT_TIMEOUT_S) -> None:
        """Write ``data`` (then EOF if asked). Raises SpecError (too large), InputNotRead
        (not taken within ``timeout_s``; it stays queued), StdinClosed (no stdin, or the
        task ended meanwhile)."""
        if len(data) > MAX_INPUT_BYTES:
            raise SpecError(
                f"input: {len(data)} bytes is more than one call may send "
                f"(at most {MAX_INPUT_BYTES} bytes; send it in parts)"
            )
        if not self._attached.is_set():
            # Still starting: the engine attaches stdin before the command runs.
            await first_of(self._attached.wait(), self._ended.wait(), timeout=ATTACH_WAIT_S)
            if not self._attached.is_set() and not self._ended.is_set():
                raise StdinClosed(
                    f"task {self.task_id} is still starting after {ATTACH_WAIT_S:.0f} s; try again"
                )
        async with self._lock:
            stream = self.stream
            if stream is None or self._ended.is_set():
                raise StdinClosed(self._why or f"task {self.task_id} has no open stdin")
            if self._undrained is not None and not self._undrained.done():
                raise InputNotRead(
                    f"task {self.task_id} is not reading its stdin: the input sent before "
                    "is still waiting to be read; nothing more is accepted until it is"
                )
            if data:
                write = asyncio.ensure_future(stream.write(data))
                self._undrained = write
                await self._wait(write, timeout_s, len(data))
            if eof:
                await stream.close_stdin()

    async def _wait(self, write: asyncio.Future[None], timeout_s: float, size: int) -> None:
        ended = asyncio.ensure_future(self._ended.wait())
        waits: set[asyncio.Future[Any]] = {write, ended}
        try:
            done, _ = await asyncio.wait(
                waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
        # A write that completed delivered its bytes, even if the task ended right after;
        # one cancelled by close() (the task ended first) did not.
        if write in done and not write.cancelled():
            error = write.exception()
            if error is None:
                return
            if isinstance(error, (OSError, ConnectionError)):
                raise StdinClosed(f"task {self.task_id}: stdin is closed ({error})") from error
            raise error
        if self._ended.is_set():
            raise StdinClosed(self._why or f"task {self.task_id} ended before taking its input")
        raise InputNotRead(
            f"task {self.task_id} is not reading its stdin: {size} bytes were not taken "
            f"within {timeout_s:g} s (they stay queued; stop the task if it is stuck)"
        )

    def close(self, why: str) -> None:
        """No more input: every pending and later call fails at once with ``why``."""
        self._why = why
        self._ended.set()
        if self._undrained is not None and not self._undrained.done():
            self._undrained.cancel()
