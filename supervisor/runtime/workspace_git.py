"""The repositories of an ``rw`` workspace, kept out of the tasks' reach.

- Every ``.git`` the project has when the session opens (its own, nested clones, submodules'
  gitdir files) is bound read-only into each task: hooks, config and refs cannot change.
- Where the project has no ``.git`` of its own (a subdirectory of a repository, or none), an
  empty read-only directory is bound at ``.git``: a task's ``git init`` there fails, and the
  user's git, which skips an empty ``.git``, still finds the enclosing repository. The
  mount point the engine makes for it on the host is removed at the session's end.
- A ``.git`` a task creates anywhere else is renamed out of git's way before every later task
  and at the session's end (``state.workspace.gitguard``), with a warning in the log.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath

import supervisor.state.workspace as changes_fs
from supervisor.core.container import Mount
from supervisor.core.logs import get_logger
from supervisor.core.workspace import WorkspacePlan
from supervisor.state.workspace.gitguard import find_repositories, quarantine

log = get_logger("supervisor.workspace")


class RwRepositories:
    """The ``.git`` entries of one ``rw`` workspace: those it had (``known``), whether the
    top-level one is our empty guard, and the sweep of those tasks add."""

    def __init__(self, plan: WorkspacePlan, state_root: Path) -> None:
        self.plan = plan
        self.empty = state_root / "empty-git"
        self.known: list[str] | None = None
        self.bound: list[str] = []
        self.guard = False
        self.log = log.bind(workspace=plan.host)

    def to_json(self) -> dict[str, object]:
        return {"git_known": self.known, "git_bound": self.bound, "git_guard": self.guard}

    def restore(self, data: dict[str, object]) -> None:
        known, bound = data.get("git_known"), data.get("git_bound")
        if isinstance(known, list):
            self.known = [str(p) for p in known]
            self.bound = [str(p) for p in bound] if isinstance(bound, list) else []
            self.guard = bool(data.get("git_guard"))

    def _open(self) -> int:
        return changes_fs.open_project(self.plan.host, self.plan.identity)

    def survey(self) -> None:
        """At the session's start (once): which repositories the project has."""
        if self.known is not None:
            return
        fd = self._open()
        try:
            found = find_repositories(fd)
        finally:
            os.close(fd)
        if not found.complete:
            self.log.warning(
                "workspace_git_survey_partial",
                why="the project is too large or deep to search whole; nested repositories "
                "below the search's reach are not bound read-only",
            )
        self.known = list(found.paths)
        self.bound = list(found.plain)
        for rel in sorted(set(found.paths) - set(found.plain)):
            self.log.warning(
                "workspace_git_not_bound",
                path=rel,
                why="not a plain directory or file (a link, or a device): not bound, and "
                "never followed",
            )
        # No .git at the top at all (not even a link): guard it with an empty one.
        self.guard = ".git" not in self.known
        if self.guard:
            self.empty.mkdir(parents=True, exist_ok=True, mode=0o755)
            os.chmod(self.empty, 0o555)  # noqa: S103 - an empty, read-only mount source

    def sweep(self) -> list[str]:
        """Rename every ``.git`` that appeared since the survey; returns where they went."""
        if self.known is None:
            return []
        fd = self._open()
        try:
            now = find_repositories(fd).paths
            new = [p for p in now if p not in self.known and not (self.guard and p == ".git")]
            moved = quarantine(fd, new) if new else []
        finally:
            os.close(fd)
        if moved:
            self.log.warning(
                "workspace_git_quarantined",
                created=new,
                moved_to=moved,
                why="a task created a repository in an rw workspace; its config could make "
                "the host's git run a program, so it was renamed out of git's way",
            )
        return moved

    def mounts(self) -> list[Mount]:
        """Read-only binds over the known repositories (and the guard)."""
        if self.known is None:
            return []
        target = PurePosixPath(self.plan.container_path)
        out = [
            Mount(
                source=str(PurePosixPath(self.plan.host) / rel),
                target=str(target / rel),
                read_only=True,
                non_recursive=True,
            )
            for rel in self.bound
        ]
        if self.guard:
            out.append(
                Mount(
                    source=str(self.empty),
                    target=str(target / ".git"),
                    read_only=True,
                    non_recursive=True,
                )
            )
        return out

    def release(self) -> None:
        """At the session's end: sweep, and remove the guard's mount point on the host (an
        empty directory; never anything else)."""
        self.sweep()
        if not self.guard:
            return
        fd = self._open()
        try:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(".git", dir_fd=fd)
                if stat.S_ISDIR(st.st_mode):
                    with contextlib.suppress(OSError):  # not empty: a task's, swept above
                        os.rmdir(".git", dir_fd=fd)
        finally:
            os.close(fd)
