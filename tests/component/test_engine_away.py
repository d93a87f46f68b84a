"""The engine goes away at each engine call of a task's life (issue 29, point 3): down (every
call refused, the attach streams cut) or wedged (the call taken and never answered, cut off
by its deadline); or it answers that one call with an error. No runner crashes; once the
engine answers again, everything resumes: the output is exact, each task has one terminal
event, its container is removed, and the warm pool is full of live containers again. Which calls a task makes is not written down by hand
only: the census test runs the lives and checks they make exactly the calls tested here."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest

from supervisor import Session, Supervisor, TaskInfo
from supervisor.core.errors import EngineError, EngineUnavailable
from supervisor.engine.fake import (
    ExecFromStdin,
    Exit,
    FakeContainer,
    FakeEngine,
    Out,
    Script,
    UntilKilled,
    WaitFor,
)
from supervisor.runtime import pool
from supervisor.runtime.aio import first_of
from tests.component.conftest import bounded_supervisor, of_task, stored_events, types_of

pytestmark = [pytest.mark.component, pytest.mark.timeout(30)]

StartPath = Literal["cold", "warm"]
#: How the engine fails the call: ``error``, it answers that one call with an EngineError
#: (say a 500) and goes on as before.
Mode = Literal["down", "wedged", "error"]

#: Every engine call's deadline here: small, so a wedge costs the test little.
DEADLINE = 0.3
#: The cold task's image: its own, so its start checks it (the pool's check of its image is
#: cached) and the check is one of its calls.
COLD_IMAGE = "sandvisor/cold:latest"
COLD_POLICY = f"""
description = "component tests: no warm pool, an image of its own"
image = "{COLD_IMAGE}"
working_dir = "/tmp"
[timeouts]
grace_s = 0.2
[watch]
stall_detection = false
"""
#: The engine calls of one task's life, from the session's start to its container's removal,
#: by start path: cold (checks, create, attach, start) or warm (a pooled container takes the
#: command on its stdin). test_these_are_the_calls_of_a_task_life checks the lists.
CALLS: dict[StartPath, tuple[str, ...]] = {
    "cold": (
        *("alive", "image_id", "create", "attach", "start"),
        *("wait", "inspect", "logs", "kill", "remove"),
    ),
    "warm": ("wait", "inspect", "logs", "kill", "remove"),
}
#: Calls before the command runs: the engine away there fails the task (it never ran).
UNSTARTED = ("image_id", "create", "attach", "start")
#: The error a start that never reached the engine fails with, by how the engine is away.
UNSTARTED_CODE: dict[Mode, str] = {
    "down": "engine_unavailable",
    "wedged": "engine_unresponsive",
    "error": "engine_error",
}
_lives = itertools.count()
CASES = [(path, method) for path, methods in CALLS.items() for method in methods]


@pytest.fixture
async def sup(
    engine: FakeEngine, tmp_path: Path, fake_policies: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Supervisor]:
    # The pool looks after its ready containers every 20 ms here (every second otherwise):
    # the tests wait for it after each outage.
    monkeypatch.setattr(pool, "CHECK_S", 0.02)
    (fake_policies / "cold.toml").write_text(COLD_POLICY)
    async with bounded_supervisor(engine, tmp_path / "state", fake_policies, DEADLINE) as sup:
        yield sup


@pytest.fixture
async def ses(sup: Supervisor) -> Session:
    ses = await sup.open_session("s1")
    assert await ses.prewarm("warm") == 2
    return ses


class Life:
    """One task: it prints ``one``, waits for the test, prints ``two``, then exits 0 (or,
    ``stopped``, runs until the test stops it). ``exit_seen_first``: the engine's answer to
    the wait for its exit is held until released, so its output is seen to end first
    (then the runner asks the engine about it: ``inspect``)."""

    def __init__(
        self, engine: FakeEngine, path: StartPath, *, stopped: bool, exit_seen_first: bool
    ) -> None:
        self.engine = engine
        self.path = path
        self.stopped = stopped
        self.go = asyncio.Event()
        end = UntilKilled() if stopped else Exit(0)
        # A command of its own: the engine's first matching script wins.
        self.command = f"life {next(_lives)}"
        engine.script(self.command, Script(Out("one\n"), WaitFor(self.go), Out("two\n"), end))
        self.exit_held = engine.hang_next("wait") if exit_seen_first else None

    @property
    def spec(self) -> dict[str, str]:
        return {"command": self.command, "policy": self.path}

    async def live(self, ses: Session, task_id: str) -> TaskInfo:
        """The test's side of the life, to its end."""
        await ses.wait_for(task_id, "^one$", timeout_s=10)
        self.go.set()
        if self.stopped:
            await ses.wait_for(task_id, "^two$", timeout_s=10)
            return await ses.stop(task_id)
        return await ses.wait(task_id, timeout_s=10)

    def release(self) -> None:
        if self.exit_held is not None:
            self.exit_held.set()


def life_for(engine: FakeEngine, path: StartPath, method: str) -> Life:
    """The life in which a task surely makes the call ``method``."""
    return Life(engine, path, stopped=method == "kill", exit_seen_first=method == "inspect")


class Away:
    """The engine away from the next call of ``method`` until the task has met it again,
    or ended meanwhile; then back. Down: that call and every one after it are refused,
    until another call on the same container. Wedged: calls of ``method`` are held (and
    cut off by their deadline) until that call is made again; a wait (no deadline) until
    the command exited. Error: only that call fails."""

    def __init__(self, engine: FakeEngine, method: str, mode: Mode) -> None:
        self.engine = engine
        self.method = method
        self.mode = mode
        self.mark = len(engine.calls)
        self._release: asyncio.Event | None = None
        self._down: asyncio.Event | None = None
        if mode == "down":
            self._down = engine.go_down_at(method)
        elif mode == "wedged":
            self._release = engine.wedge(method)
        else:
            engine.fail_next(method, EngineError(f"{method}: 500 Server Error (injected)"))
        #: The call the engine went away at: (method, container id or name).
        self.call: tuple[str, str] | None = None

    def _first(self) -> int | None:
        calls = self.engine.calls
        return next((i for i in range(self.mark, len(calls)) if calls[i][0] == self.method), None)

    async def until_met(self, ended: asyncio.Event) -> None:
        engine = self.engine
        await engine.changes.until(lambda: self._first() is not None)
        at = self._first()
        assert at is not None
        self.call = engine.calls[at]
        assert self._down is None or self._down.is_set()
        if self.mode == "error":
            return
        # The task's end counts only when it came after the call (a removal follows it).
        end = None if ended.is_set() else ended.wait()
        target = self.call[1]
        down = self._down is not None

        def met() -> bool:
            if not down and self.method == "wait":
                # No deadline, so never made again: held until the command has exited.
                c = engine.find(target)
                return c is not None and not c.running
            later = engine.calls[at + 1 :]
            return any(t == target and (down or m == self.method) for m, t in later)

        waits = [engine.changes.until(met)] + ([end] if end is not None else [])
        await first_of(*waits, timeout=10)
        assert met() or (end is not None and ended.is_set()), "the engine was not met away"
        self.back()

    def back(self) -> None:
        if self._release is not None:
            self._release.set()
        elif self._down is not None:
            self.engine.restore()


def warm_ready(engine: FakeEngine) -> list[FakeContainer]:
    """Pooled containers alive and waiting for a command."""
    return [
        c
        for c in engine.containers
        if c.request.labels.get("io.sandvisor.kind") == "pooled"
        and c.running
        and not c.stdin_closed
        and isinstance(c.at, ExecFromStdin)
    ]


async def all_well_again(engine: FakeEngine, sup: Supervisor, ses: Session) -> None:
    """The warm pool holds two live containers again, and no other container is left."""
    async with asyncio.timeout(10):
        await engine.changes.until(lambda: len(warm_ready(engine)) == 2)
        await engine.changes.until(
            lambda: (
                {c.id for c in engine.containers if not c.gone}
                == {c.id for c in warm_ready(engine)}
            )
        )
    assert sup.pools.ready() == {"warm": 2}
    for runner in [ses.task_runner(t.task_id) for t in await ses.list()]:
        async with asyncio.timeout(10):
            await runner.done.wait()


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing crashed or was given up (runner_crashed, remove_gave_up, ... are errors)."""
    bad = [
        r.msg
        for r in caplog.records
        if r.name.startswith("supervisor") and r.levelno >= logging.ERROR
    ]
    assert bad == []


@pytest.mark.parametrize("mode", ["down", "wedged", "error"])
@pytest.mark.parametrize(("path", "method"), CASES)
async def test_the_engine_away_at_a_call_of_a_task(
    engine: FakeEngine,
    sup: Supervisor,
    ses: Session,
    caplog: pytest.LogCaptureFixture,
    path: StartPath,
    method: str,
    mode: Mode,
) -> None:
    caplog.set_level(logging.INFO)
    life = life_for(engine, path, method)
    away = Away(engine, method, mode)
    try:
        if method == "alive" and mode == "down":
            # Asked before a cold start: the start is refused, no task is made.
            with pytest.raises(EngineUnavailable):
                await ses.start(life.spec)
            assert ("alive", "") in engine.calls[away.mark :]
            assert await ses.list() == []
            away.back()
            life.release()
            task = await ses.start(life.spec)
            final = await life.live(ses, task.task_id)
        elif method == "alive":
            # Only the ping fails (late on a loaded machine, or an error answer): the
            # canary, a container listing, completes, so the start goes on.
            task = await ses.start(life.spec)
            assert ("alive", "") in engine.calls[away.mark :]
            assert ("list_labeled", "io.sandvisor.canary") in engine.calls[away.mark :]
            away.back()
            life.release()
            final = await life.live(ses, task.task_id)
        else:
            task = await ses.start(life.spec)
            runner = ses.task_runner(task.task_id)
            outage = asyncio.create_task(away.until_met(runner.final))
            try:
                if path == "cold" and method in UNSTARTED:
                    final = await ses.wait(task.task_id, timeout_s=10)
                else:
                    living = asyncio.create_task(life.live(ses, task.task_id))
                    await outage
                    life.release()
                    final = await living
            finally:
                await outage
            assert away.call is not None
            assert away.call[1] in (
                runner.container_id,
                f"sandvisor-{task.task_id}",
                "",
                COLD_IMAGE,
            )
    finally:
        away.back()
        life.release()

    tid = task.task_id
    data = (await ses.read_output(tid, 0)).data
    events = await stored_events(ses)
    if path == "cold" and method in UNSTARTED:
        assert (final.status, final.error_code) == ("failed", UNSTARTED_CODE[mode])
        assert data == b""
        assert types_of(events, tid) == ["task.failed"]
    else:
        expected = ("killed", "user_stopped", 137) if life.stopped else ("completed", "exit", 0)
        assert (final.status, final.reason, final.exit_code) == expected
        assert data == b"one\ntwo\n"
        assert types_of(events, tid) == ["task.started", "task.stopped"]
    assert len(of_task(events, tid, "task.stopped", "task.failed")) == 1
    await all_well_again(engine, sup, ses)
    no_errors_logged(caplog)


def task_calls(engine: FakeEngine, since: int, container_id: str | None, name: str) -> set[str]:
    """The calls a task made: on its container, and the checks before its create."""
    mine = {container_id, name, "", COLD_IMAGE}
    return {m for m, target in engine.calls[since:] if target in mine}


@pytest.mark.parametrize("path", ["cold", "warm"])
async def test_these_are_the_calls_of_a_task_life(
    engine: FakeEngine, sup: Supervisor, path: StartPath
) -> None:
    """Each life the tests above use, on a well engine: together their calls are exactly
    the ones tested (a new engine call in a task's life fails this until it is tested)."""
    ses = await sup.open_session("census")
    seen: set[str] = set()
    for stopped, exit_seen_first in ((False, False), (True, False), (False, True)):
        assert await ses.prewarm("warm") == 2
        life = Life(engine, path, stopped=stopped, exit_seen_first=exit_seen_first)
        seen |= await calls_of(engine, ses, life)
    assert seen == set(CALLS[path])


async def calls_of(engine: FakeEngine, ses: Session, life: Life) -> set[str]:
    """The calls a task makes in ``life``, on a well engine."""
    since = len(engine.calls)
    task = await ses.start(life.spec)
    living = asyncio.create_task(life.live(ses, task.task_id))
    if life.exit_held is not None:
        await engine.changes.until(lambda: "inspect" in [m for m, _ in engine.calls[since:]])
        life.release()
    await living
    runner = ses.task_runner(task.task_id)
    await runner.done.wait()
    return task_calls(engine, since, runner.container_id, f"sandvisor-{task.task_id}")
