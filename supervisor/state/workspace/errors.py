"""Errors of the workspace engine, rooted in the one tree of ``supervisor.core.errors``."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.errors import PolicyError, SupervisorError

#: How many paths an error message names before it says "and N more".
_SHOWN = 20


def _name_paths(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_SHOWN])
    more = len(paths) - _SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


class WorkspaceError(SupervisorError):
    """The upper, the manifest or a backup is in a state this engine does not handle (an
    overlay feature we never enable, a tree too deep, a corrupt file, an upper that changed
    since it was listed)."""

    code = "workspace_error"


class WorkspaceConflict(PolicyError):
    """Changes that would overwrite host edits made since the session started (apply), or
    since the apply (undo). ``paths`` names every one; nothing was written."""

    code = "workspace_conflict"

    def __init__(self, paths: Sequence[str], what: str) -> None:
        self.paths = list(paths)
        super().__init__(
            f"{len(self.paths)} path(s) changed on the host {what}: {_name_paths(self.paths)}"
            " (nothing was written; use force to overwrite them, the old versions are backed up)"
        )


class UnsafeWorkspacePath(PolicyError):
    """A change would write outside the workspace: through a symlinked or foreign-mounted
    directory of the lower, or with a path that is absolute or has ``..``. Nothing written."""

    code = "workspace_unsafe_path"

    def __init__(self, paths: Sequence[str], why: str) -> None:
        self.paths = list(paths)
        super().__init__(f"refused {len(self.paths)} path(s): {why}: {_name_paths(self.paths)}")


class NoBackup(WorkspaceError, LookupError):
    """``undo`` found no completed apply in the backup directory."""

    code = "workspace_no_backup"
