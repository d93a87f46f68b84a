"""Marks changes as ignored: gitignore rules of the merged view, defaults, tracked files.

The project's rules as the merged view holds them, the default list below them, tracked
files never ignored. Asks ``git check-ignore`` once when it can answer for the merged
view, the pure-Python matcher otherwise.
"""

from __future__ import annotations

import bisect
import errno
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from supervisor.state.workspace import gitcmd
from supervisor.state.workspace.fsutil import O_DIR, O_READ
from supervisor.state.workspace.gitignore import Matcher, PatternList, parse
from supervisor.state.workspace.models import Change, IgnoreRules

#: Above this many changes the pure-Python matcher answers even when git could: measured
#: here, git check-ignore takes about 12 us a path (1.2 s for 100 000), the matcher 3 to 6.
GIT_MAX_PATHS = 20_000
#: A pattern file larger than this is read only this far (git has no limit; a hostile
#: upper could offer a huge one).
MAX_IGNORE_FILE = 4 << 20


def is_dir_change(change: Change) -> bool:
    """Whether the path is a directory in the view ignore rules judge it in."""
    return change.file_type == "dir"


def _read_at(root_fd: int, rel: str) -> tuple[bytes | None, bool]:
    """(content of regular file ``rel`` under ``root_fd``, whether something else masks
    it: a whiteout, a symlink or a directory). Never follows symlinks on the way."""
    parts = rel.split("/")
    fd = root_fd
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            try:
                fd = os.open(part, O_DIR, dir_fd=fd)
            except OSError:
                return None, False
            opened.append(fd)
        try:
            st = os.lstat(parts[-1], dir_fd=fd)
        except OSError:
            return None, False
        if not stat.S_ISREG(st.st_mode):
            return None, True  # a whiteout, symlink or directory masks the lower's file
        try:
            ffd = os.open(parts[-1], O_READ, dir_fd=fd)
        except OSError:
            return None, True
        try:
            return os.read(ffd, MAX_IGNORE_FILE), True
        finally:
            os.close(ffd)
    finally:
        for f in opened:
            os.close(f)


def merged_reader(
    lower_fd: int, upper_fd: int, hidden: Sequence[str]
) -> Callable[[str], bytes | None]:
    """``load`` for the Matcher: a directory's ``.gitignore`` in the merged view (the
    upper's when it has one, none when a whiteout or an opaque or replaced directory hides
    the lower's, else the lower's)."""
    hidden_sorted = sorted(hidden)

    def lower_hidden(rel: str) -> bool:
        # hidden holds directories; rel is hidden when it or an ancestor is one of them.
        probe = rel
        while True:
            i = bisect.bisect_left(hidden_sorted, probe)
            if i < len(hidden_sorted) and hidden_sorted[i] == probe:
                return True
            if "/" not in probe:
                return False
            probe = probe.rpartition("/")[0]

    def load(rel: str) -> bytes | None:
        name = f"{rel}/.gitignore" if rel else ".gitignore"
        data, masked = _read_at(upper_fd, name)
        if data is not None or masked:
            return data
        if rel and lower_hidden(rel):
            return None
        return _read_at(lower_fd, name)[0]

    return load


def _git_dir_files(repo: Path) -> Path | None:
    """The repository's common git directory (``.git``, or where a worktree's file points)."""
    dot = repo / ".git"
    if dot.is_dir() and not dot.is_symlink():
        return dot
    try:
        text = dot.read_text(errors="replace")
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = (repo / text[len("gitdir:") :].strip()).resolve()
    try:
        common = (gitdir / "commondir").read_text().strip()
    except OSError:
        return gitdir
    return (gitdir / common).resolve()


def _fixed_lists(
    lower: Path, lower_fd: int, upper_fd: int, rules: IgnoreRules
) -> tuple[list[PatternList], bytes]:
    """(lists in force everywhere, lowest first; the lower's path in its repository)."""
    lists = [parse("".join(f"{p}\n" for p in rules.defaults).encode(), b"", "defaults")]
    if not rules.gitignore:
        return lists, b""
    repo = gitcmd.find_repo(lower)
    if repo is None:
        return lists, b""
    real = Path(os.path.realpath(lower))
    rel = real.relative_to(repo)
    prefix = b"" if rel == Path() else os.fsencode(rel.as_posix()) + b"/"
    if repo == real:
        # The merged view's own info/exclude (the agent may have edited it).
        data, masked = _read_at(upper_fd, ".git/info/exclude")
        if data is None and not masked:
            data = _read_at(lower_fd, ".git/info/exclude")[0]
    else:
        gitdir = _git_dir_files(repo)
        data = _read_host(gitdir / "info" / "exclude") if gitdir else None
    if data is not None:
        lists.append(parse(data, b"", ".git/info/exclude"))
    # .gitignore files of the directories between the repository root and the lower.
    walk = repo
    for part in rel.parts:
        data = _read_host(walk / ".gitignore")
        if data is not None:
            base = os.fsencode(walk.relative_to(repo).as_posix()) + b"/" if walk != repo else b""
            lists.append(parse(data, base, str(walk / ".gitignore")))
        walk = walk / part
    return lists, prefix


def _read_host(path: Path) -> bytes | None:
    try:
        fd = os.open(path, O_READ)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES):
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_IGNORE_FILE)
    finally:
        os.close(fd)


def _git_can_answer(changes: Sequence[Change], ignore_touched: bool) -> bool:
    """git reads the lower: its answers hold for the merged view only when the ignore files
    are the lower's and no path changed type (git would take a path's type, which decides
    directory-only patterns, from the lower, or stop at a path beyond a symlink)."""
    if ignore_touched:
        return False
    for c in changes:
        if c.path.startswith(".git/info/"):
            return False
        if c.kind == "replaced" and c.old_type != c.file_type:
            return False
    return True


def mark_ignored(
    lower: Path,
    lower_fd: int,
    upper_fd: int,
    changes: Sequence[Change],
    rules: IgnoreRules,
    *,
    hidden: Sequence[str],
    ignore_touched: bool,
) -> str:
    """Set ``ignored`` on every change; returns which matcher answered ("git" or "python")."""
    if not changes:
        return "none"
    queries = [(c.path, c.file_type == "dir") for c in changes]
    found: set[str] | None = None
    unsure: set[str] = set()
    if (
        rules.use_git
        and rules.gitignore
        and len(changes) <= GIT_MAX_PATHS
        and _git_can_answer(changes, ignore_touched)
    ):
        # git takes a path's type from the lower: a directory the lower lacks is left to
        # the matcher (see gitcmd.check_ignore).
        new_dirs = {c.path for c in changes if c.kind == "added" and c.file_type == "dir"}
        answer = gitcmd.check_ignore(
            lower, [q for q in queries if q[0] not in new_dirs], rules.defaults
        )
        if answer is not None:
            found, unsure = answer
            unsure |= new_dirs
    used = "git"
    if found is None or unsure:
        fixed, prefix = _fixed_lists(lower, lower_fd, upper_fd, rules)
        load: Callable[[str], bytes | None]
        if rules.gitignore:
            load = merged_reader(lower_fd, upper_fd, hidden)
        else:

            def load(_rel: str) -> bytes | None:
                return None

        matcher = Matcher(fixed, load, prefix)
        if found is None:
            used = "python"
            found = {p for p, is_dir in queries if matcher.ignored(p, is_dir)}
        else:
            found -= unsure
            found |= {p for p in unsure if matcher.ignored(p, True)}
    if found:
        _untrack(lower, changes, found)
    for change in changes:
        change.ignored = change.path in found
    return used


def _untrack(lower: Path, changes: Sequence[Change], found: set[str]) -> None:
    """Tracked files are never ignored, nor are directories holding one."""
    tracked = gitcmd.tracked_files(lower)
    if not tracked:
        return
    tracked_set = set(tracked)
    ordered = sorted(tracked)
    for change in changes:
        if change.path not in found:
            continue
        if change.path in tracked_set:
            found.discard(change.path)
        elif is_dir_change(change) or change.old_type == "dir":
            i = bisect.bisect_left(ordered, change.path + "/")
            if i < len(ordered) and ordered[i].startswith(change.path + "/"):
                found.discard(change.path)
