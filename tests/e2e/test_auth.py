"""Authentication over the real server: the loopback TCP listener's Host/Origin checks (its
own port's names only; none on the unix socket), and private file modes (the 0600 socket in
a 0700 directory, the token files; no token in any other file). 401 without a valid token,
404 across sessions and revocation need no real server: tests/component/test_http_auth.py;
the constant-time comparison: tests/unit/test_auth.py."""

from __future__ import annotations

import stat

import httpx
import pytest

from tests.e2e.conftest import Daemon

pytestmark = pytest.mark.timeout(180)


def uds(daemon: Daemon, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(daemon.socket)),
        base_url="http://sandvisor",
        headers=headers,
        timeout=60,
    )


def test_host_and_origin_on_tcp(daemon: Daemon) -> None:
    assert daemon.tcp is not None
    host, port = daemon.tcp.rsplit(":", 1)
    assert host == "127.0.0.1"
    auth = {"Authorization": f"Bearer {daemon.token}"}
    with httpx.Client(base_url=f"http://{daemon.tcp}", timeout=30) as c:
        assert c.get("/sessions", headers=auth).status_code == 200
        assert c.get("/sessions", headers={**auth, "Host": f"localhost:{port}"}).status_code == 200
        r = c.get("/sessions", headers={**auth, "Origin": f"http://127.0.0.1:{port}"})
        assert r.status_code == 200
        assert c.get("/sessions").status_code == 401
        for bad_host in (
            "evil.example",
            f"evil.example:{port}",
            "127.0.0.1",
            f"127.0.0.1:{int(port) + 1}",
        ):
            for headers in ({**auth, "Host": bad_host}, {"Host": bad_host}):
                for path in ("/sessions", "/healthz", "/openapi.json"):
                    r = c.get(path, headers=headers)
                    assert r.status_code == 403, (bad_host, path, r.text)
                    assert r.json()["error"]["code"] == "forbidden_host"
        for origin in (
            "http://evil.example",
            f"http://evil.example:{port}",
            "null",
            f"https://127.0.0.1:{port}",
        ):
            r = c.post(
                "/sessions", headers={**auth, "Origin": origin}, json={"session_id": "rebind"}
            )
            assert r.status_code == 403, (origin, r.text)
            assert r.json()["error"]["code"] == "forbidden_origin"
        # The refused requests did nothing.
        assert c.get("/sessions", headers=auth).json() == []
    # The unix socket has no Host check (only local processes with access to a 0600 socket).
    with uds(daemon, daemon.token) as u:
        r = u.get("/sessions", headers={"Host": "evil.example"})
        assert r.status_code == 200


def test_private_file_modes(daemon: Daemon) -> None:
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    assert stat.S_ISSOCK(daemon.socket.stat().st_mode)
    assert stat.S_IMODE(daemon.socket.parent.stat().st_mode) == 0o700
    daemon_dir = daemon.state_dir / "daemon"
    assert stat.S_IMODE((daemon_dir / "admin.token").stat().st_mode) == 0o600
    assert stat.S_IMODE((daemon_dir / "daemon.json").stat().st_mode) == 0o600
    assert (daemon_dir / "admin.token").read_text().strip() == daemon.token
    assert daemon.token.startswith("sandvisor_admin_")
    # The token appears in no other file the daemon wrote (it stores digests only).
    with uds(daemon, daemon.token) as admin:
        session_token = admin.post("/sessions", json={"session_id": "files"}).json()["token"]
        admin.delete("/sessions/files")
    for path in daemon.state_dir.rglob("*"):
        if path.is_file() and path.name != "admin.token":
            data = path.read_bytes()
            assert daemon.token.encode() not in data, path
            assert session_token.encode() not in data, path
