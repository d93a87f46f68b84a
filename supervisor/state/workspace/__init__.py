"""Workspace changes: list, diff, apply, undo and discard what an overlay upper holds."""

from supervisor.state.workspace.applier import apply
from supervisor.state.workspace.changes import classify, list_changes
from supervisor.state.workspace.cleanup import (
    discard,
    prune_upper,
    remove_workspace,
    reset_upper,
    take_work_dir,
)
from supervisor.state.workspace.errors import (
    NoBackup,
    UnsafeWorkspacePath,
    WorkspaceConflict,
    WorkspaceError,
)
from supervisor.state.workspace.fsutil import Identity, Reader, check_project, open_project
from supervisor.state.workspace.manifest import HEAVY_DIRS, Manifest
from supervisor.state.workspace.models import (
    DEFAULT_IGNORES,
    ApplyResult,
    Change,
    ChangeKind,
    ChangePage,
    FileType,
    IgnoreRules,
    SkippedChange,
    UndoResult,
    display_path,
)
from supervisor.state.workspace.paging import add_digests, page_of
from supervisor.state.workspace.patch import diff, iter_diff
from supervisor.state.workspace.rollback import latest_backup, undo

__all__ = [
    "DEFAULT_IGNORES",
    "HEAVY_DIRS",
    "ApplyResult",
    "Change",
    "ChangeKind",
    "ChangePage",
    "FileType",
    "Identity",
    "IgnoreRules",
    "Manifest",
    "NoBackup",
    "Reader",
    "SkippedChange",
    "UndoResult",
    "UnsafeWorkspacePath",
    "WorkspaceConflict",
    "WorkspaceError",
    "add_digests",
    "apply",
    "check_project",
    "classify",
    "diff",
    "discard",
    "display_path",
    "iter_diff",
    "latest_backup",
    "list_changes",
    "open_project",
    "page_of",
    "prune_upper",
    "remove_workspace",
    "reset_upper",
    "take_work_dir",
    "undo",
]
