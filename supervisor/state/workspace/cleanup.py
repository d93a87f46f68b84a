"""Emptying or pruning an upper, discarding a session's changes, removing its workspace.

Through mode-000 directories, at any depth; as root, or as the user who owns the state
(the kernel's root-owned leftovers in the work dir are removed when empty, else left to the
kernel, which clears the work dir at every mount: a removed workspace's work dir is parked
for the next overlay to take).
"""

from __future__ import annotations

import bisect
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from supervisor.state.workspace.errors import UnsafeWorkspacePath
from supervisor.state.workspace.fsutil import (
    MAX_DEPTH,
    O_DIR,
    OwnerAccess,
    dir_markers,
)
from supervisor.state.workspace.models import Change
from supervisor.state.workspace.remove import remove_entry
from supervisor.state.workspace.selection import select


def _empty(path: Path) -> None:
    """Remove everything inside directory ``path`` (kept, with its mode; created when
    missing)."""
    path.mkdir(parents=True, exist_ok=True)
    access = OwnerAccess()
    fd = access.open_dir(os.fspath(path), None)
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it]
        for name in names:
            remove_entry(name, fd)
    finally:
        os.close(fd)
        access.close()


def _clear_work(path: Path) -> None:
    """Empty an overlay's work dir as far as permissions allow. The kernel owns what it
    leaves there (``work/work``, root's, mode 000) and clears it itself at the next mount,
    so what a supervisor without root cannot remove is left to it."""
    try:
        _empty(path)
    except PermissionError:
        return


def reset_upper(
    upper: str | os.PathLike[str],
    work: str | os.PathLike[str],
    lower: str | os.PathLike[str] | None = None,
    *,
    owner: tuple[int, int] | None = None,
    mode: int | None = None,
) -> None:
    """Empty ``upper`` and ``work`` (the overlay must be unmounted) for a fresh overlay.

    The merged root takes the upper's owner and mode, so they are set again: ``owner`` and
    ``mode`` when given, else those of ``lower``'s root when given, else left as they are
    (a task may have chmod-ed the workspace root, which changed the upper's)."""
    upper_p, work_p = Path(upper), Path(work)
    _empty(upper_p)
    _clear_work(work_p)
    if lower is not None:
        st = os.stat(lower)
        owner = owner or (st.st_uid, st.st_gid)
        mode = stat.S_IMODE(st.st_mode) if mode is None else mode
    access = OwnerAccess()
    fd = access.open_dir(os.fspath(upper_p), None)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
        access.close()  # the mode it had, unless a new one is set (which needs no access)
    if mode is not None:
        os.chmod(upper_p, mode, follow_symlinks=False)


def discard(
    upper: str | os.PathLike[str],
    work: str | os.PathLike[str],
    backup_dir: str | os.PathLike[str],
    lower: str | os.PathLike[str] | None = None,
    *,
    owner: tuple[int, int] | None = None,
    mode: int | None = None,
) -> None:
    """Drop every pending change (``reset_upper``) and every backup (no undo after this)."""
    reset_upper(upper, work, lower, owner=owner, mode=mode)
    _remove_path(Path(backup_dir))


def _remove_path(path: Path) -> None:
    parent = os.open(path.parent, O_DIR & ~os.O_NOFOLLOW)
    try:
        remove_entry(path.name, parent)
    finally:
        os.close(parent)


def remove_workspace(root: str | os.PathLike[str]) -> None:
    """Remove a session's whole workspace directory (upper, work, backups, manifest).
    Refuses (UnsafeWorkspacePath) a symlink, ``/`` and relative paths; a missing
    directory is fine."""
    path = Path(root)
    if not path.is_absolute() or path == Path("/") or path.is_symlink():
        raise UnsafeWorkspacePath([os.fspath(root)], "not a workspace directory to remove")
    if not path.exists():
        return
    try:
        _remove_path(path)
    except PermissionError:
        # Without root: the kernel's shared whiteout in ``work/work`` (root's, mode 000)
        # outlives every unmount of an overlay that deleted something. Park the work dir.
        if not _park_work(path):
            raise
        _remove_path(path)


#: Beside the workspaces: work dirs holding what the kernel left and a supervisor without
#: root cannot remove. ``take_work_dir`` hands them to new overlays (the kernel clears a work
#: dir when it mounts it), so there are never more than workspaces open at once. Session
#: ids start with a letter or digit: no session's directory has this name.
PARKED_WORK = ".kernel-work"


def _park_work(root: Path) -> bool:
    """Move ``root/work`` (the supervisor's own directory) to ``PARKED_WORK`` beside
    ``root``; False when there is no such directory."""
    work = root / "work"
    if work.is_symlink() or not work.is_dir():
        return False
    parked = root.parent / PARKED_WORK
    parked.mkdir(mode=0o700, exist_ok=True)
    os.rename(work, parked / f"{root.name}-{secrets.token_hex(4)}")
    return True


def take_work_dir(work: str | os.PathLike[str]) -> None:
    """Make ``work`` (``<ws>/<session>/work``), an overlay's work dir, unless it exists: a
    parked one when there is one (same filesystem, the kernel clears it at the mount), else
    a new, empty directory."""
    path = Path(work)
    if path.exists():
        return
    parked = path.parent.parent / PARKED_WORK
    try:
        names = sorted(os.listdir(parked))
    except FileNotFoundError:
        names = []
    for name in names:
        try:
            os.rename(parked / name, path)
        except FileNotFoundError:
            continue  # taken by another workspace's preparation meanwhile
        return
    path.mkdir()


def prune_upper(
    upper: str | os.PathLike[str],
    work: str | os.PathLike[str],
    changes: Sequence[Change],
    *,
    include_ignored: bool = False,
) -> int:
    """After a successful ``apply`` of ``changes`` (same ``include_ignored``): remove from the
    upper what is now in the lower, keep what apply skipped (ignored entries such as
    ``node_modules``, special files, ``.git/hooks``), so the merged view the session's next
    tasks see is unchanged. An alternative to ``reset_upper``, which drops everything.
    Returns how many upper entries stay. The overlay must be unmounted."""
    steps, _ = select(changes, include_ignored)
    applied = {s.change.path for s in steps}
    kept = sorted(c.path for c in changes if c.path not in applied)
    _clear_work(Path(work))
    fd = os.open(upper, O_DIR & ~os.O_NOFOLLOW)
    try:
        return _prune(fd, "", applied, kept, 0)
    finally:
        os.close(fd)


def _kept_below(kept: list[str], rel: str) -> bool:
    i = bisect.bisect_left(kept, rel + "/")
    return i < len(kept) and kept[i].startswith(rel + "/")


def _prune(fd: int, prefix: str, applied: set[str], kept: list[str], depth: int) -> int:
    """Prune one upper directory; how many entries stay in it."""
    stay = 0
    with os.scandir(fd) as it:
        names = [e.name for e in it]
    for name in names:
        rel = prefix + name
        st = os.lstat(name, dir_fd=fd)
        i = bisect.bisect_left(kept, rel)
        if i < len(kept) and kept[i] == rel:
            stay += 1  # a change apply skipped: the upper keeps it as it is
            continue
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)  # applied, or the same as the lower's
            continue
        child = os.open(name, O_DIR, dir_fd=fd)
        try:
            opaque, _ = dir_markers(child)
            if _kept_below(kept, rel):
                if opaque or depth + 1 >= MAX_DEPTH:
                    stay += 1  # it hides the lower's directory: kept whole
                    continue
                inner = _prune(child, rel + "/", applied, kept, depth + 1)
            else:
                inner = 0
        finally:
            os.close(child)
        if inner:
            stay += 1
        else:
            remove_entry(name, fd)
    return stay
