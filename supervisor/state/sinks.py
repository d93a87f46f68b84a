"""Event sinks (in-memory, JSONL file, callback) and the bounded queue that feeds each one."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from supervisor.core.events import BaseEvent, EventsGap
from supervisor.core.logs import get_logger

log = get_logger("supervisor.state.sinks")


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

    def __init__(
        self, fn: Callable[[BaseEvent], object] | Callable[[BaseEvent], Awaitable[object]]
    ):
        self._fn = fn

    async def send(self, event: BaseEvent) -> None:
        result = self._fn(event)
        if inspect.isawaitable(result):
            await result

    async def aclose(self) -> None:
        return None


class EventSource(Protocol):
    """What a SinkRunner reads from (the session's EventLog)."""

    @property
    def last_seq(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def backlog(self, after_seq: int) -> int: ...

    def skip_to(self, after_seq: int, keep: int) -> int: ...

    async def read_after(self, after_seq: int, limit: int) -> list[BaseEvent]: ...

    async def wait_beyond(self, seq: int, timeout: float | None = None) -> bool: ...


class SinkRunner:
    """Feeds one sink by reading the event log from its own cursor.

    Nothing is copied per sink, so a burst never overflows a sink that keeps up. A sink that
    falls more than ``max_lag`` events behind skips the oldest ones it has not seen and
    receives one ``events.gap`` naming the skipped range instead (its queue is bounded).
    Failing sends are logged and counted, never raised into the session.
    """

    def __init__(
        self, sink: Sink, source: EventSource, session_id: str, *, after_seq: int, max_lag: int
    ) -> None:
        self.sink = sink
        self.source = source
        self.session_id = session_id
        self.cursor = after_seq
        self.max_lag = max(1, max_lag)
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.failures = 0
        self.skipped = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._deliver(), name=f"sink-{type(self.sink).__name__}")

    def _skip_if_behind(self) -> EventsGap | None:
        if self.source.backlog(self.cursor) <= self.max_lag:
            return None
        before = self.source.backlog(self.cursor)
        first, last = self.cursor + 1, self.source.skip_to(self.cursor, self.max_lag)
        if last < first:
            return None
        self.cursor = last
        self.skipped += before - self.source.backlog(last)
        return EventsGap(
            session_id=self.session_id, seq=last, first_seq=first, last_seq=last, why="overflow"
        )

    async def _deliver(self) -> None:
        while True:
            gap = self._skip_if_behind()
            if gap is not None:
                await self._send(gap)
                continue
            batch = await self.source.read_after(self.cursor, 256)
            if not batch:
                if self.source.closed and self.cursor >= self.source.last_seq:
                    return
                await self.source.wait_beyond(self.cursor, 1.0)
                continue
            for event in batch:
                if event.seq <= self.cursor:
                    continue
                await self._send(event)
                self.cursor = event.seq
                if self.source.backlog(self.cursor) > self.max_lag:
                    break

    async def _send(self, event: BaseEvent) -> None:
        try:
            await self.sink.send(event)
            self.delivered += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing sink must never take the session down
            self.failures += 1
            log.warning(
                "sink_send_failed",
                sink=type(self.sink).__name__,
                session_id=self.session_id,
                seq=event.seq,
                error=repr(exc),
            )

    async def aclose(self, timeout: float = 5.0) -> None:
        """Deliver what the log still holds for this sink (up to ``timeout``), then close it.
        The source must be closed first so the delivery loop knows where the end is."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            if not self._task.done():
                self._task.cancel()
                await asyncio.wait([self._task])
        await self._close_sink()

    async def detach(self) -> None:
        """Stop delivering now (the sink is being removed), then close it."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])
        await self._close_sink()

    async def _close_sink(self) -> None:
        # A sink is user code: its failure to close must not stop the session's end, but it
        # is reported like a failed delivery.
        try:
            await self.sink.aclose()
        except Exception as exc:  # noqa: BLE001 - any sink error is logged, never raised
            log.warning(
                "sink_close_failed",
                sink=type(self.sink).__name__,
                session_id=self.session_id,
                error=repr(exc),
            )
