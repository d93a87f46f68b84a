"""The state volume's free space, checked before each new task without a thread hop per start."""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Executor
from pathlib import Path

from supervisor.core.errors import StateStorageError

#: With this much more than the minimum free, a check stays good for ``FRESH_S``: a second
#: of writes cannot use it up on its own, and output writes handle ENOSPC anyway. Closer to
#: the minimum, every start looks again.
PLENTY_BYTES = 1 << 30
FRESH_S = 1.0
#: A plentiful reading up to this old lets a start go on while a fresh one is taken in the
#: background (no thread hop on the start's path); an older one is waited for.
STALE_S = 30.0


class StateSpace:
    """Refuse new work while the state volume is (nearly) full."""

    def __init__(self, state_dir: Path, min_free_bytes: int, io: Executor) -> None:
        self.state_dir = state_dir
        self.min_free_bytes = min_free_bytes
        self.io = io
        #: When the last reading had plenty to spare (-inf: it did not, or none yet).
        self._plenty_at = float("-inf")
        self._refresh: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Raise StateStorageError when fewer than ``min_free_bytes`` are free."""
        age = time.monotonic() - self._plenty_at
        if age < FRESH_S:
            return
        if age < STALE_S:
            # Plenty a moment ago: this start goes on; the next ones see the new reading.
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.create_task(self._read_quietly(), name="state-space")
            return
        free = await self._read()
        if free < self.min_free_bytes:
            raise StateStorageError(
                f"the state volume at {self.state_dir} is full ({free // 1024} KiB free); "
                "new tasks are refused until space returns"
            )

    async def _read_quietly(self) -> None:
        """A background reading: a failure leaves the next start to read (and raise)."""
        try:
            await self._read()
        except OSError:
            self._plenty_at = float("-inf")

    async def _read(self) -> int:
        """Free bytes now; remembers a plentiful reading."""
        loop = asyncio.get_running_loop()
        stat = await loop.run_in_executor(self.io, os.statvfs, self.state_dir)
        free = stat.f_bavail * stat.f_frsize
        plenty = free >= self.min_free_bytes + PLENTY_BYTES
        self._plenty_at = time.monotonic() if plenty else float("-inf")
        return free
