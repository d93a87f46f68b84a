"""Pages of a listing and the digests of what they show: hashing is the costly part of a
listing (it reads every file), so a page hashes its own entries only."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from operator import attrgetter

from supervisor.core.workspace_pages import PAGE_DEFAULT, cut
from supervisor.state.workspace.errors import WorkspaceError
from supervisor.state.workspace.fsutil import O_DIR, DirCache, OwnerAccess, open_regular
from supervisor.state.workspace.models import Change, ChangePage


def page_of(
    upper: str | os.PathLike[str],
    listing: list[Change],
    *,
    limit: int = PAGE_DEFAULT,
    after: str | None = None,
    ignored: bool = True,
) -> ChangePage:
    """One page of ``listing`` (from ``classify``): the entries after the path ``after``
    (``ignored=False``: leaving the ignored ones out), copies with their digests read from
    ``upper`` now; ``listing`` itself is not changed."""
    shown = listing if ignored else [c for c in listing if not c.ignored]
    page, following = cut(shown, attrgetter("path"), after, limit)
    page = [replace(c) for c in page]
    add_digests(upper, page)
    return ChangePage(page, len(shown), following)


def add_digests(upper: str | os.PathLike[str], changes: list[Change]) -> None:
    """Set each change's ``digest`` from the (unmounted) ``upper``'s entry as it is now."""
    access = OwnerAccess()
    upper_fd = access.open_dir(os.fspath(upper), None, O_DIR & ~os.O_NOFOLLOW)
    try:
        _digests(upper_fd, changes)
    finally:
        os.close(upper_fd)
        access.close()


def _digests(upper_fd: int, changes: list[Change]) -> None:
    """Set each change's ``digest`` from the upper's entry as it is now."""
    udirs = DirCache(upper_fd)
    try:
        for c in changes:
            h = hashlib.sha256(f"{c.kind}\0{c.file_type}\0{c.new_mode}\0".encode())
            if c.kind != "deleted" and c.file_type == "file":
                parent, _, name = c.path.rpartition("/")
                try:
                    fd = open_regular(name, udirs.get(parent))
                except (OSError, WorkspaceError):
                    h.update(b"\0unreadable")
                else:
                    try:
                        while chunk := os.read(fd, 1 << 20):
                            h.update(chunk)
                    finally:
                        os.close(fd)
            elif c.target is not None:
                h.update(os.fsencode(c.target))
            c.digest = h.hexdigest()
    finally:
        udirs.close()
