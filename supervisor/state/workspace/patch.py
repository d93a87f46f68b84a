"""One unified diff of listed changes that ``git apply`` accepts on the lower.

Text hunks, git's binary patches (full blob ids, so git can check them), new and deleted
files, exec bit changes and symlinks. Built here: no process per file, and paths never
leave the trees (every read goes through no-follow directory fds).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import os
import stat
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from supervisor.state.workspace.fsutil import (
    MAX_DEPTH,
    O_DIR,
    DirCache,
    Identity,
    Reader,
    git_created,
    has_acl,
    lstat_at,
    open_project,
    open_regular,
    protected,
    split_relpath,
    too_deep,
)
from supervisor.state.workspace.models import Change

ZERO_ID = "0" * 40
#: Text files larger than this, or with more lines (either side), get one hunk replacing
#: every line instead of a minimal diff: difflib's matcher is quadratic in the worst case
#: and holds every line as an object (an 8 MiB file of newlines took 747 MB).
MAX_DIFF_BYTES = 2 << 20
MAX_DIFF_LINES = 20_000
#: Files larger than this (either side) are shown as their sizes and hashes unless the full
#: diff is asked for: what a review reads, and what it costs, stays bounded.
LARGE_BYTES = 1 << 20
_ESCAPES = {
    7: "\\a",
    8: "\\b",
    9: "\\t",
    10: "\\n",
    11: "\\v",
    12: "\\f",
    13: "\\r",
    34: '\\"',
    92: "\\\\",
}


@dataclass(frozen=True, slots=True)
class _Blob:
    data: bytes
    mode: str
    """git's mode: 100644, 100755 or 120000."""
    large: tuple[int, str] | None = None
    """(size, sha256) of a file over ``LARGE_BYTES`` whose bytes were not read."""

    @property
    def oid(self) -> str:
        return hashlib.sha1(
            b"blob %d\0" % len(self.data) + self.data, usedforsecurity=False
        ).hexdigest()

    @property
    def binary(self) -> bool:
        if b"\0" in self.data[:8000]:
            return True
        try:
            self.data.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False


def quote(raw: bytes) -> str:
    """A path as git prints it: C-quoted when it holds a quote, a backslash, a control
    character or a byte outside ASCII (core.quotePath), else as is."""
    if not any(c < 0x20 or c >= 0x7F or c in (34, 92) for c in raw):
        return raw.decode("ascii")
    out = ['"']
    for c in raw:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c < 0x20 or c >= 0x7F:
            out.append(f"\\{c:03o}")
        else:
            out.append(chr(c))
    out.append('"')
    return "".join(out)


def _label(raw: bytes, prefix: bytes) -> str:
    text = quote(prefix + raw)
    return text + ("\t" if " " in text else "")


def _lines(data: bytes) -> list[bytes]:
    """Lines as git sees them: split at LF only, each keeping its LF."""
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _range(start: int, length: int) -> str:
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _emit(prefix: str, line: bytes) -> str:
    text = line.decode("utf-8")
    if text.endswith("\n"):
        return prefix + text
    return prefix + text + "\n\\ No newline at end of file\n"


def _iter_lines(data: bytes) -> Iterator[bytes]:
    """``_lines`` one at a time (no list of every line)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end + 1
        yield data[start:end]
        start = end


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _hunks(old: bytes, new: bytes) -> Iterator[str]:
    big = len(old) > MAX_DIFF_BYTES or len(new) > MAX_DIFF_BYTES
    if big or max(_count_lines(old), _count_lines(new)) > MAX_DIFF_LINES:
        yield f"@@ -{_range(0, _count_lines(old))} +{_range(0, _count_lines(new))} @@\n"
        yield from (_emit("-", line) for line in _iter_lines(old))
        yield from (_emit("+", line) for line in _iter_lines(new))
        return
    a, b = _lines(old), _lines(new)
    matcher = difflib.SequenceMatcher(None, a, b)
    for group in matcher.get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        yield f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n"
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                yield from (_emit(" ", line) for line in a[a1:a2])
                continue
            yield from (_emit("-", line) for line in a[a1:a2])
            yield from (_emit("+", line) for line in b[b1:b2])


def _binary_hunk(data: bytes) -> str:
    packed = zlib.compress(data, 9)
    out = [f"literal {len(data)}\n"]
    for i in range(0, len(packed), 52):
        chunk = packed[i : i + 52]
        n = len(chunk)
        out.append(chr(ord("A") + n - 1 if n <= 26 else ord("a") + n - 27))
        out.append(base64.b85encode(chunk, pad=True).decode("ascii") + "\n")
    out.append("\n")
    return "".join(out)


def file_patch(raw: bytes, old: _Blob | None, new: _Blob | None) -> str:
    """The patch of one path: ``old`` None adds it, ``new`` None deletes it."""
    a, b = _label(raw, b"a/"), _label(raw, b"b/")
    head = [f"diff --git {quote(b'a/' + raw)} {quote(b'b/' + raw)}\n"]
    if (old and old.large) or (new and new.large):
        return "".join(head) + _large_note(old, new)
    old_id = old.oid if old else ZERO_ID
    new_id = new.oid if new else ZERO_ID
    if old is None and new is not None:
        head.append(f"new file mode {new.mode}\n")
        head.append(f"index {old_id}..{new_id}\n")
    elif new is None and old is not None:
        head.append(f"deleted file mode {old.mode}\n")
        head.append(f"index {old_id}..{new_id}\n")
    elif old is not None and new is not None:
        if old.mode != new.mode:
            head.append(f"old mode {old.mode}\nnew mode {new.mode}\n")
        if old.data == new.data:
            return "".join(head) if old.mode != new.mode else ""
        same_mode = f" {new.mode}" if old.mode == new.mode else ""
        head.append(f"index {old_id}..{new_id}{same_mode}\n")
    old_data = old.data if old else b""
    new_data = new.data if new else b""
    if (old and old.binary) or (new and new.binary):
        head.append("GIT binary patch\n")
        head.append(_binary_hunk(new_data))
        head.append(_binary_hunk(old_data))
        return "".join(head)
    if not old_data and not new_data:
        return "".join(head)
    head.append(f"--- {a if old else '/dev/null'}\n")
    head.append(f"+++ {b if new else '/dev/null'}\n")
    head.extend(_hunks(old_data, new_data))
    return "".join(head)


def _large_note(old: _Blob | None, new: _Blob | None) -> str:
    def side(blob: _Blob | None) -> str:
        if blob is None:
            return "none"
        size, digest = blob.large or (len(blob.data), hashlib.sha256(blob.data).hexdigest())
        return f"{size} bytes, sha256 {digest}"

    return (
        f"# large file: old {side(old)}; new {side(new)} (over {LARGE_BYTES} bytes: not "
        "shown; the full diff shows it)\n"
    )


def _blob(dir_fd: int, name: str, st: os.stat_result, full: bool = True) -> _Blob | None:
    """A file or symlink as git would store it; None for anything else. Unless ``full``, a
    file over ``LARGE_BYTES`` is only hashed (streamed: its bytes are not kept)."""
    if stat.S_ISLNK(st.st_mode):
        return _Blob(os.fsencode(os.readlink(name, dir_fd=dir_fd)), "120000")
    if not stat.S_ISREG(st.st_mode):
        return None
    mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
    fd = open_regular(name, dir_fd)
    try:
        if not full and os.fstat(fd).st_size > LARGE_BYTES:
            h, size = hashlib.sha256(), 0
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
                size += len(chunk)
            return _Blob(b"", mode, (size, h.hexdigest()))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return _Blob(b"".join(chunks), mode)


#: What a review shows in place of content the session's tasks could not read.
UNREADABLE = "content not readable by the sandbox"


def note_patch(raw: bytes, text: str) -> str:
    """A placeholder patch for a lower entry whose bytes are not shown: a comment line
    after the ``diff --git`` header."""
    return f"diff --git {quote(b'a/' + raw)} {quote(b'b/' + raw)}\n# {text}\n"


def unreadable_note(raw: bytes, kind: str, size: int | None) -> str:
    """``note_patch`` for what the session's tasks could not read."""
    shown = f", {size} bytes not shown" if size is not None else ""
    return note_patch(raw, f"{kind} ({UNREADABLE}{shown})")


def _may_read(reader: Reader | None, dir_fd: int, name: str, st: os.stat_result) -> bool:
    if reader is None or stat.S_ISLNK(st.st_mode):
        return True  # a link's target is readable wherever its directory is searchable
    want = 5 if stat.S_ISDIR(st.st_mode) else 4
    return reader.may(st, want, acl=has_acl(name, dir_fd))


def _tree_blobs(
    dir_fd: int, name: str, rel: str, dev: int, reader: Reader | None, full: bool, depth: int = 0
) -> Iterator[tuple[str, _Blob | str]]:
    """Every file and symlink in the lower directory ``dir_fd/name``, sorted; a note (str)
    instead of the blob for what ``reader`` could not read, and for a directory on another
    filesystem (a mount point inside the project: never read)."""
    if depth >= MAX_DEPTH:
        raise too_deep(rel, "the diff")
    fd = os.open(name, O_DIR, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_dev != dev:
            yield rel, "deleted directory (another filesystem is mounted there: not shown)"
            return
        with os.scandir(fd) as it:
            names = sorted((e.name for e in it), key=os.fsencode)
        for child in names:
            st = lstat_at(child, fd)
            if st is None:
                continue
            path = f"{rel}/{child}"
            if not _may_read(reader, fd, child, st):
                what = "deleted directory" if stat.S_ISDIR(st.st_mode) else "deleted"
                yield path, what
            elif stat.S_ISDIR(st.st_mode):
                yield from _tree_blobs(fd, child, path, dev, reader, full, depth + 1)
            else:
                blob = _blob(fd, child, st, full)
                if blob is not None:
                    yield path, blob
    finally:
        os.close(fd)


class _Access:
    """Which lower directories ``reader`` can search, from the project's root down
    (memoised per directory)."""

    def __init__(self, ldirs: DirCache, reader: Reader | None, full: bool) -> None:
        self.ldirs = ldirs
        self.reader = reader
        self.full = full
        self._seen: dict[str, bool] = {}

    def reaches(self, rel: str) -> bool:
        """Whether every directory from the root to ``rel`` (included) is searchable."""
        if self.reader is None:
            return True
        known = self._seen.get(rel)
        if known is not None:
            return known
        parent = rel.rpartition("/")[0] if rel else None
        ok = parent is None or self.reaches(parent)
        if ok:
            fd = self.ldirs.get(rel)
            ok = self.reader.may(os.fstat(fd), 1, acl=has_acl(None, fd))
        self._seen[rel] = ok
        return ok


def iter_diff(
    lower: str | os.PathLike[str],
    upper: str | os.PathLike[str],
    changes: Sequence[Change],
    *,
    include_ignored: bool = False,
    lower_id: Identity | None = None,
    reader: Reader | None = None,
    full: bool = False,
) -> Iterator[str]:
    """``diff`` piece by piece (one file's patch at a time), for streaming."""
    lower_fd = open_project(lower, lower_id)
    upper_fd = os.open(upper, O_DIR & ~os.O_NOFOLLOW)
    ldirs, udirs = DirCache(lower_fd), DirCache(upper_fd)
    access = _Access(ldirs, reader, full)
    new_git = git_created(changes)
    try:
        for change in sorted(changes, key=lambda c: os.fsencode(c.path)):
            parts = split_relpath(change.path)
            if (
                (change.ignored and not include_ignored)
                or not change.applicable
                or protected(parts, new_git)
            ):
                continue
            yield from _change_patches(
                change, "/".join(parts[:-1]), parts[-1], ldirs, udirs, access
            )
    finally:
        ldirs.close()
        udirs.close()
        os.close(lower_fd)
        os.close(upper_fd)


def _change_patches(
    change: Change, parent: str, name: str, ldirs: DirCache, udirs: DirCache, access: _Access
) -> Iterator[str]:
    old: _Blob | None = None
    old_tree: list[tuple[str, _Blob | str]] = []
    hidden: str | None = None
    raw = os.fsencode(change.path)
    if change.kind != "added":
        try:
            lfd: int | None = ldirs.get(parent)
        except (FileNotFoundError, OSError):
            lfd = None
        lst = lstat_at(name, lfd)
        if lfd is not None and lst is not None:
            readable = access.reaches(parent) and _may_read(access.reader, lfd, name, lst)
            is_dir = stat.S_ISDIR(lst.st_mode)
            if not readable:
                hidden = "deleted directory" if is_dir else "deleted"
                if change.kind != "deleted":
                    hidden = "replaced; old " + ("directory" if is_dir else "content")
            elif is_dir:
                if change.kind == "deleted" or change.file_type != "dir":
                    old_tree = list(
                        _tree_blobs(lfd, name, change.path, ldirs.dev, access.reader, access.full)
                    )
            else:
                old = _blob(lfd, name, lst, access.full)
            if hidden is not None:
                size = lst.st_size if stat.S_ISREG(lst.st_mode) else None
                yield unreadable_note(raw, hidden, size)
    new: _Blob | None = None
    if change.kind != "deleted" and change.file_type in ("file", "symlink"):
        ufd = udirs.get(parent)
        ust = lstat_at(name, ufd)
        if ust is not None:
            new = _blob(ufd, name, ust, access.full)
    for path, blob in old_tree:
        if isinstance(blob, str):
            if blob.startswith("deleted directory ("):
                yield note_patch(os.fsencode(path), blob)
            else:
                yield unreadable_note(os.fsencode(path), blob, None)
        else:
            yield file_patch(os.fsencode(path), blob, None)
    if old is not None and new is not None and old.mode[:2] != new.mode[:2]:
        # A file turned symlink (or back): git writes a deletion, then an addition.
        yield file_patch(raw, old, None)
        yield file_patch(raw, None, new)
    elif old is not None or new is not None:
        yield file_patch(raw, old, new)


def diff(
    lower: str | os.PathLike[str],
    upper: str | os.PathLike[str],
    changes: Sequence[Change],
    *,
    include_ignored: bool = False,
    lower_id: Identity | None = None,
    reader: Reader | None = None,
    full: bool = False,
) -> str:
    """A unified diff of ``changes`` (from ``list_changes``) that ``git apply`` (and
    ``git apply -R`` on the result) accepts in the lower: the changes apply would make,
    with paths relative to the lower behind ``a/`` and ``b/``. It cannot carry what git
    does not track: empty directories, directory modes, mode bits other than owner-exec,
    owners, devices, fifos and sockets. Unless ``full``, a file over ``LARGE_BYTES`` is a
    comment with its sizes and hashes instead (that part does not apply); with ``reader``,
    old bytes the tasks could not read are a comment too."""
    return "".join(
        iter_diff(
            lower,
            upper,
            changes,
            include_ignored=include_ignored,
            lower_id=lower_id,
            reader=reader,
            full=full,
        )
    )
