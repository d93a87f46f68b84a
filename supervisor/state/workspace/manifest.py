"""The stat snapshot of a lower taken when its session opens; conflicts are changes since.

Saved as one compressed binary file (100 000 entries load in tens of ms).
"""

from __future__ import annotations

import bisect
import json
import os
import stat
import struct
import time
import zlib
from collections.abc import Collection, Iterable
from pathlib import Path

from supervisor.state.workspace.errors import WorkspaceError
from supervisor.state.workspace.fsutil import MAX_DEPTH, O_DIR, Identity, open_project

#: (st_mode, st_size, st_mtime_ns, st_ctime_ns, st_ino) of one entry.
Sig = tuple[int, int, int, int, int]

#: Directories whose contents the snapshot leaves out (only the directory's own stat is
#: kept) unless git tracks a file inside: caches and installs, often most of a tree.
HEAVY_DIRS: frozenset[str] = frozenset(
    {
        ".git",
        "node_modules",
        "bower_components",
        ".venv",
        "venv",
        "__pycache__",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        ".cache",
        ".next",
        ".nuxt",
        ".gradle",
        ".turbo",
        ".parcel-cache",
        "target",
    }
)
#: Inside a skipped directory an entry counts as changed when its ctime or mtime is later
#: than the snapshot's start less this: file times come from the kernel's coarse clock,
#: up to a tick (4 to 10 ms) behind ``time.time_ns()``.
CLOCK_SLACK_NS = 50_000_000

_MAGIC = b"SANDVISORMANIFEST 1\n"
_RECORD = struct.Struct("<IQqqQ")


def sig_of(st: os.stat_result) -> Sig:
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def differs(sig: Sig, st: os.stat_result) -> bool:
    """Whether ``st`` is not the entry the snapshot saw. A directory is compared by type
    and mode only (its times move with every child, and children are compared one by one)."""
    if stat.S_IFMT(sig[0]) != stat.S_IFMT(st.st_mode):
        return True
    if stat.S_ISDIR(st.st_mode):
        return sig[0] != st.st_mode
    return sig != sig_of(st)


class Manifest:
    """Relative path -> ``Sig`` of every entry of a lower (the root itself excluded), except
    the contents of ``skipped`` directories (heavy ones, mount points, too deep)."""

    __slots__ = ("_keys", "_skipped", "entries", "root", "since_ns")

    def __init__(
        self, root: str, since_ns: int, entries: dict[str, Sig], skipped: Iterable[str] = ()
    ) -> None:
        self.root = root
        """The lower's path when the snapshot was taken (for messages)."""
        self.since_ns = since_ns
        """``time.time_ns()`` when the snapshot started."""
        self.entries = entries
        self._skipped = frozenset(skipped)
        self._keys: list[str] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def skipped(self) -> frozenset[str]:
        """Directories whose contents are not in the snapshot."""
        return self._skipped

    def get(self, path: str) -> Sig | None:
        return self.entries.get(path)

    def covers(self, path: str) -> bool:
        """Whether the snapshot looked at ``path`` (it lies under no skipped directory)."""
        if not self._skipped:
            return True
        end = path.find("/")
        while end != -1:
            if path[:end] in self._skipped:
                return False
            end = path.find("/", end + 1)
        return True

    def under(self, prefix: str) -> list[str]:
        """Paths recorded strictly inside directory ``prefix``, sorted."""
        if self._keys is None:
            self._keys = sorted(self.entries)
        keys = self._keys
        lo = bisect.bisect_left(keys, prefix + "/")
        hi = bisect.bisect_left(keys, prefix + "0")  # "0" follows "/"
        return keys[lo:hi]

    def changed_since(self, st: os.stat_result) -> bool:
        """For entries under a skipped directory: changed after the snapshot started."""
        return max(st.st_ctime_ns, st.st_mtime_ns) >= self.since_ns - CLOCK_SLACK_NS

    # -- taking --------------------------------------------------------------------------

    @classmethod
    def take(
        cls,
        lower: str | os.PathLike[str],
        *,
        skip: Collection[str] = HEAVY_DIRS,
        tracked: Collection[str] | None = None,
        lower_id: Identity | None = None,
    ) -> Manifest:
        """Snapshot ``lower``: never follows a symlink, never enters another filesystem,
        stops ``MAX_DEPTH`` levels down. Directories named in ``skip`` are left out unless
        one of the ``tracked`` paths (git's tracked files; asked from git when None) lies
        inside."""
        since = time.time_ns()
        if tracked is None:
            from supervisor.state.workspace.gitcmd import tracked_files  # noqa: PLC0415

            tracked = tracked_files(Path(lower)) or ()
        keep = _tracked_dirs(tracked) if skip else frozenset()
        root_fd = open_project(lower, lower_id)
        entries: dict[str, Sig] = {}
        skipped: list[str] = []
        try:
            dev = os.fstat(root_fd).st_dev
            _walk(root_fd, "", dev, frozenset(skip), keep, entries, skipped, 0)
        finally:
            os.close(root_fd)
        return cls(os.fspath(lower), since, entries, skipped)

    # -- storage -------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temp file + rename), mode 0600."""
        names = [os.fsencode(p) for p in self.entries]
        blob = b"\0".join(names)
        records = b"".join(_RECORD.pack(*sig) for sig in self.entries.values())
        head = json.dumps(
            {
                "root": self.root,
                "since_ns": self.since_ns,
                "count": len(names),
                "skipped": sorted(self._skipped),
            }
        ).encode()
        body = zlib.compress(struct.pack("<Q", len(blob)) + blob + records, 1)
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MAGIC + head + b"\n" + body)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a saved manifest; WorkspaceError when it is not one or is damaged."""
        data = Path(path).read_bytes()
        try:
            return cls._decode(data)
        except (ValueError, KeyError, TypeError, zlib.error, struct.error) as exc:
            raise WorkspaceError(
                f"workspace manifest {os.fspath(path)!r} is damaged: {exc}"
            ) from exc

    @classmethod
    def _decode(cls, data: bytes) -> Manifest:
        if not data.startswith(_MAGIC):
            raise ValueError("not a manifest file")
        head_end = data.index(b"\n", len(_MAGIC))
        head = json.loads(data[len(_MAGIC) : head_end])
        body = zlib.decompress(data[head_end + 1 :])
        (blob_len,) = struct.unpack_from("<Q", body)
        blob = body[8 : 8 + blob_len]
        count = int(head["count"])
        names = blob.split(b"\0") if count else []
        records = body[8 + blob_len :]
        if len(names) != count or len(records) != count * _RECORD.size:
            raise ValueError("entry count does not match")
        entries = dict(zip(map(os.fsdecode, names), _RECORD.iter_unpack(records), strict=True))
        return cls(str(head["root"]), int(head["since_ns"]), entries, head["skipped"])


def _tracked_dirs(tracked: Collection[str]) -> frozenset[str]:
    """Every directory holding a tracked file."""
    dirs: set[str] = set()
    for path in tracked:
        end = path.rfind("/")
        while end > 0:
            parent = path[:end]
            if parent in dirs:
                break
            dirs.add(parent)
            end = path.rfind("/", 0, end)
    return frozenset(dirs)


def _walk(
    fd: int,
    prefix: str,
    dev: int,
    skip: frozenset[str],
    keep: frozenset[str],
    entries: dict[str, Sig],
    skipped: list[str],
    depth: int,
) -> None:
    with os.scandir(fd) as it:
        listing = list(it)
    for entry in listing:
        rel = prefix + entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        entries[rel] = sig_of(st)
        if not stat.S_ISDIR(st.st_mode):
            continue
        if (entry.name in skip and rel not in keep) or st.st_dev != dev or depth + 1 >= MAX_DEPTH:
            skipped.append(rel)
            continue
        try:
            child = os.open(entry.name, O_DIR, dir_fd=fd)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            skipped.append(rel)
            continue
        try:
            _walk(child, rel + "/", dev, skip, keep, entries, skipped, depth + 1)
        finally:
            os.close(child)
