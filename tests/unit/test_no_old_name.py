"""The CLI's old name is gone: a word search for it over the tree (``grep -rw``) finds only
the README's note that Docker's tool of that name is a different one (issue 23)."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Not part of the tree: environments, caches and build output (all gitignored).
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
SKIP_DIRS |= {".hypothesis", ".build"}
SKIP_PATHS = {REPO / "build", REPO / "dist", REPO / "state", REPO / "bench" / "results"}
#: Spelt in two halves, so that this file is not a hit of its own search.
OLD = "s" + "bx"
WORD = re.compile(rf"(?<![A-Za-z0-9_]){OLD}(?![A-Za-z0-9_])".encode())
NOTE = f"Docker's `{OLD}` (Docker Sandboxes) is a"


def files() -> list[Path]:
    out = []
    for top, dirs, names in os.walk(REPO):
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and Path(top, d) not in SKIP_PATHS
        ]
        out += [Path(top, n) for n in names if not Path(top, n).is_symlink()]
    return out


def test_the_old_name_is_only_in_the_note_about_dockers_tool() -> None:
    found = []
    for path in files():
        data = path.read_bytes()
        if b"\0" in data[:4096]:
            continue  # images and other binaries
        for number, line in enumerate(data.splitlines(), 1):
            if WORD.search(line):
                found.append((str(path.relative_to(REPO)), number, line.decode(errors="replace")))
    readme = [f for f in found if f[0] == "README.md"]
    assert [f for f in found if f[0] != "README.md"] == []
    assert len(readme) == 1 and NOTE in readme[0][2], readme
