"""Sessions on the fake engine: the running-task cap under parallel starts, stall watching
through the heuristic (the fake is not a local engine), ending a session, and engine
outages with and without live-restore."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor import (
    EngineUnavailable,
    LimitExceeded,
    MemorySink,
    Session,
    SessionEnded,
    SessionEndedEvent,
    Supervisor,
    TaskInfo,
    TaskSpec,
    TaskStalled,
    TaskStopped,
)
from supervisor.engine.fake import (
    Exit,
    FakeEngine,
    LoopClock,
    Out,
    ReadLine,
    Script,
    UntilKilled,
    WaitFor,
)
from tests.component.conftest import (
    Runtime,
    called,
    container,
    is_event,
    of_task,
    removed,
    stored_events,
    types_of,
)

pytestmark = [pytest.mark.component, pytest.mark.timeout(20)]


def spec(command: str, policy: str = "fake", **fields: object) -> TaskSpec:
    return TaskSpec.model_validate({"command": command, "policy": policy, **fields})


async def starts(session: Session, n: int, policy: str) -> tuple[list[TaskInfo], list[Exception]]:
    """``n`` starts at once: the accepted tasks and the refusals."""
    results = await asyncio.gather(
        *(session.start(spec("serve", policy)) for _ in range(n)), return_exceptions=True
    )
    accepted = [r for r in results if isinstance(r, TaskInfo)]
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(accepted) + len(refused) == n
    return accepted, refused


async def test_parallel_starts_respect_the_cap_counted_over_the_session(
    engine: FakeEngine, sup: Supervisor, session: Session
) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    # 3 running under a policy allowing 8 ...
    first = [await session.start(spec("serve", "roomy")) for _ in range(3)]
    # ... count against a policy allowing 5: of 100 parallel starts exactly 2 get in.
    capped, refused = await starts(session, 100, "capped")
    assert len(capped) == 2
    assert all(isinstance(r, LimitExceeded) for r in refused)
    assert "session.max_running_tasks = 5 in policy 'capped'" in str(refused[0])
    # And the other way round: 5 running, the roomy policy lets 3 more in.
    roomy, refused = await starts(session, 100, "roomy")
    assert len(roomy) == 3
    assert all(isinstance(r, LimitExceeded) for r in refused)
    accepted = first + capped + roomy
    assert len({t.task_id for t in accepted}) == 8
    # All or nothing: a refused start left no container, record or event behind.
    await engine.changes.until(lambda: sum(c.running for c in engine.containers) == 8)
    assert len(engine.containers) == 8
    assert {c.request.labels["io.sandvisor.task"] for c in engine.containers} == {
        t.task_id for t in accepted
    }
    assert len(await sup.store.tasks("s1")) == 8
    assert len(await session.list()) == 8
    events = await stored_events(session)
    assert {e.task_id for e in events} == {t.task_id for t in accepted}
    # A slot frees when a task ends.
    await session.stop(capped[0].task_id)
    with pytest.raises(LimitExceeded):
        await session.start(spec("serve", "capped"))
    extra = await session.start(spec("serve", "roomy"))
    assert extra.status == "starting"


async def test_a_prompt_waiting_for_input_stalls_once_per_episode(
    engine: FakeEngine, sup: Supervisor, session: Session, sink: MemorySink
) -> None:
    engine.script(
        "setup",
        Script(
            Out("Continue? [y/N] "),
            ReadLine(),
            Out("ok\n"),
            Out("Name: "),
            ReadLine(),
            Out("bye\n"),
            Exit(0),
        ),
    )
    task = await session.start(spec("setup", "stall"))
    tid = task.task_id
    first = await sink.wait_for(is_event(tid, "task.stalled"))
    assert isinstance(first, TaskStalled)
    assert first.signal == "heuristic"  # the fake is not a local engine: no /proc to read
    assert first.last_output.endswith("Continue? [y/N] ")
    assert first.waiting_ms >= 490  # stall_after_s, in truncated ms
    assert (await session.get(tid)).stalled
    assert sup.stall_watcher is not None
    assert sup.stall_watcher.signal_for(tid) == "heuristic"
    await session.send_input(tid, "y\n")
    assert not (await session.get(tid)).stalled  # input ends the episode
    second = await sink.wait_for(lambda e: is_event(tid, "task.stalled")(e) and e.seq > first.seq)
    assert isinstance(second, TaskStalled)
    assert second.last_output.endswith("Name: ")
    await session.send_input(tid, "me\n")
    final = await session.wait(tid, timeout_s=5)
    assert (final.status, final.exit_code, final.stalled) == ("completed", 0, False)
    assert Path(final.output_path).read_bytes() == b"Continue? [y/N] ok\nName: bye\n"
    events = await stored_events(session)
    assert types_of(events, tid) == [
        "task.started",
        "task.stalled",
        "task.stalled",
        "task.stopped",
    ]
    assert sup.stall_watcher.signal_for(tid) is None  # unregistered at the end


async def test_closed_stdin_never_stalls(
    engine: FakeEngine, sup: Supervisor, session: Session
) -> None:
    engine.script("ask", Script(Out("Continue? [y/N] "), UntilKilled()))
    task = await session.start(spec("ask", "stall", stdin="closed"))
    await session.wait_output(task.task_id, 0, timeout_s=5)
    assert sup.stall_watcher is not None
    assert sup.stall_watcher.signal_for(task.task_id) is None
    await session.stop(task.task_id)
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]


async def test_session_end_stops_everything_once_and_removes_containers(
    engine: FakeEngine, sup: Supervisor, session: Session, sink: MemorySink
) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    engine.script("stubborn", Script(Out("up\n"), UntilKilled(), ignore_sigterm=True))
    engine.script("quick", Script(Out("done\n"), Exit(0)))
    serve = await session.start(spec("serve"))
    stubborn = await session.start(spec("stubborn"))
    monitor = await session.start(spec("serve", kind="monitor"))
    quick = await session.start(spec("quick"))
    await session.wait(quick.task_id, timeout_s=5)
    for t in (serve, stubborn, monitor):
        await session.wait_for(t.task_id, "^up$", timeout_s=5)
    # One more is still being created when the session ends: it never runs.
    held = engine.hang_next("create")
    starting = await session.start(spec("serve"))
    await called(engine, "create", f"sandvisor-{starting.task_id}")
    ending = asyncio.ensure_future(session.end())
    await engine.changes.until(lambda: "SIGTERM" in container(engine, serve.task_id).signals)
    held.set()
    await ending
    await session.end()  # idempotent
    assert session.ended
    with pytest.raises(SessionEnded):
        await session.start(spec("serve"))

    events = await stored_events(session)
    assert isinstance(events[-1], SessionEndedEvent)
    assert events[-1].tasks_stopped == 4
    for t in (serve, stubborn, monitor):
        assert types_of(events, t.task_id) == ["task.started", "task.stopped"]
        (stopped,) = of_task(events, t.task_id, "task.stopped")
        assert isinstance(stopped, TaskStopped)
        assert stopped.reason == "session_ended"
    assert types_of(events, quick.task_id) == ["task.started", "task.stopped"]
    assert types_of(events, starting.task_id) == ["task.stopped"]
    info = await session.get(starting.task_id)
    assert (info.status, info.reason, info.exit_code) == ("killed", "session_ended", None)
    assert container(engine, starting.task_id).signals == []  # created, never started
    assert container(engine, stubborn.task_id).signals == ["SIGTERM", "SIGKILL"]
    assert container(engine, serve.task_id).signals == ["SIGTERM"]
    assert all(c.removed for c in engine.containers)
    # The sink got everything, session.ended last, and was closed.
    received = [e async for e in sink]
    assert received[-1].type == "session.ended"
    assert [e.seq for e in received] == [e.seq for e in events]
    assert "s1" not in [s.session_id for s in sup.sessions()]


# -- engine outages ------------------------------------------------------------------------


async def test_engine_outage_with_live_restore_loses_nothing(
    engine: FakeEngine, session: Session
) -> None:
    during, after = asyncio.Event(), asyncio.Event()
    engine.script(
        "p",
        Script(
            Out("before\n"),
            WaitFor(during),
            Out("during\n"),
            WaitFor(after),
            Out("after\n"),
            Exit(0),
        ),
    )
    task = await session.start(spec("p"))
    await session.wait_for(task.task_id, "^before$", timeout_s=5)
    c = container(engine, task.task_id)
    engine.go_down()
    during.set()  # printed while the engine is away: only its log has it
    await engine.changes.until(lambda: c.at == WaitFor(after))
    with pytest.raises(EngineUnavailable):
        await session.start(spec("p"))
    assert (await session.get(task.task_id)).status == "running"
    engine.restore()
    after.set()
    final = await session.wait(task.task_id, timeout_s=10)
    assert (final.status, final.reason, final.exit_code) == ("completed", "exit", 0)
    assert Path(final.output_path).read_bytes() == b"before\nduring\nafter\n"
    assert await removed(engine, task.task_id)
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]


async def test_a_deadline_passing_while_the_engine_is_down_fires_when_it_is_back(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    task = await session.start(spec("serve", timeout_ms=300))
    await session.wait_for(task.task_id, "^up$", timeout_s=5)
    engine.go_down()
    runner = session.task_runner(task.task_id)
    assert runner.container_id is not None
    await called(engine, "kill", runner.container_id)
    assert (await session.get(task.task_id)).status == "stopping"
    engine.restore()
    final = await session.wait(task.task_id, timeout_s=10)
    assert (final.status, final.reason) == ("killed", "timeout")
    # SIGTERM was refused while the engine was away; the kill went on until it took.
    assert container(engine, task.task_id).signals in (["SIGTERM"], ["SIGKILL"])
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]


@pytest.mark.parametrize("kill", ["during-the-outage", "by-go_down"])
async def test_engine_restart_without_live_restore_ends_tasks_as_lost(
    tmp_path: Path, fake_policies: Path, kill: str
) -> None:
    """``by-go_down``: the fake's own model of such a restart; ``during-the-outage``: the
    same order of things by hand (the engine goes away, then its containers die)."""
    async with FakeEngine(clock=LoopClock(), live_restore=False) as engine:
        runtime = Runtime(engine, tmp_path / "state", fake_policies)
        try:
            sup = await runtime.supervisor()
            assert sup.live_restore is False
            session = await sup.open_session("s1")
            engine.script("serve", Script(Out("up\n"), UntilKilled()))
            task = await session.start(spec("serve"))
            await session.wait_for(task.task_id, "^up$", timeout_s=5)
            c = container(engine, task.task_id)
            mark = len(engine.calls)
            # (By hand: go_down() leaves the containers alone; they die below.)
            engine.live_restore = kill == "during-the-outage"
            engine.go_down()
            # The supervisor saw the engine gone (a wait failed and was tried again).
            async with asyncio.timeout(1.5):
                await called(engine, "wait", c.id, since=mark)
            if kill == "during-the-outage":
                c.deliver("SIGKILL")  # the engine's restart without live-restore
            assert c.signals == ["SIGKILL"]
            engine.restore()
            final = await session.wait(task.task_id, timeout_s=10)
            assert (final.status, final.reason) == ("failed", "lost")
            assert final.error is not None
            assert "without live-restore" in final.error
            assert Path(final.output_path).read_bytes() == b"up\n"
            assert await removed(engine, task.task_id)
            events = await stored_events(session)
            assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
            (stopped,) = of_task(events, task.task_id, "task.stopped")
            assert isinstance(stopped, TaskStopped)
            assert stopped.reason == "lost"
        finally:
            engine.restore()
            await runtime.aclose()
