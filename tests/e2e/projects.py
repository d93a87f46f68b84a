"""Project directories for the workspace tests: made under the daemon's workspace root,
owned by a user (tasks run as the owner), and hashed to prove the host tree untouched."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from tests.unit.workspace_tools import snapshot
from tests.users import PROJECT_OWNER

#: The owner of test projects: a user, as on a developer's machine (not root): uid 1000 as
#: root, else the user running the tests (``tests/users.py``).
OWNER = PROJECT_OWNER


def make_project(
    root: Path, files: Mapping[str, str | bytes], owner: tuple[int, int] = OWNER
) -> Path:
    """``root`` with ``files`` (relative path -> content), every entry owned by ``owner``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        path.write_bytes(data)
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, *owner)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), *owner)
    return root


def tree_hash(root: Path) -> str:
    """Every entry's type, mode, content, owner and mtime, hashed."""
    h = hashlib.sha256()
    for rel, entry in sorted(snapshot(root, times=True, owners=True).items()):
        h.update(repr((rel, entry)).encode())
    return h.hexdigest()


def contents(root: Path) -> dict[str, str]:
    """relative path -> text of every regular file (directories and links left out)."""
    out = {}
    for rel, entry in snapshot(root).items():
        if entry[0] == "file":
            data = entry[2]
            assert isinstance(data, bytes)
            out[rel] = data.decode(errors="replace")
    return out
