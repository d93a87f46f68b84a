"""The supervisor's counters (core/stats.py), the event log's hooks into them, and their
Prometheus form (interfaces/daemon/metrics.py) parsed back with prometheus_client."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.core.events import (
    BaseEvent,
    SessionEnded,
    TaskFailed,
    TaskOutput,
    TaskStalled,
    TaskStarted,
    TaskStopped,
)
from supervisor.core.stats import (
    END_REASONS,
    EVENT_TYPES,
    START_BUCKETS,
    Histogram,
    RuntimeStats,
)
from supervisor.interfaces.daemon.metrics import METRIC_NAMES, SupervisorCollector
from supervisor.state.eventlog import EventLog
from supervisor.state.store import StateStore

SID = "s1"
TID = "bg-00000001"


def started(policy: str = "default") -> TaskStarted:
    return TaskStarted(
        session_id=SID,
        task_id=TID,
        command="true",
        description="",
        kind="background",
        policy=policy,
        output_path="/x",
        persistent=False,
        timeout_ms=1000,
    )


def stopped(reason: str, exit_code: int | None = None) -> TaskStopped:
    return TaskStopped.model_validate(
        {
            "session_id": SID,
            "task_id": TID,
            "command": "true",
            "description": "",
            "output_path": "/x",
            "reason": reason,
            "exit_code": exit_code,
            "running_ms": 5,
            "output_bytes": 0,
        }
    )


def failed() -> TaskFailed:
    return TaskFailed(
        session_id=SID,
        task_id=TID,
        command="true",
        description="",
        output_path="/x",
        error_code="image_missing",
        message="no image",
    )


def stalled() -> TaskStalled:
    return TaskStalled(
        session_id=SID,
        task_id=TID,
        command="read x",
        description="",
        output_path="/x",
        signal="process_state",
        last_output="name? ",
        waiting_ms=1000,
    )


# -- the histogram ------------------------------------------------------------------------


def test_histogram_buckets_are_le_and_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.observe(value)
    # A value equal to a bound falls in that bucket (Prometheus's ``le``).
    assert h.cumulative() == ((0.1, 2), (1.0, 4), (math.inf, 5))
    assert h.count == 5
    assert h.total == pytest.approx(8.65)


def test_histogram_sorts_its_bounds() -> None:
    assert Histogram((1.0, 0.5)).bounds == (0.5, 1.0)


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=50))
def test_histogram_counts_every_value_once(values: list[float]) -> None:
    h = Histogram()
    for v in values:
        h.observe(v)
    buckets = h.cumulative()
    counts = [n for _, n in buckets]
    assert counts == sorted(counts), "cumulative counts never go down"
    assert buckets[-1] == (math.inf, len(values))
    for bound, n in buckets:
        assert n == sum(1 for v in values if v <= bound)


# -- the counters -------------------------------------------------------------------------


def test_events_are_counted_by_type_and_meaning() -> None:
    stats = RuntimeStats()
    events: list[BaseEvent] = [
        started("default"),
        started("default"),
        started("untrusted"),
        stopped("exit", 0),
        stopped("exit", 3),
        stopped("timeout"),
        failed(),
        stalled(),
        stalled(),
        TaskOutput(session_id=SID, task_id=TID, text="x", ordinal=1, lines=1),
        SessionEnded(session_id=SID, tasks_stopped=0),
    ]
    for ev in events:
        stats.event(ev)
    assert stats.started == {"default": 2, "untrusted": 1}
    assert stats.ended["exit"] == 2
    assert stats.ended["timeout"] == 1
    assert stats.ended["failed"] == 1
    assert stats.ended["lost"] == 0  # every reason is there from the start
    assert set(stats.ended) == set(END_REASONS)
    assert set(stats.events) == set(EVENT_TYPES)
    assert "events.gap" not in EVENT_TYPES  # made per reader, never logged
    assert stats.stalls == 2
    assert {k: n for k, n in stats.events.items() if n} == {
        "task.started": 3,
        "task.stopped": 3,
        "task.failed": 1,
        "task.stalled": 2,
        "task.output": 1,
        "session.ended": 1,
    }


def test_output_and_first_byte() -> None:
    stats = RuntimeStats()
    stats.output(10)
    stats.output(5)
    stats.first_byte("cold", 0.08)
    stats.first_byte("warm", 0.001)
    stats.first_byte("warm", -0.5)  # a clock step never makes a negative latency
    snap = stats.snapshot(
        tasks_running=0, sink_lag_events=0, engine_up=True, pool_ready={}, sessions_open=0
    )
    assert snap.output_bytes == 15
    cold, warm = snap.task_start_seconds["cold"], snap.task_start_seconds["warm"]
    assert (cold.count, warm.count) == (1, 2)
    assert cold.total == pytest.approx(0.08)
    assert warm.total == pytest.approx(0.001)
    assert dict(warm.buckets)[START_BUCKETS[0]] == 2


def test_a_snapshot_does_not_move_with_the_counters() -> None:
    stats = RuntimeStats()
    stats.event(started())
    snap = stats.snapshot(
        tasks_running=1,
        sink_lag_events=3,
        engine_up=False,
        pool_ready={"default": 2},
        sessions_open=1,
    )
    stats.event(started())
    stats.first_byte("cold", 0.1)
    assert snap.tasks_started == {"default": 1}
    assert snap.task_start_seconds["cold"].count == 0


# -- the event log's hooks ----------------------------------------------------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StateStore]:
    s = StateStore(tmp_path / "state.db")
    await s.open()
    yield s
    await s.close()


async def test_event_log_counts_what_it_logs(store: StateStore) -> None:
    stats = RuntimeStats()
    log = EventLog(SID, store, on_emit=stats.event)
    await log.load()
    log.emit(started())
    log.emit(stopped("user_stopped"))
    await log.flushed()
    assert {k: n for k, n in stats.events.items() if n} == {"task.started": 1, "task.stopped": 1}
    assert stats.events["task.poll"] == 0  # every logged type shows, from 0
    assert stats.ended["user_stopped"] == 1
    await log.aclose()


class GatedSink:
    """Takes one event, then waits for the gate: a sink that fell behind."""

    def __init__(self) -> None:
        self.got: list[BaseEvent] = []
        self.gate = asyncio.Event()
        self.first = asyncio.Event()

    async def send(self, event: BaseEvent) -> None:
        self.got.append(event)
        self.first.set()
        await self.gate.wait()

    async def aclose(self) -> None:
        return None


async def test_sink_lag_is_the_furthest_behind_sink(store: StateStore) -> None:
    log = EventLog(SID, store)
    await log.load()
    assert log.sink_lag() == 0  # no sinks
    slow = GatedSink()
    log.add_sink(slow)
    for _ in range(5):
        log.emit(TaskOutput(session_id=SID, task_id=TID, text="x", ordinal=1, lines=1))
    await log.flushed()
    await asyncio.wait_for(slow.first.wait(), 5)
    # The sink holds event 1 (its cursor is still 0): all five are undelivered.
    assert log.sink_lag() == 5
    slow.gate.set()
    async with asyncio.timeout(5):
        while log.sink_lag():  # the cursor moves right after each send returns
            await asyncio.sleep(0.01)
    assert len(slow.got) == 5
    await log.aclose()


# -- the Prometheus form ------------------------------------------------------------------


def test_collector_output_parses_with_every_name() -> None:
    stats = RuntimeStats()
    stats.event(started("default"))
    stats.event(started("default"))
    stats.event(stopped("exit", 0))
    stats.event(failed())
    stats.event(stalled())
    stats.output(1234)
    stats.first_byte("cold", 0.07)
    stats.first_byte("warm", 0.003)
    snap = stats.snapshot(
        tasks_running=1,
        sink_lag_events=7,
        engine_up=True,
        pool_ready={"default": 2, "dev": 0},
        sessions_open=3,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SupervisorCollector(lambda: snap))
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    for name in METRIC_NAMES:
        assert any(n == name or n.startswith(f"{name}_") for n in names), (name, text)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("sandvisor_tasks_running") == 1
    assert value("sandvisor_tasks_started_total", policy="default") == 2
    assert value("sandvisor_tasks_ended_total", reason="exit") == 1
    assert value("sandvisor_tasks_ended_total", reason="failed") == 1
    assert value("sandvisor_tasks_ended_total", reason="oom_killed") == 0
    assert value("sandvisor_stalls_total") == 1
    assert value("sandvisor_events_total", type="task.started") == 2
    assert value("sandvisor_output_bytes_total") == 1234
    assert value("sandvisor_sink_lag_events") == 7
    assert value("sandvisor_engine_up", state="up") == 1
    assert value("sandvisor_pool_ready", policy="default") == 2
    assert value("sandvisor_sessions_open") == 3
    assert value("sandvisor_task_start_seconds_count", path="cold") == 1
    assert value("sandvisor_task_start_seconds_bucket", path="cold", le="0.05") == 0
    assert value("sandvisor_task_start_seconds_bucket", path="cold", le="0.1") == 1
    assert value("sandvisor_task_start_seconds_bucket", path="warm", le="0.005") == 1
    assert value("sandvisor_task_start_seconds_bucket", path="warm", le="+Inf") == 1
    assert value("sandvisor_task_start_seconds_sum", path="warm") == pytest.approx(0.003)
