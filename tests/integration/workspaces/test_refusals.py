"""Workspaces the supervisor refuses (outside the roots, the engine's or its own files,
paths the overlay options cannot carry, root-owned under ``refuse``), the reserved container
paths that fall back to ``/workspace``, and a root-owned project run as nobody."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import Supervisor
from supervisor.core.errors import PolicyError
from supervisor.core.workspace import FALLBACK_PATH, NOBODY, WorkspaceSpec
from tests.conftest import require_engine
from tests.integration.workspaces.support import (
    OWNER,
    WsEnv,
    chown_tree,
    host_listing,
    merged_listing,
    run,
    run_ok,
)
from tests.unit.workspace_tools import Dir, File, build
from tests.users import AS_ROOT, root_only

pytestmark = [
    pytest.mark.timeout(240),
]


async def refused(sup: Supervisor, sid: str, path: str | Path, policy: str = "default") -> str:
    """The PolicyError opening a session on ``path`` gives; no session is left open."""
    with pytest.raises(PolicyError) as err:
        await sup.open_session(sid, workspace=WorkspaceSpec(path=str(path)), policy=policy)
    assert sid not in {s.session_id for s in sup.sessions()}
    assert not (sup.state_dir / "ws" / sid).exists()
    return str(err.value)


async def test_outside_the_roots_odd_paths_and_the_supervisors_own_files(
    ws: WsEnv, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    msg = await refused(ws.sup, "out", outside)
    assert str(outside) in msg and str(ws.roots) in msg and "not under an allowed" in msg
    # A symlink inside a root that points outside is judged by where it leads.
    (ws.roots / "sneaky").symlink_to(outside)
    assert "not under an allowed" in await refused(ws.sup, "sneaky", ws.roots / "sneaky")
    for name in ("a,b", "a:b", "lower=x,upperdir=y"):
        project = ws.project({"f": "f"}, name=name)
        assert "cannot be mounted" in await refused(ws.sup, "opt", project)
    assert "not a directory" in await refused(ws.sup, "file", ws.project({"f": "f"}) / "f")
    assert "No such file" in await refused(ws.sup, "missing", ws.roots / "nope")
    # Nothing was opened: the same id still opens without a workspace.
    session = await ws.sup.open_session("out")
    assert session.workspace is None
    await session.end()


async def test_the_engines_files_the_state_dir_and_the_whole_host(
    tmp_path: Path, policies_dir: Path
) -> None:
    require_engine()
    state = tmp_path / "state"
    async with Supervisor(state_dir=state, policies_dir=policies_dir, workspace_roots=["/"]) as sup:
        assert "whole host" in await refused(sup, "root", "/")
        for path in ("/var/lib/docker", "/run", "/var/run"):
            if os.path.exists(path):
                assert "engine's files" in await refused(sup, "engine", path)
        assert "state directory" in await refused(sup, "state", state)
        (state / "inside").mkdir()
        assert "state directory" in await refused(sup, "state", state / "inside")
        assert "state directory" in await refused(sup, "state", tmp_path)


#: A host directory that is a system path inside the images: /usr/local as root; without
#: root, /dev/shm (world-writable on the host, under the images' /dev).
SYSTEM_PARENT = Path("/usr/local" if AS_ROOT else "/dev/shm")


@pytest.fixture
def usr_local_root() -> Iterator[Path]:
    """A workspace root under ``SYSTEM_PARENT`` (a system path inside the images)."""
    root = SYSTEM_PARENT / f"sandvisor-wstest-{secrets.token_hex(4)}"
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_reserved_container_path_falls_back_to_workspace(
    usr_local_root: Path, state_dir: Path, policies_dir: Path
) -> None:
    require_engine()
    project = usr_local_root / "proj"
    build(project, {"a.txt": "a\n"})
    chown_tree(project)
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[usr_local_root]
    ) as sup:
        session = await sup.open_session("fallback", workspace=WorkspaceSpec(path=str(project)))
        ws = session.workspace
        assert ws is not None and ws.plan.container_path == FALLBACK_PATH
        assert ws.plan.warning is not None and "system path" in ws.plan.warning
        assert FALLBACK_PATH in ws.plan.warning
        # The image's system path is intact: tasks see the project at /workspace (in place
        # of the policy's tmpfs there), and python3 from /usr still runs.
        seen = await merged_listing(session)
        assert seen["cwd"] == FALLBACK_PATH
        assert seen["tree"] == host_listing(project)
        await run_ok(session, f"echo b > b.txt; test ! -e {SYSTEM_PARENT}/sandvisor-wstest-*")
        assert [c.path for c in await session.workspace_changes()] == ["b.txt"]
        await session.discard_changes()
        await session.end()


@root_only("makes a project owned by root")
async def test_a_root_owned_project_under_refuse_and_under_root_on_runc(
    ws: WsEnv, policies_dir: Path
) -> None:
    (policies_dir / "ws-refuse.toml").write_text('workspace_root_owner = "refuse"\n')
    (policies_dir / "ws-root-runc.toml").write_text('workspace_root_owner = "root"\n')
    ws.sup.policies.reload()
    project = ws.project({"a.txt": "a\n"}, owner=(0, 0))
    msg = await refused(ws.sup, "refuse", project, policy="ws-refuse")
    assert "owned by root" in msg and "'refuse'" in msg
    msg = await refused(ws.sup, "rootrunc", project, policy="ws-root-runc")
    assert "needs runtime runsc" in msg


@root_only("makes a project owned by root and applies to it")
async def test_a_root_owned_project_runs_as_nobody(ws: WsEnv) -> None:
    project = ws.project(
        {
            "top.txt": "root's\n",
            "sub/inner.txt": "inner\n",
            "open/": Dir(0o777),
            "script.sh": File(b"#!/bin/sh\n", 0o755),
        },
        owner=(0, 0),
    )
    session = await ws.open("nobody", project)
    final, out = await run(
        session,
        "id -u; id -g; touch made-at-top && echo top-ok; mkdir dir-at-top && echo mkdir-ok; "
        "touch sub/new; echo sub-rc=$?; echo x >> top.txt; echo append-rc=$?; "
        "touch open/new && echo open-ok; rm top.txt && echo rm-ok; echo end",
    )
    assert final.status == "completed", (final, out)
    lines = out.splitlines()
    assert lines[:2] == [str(NOBODY[0]), str(NOBODY[1])], out
    # The top of the tree belongs to nobody (the upper's owner): new entries and removals
    # work there. Below it, root's directories and files stay as root left them.
    assert "top-ok" in lines and "mkdir-ok" in lines and "rm-ok" in lines, out
    assert "sub-rc=1" in lines and "append-rc=2" in lines, out
    assert out.count("Permission denied") == 2, out
    assert "open-ok" in lines, out
    changes = {c.path: c.kind for c in await session.workspace_changes()}
    assert changes == {
        "made-at-top": "added",
        "dir-at-top": "added",
        "open/new": "added",
        "top.txt": "deleted",
    }
    await session.apply_changes()
    # Applied entries belong to the workspace's owner (root), not to nobody.
    for rel in ("made-at-top", "dir-at-top", "open/new"):
        assert os.lstat(project / rel).st_uid == 0, rel
    assert not (project / "top.txt").exists()
    assert os.stat(project).st_uid == 0 and OWNER[0] != 0
    await session.discard_changes()
    await session.end()
