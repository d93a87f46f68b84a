"""The daemon answers over its unix socket with the admin token, and refuses without it."""

from __future__ import annotations

import stat

from tests.e2e.conftest import Daemon


def test_daemon_socket_and_token(daemon: Daemon) -> None:
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.socket.parent.stat().st_mode) == 0o700
    token_file = daemon.state_dir / "daemon" / "admin.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    with daemon.client() as c:
        assert c.get("/healthz").json()["engine"]["ok"] is True
        assert c.get("/sessions").json() == []
    with daemon.client(token="wrong") as c:
        r = c.get("/sessions")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
