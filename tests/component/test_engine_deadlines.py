"""A wedged engine (issue 29) on the fake: create, start or remove never return. A start
fails within the deadline with engine_unresponsive, the session's other calls answer
meanwhile, a running task rides it out, and once the engine completes calls again the
state is exact: output, one terminal event per task, no container left behind. And the
watchdog: up, wedged (its canary hangs), down (refused), and a start refused at once while
wedged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from supervisor import MemorySink, Session, Supervisor
from supervisor.core.errors import EngineUnavailable, EngineUnresponsive
from supervisor.engine.fake import Exit, FakeEngine, Out, Script, WaitFor
from supervisor.runtime.task import stopper
from tests.component.conftest import (
    bounded_supervisor,
    container,
    of_task,
    removed,
    stored_events,
)

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]

#: Every engine call's deadline here: small, so a wedge costs the test little.
DEADLINE = 0.3
#: Room over the deadline for the work around the call on a loaded 2-core machine.
SLACK = 1.0


@pytest.fixture
async def bounded(
    engine: FakeEngine, tmp_path: Path, fake_policies: Path
) -> AsyncIterator[Supervisor]:
    async with bounded_supervisor(engine, tmp_path / "state", fake_policies, DEADLINE) as sup:
        yield sup


@pytest.fixture
async def ses(bounded: Supervisor, sink: MemorySink) -> Session:
    return await bounded.open_session("s1", sinks=[sink])


async def a_running_ticker(engine: FakeEngine, ses: Session) -> tuple[str, asyncio.Event]:
    """A task that printed its first line and goes on when the returned event is set."""
    go = asyncio.Event()
    engine.script("ticker", Script(Out("one\n"), WaitFor(go), Out("two\n"), Exit(0)))
    ticker = await ses.start({"command": "ticker", "policy": "fake"})
    await ses.wait_for(ticker.task_id, "one", timeout_s=5)
    return ticker.task_id, go


async def one_terminal_event_each(ses: Session, *task_ids: str) -> None:
    events = await stored_events(ses)
    for tid in task_ids:
        ends = of_task(events, tid, "task.stopped", "task.failed")
        assert len(ends) == 1, (tid, ends)


@pytest.mark.parametrize("method", ["create", "start"])
async def test_a_start_on_a_wedged_engine_fails_within_the_deadline(
    engine: FakeEngine, bounded: Supervisor, ses: Session, method: str
) -> None:
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    ticker, go = await a_running_ticker(engine, ses)
    release = engine.wedge(method)
    loop = asyncio.get_running_loop()
    began = loop.time()
    task = await ses.start({"command": "quick", "policy": "fake"})
    final = await ses.wait(task.task_id, timeout_s=10)
    took = loop.time() - began
    assert (final.status, final.error_code) == ("failed", "engine_unresponsive")
    assert final.error is not None
    assert f"within its {DEADLINE:g} s deadline" in final.error
    assert DEADLINE <= took < DEADLINE + SLACK, took
    # Meanwhile everything else answers: the list, the running task's output, metrics.
    listed = {t.task_id: t.status for t in await ses.list()}
    assert listed == {ticker: "running", task.task_id: "failed"}
    part = await ses.read_output(ticker, 0)
    assert part.data == b"one\n"
    assert bounded.metrics().tasks_running == 1

    release.set()  # the engine completes calls again
    go.set()
    done = await ses.wait(ticker, timeout_s=10)
    assert (done.status, done.exit_code) == ("completed", 0)
    assert (await ses.read_output(ticker, 0)).data == b"one\ntwo\n"
    # A kind that timed out counts as wedged for one deadline, unless a call of it
    # completes: starts are refused at once until then (see the watchdog test).
    await wait_state(bounded, "up")
    again = await ses.start({"command": "quick", "policy": "fake"})
    assert (await ses.wait(again.task_id, timeout_s=10)).exit_code == 0
    assert (await ses.read_output(again.task_id, 0)).data == b"hi\n"
    await one_terminal_event_each(ses, ticker, task.task_id, again.task_id)
    for tid in (ticker, again.task_id):
        assert await removed(engine, tid)
    if method == "start":
        # The failed task's container was created; it is removed, not left behind.
        c = container(engine, task.task_id)
        await engine.changes.until(lambda: c.removed)
    else:
        # A create cut off before the engine made anything: no container for it at all.
        assert all(c.name != f"sandvisor-{task.task_id}" for c in engine.containers)


async def test_a_wedged_remove_is_retried_until_the_engine_answers(
    engine: FakeEngine, ses: Session
) -> None:
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    release = engine.wedge("remove")
    task = await ses.start({"command": "quick", "policy": "fake"})
    final = await ses.wait(task.task_id, timeout_s=10)
    assert (final.status, final.exit_code) == ("completed", 0)
    c = container(engine, task.task_id)
    # A remove was taken and never completed: wait until the engine got a second one (the
    # first ran out of its deadline and the stopper tried again).
    await engine.changes.until(
        lambda: [m for m, t in engine.calls if t == c.id].count("remove") >= 2
    )
    assert not c.removed
    release.set()
    await engine.changes.until(lambda: c.removed)
    await one_terminal_event_each(ses, task.task_id)
    assert (await ses.read_output(task.task_id, 0)).data == b"hi\n"


async def test_a_create_the_engine_carries_out_after_its_deadline_is_reaped(
    engine: FakeEngine, bounded: Supervisor, ses: Session
) -> None:
    """Docker's create runs in a thread a deadline does not stop: a wedged engine may make
    the container after the task failed. No task knows it; the reconciler's next round
    removes it, with the session still open."""
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    release = engine.wedge("create")
    task = await ses.start({"command": "quick", "policy": "fake"})
    final = await ses.wait(task.task_id, timeout_s=10)
    assert (final.status, final.error_code) == ("failed", "engine_unresponsive")
    release.set()
    runner = ses.task_runner(task.task_id)
    async with asyncio.timeout(10):
        await runner.done.wait()
    engine.create(runner.request)  # what the engine did with the cut-off call
    c = container(engine, task.task_id)
    assert await bounded.reconciler.reap_unowned() == 1
    assert c.removed
    assert [t.task_id for t in await ses.list()] == [task.task_id]
    await one_terminal_event_each(ses, task.task_id)


async def test_a_removal_given_up_is_kept_trying_while_the_session_is_open(
    engine: FakeEngine,
    ses: Session,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stopper's retries run out while the engine stays wedged: the container is not
    forgotten (the reconciler leaves it alone: the session's task owns it); it goes once
    the engine answers, the session still open."""
    monkeypatch.setattr(stopper, "REMOVE_ATTEMPTS", 1)
    caplog.set_level(logging.INFO)
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    release = engine.wedge("remove")
    task = await ses.start({"command": "quick", "policy": "fake"})
    assert (await ses.wait(task.task_id, timeout_s=10)).exit_code == 0
    runner = ses.task_runner(task.task_id)
    async with asyncio.timeout(10):
        await runner.done.wait()  # its own attempts are over
    c = container(engine, task.task_id)
    assert not c.removed
    release.set()
    async with asyncio.timeout(10):
        await engine.changes.until(lambda: c.removed)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    await one_terminal_event_each(ses, task.task_id)


async def wait_state(sup: Supervisor, state: str) -> None:
    """Until the watchdog says ``state`` (it looks every second)."""
    while sup.engine_state != state:
        await asyncio.sleep(0.05)


async def test_the_watchdog_tells_up_wedged_and_down_apart(
    engine: FakeEngine, bounded: Supervisor, ses: Session
) -> None:
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    assert await bounded.checks.look(canary_s=DEADLINE) == "up"
    assert bounded.metrics().engine_state == "up"

    # The canary (a listing) hangs while the ping answers: wedged, not up.
    release = engine.wedge("list_labeled")
    assert await bounded.checks.look(canary_s=DEADLINE) == "wedged"
    assert not bounded.engine_ok
    snap = bounded.metrics()
    assert (snap.engine_state, snap.engine_up) == ("wedged", False)
    # A start now is refused at once: no call would complete.
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(EngineUnresponsive, match="the Docker engine is wedged") as refused:
        await ses.start({"command": "quick", "policy": "fake"})
    assert loop.time() - began < 0.1
    assert refused.value.retryable
    assert await ses.list() == []

    release.set()
    await wait_state(bounded, "up")
    task = await ses.start({"command": "quick", "policy": "fake"})
    assert (await ses.wait(task.task_id, timeout_s=10)).exit_code == 0

    engine.go_down()
    assert await bounded.checks.look(canary_s=DEADLINE) == "down"
    with pytest.raises(EngineUnavailable) as down:
        await ses.start({"command": "quick", "policy": "fake"})
    assert not isinstance(down.value, EngineUnresponsive)
    engine.restore()
    await wait_state(bounded, "up")
