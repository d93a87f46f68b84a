"""The ``ro`` and ``rw`` modes, and the same path: on runc and runsc, a read-only project
refuses writes and hides submounts, a read-write one gets files owned by its owner and keeps
the repository's hooks and config read-only, and a host venv's console script runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.core.errors import PolicyError
from supervisor.core.workspace_errors import UnsafeWorkspacePath
from tests.integration.workspaces.support import (
    OWNER,
    POLICY,
    WsEnv,
    chown_tree,
    run,
    run_ok,
    tree_hash,
)
from tests.users import root_only

pytestmark = [
    pytest.mark.timeout(240),
]
RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]
#: The cases on a project with a tmpfs mounted inside it.
submount_case = root_only("mounts a tmpfs inside the project")


@pytest.fixture
def submount(ws: WsEnv) -> Iterator[Path]:
    """A project with a tmpfs mounted on its ``mnt/`` (holding ``secret``)."""
    project = ws.project({"a.txt": "a\n", "mnt/.keep": ""})
    mnt = project / "mnt"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "secret").write_text("SUBMOUNT\n")
        yield project
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@submount_case
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_ro_refuses_writes_and_hides_submounts(
    ws: WsEnv, submount: Path, runtime: str
) -> None:
    before = tree_hash(submount)
    session = await ws.open(f"ro-{runtime}", submount, mode="ro")
    final, out = await run(
        session,
        "echo x > new.txt; echo x >> a.txt; mkdir d; "
        "python3 -c 'import os; print(sorted(os.listdir(\"mnt\")))'; cat a.txt",
        policy=POLICY[runtime],
    )
    assert final.status == "completed", (final, out)
    assert out.count("Read-only file system") == 3, out
    # The non-recursive bind shows the directory under the submount, not the tmpfs.
    assert "['.keep']" in out and "SUBMOUNT" not in out, out
    assert out.endswith("a\n"), out
    assert tree_hash(submount) == before
    with pytest.raises(PolicyError, match="only overlay workspaces"):
        await session.workspace_changes()
    await session.end()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_rw_files_belong_to_the_owner_and_git_stays_read_only(
    ws: WsEnv, runtime: str
) -> None:
    project = ws.project(
        {
            "a.txt": "a\n",
            ".git/HEAD": "ref: refs/heads/main\n",
            ".git/config": "[core]\n",
            ".git/hooks/README": "hooks\n",
        }
    )
    session = await ws.open(f"rw-{runtime}", project, mode="rw")
    final, out = await run(
        session,
        "echo new > new.txt; mkdir -p made/sub; echo x > made/sub/f; echo b >> a.txt; "
        "echo evil > .git/hooks/pre-commit; echo '[core] hooksPath=/tmp' >> .git/config; "
        "echo 'ref: refs/heads/x' > .git/HEAD; echo end",
        policy=POLICY[runtime],
    )
    assert final.status == "completed", (final, out)
    assert out.count("Read-only file system") == 3, out
    assert out.endswith("end\n"), out
    for rel in ("new.txt", "made", "made/sub", "made/sub/f"):
        st = os.lstat(project / rel)
        assert (st.st_uid, st.st_gid) == OWNER, rel
    assert (project / "a.txt").read_text() == "a\nb\n"
    assert not (project / ".git/hooks/pre-commit").exists()
    assert (project / ".git/config").read_text() == "[core]\n"
    # All of .git is read-only: a writable .git lets a task point the host's git at a
    # config of its own (commondir). git commit inside an rw task fails, as in Codex.
    assert (project / ".git/HEAD").read_text() == "ref: refs/heads/main\n"
    await session.end()


async def test_same_path_and_a_host_venv_console_script(ws: WsEnv) -> None:
    project = ws.project({"app.py": "print('app')\n"})
    # Created on the host with the host's Python (3.11, like the images').
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(project / ".venv")], check=True)
    chown_tree(project)
    pip = project / ".venv/bin/pip"
    assert pip.read_text().startswith(f"#!{project}/.venv/bin/python")
    session = await ws.open("venv", project)
    for runtime in ("runc", "runsc"):
        out = await run_ok(
            session,
            "pwd; .venv/bin/pip --version; .venv/bin/python -c 'import sys; print(sys.prefix)'",
            policy=POLICY[runtime],
        )
        lines = out.splitlines()
        assert lines[0] == str(project), out
        assert lines[1].startswith("pip ") and f"from {project}/.venv/lib/python3" in lines[1], out
        assert lines[2] == f"{project}/.venv", out
    await session.end()


@submount_case
async def test_overlay_hides_submounts_and_apply_refuses_writes_under_them(
    ws: WsEnv, submount: Path
) -> None:
    session = await ws.open("ov-submount", submount)
    out = await run_ok(
        session, "ls -A mnt; echo new > mnt/new; echo b > a.txt; echo done", policy=POLICY["runc"]
    )
    assert out == ".keep\ndone\n", out
    changes = {c.path: c for c in await session.workspace_changes()}
    assert "another filesystem is mounted" in (changes["mnt/new"].note or "")
    before = tree_hash(submount)
    # Applying would write into the host's tmpfs, not the project: the whole apply is
    # refused (nothing written), and the user discards or moves the mount.
    with pytest.raises(UnsafeWorkspacePath, match="another filesystem is mounted"):
        await session.apply_changes()
    assert tree_hash(submount) == before
    assert sorted(os.listdir(submount / "mnt")) == ["secret"]
    await session.discard_changes()
    await session.end()
