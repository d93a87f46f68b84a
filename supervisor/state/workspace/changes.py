"""Lists what an overlay upper changes in its lower, with conflicts against the manifest.

Walks the upper (offline) beside the lower and classifies every entry (``classify``);
``list_changes`` hashes every entry, a page (``paging.page_of``) only its own.
"""

from __future__ import annotations

import os
import posixpath
import stat
from operator import attrgetter
from pathlib import Path

from supervisor.state.workspace.errors import WorkspaceError
from supervisor.state.workspace.fsutil import (
    HEAD_BYTES,
    MAX_DEPTH,
    O_DIR,
    Identity,
    OwnerAccess,
    dir_markers,
    file_type,
    is_whiteout,
    looks_binary,
    lstat_at,
    open_project,
    read_head,
    same_bytes,
    too_deep,
    try_open_dir,
)
from supervisor.state.workspace.ignore import mark_ignored
from supervisor.state.workspace.manifest import Manifest, differs
from supervisor.state.workspace.models import Change, IgnoreRules
from supervisor.state.workspace.paging import add_digests

APPEARED = "appeared on the host since the session started"
REMOVED = "removed on the host since the session started"
CHANGED = "changed on the host since the session started"
SPECIAL_NOTE = "a device, fifo or socket: apply skips it"
MOUNT_NOTE = "another filesystem is mounted at this path on the host: apply refuses it"


def list_changes(
    lower: str | os.PathLike[str],
    upper: str | os.PathLike[str],
    manifest: Manifest,
    rules: IgnoreRules | None = None,
    *,
    lower_id: Identity | None = None,
) -> list[Change]:
    """Every change the (unmounted) ``upper`` makes to ``lower``, sorted by path (parents
    before children), each with its ``digest``. See ``Change`` for the fields; entries
    whose bytes and mode equal the lower's are left out, and a deleted directory is one
    change."""
    changes = classify(lower, upper, manifest, rules, lower_id=lower_id)
    add_digests(upper, changes)
    return changes


def classify(
    lower: str | os.PathLike[str],
    upper: str | os.PathLike[str],
    manifest: Manifest,
    rules: IgnoreRules | None = None,
    *,
    lower_id: Identity | None = None,
) -> list[Change]:
    """``list_changes`` without the digests (the walk, the conflicts and the ignore marks:
    what a page is cut from; hashing is left to the page's entries)."""
    walker = Walker(manifest)
    lower_fd = open_project(lower, lower_id)
    try:
        upper_fd = walker.access.open_dir(os.fspath(upper), None, O_DIR & ~os.O_NOFOLLOW)
        try:
            walker.dev = os.fstat(lower_fd).st_dev
            walker.walk_dir(upper_fd, lower_fd, "", False, 0)
            changes = [c for c in walker.changes if c is not None]
            changes.sort(key=attrgetter("path"))
            mark_ignored(
                Path(lower),
                lower_fd,
                upper_fd,
                changes,
                rules or IgnoreRules(),
                hidden=walker.hidden,
                ignore_touched=walker.ignore_touched,
            )
        finally:
            os.close(upper_fd)
            walker.access.close()
    finally:
        os.close(lower_fd)
    return changes


def _binary(name: str, dir_fd: int, size: int) -> bool:
    try:
        return looks_binary(read_head(name, dir_fd), size <= HEAD_BYTES)
    except OSError:
        return True


def _symlink_note(rel: str, target: str) -> str | None:
    if target.startswith("/"):
        return "symlink with an absolute target: apply copies the link, never what it points at"
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    if joined == ".." or joined.startswith("../"):
        return "symlink pointing out of the workspace: apply copies the link, never its target"
    return None


class Walker:
    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.dev = 0
        self.changes: list[Change | None] = []
        self.hidden: list[str] = []
        """Directories whose lower is hidden in the merged view (opaque or replaced)."""
        self.ignore_touched = False
        """An ignore file of the merged view differs from the lower's."""
        self.access = OwnerAccess()
        """The upper's directories a task shut, opened up for the walk."""

    # -- conflicts -----------------------------------------------------------------------

    def conflict(self, rel: str, lst: os.stat_result | None) -> str | None:
        sig = self.manifest.get(rel)
        if sig is None:
            if lst is None:
                return None
            if self.manifest.covers(rel):
                return APPEARED
            return CHANGED if self.manifest.changed_since(lst) else None
        if lst is None:
            return REMOVED
        if differs(sig, lst):
            return CHANGED
        if rel in self.manifest.skipped and sig[2] != lst.st_mtime_ns:
            return CHANGED  # its contents are not in the manifest: its mtime speaks for them
        return None

    def subtree_conflict(
        self, lower_fd: int, name: str, rel: str, lst: os.stat_result
    ) -> str | None:
        """For a lower directory about to be removed or replaced: the first host change in
        it since the manifest, as "<path>: <reason>"."""
        why = self.conflict(rel, lst)
        if why or rel in self.manifest.skipped or not self.manifest.covers(rel):
            return f"{rel}: {why}" if why else None
        seen: set[str] = set()
        fd = try_open_dir(name, lower_fd)
        if fd is None:
            return f"{rel}: {CHANGED}"
        try:
            found = self._scan(fd, rel + "/", seen, 0)
        finally:
            os.close(fd)
        if found:
            return found
        missing = next((p for p in self.manifest.under(rel) if p not in seen), None)
        return f"{missing}: {REMOVED}" if missing else None

    def _scan(self, fd: int, prefix: str, seen: set[str], depth: int) -> str | None:
        with os.scandir(fd) as it:
            listing = list(it)
        for entry in listing:
            rel = prefix + entry.name
            seen.add(rel)
            st = lstat_at(entry.name, fd)
            if st is None:
                continue
            why = self.conflict(rel, st)
            if why:
                return f"{rel}: {why}"
            if not stat.S_ISDIR(st.st_mode) or rel in self.manifest.skipped:
                continue
            if st.st_dev != self.dev or depth >= MAX_DEPTH:
                continue
            child = try_open_dir(entry.name, fd)
            if child is None:
                continue
            try:
                found = self._scan(child, rel + "/", seen, depth + 1)
            finally:
                os.close(child)
            if found:
                return found
        return None

    def _hide(self, rel: str, lower_fd: int | None, name: str) -> None:
        """The merged view no longer sees the lower directory ``rel``: a ``.gitignore`` in
        it no longer counts (git, reading the lower, would still apply it)."""
        self.hidden.append(rel)
        if self.ignore_touched or lower_fd is None:
            return
        if lstat_at(f"{name}/.gitignore", lower_fd) is not None or any(
            p.endswith("/.gitignore") for p in self.manifest.under(rel)
        ):
            self.ignore_touched = True

    # -- walking -------------------------------------------------------------------------

    def walk_dir(
        self, upper_fd: int, lower_fd: int | None, prefix: str, complete: bool, depth: int
    ) -> None:
        """Classify the entries of one upper directory. ``complete``: the upper directory
        is the whole merged directory (an opaque one, or inside one), so lower entries it
        lacks are deletions."""
        with os.scandir(upper_fd) as it:
            names = [e.name for e in it]
        for name in names:
            self.entry(upper_fd, lower_fd, prefix, name, complete, depth)
        if complete and lower_fd is not None:
            present = set(names)
            with os.scandir(lower_fd) as it:
                gone = [e.name for e in it if e.name not in present]
            for name in gone:
                lst = lstat_at(name, lower_fd)
                if lst is not None:
                    self.deleted(lower_fd, prefix + name, name, lst)

    def entry(
        self,
        upper_fd: int,
        lower_fd: int | None,
        prefix: str,
        name: str,
        complete: bool,
        depth: int,
    ) -> None:
        rel = prefix + name
        try:
            ust = os.lstat(name, dir_fd=upper_fd)
        except FileNotFoundError:
            return
        lst = lstat_at(name, lower_fd)
        if name == ".gitignore":
            self.ignore_touched = True
        if is_whiteout(ust):
            if lst is not None and lower_fd is not None:
                self.deleted(lower_fd, rel, name, lst)
            return
        if stat.S_ISDIR(ust.st_mode):
            self.directory(upper_fd, lower_fd, rel, name, ust, lst, complete, depth)
            return
        change = self.compare(upper_fd, lower_fd, rel, name, ust, lst)
        if change is not None:
            self.changes.append(change)

    def compare(
        self,
        upper_fd: int,
        lower_fd: int | None,
        rel: str,
        name: str,
        ust: os.stat_result,
        lst: os.stat_result | None,
    ) -> Change | None:
        """A non-directory upper entry against the lower's (None when they are equal)."""
        new_type = file_type(ust.st_mode)
        new_mode = stat.S_IMODE(ust.st_mode)
        change = Change(rel, "added", new_type, new_mode=new_mode)
        if new_type == "file":
            change.size = ust.st_size
        elif new_type == "symlink":
            change.target = os.readlink(name, dir_fd=upper_fd)
            change.size = len(os.fsencode(change.target))
            change.note = _symlink_note(rel, change.target)
        else:
            change.note = SPECIAL_NOTE
        if lst is not None:
            assert lower_fd is not None
            old_type = file_type(lst.st_mode)
            change.old_type = old_type
            change.old_mode = stat.S_IMODE(lst.st_mode)
            if old_type == "file":
                change.old_size = lst.st_size
            elif old_type == "symlink":
                change.old_target = os.readlink(name, dir_fd=lower_fd)
            if old_type != new_type:
                change.kind = "replaced"
                if old_type == "dir":
                    change.conflict_reason = self.subtree_conflict(lower_fd, name, rel, lst)
                    self._hide(rel, lower_fd, name)
            elif not self._differs(change, upper_fd, lower_fd, name, ust, lst):
                return None
        if change.conflict_reason is None:
            change.conflict_reason = self.conflict(rel, lst)
        change.conflict = change.conflict_reason is not None
        if new_type == "file":
            change.binary = _binary(name, upper_fd, ust.st_size)
            if ust.st_nlink > 1 and change.note is None:
                change.note = "hard-linked in the upper: apply copies the content"
        return change

    def _differs(
        self,
        change: Change,
        upper_fd: int,
        lower_fd: int,
        name: str,
        ust: os.stat_result,
        lst: os.stat_result,
    ) -> bool:
        """Same type on both sides: set the kind and say whether anything differs."""
        mode_differs = change.old_mode != change.new_mode
        t = change.file_type
        if t == "file":
            if ust.st_size != lst.st_size or not same_bytes(name, upper_fd, name, lower_fd):
                change.kind = "modified"
                return True
        elif t == "symlink":
            if change.target != change.old_target:
                change.kind = "modified"
                return True
            return False  # a symlink's own mode means nothing on Linux
        elif t in ("char_device", "block_device") and ust.st_rdev != lst.st_rdev:
            change.kind = "modified"
            return True
        if mode_differs:
            change.kind = "mode"
        return mode_differs

    def directory(
        self,
        upper_fd: int,
        lower_fd: int | None,
        rel: str,
        name: str,
        ust: os.stat_result,
        lst: os.stat_result | None,
        complete: bool,
        depth: int,
    ) -> None:
        if depth + 1 >= MAX_DEPTH:
            raise too_deep(rel)
        fd = self.access.open_dir(name, upper_fd)
        try:
            opaque, unsupported = dir_markers(fd)
            if unsupported:
                raise WorkspaceError(
                    f"{rel!r} carries {unsupported}: the overlay was mounted with redirect_dir "
                    "or metacopy on, which this engine does not read"
                )
            new_mode = stat.S_IMODE(ust.st_mode)
            if lst is not None and stat.S_ISDIR(lst.st_mode) and lst.st_dev != self.dev:
                # The overlay saw the directory under the host's mount point, which the
                # host cannot see: nothing to compare, nothing apply may write.
                self.changes.append(Change(rel, "added", "dir", new_mode=new_mode, note=MOUNT_NOTE))
                mark = len(self.changes)
                self.walk_dir(fd, None, rel + "/", False, depth + 1)
                for change in self.changes[mark:]:
                    if change is not None:
                        change.note = MOUNT_NOTE
                return
            if lst is not None and stat.S_ISDIR(lst.st_mode):
                self._merged_dir(fd, lower_fd, rel, name, ust, lst, opaque, complete, depth)
                return
            change = Change(rel, "added", "dir", new_mode=new_mode)
            if lst is not None:
                assert lower_fd is not None
                change.kind = "replaced"
                change.old_type = file_type(lst.st_mode)
                change.old_mode = stat.S_IMODE(lst.st_mode)
                if change.old_type == "symlink":
                    change.old_target = os.readlink(name, dir_fd=lower_fd)
                elif change.old_type == "file":
                    change.old_size = lst.st_size
                self._hide(rel, None, name)
            change.conflict_reason = self.conflict(rel, lst)
            change.conflict = change.conflict_reason is not None
            self.changes.append(change)
            self.walk_dir(fd, None, rel + "/", False, depth + 1)
        finally:
            os.close(fd)

    def _merged_dir(
        self,
        fd: int,
        lower_fd: int | None,
        rel: str,
        name: str,
        ust: os.stat_result,
        lst: os.stat_result,
        opaque: bool,
        complete: bool,
        depth: int,
    ) -> None:
        """An upper directory over a lower one: its own change (if any) goes before its
        children's, decided once they are known."""
        assert lower_fd is not None
        mark = len(self.changes)
        self.changes.append(None)
        if opaque and not complete:
            self._hide(rel, lower_fd, name)
        child_lower = try_open_dir(name, lower_fd)
        try:
            self.walk_dir(fd, child_lower, rel + "/", complete or opaque, depth + 1)
        finally:
            if child_lower is not None:
                os.close(child_lower)
        old_mode, new_mode = stat.S_IMODE(lst.st_mode), stat.S_IMODE(ust.st_mode)
        replaced = opaque and not complete and len(self.changes) > mark + 1
        if not replaced and old_mode == new_mode:
            return
        change = Change(
            rel,
            "replaced" if replaced else "mode",
            "dir",
            old_type="dir",
            old_mode=old_mode,
            new_mode=new_mode,
        )
        if replaced:
            change.note = "the upper holds the whole directory (removed and made again)"
        change.conflict_reason = self.conflict(rel, lst)
        change.conflict = change.conflict_reason is not None
        self.changes[mark] = change

    def deleted(self, lower_fd: int, rel: str, name: str, lst: os.stat_result) -> None:
        old_type = file_type(lst.st_mode)
        change = Change(
            rel, "deleted", old_type, old_type=old_type, old_mode=stat.S_IMODE(lst.st_mode)
        )
        if old_type == "file":
            change.size = change.old_size = lst.st_size
            change.binary = _binary(name, lower_fd, lst.st_size)
        elif old_type == "symlink":
            change.old_target = os.readlink(name, dir_fd=lower_fd)
            change.size = len(os.fsencode(change.old_target))
        if old_type == "dir":
            if lst.st_dev != self.dev:
                change.note = MOUNT_NOTE
            change.conflict_reason = self.subtree_conflict(lower_fd, name, rel, lst)
        else:
            change.conflict_reason = self.conflict(rel, lst)
        change.conflict = change.conflict_reason is not None
        self.changes.append(change)
