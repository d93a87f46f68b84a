"""Errors of the workspace engine: defined in the one tree (``supervisor.core.errors``) so
that every interface, the HTTP client included, knows them by their codes."""

from __future__ import annotations

from supervisor.core.workspace_errors import (
    NoBackup,
    UnsafeWorkspacePath,
    WorkspaceConflict,
    WorkspaceError,
)

__all__ = ["NoBackup", "UnsafeWorkspacePath", "WorkspaceConflict", "WorkspaceError"]
