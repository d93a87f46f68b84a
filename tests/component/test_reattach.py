"""Re-attach on the fake engine: a dropped attach connection loses and repeats nothing (the
log's part from before the live stream is read with the container paused, then thawed);
the whole-log fallback; a container a crash left paused is thawed on re-adoption."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor import Session, TaskOutput, TaskSpec
from supervisor.core.events import BaseEvent
from supervisor.core.resync import COPIER_CHUNK
from supervisor.engine.fake import Exit, FakeContainer, FakeEngine, Out, Script, WaitFor
from supervisor.runtime.task.reattach import Reattacher
from tests.component.conftest import (
    Runtime,
    calls_for,
    container,
    of_task,
    removed,
    stored_events,
    types_of,
)

pytestmark = [pytest.mark.component, pytest.mark.timeout(20)]


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix}{i}\n" for i in range(n))


def ordinals(events: list[BaseEvent], task_id: str) -> list[int]:
    out: list[int] = []
    for e in of_task(events, task_id, "task.output"):
        assert isinstance(e, TaskOutput)
        out += range(e.ordinal - e.lines + 1, e.ordinal + 1)
    return out


@pytest.fixture
def whole_log_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the re-attach's fallback (reading the whole log with the container paused)."""
    seen: list[str] = []
    original = Reattacher._store_whole_log

    async def spy(self: Reattacher, cid: str, *args: object, **kwargs: object) -> int:
        seen.append(cid)
        return await original(self, cid, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Reattacher, "_store_whole_log", spy)
    return seen


@pytest.mark.parametrize(
    "read",
    ["by-time", "by-time-longer-tail", "whole-log"],
)
async def test_dropped_attach_is_resumed_with_the_pause(
    engine: FakeEngine, session: Session, whole_log_reads: list[str], read: str
) -> None:
    """The connection drops; while the re-attach's live attach is held up, the command
    prints more (only the log has it). ``by-time``: the paused read finds it by message
    times (``longer-tail``: the bulk read's last time is shared by more messages than the
    first tail holds, so a longer tail is read); ``whole-log``: stderr in the log (two
    streams' times interleave) makes the re-attach read the whole log instead."""
    g1, g2 = asyncio.Event(), asyncio.Event()
    # Each Out is one write: its lines reach the log with one time.
    last = {
        "by-time": (Out("a-last\nready\n"),),
        "by-time-longer-tail": (Out(lines("a", 100) + "ready\n"),),
        "whole-log": (Out(lines("e", 3), stream=2), Out("ready\n")),
    }[read]
    engine.script(
        "printer",
        Script(
            Out(lines("a", 100)),
            *last,
            WaitFor(g1),
            Out(lines("b", 50)),
            WaitFor(g2),
            Out(lines("c", 50) + "no newline"),
            Exit(0),
        ),
    )
    task = await session.start(TaskSpec(command="printer", policy="fake", kind="monitor"))
    await session.wait_for(task.task_id, "^ready$", timeout_s=5)
    c = container(engine, task.task_id)
    mark = len(engine.calls)
    release = engine.hang_next("attach")
    engine.drop_attach(c.id)
    # The re-attach has read the log's bulk and now waits for its live attach.
    await engine.changes.until(lambda: "attach" in calls_for(engine, c.id, mark))
    assert "logs" in calls_for(engine, c.id, mark)
    g1.set()
    await engine.changes.until(lambda: c.at == WaitFor(g2))
    release.set()
    await engine.changes.until(lambda: "unpause" in calls_for(engine, c.id, mark))
    assert c.status == "running"
    g2.set()
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    expected = c.written()
    assert expected.endswith(b"c49\nno newline")
    assert Path(final.output_path).read_bytes() == expected
    calls = calls_for(engine, c.id, mark)
    assert calls.count("pause") == calls.count("unpause") == 1
    paused, thawed = calls.index("pause"), calls.index("unpause")
    assert calls.index("attach") < paused < thawed
    assert "logs" in calls[paused:thawed]  # the log's new part, read while paused
    assert whole_log_reads == ([c.id] if read == "whole-log" else [])
    # Monitor lines continue through the re-attach: each stdout line exactly once.
    events = await stored_events(session)
    stdout_lines = b"".join(bytes(p) for k, p in c.output if k == 1).count(b"\n") + 1
    if read != "whole-log":
        assert ordinals(events, task.task_id) == list(range(1, stdout_lines + 1))
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]


def drop_after(monkeypatch: pytest.MonkeyPatch, marker: bytes) -> None:
    """The attach connection drops right after ``marker`` is written, before the client
    read it (it is lost from the stream; the log has it)."""
    emit: Callable[[FakeContainer, int, bytes], None] = FakeContainer.emit

    def emit_then_drop(self: FakeContainer, stream: int, data: bytes) -> None:
        emit(self, stream, data)
        if data == marker:
            self.drop_streams(lose_unread=True)

    monkeypatch.setattr(FakeContainer, "emit", emit_then_drop)


async def test_output_in_flight_when_the_connection_drops_comes_from_the_log(
    engine: FakeEngine, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = asyncio.Event()
    drop_after(monkeypatch, b"in flight\n")
    done = asyncio.Event()
    engine.script(
        "p",
        Script(
            Out("before\n"),
            WaitFor(go),
            Out("in flight\n"),
            Out("after\n"),
            WaitFor(done),
            Out("end\n"),
            Exit(0),
        ),
    )
    task = await session.start(TaskSpec(command="p", policy="fake"))
    await session.wait_for(task.task_id, "^before$", timeout_s=5)
    go.set()
    await session.wait_for(task.task_id, "^after$", timeout_s=5)
    done.set()
    final = await session.wait(task.task_id, timeout_s=5)
    assert final.exit_code == 0
    assert Path(final.output_path).read_bytes() == b"before\nin flight\nafter\nend\n"


@pytest.mark.parametrize("when", ["in-flight", "after-the-drop"])
async def test_last_words_when_the_connection_drops_come_from_the_log(
    engine: FakeEngine, session: Session, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The command's last output does not reach the client: lost in flight with the
    connection (``in-flight``), or printed after the connection dropped and before the
    supervisor looked at the container again (``after-the-drop``); then it exits."""
    go = asyncio.Event()
    if when == "in-flight":
        drop_after(monkeypatch, b"last words\n")
    engine.script("p", Script(Out("before\n"), WaitFor(go), Out("last words\n"), Exit(0)))
    task = await session.start(TaskSpec(command="p", policy="fake"))
    await session.wait_for(task.task_id, "^before$", timeout_s=5)
    c = container(engine, task.task_id)
    if when == "after-the-drop":
        mark = len(engine.calls)
        held = engine.hang_next("inspect")
        engine.drop_attach(c.id)
        await engine.changes.until(lambda: "inspect" in calls_for(engine, c.id, mark))
        go.set()
        await engine.changes.until(lambda: c.status == "exited")
        held.set()
    else:
        go.set()
    final = await session.wait(task.task_id, timeout_s=5)
    assert final.exit_code == 0
    assert Path(final.output_path).read_bytes() == b"before\nlast words\n"


@pytest.mark.parametrize(
    "where",
    [
        "inside-a-piece",
        "across-pieces",
    ],
)
async def test_a_utf8_character_at_the_logs_16k_cut_is_not_repeated(
    engine: FakeEngine, session: Session, where: str
) -> None:
    go = asyncio.Event()
    before = COPIER_CHUNK - 1 if where == "across-pieces" else COPIER_CHUNK - 10
    line = b"y" * before + "\u00e9".encode() + b"z\n"  # a 2-byte character
    engine.script("p", Script(Out(line), Out("ready\n"), WaitFor(go), Out("after\n"), Exit(0)))
    task = await session.start(TaskSpec(command="p", policy="fake"))
    await session.wait_for(task.task_id, "^ready$", timeout_s=5)
    c = container(engine, task.task_id)
    mark = len(engine.calls)
    engine.drop_attach(c.id)
    await engine.changes.until(lambda: "unpause" in calls_for(engine, c.id, mark))
    go.set()
    final = await session.wait(task.task_id, timeout_s=5)
    assert Path(final.output_path).read_bytes() == line + b"ready\nafter\n"


async def test_a_container_left_paused_by_a_crash_is_thawed_on_readoption(
    runtime: Runtime, engine: FakeEngine
) -> None:
    go = asyncio.Event()
    engine.script("p", Script(Out("one\n"), WaitFor(go), Out("two\n"), Exit(0)))
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    task = await session.start(TaskSpec(command="p", policy="fake"))
    await session.wait_for(task.task_id, "^one$", timeout_s=5)
    await runtime.release(sup)
    c = container(engine, task.task_id)
    # A supervisor killed at the re-attach's pause left the container frozen.
    await engine.backend().pause(c.id)
    go.set()  # (it prints "two" only once thawed)
    mark = len(engine.calls)
    sup2 = await runtime.supervisor()
    session2 = sup2.session("s1")
    final = await session2.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    assert Path(final.output_path).read_bytes() == b"one\ntwo\n"
    calls = calls_for(engine, c.id, mark)
    # Thawed first (before the re-attach's own pause and thaw).
    assert calls.index("unpause") < calls.index("pause") if "pause" in calls else "unpause" in calls
    assert await removed(engine, task.task_id)
    events = await stored_events(session2)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
