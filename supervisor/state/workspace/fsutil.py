"""File-level helpers: no-follow opening through directory fds, types, overlay markers.

Also content checks and git's protected paths. Removing a tree is ``remove``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.core.workspace_errors import WorkspaceMoved
from supervisor.state.workspace.errors import UnsafeWorkspacePath, WorkspaceError
from supervisor.state.workspace.models import Change, FileType

#: A directory, opened without following a symlink in its last component.
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Any entry opened for reading or fchmod; O_NONBLOCK so a FIFO swapped in never blocks.
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: How many bytes decide ``binary`` (git looks at the first 8000).
HEAD_BYTES = 8192
#: Deepest directory nesting walked (each level holds two fds and up to three stack frames,
#: well inside Python's default recursion limit of 1000). Not PATH_MAX deep on purpose: a
#: 4096-byte path nests up to 2048 directories, and walking both trees that deep without
#: re-resolving paths (what keeps a swapped directory from being followed) needs 4096
#: open directories, four times the default limit of 1024 file descriptors.
MAX_DEPTH = 256


def too_deep(rel: str, what: str = "the review") -> WorkspaceError:
    """The error for a tree nested deeper than ``MAX_DEPTH``, saying why and what to do."""
    return WorkspaceError(
        f"{rel!r} is nested deeper than {MAX_DEPTH} directories, where {what} stops: each "
        "level holds open directories of both trees (a depth of PATH_MAX would need more "
        "file descriptors than the default limit); discard the change, or flatten the tree "
        "in the sandbox and list again"
    )


OPAQUE_XATTRS = ("user.overlay.opaque", "trusted.overlay.opaque")
#: Overlay features that would make the upper mean something else than it seems
#: (a renamed directory, a file whose data is in the lower): never enabled by the runtime.
UNSUPPORTED_XATTRS = (
    "user.overlay.redirect",
    "trusted.overlay.redirect",
    "user.overlay.metacopy",
    "trusted.overlay.metacopy",
)

_TYPES: dict[int, FileType] = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char_device",
    stat.S_IFBLK: "block_device",
}
_SETID = stat.S_ISUID | stat.S_ISGID


def file_type(mode: int) -> FileType:
    """The entry type of an ``st_mode``."""
    return _TYPES[stat.S_IFMT(mode)]


#: Group and other write: an applied entry gets them only where the host's entry had them.
_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH


def safe_mode(mode: int, old: int | None = None) -> int:
    """Permission bits to give an applied entry: setuid and setgid stripped, group and
    other write masked unless the host's entry at that path (``old``, its st_mode) already
    had them (a ``chmod 0777`` in the sandbox must not make a world-writable directory on
    the host)."""
    keep = (old or 0) & _SHARED_WRITE
    return (stat.S_IMODE(mode) & ~_SETID & ~_SHARED_WRITE) | (stat.S_IMODE(mode) & keep)


def is_whiteout(st: os.stat_result) -> bool:
    """Overlay's deletion marker: a character device 0:0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def dir_markers(fd: int) -> tuple[bool, str | None]:
    """(opaque, name of an unsupported overlay xattr) of an upper directory."""
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return False, None
        raise
    if not names:
        return False, None
    bad = next((n for n in names if n in UNSUPPORTED_XATTRS), None)
    for name in OPAQUE_XATTRS:
        if name in names and os.getxattr(fd, name) == b"y":
            return True, bad
    return False, bad


#: A directory on the way to a project, opened only to walk through (no read permission
#: needed, never following a symlink).
_O_WALK = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: (st_dev, st_ino) of a project directory: what it was when its session opened.
Identity = tuple[int, int]


def identity_of(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino)


def open_project(path: str | os.PathLike[str], expect: Identity | None = None) -> int:
    """Open the absolute directory ``path`` for reading, walking it component by component
    from ``/`` with O_NOFOLLOW (what openat2's RESOLVE_NO_SYMLINKS does, which Python does
    not expose): a symlink anywhere on the way raises WorkspaceMoved, as does a directory
    whose (st_dev, st_ino) is not ``expect``. Workspace paths are realpaths, so a link on
    the way means the tree was changed since the session opened."""
    text = os.path.abspath(os.fspath(path))
    parts = [p for p in text.split("/") if p]
    fd = os.open("/", O_DIR if not parts else _O_WALK)
    for i, name in enumerate(parts):
        try:
            nxt = os.open(name, O_DIR if i == len(parts) - 1 else _O_WALK, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise
            where = "/" + "/".join(parts[: i + 1])
            what = "is missing" if exc.errno == errno.ENOENT else "is now a symlink"
            raise WorkspaceMoved(
                f"workspace {text!r}: {where} {what} (it was a directory when the session "
                "opened); refusing to follow it"
            ) from exc
        finally:
            os.close(fd)
        fd = nxt
    if expect is not None and identity_of(os.fstat(fd)) != tuple(expect):
        os.close(fd)
        raise WorkspaceMoved(
            f"workspace {text!r} is another directory than the one the session opened (it "
            "was moved or replaced); refusing to use it"
        )
    return fd


def check_project(path: str | os.PathLike[str], expect: Identity | None) -> None:
    """Raise WorkspaceMoved unless ``path`` still is the directory ``expect`` names."""
    os.close(open_project(path, expect))


#: Extended attributes that carry a POSIX ACL: with one, the mode bits alone do not say
#: who may read an entry.
_ACL_XATTRS = ("system.posix_acl_access",)


@dataclass(frozen=True, slots=True)
class Reader:
    """The credentials of a session's tasks (uid, gids): what a review may show of the
    lower is only what they could have read themselves. Decided from the mode bits, as the
    kernel does for a process without capabilities (tasks drop them all); an entry with an
    ACL counts as readable only by its owner (conservative: an ACL may deny what the bits
    seem to allow)."""

    uid: int
    gids: tuple[int, ...]

    def may(self, st: os.stat_result, want: int, *, acl: bool = False) -> bool:
        """Whether the permission bits ``want`` (4 read, 1 search/execute, ORed) of
        ``st`` are granted to this reader."""
        mode = st.st_mode
        if st.st_uid == self.uid:
            return (mode >> 6) & want == want
        if acl:
            return False
        if st.st_gid in self.gids:
            return (mode >> 3) & want == want
        return mode & want == want


def has_acl(name: str | None, dir_fd: int) -> bool:
    """Whether the entry ``name`` under ``dir_fd`` (or ``dir_fd`` itself) carries an ACL
    (``os.listxattr`` takes no dir_fd: the fd's /proc path stands in for it)."""
    path = f"/proc/self/fd/{dir_fd}" + (f"/{name}" if name is not None else "")
    try:
        names = os.listxattr(path, follow_symlinks=name is None)
    except OSError:
        return False
    return any(n in _ACL_XATTRS for n in names)


class OwnerAccess:
    """Opens the layer's directories that a task shut (``chmod 000 dir``) to a supervisor
    without root. Permission bits bind such a supervisor too, but the layer's directories
    are its own uid's: a shut one gets its owner's read, write and search for as long as
    the operation runs, and :meth:`close` puts every mode back exactly. As root (or for a
    directory of another owner) nothing is changed: the open fails as it would."""

    def __init__(self) -> None:
        self._held: list[tuple[int, int]] = []

    def open_dir(self, name: str, dir_fd: int | None, flags: int = O_DIR) -> int:
        """``os.open(name, flags, dir_fd=dir_fd)`` for a directory, as its owner."""
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except PermissionError:
            uid = os.geteuid()
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if uid == 0 or st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
                raise
            mode = stat.S_IMODE(st.st_mode)
            # fchmodat without following: a symlink swapped in is refused, never followed.
            os.chmod(name, mode | 0o700, dir_fd=dir_fd, follow_symlinks=False)
            fd = os.open(name, flags, dir_fd=dir_fd)
            if identity_of(os.fstat(fd)) != identity_of(st):
                os.fchmod(fd, mode)
                os.close(fd)
                raise
            self._held.append((os.dup(fd), mode))
            return fd

    def close(self) -> None:
        """Give every directory opened up its mode back (last opened first)."""
        while self._held:
            fd, mode = self._held.pop()
            with contextlib.suppress(OSError):
                os.fchmod(fd, mode)
            os.close(fd)


def open_dir(name: str, dir_fd: int) -> int:
    """Open the directory ``name`` under ``dir_fd``; a symlink raises (ELOOP or ENOTDIR)."""
    return os.open(name, O_DIR, dir_fd=dir_fd)


def try_open_dir(name: str, dir_fd: int | None) -> int | None:
    """Like ``open_dir``, None when it is missing, not a directory or a symlink."""
    if dir_fd is None:
        return None
    try:
        return os.open(name, O_DIR, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def lstat_at(name: str, dir_fd: int | None) -> os.stat_result | None:
    """``lstat`` relative to ``dir_fd``; None when missing (or when there is no directory)."""
    if dir_fd is None:
        return None
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_link(name: str, dir_fd: int) -> str:
    return os.readlink(name, dir_fd=dir_fd)


def open_regular(name: str, dir_fd: int) -> int:
    """Open a regular file for reading, refusing anything else that may sit there now."""
    fd = os.open(name, O_READ, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WorkspaceError(f"{name!r} is no longer a regular file")
    return fd


def read_head(name: str, dir_fd: int, size: int = HEAD_BYTES) -> bytes:
    """The first bytes of an entry just seen as a regular file. No type check after the
    open: O_NOFOLLOW and O_NONBLOCK already keep a swapped-in symlink or FIFO harmless."""
    fd = os.open(name, O_READ, dir_fd=dir_fd)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def looks_binary(head: bytes, full: bool) -> bool:
    """A NUL byte, or bytes that are not UTF-8. ``full`` says ``head`` is the whole file
    (else a character cut at its end is not held against it)."""
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return full or exc.end < len(head) or exc.reason != "unexpected end of data"
    return False


def same_bytes(name_a: str, fd_a: int, name_b: str, fd_b: int) -> bool:
    """Whether two regular files hold the same bytes (caller checked the sizes)."""
    a = open_regular(name_a, fd_a)
    try:
        b = open_regular(name_b, fd_b)
        try:
            while True:
                chunk = os.read(a, 1 << 20)
                if chunk != os.read(b, 1 << 20):
                    return False
                if not chunk:
                    return True
        finally:
            os.close(b)
    finally:
        os.close(a)


#: What under the project's ``.git`` makes the host's git run a program or look elsewhere
#: for its configuration or objects: hooks; config (core.fsmonitor, core.hooksPath,
#: aliases, filters); commondir and gitdir (another repository's config); info (attributes,
#: excludes, grafts); worktrees and modules (repositories of their own, with config and
#: hooks). Never applied nor put in a diff, whatever the options; nor is
#: ``objects/info`` (alternates: objects from anywhere).
PROTECTED = frozenset(
    {"hooks", "config", "config.worktree", "commondir", "gitdir", "info", "worktrees", "modules"}
)


#: Names that make git read another file wherever they are under ``.git`` (a config a later
#: commondir could name, a worktree's pointers).
_REDIRECTS = frozenset({"config", "config.worktree", "commondir", "gitdir"})


def protected(parts: list[str], git_created: bool = False) -> bool:
    """Whether a change's path (as components) is something of a repository the host's git
    would run or be redirected by: ``PROTECTED`` under the project's ``.git``, all of a
    ``.git`` the task created or replaced (``git_created``: a new repository's config), and
    every ``.git`` deeper in the project (nested clones, submodules' gitdir files)."""
    for i, part in enumerate(parts):
        if part != ".git":
            continue
        if i > 0 or git_created:
            return True
        rest = parts[1:]
        return bool(rest) and (
            rest[0] in PROTECTED
            or rest[-1] in _REDIRECTS
            or (rest[0] == "objects" and rest[1:2] == ["info"])
        )
    return False


def git_created(changes: Iterable[Change]) -> bool:
    """Whether the changes create the project's ``.git`` or replace it by another type (a
    gitdir file, a link): then all of it is protected."""
    return any(c.path == ".git" and c.kind in ("added", "replaced") for c in changes)


def split_relpath(path: str) -> list[str]:
    """The components of a change's path; refuses absolute paths, ``..``, ``.``, empty
    components and NUL bytes (no change the engine lists has them)."""
    parts = path.split("/")
    if not path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise UnsafeWorkspacePath([path], "not a plain relative path")
    return parts


class DirCache:
    """Open directory fds of one tree by relative path, walked from its root without
    following symlinks and without leaving the root's device; the least recently used are
    closed beyond ``size``."""

    def __init__(self, root_fd: int, size: int = 64) -> None:
        self.root_fd = root_fd
        self.dev = os.fstat(root_fd).st_dev
        self._size = size
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._access = OwnerAccess()

    def get(self, rel: str) -> int:
        """The fd of directory ``rel`` ("" is the root). Raises FileNotFoundError when a
        component is missing, UnsafeWorkspacePath when one is a symlink, not a directory
        or another filesystem mounted there."""
        if not rel:
            return self.root_fd
        fd = self._fds.get(rel)
        if fd is not None:
            self._fds.move_to_end(rel)
            return fd
        parent, _, name = rel.rpartition("/")
        pfd = self.get(parent)
        try:
            fd = self._access.open_dir(name, pfd)
        except (NotADirectoryError, OSError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeWorkspacePath(
                    [rel], "a directory on the way is a symlink or not a directory"
                ) from exc
            raise
        if os.fstat(fd).st_dev != self.dev:
            os.close(fd)
            raise UnsafeWorkspacePath([rel], "another filesystem is mounted there")
        self._fds[rel] = fd
        while len(self._fds) > self._size:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def forget(self, rel: str) -> None:
        """Close ``rel`` and everything under it (it was moved or removed)."""
        for key in [k for k in self._fds if k == rel or k.startswith(rel + "/")]:
            os.close(self._fds.pop(key))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._access.close()


def same_device_or_refuse(fd: int, dev: int, rel: str) -> None:
    if os.fstat(fd).st_dev != dev:
        raise UnsafeWorkspacePath([rel], "another filesystem is mounted there")
