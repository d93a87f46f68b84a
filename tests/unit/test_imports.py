"""Start-up cost: what importing the CLI, the client and the MCP server loads.

Every ``sandvisor`` command is a new process, so a heavy import is paid on every call: the CLI
registers all its subcommands, and none may pull in docker, FastAPI, uvicorn, httpx,
pydantic or structlog before the command that needs them runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: The checkout, so that ``python -c`` imports this tree's package first.
REPO = Path(__file__).resolve().parents[2]
HEAVY = ("docker", "fastapi", "uvicorn", "httpx", "pydantic", "structlog", "importlib.abc")


def loaded_after(code: str) -> list[str]:
    probe = (
        f"import sys, json\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, check=True, timeout=60, cwd=REPO
    ).stdout
    return list(json.loads(out.decode().splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import supervisor.interfaces.client",
        "from supervisor.interfaces.cli.main import build_parser; build_parser()",
        # What `sandvisor ps` runs before it talks to the daemon, and how it prints a task.
        "from supervisor.interfaces.cli import tasks, remote; "
        "from supervisor.core.text import outcome_short; "
        "outcome_short({'status': 'completed', 'reason': 'exit', 'exit_code': 0})",
    ],
)
def test_the_cli_and_the_client_load_nothing_heavy(code: str) -> None:
    assert loaded_after(code) == []


def test_the_mcp_server_loads_no_docker_and_no_fastapi() -> None:
    # The MCP SDK itself imports pydantic, httpx and (for its HTTP transports) uvicorn.
    loaded = loaded_after("import supervisor.interfaces.mcp.server")
    assert "docker" not in loaded
    assert "fastapi" not in loaded
