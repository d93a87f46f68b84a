"""Undo of an apply: replays its journal backwards, refusing to overwrite later host edits.

Every entry the apply wrote must still be what it wrote: a later host edit is a conflict.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from supervisor.state.workspace.backup import Sig, entry_sig, read_journal, restore
from supervisor.state.workspace.errors import (
    NoBackup,
    UnsafeWorkspacePath,
    WorkspaceConflict,
    WorkspaceError,
)
from supervisor.state.workspace.fsutil import (
    O_DIR,
    O_READ,
    DirCache,
    Identity,
    lstat_at,
    open_project,
)
from supervisor.state.workspace.models import UndoResult, display_path
from supervisor.state.workspace.remove import remove_entry


def latest_backup(backup_dir: str | os.PathLike[str]) -> Path | None:
    """The newest apply's backup under ``backup_dir`` (None when there is none)."""
    root = Path(backup_dir)
    try:
        slots = sorted(
            p for p in root.iterdir() if p.name.isdigit() and (p / "journal.jsonl").exists()
        )
    except FileNotFoundError:
        return None
    return slots[-1] if slots else None


def undo(
    lower: str | os.PathLike[str],
    backup_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    lower_id: Identity | None = None,
) -> UndoResult:
    """Undo the newest apply recorded under ``backup_dir``: the lower gets back every entry
    it overwrote or deleted (bytes, mode, owner, times, inode when the backup shares the
    lower's filesystem) and loses every entry it created. Raises NoBackup when there is
    nothing to undo, WorkspaceConflict (nothing changed) when an entry the apply wrote was
    changed on the host since, unless ``force``: then those entries are left as they are
    and listed in ``kept``. The backup is removed afterwards."""
    slot = latest_backup(backup_dir)
    if slot is None:
        raise NoBackup(f"no apply to undo in {os.fspath(backup_dir)!r}")
    return undo_slot(Path(lower), slot, force=force, lower_id=lower_id)


#: In a backup directory: inode numbers an undo gave entries it restored by copying
#: (path -> {old inode: new inode}), so an older apply's undo still knows them.
INODES = "inodes.json"


class _Undo:
    def __init__(
        self,
        ldirs: DirCache,
        records: list[dict[str, Any]],
        data_fd: int,
        same_fs: bool,
        inodes: dict[str, dict[str, int]],
    ) -> None:
        self.inodes = inodes
        self.ldirs = ldirs
        self.records = records
        self.data_fd = data_fd
        self.same_fs = same_fs
        self.created = {r["path"] for r in records if r["op"] == "made"} | {
            r["path"] for r in records if r["op"] == "put" and r.get("before") is None
        }

    def _matches(self, path: str, st: os.stat_result | None, sig: list[int] | None) -> bool:
        if st is None or sig is None:
            return False
        have, want = entry_sig(st), tuple(sig)
        if have == want:
            return True
        moved = self.inodes.get(path, {}).get(str(want[1]))
        return moved is not None and have == (want[0], moved, *want[2:])

    def _here(self, path: str) -> tuple[int | None, str, os.stat_result | None]:
        parent, _, name = path.rpartition("/")
        try:
            pfd = self.ldirs.get(parent)
        except (FileNotFoundError, UnsafeWorkspacePath):
            return None, name, None
        return pfd, name, lstat_at(name, pfd)

    def _has_data(self, slot: str | None) -> bool:
        return slot is not None and lstat_at(slot, self.data_fd) is not None

    def conflict(self, r: dict[str, Any]) -> bool:
        """Whether undoing record ``r`` would touch something the host changed."""
        op, path = r["op"], r["path"]
        pfd, _, cur = self._here(path)
        if op in ("begin", "end", "tmp"):
            return False
        if pfd is None:
            # The parent went away: only fine when nothing is to be put back.
            return op in ("del", "put") and self._has_data(r.get("data"))
        if op == "put":
            return not (
                cur is None
                or self._matches(path, cur, r.get("after"))
                or self._matches(path, cur, r.get("before"))
            )
        if op == "del":
            return not (cur is None or self._matches(path, cur, r.get("before")))
        if op == "made":
            if cur is None:
                return False
            if not self._matches(path, cur, r.get("after")):
                return True
            prefix = path + "/"
            with os.scandir(self.ldirs.get(path)) as it:
                return any(prefix + e.name not in self.created for e in it)
        if op == "mode":
            return cur is not None and cur.st_ino != r["ino"]
        raise WorkspaceError(f"unknown journal record {op!r}")

    def revert(self, r: dict[str, Any], result: dict[str, list[str]]) -> None:
        op, path = r["op"], r["path"]
        if op in ("begin", "end"):
            return
        pfd, name, cur = self._here(path)
        if pfd is None:
            return
        if op == "tmp":
            tmp = lstat_at(r["tmp"], pfd)
            if tmp is not None and not stat.S_ISDIR(tmp.st_mode):
                os.unlink(r["tmp"], dir_fd=pfd)
            return
        slot = r.get("data")
        has_data = self._has_data(slot)
        if op == "mode":
            if cur is not None and not stat.S_ISLNK(cur.st_mode):
                fd = os.open(name, O_READ if not stat.S_ISDIR(cur.st_mode) else O_DIR, dir_fd=pfd)
                try:
                    os.fchmod(fd, r["mode"])
                finally:
                    os.close(fd)
                result["restored"].append(path)
            return
        if op == "made":
            if cur is not None:
                self.ldirs.forget(path)
                os.rmdir(name, dir_fd=pfd)
                result["removed"].append(path)
            return
        if op == "put" and self._matches(path, cur, r.get("before")):
            cur = None  # never replaced: the backup is a link to, or a copy of, this very entry
            if has_data and slot is not None:
                remove_entry(slot, self.data_fd)
            return
        if op == "del" and cur is not None and not has_data:
            return  # the removal never happened
        if cur is not None:
            if stat.S_ISDIR(cur.st_mode):
                self.ldirs.forget(path)
            remove_entry(name, pfd)
            if not has_data:
                result["removed"].append(path)
        if has_data and slot is not None:
            if restore(self.data_fd, slot, self.same_fs, pfd, name) and r.get("before"):
                new = os.lstat(name, dir_fd=pfd).st_ino
                self.inodes.setdefault(path, {})[str(r["before"][1])] = new
            result["restored"].append(path)


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def undo_slot(
    lower: Path, slot: Path, *, force: bool = False, lower_id: Identity | None = None
) -> UndoResult:
    """Undo the apply whose backup is ``slot`` (see ``undo``)."""
    records = list(read_journal(slot))
    if not records:
        raise NoBackup(f"no apply to undo in {os.fspath(slot)!r}")
    lower_fd = open_project(lower, lower_id)
    data_fd = os.open(slot / "data", O_DIR)
    ldirs = DirCache(lower_fd)
    try:
        begin = records[0]
        root = os.fstat(lower_fd)
        if begin.get("op") == "begin" and begin.get("root") != [root.st_dev, root.st_ino]:
            raise WorkspaceError(
                f"{os.fspath(slot)!r} is the backup of another directory ({begin.get('lower')!r})"
            )
        inodes_file = slot.parent / INODES
        try:
            inodes = json.loads(inodes_file.read_text())
        except FileNotFoundError:
            inodes = {}
        except ValueError as exc:
            raise WorkspaceError(f"{inodes_file} is damaged") from exc
        same_fs = os.fstat(data_fd).st_dev == root.st_dev
        job = _Undo(ldirs, records, data_fd, same_fs, inodes)
        # Only a path's last record says what should be there now; its earlier ones are
        # undone after it, from the state it leaves.
        last = {r["path"]: r for r in records if r["op"] not in ("begin", "end", "tmp")}
        conflicts = [path for path, r in last.items() if job.conflict(r)]
        if conflicts and not force:
            raise WorkspaceConflict(conflicts, "since the apply")
        skip = set(conflicts)
        result: dict[str, list[str]] = {"restored": [], "removed": []}
        try:
            for r in reversed(records):
                if r["path"] not in skip:
                    job.revert(r, result)
        finally:
            if inodes:
                _write_json(inodes_file, inodes)
    finally:
        ldirs.close()
        os.close(data_fd)
        os.close(lower_fd)
    parent_fd = os.open(slot.parent, O_DIR)
    try:
        remove_entry(slot.name, parent_fd)
    finally:
        os.close(parent_fd)
    return UndoResult(
        restored=[display_path(p) for p in result["restored"]],
        removed=[display_path(p) for p in result["removed"]],
        kept=[display_path(p) for p in conflicts],
    )


__all__ = ["Sig", "latest_backup", "undo", "undo_slot"]
