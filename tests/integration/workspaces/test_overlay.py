"""Overlay workspaces through the library, on runc and runsc: a task's edits become exactly
the listed changes, the host tree stays as it was until apply, apply makes it the merged
view a task saw, host edits are conflicts, undo and discard put things back, and nothing
(volume, upper, mount) is left once the session is over."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from supervisor.core.workspace_errors import WorkspaceBusy, WorkspaceConflict
from tests.integration.workspaces.support import (
    OWNER,
    POLICY,
    WsEnv,
    host_listing,
    merged_listing,
    mounts_mentioning,
    our_volumes,
    run_ok,
    tree_hash,
)
from tests.unit.workspace_tools import File, Link, Spec, git_apply, kinds

pytestmark = [
    pytest.mark.timeout(240),
]

PROJECT: Spec = {
    ".gitignore": "*.log\n",
    "edit.txt": "v1\n",
    "keep.txt": "unchanged\n",
    "gone.txt": "bye\n",
    "gonedir/a": "a",
    "gonedir/b/c": "c",
    "old-name.txt": "rename me\n",
    "olddir/x": "x",
    "olddir/y/z": "z",
    "script.sh": File(b"#!/bin/sh\necho hi\n", 0o644),
    "private/p": "p",
    "conflict.txt": "host v1\n",
    "link": Link("edit.txt"),
}

# Modifies, creates, deletes, renames and chmods; writes at the top of the tree (the root
# must be writable by the task's user) and one ignored file.
EDITS = """set -e
echo v2 > edit.txt
echo new > new.txt
mkdir -p newdir/sub
echo deep > newdir/sub/deep.txt
rm gone.txt
rm -r gonedir
mv old-name.txt new-name.txt
mv olddir newdir2
chmod 755 script.sh
chmod 700 private
echo agent > conflict.txt
ln -s new.txt link-to-new
echo noise > build.log
"""

EXPECTED = {
    "build.log": "added",
    "conflict.txt": "modified",
    "edit.txt": "modified",
    "gone.txt": "deleted",
    "gonedir": "deleted",
    "link-to-new": "added",
    "new-name.txt": "added",
    "new.txt": "added",
    "newdir": "added",
    "newdir/sub": "added",
    "newdir/sub/deep.txt": "added",
    "newdir2": "added",
    "newdir2/x": "added",
    "newdir2/y": "added",
    "newdir2/y/z": "added",
    "old-name.txt": "deleted",
    "olddir": "deleted",
    "private": "mode",
    "script.sh": "mode",
}


@pytest.mark.parametrize("runtime", ["runc", pytest.param("runsc", marks=pytest.mark.runsc)])
async def test_overlay_review_apply_undo_discard(ws: WsEnv, runtime: str, tmp_path: Path) -> None:
    policy = POLICY[runtime]
    project = ws.project(PROJECT)
    pristine = tree_hash(project)
    session = await ws.open(f"ov-{runtime}", project)

    await run_ok(session, EDITS, policy=policy)
    seen = await merged_listing(session, policy)
    # Same path, run as the owner, and the top of the tree is the owner's and writable.
    assert seen["cwd"] == str(project)
    assert seen["id"] == list(OWNER)
    assert seen["root"] == [*OWNER, 0o755] and seen["root_writable"], seen
    assert tree_hash(project) == pristine, "the host tree changed before apply"

    changes = await session.workspace_changes()
    assert kinds(changes) == EXPECTED
    by_path = {c.path: c for c in changes}
    assert [c.path for c in changes if c.ignored] == ["build.log"]
    assert not any(c.conflict for c in changes)
    assert (by_path["script.sh"].old_mode, by_path["script.sh"].new_mode) == (0o644, 0o755)
    assert by_path["link-to-new"].target == "new.txt"
    # The diff is what `git apply` takes: on a copy of the project it gives the merged view.
    patch = await session.workspace_diff()
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True)
    git_apply(patch, copy)
    ignored = {"build.log"}
    merged_files = {k: v for k, v in git_view_of(seen["tree"]).items() if k not in ignored}
    assert git_view_of(host_listing(copy)) == merged_files
    assert tree_hash(project) == pristine

    # A host edit made meanwhile is a conflict: refused, nothing written.
    (project / "conflict.txt").write_text("host edit\n")
    os.chown(project / "conflict.txt", *OWNER)
    edited = tree_hash(project)
    conflicting = [c.path for c in await session.workspace_changes() if c.conflict]
    assert conflicting == ["conflict.txt"]
    with pytest.raises(WorkspaceConflict) as refused:
        await session.apply_changes()
    assert refused.value.paths == ["conflict.txt"]
    assert tree_hash(project) == edited

    # Forced: applied, the host's version backed up; the host tree is the merged view
    # (less the ignored file, which stays pending in the upper).
    result = await session.apply_changes(force=True)
    assert result.forced == ["conflict.txt"]
    assert [s.path for s in result.skipped] == ["build.log"]
    expected_tree = {k: v for k, v in seen["tree"].items() if k not in ignored}
    assert host_listing(project) == expected_tree
    left = await session.workspace_changes()
    assert [(c.path, c.ignored) for c in left] == [("build.log", True)]
    # Tasks keep seeing the same tree after apply.
    assert (await merged_listing(session, policy))["tree"] == seen["tree"]

    # Undo: the host tree as it was just before apply (the host edit back). The applied
    # changes left the upper with the apply (the tasks see the host tree again), so only
    # the ignored file stays pending.
    undone = await session.undo_apply()
    assert "conflict.txt" in undone.restored
    assert tree_hash(project) == edited
    assert (project / "conflict.txt").read_text() == "host edit\n"
    assert [(c.path, c.ignored) for c in await session.workspace_changes()] == [("build.log", True)]

    # Discard: no change, no volume, no mount; tasks see the host tree again.
    await session.discard_changes()
    assert await session.workspace_changes() == []
    assert our_volumes(ws.sup) == []
    assert mounts_mentioning(ws.ws_dir(session.session_id)) == []
    again = await merged_listing(session, policy)
    assert again["tree"] == host_listing(project)
    await session.end()
    assert our_volumes(ws.sup) == []
    assert not ws.ws_dir(session.session_id).exists()
    assert mounts_mentioning(ws.ws_dir(session.session_id), project) == []
    assert tree_hash(project) == edited


def git_view_of(tree: dict[str, list[object]]) -> dict[str, tuple[object, ...]]:
    """``git_view`` of a LISTING tree (files by hash, so the copy is hashed the same way)."""
    out: dict[str, tuple[object, ...]] = {}
    for rel, (kind, mode, _uid, _gid, extra) in tree.items():
        if kind == "link":
            out[rel] = ("link", extra)
        elif kind == "file":
            out[rel] = ("file", bool(int(mode) & 0o100), extra)  # type: ignore[call-overload]
    return out


async def test_tasks_of_a_session_share_the_upper_at_once_across_runtimes(ws: WsEnv) -> None:
    project = ws.project({"app.py": "print('app')\n"})
    pristine = tree_hash(project)
    session = await ws.open("share", project)
    # A (runc) waits for B's file and answers; B (runsc) writes, then waits for the answer:
    # both run at once on the one overlay volume.
    waiter = await session.start(
        {
            "command": "until [ -f flag ]; do sleep 0.05; done; cat flag; echo seen > ack",
            "policy": POLICY["runc"],
            "timeout_ms": 60_000,
        }
    )
    out = await run_ok(
        session,
        "printf 'VALUE = 42\\n' > installed.py; echo hello > flag; "
        "until [ -f ack ]; do sleep 0.05; done; cat ack",
        policy=POLICY["runsc"],
        timeout_ms=60_000,
    )
    assert out.strip().endswith("seen"), out
    first = await session.wait(waiter.task_id, timeout_s=60)
    assert first.status == "completed", first
    assert Path(first.output_path).read_text() == "hello\n"
    # What one task installed, the next imports (pip/npm install, then the tests).
    out = await run_ok(session, "python3 -c 'import installed; print(installed.VALUE)'")
    assert out.strip() == "42"
    assert tree_hash(project) == pristine
    changes = await session.workspace_changes()
    assert {c.path for c in changes if not c.ignored} == {"installed.py", "flag", "ack"}
    assert {c.path for c in changes if c.ignored} == {
        "__pycache__",
        "__pycache__/installed.cpython-311.pyc",
    }
    await session.discard_changes()
    await session.end()


async def test_apply_waits_for_no_task_or_stops_them_when_asked(ws: WsEnv) -> None:
    project = ws.project({"a.txt": "a\n"})
    session = await ws.open("busy", project)
    server = await session.start(
        {"command": "echo b > a.txt; echo ready; sleep 600", "persistent": True}
    )
    await session.wait_for(server.task_id, "^ready$", timeout_s=60)
    for call in (session.apply_changes, session.discard_changes, session.undo_apply):
        with pytest.raises(WorkspaceBusy) as busy:
            await call()
        assert server.task_id in str(busy.value)
    assert (project / "a.txt").read_text() == "a\n"
    result = await session.apply_changes(stop_tasks=True)
    assert result.applied == ["a.txt"]
    final = await session.get(server.task_id)
    assert final.ended and final.reason == "user_stopped", final
    assert (project / "a.txt").read_text() == "b\n"
    assert os.stat(project / "a.txt").st_uid == OWNER[0]
    # Nothing pending, nothing to undo twice.
    assert await session.workspace_changes() == []
    await session.end()
    assert our_volumes(ws.sup) == []


async def test_no_task_starts_on_the_workspace_while_it_is_applied(ws: WsEnv) -> None:
    project = ws.project({"a.txt": "a\n"})
    session = await ws.open("race", project)
    await run_ok(session, "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); echo $i > f$i; done")
    workspace = session.workspace
    assert workspace is not None
    # Watch (without changing) when the apply writes the host tree, and when a task has
    # the overlay volume made (the engine mounts it at the container's start, right after).
    seen: list[tuple[str, float]] = []
    apply_files, ensure_volume = workspace._apply, workspace.ensure_volume

    def timed_apply(force: bool, reviewed: object) -> object:
        seen.append(("apply", time.monotonic()))
        try:
            return apply_files(force, reviewed)  # type: ignore[arg-type]
        finally:
            seen.append(("applied", time.monotonic()))

    async def timed_ensure() -> None:
        await ensure_volume()
        seen.append(("volume", time.monotonic()))

    workspace._apply = timed_apply  # type: ignore[method-assign]
    workspace.ensure_volume = timed_ensure  # type: ignore[method-assign]
    applying = asyncio.create_task(session.apply_changes())
    while not seen and not applying.done():
        await asyncio.sleep(0.001)
    try:
        info = await session.start({"command": "ls | wc -l"})
    except WorkspaceBusy:
        info = None
    result = await applying
    assert len(result.applied) == 3000
    if info is not None:
        final = await session.wait(info.task_id, timeout_s=60)
        assert final.status == "completed", final
    order = [what for what, _ in sorted(seen, key=lambda e: e[1])]
    # A task may wait for the apply, or be refused; it must not mount the overlay while
    # the lower is being written (the kernel leaves that undefined).
    assert order[:2] == ["apply", "applied"], order
    await session.end()


async def test_after_apply_tasks_see_the_users_later_edits(ws: WsEnv) -> None:
    project = ws.project({"a.txt": "a\n"})
    session = await ws.open("fresh", project)
    await run_ok(session, "echo agent > a.txt")
    await session.apply_changes()
    (project / "a.txt").write_text("the user's edit after the apply\n")
    seen = await run_ok(session, "cat a.txt")
    pending = await session.workspace_changes()
    await session.discard_changes()
    await session.end()
    assert seen == "the user's edit after the apply\n"
    assert pending == []
