"""A task's stdio on Swarm: output from its node engine's log (followed, so nothing written
before the supervisor got there is missed) and stdin through an attach that carries no
output. Swarm never sets StdinOnce, so there is no EOF to give."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from supervisor.core.container import Segment
from supervisor.core.errors import Unsupported
from supervisor.engine.base import AttachedStream


class SwarmStream:
    """Output from ``output`` (a followed log); input to ``stdin`` when the task has one."""

    def __init__(self, output: AsyncIterator[list[Segment]], stdin: AttachedStream | None) -> None:
        self._output = output
        self._stdin = stdin
        self._closed = False

    async def read(self) -> list[Segment] | None:
        if self._closed:
            return None
        try:
            return await anext(self._output)
        except StopAsyncIteration:
            return None

    async def write(self, data: bytes) -> None:
        if self._stdin is None:
            raise ConnectionError("this task was started without stdin")
        await self._stdin.write(data)

    async def close_stdin(self) -> None:
        raise Unsupported(
            "Swarm never sets StdinOnce: a task's stdin cannot be closed while it runs"
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self._output, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        if self._stdin is not None:
            await self._stdin.aclose()

    def is_open(self) -> bool:
        return not self._closed
