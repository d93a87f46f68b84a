"""Fixtures of the workspace integration tests: a supervisor whose only workspace root is a
folder of the test's own, and projects in it owned by an ordinary user (uid 1000)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from supervisor import Supervisor
from tests.conftest import require_engine
from tests.integration.workspaces.support import WsEnv


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    """The supervisor's one workspace root."""
    path = tmp_path / "roots"
    path.mkdir()
    return path


@pytest.fixture
async def ws(roots: Path, state_dir: Path, policies_dir: Path) -> AsyncIterator[WsEnv]:
    require_engine()
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[roots]
    ) as sup:
        yield WsEnv(sup, roots)
