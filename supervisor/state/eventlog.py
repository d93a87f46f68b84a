"""A session's event log: assigns seq, stores durably first, then fans out to readers and sinks."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from supervisor.core.errors import SessionEnded, StateStorageError
from supervisor.core.events import BaseEvent, EventsGap, parse_event
from supervisor.core.logs import get_logger
from supervisor.state.sinks import Sink, SinkRunner
from supervisor.state.store import StateStore

log = get_logger("supervisor.state.eventlog")

#: Seqs are reserved in blocks in the store, so a seq handed out while the store could not
#: be written is still never reused after a restart.
_SEQ_BLOCK = 10_000


def _weight(event: BaseEvent) -> int:
    """Rough memory cost of an event (monitor text dominates)."""
    text = getattr(event, "text", None) or getattr(event, "tail", None) or ""
    return 256 + len(text)


class EventLog:
    """Per-session, strictly increasing ``seq``; durable first, fan-out second.

    ``emit`` never blocks: it queues the event; a flusher commits batches (group commit) and
    then publishes them, in seq order, to the in-memory window, waiting readers and sinks.
    """

    def __init__(
        self,
        session_id: str,
        store: StateStore,
        *,
        memory_events: int = 20_000,
        memory_bytes: int = 32 * 1024 * 1024,
        retention_events: int = 100_000,
        sink_max_lag: int = 10_000,
        on_emit: Callable[[BaseEvent], None] | None = None,
    ) -> None:
        self.session_id = session_id
        #: Told of every event as it is logged (the supervisor's counters); must not block.
        self._on_emit = on_emit
        self._store = store
        self._memory_events = memory_events
        self._memory_bytes = memory_bytes
        self._window_bytes = 0
        self.retention_events = retention_events
        self._sink_max_lag = sink_max_lag
        self._next_seq = 1
        self._reserved_until = 0
        self._pending: list[BaseEvent] = []
        self._window: list[BaseEvent] = []
        self._published_seq = 0
        self._sinks: list[SinkRunner] = []
        self._flusher: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._closed = False
        self._since_prune = 0
        self._pruned_until = 0
        self.degraded = False

    @property
    def last_seq(self) -> int:
        """Highest seq published so far."""
        return self._published_seq

    @property
    def closed(self) -> bool:
        return self._closed

    async def load(self) -> None:
        """Continue after what the store holds. After a crash, numbering also skips the block
        reserved before it (seqs handed out while the store could not be written must never
        be reused); such holes are not gaps: those seqs never reached anyone durably."""
        _, hi = await self._store.seq_bounds(self.session_id)
        reserved = int(await self._store.get_meta(f"seq_reserved:{self.session_id}") or 0)
        pruned = await self._store.pruned_floor(self.session_id)
        self._next_seq = max(hi, reserved) + 1
        self._published_seq = hi
        self._reserved_until = self._next_seq - 1
        self._pruned_until = pruned
        self._closed = False

    def emit(self, event: BaseEvent) -> BaseEvent:
        """Assign seq and timestamp, queue for storage and delivery; returns the logged event."""
        if self._closed:
            raise SessionEnded(f"event log of session {self.session_id} is closed")
        logged = event.model_copy(update={"seq": self._next_seq, "ts": time.time()})
        self._next_seq += 1
        self._pending.append(logged)
        if self._on_emit is not None:
            self._on_emit(logged)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=f"eventlog-{self.session_id}")
        return logged

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            top = batch[-1].seq
            try:
                if top > self._reserved_until:
                    self._reserved_until = top + _SEQ_BLOCK
                    await self._store.set_meta(
                        f"seq_reserved:{self.session_id}", str(self._reserved_until)
                    )
                await self._store.append_events(
                    [
                        (self.session_id, ev.seq, ev.type, ev.task_id, ev.model_dump_json())
                        for ev in batch
                    ]
                )
                self.degraded = False
                self._since_prune += len(batch)
            except StateStorageError as exc:
                # Availability over durability: deliver anyway, say so once.
                if not self.degraded:
                    log.warning("event_store_failed", session_id=self.session_id, error=str(exc))
                self.degraded = True
            self._publish(batch)
            if self._since_prune >= 5_000:
                self._since_prune = 0
                await self._prune()

    async def _prune(self) -> None:
        """Drop events beyond retention (the store records how far, for explicit gaps)."""
        with contextlib.suppress(StateStorageError):
            await self._store.prune_events(self.session_id, self.retention_events)
            self._pruned_until = await self._store.pruned_floor(self.session_id)

    def _publish(self, batch: list[BaseEvent]) -> None:
        self._window.extend(batch)
        self._window_bytes += sum(_weight(e) for e in batch)
        # Bounded by count and by size (monitor text): older events stay in the store.
        if len(self._window) > 2 * self._memory_events or self._window_bytes > self._memory_bytes:
            keep = self._memory_events
            drop = max(0, len(self._window) - keep)
            dropped = sum(_weight(e) for e in self._window[:drop])
            while (
                self._window_bytes - dropped > self._memory_bytes // 2
                and drop < len(self._window) - 1
            ):
                dropped += _weight(self._window[drop])
                drop += 1
            del self._window[:drop]
            self._window_bytes -= dropped
        self._published_seq = batch[-1].seq
        self._changed.set()
        self._changed = asyncio.Event()

    async def flushed(self) -> None:
        """Wait until everything emitted so far is stored and published."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def caught_up(self) -> None:
        """Wait until every event emitted before this call is published (and stored, unless
        the store is failing). Unlike ``flushed``, events emitted meanwhile do not extend the
        wait, so a busy session cannot hold a caller here."""
        target = self._next_seq - 1
        while self._published_seq < target:
            flusher = self._flusher
            if flusher is None or flusher.done():
                if flusher is not None and not flusher.cancelled() and flusher.exception():
                    raise StateStorageError(
                        "the event log's flusher failed"
                    ) from flusher.exception()
                return
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({flusher, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    def add_sink(
        self, sink: Sink, *, after_seq: int | None = None, max_lag: int | None = None
    ) -> SinkRunner:
        """Attach a sink: it receives events after ``after_seq`` (default: from now on). A sink
        more than ``max_lag`` events behind skips ahead and gets an ``events.gap``."""
        runner = SinkRunner(
            sink,
            self,
            self.session_id,
            after_seq=self._published_seq if after_seq is None else after_seq,
            max_lag=self._sink_max_lag if max_lag is None else max_lag,
        )
        self._sinks.append(runner)
        runner.start()
        return runner

    async def remove_sink(self, runner: SinkRunner) -> None:
        if runner in self._sinks:
            self._sinks.remove(runner)
        await runner.detach()

    def sink_lag(self) -> int:
        """Published events the sink furthest behind has yet to take (0 without sinks)."""
        return max((self.backlog(r.cursor) for r in self._sinks), default=0)

    async def read_after(self, after_seq: int, limit: int) -> list[BaseEvent]:
        """Published events with seq > after_seq (at most ``limit``), from memory or the store.

        When retention has dropped events after ``after_seq``, the first item is an
        ``events.gap`` (why="retention") naming them; its seq is the last dropped one.
        """
        if after_seq >= self._published_seq:
            return []
        window = self._window
        if window and window[0].seq <= after_seq + 1:
            i = bisect.bisect_right(window, after_seq, key=lambda e: e.seq)
            return window[i : i + limit]
        # Older than memory: ask the store, including how far retention has pruned.
        self._pruned_until = max(
            self._pruned_until, await self._store.pruned_floor(self.session_id)
        )
        head: list[BaseEvent] = []
        if after_seq < self._pruned_until:
            head.append(
                EventsGap(
                    session_id=self.session_id,
                    seq=self._pruned_until,
                    first_seq=after_seq + 1,
                    last_seq=self._pruned_until,
                    why="retention",
                )
            )
            after_seq = self._pruned_until
            limit -= 1
        rows = await self._store.read_events(self.session_id, after_seq, max(limit, 0))
        events: list[BaseEvent] = [
            e for e in (parse_event(r) for r in rows) if e.seq <= self._published_seq
        ]
        if not events and limit > 0:
            # Nothing stored after it (the store lags or failed): serve from memory.
            i = bisect.bisect_right(window, after_seq, key=lambda e: e.seq)
            events = window[i : i + limit]
        return head + events

    def backlog(self, after_seq: int) -> int:
        """How many published events follow ``after_seq`` (an upper bound when they are
        older than the in-memory window)."""
        window = self._window
        if window and window[0].seq <= after_seq + 1:
            return len(window) - bisect.bisect_right(window, after_seq, key=lambda e: e.seq)
        return max(0, self._published_seq - after_seq)

    def skip_to(self, after_seq: int, keep: int) -> int:
        """A cursor after which exactly ``keep`` events remain (or ``after_seq`` if fewer)."""
        window = self._window
        if self.backlog(after_seq) <= keep:
            return after_seq
        if keep <= 0:
            return self._published_seq
        if window and len(window) > keep:
            return window[-keep - 1].seq
        return max(after_seq, self._published_seq - keep)

    async def wait_beyond(self, seq: int, timeout: float | None = None) -> bool:
        """Wait until an event with seq > ``seq`` is published; False on timeout or close."""
        while self._published_seq <= seq:
            if self._closed:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return False
        return True

    async def follow(self, after_seq: int = 0, *, follow: bool = True) -> AsyncIterator[BaseEvent]:
        """Replay events after ``after_seq``, then (with ``follow``) wait for new ones until the
        log closes. A slow reader only slows itself. Everything emitted before the call is
        included, also without ``follow``."""
        await self.caught_up()
        cursor = after_seq
        while True:
            batch = await self.read_after(cursor, 1000)
            if batch:
                for ev in batch:
                    yield ev
                    cursor = ev.seq
                continue
            if not follow or self._closed:
                return
            await self.wait_beyond(cursor)

    async def aclose(self, sink_timeout: float = 5.0) -> None:
        """Flush, close sinks (delivering what they have queued) and stop followers."""
        await self.flushed()
        if not self.degraded and self._reserved_until > self._published_seq:
            # Clean close: give back the unused reservation, so numbering continues
            # without a hole next time.
            with contextlib.suppress(StateStorageError):
                await self._store.set_meta(
                    f"seq_reserved:{self.session_id}", str(self._published_seq)
                )
                self._reserved_until = self._published_seq
        self._closed = True
        self._changed.set()
        runners, self._sinks = self._sinks, []
        await asyncio.gather(*(r.aclose(sink_timeout) for r in runners))
