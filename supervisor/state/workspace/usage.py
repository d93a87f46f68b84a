"""How much a session's overlay upper takes on the host disk: the bytes its entries have
allocated and how many entries it holds (each is an inode on the host). Walked without
following a link, by directory handle, and stopped early once past a limit: the workspace
cap only needs to know that it is exceeded."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from supervisor.state.workspace.fsutil import O_DIR


@dataclass(frozen=True)
class LayerUsage:
    """What the upper holds. When ``complete`` is false the walk stopped at a limit, and
    both counts are lower bounds."""

    bytes: int
    """Allocated bytes (``st_blocks``): what the host disk really gives it. A hard-linked
    file counts once."""
    files: int
    """Entries of every type (files, directories, links, whiteouts), the upper excluded."""
    complete: bool = True
    unreadable: int = 0
    """Directories the walk could not open (counted as entries, their content not)."""

    def over(self, max_bytes: int, max_files: int) -> bool:
        return self.bytes > max_bytes or self.files > max_files


def layer_usage(
    upper: str | os.PathLike[str],
    *,
    stop_bytes: int | None = None,
    stop_files: int | None = None,
) -> LayerUsage:
    """Measure ``upper``; stop as soon as the bytes pass ``stop_bytes`` or the entries pass
    ``stop_files``. A missing upper holds nothing."""
    try:
        top = os.open(Path(upper), O_DIR)
    except FileNotFoundError:
        return LayerUsage(0, 0)
    total = files = unreadable = 0
    seen: set[tuple[int, int]] = set()
    # Depth first, one open directory per level: the handles held are the depth, never a
    # directory's width.
    stack: list[tuple[int, Iterator[tuple[str, os.stat_result]]]] = []
    try:
        stack.append((top, _listing(top)))
    except OSError:
        os.close(top)
        return LayerUsage(0, 0, True, 1)
    try:
        while stack:
            fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                os.close(fd)
                continue
            name, st = entry
            files += 1
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += st.st_blocks * 512
            if (stop_bytes is not None and total > stop_bytes) or (
                stop_files is not None and files > stop_files
            ):
                return LayerUsage(total, files, False, unreadable)
            if stat.S_ISDIR(st.st_mode):
                try:
                    child = os.open(name, O_DIR, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError:
                    unreadable += 1
                    continue
                try:
                    stack.append((child, _listing(child)))
                except OSError:
                    os.close(child)
                    unreadable += 1
    finally:
        for fd, _ in stack:
            os.close(fd)
    return LayerUsage(total, files, True, unreadable)


def _listing(fd: int) -> Iterator[tuple[str, os.stat_result]]:
    """The entries of the directory ``fd`` with their ``lstat``, read at once (the directory
    stream is closed before the walk goes deeper)."""
    found: list[tuple[str, os.stat_result]] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                found.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue  # removed while we looked
    return iter(found)
