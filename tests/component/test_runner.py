"""One task's life on the fake engine: cold start, exit, timeouts, stops and their
escalation, stdin."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from supervisor import (
    MemorySink,
    Session,
    SpecError,
    StdinClosed,
    TaskNotRunning,
    TaskSpec,
    TaskStopped,
)
from supervisor.core.container import ContainerRequest
from supervisor.core.errors import InputNotRead
from supervisor.engine.fake import (
    Exit,
    FakeAttach,
    FakeEngine,
    Out,
    ReadEOF,
    ReadLine,
    Script,
    UntilKilled,
    WaitFor,
)
from supervisor.runtime.task.stdin import MAX_INPUT_BYTES
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

pytestmark = [pytest.mark.component, pytest.mark.timeout(15)]


def spec(command: str, **fields: object) -> TaskSpec:
    return TaskSpec.model_validate({"command": command, "policy": "fake", **fields})


async def test_cold_start_runs_captures_and_removes(
    engine: FakeEngine, session: Session, sink: MemorySink
) -> None:
    engine.script(
        "make",
        Script(Out("building\n"), Out(b"warn: \xff\n", stream=2), Out("done, no newline"), Exit(3)),
    )
    task = await session.start(spec("make", description="build"))
    assert task.status == "starting"
    assert Path(task.output_path).parent.name == "tasks"
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.reason, final.exit_code) == ("failed", "exit", 3)
    data = b"building\nwarn: \xff\ndone, no newline"
    assert Path(final.output_path).read_bytes() == data
    assert final.output_bytes == len(data)
    c = container(engine, task.task_id)
    assert await removed(engine, task.task_id)
    assert c.request.command == ["/bin/sh", "-c", "exec 2>&1; make"]
    assert c.request.labels["io.sandvisor.task"] == task.task_id
    # A cold start: create, attach (before the start, so no byte is missed), start.
    methods = [m for m, target in engine.calls if target in (c.id, c.name)]
    assert methods[:3] == ["create", "attach", "start"]
    assert methods[-1] == "remove"
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
    stopped = of_task(events, task.task_id, "task.stopped")[0]
    assert isinstance(stopped, TaskStopped)
    assert (stopped.reason, stopped.exit_code, stopped.output_bytes, stopped.description) == (
        "exit",
        3,
        len(data),
        "build",
    )
    # The sink got the same events, in the same order.
    await sink.wait_for(is_event(task.task_id, "task.stopped"))
    assert [e.seq for e in sink.events if e.task_id == task.task_id] == [
        e.seq for e in of_task(events, task.task_id)
    ]
    with pytest.raises(TaskNotRunning) as err:
        await session.stop(task.task_id)
    assert err.value.info.exit_code == 3


async def test_missing_image_gives_one_task_failed(runtime: Runtime) -> None:
    runtime.engine.images = {"sandvisor/debian:latest"}
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    task = await session.start(spec("true"))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.error_code) == ("failed", "image_missing")
    assert runtime.engine.containers == []
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.failed"]


async def test_missing_image_is_never_pulled_and_names_the_build_command(
    runtime: Runtime,
) -> None:
    runtime.engine.images = set()
    runtime.engine.registry = {"sandvisor/minimal:latest"}  # a registry that would have it
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    task = await session.start(spec("true"))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.error_code) == ("failed", "image_missing")
    assert "'sandvisor/minimal:latest'" in (final.error or "")
    assert "`sandvisor images build minimal`" in (final.error or "")
    assert [c for c in runtime.engine.calls if c[0] == "pull_image"] == []


def pulling_policy(runtime: Runtime, image: str) -> None:
    (runtime.policies_dir / "pulling.toml").write_text(
        f'image = "{image}"\nworking_dir = "/tmp"\npull = true\n[timeouts]\ngrace_s = 0.2\n'
    )


async def test_a_policy_with_pull_true_pulls_a_missing_image_once(runtime: Runtime) -> None:
    runtime.engine.images = set()
    runtime.engine.registry = {"example.org/tools:1"}
    pulling_policy(runtime, "example.org/tools:1")
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    first = await session.start(spec("true", policy="pulling"))
    second = await session.start(spec("true", policy="pulling"))
    for task in (first, second):
        final = await session.wait(task.task_id, timeout_s=5)
        assert (final.status, final.exit_code) == ("completed", 0)
    assert [c for c in runtime.engine.calls if c[0] == "pull_image"] == [
        ("pull_image", "example.org/tools:1")
    ]


async def test_a_failed_pull_fails_the_task_naming_the_image(runtime: Runtime) -> None:
    runtime.engine.images = set()
    pulling_policy(runtime, "example.org/absent:1")
    sup = await runtime.supervisor()
    session = await sup.open_session("s1")
    task = await session.start(spec("true", policy="pulling"))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.error_code) == ("failed", "image_missing")
    assert "'example.org/absent:1'" in (final.error or "") and "pulling it failed" in (
        final.error or ""
    )
    assert runtime.engine.containers == []


async def test_timeout_stops_with_sigterm(engine: FakeEngine, session: Session) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    began = time.monotonic()
    task = await session.start(spec("serve", timeout_ms=200))
    final = await session.wait(task.task_id, timeout_s=5)
    assert time.monotonic() - began >= 0.2
    assert (final.status, final.reason, final.exit_code) == ("killed", "timeout", 143)
    c = container(engine, task.task_id)
    assert c.signals == ["SIGTERM"]
    assert await removed(engine, task.task_id)
    assert Path(final.output_path).read_bytes() == b"up\n"
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]


async def test_timeout_of_a_sigterm_ignorer_escalates_after_the_grace(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("stubborn", Script(UntilKilled(), ignore_sigterm=True))
    task = await session.start(spec("stubborn", timeout_ms=100))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.reason, final.exit_code) == ("killed", "timeout", 137)
    assert container(engine, task.task_id).signals == ["SIGTERM", "SIGKILL"]
    # Deadline plus the policy's 0.2 s grace.
    assert final.running_ms >= 290  # (ms are truncated)
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]


async def test_idle_timeout_stops_a_silent_task(engine: FakeEngine, session: Session) -> None:
    engine.script("quiet", Script(Out("hello\n"), UntilKilled()))
    task = await session.start(spec("quiet", idle_timeout_ms=150))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.reason, final.exit_code) == ("killed", "idle_timeout", 143)
    assert final.running_ms >= 140  # (ms are truncated)
    assert Path(final.output_path).read_bytes() == b"hello\n"


async def test_persistent_task_runs_until_stopped(engine: FakeEngine, session: Session) -> None:
    engine.script("daemon", Script(Out("ready\n"), UntilKilled()))
    task = await session.start(spec("daemon", persistent=True))
    assert task.timeout_ms is None
    await session.wait_for(task.task_id, "^ready$", timeout_s=5)
    info = await session.get(task.task_id)
    assert (info.status, info.deadline_at) == ("running", None)
    final = await session.stop(task.task_id)
    assert (final.status, final.reason, final.exit_code) == ("killed", "user_stopped", 143)


async def test_stop_of_a_sigterm_ignorer_escalates_after_the_grace(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("stubborn", Script(Out("ignoring TERM\n"), UntilKilled(), ignore_sigterm=True))
    task = await session.start(spec("stubborn"))
    await session.wait_for(task.task_id, "ignoring", timeout_s=5)
    c = container(engine, task.task_id)
    began = time.monotonic()
    final = await session.stop(task.task_id)
    assert time.monotonic() - began >= 0.19  # the policy's grace_s
    assert (final.status, final.reason, final.exit_code) == ("killed", "user_stopped", 137)
    assert c.signals == ["SIGTERM", "SIGKILL"]
    assert await removed(engine, task.task_id)
    # stop() returns once the terminal event is readable, exactly once.
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
    with pytest.raises(TaskNotRunning):
        await session.stop(task.task_id)


@pytest.mark.parametrize("order", ["exit-first", "stop-first"])
async def test_stop_racing_a_natural_exit_gives_one_terminal_event(
    engine: FakeEngine, session: Session, order: str
) -> None:
    gates: dict[str, asyncio.Event] = {}

    def gated(request: ContainerRequest) -> Script:
        # One gate per task (containers are created in whatever order the runners get to).
        gate = gates[request.labels["io.sandvisor.task"]] = asyncio.Event()
        return Script(Out("work\n"), WaitFor(gate), Exit(0))

    engine.script("racer", gated)
    tasks = [await session.start(spec("racer")) for _ in range(5)]
    for t in tasks:
        await session.wait_for(t.task_id, "work", timeout_s=5)
    finals = []
    for t in tasks:
        c = container(engine, t.task_id)
        if order == "exit-first":
            gates[t.task_id].set()
            stopping = asyncio.ensure_future(session.stop(t.task_id))
        else:
            stopping = asyncio.ensure_future(session.stop(t.task_id))
            await called(engine, "kill", c.id)
            gates[t.task_id].set()
        try:
            finals.append(await stopping)
        except TaskNotRunning as exc:  # the exit won before the stop was asked
            finals.append(exc.info)
    events = await stored_events(session)
    for t, final in zip(tasks, finals, strict=True):
        assert types_of(events, t.task_id) == ["task.started", "task.stopped"]
        (stopped,) = of_task(events, t.task_id, "task.stopped")
        assert isinstance(stopped, TaskStopped)
        assert (final.reason, final.exit_code) == (stopped.reason, stopped.exit_code)
        if order == "stop-first":
            assert (final.status, final.reason, final.exit_code) == (
                "killed",
                "user_stopped",
                143,
            )
        else:
            assert final.exit_code == 0
            assert final.reason in ("exit", "user_stopped")
        assert await removed(engine, t.task_id)


# -- stdin -----------------------------------------------------------------------------


async def test_input_reaches_the_command_then_eof(engine: FakeEngine, session: Session) -> None:
    engine.script("cat", Script(ReadLine(echo=True), ReadEOF(echo=True), Exit(0)))
    task = await session.start(spec("cat"))
    await session.send_input(task.task_id, "first line\n")
    await session.wait_for(task.task_id, "^first line$", timeout_s=5)
    await session.send_input(task.task_id, b"rest \xfe", eof=True)
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.exit_code) == ("completed", 0)
    assert Path(final.output_path).read_bytes() == b"first line\nrest \xfe"
    c = container(engine, task.task_id)
    assert (bytes(c.stdin), c.stdin_closed) == (b"first line\nrest \xfe", True)
    with pytest.raises(TaskNotRunning):
        await session.send_input(task.task_id, "late\n")


async def test_input_after_eof_or_with_closed_stdin_is_refused(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("wait", Script(UntilKilled()))
    piped = await session.start(spec("wait"))
    await session.send_input(piped.task_id, "", eof=True)
    await engine.changes.until(lambda: container(engine, piped.task_id).stdin_closed)
    with pytest.raises(StdinClosed, match="EOF was sent"):
        await session.send_input(piped.task_id, "more\n")
    closed = await session.start(spec("wait", stdin="closed"))
    with pytest.raises(StdinClosed, match="stdin=closed"):
        await session.send_input(closed.task_id, "x\n")
    name = f"sandvisor-{closed.task_id}"
    await engine.changes.until(lambda: (c := engine.find(name)) is not None and c.running)
    c = container(engine, closed.task_id)
    assert c.stdin_closed
    assert not c.request.stdin_open


async def test_input_over_the_cap_is_refused_and_nothing_is_written(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("cat", Script(ReadEOF(echo=True), Exit(0)))
    task = await session.start(spec("cat"))
    with pytest.raises(SpecError, match="at most 1048576 bytes"):
        await session.send_input(task.task_id, b"x" * (MAX_INPUT_BYTES + 1))
    await session.send_input(task.task_id, b"y" * MAX_INPUT_BYTES, eof=True)
    final = await session.wait(task.task_id, timeout_s=5)
    assert final.output_bytes == MAX_INPUT_BYTES
    assert bytes(container(engine, task.task_id).stdin) == b"y" * MAX_INPUT_BYTES


class FullPipe:
    """The fake's stdin never pushes back; with this, writes block until :attr:`drained`
    is set (a command that does not read, with the pipe's buffer full)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.drained = asyncio.Event()


@pytest.fixture
def full_pipe(monkeypatch: pytest.MonkeyPatch) -> FullPipe:
    pipe = FullPipe()
    write = FakeAttach.write

    async def blocking_write(self: FakeAttach, data: bytes) -> None:
        pipe.entered.set()
        await pipe.drained.wait()
        await write(self, data)

    monkeypatch.setattr(FakeAttach, "write", blocking_write)
    return pipe


async def test_input_not_read_times_out_and_a_stop_fails_the_pending_write(
    engine: FakeEngine, session: Session, full_pipe: FullPipe
) -> None:
    engine.script("busy", Script(Out("not reading\n"), UntilKilled()))
    task = await session.start(spec("busy"))
    await session.wait_for(task.task_id, "not reading", timeout_s=5)
    stdin = session.task_runner(task.task_id).stdin
    with pytest.raises(InputNotRead, match=r"not taken within 0\.2 s"):
        await stdin.send(b"hello\n", eof=False, timeout_s=0.2)
    # The first write is still queued: nothing more is accepted until it is read.
    with pytest.raises(InputNotRead, match="still waiting to be read"):
        await session.send_input(task.task_id, "more\n")
    assert bytes(container(engine, task.task_id).stdin) == b""
    # The pipe drains: the queued input arrives, and input flows again.
    full_pipe.drained.set()
    await engine.changes.until(lambda: container(engine, task.task_id).stdin == b"hello\n")
    await session.send_input(task.task_id, "more\n")
    assert bytes(container(engine, task.task_id).stdin) == b"hello\nmore\n"


async def test_a_stop_fails_a_pending_write_at_once(
    engine: FakeEngine, session: Session, full_pipe: FullPipe
) -> None:
    engine.script("busy", Script(Out("not reading\n"), UntilKilled()))
    task = await session.start(spec("busy"))
    await session.wait_for(task.task_id, "not reading", timeout_s=5)
    pending = asyncio.ensure_future(session.send_input(task.task_id, "hello\n"))
    await full_pipe.entered.wait()
    assert not pending.done()
    began = time.monotonic()
    await session.stop(task.task_id)
    # Closed by the stop: the task ended, or its output ended first (whichever the runner
    # saw first); never a hang, never a cancellation.
    with pytest.raises(StdinClosed, match=r"has ended|output ended"):
        await asyncio.wait_for(pending, 2)
    # At once: well within the 10 s a write may otherwise wait.
    assert time.monotonic() - began < 2


async def test_a_container_lost_with_its_node_ends_the_task_lost_naming_it(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    task = await session.start(spec("serve"))
    await session.wait_for(task.task_id, "up", timeout_s=5)
    engine.lose(container(engine, task.task_id).id, "node w1 (abc) is down")
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.reason) == ("failed", "lost")
    assert final.error == "node w1 (abc) is down"
    assert Path(final.output_path).read_bytes() == b"up\n"
    events = await stored_events(session)
    assert types_of(events, task.task_id) == ["task.started", "task.stopped"]
