"""EventLog over a real StateStore (SQLite in tmp_path): seq, replay, follow, retention, sinks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from supervisor.core.errors import SessionEnded, StateStorageError
from supervisor.core.events import BaseEvent, EventsGap, TaskOutput, parse_event
from supervisor.state.eventlog import EventLog
from supervisor.state.sinks import MemorySink
from supervisor.state.store import StateStore

SID = "s1"
BLOCK = 10_000  # eventlog._SEQ_BLOCK


def out(i: int) -> TaskOutput:
    return TaskOutput(session_id=SID, task_id="bg-00000001", text=f"line {i}", ordinal=i, lines=1)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StateStore]:
    st = StateStore(tmp_path / "state" / "state.db")
    await st.open()
    yield st
    await st.close()


async def new_log(store: StateStore, **kw: int) -> EventLog:
    log = EventLog(SID, store, **kw)
    await log.load()
    return log


def seqs(events: list[BaseEvent]) -> list[int]:
    return [e.seq for e in events]


async def collect(log: EventLog, after_seq: int = 0, *, follow: bool = True) -> list[BaseEvent]:
    return [ev async for ev in log.follow(after_seq, follow=follow)]


async def test_seq_strictly_increasing_and_stored(store: StateStore) -> None:
    log = await new_log(store)
    logged = [log.emit(out(i)) for i in range(5)]
    assert seqs(logged) == [1, 2, 3, 4, 5]
    assert all(e.ts > 0 for e in logged)
    await log.flushed()
    logged += [log.emit(out(i)) for i in range(5, 8)]
    await log.flushed()
    assert seqs(logged) == list(range(1, 9))
    assert log.last_seq == 8
    rows = await store.read_events(SID, 0, 100)
    assert [parse_event(r) for r in rows] == logged
    assert await store.seq_bounds(SID) == (1, 8)
    await log.aclose()


async def test_follow_replays_then_follows_live_and_stops_after_aclose(store: StateStore) -> None:
    log = await new_log(store)
    for i in range(3):
        log.emit(out(i))
    await log.flushed()
    sink = MemorySink()  # only used as a waitable list
    got: list[BaseEvent] = []

    async def follower() -> None:
        async for ev in log.follow(0):
            got.append(ev)
            await sink.send(ev)

    task = asyncio.create_task(follower())
    await sink.wait_for(lambda e: e.seq == 3, timeout=5)
    log.emit(out(3))
    log.emit(out(4))
    await sink.wait_for(lambda e: e.seq == 5, timeout=5)
    assert not task.done()
    await log.aclose()
    await asyncio.wait_for(task, 5)  # the follower ends once the log is closed
    assert seqs(got) == [1, 2, 3, 4, 5]
    assert [e.text for e in got if isinstance(e, TaskOutput)] == [f"line {i}" for i in range(5)]


async def test_follow_from_the_middle_and_without_following(store: StateStore) -> None:
    log = await new_log(store)
    for i in range(6):
        log.emit(out(i))
    await log.flushed()
    assert seqs(await collect(log, 4, follow=False)) == [5, 6]
    assert await collect(log, 6, follow=False) == []
    assert seqs(await log.read_after(2, 2)) == [3, 4]
    await log.aclose()


async def test_reading_without_following_includes_what_was_just_emitted(
    store: StateStore,
) -> None:
    # No flushed() between emit and read: the batch is still queued for the store.
    log = await new_log(store)
    for i in range(3):
        log.emit(out(i))
    assert seqs(await collect(log, 0, follow=False)) == [1, 2, 3]
    await log.aclose()


async def test_caught_up_is_not_extended_by_later_events(store: StateStore) -> None:
    log = await new_log(store)
    log.emit(out(0))
    stop = asyncio.Event()

    async def chatter() -> None:  # keeps the flusher busy for as long as it runs
        i = 1
        while not stop.is_set():
            log.emit(out(i))
            i += 1
            await asyncio.sleep(0)

    noisy = asyncio.create_task(chatter())
    await asyncio.wait_for(log.caught_up(), 10)
    assert log.last_seq >= 1
    stop.set()
    await noisy
    await log.aclose()


async def test_emit_after_close_is_an_error(store: StateStore) -> None:
    log = await new_log(store)
    await log.aclose()
    with pytest.raises(SessionEnded, match="closed"):
        log.emit(out(0))
    assert log.closed


async def test_after_a_clean_close_numbering_continues_without_a_hole(
    store: StateStore,
) -> None:
    first = await new_log(store)
    for i in range(3):
        first.emit(out(i))
    await first.aclose()
    assert await store.get_meta(f"seq_reserved:{SID}") == "3"  # unused block given back
    second = await new_log(store)
    assert second.last_seq == 3
    ev = second.emit(out(3))
    assert ev.seq == 4
    await second.aclose()


async def test_after_a_crash_numbering_skips_the_reserved_block(store: StateStore) -> None:
    first = await new_log(store)
    for i in range(3):
        first.emit(out(i))
    await first.flushed()  # ... and the process dies here, without aclose()
    assert await store.get_meta(f"seq_reserved:{SID}") == str(3 + BLOCK)

    second = await new_log(store)
    assert second.last_seq == 3  # resuming readers wait after the last *stored* event
    assert await second.read_after(3, 10) == []
    ev = second.emit(out(3))
    assert ev.seq == 3 + BLOCK + 1  # never reuses a seq that may have been handed out
    await second.flushed()
    assert (await store.seq_bounds(SID))[1] == ev.seq
    # The hole is not a gap: those seqs never reached anyone durably.
    assert seqs(await second.read_after(3, 10)) == [ev.seq]
    assert seqs(await second.read_after(0, 2)) == [1, 2]
    await second.aclose()


async def test_new_log_continues_after_the_last_stored_seq(store: StateStore) -> None:
    first = await new_log(store)
    for i in range(4):
        first.emit(out(i))
    await first.aclose()
    await store.set_meta(f"seq_reserved:{SID}", "0")  # e.g. the block record was lost
    second = await new_log(store)
    assert second.emit(out(4)).seq == 5
    await second.aclose()


async def test_other_sessions_do_not_share_numbering(store: StateStore) -> None:
    a = await new_log(store)
    a.emit(out(0))
    await a.aclose()
    b = EventLog("s2", store)
    await b.load()
    assert b.emit(TaskOutput(session_id="s2", text="x", ordinal=1, lines=1)).seq == 1
    await b.aclose()


async def test_read_after_beyond_retention_yields_a_gap(store: StateStore) -> None:
    log = await new_log(store, memory_events=5, retention_events=10)
    for i in range(30):
        log.emit(out(i))
    await log.flushed()
    assert await store.prune_events(SID, 10) == 20
    assert await store.seq_bounds(SID) == (21, 30)
    events = await log.read_after(0, 100)
    gap, *rest = events
    assert isinstance(gap, EventsGap)
    assert (gap.first_seq, gap.last_seq, gap.seq, gap.why) == (1, 20, 20, "retention")
    assert seqs(rest) == list(range(21, 31))
    # the limit counts the gap
    assert seqs(await log.read_after(0, 3)) == [20, 21, 22]
    # still held: no gap
    assert seqs(await log.read_after(22, 3)) == [23, 24, 25]
    # in memory
    assert seqs(await log.read_after(27, 100)) == [28, 29, 30]
    replay = await collect(log, 0, follow=False)
    assert isinstance(replay[0], EventsGap)
    assert seqs(replay[1:]) == list(range(21, 31))
    await log.aclose()


async def test_automatic_pruning_keeps_retention_events(store: StateStore) -> None:
    log = await new_log(store, memory_events=50, retention_events=100)
    for i in range(5000):
        log.emit(out(i))
    await log.flushed()
    assert await store.seq_bounds(SID) == (4901, 5000)
    events = await log.read_after(0, 10)
    assert isinstance(events[0], EventsGap)
    assert (events[0].first_seq, events[0].last_seq) == (1, 4900)
    assert seqs(events[1:]) == list(range(4901, 4910))
    await log.aclose()


async def test_sink_with_after_seq_gets_the_backlog_then_live_events(store: StateStore) -> None:
    log = await new_log(store)
    for i in range(10):
        log.emit(out(i))
    await log.flushed()
    backlog = MemorySink()
    live_only = MemorySink()
    log.add_sink(backlog, after_seq=0)
    log.add_sink(live_only)
    await backlog.wait_for(lambda e: e.seq == 10, timeout=5)
    log.emit(out(10))
    await backlog.wait_for(lambda e: e.seq == 11, timeout=5)
    await live_only.wait_for(lambda e: e.seq == 11, timeout=5)
    await log.aclose()
    assert seqs(backlog.events) == list(range(1, 12))
    assert seqs(live_only.events) == [11]
    # closing the log closed the sinks: iteration ends
    assert seqs([e async for e in backlog]) == list(range(1, 12))


async def test_sink_from_the_middle_and_removal(store: StateStore) -> None:
    log = await new_log(store)
    for i in range(5):
        log.emit(out(i))
    await log.flushed()
    sink = MemorySink()
    runner = log.add_sink(sink, after_seq=3)
    await sink.wait_for(lambda e: e.seq == 5, timeout=5)
    await log.remove_sink(runner)
    log.emit(out(5))
    await log.aclose()
    assert seqs(sink.events) == [4, 5]


async def test_slow_sink_over_max_lag_gets_an_overflow_gap(store: StateStore) -> None:
    log = await new_log(store)
    for i in range(50):
        log.emit(out(i))
    await log.flushed()
    sink = MemorySink()
    log.add_sink(sink, after_seq=0, max_lag=10)
    await sink.wait_for(lambda e: e.seq == 50, timeout=5)
    await log.aclose()
    gap, *rest = sink.events
    assert isinstance(gap, EventsGap)
    assert (gap.first_seq, gap.last_seq, gap.why) == (1, 40, "overflow")
    assert seqs(rest) == list(range(41, 51))


async def test_store_failure_degrades_but_still_delivers(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = await new_log(store)
    sink = MemorySink()
    log.add_sink(sink)

    async def broken(rows: object) -> None:
        raise StateStorageError("disk full")

    monkeypatch.setattr(store, "append_events", broken)
    log.emit(out(0))
    log.emit(out(1))
    await log.flushed()
    assert log.degraded
    await sink.wait_for(lambda e: e.seq == 2, timeout=5)
    monkeypatch.undo()
    log.emit(out(2))
    await log.flushed()
    assert not log.degraded
    await log.aclose()
    assert seqs(sink.events) == [1, 2, 3]


async def test_wait_beyond(store: StateStore) -> None:
    log = await new_log(store)
    assert await log.wait_beyond(0, timeout=0.01) is False
    waiter = asyncio.create_task(log.wait_beyond(0, timeout=5))
    log.emit(out(0))
    assert await waiter is True
    closed_waiter = asyncio.create_task(log.wait_beyond(1, timeout=5))
    await asyncio.sleep(0)
    await log.aclose()
    assert await closed_waiter is False


# -- after a restart: the reserved seq block is not history --------------------------------


async def test_resuming_after_restart_has_no_phantom_gap(store: StateStore) -> None:
    first = await new_log(store)
    for i in range(3):
        first.emit(out(i))
    await first.aclose()
    second = await new_log(store)
    assert await second.wait_beyond(3, timeout=0.01) is False  # nothing new yet
    sink = MemorySink()
    got: list[BaseEvent] = []

    async def follower() -> None:
        async for ev in second.follow(0):
            got.append(ev)
            await sink.send(ev)

    task = asyncio.create_task(follower())
    await sink.wait_for(lambda e: e.seq == 3, timeout=5)
    new = second.emit(out(3))
    await sink.wait_for(lambda e: e.seq >= new.seq, timeout=5)
    await second.aclose()
    await asyncio.wait_for(task, 5)
    assert seqs(got) == [1, 2, 3, new.seq]
    assert not any(isinstance(e, EventsGap) for e in got)


async def test_sink_backlog_after_restart(store: StateStore) -> None:
    first = await new_log(store)
    for i in range(3):
        first.emit(out(i))
    await first.aclose()
    second = await new_log(store)
    sink = MemorySink()
    second.add_sink(sink, after_seq=0)
    await sink.wait_for(lambda e: e.seq >= 3, timeout=5)
    # (with the bug the runner also spins: it never sees the end, so aclose waits it out)
    await second.aclose(sink_timeout=0.5)
    assert seqs(sink.events) == [1, 2, 3]
