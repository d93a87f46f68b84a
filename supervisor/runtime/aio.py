"""Small asyncio helpers the runtime shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any


async def first_of(*waits: Awaitable[object], timeout: float | None) -> None:
    """Return when the first of ``waits`` completes or ``timeout`` passes; cancel the rest."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            f.cancel()


class Background:
    """Tasks started in the background and kept referenced until they finish (the loop
    holds only weak references to tasks)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, work: Coroutine[Any, Any, None], name: str | None = None) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def busy(self) -> bool:
        """Whether a task started here is still running."""
        return bool(self._tasks)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def wait(self) -> None:
        """Until every task started so far has finished."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))
