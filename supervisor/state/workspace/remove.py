"""Removing a tree under a directory fd: never follows a symlink, never leaves its device,
clears the permission bits that stand in the way (a supervisor without root is bound by
them too) and handles any depth."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable

from supervisor.state.workspace.errors import WorkspaceError
from supervisor.state.workspace.fsutil import O_DIR, lstat_at


def remove_entry(name: str, dir_fd: int, *, dev: int | None = None) -> None:
    """Remove ``name`` under ``dir_fd`` whatever it is, a whole tree included: never follows
    a symlink, never enters another filesystem (``dev``, default the parent's: raises
    WorkspaceError on a mount point), clears permission bits that stand in the way, and
    handles any depth (deep chains are moved up next to the tree and removed from there)."""
    st = lstat_at(name, dir_fd)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    if _rmdir_if_empty(name, dir_fd):
        return
    dev = os.fstat(dir_fd).st_dev if dev is None else dev
    pending = [name]
    while pending:
        top = pending.pop()
        _empty_dir(top, dir_fd, dev, pending)
        _rmdir(top, dir_fd)


def _rmdir(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        _writable(dir_fd, os.rmdir, name)


def _rmdir_if_empty(name: str, dir_fd: int) -> bool:
    """Remove an empty directory; False when it holds entries. Needs no permission on the
    directory itself, only on its parent: a non-root supervisor so removes the empty,
    root-owned mode-000 ``work/work`` the kernel leaves in an overlay's work dir."""
    try:
        _writable(dir_fd, os.rmdir, name)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
            return False
        raise
    return True


def _writable(dir_fd: int, op: Callable[..., None], name: str) -> None:
    """``op(name, dir_fd=dir_fd)``; when the directory's mode stands in the way (a task
    made it read-only), give its owner write and search on it and try once more (without
    root, permission bits bind the supervisor too)."""
    try:
        op(name, dir_fd=dir_fd)
    except PermissionError:
        st = os.fstat(dir_fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o300 == 0o300:
            raise  # not ours to chmod, or not the mode that stands in the way
        os.fchmod(dir_fd, stat.S_IMODE(st.st_mode) | 0o700)
        op(name, dir_fd=dir_fd)


def _open_for_removal(name: str, dir_fd: int, dev: int) -> int:
    try:
        fd = os.open(name, O_DIR, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd, follow_symlinks=False)
        fd = os.open(name, O_DIR, dir_fd=dir_fd)
    if os.fstat(fd).st_dev != dev:
        os.close(fd)
        raise WorkspaceError(f"refusing to remove {name!r}: another filesystem is mounted there")
    return fd


#: Depth at which ``remove_entry`` moves a subtree up instead of descending further.
_FLATTEN_AT = 64


def _empty_dir(name: str, parent_fd: int, dev: int, pending: list[str]) -> None:
    """Remove everything inside ``parent_fd/name`` (kept); subtrees deeper than
    ``_FLATTEN_AT`` are renamed next to ``name`` and queued in ``pending``."""
    stack: list[tuple[int, list[os.DirEntry[str]]]] = []
    fd = _open_for_removal(name, parent_fd, dev)
    stack.append((fd, list(os.scandir(fd))))
    try:
        while stack:
            fd, entries = stack[-1]
            if not entries:
                stack.pop()
                os.close(fd)
                if stack:
                    # The directory just emptied is the entry the parent is on.
                    pfd, pentries = stack[-1]
                    _rmdir(pentries.pop().name, pfd)
                continue
            entry = entries[-1]
            if not entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    _writable(fd, os.unlink, entry.name)
                entries.pop()
                continue
            if len(stack) >= _FLATTEN_AT:
                moved = f".sandvisor-rm-{secrets.token_hex(8)}"
                os.rename(entry.name, moved, src_dir_fd=fd, dst_dir_fd=parent_fd)
                pending.append(moved)
                entries.pop()
                continue
            if _rmdir_if_empty(entry.name, fd):
                entries.pop()
                continue
            child = _open_for_removal(entry.name, fd, dev)
            stack.append((child, list(os.scandir(child))))
    finally:
        for fd, _ in stack:
            os.close(fd)
