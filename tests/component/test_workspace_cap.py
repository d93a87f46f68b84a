"""The cap on a session's overlay layer (issue 22, item 9): a running task whose layer goes
past its policy's ``session.workspace_max_mb`` or ``workspace_max_files`` is stopped with
reason ``workspace_full``; a start of that policy is refused until the changes are
discarded or applied; a policy with a larger cap runs on. On the fake engine, the test
writes into the upper itself, as a task's writes through the overlay would land there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor import MemorySink, Session, Supervisor, TaskSpec, WorkspaceSpec
from supervisor.core.workspace_errors import WorkspaceFull
from supervisor.engine.fake import Exit, FakeEngine, Out, Script, UntilKilled
from tests.component.conftest import Runtime, of_task, stored_events

pytestmark = [pytest.mark.component, pytest.mark.timeout(30)]


def spec(command: str, policy: str) -> TaskSpec:
    return TaskSpec.model_validate({"command": command, "policy": policy})


@pytest.fixture
async def sup(runtime: Runtime, tmp_path: Path) -> Supervisor:
    runtime.workspace_roots = [tmp_path]
    return await runtime.supervisor()


@pytest.fixture
async def session(sup: Supervisor, tmp_path: Path) -> Session:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "README").write_text("hello\n")
    return await sup.open_session(
        "capped", sinks=[MemorySink()], workspace=WorkspaceSpec(path=str(project))
    )


def upper(session: Session) -> Path:
    assert session.workspace is not None
    return session.workspace.upper


async def test_a_layer_past_the_size_cap_stops_its_task_and_refuses_the_next(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    small = await session.start(spec("serve", "small-layer"))
    roomy = await session.start(spec("serve", "fake"))
    await session.wait_for(small.task_id, "up", timeout_s=5)
    # What `dd if=/dev/zero of=big bs=1M count=2` would leave in the upper.
    (upper(session) / "big").write_bytes(os.urandom(2 << 20))

    final = await session.wait(small.task_id, timeout_s=10)
    assert (final.status, final.reason) == ("killed", "workspace_full"), final
    # The policy with the larger cap (4096 MB) runs on.
    assert (await session.get(roomy.task_id)).status == "running"
    events = await stored_events(session)
    ends = of_task(events, small.task_id, "task.stopped", "task.failed")
    assert [e.reason for e in ends] == ["workspace_full"]  # type: ignore[attr-defined]

    with pytest.raises(WorkspaceFull) as refused:
        await session.start(spec("quick", "small-layer"))
    message = str(refused.value)
    assert refused.value.code == "workspace_full"
    for part in ("session.workspace_max_mb", "1 MB", "'small-layer'", "apply or discard"):
        assert part in message, message
    # Another policy's cap is its own.
    other = await session.start(spec("quick", "fake"))
    assert (await session.wait(other.task_id, timeout_s=5)).exit_code == 0

    await session.discard_changes(stop_tasks=True)
    again = await session.start(spec("quick", "small-layer"))
    assert (await session.wait(again.task_id, timeout_s=5)).exit_code == 0


async def test_a_layer_past_the_entry_cap_stops_its_task(
    engine: FakeEngine, session: Session
) -> None:
    engine.script("serve", Script(Out("up\n"), UntilKilled()))
    task = await session.start(spec("serve", "small-layer"))
    await session.wait_for(task.task_id, "up", timeout_s=5)
    flood = upper(session) / "flood"
    flood.mkdir()
    for i in range(60):  # empty files: no bytes to speak of, one inode each
        (flood / f"f{i}").touch()
    final = await session.wait(task.task_id, timeout_s=10)
    assert (final.status, final.reason) == ("killed", "workspace_full"), final
