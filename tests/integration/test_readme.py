"""The README's library example runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, require_engine

pytestmark = pytest.mark.timeout(180)


def library_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Library", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block in the README's Library section"
    return match.group(1)


def test_readme_library_example_runs(tmp_path: Path) -> None:
    require_engine()
    script = tmp_path / "example.py"
    script.write_text(library_example())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "matched 'ready' at byte" in out
    assert "completed exit 0" in out
    assert "b'tick 1\\ntic' 10 False" in out
    assert "<status>completed</status>" in out
    assert "task.stopped" in out
    assert "[info" not in out  # a library does not print logs on its own


def workspace_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Workspaces", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block in the README's Workspaces section"
    return match.group(1)


def test_readme_workspace_example_runs(tmp_path: Path) -> None:
    require_engine()
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    script = tmp_path / "example.py"
    script.write_text(workspace_example())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    done = subprocess.run(
        [sys.executable, str(script), str(project)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "completed 0" in out
    assert "('added', 'RESULT')" in out
    assert "+ok" in out
    assert (project / "RESULT").read_text() == "ok\n"
    assert (project / "RESULT").stat().st_uid == project.stat().st_uid
