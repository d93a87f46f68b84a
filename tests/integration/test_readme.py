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


def python_block(heading: str) -> str:
    """The first python block of the README section under ``## <heading>``."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"no python block in the README's {heading} section"
    return match.group(1)


def run_example(tmp_path: Path, heading: str, *args: str) -> str:
    """Run the section's example as a script (no SANDVISOR_ settings); its stdout."""
    script = tmp_path / "example.py"
    script.write_text(python_block(heading))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDVISOR_")}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_readme_library_example_runs(tmp_path: Path) -> None:
    require_engine()
    out = run_example(tmp_path, "Library")
    assert "matched 'ready' at byte" in out
    assert "completed exit 0" in out
    assert "b'tick 1\\ntic' 10 False" in out
    assert "<status>completed</status>" in out
    assert "task.stopped" in out
    assert "[info" not in out  # a library does not print logs on its own


def test_readme_workspace_example_runs(tmp_path: Path) -> None:
    require_engine()
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    out = run_example(tmp_path, "Workspaces", str(project))
    assert "completed 0" in out
    assert "('added', 'RESULT')" in out
    assert "+ok" in out
    assert (project / "RESULT").read_text() == "ok\n"
    assert (project / "RESULT").stat().st_uid == project.stat().st_uid
