"""Which listed changes apply carries over, and whether they are the ones reviewed.

Skipped: what git would run or be redirected by (``fsutil.protected``), ignored entries
(unless asked for), devices, fifos and sockets. Checked: the reviewed digests.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from supervisor.state.workspace.errors import WorkspaceConflict
from supervisor.state.workspace.fsutil import git_created, protected, split_relpath
from supervisor.state.workspace.models import Change, SkippedChange, display_path


@dataclass(slots=True)
class Step:
    """One change apply carries over: where it goes (``parent``/``name``) and what it
    found there."""

    change: Change
    parent: str
    name: str
    fresh: bool = False
    """A parent directory is created by this apply: nothing of the lower lies below."""
    lower: os.stat_result | None = None


def select(
    changes: Sequence[Change], include_ignored: bool
) -> tuple[list[Step], list[SkippedChange]]:
    """The changes apply carries over (in path order, parents first) and those it skips
    (a skipped directory stands for the skipped entries below it: node_modules is one)."""
    steps: list[Step] = []
    skipped: list[SkippedChange] = []
    skipped_dirs: set[str] = set()
    unique = {c.path: c for c in changes}  # a path listed twice is applied once
    new_git = git_created(unique.values())
    for change in sorted(unique.values(), key=lambda c: c.path):
        parts = split_relpath(change.path)
        reason = None
        if protected(parts, new_git):
            reason = "protected"
        elif change.ignored and not include_ignored:
            reason = "ignored"
        elif not change.applicable:
            reason = "special_file"
        if reason is not None:
            if not any("/".join(parts[:i]) in skipped_dirs for i in range(1, len(parts))):
                skipped.append(SkippedChange(path=display_path(change.path), reason=reason))
            if change.file_type == "dir":
                skipped_dirs.add(change.path)
            continue
        parent = "/".join(parts[:-1])
        steps.append(Step(change, parent, parts[-1]))
    return steps, skipped


def check_reviewed(
    to_apply: Sequence[Change], listed: Sequence[Change], reviewed: Mapping[str, str]
) -> None:
    """Raise WorkspaceConflict (nothing written) unless the changes ``to_apply`` are exactly
    those reviewed: the same digests, and no reviewed path gone from the ``listed`` changes
    (a task that went on writing after the review, a trap run by the stop, must not get
    its writes applied unseen). Reviewed changes apply skips anyway may stay."""
    present = {c.review_key for c in listed}
    differ = sorted(
        {c.review_key for c in to_apply if reviewed.get(c.review_key) != c.digest}
        | {p for p in reviewed if p not in present}
    )
    if differ:
        raise WorkspaceConflict(
            differ,
            message=(
                f"{len(differ)} change(s) differ from what was reviewed: "
                f"{', '.join(display_path(p) for p in differ[:10])}"
                f"{' and more' if len(differ) > 10 else ''} (nothing was written; review the "
                "changes again, then apply)"
            ),
        )
