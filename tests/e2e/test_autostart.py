"""The CLI's automatic daemon start hands out a client that carries the admin token, also
when the daemon comes up between building a client and asking it whether it listens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor.interfaces import launch as launch_mod
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.launch import ensure_daemon
from tests.conftest import require_engine
from tests.e2e.conftest import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)


class _Spawned:
    """Stands in for the spawned process: the test starts the real daemon itself, at the
    moment that used to lose the token."""

    pid = 0
    returncode = None

    def poll(self) -> None:
        return None


async def test_client_from_autostart_has_the_token_written_while_it_waited(
    tmp_path: Path, policies_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_engine()
    for name in ("SANDVISOR_URL", "SANDVISOR_TOKEN", "SANDVISOR_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    started: list[Daemon] = []
    real_reachable = SandvisorClient.reachable
    calls = 0

    async def reachable(self: SandvisorClient) -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:
            # First probe after the spawn: this client was built before the daemon wrote
            # its token; the daemon comes up now, before the client asks.
            assert not (state / "daemon" / "admin.token").exists()
            started.append(await asyncio.to_thread(start_daemon, state, policies_dir))
        return await real_reachable(self)

    monkeypatch.setattr(SandvisorClient, "reachable", reachable)
    monkeypatch.setattr(launch_mod, "_spawn", lambda cmd, log_path: _Spawned())
    try:
        client = await ensure_daemon(state, quiet=True)
        async with client:
            created = await client.create_session("autostart")  # admin only: needs the token
            assert created["session_id"] == "autostart"
            await client.end_session("autostart")
        assert calls == 2 and len(started) == 1
    finally:
        for daemon in started:
            assert daemon.stop() == 0
