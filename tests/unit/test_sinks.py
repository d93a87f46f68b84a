"""Sinks and SinkRunner (fed by a fake in-memory EventSource): order, failures, lag, close."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from supervisor.core.events import BaseEvent, EventsGap, SessionEnded, TaskOutput, parse_event
from supervisor.state.sinks import CallbackSink, JsonlSink, MemorySink, Sink, SinkRunner

SID = "s1"


def ev(seq: int) -> BaseEvent:
    return TaskOutput(
        session_id=SID, task_id="bg-00000001", seq=seq, text=f"e{seq}", ordinal=seq, lines=1
    )


class FakeSource:
    """A list of events with the EventSource protocol (what the EventLog offers a runner)."""

    def __init__(self) -> None:
        self.events: list[BaseEvent] = []
        self._closed = False
        self._changed = asyncio.Event()
        self.reads = 0

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, *seqs: int) -> None:
        for seq in seqs:
            assert seq > self.last_seq
            self.events.append(ev(seq))
        self._changed.set()

    def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def read_after(self, after_seq: int, limit: int) -> list[BaseEvent]:
        self.reads += 1
        return [e for e in self.events if e.seq > after_seq][:limit]

    def backlog(self, after_seq: int) -> int:
        return sum(1 for e in self.events if e.seq > after_seq)

    def skip_to(self, after_seq: int, keep: int) -> int:
        later = [e for e in self.events if e.seq > after_seq]
        if len(later) <= keep:
            return after_seq
        return later[-keep - 1].seq if keep > 0 else later[-1].seq

    async def wait_beyond(self, seq: int, timeout: float | None = None) -> bool:
        try:
            async with asyncio.timeout(timeout):
                while self.last_seq <= seq:
                    if self._closed:
                        return False
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True


class GatedSink:
    """Records events; each send waits until the test opens the gate."""

    def __init__(self) -> None:
        self.events: list[BaseEvent] = []
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.closed = False

    async def send(self, event: BaseEvent) -> None:
        self.entered.set()
        await self.gate.wait()
        self.events.append(event)

    async def aclose(self) -> None:
        self.closed = True


class FlakySink(MemorySink):
    """Fails on chosen seqs."""

    def __init__(self, fail_on: set[int]) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.attempts: list[int] = []

    async def send(self, event: BaseEvent) -> None:
        self.attempts.append(event.seq)
        if event.seq in self.fail_on:
            raise RuntimeError(f"boom {event.seq}")
        await super().send(event)


def seqs(events: list[BaseEvent]) -> list[int]:
    return [e.seq for e in events]


def test_sinks_satisfy_the_protocol(tmp_path: Path) -> None:
    for sink in (MemorySink(), JsonlSink(tmp_path / "x.jsonl"), CallbackSink(print), GatedSink()):
        assert isinstance(sink, Sink)


async def test_delivers_backlog_and_live_events_in_seq_order() -> None:
    source = FakeSource()
    source.publish(1, 2, 3)
    sink = MemorySink()
    runner = SinkRunner(sink, source, SID, after_seq=1, max_lag=100)
    runner.start()
    await sink.wait_for(lambda e: e.seq == 3, timeout=5)
    source.publish(4, 5, 9)  # seqs may skip (events that were never logged); order is kept
    await sink.wait_for(lambda e: e.seq == 9, timeout=5)
    source.close()
    await runner.aclose()
    assert seqs(sink.events) == [2, 3, 4, 5, 9]
    assert (runner.delivered, runner.failures, runner.skipped) == (5, 0, 0)
    assert runner.cursor == 9


async def test_failing_sink_keeps_receiving_and_failures_are_counted() -> None:
    source = FakeSource()
    sink = FlakySink(fail_on={2, 3, 5})
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=100)
    runner.start()
    source.publish(1, 2, 3)
    await sink.wait_for(lambda e: e.seq == 1, timeout=5)
    source.publish(4, 5, 6)
    await sink.wait_for(lambda e: e.seq == 6, timeout=5)
    source.close()
    await runner.aclose()
    assert sink.attempts == [1, 2, 3, 4, 5, 6]  # every event tried once, in order
    assert seqs(sink.events) == [1, 4, 6]
    assert runner.failures == 3
    assert runner.delivered == 3


async def test_sink_far_behind_gets_one_gap_then_the_newest_events() -> None:
    source = FakeSource()
    source.publish(*range(1, 21))
    sink = MemorySink()
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=5)
    runner.start()
    await sink.wait_for(lambda e: e.seq == 20, timeout=5)
    source.close()
    await runner.aclose()
    first, *rest = sink.events
    assert isinstance(first, EventsGap)
    assert (first.first_seq, first.last_seq, first.seq, first.why) == (1, 15, 15, "overflow")
    assert first.session_id == SID
    assert seqs(rest) == [16, 17, 18, 19, 20]
    assert runner.skipped == 15


async def test_slow_sink_falling_behind_while_live() -> None:
    source = FakeSource()
    sink = GatedSink()
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=5)
    runner.start()
    source.publish(1)
    await asyncio.wait_for(sink.entered.wait(), 5)  # stuck delivering event 1
    source.publish(*range(2, 31))
    sink.gate.set()
    source.close()
    await runner.aclose(timeout=5)
    assert sink.closed
    gaps = [e for e in sink.events if isinstance(e, EventsGap)]
    assert len(gaps) == 1
    assert (gaps[0].first_seq, gaps[0].last_seq) == (2, 25)
    assert seqs(sink.events) == [1, 25, 26, 27, 28, 29, 30]
    # every seq either delivered or inside the gap, none twice, never out of order
    delivered = [e.seq for e in sink.events if not isinstance(e, EventsGap)]
    covered = sorted([*delivered, *range(gaps[0].first_seq, gaps[0].last_seq + 1)])
    assert covered == list(range(1, 31))
    assert runner.skipped == 24


async def test_sink_exactly_max_lag_behind_gets_no_gap() -> None:
    source = FakeSource()
    source.publish(*range(1, 6))
    sink = MemorySink()
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=5)
    runner.start()
    source.close()
    await runner.aclose()
    assert seqs(sink.events) == [1, 2, 3, 4, 5]
    assert not any(isinstance(e, EventsGap) for e in sink.events)


async def test_aclose_delivers_what_remains_then_closes_the_sink() -> None:
    source = FakeSource()
    sink = GatedSink()
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=100)
    runner.start()
    source.publish(*range(1, 11))
    await asyncio.wait_for(sink.entered.wait(), 5)
    source.close()
    closing = asyncio.create_task(runner.aclose(timeout=5))
    await asyncio.sleep(0)
    assert not sink.closed  # still delivering
    sink.gate.set()
    await closing
    assert seqs(sink.events) == list(range(1, 11))
    assert sink.closed


async def test_aclose_gives_up_after_its_timeout() -> None:
    source = FakeSource()
    sink = GatedSink()  # never opened: the sink hangs
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=100)
    runner.start()
    source.publish(1, 2)
    await asyncio.wait_for(sink.entered.wait(), 5)
    source.close()
    await runner.aclose(timeout=0.05)
    assert sink.events == []
    assert sink.closed


async def test_detach_stops_at_once() -> None:
    source = FakeSource()
    sink = GatedSink()
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=100)
    runner.start()
    source.publish(1)
    await asyncio.wait_for(sink.entered.wait(), 5)
    await runner.detach()
    assert sink.closed
    assert sink.events == []


async def test_idle_runner_waits_instead_of_spinning() -> None:
    source = FakeSource()
    sink = MemorySink()
    runner = SinkRunner(sink, source, SID, after_seq=0, max_lag=100)
    runner.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert source.reads == 1  # one empty read, then it waits for news
    source.close()
    await runner.aclose()


# -- the sinks themselves -----------------------------------------------------------------


async def test_memory_sink_iterates_until_closed_and_wait_for_sees_old_events() -> None:
    sink = MemorySink()
    await sink.send(ev(1))
    assert (await sink.wait_for(lambda e: e.seq == 1, timeout=1)).seq == 1
    got: list[int] = []

    async def consume() -> None:
        async for e in sink:
            got.append(e.seq)

    consumer = asyncio.create_task(consume())
    await sink.send(ev(2))
    await sink.wait_for(lambda e: e.seq == 2, timeout=1)
    await sink.aclose()
    await asyncio.wait_for(consumer, 5)
    assert got == [1, 2]
    with pytest.raises(LookupError, match="closed without a matching event"):
        await sink.wait_for(lambda e: e.seq == 99, timeout=1)


async def test_memory_sink_wait_for_times_out() -> None:
    with pytest.raises(TimeoutError):
        await MemorySink().wait_for(lambda e: True, timeout=0.01)


async def test_jsonl_sink_appends_one_json_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "events.jsonl"
    sink = JsonlSink(path)
    await sink.send(ev(1))
    await sink.send(SessionEnded(session_id=SID, seq=2, tasks_stopped=0))
    await sink.aclose()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2]
    assert [parse_event(line) for line in lines] == [
        ev(1),
        SessionEnded(session_id=SID, seq=2, tasks_stopped=0),
    ]


async def test_callback_sink_sync_and_async() -> None:
    seen: list[int] = []

    async def acb(e: BaseEvent) -> None:
        await asyncio.sleep(0)
        seen.append(-e.seq)

    await CallbackSink(lambda e: seen.append(e.seq)).send(ev(1))
    await CallbackSink(acb).send(ev(2))
    assert seen == [1, -2]
