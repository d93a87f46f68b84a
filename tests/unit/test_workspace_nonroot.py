"""Workspace cleanup as a supervisor without root (issue 22, item 18): a docker-group user's
daemon owns the state, but the kernel leaves a root-owned, mode-000 ``work/work`` in every
overlay's work dir, and tasks may leave read-only directories in the upper."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.state.workspace import (
    Change,
    Manifest,
    list_changes,
    prune_upper,
    remove_workspace,
    reset_upper,
    take_work_dir,
)
from supervisor.state.workspace.cleanup import PARKED_WORK

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switches to another uid")

USER = (1500, 1500)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory the other uid can reach (pytest's tmp dirs are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sandvisor-nonroot-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a child process with ``USER``'s uid and gid and no other groups;
    re-raise what it raised as an AssertionError with its traceback."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        code = 0
        try:
            os.setgroups([])
            os.setgid(USER[1])
            os.setuid(USER[0])
            fn()
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        text = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text


def workspace(base: Path) -> tuple[Path, Path, Path]:
    """A session's workspace dir as an overlay leaves it: the user's upper with a file and a
    read-only directory a task made, and the work dir with the kernel's root-owned
    ``work/work``."""
    root = base / "ws" / "s1"
    upper, work = root / "upper", root / "work"
    (upper / "ro" / "inner").mkdir(parents=True)
    (upper / "ro" / "inner" / "f.txt").write_text("x")
    (upper / "new.txt").write_text("new")
    work.mkdir()
    for path in (base / "ws", root, upper, work, upper / "ro", upper / "ro" / "inner"):
        os.chown(path, *USER)
    for path in (upper / "ro" / "inner" / "f.txt", upper / "new.txt"):
        os.chown(path, *USER)
    (upper / "ro" / "inner").chmod(0o555)
    (upper / "ro").chmod(0o555)
    (work / "work").mkdir()
    (work / "work").chmod(0)  # root's, as the kernel makes it
    return root, upper, work


def test_remove_workspace_without_root(base: Path) -> None:
    root, _, _ = workspace(base)
    as_user(lambda: remove_workspace(root))
    assert not root.exists()


def test_reset_and_prune_without_root(base: Path) -> None:
    root, upper, work = workspace(base)
    change = Change("new.txt", "added", "file", new_mode=0o644)

    def prune() -> None:
        assert prune_upper(upper, work, [change]) == 0

    as_user(prune)
    assert list(upper.iterdir()) == []  # applied, or (read-only ``ro``) equal to the lower
    as_user(lambda: reset_upper(upper, work, owner=USER, mode=0o755))
    assert list(upper.iterdir()) == [] and list(work.iterdir()) == []
    assert root.exists()


def test_a_non_empty_root_owned_leftover_is_left_to_the_kernel(base: Path) -> None:
    """After a crash the kernel's work dir may hold entries: without root they cannot go,
    and emptying the work dir is not needed (the next mount clears it), so reset goes on."""
    _, upper, work = workspace(base)
    (work / "work" / "#1234").mkdir()
    as_user(lambda: reset_upper(upper, work, owner=USER, mode=0o755))
    assert list(upper.iterdir()) == []
    assert (work / "work" / "#1234").exists()


def test_a_work_dir_the_kernel_left_a_whiteout_in_is_parked_and_taken_again(base: Path) -> None:
    """Since Linux 5.8 an overlay that deleted something leaves its shared whiteout (a 0/0
    character device, root's) in ``work/work`` at every unmount. Removing the workspace
    without root parks the work dir beside the workspaces; the next overlay takes it (the
    kernel clears it at that mount) instead of piling them up."""
    root, _, work = workspace(base)
    os.mknod(work / "work" / "#3140", 0o000 | stat.S_IFCHR, os.makedev(0, 0))
    as_user(lambda: remove_workspace(root))
    assert not root.exists()
    [parked] = (base / "ws" / PARKED_WORK).iterdir()
    assert (parked / "work" / "#3140").exists()
    new_work = base / "ws" / "s2" / "work"
    new_work.parent.mkdir()
    os.chown(new_work.parent, *USER)
    as_user(lambda: take_work_dir(new_work))
    assert (new_work / "work" / "#3140").exists()  # the same directory, for the kernel to clear
    assert list((base / "ws" / PARKED_WORK).iterdir()) == []
    as_user(lambda: take_work_dir(base / "ws" / "s2" / "other"))  # none parked: a new one
    assert list((base / "ws" / "s2" / "other").iterdir()) == []


def test_a_layer_a_task_shut_with_chmod_000_is_reviewed_and_discarded(base: Path) -> None:
    """The task ran ``chmod 000 sub; chmod 000 .``: the upper's root and ``sub`` are the
    user's, mode 000. The review lists ``sub``'s mode change (the root's mode is not a
    change) and leaves both modes as the task set them; a discard empties the upper and
    gives its root the project's mode again."""
    lower, upper, work = base / "proj", base / "ws" / "upper", base / "ws" / "work"
    (lower / "sub").mkdir(parents=True)
    (lower / "sub" / "f").write_text("f\n")
    (upper / "sub").mkdir(parents=True)
    (upper / "new.txt").write_text("new\n")
    work.mkdir()
    for path in (lower, lower / "sub", lower / "sub" / "f", base / "ws", upper, work):
        os.chown(path, *USER)
    for path in (upper / "sub", upper / "new.txt"):
        os.chown(path, *USER)
    (upper / "sub").chmod(0)
    upper.chmod(0)
    manifest = Manifest.take(lower)
    mode_of_lower = stat.S_IMODE(lower.stat().st_mode)

    def review() -> None:
        got = {c.path: (c.kind, c.new_mode) for c in list_changes(lower, upper, manifest)}
        assert got == {"new.txt": ("added", 0o644), "sub": ("mode", 0)}

    as_user(review)
    assert stat.S_IMODE(upper.stat().st_mode) == 0
    assert stat.S_IMODE((upper / "sub").stat().st_mode) == 0
    as_user(lambda: reset_upper(upper, work, lower))
    assert list(upper.iterdir()) == []
    assert stat.S_IMODE(upper.stat().st_mode) == mode_of_lower
