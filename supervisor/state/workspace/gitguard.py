"""Repositories inside an ``rw`` workspace: found at the session's start (bound read-only
into every task), and those a task created later put out of the host git's way.

A ``.git`` a task makes in an ``rw`` workspace is on the host at once; its ``config`` can name
programs (``core.fsmonitor``) that the user's next ``git status`` in that directory runs.
Overlay workspaces never apply one (``fsutil.protected``); ``rw`` has no review, so the
supervisor renames what appeared to ``.git.sandvisor-quarantined-<hex>`` (git ignores it)
before each task and at the session's end, and says so in the log.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass

from supervisor.state.workspace.errors import UnsafeWorkspacePath
from supervisor.state.workspace.fsutil import DirCache
from supervisor.state.workspace.manifest import HEAVY_DIRS

#: How far a search looks: deep enough for vendored clones and submodules, bounded so a
#: huge tree costs a task start no more than a few tens of milliseconds.
MAX_ENTRIES = 50_000
MAX_DEPTH = 16
QUARANTINE = ".git.sandvisor-quarantined-"


@dataclass(frozen=True)
class Found:
    """The ``.git`` entries of a tree (relative paths), those of them that are a plain
    directory or file (a bind can cover them), and whether the search saw it all."""

    paths: tuple[str, ...]
    plain: tuple[str, ...]
    complete: bool


def find_repositories(root_fd: int) -> Found:
    """Every ``.git`` directory or file under ``root_fd``: never follows a link, never
    leaves the root's filesystem, does not enter ``.git`` itself nor the heavy directories
    (node_modules, .venv, ...), stops after ``MAX_ENTRIES`` entries or ``MAX_DEPTH``."""
    dirs = DirCache(root_fd)
    found: list[str] = []
    plain: list[str] = []
    seen = 0
    complete = True
    pending = [("", 0)]
    try:
        while pending:
            rel, depth = pending.pop()
            try:
                fd = dirs.get(rel)
            except (OSError, UnsafeWorkspacePath):
                continue  # gone, swapped for a link, or another filesystem: not ours to walk
            with os.scandir(fd) as it:
                entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
            for name, st in entries:
                seen += 1
                path = f"{rel}/{name}" if rel else name
                if name == ".git":
                    found.append(path)
                    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                        plain.append(path)
                elif stat.S_ISDIR(st.st_mode) and name not in HEAVY_DIRS:
                    if depth + 1 >= MAX_DEPTH:
                        complete = False
                    else:
                        pending.append((path, depth + 1))
            if seen > MAX_ENTRIES:
                complete = False
                break
    finally:
        dirs.close()
    return Found(tuple(sorted(found)), tuple(sorted(plain)), complete)


def quarantine(root_fd: int, paths: list[str]) -> list[str]:
    """Rename each ``.git`` of ``paths`` (relative, found by ``find_repositories``) to
    ``.git.sandvisor-quarantined-<hex>`` beside it, where no git looks; returns the new
    paths (links included: a ``.git`` link can point git at a directory of the task's).
    Entries that are gone are left alone."""
    dirs = DirCache(root_fd)
    moved = []
    try:
        for path in paths:
            parent, _, name = path.rpartition("/")
            try:
                pfd = dirs.get(parent)
                os.lstat(name, dir_fd=pfd)
            except (OSError, UnsafeWorkspacePath):
                continue
            new = QUARANTINE + secrets.token_hex(4)
            os.rename(name, new, src_dir_fd=pfd, dst_dir_fd=pfd)
            moved.append(f"{parent}/{new}" if parent else new)
    finally:
        dirs.close()
    return moved
