"""Event sinks (in-memory, JSONL file, callback) and the bounded queue that feeds each one."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

import structlog

from supervisor.events import BaseEvent, EventsGap

log = structlog.get_logger("supervisor.sinks")


@runtime_checkable
class Sink(Protocol):
    """Where a session's events go. ``send`` may be slow or fail; capture never waits for it."""

    async def send(self, event: BaseEvent) -> None:
        """Deliver one event (called in seq order, one at a time)."""
        ...

    async def aclose(self) -> None:
        """Release resources; called once after the last event."""
        ...


class MemorySink:
    """Keeps events in memory; iterate with ``async for`` (ends after ``session.ended``)."""

    def __init__(self) -> None:
        self.events: list[BaseEvent] = []
        self._changed = asyncio.Event()
        self._closed = False

    async def send(self, event: BaseEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def aclose(self) -> None:
        self._closed = True
        self._changed.set()

    async def wait_for(
        self, predicate: Callable[[BaseEvent], bool], timeout: float = 30.0
    ) -> BaseEvent:
        """The first event (already received or later) matching ``predicate``."""
        async with asyncio.timeout(timeout):
            seen = 0
            while True:
                for ev in self.events[seen:]:
                    if predicate(ev):
                        return ev
                seen = len(self.events)
                if self._closed:
                    raise LookupError("sink closed without a matching event")
                self._changed.clear()
                await self._changed.wait()

    async def __aiter__(self) -> AsyncIterator[BaseEvent]:
        index = 0
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self._closed:
                return
            self._changed.clear()
            await self._changed.wait()


class JsonlSink:
    """Appends one JSON object per line to a file (writes off the event loop)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fh: object | None = None

    async def send(self, event: BaseEvent) -> None:
        line = event.model_dump_json() + "\n"

        def write() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)

        await asyncio.get_running_loop().run_in_executor(None, write)

    async def aclose(self) -> None:
        return None


class CallbackSink:
    """Calls ``fn(event)``; ``fn`` may be a plain function or a coroutine function."""

    def __init__(self, fn: Callable[[BaseEvent], object] | Callable[[BaseEvent], Awaitable[object]]):
        self._fn = fn

    async def send(self, event: BaseEvent) -> None:
        result = self._fn(event)
        if inspect.isawaitable(result):
            await result

    async def aclose(self) -> None:
        return None


class SinkRunner:
    """Feeds one sink from a bounded queue. ``offer`` never blocks: on overflow the missing
    range becomes one ``events.gap`` delivered in its place, in order."""

    def __init__(self, sink: Sink, session_id: str, *, maxsize: int = 1024) -> None:
        self.sink = sink
        self.session_id = session_id
        self._queue: asyncio.Queue[BaseEvent | None] = asyncio.Queue(maxsize=maxsize)
        self._gap: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.failures = 0
        self.dropped = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._deliver(), name=f"sink-{type(self.sink).__name__}")

    def _gap_event(self) -> EventsGap:
        assert self._gap is not None
        first, last = self._gap
        self._gap = None
        return EventsGap(
            session_id=self.session_id, seq=last, first_seq=first, last_seq=last, why="overflow"
        )

    def offer(self, event: BaseEvent) -> None:
        """Queue ``event`` for delivery, or widen the current gap when the queue is full."""
        # Room for the gap marker *and* the event keeps the order gap -> event.
        if self._gap is not None:
            if self._queue.maxsize - self._queue.qsize() >= 2:
                self._queue.put_nowait(self._gap_event())
            else:
                self._gap = (self._gap[0], event.seq)
                self.dropped += 1
                return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._gap = (event.seq, event.seq)
            self.dropped += 1

    async def _deliver(self) -> None:
        while True:
            if self._queue.empty() and self._gap is not None:
                item: BaseEvent | None = self._gap_event()
            else:
                item = await self._queue.get()
            if item is None:
                if self._gap is not None:
                    await self._send(self._gap_event())
                return
            await self._send(item)

    async def _send(self, event: BaseEvent) -> None:
        try:
            await self.sink.send(event)
            self.delivered += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failing sink must never take the session down
            self.failures += 1
            log.warning(
                "sink_send_failed",
                sink=type(self.sink).__name__,
                session_id=self.session_id,
                seq=event.seq,
                error=repr(exc),
            )

    async def aclose(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (up to ``timeout``), then close the sink."""
        if self._task is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            try:
                await asyncio.wait_for(self._queue.put(None), timeout)
            except TimeoutError:
                self._task.cancel()
            remaining = max(0.0, deadline - loop.time())
            if not self._task.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._task), remaining)
            if not self._task.done():
                self._task.cancel()
                await asyncio.wait([self._task])
        with contextlib.suppress(Exception):
            await self.sink.aclose()
