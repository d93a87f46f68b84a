"""Polls, monitor line events, wait-for-pattern and idle timeouts against the real engine."""

from __future__ import annotations

import asyncio
import re

import pytest

from supervisor import (
    MemorySink,
    SpecError,
    Supervisor,
    TaskNotRunning,
    TaskSpec,
    WaitTimeout,
    render_xml,
)
from supervisor.core.events import BaseEvent, TaskOutput, TaskOutputSuppressed, TaskPoll

pytestmark = pytest.mark.timeout(120)


def of(sink: MemorySink, task_id: str, kind: str) -> list[BaseEvent]:
    return [e for e in sink.events if e.task_id == task_id and e.type == kind]


async def terminal_seq(sink: MemorySink, task_id: str) -> int:
    """Seq of the task's terminal event, once the sink has it (delivery is asynchronous)."""
    ev = await sink.wait_for(
        lambda e: e.task_id == task_id and e.type in ("task.stopped", "task.failed")
    )
    return ev.seq


# -- polls --------------------------------------------------------------------------------


async def test_polls_carry_the_latest_tail(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("polls", sinks=[sink])
    info = await session.start(
        TaskSpec(
            command="i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo line$i; sleep 0.1; done",
            policy="fast",
            poll_every_s=1,
            poll_tail_chars=30,
        )
    )
    final = await session.wait(info.task_id, timeout_s=60)
    assert final.status == "completed"
    with open(final.output_path) as fh:
        output = fh.read()
    polls = [e for e in of(sink, info.task_id, "task.poll") if isinstance(e, TaskPoll)]
    assert len(polls) >= 2
    last_numbers = []
    for p in polls:
        assert 0 < len(p.tail) <= 30
        assert p.tail in output
        assert p.new_bytes > 0
        assert p.running_ms >= 900
        last_numbers.append(int(re.findall(r"line(\d+)", p.tail)[-1]))
        xml = render_xml(p)
        assert xml is not None
        assert xml.startswith(f'<background_task_poll taskId="{info.task_id}" command="')
        assert "<log_tail>" in xml
    assert last_numbers == sorted(last_numbers)
    assert last_numbers[-1] > last_numbers[0]
    end = await terminal_seq(sink, info.task_id)
    assert all(p.seq < end for p in polls)


async def test_silent_task_gets_no_polls_unless_asked(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("silent", sinks=[sink])
    quiet = await session.start(TaskSpec(command="sleep 3", policy="fast", poll_every_s=1))
    always = await session.start(
        TaskSpec(command="sleep 3", policy="fast", poll_every_s=1, poll_only_on_change=False)
    )
    await session.wait(quiet.task_id, timeout_s=30)
    await session.wait(always.task_id, timeout_s=30)
    await terminal_seq(sink, quiet.task_id)
    await terminal_seq(sink, always.task_id)
    assert of(sink, quiet.task_id, "task.poll") == []
    unchanged = of(sink, always.task_id, "task.poll")
    assert len(unchanged) >= 1
    assert all(p.new_bytes == 0 for p in unchanged if isinstance(p, TaskPoll))


async def test_no_poll_after_stop_or_session_end(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("pollstop", sinks=[sink])
    a = await session.start(
        TaskSpec(command="while true; do echo x; sleep 0.1; done", policy="fast", poll_every_s=1)
    )
    b = await session.start(
        TaskSpec(command="while true; do echo y; sleep 0.1; done", policy="fast", poll_every_s=1)
    )
    await sink.wait_for(lambda e: e.type == "task.poll" and e.task_id == a.task_id)
    await session.stop(a.task_id)
    await sink.wait_for(lambda e: e.type == "task.poll" and e.task_id == b.task_id)
    await session.end()
    for tid in (a.task_id, b.task_id):
        end = await terminal_seq(sink, tid)
        assert all(e.seq < end for e in of(sink, tid, "task.poll"))


# -- monitors -----------------------------------------------------------------------------

WRITER = r"""
import sys, time
w = sys.stdout.write
f = sys.stdout.flush
w("partial "); f(); time.sleep(0.3); w("line one\n"); f()
w("a\nb\nc"); f(); time.sleep(0.3); w("d\n"); f()
for i in range(1500):
    w(f"burst {i}\n")
f()
time.sleep(0.3)
w("x" * (1024 * 1024) + "\n"); f()
w("\u00e9\u00e8 unicode \U0001f600\n"); f()
time.sleep(0.3)
w("no newline at the end"); f()
"""


async def test_monitor_chunks_rebuild_stdout_exactly(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("monitor", sinks=[sink])
    info = await session.start(
        TaskSpec(command=f"python3 -c '{WRITER}'", kind="monitor", description="writer")
    )
    active = await session.list(kind="monitor", active_only=True)
    assert [t.task_id for t in active] == [info.task_id]
    final = await session.wait(info.task_id, timeout_s=60)
    assert final.status == "completed"
    assert await session.list(kind="monitor", active_only=True) == []
    end = await terminal_seq(sink, info.task_id)
    with open(final.output_path, "rb") as fh:
        stdout = fh.read()
    chunks = [e for e in of(sink, info.task_id, "task.output") if isinstance(e, TaskOutput)]
    assert not of(sink, info.task_id, "task.output_suppressed")
    rebuilt = "".join(c.text + ("\n" if c.eol else "") for c in chunks)
    assert rebuilt.encode() == stdout
    ordinals = [c.ordinal for c in chunks]
    assert ordinals == sorted(set(ordinals))
    assert all(len(c.text.encode()) <= 256 * 1024 for c in chunks)
    assert any(c.cut for c in chunks)  # the 1 MiB line came in pieces
    assert chunks[-1].text.endswith("no newline at the end")
    assert not chunks[-1].eol
    assert chunks[0].text.startswith("partial line one")
    assert all(c.seq < end for c in chunks)


async def test_monitor_flood_is_suppressed_explicitly(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("flood", sinks=[sink])
    info = await session.start(TaskSpec(command="seq 1 100000", kind="monitor", policy="fast"))
    final = await session.wait(info.task_id, timeout_s=60)
    assert final.status == "completed"
    await terminal_seq(sink, info.task_id)
    with open(final.output_path, "rb") as fh:
        assert fh.read() == "".join(f"{i}\n" for i in range(1, 100_001)).encode()
    seen: list[int] = []
    for e in sink.events:
        if e.task_id != info.task_id:
            continue
        if isinstance(e, TaskOutput):
            n = len(e.text.split("\n"))
            seen += range(e.ordinal - n + 1, e.ordinal + 1)
            assert e.text.split("\n") == [str(i) for i in range(e.ordinal - n + 1, e.ordinal + 1)]
        elif isinstance(e, TaskOutputSuppressed):
            assert e.lines == e.last_ordinal - e.first_ordinal + 1
            seen += range(e.first_ordinal, e.last_ordinal + 1)
    # Every line is accounted for exactly once: delivered or explicitly suppressed.
    assert seen == list(range(1, 100_001))
    assert of(sink, info.task_id, "task.output_suppressed")


# -- wait_for -----------------------------------------------------------------------------


async def test_wait_for_finds_earlier_and_later_lines(sup: Supervisor) -> None:
    session = await sup.open_session("waitfor")
    info = await session.start(
        TaskSpec(
            command="echo booting; echo 'server ready on :3000'; sleep 1; echo late-line; sleep 60",
            policy="fast",
        )
    )
    await session.wait_for(info.task_id, "late-line", timeout_s=30)
    earlier = await session.wait_for(info.task_id, r"ready on :(\d+)", timeout_s=5)
    assert earlier.line == "server ready on :3000"
    with open(info.output_path, "rb") as fh:
        data = fh.read()
    assert data[earlier.offset : earlier.offset + len(earlier.line)] == earlier.line.encode()
    later = await session.start(TaskSpec(command="sleep 1; echo done-now; sleep 60", policy="fast"))
    match = await session.wait_for(later.task_id, "^done-now$", timeout_s=30)
    assert match.offset == 0
    with pytest.raises(WaitTimeout):
        await session.wait_for(info.task_id, "never printed", timeout_s=0.5)
    with pytest.raises(SpecError, match="pattern"):
        await session.wait_for(info.task_id, "([unclosed", timeout_s=1)
    await session.end()


async def test_wait_for_reports_a_task_that_ended_without_the_line(sup: Supervisor) -> None:
    session = await sup.open_session("waitfor-ended")
    info = await session.start(TaskSpec(command="echo nope; exit 3", policy="fast"))
    with pytest.raises(TaskNotRunning) as err:
        await session.wait_for(info.task_id, "ready", timeout_s=30)
    assert err.value.info.exit_code == 3
    assert "exit code 3" in str(err.value)


async def test_wait_for_sees_a_final_line_without_newline(sup: Supervisor) -> None:
    session = await sup.open_session("waitfor-partial")
    info = await session.start(TaskSpec(command="printf 'ready'", policy="fast"))
    match = await session.wait_for(info.task_id, "^ready$", timeout_s=30)
    assert match.line == "ready"


# -- idle timeout -------------------------------------------------------------------------


async def test_idle_timeout_stops_a_silent_task(sup: Supervisor) -> None:
    session = await sup.open_session("idle")
    silent = await session.start(
        TaskSpec(command="echo hi; sleep 100", policy="fast", idle_timeout_ms=1000)
    )
    chatty = await session.start(
        TaskSpec(
            command="for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 0.3; done",
            policy="fast",
            idle_timeout_ms=1000,
        )
    )
    s, c = await asyncio.gather(
        session.wait(silent.task_id, timeout_s=30), session.wait(chatty.task_id, timeout_s=30)
    )
    assert s.reason == "idle_timeout"
    assert s.status == "killed"
    assert c.reason == "exit"
    assert c.exit_code == 0
