"""The workspace's errors (a session's project: review, apply, undo), in the one exception
tree of ``supervisor.core.errors``; registered by code like every other (``core.wire``
imports this module, so a daemon's answer is rebuilt as the same class)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.core.errors import LimitExceeded, PolicyError, SupervisorError

#: How many paths a workspace error names before it says "and N more".
_SHOWN_PATHS = 20


def _name_paths(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_SHOWN_PATHS])
    more = len(paths) - _SHOWN_PATHS
    return shown + (f" and {more} more" if more > 0 else "")


class WorkspaceFull(LimitExceeded):
    """The session's workspace layer holds more than the task's policy allows
    (``session.workspace_max_mb`` / ``workspace_max_files``); apply or discard first."""

    code = "workspace_full"


class WorkspaceBusy(SupervisorError):
    """Apply, discard and undo need the session's tasks stopped: ``task_ids`` still run."""

    code = "workspace_busy"

    def __init__(self, message: str, task_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.task_ids = list(task_ids)

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        ids = detail.get("task_ids")
        return cls(message, [str(t) for t in ids] if isinstance(ids, list) else [])

    def wire_detail(self) -> dict[str, Any]:
        return {"task_ids": self.task_ids}


class NoWorkspace(SupervisorError, LookupError):
    """The session was opened without a workspace: it has no changes to review."""

    code = "no_workspace"


class WorkspaceOutsideRoots(PolicyError):
    """The workspace asked for is not under any of the supervisor's allowed roots
    (``--workspace-root``, ``SANDVISOR_WORKSPACE_ROOTS``, default the home directory of the user
    running it). ``roots`` lists them."""

    code = "workspace_outside_roots"

    def __init__(self, message: str, roots: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.roots = list(roots)

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        roots = detail.get("roots")
        return cls(message, [str(r) for r in roots] if isinstance(roots, list) else [])

    def wire_detail(self) -> dict[str, Any]:
        return {"roots": self.roots}


class WorkspaceError(SupervisorError):
    """The upper, the manifest or a backup is in a state the workspace engine does not
    handle (an overlay feature we never enable, a tree too deep, a corrupt file, an upper
    that changed since it was listed)."""

    code = "workspace_error"


class WorkspaceConflict(PolicyError):
    """Changes that would overwrite host edits made since the session started (apply), or
    since the apply (undo). ``paths`` names every one; nothing was written."""

    code = "workspace_conflict"

    def __init__(self, paths: Sequence[str], what: str = "", *, message: str | None = None):
        self.paths = list(paths)
        super().__init__(
            message
            or f"{len(self.paths)} path(s) changed on the host {what}: "
            f"{_name_paths(self.paths)} (nothing was written; use force to overwrite them, "
            "the old versions are backed up)"
        )

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        paths = detail.get("paths")
        return cls([str(p) for p in paths] if isinstance(paths, list) else [], message=message)

    def wire_detail(self) -> dict[str, Any]:
        return {"paths": self.paths}


class UnsafeWorkspacePath(PolicyError):
    """A change would write outside the workspace: through a symlinked or foreign-mounted
    directory of the lower, or with a path that is absolute or has ``..``. Nothing written."""

    code = "workspace_unsafe_path"

    def __init__(self, paths: Sequence[str], why: str = "", *, message: str | None = None):
        self.paths = list(paths)
        super().__init__(
            message or f"refused {len(self.paths)} path(s): {why}: {_name_paths(self.paths)}"
        )

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        paths = detail.get("paths")
        return cls([str(p) for p in paths] if isinstance(paths, list) else [], message=message)

    def wire_detail(self) -> dict[str, Any]:
        return {"paths": self.paths}


class WorkspaceMoved(PolicyError):
    """The project path now leads elsewhere (a symlink on the way, or another directory)."""

    code = "workspace_moved"


class NoBackup(WorkspaceError, LookupError):
    """``undo`` found no completed apply to undo."""

    code = "workspace_no_backup"
