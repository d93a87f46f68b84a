"""A workspace outlives its session (the changes wait to be applied) and its supervisor (a
restart on the same state dir keeps the workspace, its changes and the running tasks' view
of it)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import pytest

from supervisor import Supervisor, TaskSpec
from supervisor.core.errors import PolicyError, SessionNotFound
from supervisor.core.workspace import WorkspaceSpec
from tests.conftest import require_engine
from tests.integration.workspaces.support import (
    OWNER,
    WsEnv,
    chown_tree,
    mounts_mentioning,
    our_volumes,
    run,
    run_ok,
    tree_hash,
)
from tests.unit.workspace_tools import build, kinds

pytestmark = [
    pytest.mark.timeout(240),
]


async def test_changes_outlive_the_session_and_apply_afterwards(ws: WsEnv) -> None:
    project = ws.project({"a.txt": "a\n", "b.txt": "b\n"})
    pristine = tree_hash(project)
    session = await ws.open("kept", project)
    await run_ok(session, "echo A > a.txt; rm b.txt; echo c > c.txt")
    await session.end()
    # The session is over: its tasks and volume are gone, its changes are not.
    assert our_volumes(ws.sup) == []
    assert mounts_mentioning(ws.ws_dir("kept")) == []
    assert tree_hash(project) == pristine
    kept = ws.sup.workspace("kept")
    assert kinds(await kept.changes()) == {
        "a.txt": "modified",
        "b.txt": "deleted",
        "c.txt": "added",
    }
    assert "+A" in await kept.diff()
    result = await kept.apply()
    assert sorted(result.applied) == ["a.txt", "b.txt", "c.txt"]
    assert sorted(os.listdir(project)) == ["a.txt", "c.txt"]
    assert (project / "a.txt").read_text() == "A\n"
    assert os.stat(project / "c.txt").st_uid == OWNER[0]
    assert await kept.changes() == []
    # And the user can still take it back.
    await kept.undo()
    assert tree_hash(project) == pristine
    await ws.sup.workspaces.drop("kept")
    with pytest.raises(SessionNotFound):
        ws.sup.workspace("kept")
    assert not ws.ws_dir("kept").exists()


async def test_a_session_with_nothing_to_review_leaves_nothing(ws: WsEnv) -> None:
    project = ws.project({"a.txt": "a\n"})
    session = await ws.open("clean", project)
    await run_ok(session, "cat a.txt")
    await session.end()
    assert our_volumes(ws.sup) == []
    assert not ws.ws_dir("clean").exists()
    with pytest.raises(SessionNotFound):
        ws.sup.workspace("clean")


TICKER = (
    "echo before > before.txt; echo ready; "
    "until [ -f go ]; do sleep 0.05; done; echo after > after.txt; echo finished"
)


async def test_a_restart_keeps_the_workspace_and_the_running_tasks_mount(
    tmp_path: Path, state_dir: Path, policies_dir: Path
) -> None:
    require_engine()
    roots = tmp_path / "roots"
    project = roots / "proj"
    build(project, {"a.txt": "a\n"})
    chown_tree(roots)
    pristine = tree_hash(project)
    spec = WorkspaceSpec(path=str(project))
    first = Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
        workspace_roots=[roots],
        stop_tasks_on_close=False,
    )
    async with first as sup:
        session = await sup.open_session("restart", workspace=spec)
        ticker = await session.start(TaskSpec(command=TICKER, persistent=True))
        await session.wait_for(ticker.task_id, "^ready$", timeout_s=60)
        volume = session.workspace.volume if session.workspace else ""
        instance = sup.instance_id
    # The supervisor is gone; the task and its overlay are not.
    assert volume in _volumes_of(instance)
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[roots]
    ) as sup:
        session = sup.session("restart")
        assert session.workspace is not None and session.workspace.plan.host == str(project)
        assert kinds(await session.workspace_changes()) == {"before.txt": "added"}
        # A new task of the restored session shares the volume the re-adopted one holds.
        await run_ok(session, "cat before.txt; echo go > go")
        final = await session.wait(ticker.task_id, timeout_s=60)
        assert final.status == "completed" and final.exit_code == 0, final
        assert Path(final.output_path).read_text() == "ready\nfinished\n"
        assert kinds(await session.workspace_changes()) == {
            "before.txt": "added",
            "go": "added",
            "after.txt": "added",
        }
        assert tree_hash(project) == pristine
        await session.apply_changes()
        assert sorted(os.listdir(project)) == ["a.txt", "after.txt", "before.txt", "go"]
        await session.discard_changes()
        await session.end()
        assert our_volumes(sup) == []


async def test_a_restart_keeps_rw_git_protection(
    tmp_path: Path, state_dir: Path, policies_dir: Path
) -> None:
    require_engine()
    roots = tmp_path / "roots"
    project = roots / "proj"
    build(project, {"a.txt": "a\n", ".git/hooks/README": "hooks\n", ".git/config": "[core]\n"})
    chown_tree(roots)
    spec = WorkspaceSpec(path=str(project), mode="rw")
    hook = "echo evil > .git/hooks/pre-commit; echo x >> .git/config; echo done"
    async with Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
        workspace_roots=[roots],
        stop_tasks_on_close=False,
    ) as sup:
        session = await sup.open_session("rwrestart", workspace=spec)
        _, out = await run(session, hook)
        assert out.count("Read-only file system") == 2, out
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[roots]
    ) as sup:
        session = sup.session("rwrestart")
        _, out = await run(session, hook)
        await session.end()
    assert not (project / ".git/hooks/pre-commit").exists()
    assert (project / ".git/config").read_text() == "[core]\n"
    assert out.count("Read-only file system") == 2, out


def _volumes_of(instance: str) -> list[str]:
    from tests.integration.workspaces.support import engine  # noqa: PLC0415

    client = engine()
    try:
        found = client.volumes(filters={"label": f"io.sandvisor.owner={instance}"})
    finally:
        client.close()
    return [v["Name"] for v in (found or {}).get("Volumes") or []]


async def test_a_kept_workspace_reopens_and_retention_reaps_it(
    roots: Path, state_dir: Path, policies_dir: Path
) -> None:
    require_engine()
    project = roots / "proj"
    build(project, {"a.txt": "a\n"})
    chown_tree(project)
    spec = WorkspaceSpec(path=str(project))
    async with Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
        workspace_roots=[roots],
        workspace_retention_s=3600,
    ) as sup:
        session = await sup.open_session("again", workspace=spec)
        await run_ok(session, "echo b > a.txt")
        await session.end()
        assert [w.session_id for w in sup.workspaces.retained()] == ["again"]
    # A restart keeps the ended session's changes too.
    async with Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
        workspace_roots=[roots],
        workspace_retention_s=3600,
    ) as sup:
        assert [w.session_id for w in sup.workspaces.retained()] == ["again"]
        assert kinds(await sup.workspace("again").changes()) == {"a.txt": "modified"}
        # The same id on the same project carries on from the kept changes...
        session = await sup.open_session("again", workspace=spec)
        assert (await run_ok(session, "cat a.txt")) == "b\n"
        await session.end()
        # ...another project under that id is refused while they wait.
        other = roots / "other"
        build(other, {"x": "x"})
        chown_tree(other)
        with pytest.raises(PolicyError, match="not yet applied or discarded"):
            await sup.open_session("again", workspace=WorkspaceSpec(path=str(other)))
        assert await sup.workspaces.reap([]) == 0
        sup.workspaces.retention_s = 0.0
        assert await sup.workspaces.reap([]) == 1
        assert not (state_dir / "ws" / "again").exists()
        assert (project / "a.txt").read_text() == "a\n"


async def test_the_reaper_removes_a_gone_owners_workspace_volume(
    tmp_path: Path, policies_dir: Path
) -> None:
    require_engine()
    from supervisor.runtime.ownership import boot_id  # noqa: PLC0415
    from tests.conftest import owned_label  # noqa: PLC0415
    from tests.integration.workspaces.support import engine  # noqa: PLC0415

    client = engine()
    name = f"sandvisor-ws-gone-{os.getpid()}-{time.monotonic_ns()}"
    gone = {
        "io.sandvisor.owner": "gone0000",
        "io.sandvisor.owner.host": socket.gethostname(),
        "io.sandvisor.owner.boot": boot_id(),
        "io.sandvisor.owner.pid": "999999",
        "io.sandvisor.owner.lock": "/nonexistent/state/supervisor.lock",
        "io.sandvisor.session": "s-gone",
        "io.sandvisor.kind": "workspace",
    }
    client.create_volume(name, driver="local", labels={**gone, **owned_label()})
    try:
        async with Supervisor(state_dir=tmp_path / "sweeper", policies_dir=policies_dir) as sup:
            await sup.sweep()
            await sup.workspaces.reap([s.session_id for s in sup.sessions()])
        left = client.volumes(filters={"name": name}).get("Volumes") or []
        assert left == [], "a gone owner's workspace volume is left forever"
    finally:
        with contextlib.suppress(Exception):
            client.remove_volume(name, force=True)
        client.close()
