"""Applies listed changes to the lower: checks everything, then writes atomically with backups.

Checks first (containment, the upper still as listed, conflicts), then writes each entry
atomically behind a backup journal, and rolls back what it did when anything fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from supervisor.state.workspace.backup import JOURNAL, Store, copy_data, entry_sig
from supervisor.state.workspace.changes import Walker
from supervisor.state.workspace.errors import (
    UnsafeWorkspacePath,
    WorkspaceConflict,
    WorkspaceError,
)
from supervisor.state.workspace.fsutil import (
    MAX_DEPTH,
    O_DIR,
    O_READ,
    DirCache,
    Identity,
    file_type,
    lstat_at,
    open_project,
    open_regular,
    safe_mode,
)
from supervisor.state.workspace.manifest import Manifest
from supervisor.state.workspace.models import (
    ApplyResult,
    Change,
    display_path,
)
from supervisor.state.workspace.selection import Step, check_reviewed, select

log = structlog.get_logger(__name__)

_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _removes_lower_dir(step: Step) -> bool:
    c = step.change
    low = step.lower
    return (
        low is not None
        and stat.S_ISDIR(low.st_mode)
        and (c.kind == "deleted" or c.file_type != "dir")
    )


def _mount_inside(dir_fd: int, name: str, dev: int, depth: int = 0) -> bool:
    """Whether another filesystem is mounted somewhere in the tree ``dir_fd/name`` (a tree
    too deep to look through counts as one: it is not removed blind)."""
    if depth >= MAX_DEPTH:
        return True
    fd = os.open(name, O_DIR, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as it:
            subdirs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        for sub in subdirs:
            st = lstat_at(sub, fd)
            if st is None or not stat.S_ISDIR(st.st_mode):
                continue
            if st.st_dev != dev or _mount_inside(fd, sub, dev, depth + 1):
                return True
        return False
    finally:
        os.close(fd)


def _plan(steps: list[Step], ldirs: DirCache, udirs: DirCache) -> None:
    """Look at both trees before anything is written; raise if a step cannot be done."""
    kinds: dict[str, str] = {}  # lower prefix -> "dir" | "absent" | why it is refused
    new_dirs: set[str] = set()  # directories this apply makes where the lower has none
    unsafe: dict[str, list[str]] = {}
    stale: list[str] = []
    for step in steps:
        c = step.change
        if c.kind != "deleted":
            try:
                ust = lstat_at(step.name, udirs.get(step.parent))
            except (FileNotFoundError, UnsafeWorkspacePath):
                ust = None
            if ust is None or file_type(ust.st_mode) != c.file_type:
                stale.append(c.path)
                continue
        why = _ancestors(step, ldirs, kinds, new_dirs)
        if why:
            unsafe.setdefault(why, []).append(c.path)
            continue
        if not step.fresh:
            step.lower = lstat_at(step.name, ldirs.get(step.parent))
            low = step.lower
            if low is not None and stat.S_ISDIR(low.st_mode) and low.st_dev != ldirs.dev:
                unsafe.setdefault("another filesystem is mounted there", []).append(c.path)
                continue
            if _removes_lower_dir(step) and _mount_inside(
                ldirs.get(step.parent), step.name, ldirs.dev
            ):
                unsafe.setdefault("it holds a mount point", []).append(c.path)
                continue
        low = step.lower
        if (c.file_type == "dir" and c.kind != "deleted") and (
            low is None or not stat.S_ISDIR(low.st_mode)
        ):
            new_dirs.add(c.path)
    if unsafe:
        raise UnsafeWorkspacePath([p for ps in unsafe.values() for p in ps], "; ".join(unsafe))
    if stale:
        raise WorkspaceError(
            f"the upper no longer holds {len(stale)} listed change(s) (list them again): "
            + ", ".join(repr(p) for p in stale[:10])
        )


def _ancestors(
    step: Step, ldirs: DirCache, kinds: dict[str, str], new_dirs: set[str]
) -> str | None:
    """Check the lower's directories above a step: each must be a real directory on the
    lower's filesystem, absent, or made by an earlier step. Sets ``step.fresh``."""
    if not step.parent:
        return None
    parts = step.parent.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if prefix in new_dirs:
            step.fresh = True
            return None
        kind = kinds.get(prefix)
        if kind is None:
            kind = kinds[prefix] = _prefix_kind(prefix, ldirs)
        if kind == "absent":
            step.fresh = True
            return None
        if kind != "dir":
            return kind
    return None


def _prefix_kind(prefix: str, ldirs: DirCache) -> str:
    parent, _, name = prefix.rpartition("/")
    st = lstat_at(name, ldirs.get(parent))
    if st is None:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return "a directory on the way is a symlink in the host tree"
    if not stat.S_ISDIR(st.st_mode):
        return "a directory on the way is not a directory in the host tree"
    if st.st_dev != ldirs.dev:
        return "a directory on the way has another filesystem mounted"
    return "dir"


def _conflicts(
    steps: list[Step], ldirs: DirCache, manifest: Manifest | None, force: bool
) -> list[str]:
    """Paths in conflict (fresh from the manifest when given); raise unless ``force``."""
    found: list[str] = []
    walker = Walker(manifest) if manifest is not None else None
    if walker is not None:
        walker.dev = ldirs.dev
    for step in steps:
        c = step.change
        if walker is None:
            if c.conflict:
                found.append(c.path)
            continue
        if step.lower is not None and _removes_lower_dir(step):
            why = walker.subtree_conflict(ldirs.get(step.parent), step.name, c.path, step.lower)
        else:
            why = walker.conflict(c.path, step.lower)
        if why:
            found.append(c.path)
    if found and not force:
        raise WorkspaceConflict(found, "since the session started")
    return found


def _new_slot(backup_dir: Path) -> Path:
    """A fresh numbered directory for this apply's backup (undo takes the newest)."""
    backup_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    taken = [int(p.name) for p in backup_dir.iterdir() if p.name.isdigit()]
    slot = backup_dir / f"{max(taken, default=0) + 1:06d}"
    slot.mkdir(mode=0o700)
    return slot


def apply(
    lower: str | os.PathLike[str],
    upper: str | os.PathLike[str],
    changes: Sequence[Change],
    backup_dir: str | os.PathLike[str],
    *,
    owner: tuple[int, int],
    force: bool = False,
    include_ignored: bool = False,
    manifest: Manifest | None = None,
    lower_id: Identity | None = None,
    reviewed: Mapping[str, str] | None = None,
) -> ApplyResult:
    """Carry ``changes`` (from ``list_changes``) from the unmounted ``upper`` into ``lower``.

    Skips ignored changes (unless ``include_ignored``), devices, fifos and sockets, and
    ``.git/hooks``/``.git/config``. Before writing anything: raises UnsafeWorkspacePath if
    a path would leave the lower (a symlinked or foreign-mounted directory on the way),
    WorkspaceError if the upper no longer holds what was listed, WorkspaceConflict if any
    change conflicts (rechecked against ``manifest`` when given) unless ``force``. Every
    entry it creates is owned by ``owner`` with the upper's mode minus setuid/setgid;
    overwritten and deleted entries go to a new numbered backup under ``backup_dir`` (none
    when there is nothing to apply). On any failure what was done is rolled back and the
    error raised."""
    backup_root = Path(backup_dir)
    steps, skipped = select(changes, include_ignored)
    if reviewed is not None:
        check_reviewed([s.change for s in steps], changes, reviewed)
    lower_fd = open_project(lower, lower_id)
    upper_fd = os.open(upper, O_DIR & ~os.O_NOFOLLOW)
    ldirs, udirs = DirCache(lower_fd), DirCache(upper_fd)
    try:
        _plan(steps, ldirs, udirs)
        forced = _conflicts(steps, ldirs, manifest, force)
        if not steps:
            return ApplyResult(
                applied=[],
                created=0,
                overwritten=0,
                deleted=0,
                mode_changed=0,
                bytes_written=0,
                skipped=skipped,
                forced=[],
                backup_dir="",
            )
        slot = _new_slot(backup_root)
        store = Store(slot, ldirs.dev)
        run = _Run(store, ldirs, udirs, owner)
        try:
            root = os.fstat(lower_fd)
            store.record(
                "begin",
                "",
                root=[root.st_dev, root.st_ino],
                lower=os.fsdecode(os.fspath(lower)),
                time=time.time(),
            )
            for step in steps:
                run.step(step)
            run.finish()
            store.record("end", "", applied=len(run.applied))
        except BaseException:
            store.close()
            _rollback(lower, slot)
            raise
        store.close()
    finally:
        ldirs.close()
        udirs.close()
        os.close(lower_fd)
        os.close(upper_fd)
    return ApplyResult(
        applied=[display_path(p) for p in run.applied],
        created=run.created,
        overwritten=run.overwritten,
        deleted=run.deleted,
        mode_changed=run.mode_changed,
        bytes_written=run.bytes_written,
        skipped=skipped,
        forced=[display_path(p) for p in forced],
        backup_dir=str(slot),
    )


def _rollback(lower: str | os.PathLike[str], slot: Path) -> None:
    from supervisor.state.workspace.rollback import undo_slot  # noqa: PLC0415

    try:
        undo_slot(Path(lower), slot, force=True)
    except Exception:  # the apply's own error is the one to raise; this one is logged
        log.exception("workspace.rollback_failed", backup=str(slot))


class _Run:
    """Writes the planned steps; counts what it did."""

    def __init__(
        self, store: Store, ldirs: DirCache, udirs: DirCache, owner: tuple[int, int]
    ) -> None:
        self.store = store
        self.ldirs = ldirs
        self.udirs = udirs
        self.uid, self.gid = owner
        self.applied: list[str] = []
        self.created = self.overwritten = self.deleted = self.mode_changed = 0
        self.bytes_written = 0
        self.dir_modes: list[tuple[str, int]] = []

    def step(self, step: Step) -> None:
        c = step.change
        pfd = self._parent(step.parent)
        cur = lstat_at(step.name, pfd)
        if c.kind == "deleted":
            if cur is not None:
                self._remove(pfd, step.name, c.path, cur)
                self.deleted += 1
                self.applied.append(c.path)
            return
        if c.kind == "mode" and cur is not None and file_type(cur.st_mode) == c.file_type:
            self._chmod(pfd, step.name, c, cur)
            return
        if c.file_type == "dir":
            self._dir(pfd, step.name, c, cur)
        else:
            self._place(pfd, step, c, cur)
        self.applied.append(c.path)

    def finish(self) -> None:
        """Directory modes last, deepest first: a read-only directory is filled first."""
        for rel, mode in sorted(self.dir_modes, key=lambda x: x[0].count("/"), reverse=True):
            os.fchmod(self.ldirs.get(rel), mode)

    # -- helpers -------------------------------------------------------------------------

    def _parent(self, rel: str) -> int:
        """The lower directory ``rel``, making missing ones (a caller may pass a subset of
        the changes, without the directory's own)."""
        try:
            return self.ldirs.get(rel)
        except FileNotFoundError:
            parent, _, name = rel.rpartition("/")
            pfd = self._parent(parent)
            try:
                mode = os.fstat(self.udirs.get(rel)).st_mode
            except (OSError, UnsafeWorkspacePath):
                mode = 0o755
            self._mkdir(pfd, name, rel, safe_mode(mode))
            return self.ldirs.get(rel)

    def _mkdir(self, pfd: int, name: str, rel: str, mode: int) -> None:
        os.mkdir(name, 0o700, dir_fd=pfd)
        fd = os.open(name, O_DIR, dir_fd=pfd)
        try:
            os.fchown(fd, self.uid, self.gid)
            self.store.record("made", rel, after=list(entry_sig(os.fstat(fd))))
        finally:
            os.close(fd)
        self.dir_modes.append((rel, mode))
        self.created += 1

    def _remove(self, pfd: int, name: str, rel: str, cur: os.stat_result) -> None:
        self.store.take(pfd, name, rel, entry_sig(cur))
        if stat.S_ISDIR(cur.st_mode):
            self.ldirs.forget(rel)

    def _chmod(self, pfd: int, name: str, c: Change, cur: os.stat_result) -> None:
        mode = safe_mode(c.new_mode or 0, cur.st_mode)
        self.mode_changed += 1
        self.applied.append(c.path)
        if c.file_type == "symlink":
            return
        self.store.record("mode", c.path, ino=cur.st_ino, mode=stat.S_IMODE(cur.st_mode))
        if c.file_type == "dir":
            self.dir_modes.append((c.path, mode))
            return
        fd = os.open(name, O_READ, dir_fd=pfd)
        try:
            if os.fstat(fd).st_ino != cur.st_ino:
                raise WorkspaceError(f"{c.path!r} changed on the host while being applied")
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def _dir(self, pfd: int, name: str, c: Change, cur: os.stat_result | None) -> None:
        mode = safe_mode(c.new_mode or 0o755, cur.st_mode if cur is not None else None)
        if cur is not None and stat.S_ISDIR(cur.st_mode):
            # The lower keeps its directory (an opaque one over it, or one made on the
            # host meanwhile): only the mode follows the upper.
            if stat.S_IMODE(cur.st_mode) != mode:
                self.store.record("mode", c.path, ino=cur.st_ino, mode=stat.S_IMODE(cur.st_mode))
                self.dir_modes.append((c.path, mode))
            return
        if cur is not None:
            self._remove(pfd, name, c.path, cur)
            self.overwritten += 1
            self.created -= 1
        self._mkdir(pfd, name, c.path, mode)

    def _place(self, pfd: int, step: Step, c: Change, cur: os.stat_result | None) -> None:
        """A file or symlink: built under a temporary name beside its target, then linked
        in (when the target is absent: never overwrites what appeared meanwhile) or renamed
        over it (the old entry backed up first)."""
        tmp = f".sandvisor-apply-{secrets.token_hex(6)}"
        upfd = self.udirs.get(step.parent)
        # Journaled first, so an undo after a crash also removes a temporary left behind.
        self.store.record("tmp", c.path, tmp=tmp)
        try:
            if c.file_type == "file":
                old = cur.st_mode if cur is not None else None
                after = self._write_temp(upfd, step.name, pfd, tmp, old)
            else:
                os.symlink(os.readlink(step.name, dir_fd=upfd), tmp, dir_fd=pfd)
                os.chown(tmp, self.uid, self.gid, dir_fd=pfd, follow_symlinks=False)
                ust = os.lstat(step.name, dir_fd=upfd)
                os.utime(
                    tmp, ns=(ust.st_atime_ns, ust.st_mtime_ns), dir_fd=pfd, follow_symlinks=False
                )
                after = entry_sig(os.lstat(tmp, dir_fd=pfd))
            if cur is None:
                self.store.record("put", c.path, before=None, data=None, after=list(after))
                try:
                    os.link(tmp, step.name, src_dir_fd=pfd, dst_dir_fd=pfd, follow_symlinks=False)
                    os.unlink(tmp, dir_fd=pfd)
                    self.created += 1
                    return
                except FileExistsError:
                    cur = lstat_at(step.name, pfd)
                    if cur is None:  # pragma: no cover - gone again at once
                        raise
            before = entry_sig(cur)
            if stat.S_ISDIR(cur.st_mode):
                self._remove(pfd, step.name, c.path, cur)
                self.store.record("put", c.path, before=None, data=None, after=list(after))
                os.rename(tmp, step.name, src_dir_fd=pfd, dst_dir_fd=pfd)
            else:
                slot = self.store.keep(pfd, step.name)
                self.store.record("put", c.path, before=list(before), data=slot, after=list(after))
                os.replace(tmp, step.name, src_dir_fd=pfd, dst_dir_fd=pfd)
            self.overwritten += 1
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            raise

    def _write_temp(
        self, upfd: int, name: str, pfd: int, tmp: str, old: int | None
    ) -> tuple[int, int, int, int]:
        src = open_regular(name, upfd)
        try:
            sst = os.fstat(src)
            dst = os.open(tmp, _O_NEW, 0o600, dir_fd=pfd)
            try:
                self.bytes_written += copy_data(src, dst)
                os.fchown(dst, self.uid, self.gid)
                os.fchmod(dst, safe_mode(sst.st_mode, old))
                os.utime(dst, ns=(sst.st_atime_ns, sst.st_mtime_ns))
                return entry_sig(os.fstat(dst))
            finally:
                os.close(dst)
        finally:
            os.close(src)


__all__ = ["JOURNAL", "apply"]
