"""Re-adoption on the fake engine: a supervisor stops without stopping its tasks (as the
daemon does), a new one opens the same state dir with a new client of the same engine, and
every task goes on from the stage it had reached, with exactly one terminal event each.

Crash-like states come from holding one engine call of a task (``hang_next``) while the
first supervisor lets go, and, where a kill -9 would leave the store behind the engine,
from rewriting the stored record (``StateStore``) before the second one opens."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor import BaseEvent, MemorySink, Supervisor, TaskOutput, TaskSpec, TaskStopped
from supervisor.core.task_state import TaskRecord
from supervisor.engine.fake import Exit, FakeEngine, Out, Script, WaitFor
from supervisor.state.store import StateStore
from tests.component.conftest import (
    Runtime,
    called,
    calls_for,
    container,
    of_task,
    removed,
    stored_events,
    types_of,
)

pytestmark = [pytest.mark.component, pytest.mark.timeout(20)]


def spec(command: str, **fields: object) -> TaskSpec:
    return TaskSpec.model_validate({"command": command, "policy": "fake", **fields})


async def stored_record(sup: Supervisor, task_id: str) -> tuple[str, TaskRecord]:
    for tid, _, stage, raw in await sup.store.tasks("s1"):
        if tid == task_id:
            return stage, TaskRecord.model_validate_json(raw)
    raise KeyError(task_id)


async def rewrite_records(state_dir: Path, records: dict[str, tuple[str, TaskRecord]]) -> None:
    """Put task records back as a crash would have left them (the supervisor is closed)."""
    store = StateStore(state_dir / "state.db")
    await store.open()
    try:
        for task_id, (stage, record) in records.items():
            await store.put_task(task_id, "s1", stage, record.model_dump_json())
    finally:
        await store.close()


async def held_at(engine: FakeEngine, task_id: str, method: str) -> str:
    """Wait until the task's container got to ``method`` (held there by ``hang_next``)."""
    name = f"sandvisor-{task_id}"
    if method == "create":
        await called(engine, "create", name)
        return name
    await engine.changes.until(lambda: engine.find(name) is not None)
    cid = container(engine, task_id).id
    await called(engine, method, cid)
    return cid


async def test_readoption_at_every_stage(runtime: Runtime, engine: FakeEngine) -> None:
    c_more, c_end, d_end, e_end = (asyncio.Event() for _ in range(4))
    engine.script("intent", Script(Out("A\n"), Exit(0)))
    engine.script("created", Script(Out("B\n"), Exit(0)))
    engine.script("unrecorded", Script(Out("F\n"), Exit(0)))
    engine.script(
        "running",
        Script(Out("C1\n"), WaitFor(c_more), Out("C2\n"), WaitFor(c_end), Out("C3\n"), Exit(0)),
    )
    engine.script("exits-while-down", Script(Out("D1\n"), WaitFor(d_end), Out("D2\n"), Exit(5)))
    engine.script("ended", Script(Out("E\n"), WaitFor(e_end), Exit(0)))

    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    # A: accepted (intent stored); the supervisor goes before the container exists.
    engine.hang_next("create")
    a = await session.start(spec("intent"))
    await held_at(engine, a.task_id, "create")
    # B: created (and recorded), never started.
    engine.hang_next("attach")
    b = await session.start(spec("created"))
    b_cid = await held_at(engine, b.task_id, "attach")
    # F: created, but the crash came before the record said so (found by its labels).
    engine.hang_next("attach")
    f = await session.start(spec("unrecorded"))
    await held_at(engine, f.task_id, "attach")
    # C: running; D: running, exits while no supervisor is there.
    c = await session.start(spec("running"))
    d = await session.start(spec("exits-while-down"))
    await session.wait_for(c.task_id, "^C1$", timeout_s=5)
    await session.wait_for(d.task_id, "^D1$", timeout_s=5)
    # E: its terminal event is stored, but the crash came before its record said ended
    # and before its container was removed.
    e = await session.start(spec("ended"))
    await session.wait_for(e.task_id, "^E$", timeout_s=5)
    e_running = await stored_record(sup, e.task_id)
    assert e_running[0] == "running"
    held_remove = engine.hang_next("remove")
    e_end.set()
    e_final = await session.wait(e.task_id, timeout_s=5)
    await held_at(engine, e.task_id, "remove")
    f_stage, f_record = await stored_record(sup, f.task_id)
    assert (await stored_record(sup, a.task_id))[0] == "intent"
    assert (f_stage, (await stored_record(sup, b.task_id))[0]) == ("created", "created")

    await runtime.release(sup)
    # While no supervisor runs: C prints (only the log has it), D prints and exits.
    c_more.set()
    d_end.set()
    c_box, d_box = container(engine, c.task_id), container(engine, d.task_id)
    await engine.changes.until(lambda: c_box.at == WaitFor(c_end) and d_box.status == "exited")
    unrecorded = f_record.model_copy(
        update={
            "stage": "intent",
            "container_id": None,
            "info": f_record.info.model_copy(update={"container_id": None}),
        }
    )
    await rewrite_records(
        runtime.state_dir, {e.task_id: e_running, f.task_id: ("intent", unrecorded)}
    )
    mark = len(engine.calls)

    sup2 = await runtime.supervisor()
    session2 = sup2.session("s1")
    finals = {t.task_id: await session2.wait(t.task_id, timeout_s=5) for t in (a, b, f, d, e)}
    await session2.wait_for(c.task_id, "^C2$", timeout_s=5)
    c_end.set()
    finals[c.task_id] = await session2.wait(c.task_id, timeout_s=5)

    expected = {
        a.task_id: (b"A\n", "completed", 0),
        b.task_id: (b"B\n", "completed", 0),
        f.task_id: (b"F\n", "completed", 0),
        c.task_id: (b"C1\nC2\nC3\n", "completed", 0),
        d.task_id: (b"D1\nD2\n", "failed", 5),
        e.task_id: (b"E\n", "completed", 0),
    }
    events = await stored_events(session2)
    for task_id, (output, status, code) in expected.items():
        final = finals[task_id]
        assert (final.status, final.reason, final.exit_code) == (status, "exit", code), task_id
        assert Path(final.output_path).read_bytes() == output, task_id
        assert types_of(events, task_id) == ["task.started", "task.stopped"], task_id
        (stopped,) = of_task(events, task_id, "task.stopped")
        assert isinstance(stopped, TaskStopped)
        assert (stopped.exit_code, stopped.output_bytes) == (code, len(output)), task_id
        # One container per task, never a second one, removed at the end.
        assert [x.name for x in engine.containers].count(f"sandvisor-{task_id}") == 1, task_id
        assert await removed(engine, task_id)
    # A got its container only now; B and F were started, not created again.
    assert ("create", f"sandvisor-{a.task_id}") in engine.calls[mark:]
    assert calls_for(engine, b_cid, mark)[-1] == "remove"
    for task_id in (b.task_id, f.task_id):
        calls = calls_for(engine, container(engine, task_id).id, mark)
        assert calls.index("attach") < calls.index("start"), task_id
    # E's outcome is the one stored before the crash; the new supervisor removed its
    # container (the first one's removal is still held).
    assert finals[e.task_id].running_ms == e_final.running_ms
    assert calls_for(engine, container(engine, e.task_id).id, mark)[-1] == "remove"
    held_remove.set()


async def test_a_task_whose_record_says_ended_keeps_no_container(
    runtime: Runtime, engine: FakeEngine
) -> None:
    """The crash came after the record said ended, before the container was removed."""
    engine.script("quick", Script(Out("done\n"), Exit(0)))
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    held_remove = engine.hang_next("remove")
    task = await session.start(spec("quick"))
    await held_at(engine, task.task_id, "remove")
    assert (await stored_record(sup, task.task_id))[0] == "ended"
    await runtime.release(sup)
    sup2 = await runtime.supervisor()
    session2 = sup2.session("s1")
    final = await session2.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    await session2.end()
    gone = container(engine, task.task_id).removed
    held_remove.set()  # (the first supervisor's held call, only after the look)
    # "Ending a session stops and removes all of its containers" (DESIGN.md).
    assert gone, "the ended task's container outlived its session's end"


async def test_session_end_after_a_restart_stops_readopted_tasks(
    runtime: Runtime, engine: FakeEngine
) -> None:
    engine.script("serve", Script(Out("up\n"), WaitFor(asyncio.Event())))
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    tasks = [await session.start(spec("serve")) for _ in range(3)]
    for t in tasks:
        await session.wait_for(t.task_id, "^up$", timeout_s=5)
    mark = len(engine.calls)
    sup2 = await runtime.restart(sup)
    session2 = sup2.session("s1")
    for t in tasks:
        cid = container(engine, t.task_id).id
        # Re-attached and waiting for the exit again.
        await called(engine, "wait", cid, since=mark)
    await session2.end()
    events = await stored_events(session2)
    for t in tasks:
        assert types_of(events, t.task_id) == ["task.started", "task.stopped"]
        info = await session2.get(t.task_id)
        assert (info.status, info.reason, info.exit_code) == ("killed", "session_ended", 143)
        assert container(engine, t.task_id).removed
        assert container(engine, t.task_id).signals == ["SIGTERM"]
    assert events[-1].type == "session.ended"


# -- monitor resume marks ----------------------------------------------------------------


def lose_last_event(state_dir: Path, session_id: str, task_id: str) -> int:
    """What a kill -9 leaves when the task's last event was emitted but never stored: the
    row is not there (its seq stays reserved). Returns that seq."""
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        (seq,) = conn.execute(
            "SELECT MAX(seq) FROM events WHERE session_id=? AND task_id=?", (session_id, task_id)
        ).fetchone()
        with conn:
            conn.execute("DELETE FROM events WHERE session_id=? AND seq=?", (session_id, seq))
        return int(seq)
    finally:
        conn.close()


def line_event(ordinal: int) -> Callable[[BaseEvent], bool]:
    """Matches the ``task.output`` event whose last line has this ordinal."""
    return lambda e: isinstance(e, TaskOutput) and e.ordinal == ordinal


def line_ordinals(events: list[BaseEvent], task_id: str) -> list[int]:
    out: list[int] = []
    for e in events:
        if isinstance(e, TaskOutput) and e.task_id == task_id:
            out += range(e.ordinal - e.lines + 1, e.ordinal + 1)
    return out


async def test_monitor_lines_resume_with_no_gap_and_no_repeat(
    runtime: Runtime, engine: FakeEngine
) -> None:
    gates = [asyncio.Event() for _ in range(3)]
    engine.script(
        "tail -f",
        Script(
            Out("l1\n"),
            WaitFor(gates[0]),
            Out("l2\n"),
            WaitFor(gates[1]),
            Out("l3\n"),
            WaitFor(gates[2]),
            Out("l4\n"),
            Out("partial"),
            Exit(0),
        ),
    )
    sink = MemorySink()
    sup = await runtime.supervisor()
    session = await sup.open_session("s1", sinks=[sink])
    task = await session.start(spec("tail -f", kind="monitor"))
    tid = task.task_id
    for ordinal in (1, 2, 3):
        await sink.wait_for(line_event(ordinal))
        if ordinal < 3:
            gates[ordinal - 1].set()
    stage, record = await stored_record(sup, tid)
    assert stage == "running"
    await runtime.release(sup)
    # The crash: the record's last checkpoint was after l1; l2's event was stored, l3's
    # was emitted but never stored.
    capture = record.capture.model_copy(update={"monitor_ordinal": 1, "monitor_offset": 3})
    await rewrite_records(
        runtime.state_dir, {tid: ("running", record.model_copy(update={"capture": capture}))}
    )
    lost_seq = lose_last_event(runtime.state_dir, "s1", tid)

    sup2 = await runtime.supervisor()
    session2 = sup2.session("s1")
    sink2 = MemorySink()
    session2.add_sink(sink2, after_seq=0)
    resent = await sink2.wait_for(line_event(3))
    assert resent.seq > lost_seq  # sent again, with a new seq: the lost one is never reused
    gates[2].set()
    final = await session2.wait(tid, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    data = Path(final.output_path).read_bytes()
    assert data == b"l1\nl2\nl3\nl4\npartial"
    events = await stored_events(session2)
    # l2 was read again from the file but not sent again (its event was stored).
    assert line_ordinals(events, tid) == [1, 2, 3, 4, 5]
    outputs = [e for e in events if isinstance(e, TaskOutput) and e.task_id == tid]
    rebuilt = "".join(e.text + ("\n" if e.eol else "") for e in outputs)
    assert rebuilt.encode() == data
    assert types_of(events, tid) == ["task.started", "task.stopped"]


@pytest.mark.parametrize("method", ["attach", "inspect"])
async def test_an_engine_away_during_readoption_is_waited_out(
    runtime: Runtime, engine: FakeEngine, method: str
) -> None:
    go = asyncio.Event()
    engine.script("tick", Script(Out("A\n"), WaitFor(go), Out("B\n"), Exit(0)))
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    task = await session.start(spec("tick"))
    await session.wait_for(task.task_id, "^A$", timeout_s=5)
    await runtime.release(sup)
    # The engine goes away just as the new supervisor re-attaches (attach), or asks how
    # the container is (inspect): the task rides it out as a running task would.
    went = engine.go_down_at(method)
    sup2 = await runtime.supervisor()
    await asyncio.wait_for(went.wait(), 5)
    engine.restore()
    go.set()
    session2 = sup2.session("s1")
    final = await session2.wait(task.task_id, timeout_s=10)
    assert (final.status, final.exit_code, final.error_code) == ("completed", 0, None), final
    assert (await session2.read_output(task.task_id, 0)).data == b"A\nB\n"
    events = await stored_events(session2)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
