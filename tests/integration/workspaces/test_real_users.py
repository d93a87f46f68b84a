"""The README's own set-ups, as their users meet them (issue 22, items 17 and 18).

Root on a fresh server keeps projects under ``/root`` (0700): the tasks of a root-owned
workspace run as ``nobody`` and must still reach their working directory, and see nothing
else of ``/root``. (The docker-group user with a 0700 home is in
``tests/e2e/test_wheel_user.py``, a daemon of that user from the installed wheel, and
``tests/e2e/test_workspace_nonroot.py``, every workspace test run as that user.)
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import Supervisor, TaskSpec
from supervisor.core.workspace import WorkspaceSpec
from tests.conftest import require_engine
from tests.users import root_only

pytestmark = [
    pytest.mark.timeout(240),
    root_only("a project under /root"),
]


@pytest.fixture
def root_home_project() -> Iterator[Path]:
    """``/root/sandvisor-it-<hex>/proj``: root's, under root's 0700 home, a small pytest
    project with a root-only file beside it in ``/root``."""
    home = Path("/root")
    assert home.stat().st_mode & 0o077 == 0 or pytest.fail("/root is expected to be private")
    base = home / f"sandvisor-it-{secrets.token_hex(4)}"
    proj = base / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (proj / "tests" / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    (proj / "index.html").write_text("<h1>served</h1>\n")
    (base / "beside.txt").write_text("not for the task\n")
    try:
        yield proj
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("policy", ["dev", "untrusted"])
async def test_root_project_under_root_home_runs_its_tests(
    root_home_project: Path, state_dir: Path, policies_dir: Path, policy: str
) -> None:
    require_engine()
    proj = root_home_project
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[proj.parent]
    ) as sup:
        session = await sup.open_session(
            f"roothome-{policy}", workspace=WorkspaceSpec(path=str(proj))
        )
        try:
            command = (
                "id -u; python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -1; "
                'python3 -c \'import os; print(sorted(os.listdir("/root"))); '
                f'print(sorted(os.listdir("{proj.parent}")))\'; '
                "cat index.html; pwd"
            )
            if policy == "untrusted":
                command = (
                    "id -u; cat pytest.ini >/dev/null && echo '1 passed'; ls -a /root; "
                    f"ls -a {proj.parent}; cat index.html; pwd"
                )
            info = await session.start(TaskSpec(command=command, policy=policy, timeout_ms=120_000))
            final = await session.wait(info.task_id, timeout_s=180)
            out = Path(final.output_path).read_text()
        finally:
            await session.end()
    assert final.status == "completed" and final.exit_code == 0, out
    lines = out.splitlines()
    assert lines[0] == "65534", out  # never root
    assert "1 passed" in out, out
    assert "<h1>served</h1>" in out and str(proj) in lines, out
    assert proj.parent.name in out and "beside.txt" not in out, out
    assert "PermissionError" not in out, out
