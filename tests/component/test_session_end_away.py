"""A session that ends while the engine is away (issue 29, point 4): wedged (kill, remove and
network removal taken, never answered) or down. The end finishes within its bounded time,
its tasks end as ``lost``, and what it could not remove is not forgotten: once the engine
answers, the tasks' containers, the session's own warm container and its network go. When
the supervisor is closed first, it leaves nothing running, and the next supervisor on the
same state dir removes them at its start. Nothing is orphaned."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Literal

import pytest

from supervisor import Session, Supervisor
from supervisor.core.labels import LABEL_SESSION
from supervisor.engine.fake import FakeContainer, FakeEngine, Out, Script, UntilKilled
from tests.component.conftest import bounded_supervisor, of_task, reconciling, stored_events

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]

Away = Literal["wedged", "down"]

#: Every engine call's deadline here: small, so a wedge costs the test little.
DEADLINE = 0.3
#: How long a session's end waits for its tasks beyond their grace (0.2 s).
END_TIMEOUT = 0.5
#: Room over the computed bound for the work around the calls on a loaded 2-core machine.
SLACK = 1.0
#: The longest a session end may take here: the grace and END_TIMEOUT for its tasks, then a
#: deadline each for its warm container's and its network's removal.
END_BOUND = 0.2 + END_TIMEOUT + 2 * DEADLINE + SLACK


Opener = Callable[[], AbstractAsyncContextManager[Supervisor]]


@pytest.fixture
def opened(engine: FakeEngine, tmp_path: Path, fake_policies: Path) -> Opener:
    """Opens a bounded supervisor on the test's one state dir (a second one: a restart)."""
    return lambda: bounded_supervisor(
        engine, tmp_path / "state", fake_policies, DEADLINE, end_timeout_s=END_TIMEOUT
    )


def of_session(engine: FakeEngine, session_id: str) -> list[FakeContainer]:
    """The containers the engine still has that name the session."""
    return [
        c
        for c in engine.containers
        if not c.gone and c.request.labels.get(LABEL_SESSION) == session_id
    ]


class Work:
    """A session with work to clean up: two tasks running (one on the session's network),
    a warm container of its own (on that network too)."""

    def __init__(self, ses: Session, task_ids: list[str]) -> None:
        self.ses = ses
        self.task_ids = task_ids
        self.network = ses.network_name("session")

    @classmethod
    async def make(cls, engine: FakeEngine, sup: Supervisor) -> Work:
        engine.script("hold", Script(Out("up\n"), UntilKilled()))
        ses = await sup.open_session("s1")
        assert await ses.prewarm("net-warm") == 1
        task_ids = []
        for policy in ("fake", "net-session"):
            task = await ses.start({"command": "hold", "policy": policy})
            await ses.wait_for(task.task_id, "^up$", timeout_s=10)
            task_ids.append(task.task_id)
        assert len(of_session(engine, "s1")) == 3
        assert ses.network_name("session") in engine.networks
        return cls(ses, task_ids)

    async def end_while_away(self, engine: FakeEngine, away: Away) -> Callable[[], None]:
        """End the session with the engine away; returns what brings it back."""
        if away == "wedged":
            release = engine.wedge("kill", "remove", "remove_network")
            back = release.set
        else:
            engine.go_down()
            back = engine.restore
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self.ses.end()
        took = loop.time() - began
        assert took < END_BOUND, took
        # What the end could not remove is still there.
        assert len(of_session(engine, "s1")) == 3
        assert self.network in engine.networks
        events = await stored_events(self.ses)
        for tid in self.task_ids:
            ends = of_task(events, tid, "task.stopped", "task.failed")
            assert len(ends) == 1, ends
            info = await self.ses.get(tid)
            assert (info.status, info.error_code) == ("failed", "lost")
            assert info.error is not None
            assert "removed once the engine is back" in info.error
        assert [e.type for e in events][-1] == "session.ended"
        return back

    def all_gone(self, engine: FakeEngine) -> bool:
        return not of_session(engine, "s1") and self.network not in engine.networks


@pytest.mark.parametrize("away", ["wedged", "down"])
async def test_what_a_session_end_could_not_remove_goes_once_the_engine_answers(
    engine: FakeEngine, opened: Opener, away: Away
) -> None:
    async with opened() as sup:
        work = await Work.make(engine, sup)
        back = await work.end_while_away(engine, away)
        assert sup.sessions() == []
        back()
        async with reconciling(sup), asyncio.timeout(20):
            await engine.changes.until(lambda: work.all_gone(engine))


def own_tasks(before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    """Tasks started since ``before`` and still pending, but the fake engine's containers."""
    return [
        t
        for t in asyncio.all_tasks()
        if t not in before and not t.done() and not t.get_name().startswith("fake-")
    ]


@pytest.mark.parametrize("away", ["wedged", "down"])
async def test_what_a_closed_supervisor_could_not_remove_goes_with_the_next_one(
    engine: FakeEngine, opened: Opener, away: Away
) -> None:
    before = set(asyncio.all_tasks())
    async with opened() as sup:
        work = await Work.make(engine, sup)
        back = await work.end_while_away(engine, away)
    # Closed while the engine is away: nothing of it keeps running (its work is the next
    # supervisor's, found by the labels), and what it could not remove is still there.
    assert own_tasks(before) == []
    back()
    assert len(of_session(engine, "s1")) == 3
    assert work.network in engine.networks
    async with opened() as again:
        # Its start's round removes them, before anything else runs.
        assert work.all_gone(engine)
        assert again.sessions() == []
