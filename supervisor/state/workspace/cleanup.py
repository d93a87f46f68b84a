"""Emptying an upper for a fresh start, discarding a session's changes, removing its
workspace directory: as root, through mode-000 directories, at any depth."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from supervisor.state.workspace.errors import UnsafeWorkspacePath
from supervisor.state.workspace.fsutil import O_DIR, remove_entry


def _empty(path: Path) -> None:
    """Remove everything inside directory ``path`` (kept; created when missing)."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, O_DIR)
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it]
        for name in names:
            remove_entry(name, fd)
    finally:
        os.close(fd)


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
    _empty(work_p)
    if lower is not None:
        st = os.stat(lower)
        owner = owner or (st.st_uid, st.st_gid)
        mode = stat.S_IMODE(st.st_mode) if mode is None else mode
    fd = os.open(upper_p, O_DIR)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


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
    if path.exists():
        _remove_path(path)
