"""An ``rw`` workspace's checks run when a warm container takes its command, not when the
pool made the container (before earlier tasks ran)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import MemorySink, Supervisor, TaskSpec, WorkspaceSpec
from supervisor.core.workspace_errors import WorkspaceMoved
from supervisor.engine.fake import Exit, FakeEngine, Out, Script
from tests.component.conftest import Runtime, container, removed

pytestmark = [pytest.mark.component, pytest.mark.timeout(15)]


def warm(command: str) -> TaskSpec:
    return TaskSpec.model_validate({"command": command, "policy": "warm"})


@pytest.fixture
async def sup(runtime: Runtime, tmp_path: Path) -> Supervisor:
    """A supervisor whose workspace root is the test's folder."""
    runtime.workspace_roots = [tmp_path]
    return await runtime.supervisor()


async def test_a_repository_made_after_the_pool_filled_is_moved_before_the_command(
    engine: FakeEngine, sup: Supervisor, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    session = await sup.open_session(
        "ws", sinks=[MemorySink()], workspace=WorkspaceSpec(path=str(project), mode="rw")
    )
    engine.script("ls", Script(Out("ok\n"), Exit(0)))
    assert await session.prewarm("warm") == 2
    # What an earlier task (or anything else) created once the spares were made.
    (project / "src" / ".git").mkdir()
    (project / "src" / ".git" / "config").write_text("[core]\n\tfsmonitor = touch PWNED\n")
    ready = [c.name for c in engine.containers if not c.gone]
    task = await session.start(warm("ls"))
    final = await session.wait(task.task_id, timeout_s=5)
    assert final.status == "completed"
    assert f"sandvisor-{task.task_id}" in ready, "the task did not take a warm container"
    assert not (project / "src" / ".git").exists(), "the warm start skipped the sweep"
    moved = list((project / "src").glob(".git.sandvisor-quarantined-*"))
    assert len(moved) == 1 and (moved[0] / "config").read_text().endswith("PWNED\n")


async def test_a_moved_project_refuses_a_warm_start(
    engine: FakeEngine, sup: Supervisor, tmp_path: Path
) -> None:
    parent = tmp_path / "parent"
    project = parent / "app"
    project.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    session = await sup.open_session(
        "moved", sinks=[MemorySink()], workspace=WorkspaceSpec(path=str(project), mode="rw")
    )
    assert await session.prewarm("warm") == 2
    project.rename(parent / "app.old")
    project.symlink_to(outside)
    engine.script("ls", Script(Out("ran\n"), Exit(0)))
    task = await session.start(warm("ls"))
    final = await session.wait(task.task_id, timeout_s=5)
    assert (final.status, final.error_code) == ("failed", WorkspaceMoved.code), final
    assert "now a symlink" in (final.error or "")
    c = container(engine, task.task_id)
    assert b"ls" not in bytes(c.stdin), "the command reached a container of the moved project"
    assert await removed(engine, task.task_id)
