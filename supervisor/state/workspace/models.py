"""What the workspace engine hands back: changes, ignore rules, apply and undo results."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ChangeKind = Literal["added", "modified", "deleted", "replaced", "mode"]
FileType = Literal["file", "dir", "symlink", "fifo", "socket", "char_device", "block_device"]
#: The entry types apply writes; the others are listed and skipped.
APPLICABLE: frozenset[str] = frozenset({"file", "dir", "symlink"})

#: Patterns (gitignore syntax) every listing treats as ignored, below the project's own
#: ``.gitignore`` files (a project can re-include one with ``!name``). Tracked files are
#: never ignored.
DEFAULT_IGNORES: tuple[str, ...] = (
    ".git",
    "node_modules/",
    "bower_components/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".tox/",
    ".nox/",
    ".eggs/",
    "*.egg-info/",
    "dist/",
    "build/",
    ".cache/",
    "target/",
    ".next/",
    ".nuxt/",
    ".svelte-kit/",
    ".turbo/",
    ".parcel-cache/",
    ".gradle/",
    "coverage/",
    ".coverage",
    ".nyc_output/",
    ".DS_Store",
    "*.swp",
)


def display_path(path: str) -> str:
    """``path`` as valid text: bytes that are not UTF-8 shown as ``\\xNN`` (not reversible)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(slots=True)
class Change:
    """One entry of the upper that differs from the lower (treat as immutable).

    A dataclass rather than a pydantic model: a listing builds up to 100 000 of them and
    model construction alone would take half of the 2 s budget. ``pydantic.TypeAdapter``
    validates and serializes it; ``to_dict`` gives a JSON-safe form.
    """

    path: str
    """Relative POSIX path (never absolute, never ``..``). Bytes that are not UTF-8 are
    surrogate escapes: ``os.fsencode(path)`` gives the exact name."""
    kind: ChangeKind
    """added (absent from the lower), modified (bytes, or symlink target, differ), deleted,
    replaced (the type changed, or an opaque directory replaced the lower's), mode (only
    the permission bits differ)."""
    file_type: FileType
    """Type of the new entry; for ``deleted``, of the old one."""
    size: int = 0
    """Bytes of the new regular file (of the old one for ``deleted``); a symlink's target
    length; 0 for directories and special files."""
    old_type: FileType | None = None
    """Type of the lower's entry when it had one."""
    old_mode: int | None = None
    """Permission bits (``stat.S_IMODE``) of the lower's entry when it had one."""
    new_mode: int | None = None
    """Permission bits of the upper's entry (None for ``deleted``)."""
    old_size: int | None = None
    """Size of the lower's regular file when it had one."""
    binary: bool = False
    """Regular files: a NUL byte in the first 8 KiB, or those bytes are not UTF-8 (the new
    content; the old one for ``deleted``)."""
    ignored: bool = False
    """Matched by the ignore rules (and not tracked by git): apply skips it by default."""
    conflict: bool = False
    """The host's entry at this path changed since the manifest was taken (or appeared, or
    disappeared): apply refuses it unless forced."""
    conflict_reason: str | None = None
    """Why ``conflict`` is set, in words."""
    target: str | None = None
    """The new symlink's target."""
    old_target: str | None = None
    """The old symlink's target."""
    note: str | None = None
    """Anything else worth knowing: special files apply skips, hard links, mount points."""
    digest: str | None = None
    """What apply would write at this path, as one hash (sha256 of the kind, the type, the
    new mode and the new bytes or link target). A reviewer passes the digests it saw back
    to apply (``reviewed``), which then writes only exactly that."""

    @property
    def applicable(self) -> bool:
        """Whether apply can carry it over (devices, fifos and sockets are skipped)."""
        return self.kind == "deleted" or self.file_type in APPLICABLE

    @property
    def review_key(self) -> str:
        """How a reviewer names this change in ``reviewed``: its path, or for a name that
        is not UTF-8 ``b64:`` and the base64 of its bytes (``path_b64``)."""
        raw = os.fsencode(self.path)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return "b64:" + base64.b64encode(raw).decode()
        return self.path

    @property
    def path_bytes(self) -> bytes:
        """The exact relative name, as bytes."""
        return os.fsencode(self.path)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: ``path`` as text, plus ``path_b64`` (the exact bytes) when the
        name is not UTF-8; symlink targets likewise."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if name in ("path", "target", "old_target") and value is not None:
                raw = os.fsencode(value)
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    out[f"{name}_b64"] = base64.b64encode(raw).decode()
                    value = display_path(value)
            out[name] = value
        out["applicable"] = self.applicable
        return out


@dataclass(slots=True)
class ChangePage:
    """One page of a listing (see ``supervisor.core.workspace_pages``)."""

    changes: list[Change]
    """The page's changes, in the listing's order, their digests read as the page was cut."""
    total: int
    """Every change of the listing the page was cut from (after the ignored filter)."""
    next: str | None
    """The cursor of the next page (``after`` for it), or None when this page is the last."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: ``changes`` (``Change.to_dict`` each), ``total``, ``next``."""
        return {
            "changes": [c.to_dict() for c in self.changes],
            "total": self.total,
            "next": self.next,
        }


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IgnoreRules(_Frozen):
    """Which changes count as ignored (not applied unless asked)."""

    defaults: tuple[str, ...] = DEFAULT_IGNORES
    """Patterns in gitignore syntax, with the lowest precedence (like ``core.excludesFile``)."""
    gitignore: bool = True
    """Read the project's ``.gitignore`` files (root and nested, as the merged view holds
    them) and ``.git/info/exclude``; with False only ``defaults`` count."""
    use_git: bool = True
    """Ask ``git check-ignore`` when git, a repository and unchanged ignore files allow it
    (else, or when git fails, the built-in matcher gives the same answers)."""


class SkippedChange(_Frozen):
    """A change apply did not carry over, and why."""

    path: str = Field(description="display form of the path (see display_path)")
    reason: Literal["ignored", "special_file", "protected"]
    """ignored (include_ignored was off), special_file (device, fifo or socket),
    protected (``.git/hooks``, ``.git/config``: never applied, they run code on the host)."""


class ApplyResult(_Frozen):
    """What apply did. Paths are display forms (see ``display_path``)."""

    applied: list[str]
    """Every path written, deleted or re-moded, in the order applied."""
    created: int
    """Entries that did not exist in the lower."""
    overwritten: int
    """Entries replaced (their old version is in the backup)."""
    deleted: int
    """Entries removed (directories count once; backed up)."""
    mode_changed: int
    """Entries whose permission bits alone changed."""
    bytes_written: int
    """Bytes of file content copied into the lower."""
    skipped: list[SkippedChange]
    """Changes not applied."""
    forced: list[str]
    """Conflicting paths overwritten because force was given (backed up)."""
    backup_dir: str
    """Where the backup and its journal are; ``undo`` reads it."""


class UndoResult(_Frozen):
    """What undo did. Paths are display forms."""

    restored: list[str]
    """Paths put back as they were before the apply."""
    removed: list[str]
    """Paths the apply had created, removed again."""
    kept: list[str]
    """Paths changed on the host since the apply, left alone (only with force)."""
