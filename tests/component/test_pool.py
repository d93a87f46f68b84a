"""Warm starts on the fake engine: a pooled container takes the command on its stdin; what
a pooled container cannot honour (env, tighter limits) falls back to a cold start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor import PolicyError, Session, Supervisor, TaskSpec
from supervisor.engine.fake import Exit, FakeEngine, Out, ReadLine, Script, UntilKilled
from supervisor.state.store import StateStore
from tests.component.conftest import container, removed, stored_events, types_of

pytestmark = [pytest.mark.component, pytest.mark.timeout(15)]


def warm(command: str, **fields: object) -> TaskSpec:
    return TaskSpec.model_validate({"command": command, "policy": "warm", **fields})


def pooled(engine: FakeEngine) -> list[str]:
    """Names of the live pooled containers (the pool's shell loop as their command)."""
    return [
        c.name
        for c in engine.containers
        if not c.gone and c.request.labels.get("io.sandvisor.kind") == "pooled"
    ]


async def test_warm_start_delivers_the_command_over_stdin(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("greet", Script(Out("hello\n"), ReadLine(echo=True), Exit(4)))
    assert await session.prewarm("warm") == 2
    ready = pooled(engine)
    assert len(ready) == 2
    creates = sum(1 for method, _ in engine.calls if method == "create")
    task = await session.start(warm("greet"))
    # The task took a pooled container: its name, no create of its own.
    assert f"sandvisor-{task.task_id}" in ready
    await session.wait_for(task.task_id, "^hello$", timeout_s=5)
    await session.send_input(task.task_id, "typed\n")
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.reason, final.exit_code) == ("failed", "exit", 4)
    assert Path(final.output_path).read_bytes() == b"hello\ntyped\n"
    c = container(engine, task.task_id)
    # The command, the pool's sentinel line, then the task's own input, on one pipe.
    head, sentinel, rest = bytes(c.stdin).split(b"\n", 2)
    assert head == b"greet"
    assert sentinel.startswith(b"sandvisor-start-")
    assert rest == b"typed\n"
    assert c.request.command[:2] == ["/bin/sh", "-c"]
    assert "read -r l" in c.request.command[2]
    assert [m for m, target in engine.calls if target in (c.id, c.name)].count("start") == 1
    assert await removed(engine, task.task_id)
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
    # The pool refills behind the task (in the background, a moment later).
    await engine.changes.until(lambda: len(pooled(engine)) == 2)
    assert sum(1 for method, _ in engine.calls if method == "create") == creates + 1


async def test_warm_task_with_closed_stdin_gets_eof_after_the_command(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("reader", Script(ReadLine(echo=True), Out("eof\n"), Exit(0)))
    await session.prewarm("warm")
    task = await session.start(warm("reader", stdin="closed"))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    assert Path(final.output_path).read_bytes() == b"eof\n"
    assert container(engine, task.task_id).stdin_closed


async def test_limits_fall_back_to_a_cold_start(engine: FakeEngine, session: Session) -> None:
    """Limits are decided when a container is created: a warm one cannot take them."""
    engine.script("greet", Script(Out("cold\n"), Exit(0)))
    await session.prewarm("warm")
    ready = pooled(engine)
    task = await session.start(warm("greet", limits={"memory_mb": 64}))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    assert Path(final.output_path).read_bytes() == b"cold\n"
    c = container(engine, task.task_id)
    assert c.name not in ready
    assert c.request.command == ["/bin/sh", "-c", "exec 2>&1; greet"]
    assert c.request.memory_bytes == 64 * 1024 * 1024
    assert pooled(engine) == ready  # the pool was left alone


async def test_env_travels_to_a_warm_container_over_stdin(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("greet", Script(Out("warm\n"), Exit(0)))
    await session.prewarm("warm")
    ready = pooled(engine)
    value = 'it\'s "quoted"\nand two lines'
    task = await session.start(warm("greet", env={"GREETING": "hi", "ODD": value}))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    c = container(engine, task.task_id)
    assert c.name in ready  # a warm start
    assert c.exported == {"GREETING": "hi", "ODD": value}


async def test_the_shared_pool_outlives_a_session_and_goes_with_the_supervisor(
    engine: FakeEngine, sup: Supervisor, session: Session
) -> None:
    with pytest.raises(PolicyError, match="warm_pool_max = 0"):
        await session.prewarm("fake")
    engine.script("serve", Script(UntilKilled()))
    await session.prewarm("warm")
    task = await session.start(warm("serve"))
    # The task's container (made for the pool) and the two ready again after the refill.
    await engine.changes.until(lambda: len(pooled(engine)) == 3)
    await session.end()
    info = await session.get(task.task_id)
    assert (info.status, info.reason) == ("killed", "session_ended")
    # The task's container went with the session; the shared pool's wait for the next one.
    assert container(engine, task.task_id).removed
    assert len(pooled(engine)) == 2
    other = await sup.open_session("next")
    taken = await other.start(warm("serve"))
    assert container(engine, taken.task_id).name in {c.name for c in engine.containers}
    await other.end()
    await sup.aclose()
    assert all(c.removed for c in engine.containers)


async def test_a_warm_start_asks_the_engine_nothing_before_it_answers(
    engine: FakeEngine, session: Session
) -> None:
    """The warm container's live attach connection shows the engine answers: no ping on the
    start's path. A cold start still pings first (a clear EngineUnavailable)."""
    engine.script("greet", Script(Out("hi\n"), Exit(0)))
    await session.prewarm("warm")
    before = len(engine.calls)
    ready = pooled(engine)
    task = await session.start(warm("greet"))
    assert f"sandvisor-{task.task_id}" in ready
    assert [m for m, _ in engine.calls[before:] if m == "alive"] == []
    await session.wait(task.task_id, timeout_s=5)
    before = len(engine.calls)
    cold = await session.start(warm("greet", limits={"memory_mb": 64}))
    assert [m for m, _ in engine.calls[before:]][:1] == ["alive"]
    await session.wait(cold.task_id, timeout_s=5)


async def test_a_ready_container_whose_connection_ended_is_skipped_and_removed(
    engine: FakeEngine, session: Session
) -> None:
    """A warm container that exited (or lost its engine connection) while it waited is never
    handed a command: the start takes the next one, and the dead one is removed."""
    engine.script("greet", Script(Out("hi\n"), Exit(0)))
    await session.prewarm("warm")
    first, second = pooled(engine)
    engine.container(first).drop_streams()
    task = await session.start(warm("greet"))
    assert f"sandvisor-{task.task_id}" == second
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, Path(final.output_path).read_bytes()) == ("completed", b"hi\n")
    await engine.changes.until(lambda: engine.container(first).removed)
    # All of them dead: a cold start, never a failed task.
    await engine.changes.until(lambda: len(pooled(engine)) == 2)
    for name in pooled(engine):
        engine.container(name).drop_streams()
    cold = await session.start(warm("greet"))
    assert f"sandvisor-{cold.task_id}" not in pooled(engine)
    final = await session.wait(cold.task_id, timeout_s=5)
    assert (final.status, Path(final.output_path).read_bytes()) == ("completed", b"hi\n")


async def test_a_container_being_bound_is_never_reaped(
    engine: FakeEngine, sup: Supervisor, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between taking a warm container and registering its task, the first record is being
    written: the reconciler, running right then, must count the container as owned."""
    engine.script("greet", Script(Out("hi\n"), Exit(0)))
    await session.prewarm("warm")
    writing = asyncio.Event()
    release = asyncio.Event()
    real = StateStore.put_task

    async def slow_put(store: StateStore, task_id: str, *args: str) -> None:
        if not writing.is_set():  # the first record of the start below
            writing.set()
            await release.wait()
        await real(store, task_id, *args)

    monkeypatch.setattr(StateStore, "put_task", slow_put)
    start = asyncio.create_task(session.start(warm("greet")))
    await writing.wait()
    assert await sup.reconciler.reap_unowned() == 0
    assert not any(c.removed for c in engine.containers)
    release.set()
    task = await start
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, Path(final.output_path).read_bytes()) == ("completed", b"hi\n")
