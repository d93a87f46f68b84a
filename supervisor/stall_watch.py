"""Stall watching service (filled in by the watcher work): tracks tasks with an open stdin."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any


class StallWatcher:
    """Placeholder registry; detection lands with the watcher issue."""

    def __init__(self, backend: Any, io: Executor) -> None:
        self._backend = backend
        self._io = io
        self._tasks: set[Any] = set()

    def register(self, runner: Any) -> None:
        self._tasks.add(runner)

    def unregister(self, runner: Any) -> None:
        self._tasks.discard(runner)

    def output_resumed(self, runner: Any) -> None:
        return None

    def input_sent(self, runner: Any) -> None:
        return None

    async def aclose(self) -> None:
        self._tasks.clear()
