"""StateSpace: the free-space check before each start, without a thread hop on the start's
path while the last reading had plenty to spare."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from supervisor.core.errors import StateStorageError
from supervisor.runtime import state_space
from supervisor.runtime.state_space import FRESH_S, PLENTY_BYTES, STALE_S, StateSpace

MIN = 1 << 20


class Disk:
    """A statvfs whose free space and clock the test sets; counts the readings."""

    def __init__(self) -> None:
        self.free = MIN + PLENTY_BYTES
        self.now = 1000.0
        self.reads = 0

    def statvfs(self, path: str | os.PathLike[str]) -> SimpleNamespace:
        self.reads += 1
        return SimpleNamespace(f_bavail=self.free, f_frsize=1)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    d = Disk()
    monkeypatch.setattr(state_space.os, "statvfs", d.statvfs)
    monkeypatch.setattr(state_space, "time", SimpleNamespace(monotonic=lambda: d.now))
    return d


async def settle() -> None:
    """Let the background reading (the task named ``state-space``) finish."""
    await asyncio.gather(*(t for t in asyncio.all_tasks() if t.get_name() == "state-space"))


async def test_plenty_is_read_in_the_background_and_little_is_waited_for(
    disk: Disk, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(1) as io:
        space = StateSpace(tmp_path, MIN, io)
        await space.check()  # no reading yet: waited for
        assert disk.reads == 1
        disk.now += FRESH_S / 2
        await space.check()  # fresh: nothing read
        assert disk.reads == 1
        disk.now += FRESH_S
        disk.free = MIN - 1  # filled up meanwhile
        await space.check()  # plenty a moment ago: goes on, reads behind
        await settle()
        assert disk.reads == 2
        with pytest.raises(StateStorageError, match="is full"):
            await space.check()  # the new reading says little: every start reads again
        assert disk.reads == 3
        disk.free = MIN + PLENTY_BYTES
        await space.check()
        assert disk.reads == 4
        # A plentiful reading grows old with no start to refresh it: waited for again.
        disk.now += STALE_S + 1
        disk.free = MIN - 1
        with pytest.raises(StateStorageError):
            await space.check()
