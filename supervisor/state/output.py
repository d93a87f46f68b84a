"""Output files: one append-only writer per task, capped; offset reads and tails."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from supervisor.core.models import OutputSlice
from supervisor.core.resync import log_length, split_messages
from supervisor.core.terminal import render_tail
from supervisor.core.text import utf8_safe_end

T = TypeVar("T")
Buffer = bytes | bytearray | memoryview
_IOV_MAX = 1024
_COALESCE_BYTES = 256 * 1024
_COALESCE_S = 0.002
_BUSY_S = 0.01
#: A file this writer started empty keeps its first bytes in memory too, while it is no
#: longer than this: a fresh task's first reads (an agent waiting for its first output)
#: then need no thread hop. The copy is exact: every write to the file passes here.
HEAD_BYTES = 4096


def cap_marker(cap: int) -> bytes:
    """Written once into the file when the output cap is reached."""
    return f"\n[sandvisor: output cap of {cap} bytes reached; further output is dropped]\n".encode()


def dropped_marker(dropped: int) -> bytes:
    """Written at the end when output was dropped."""
    return f"[sandvisor: {dropped} bytes of output were dropped after the cap]\n".encode()


def gap_marker(nbytes: int, why: str) -> bytes:
    """Written when output could not be stored (full disk) or was lost by the engine."""
    return f"\n[sandvisor: {nbytes} bytes of output missing here: {why}]\n".encode()


class OutputFile:
    """A task's merged output file, written behind the capture loop by one writer.

    ``append``/``append_parts`` queue the bytes and return at once (no thread handoff per
    chunk); a single writer coroutine per file takes everything queued and writes it with
    one ``writev`` in ``io``, so the loop never blocks and chunks are batched while a write
    is in flight. More than ``high_water`` bytes queued makes ``append`` wait (bounded
    memory, backpressure on the engine stream). ``task_bytes`` counts the command's bytes
    in the file; markers are extra. When the disk is full the bytes are counted as a gap,
    marked in the file once space returns. ``on_write`` runs after each write lands.
    """

    def __init__(
        self, path: Path, cap: int, io: Executor, *, high_water: int = 16 * 1024 * 1024
    ) -> None:
        self.path = path
        self.cap = cap
        self._io = io
        self._fd: int | None = None
        self.task_bytes = 0
        self.file_size = 0
        self.dropped = 0
        self.gap_bytes = 0
        self._pending_gap = 0
        self._closed = False
        self._high_water = high_water
        #: (counts as command output?, buffer), in order.
        self._queue: list[tuple[bool, Buffer]] = []
        self._queued = 0
        self._accepted = 0
        self._writer: asyncio.Task[None] | None = None
        self._last_write = float("-inf")
        self._drained = asyncio.Event()
        self._drained.set()
        self.on_write: Callable[[], None] | None = None
        #: The whole file, while it is short and this writer wrote all of it; else None.
        self._head: bytearray | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, fn, *args)

    async def open(self, *, task_bytes: int = 0) -> None:
        """Create (or reopen for append) the file."""

        def do_open() -> tuple[int, int]:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            return fd, os.fstat(fd).st_size

        fd, size = await self._run(do_open)
        self._fd = fd
        self.file_size = size
        self._head = bytearray() if size == 0 else None
        self.task_bytes = self._accepted = task_bytes

    # -- queueing (the capture loop) ----------------------------------------------------

    def _enqueue(self, task: bool, data: Buffer) -> None:
        if len(data):
            self._queue.append((task, data))
            self._queued += len(data)

    async def append_parts(self, parts: Sequence[Buffer]) -> None:
        """Queue command output (e.g. views into the engine stream), enforcing the cap."""
        size = sum(len(p) for p in parts)
        room = self.cap - self._accepted
        if size <= room:
            for part in parts:
                self._enqueue(True, part)
            self._accepted += size
        else:
            data = b"".join(parts)
            if room > 0:
                self._enqueue(True, data[:room])
                self._accepted += room
            if not self.dropped:  # the first dropped byte: say so where it happened
                self._enqueue(False, cap_marker(self.cap))
            self.dropped += size - max(room, 0)
        self._kick()
        if self._queued > self._high_water:
            await self.flush()

    async def append(self, data: Buffer) -> None:
        """Queue one buffer of command output."""
        if len(data):
            await self.append_parts([data])

    async def note_gap(self, nbytes: int, why: str) -> None:
        """Record output that is known to be missing (e.g. rotated away by the engine)."""
        self._enqueue(False, gap_marker(nbytes, why))
        self._kick()

    def _kick(self) -> None:
        if self._queue and (self._writer is None or self._writer.done()):
            self._drained.clear()
            self._writer = asyncio.create_task(self._write_queued(), name="output-writer")

    async def flush(self) -> None:
        """Wait until everything queued is in the file (or counted as a gap)."""
        while self._queue or (self._writer is not None and not self._writer.done()):
            self._kick()
            await self._drained.wait()

    # -- writing (the writer coroutine; blocking calls in ``io``) -------------------------

    async def _write_queued(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                busy = loop.time() - self._last_write < _BUSY_S
                if busy and self._queued < _COALESCE_BYTES and not self._closed:
                    # A fast stream: let its small reads pile up for a moment, one thread hop
                    # per ~256 KiB instead of one per ~14 KiB read. The first write after a
                    # quiet spell goes out at once (no added latency for short commands).
                    await asyncio.sleep(_COALESCE_S)
                batch, self._queue, self._queued = self._queue, [], 0
                await self._write_batch(batch)
                self._last_write = loop.time()
                if self.on_write is not None:
                    self.on_write()
        finally:
            self._drained.set()

    async def _write_batch(self, batch: list[tuple[bool, Buffer]]) -> None:
        if self._pending_gap:
            marker = gap_marker(self._pending_gap, "the disk was full")
            if await self._write_some([marker]) < len(marker):
                lost = sum(len(b) for task, b in batch if task)
                self._pending_gap += lost
                self.gap_bytes += lost
                return
            self._pending_gap = 0
        written = await self._write_some([b for _, b in batch])
        task_written = task_total = 0
        left = written
        for task, buf in batch:
            took = min(left, len(buf))
            left -= took
            if task:
                task_total += len(buf)
                task_written += took
        self.task_bytes += task_written
        if task_written < task_total:
            self._pending_gap += task_total - task_written
            self.gap_bytes += task_total - task_written

    def _write_all(self, data: list[Buffer]) -> tuple[int, OSError | None]:
        """Write everything with writev (no joining copies), or as much as fits:
        (bytes written, the error that stopped it)."""
        assert self._fd is not None
        pending = deque(data)
        total = 0
        while pending:
            try:
                n = os.writev(self._fd, list(itertools.islice(pending, _IOV_MAX)))
            except OSError as exc:
                return total, exc
            total += n
            while pending and n >= len(pending[0]):
                n -= len(pending.popleft())
            if n:
                pending[0] = memoryview(pending[0])[n:]
        return total, None

    async def _write_some(self, data: list[Buffer]) -> int:
        written, error = await self._run(self._write_all, data)
        self.file_size += written
        self._keep_head(data, written)
        if error is not None and error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise error
        return written

    def _keep_head(self, data: list[Buffer], written: int) -> None:
        head = self._head
        if head is None or not written:
            return
        if len(head) + written > HEAD_BYTES:
            self._head = None  # the file outgrew it: reads go to the file from now on
            return
        left = written
        for buf in data:
            took = memoryview(buf)[:left]
            head += took
            left -= len(took)
            if not left:
                break

    def head_range(self, offset: int, limit: int) -> tuple[bytes, int] | None:
        """``(bytes at offset, file size)`` as a read of the file would give them, from
        memory; None when the file is not all in memory (read it)."""
        head = self._head
        if head is None:
            return None
        return bytes(head[offset : offset + limit]), len(head)

    async def close(self) -> None:
        """Write what is queued, the final truncation record (if any), and close."""
        if self._closed or self._fd is None:
            return
        await self.flush()
        self._closed = True
        if self.dropped:
            self._enqueue(False, dropped_marker(self.dropped))
        if self._queue or self._pending_gap:
            await self._write_batch(self._queue)  # also writes a gap marker if space is back
            self._queue = []
        fd, self._fd = self._fd, None
        self._head = None  # an ended task's reads go to its file
        await self._run(os.close, fd)


def _read_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if offset >= size:
                return b"", size
            fh.seek(offset)
            return fh.read(limit), size
    except FileNotFoundError:
        return b"", 0


async def read_slice(
    path: Path,
    offset: int,
    limit: int,
    *,
    ended: bool,
    io: Executor | None = None,
    writer: OutputFile | None = None,
) -> OutputSlice:
    """Read ``limit`` bytes at ``offset`` (from ``writer``'s copy in memory when it has the
    whole file). A slice never ends inside a UTF-8 character unless the file itself ends
    there, so decoded slices stitch together cleanly."""
    known = writer.head_range(offset, limit) if writer is not None else None
    if known is None:
        loop = asyncio.get_running_loop()
        known = await loop.run_in_executor(io, _read_range, path, offset, limit)
    data, size = known
    end = offset + len(data)
    if data and end < size:
        cut = utf8_safe_end(data)
        if cut > 0:
            data = data[:cut]
            end = offset + cut
    return OutputSlice(data=data, offset=offset, next_offset=end, eof=ended and end >= size)


def replayed_length(path: Path, start: int, end: int) -> int:
    """How many bytes the engine's log replay holds for file bytes ``[start, end)``
    (``start`` where a line starts): see :func:`supervisor.core.resync.log_length`."""
    total = 0
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            remaining = end - start
            carry = b""
            while remaining > 0:
                block = fh.read(min(remaining, 4 << 20))
                if not block:
                    break
                remaining -= len(block)
                whole, carry = split_messages(carry + block, final=remaining <= 0)
                total += log_length(whole)
            total += log_length(carry)
    except FileNotFoundError:
        return 0
    return total


def read_range(path: Path, start: int, end: int) -> bytes:
    """File bytes ``[start, end)`` (blocking; run in a worker thread)."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            return fh.read(max(0, end - start))
    except FileNotFoundError:
        return b""


async def read_tail(path: Path, chars: int, io: Executor | None = None) -> str:
    """The last ``chars`` characters of the file, decoded with replacement."""
    loop = asyncio.get_running_loop()

    def tail() -> bytes:
        try:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                start = max(0, size - chars * 4)
                fh.seek(start)
                return fh.read()
        except FileNotFoundError:
            return b""

    raw = await loop.run_in_executor(io, tail)
    text = raw.decode("utf-8", "replace")
    return text[-chars:] if chars > 0 else ""


#: Most bytes read from a file's end to fill a rendered tail: a progress bar's frames render
#: to little, so the window grows (x8 from ``4 * chars``) until the tail is full or this.
RENDER_WINDOW = 1 << 20


def rendered_tail_of(path: Path, chars: int, *, final: bool) -> str:
    """The last ``chars`` characters of the file as a terminal shows them (blocking; run in
    a worker thread). Not ``final`` (the task runs): an incomplete escape sequence at the end
    is left out until the rest of it comes."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            window = min(size, max(4 * chars, 4096))
            while True:
                fh.seek(size - window)
                data = fh.read(window)
                start = size - window
                text = render_tail(data, chars, final=final, whole=start == 0).text
                if len(text) >= chars or start == 0 or window >= RENDER_WINDOW:
                    return text
                window = min(size, window * 8, RENDER_WINDOW)
    except FileNotFoundError:
        return ""


async def read_rendered_tail(
    path: Path, chars: int, io: Executor | None = None, *, final: bool = False
) -> str:
    """:func:`rendered_tail_of` in ``io``: the tail agents are handed (polls, stall notices)."""
    if chars <= 0:
        return ""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(io, lambda: rendered_tail_of(path, chars, final=final))
