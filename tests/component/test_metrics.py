"""The supervisor's metrics on the fake engine: what the runtime counts (starts by policy,
ends by reason, output bytes, cold and warm first bytes) and the gauges read at snapshot
time (running tasks, sessions, warm pools, sink lag, engine)."""

from __future__ import annotations

import pytest

from supervisor import MemorySink, Session, Supervisor, TaskSpec
from supervisor.core.errors import EngineUnavailable, ImageMissing
from supervisor.engine.fake import Exit, FakeEngine, Out, Script, UntilKilled

pytestmark = [pytest.mark.component, pytest.mark.timeout(15)]


async def test_counters_follow_the_tasks(
    engine: FakeEngine, sup: Supervisor, session: Session, sink: MemorySink
) -> None:
    engine.script("hello", Script(Out("hello\n"), Out("world\n"), Exit(0)))
    engine.script("fail3", Script(Out("oops\n"), Exit(3)))
    engine.script("serve", Script(UntilKilled()))
    engine.script("quiet", Script(Exit(0)))
    before = sup.metrics()
    assert before.sessions_open == 1
    assert before.engine_up
    assert before.task_start_seconds["cold"].count == 0

    hello = await session.start(TaskSpec(command="hello", policy="fake"))
    fail3 = await session.start(TaskSpec(command="fail3", policy="fake"))
    quiet = await session.start(TaskSpec(command="quiet", policy="fake"))
    serve = await session.start(TaskSpec(command="serve", policy="fake"))
    for task in (hello, fail3, quiet):
        await session.wait(task.task_id, timeout_s=5)
    await sink.wait_for(lambda e: e.task_id == serve.task_id and e.type == "task.started")
    running = sup.metrics()
    assert running.tasks_running == 1
    await session.stop(serve.task_id)
    engine.fail_next("create", ImageMissing("no such image"))
    broken = await session.start(TaskSpec(command="hello", policy="fake"))
    final = await session.wait(broken.task_id, timeout_s=5)
    assert final.status == "failed"

    m = sup.metrics()
    assert m.tasks_running == 0
    assert m.tasks_started["fake"] == 4
    assert m.tasks_started["warm"] == 0  # every policy shows, from 0
    assert m.tasks_ended["exit"] == 3
    assert m.tasks_ended["user_stopped"] == 1
    assert m.tasks_ended["failed"] == 1
    assert m.output_bytes == len(b"hello\nworld\noops\n")
    # Only the tasks that printed something have a first byte; all started cold.
    assert m.task_start_seconds["cold"].count == 2
    assert m.task_start_seconds["warm"].count == 0
    assert m.events["task.started"] == 4
    assert m.events["task.stopped"] == 4
    assert m.events["task.failed"] == 1
    assert m.stalls == 0


async def test_warm_starts_are_timed_apart(engine: FakeEngine, sup: Supervisor) -> None:
    engine.script("greet", Script(Out("hi\n"), Exit(0)))
    session = await sup.open_session("warm-metrics")
    assert await session.prewarm("warm") == 2
    ready = sup.metrics().pool_ready
    assert ready["warm"] == 2
    # Every pooled policy shows, at 0 before its first pool is made.
    assert ready["dev"] == 0
    assert "fake" not in ready  # warm_pool_max = 0: never pooled
    task = await session.start(TaskSpec(command="greet", policy="warm"))
    await session.wait(task.task_id, timeout_s=5)
    m = sup.metrics()
    assert m.task_start_seconds["warm"].count == 1
    assert m.task_start_seconds["cold"].count == 0
    assert m.task_start_seconds["warm"].total < 5
    await session.end()
    m = sup.metrics()
    assert m.sessions_open == 0
    assert m.events["session.ended"] == 1


async def test_engine_down_shows(engine: FakeEngine, sup: Supervisor) -> None:
    assert sup.metrics().engine_up
    engine.go_down()
    with pytest.raises(EngineUnavailable):
        await sup.ensure_engine()
    assert not sup.metrics().engine_up
    engine.restore()
    await sup.ensure_engine()
    assert sup.metrics().engine_up
