"""``sandvisor mcp`` on a project, through the official MCP client against a real daemon and
engine: the issue's acceptance (a Python package's tests, a venv installed in one call and
used in the next, a Node server reached from another call by its task id, the host tree
untouched throughout), the review tool, the changes kept at the end, and the refusals."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, Daemon, projects_root
from tests.e2e.projects import make_project, tree_hash
from tests.e2e.test_mcp import _BG, mcp_client

pytestmark = pytest.mark.timeout(240)

WHEEL = "hello_sandvisor-0.1-py3-none-any.whl"
PROJECT = {
    "calc/__init__.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": (
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_add_negative():\n    assert add(-1, 1) == 0\n"
    ),
    "server.js": (
        "const http = require('http');\n"
        "http.createServer((req, res) => res.end('hello from node\\n'))\n"
        "  .listen(3000, () => console.log('listening on 3000'));\n"
    ),
    ".gitignore": ".venv/\n",
}


def wheel() -> bytes:
    """A pure-Python wheel of ``hello_sandvisor``, built by hand (a zip with a RECORD)."""
    dist = "hello_sandvisor-0.1.dist-info"
    files = {
        "hello_sandvisor/__init__.py": b"def greet():\n    return 'hello from a wheel'\n",
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: hello_sandvisor\nVersion: 0.1\n",
        f"{dist}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def stderr_of(daemon: Daemon) -> str:
    return (daemon.state_dir.parent / "mcp-stderr.log").read_text()


async def test_agent_works_on_its_project_and_the_user_applies(
    daemon: Daemon, tmp_path: Path
) -> None:
    project = make_project(
        projects_root(tmp_path) / "proj", {**PROJECT, f"wheels/{WHEEL}": wheel()}
    )
    pristine = tree_hash(project)
    async with mcp_client(daemon, "--policy", "dev", cwd=project) as mcp:
        tools = {t.name for t in (await mcp.session.list_tools()).tools}
        assert "workspace_changes" in tools and "workspace_apply" not in tools
        init = mcp.session.initialize_result
        assert init is not None and init.instructions is not None
        assert str(project) in init.instructions
        bash = next(t for t in (await mcp.session.list_tools()).tools if t.name == "bash")
        assert bash.description is not None
        assert "persist between calls" in bash.description and "node_modules" in bash.description
        assert "http://bg-1a2b3c4d:3000/" in bash.description

        tests = await mcp.ok("bash", command="python3 -m pytest -q")
        assert "2 passed" in tests and "Exit code: 0" in tests, tests
        assert tree_hash(project) == pristine

        install = await mcp.ok(
            "bash",
            command=f"python3 -m venv .venv && .venv/bin/pip install --no-index wheels/{WHEEL}",
            timeout=300_000,
        )
        assert "Successfully installed hello-sandvisor-0.1" in install, install
        used = await mcp.ok(
            "bash",
            command=".venv/bin/python -c 'import hello_sandvisor; print(hello_sandvisor.greet())'",
        )
        assert used.startswith("hello from a wheel\nExit code: 0"), used
        assert tree_hash(project) == pristine

        started = await mcp.ok(
            "bash", command="node server.js", description="node server", run_in_background=True
        )
        match = _BG.search(started)
        assert match, started
        task_id = match.group(1)
        ready = await mcp.ok("task_wait", task_id=task_id, pattern="listening on", timeout=60_000)
        assert "listening on 3000" in ready
        reply = await mcp.ok("bash", command=f"curl -sS http://{task_id}:3000/")
        assert reply.startswith("hello from node\nExit code: 0"), reply

        edit = "printf 'def sub(a, b):\\n    return a - b\\n' >> calc/__init__.py"
        await mcp.ok("bash", command=edit)
        review = await mcp.ok("workspace_changes")
        assert f"Workspace {project} (overlay" in review
        assert "modified  calc/__init__.py" in review
        assert "+def sub(a, b):" in review
        assert ".venv" not in review.split("--- diff ---")[0]  # ignored: not listed
        assert "sandvisor workspace apply --session mcp-" in review
        everything = await mcp.ok("workspace_changes", ignored=True, include_diff=False)
        assert ".venv/ (ignored)" in everything and "200 of them here" in everything
        assert len(everything) < 32_000
        # The next page: the cursor the result ends with, passed back exactly.
        cursor = re.search(r"call workspace_changes with after=(\".*\") for the next", everything)
        assert cursor, everything[-500:]
        after = json.loads(cursor.group(1))
        following = await mcp.ok("workspace_changes", ignored=True, include_diff=False, after=after)
        assert f"after {cursor.group(1)}" in following
        listed = [line.split()[1] for line in following.splitlines()[1:] if "(ignored" in line]
        assert listed and all(path > after for path in listed), listed[:5]
        assert tree_hash(project) == pristine

    err = stderr_of(daemon)
    sid = re.search(r"session (mcp-[0-9a-f]{12}) open on " + re.escape(str(project)), err)
    assert sid, err
    session_id = sid.group(1)
    assert f"sandvisor workspace apply --session {session_id}" in err
    last = [line for line in err.splitlines() if session_id in line][-1]
    assert f"session {session_id} ended (1 task(s) stopped); its changes to {project}" in last
    assert f"`sandvisor workspace diff --session {session_id}`" in last
    assert tree_hash(project) == pristine

    # The user reviews and applies after the session ended: only the edit reaches the host.
    diff = daemon.sandvisor("workspace", "diff", "--session", session_id, cwd=tmp_path)
    assert b"+def sub(a, b):" in diff.stdout, diff
    applied = daemon.sandvisor("workspace", "apply", "--session", session_id, cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert "def sub(a, b)" in (project / "calc" / "__init__.py").read_text()
    assert not (project / ".venv").exists() and not (project / ".pytest_cache").exists()
    discard = daemon.sandvisor("workspace", "discard", "--session", session_id, cwd=tmp_path)
    assert discard.returncode == 0, discard.stderr


async def test_agent_apply_when_allowed(daemon: Daemon, tmp_path: Path) -> None:
    project = make_project(projects_root(tmp_path) / "small", {"a.txt": "a\n"})
    async with mcp_client(daemon, "--policy", "fast", "--allow-agent-apply", cwd=project) as mcp:
        assert "workspace_apply" in {t.name for t in (await mcp.session.list_tools()).tools}
        await mcp.ok("bash", command="echo agent > agent.txt")
        applied = await mcp.ok("workspace_apply")
        assert applied.startswith("Applied 1 change(s) to the project on the host: 1 created")
        assert (project / "agent.txt").read_text() == "agent\n"
        assert "no changes" in await mcp.ok("workspace_changes")
    assert "ended (0 task(s) stopped)" in stderr_of(daemon).splitlines()[-1]


async def test_outside_the_roots_no_workspace_and_said_so(daemon: Daemon, tmp_path: Path) -> None:
    outside = make_project(tmp_path / "outside", {"f": "x\n"})
    async with mcp_client(daemon, "--policy", "fast", cwd=outside) as mcp:
        first = await mcp.ok("bash", command="pwd")
        assert first.startswith("/tmp\nExit code: 0"), first
        assert f"this session has no workspace: {outside} is not under" in first
        second = await mcp.ok("bash", command="true")
        assert "no workspace" not in second
        assert "no workspace" in await mcp.ok("workspace_changes")
        init = mcp.session.initialize_result
        assert init is not None and init.instructions is not None
        assert "nothing persists between calls" in init.instructions
    assert f"{outside} is not under the sandvisor daemon's workspace roots" in stderr_of(daemon)

    # Named explicitly, a workspace the daemon refuses is an error: one line, no server.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "supervisor.interfaces.cli.main",
            "mcp",
            "--workspace",
            str(outside),
        ],
        env={**daemon.env, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == b""
    [line] = result.stderr.decode().splitlines()
    assert (
        line.startswith(f"sandvisor mcp: --workspace {outside}: workspace") and "not under" in line
    )
