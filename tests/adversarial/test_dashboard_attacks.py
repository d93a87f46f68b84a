"""Attacks on the dashboard's cookie from another loopback port (issue 22, item 10).

Browsers scope cookies by host, not port: any other local server the browser visits
(``http://127.0.0.1:18399``) receives the dashboard's cookie, and can replay it from a plain
HTTP client with whatever ``Origin`` it likes. The Origin check alone let such a replay stop
a task and mint a login link. Anything on the cookie but the dashboard's pages (static,
no data) now also needs the login's CSRF token, which never travels in a cookie: state
changes and reads alike. These cases replay with a real HTTP client against a real
``sandvisor serve --ui`` on a real engine (the browser side is in tests/browser)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import POLICIES, TEST_POLICIES, require_engine
from tests.e2e.conftest import Daemon, start_daemon
from tests.ui_login import Login, login_page

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ui_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    require_engine()
    root = tmp_path_factory.mktemp("ui-attack")
    policies = root / "policies"
    shutil.copytree(POLICIES, policies)
    for name, text in TEST_POLICIES.items():
        (policies / f"{name}.toml").write_text(text)
    d = start_daemon(root / "state", policies, "--listen", "127.0.0.1:0", "--ui")
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]


def _base(d: Daemon) -> str:
    assert d.tcp is not None
    return f"http://{d.tcp}"


def _login(d: Daemon, token: str | None = None) -> Login:
    """Open a fresh login link the way a browser does (a real client over TCP)."""
    cookie, found = login_page(d, token)
    # No token on the page fails the cases below where it matters (the attack succeeding).
    return Login(cookie, found.group(1) if found else "")


def _running(d: Daemon, sid: str, tid: str) -> bool:
    with d.client() as api:
        return str(api.get(f"/sessions/{sid}/tasks/{tid}").json()["status"]) == "running"


def _start_sleeper(d: Daemon, sid: str) -> str:
    with d.client() as api:
        r = api.post("/sessions", json={"session_id": sid})
        assert r.status_code in (200, 201), r.text
        r = api.post(f"/sessions/{sid}/tasks", json={"command": "sleep 600", "policy": "fast"})
        assert r.status_code == 201, r.text
        tid = str(r.json()["task_id"])
    deadline = time.monotonic() + 30
    while not _running(d, sid, tid):
        assert time.monotonic() < deadline, "the task never ran"
        time.sleep(0.05)
    return tid


def test_a_replayed_cookie_with_a_forged_origin_changes_nothing(ui_daemon: Daemon) -> None:
    d = ui_daemon
    base = _base(d)
    tid = _start_sleeper(d, "victim")
    admin = _login(d)
    # What a page on another loopback port receives: the Cookie header, nothing else.
    # The replay forges the dashboard's own Origin (a plain client can send any).
    forged = {"Cookie": admin.cookie, "Origin": base}
    stop = f"/sessions/victim/tasks/{tid}/stop"
    other = _login(d)
    with httpx.Client(base_url=base, timeout=30) as attacker:
        # Reads are refused too: the cookie alone opens the dashboard's pages (static files,
        # no data in them) and nothing else.
        assert attacker.get("/ui/", headers={"Cookie": admin.cookie}).status_code == 200
        for path in (
            "/tasks",
            "/sessions",
            f"/sessions/victim/tasks/{tid}/output",
            f"/sessions/victim/tasks/{tid}/output/file",
            "/sessions/victim/events",
            "/events/stream",
            "/openapi.json",
            "/metrics",
        ):
            for headers in ({}, {"Origin": base}, {"X-Sandvisor-CSRF": other.csrf}):
                r = attacker.get(path, headers={"Cookie": admin.cookie, **headers})
                assert r.status_code == 403, (path, headers, r.text)
                assert r.json()["error"]["code"] == "forbidden_csrf", r.text
            r = attacker.get(f"{path}?sandvisor_csrf={other.csrf}", headers=forged)
            assert r.status_code == 403, (path, r.text)
        for method, path, body in (
            ("POST", stop, None),
            ("POST", "/ui/logins", {}),
            ("POST", f"/sessions/victim/tasks/{tid}/input", {"text": "x\n"}),
            ("POST", "/sessions", {"session_id": "planted"}),
            ("DELETE", "/sessions/victim", None),
            ("POST", "/ui/logout", None),
        ):
            r = attacker.request(method, path, headers=forged, json=body)
            assert r.status_code == 403, (method, path, r.text)
            assert r.json()["error"]["code"] == "forbidden_csrf", r.text
            # A made-up token, and the token of another login (another cookie), fare no better.
            for token in ("sandvisor_csrf_made-up", other.csrf, admin.cookie.split("=", 1)[1]):
                r = attacker.request(
                    method, path, headers={**forged, "X-Sandvisor-CSRF": token}, json=body
                )
                assert r.status_code == 403, (method, path, token, r.text)
        # Nothing happened: the task runs, no session was planted, the login still works.
        assert _running(d, "victim", tid)
        with d.client() as api:
            assert "planted" not in {s["session_id"] for s in api.get("/sessions").json()}
        own = {"Cookie": admin.cookie, "X-Sandvisor-CSRF": admin.csrf}
        assert attacker.get("/tasks", headers=own).status_code == 200
        # Where a browser cannot send a header (EventSource, a download link), the token
        # may come in the query; the routes never see it (they refuse unknown parameters).
        r = attacker.get(f"/sessions/victim/tasks/{tid}?sandvisor_csrf={admin.csrf}", headers=own)
        assert r.status_code == 200, r.text

    # The dashboard's own script sends the token: the same requests then work.
    with httpx.Client(base_url=base, timeout=30) as dashboard:
        own = {**forged, "X-Sandvisor-CSRF": admin.csrf}
        r = dashboard.post("/ui/logins", headers=own, json={})
        assert r.status_code == 201, r.text
        r = dashboard.post(stop, headers=own)
        assert r.status_code == 200, r.text
        assert r.json()["reason"] == "user_stopped"
        # The token does not replace the Origin check: without an Origin it is still refused.
        r = dashboard.post(stop, headers={"Cookie": admin.cookie, "X-Sandvisor-CSRF": admin.csrf})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
        assert dashboard.post("/ui/logout", headers=own).status_code == 204
        assert dashboard.get("/tasks", headers=own).status_code == 401


def test_a_session_login_token_does_not_unlock_the_admin_cookie(ui_daemon: Daemon) -> None:
    """A session's login has its own token: holding it (the session's own page) and the
    admin's cookie (received on another port) changes nothing as the admin."""
    d = ui_daemon
    base = _base(d)
    tid = _start_sleeper(d, "other")
    with d.client() as api:
        session_token = api.post("/sessions", json={"session_id": "scoped"}).json()["token"]
    scoped = _login(d, session_token)
    admin = _login(d)
    headers = {"Cookie": admin.cookie, "Origin": base, "X-Sandvisor-CSRF": scoped.csrf}
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post(f"/sessions/other/tasks/{tid}/stop", headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_csrf"
    assert _running(d, "other", tid)


def test_bearer_clients_need_no_csrf_token(ui_daemon: Daemon) -> None:
    d = ui_daemon
    base = _base(d)
    tid = _start_sleeper(d, "bearer")
    auth = {"Authorization": f"Bearer {d.token}", "Origin": base}
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post(f"/sessions/bearer/tasks/{tid}/stop", headers=auth)
        assert r.status_code == 200, r.text
        assert c.post("/ui/logins", headers=auth, json={}).status_code == 201
