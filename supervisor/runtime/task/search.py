"""``wait_for``: the first output line matching a pattern, searched in the output file.

The file is read and scanned in a worker thread, chunk by chunk, so a long line or a slow
pattern never holds the event loop; the caller's timeout is checked between chunks and
while waiting for more output.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol

from supervisor.core.errors import TaskNotRunning, WaitTimeout
from supervisor.core.models import PatternMatch, TaskInfo
from supervisor.core.scan import LineScanner, Pattern
from supervisor.runtime.aio import first_of

#: Bytes read and scanned per thread hop: small enough that the caller's deadline is
#: checked often even for the slowest patterns (RE2's fallback engine runs at ~12 MB/s).
CHUNK = 1 << 20


def _read_from(path: Path, offset: int, size: int = CHUNK) -> bytes:
    try:
        with path.open("rb") as fh:
            if offset >= os.fstat(fh.fileno()).st_size:
                return b""  # (and never seek absurdly far: some filesystems refuse)
            fh.seek(offset)
            return fh.read(size)
    except FileNotFoundError:
        return b""


def _scan_next(scanner: LineScanner, path: Path) -> tuple[int, PatternMatch | None]:
    """Read the next chunk and feed it: (bytes read, the match if any)."""
    offset = scanner.position
    data = _read_from(path, offset)
    if not data:
        return 0, None
    return len(data), scanner.feed(data, offset)


class TaskView(Protocol):
    """What a search needs to know about its task while it runs (a TaskRunner is one)."""

    @property
    def task_id(self) -> str: ...
    @property
    def seen(self) -> asyncio.Event:
        """Set (and replaced) whenever output arrives."""
        ...

    @property
    def ended(self) -> bool: ...

    exited: asyncio.Event
    final: asyncio.Event

    def info(self) -> TaskInfo: ...


async def wait_for_pattern(
    path: Path,
    pattern: Pattern,
    task: TaskView,
    io: Executor,
    *,
    timeout_s: float,
    from_offset: int = 0,
) -> PatternMatch:
    """First line at/after ``from_offset`` matching ``pattern`` (lines printed before the
    call count). Raises WaitTimeout, or TaskNotRunning when the task ended without one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    scanner = LineScanner(pattern, from_offset)
    while True:
        seen = task.seen
        ended = task.ended or task.exited.is_set()
        got, match = await loop.run_in_executor(io, _scan_next, scanner, path)
        if match is not None:
            return match
        if got:
            if loop.time() >= deadline:
                break
            continue
        if ended:
            if task.exited.is_set() and not task.ended:
                await task.final.wait()  # the last bytes may still be on their way
                continue
            match = scanner.finish()
            if match is not None:
                return match
            info = task.info()
            raise TaskNotRunning(
                info,
                f"task {task.task_id} ended ({info.describe_end()}) without printing "
                f"a line matching {pattern.pattern!r}",
            )
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await first_of(seen.wait(), task.final.wait(), timeout=remaining)
    raise WaitTimeout(
        f"no line matching {pattern.pattern!r} in the output of task {task.task_id} "
        f"within {timeout_s} s"
    )
