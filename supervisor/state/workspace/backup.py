"""Backups of what apply overwrites or deletes: a write-ahead journal plus the old entries.

The old entries are hard links or moves on the lower's filesystem, exact copies elsewhere,
so ``undo`` puts the lower back as it was, also after a crash in the middle of an apply.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from supervisor.state.workspace.errors import WorkspaceError
from supervisor.state.workspace.fsutil import MAX_DEPTH, O_DIR, O_READ, too_deep
from supervisor.state.workspace.remove import remove_entry

JOURNAL = "journal.jsonl"
DATA = "data"
#: (file type bits, inode, size, mtime_ns): what undo checks an entry still is. No ctime:
#: a rename moves it on ext4; directories carry size and mtime 0 (children move them).
Sig = tuple[int, int, int, int]


def entry_sig(st: os.stat_result) -> Sig:
    if stat.S_ISDIR(st.st_mode):
        return (stat.S_IFDIR, st.st_ino, 0, 0)
    return (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns)


def copy_data(src: int, dst: int) -> int:
    """Copy all of ``src`` into ``dst`` (both fds at offset 0); bytes copied."""
    total = 0
    try:
        while True:
            n = os.copy_file_range(src, dst, 1 << 30)
            if n == 0:
                return total
            total += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    while True:
        chunk = os.read(src, 1 << 20)
        if not chunk:
            return total
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
        total += len(chunk)


def copy_exact(
    src_dir: int,
    name: str,
    dst_dir: int,
    dst_name: str,
    links: dict[tuple[int, int], tuple[int, str]] | None = None,
    depth: int = 0,
) -> None:
    """Copy an entry (a whole tree for a directory) keeping type, bytes, mode bits
    (setuid included), owner and times; hard links inside the tree stay links. Used for
    backups only: never follows a symlink."""
    st = os.lstat(name, dir_fd=src_dir)
    links = {} if links is None else links
    mode = st.st_mode
    if stat.S_ISREG(mode) and st.st_nlink > 1:
        known = links.get((st.st_dev, st.st_ino))
        if known is not None:
            os.link(
                known[1], dst_name, src_dir_fd=known[0], dst_dir_fd=dst_dir, follow_symlinks=False
            )
            return
        links[(st.st_dev, st.st_ino)] = (dst_dir, dst_name)
    if stat.S_ISREG(mode):
        src = os.open(name, O_READ, dir_fd=src_dir)
        try:
            dst = os.open(
                dst_name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dst_dir,
            )
            try:
                copy_data(src, dst)
                os.fchown(dst, st.st_uid, st.st_gid)
                os.fchmod(dst, stat.S_IMODE(mode))
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dst)
        finally:
            os.close(src)
        return
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(name, dir_fd=src_dir), dst_name, dir_fd=dst_dir)
    elif stat.S_ISDIR(mode):
        if depth >= MAX_DEPTH:
            raise too_deep(name, "the backup")
        os.mkdir(dst_name, 0o700, dir_fd=dst_dir)
        sfd = os.open(name, O_DIR, dir_fd=src_dir)
        try:
            dfd = os.open(dst_name, O_DIR, dir_fd=dst_dir)
            try:
                with os.scandir(sfd) as it:
                    children = [e.name for e in it]
                for child in children:
                    copy_exact(sfd, child, dfd, child, links, depth + 1)
                os.fchown(dfd, st.st_uid, st.st_gid)
                os.fchmod(dfd, stat.S_IMODE(mode))
                os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        return
    else:
        os.mknod(dst_name, mode, st.st_rdev, dir_fd=dst_dir)
    os.chown(dst_name, st.st_uid, st.st_gid, dir_fd=dst_dir, follow_symlinks=False)
    os.utime(dst_name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst_dir, follow_symlinks=False)
    if not stat.S_ISLNK(mode):
        os.chmod(dst_name, stat.S_IMODE(mode), dir_fd=dst_dir, follow_symlinks=False)


class Store:
    """One apply's backup: ``<dir>/journal.jsonl`` and ``<dir>/data/<n>``."""

    def __init__(self, root: Path, lower_dev: int) -> None:
        self.root = root
        data = root / DATA
        data.mkdir(parents=True, mode=0o700)
        self.data_fd = os.open(data, O_DIR)
        self.same_fs = os.fstat(self.data_fd).st_dev == lower_dev
        self._n = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._journal = os.open(root / JOURNAL, flags, 0o600)

    def close(self) -> None:
        os.close(self._journal)
        os.close(self.data_fd)

    def record(self, op: str, path: str, **fields: Any) -> None:
        """Append one journal record straight to the kernel (a crash of this process loses
        nothing; a power loss is not covered). ASCII: names that are not UTF-8 are
        escaped by json (and read back exactly)."""
        line = json.dumps({"op": op, "path": path, **fields}) + "\n"
        os.write(self._journal, line.encode("ascii"))

    def _slot(self) -> str:
        self._n += 1
        return str(self._n)

    def keep(self, dir_fd: int, name: str) -> str:
        """Back up a non-directory that stays in place until replaced: a hard link on the
        same filesystem (no copy, same inode), else an exact copy. Returns the slot."""
        slot = self._slot()
        if self.same_fs:
            try:
                os.link(
                    name, slot, src_dir_fd=dir_fd, dst_dir_fd=self.data_fd, follow_symlinks=False
                )
                return slot
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
        copy_exact(dir_fd, name, self.data_fd, slot)
        return slot

    def take(self, dir_fd: int, name: str, path: str, before: Sig) -> None:
        """Move an entry (a directory with its tree) out of the lower into the backup and
        journal it as deleted: the record goes first, then a rename on the same filesystem;
        elsewhere an exact copy, the record, then the removal (``dev`` checked)."""
        slot = self._slot()
        if self.same_fs:
            self.record("del", path, before=list(before), data=slot)
            try:
                os.rename(name, slot, src_dir_fd=dir_fd, dst_dir_fd=self.data_fd)
                return
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            copy_exact(dir_fd, name, self.data_fd, slot)
        else:
            copy_exact(dir_fd, name, self.data_fd, slot)
            self.record("del", path, before=list(before), data=slot)
        remove_entry(name, dir_fd)


def read_journal(root: Path) -> Iterator[dict[str, Any]]:
    path = root / JOURNAL
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if n == len(text.splitlines()):
                return  # a torn last line: the process died writing it; the op never ran
            raise WorkspaceError(f"backup journal {path} is damaged at line {n}") from exc
        yield record


def restore(data_fd: int, slot: str, same_fs: bool, dir_fd: int, name: str) -> bool:
    """Put a backed-up entry back at ``dir_fd/name`` (absent); True when it was copied (a
    new inode), False when renamed back (the very same inode)."""
    if same_fs:
        try:
            os.rename(slot, name, src_dir_fd=data_fd, dst_dir_fd=dir_fd)
            return False
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
    copy_exact(data_fd, slot, dir_fd, name)
    remove_entry(slot, data_fd)
    return True
