"""Authentication and isolation of the daemon's API: 401 without a valid token, 404 (never 403)
across sessions, Host/Origin checks on TCP, private file modes, revocation, constant-time
comparison."""

from __future__ import annotations

import hmac
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.interfaces.daemon.auth import Auth
from tests.e2e.conftest import Daemon

pytestmark = pytest.mark.timeout(180)

NO_SUCH_TASK = "bg-00000000"
NO_SUCH_SESSION = "never-existed"


def uds(daemon: Daemon, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(daemon.socket)),
        base_url="http://sandvisor",
        headers=headers,
        timeout=60,
    )


def session_routes(sid: str, tid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(method, path, json body) for every route under a session, with valid bodies."""
    s, t = f"/sessions/{sid}", f"/sessions/{sid}/tasks/{tid}"
    return [
        ("GET", s, None),
        ("GET", f"{s}/tasks", None),
        ("POST", f"{s}/tasks", {"command": "echo pwned", "policy": "fast"}),
        ("GET", t, None),
        ("POST", f"{t}/stop", None),
        ("POST", f"{t}/input", {"text": "pwned\n"}),
        ("GET", f"{t}/output", None),
        ("GET", f"{t}/tail", None),
        ("POST", f"{t}/wait", {"timeout_s": 0.1}),
        ("POST", f"{t}/wait-for", {"pattern": "x", "timeout_s": 0.1}),
        ("GET", f"{s}/events", None),
        ("GET", f"{s}/events/stream", None),
        ("GET", f"{s}/notifications", None),
        ("GET", f"{s}/notifications/pending?consumer=c", None),
        ("POST", f"{s}/notifications/ack", {"consumer": "c", "seq": 0}),
        ("POST", f"{s}/end", None),
        ("DELETE", s, None),
    ]


def task_routes(sid: str, tid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [r for r in session_routes(sid, tid) if "/tasks/" in r[1]]


def call(
    client: httpx.Client, method: str, path: str, body: dict[str, Any] | None
) -> httpx.Response:
    return client.request(method, path, json=body)


def same_answer(a: httpx.Response, b: httpx.Response, real: str, fake: str) -> None:
    """Identical status and error body (code, message, the ids it names), once the ids are
    swapped: the body names only what the request named."""
    assert a.status_code == b.status_code, (a.status_code, a.text, b.status_code, b.text)
    ea, eb = a.json()["error"], b.json()["error"]
    assert ea["code"] == eb["code"], (ea, eb)
    swapped = {k: v.replace(real, fake) if isinstance(v, str) else v for k, v in ea.items()}
    assert swapped == eb, (ea, eb)
    assert set(ea) <= {"code", "message", "session_id", "task_id"}
    assert "forbidden" not in a.text


@pytest.fixture
def two_sessions(daemon: Daemon) -> Iterator[dict[str, Any]]:
    """Sessions A and B, each with its token and a running sleeper task."""
    out: dict[str, Any] = {}
    with uds(daemon, daemon.token) as admin:
        for name in ("alpha", "bravo"):
            r = admin.post("/sessions", json={"session_id": name})
            assert r.status_code == 201
            token = r.json()["token"]
            with uds(daemon, token) as c:
                r = c.post(
                    f"/sessions/{name}/tasks",
                    json={"command": "echo up; exec sleep 600", "policy": "fast"},
                )
                assert r.status_code == 201
                tid = r.json()["task_id"]
                matched = c.post(f"/sessions/{name}/tasks/{tid}/wait-for", json={"pattern": "up"})
                assert matched.json()["matched"] is True
            out[name] = {"token": token, "task": tid}
        yield out
        for name in ("alpha", "bravo"):
            admin.delete(f"/sessions/{name}")


def test_missing_or_bad_token_is_401(daemon: Daemon, two_sessions: dict[str, Any]) -> None:
    tid = two_sessions["alpha"]["task"]
    routes = [
        ("GET", "/sessions", None),
        ("POST", "/sessions", {"session_id": "x"}),
        ("GET", f"/tasks/{tid}", None),
        *session_routes("alpha", tid),
    ]
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer sandvisor_admin_wrong"},
        {"Authorization": f"Bearer {daemon.token}x"},
        {"Authorization": f"Basic {daemon.token}"},
        {"Authorization": daemon.token},
    ]
    with uds(daemon, None) as anon:
        for headers in bad_headers:
            for method, path, body in routes:
                r = anon.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (headers, method, path, r.text)
                assert r.json() == {
                    "error": {"code": "unauthorized", "message": "missing or invalid bearer token"}
                }
                assert r.headers["www-authenticate"] == "Bearer"
        # No token in query strings.
        r = anon.get("/sessions", params={"token": daemon.token})
        assert r.status_code == 401
        # Even a malformed body: authentication is decided first (this was a 422).
        r = anon.post(
            "/sessions/alpha/tasks",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
        for garbage in (b"{nope", b'{"session_id": "\xff"}'):  # bad JSON; JSON that is not UTF-8
            r = anon.post(
                "/sessions", content=garbage, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "unauthorized"
        # Health needs no token and then tells nothing but that the daemon answers.
        r = anon.get("/healthz")
        assert (r.status_code, r.json()) == (200, {"ok": True})
    # Nothing happened to the sessions.
    with uds(daemon, daemon.token) as admin:
        assert {s["session_id"] for s in admin.get("/sessions").json()} == {"alpha", "bravo"}
        assert admin.get(f"/sessions/alpha/tasks/{tid}").json()["status"] == "running"
        assert len(admin.get("/sessions/alpha/tasks").json()) == 1


def test_nothing_but_healthz_answers_without_a_token(daemon: Daemon) -> None:
    """No route, method, document or docs page is revealed to a caller without a token: every
    path and method answers 401 (PUT /sessions was a 405 naming POST; /openapi.json, /docs,
    /redoc and /docs/oauth2-redirect answered, /docs loading Swagger UI from a CDN)."""
    probes = [
        ("PUT", "/sessions"),
        ("PATCH", "/sessions/alpha"),
        ("PUT", "/sessions/alpha/tasks/bg-00000000"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/redoc"),
        ("GET", "/docs/oauth2-redirect"),
        ("GET", "/no-such-route"),
        ("DELETE", "/healthz/x"),
        ("POST", "/"),
    ]
    with uds(daemon, None) as anon:
        for method, path in probes:
            r = anon.request(method, path)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.json() == {
                "error": {"code": "unauthorized", "message": "missing or invalid bearer token"}
            }
            assert "allow" not in r.headers
        assert anon.get("/healthz").status_code == 200
    with uds(daemon, daemon.token) as admin:
        # Authenticated: the docs pages do not exist at all (no UI, no CDN); the spec does.
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            r = admin.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"]["code"] == "not_found"
        assert admin.get("/openapi.json").json()["info"]["title"] == "sandbox-supervisor"
        # 405 lists every method of the path (it listed one route's: GET, not DELETE).
        for method, path, allowed in (
            ("PUT", "/sessions", "GET, POST"),
            ("PUT", "/sessions/alpha", "DELETE, GET"),
            ("POST", "/healthz", "GET"),
            ("DELETE", "/sessions/alpha/tasks", "GET, POST"),
        ):
            r = admin.request(method, path)
            assert r.status_code == 405, (method, path, r.text)
            assert r.headers["allow"] == allowed
            assert r.json()["error"] == {
                "code": "method_not_allowed",
                "message": f"{method} is not allowed here (allowed: {allowed})",
                "allowed": allowed.split(", "),
            }


def test_cross_session_access_is_404(daemon: Daemon, two_sessions: dict[str, Any]) -> None:
    a, b = two_sessions["alpha"], two_sessions["bravo"]
    with uds(daemon, a["token"]) as c:
        # B's URLs with A's token answer exactly like a session that never existed.
        real_routes = session_routes("bravo", b["task"])
        fake_routes = session_routes(NO_SUCH_SESSION, b["task"])
        for (method, path, body), (_, fake_path, _) in zip(real_routes, fake_routes, strict=True):
            real = call(c, method, path, body)
            fake = call(c, method, fake_path, body)
            assert real.status_code == 404, (method, path, real.text)
            assert real.json()["error"]["code"] == "session_not_found"
            same_answer(real, fake, "bravo", NO_SUCH_SESSION)

        # B's task id under A's own URL: like a task id that never existed.
        for (method, path, body), (_, fake_path, _) in zip(
            task_routes("alpha", b["task"]), task_routes("alpha", NO_SUCH_TASK), strict=True
        ):
            real = call(c, method, path, body)
            fake = call(c, method, fake_path, body)
            assert real.status_code == 404, (method, path, real.text)
            assert real.json()["error"]["code"] == "task_not_found"
            same_answer(real, fake, b["task"], NO_SUCH_TASK)

        # The cross-session lookup route: B's task is as unknown as a made-up one.
        same_answer(
            c.get(f"/tasks/{b['task']}"), c.get(f"/tasks/{NO_SUCH_TASK}"), b["task"], NO_SUCH_TASK
        )
        assert c.get(f"/tasks/{b['task']}").status_code == 404
        assert c.get(f"/tasks/{a['task']}").json()["session_id"] == "alpha"

        # Admin-only routes: a 404 identical to a route that does not exist at all.
        for body in ({"session_id": "mine"}, {}, {"bogus": 1}):
            r = c.post("/sessions", json=body)
            nothing = c.post("/no-such-route", json=body)
            assert r.status_code == nothing.status_code == 404, (r.text, nothing.text)
            assert (
                r.json()
                == nothing.json()
                == {"error": {"code": "not_found", "message": "no such resource"}}
            )
        # Listing shows only the token's own session.
        assert [s["session_id"] for s in c.get("/sessions").json()] == ["alpha"]

    # B is untouched: its task still runs, its session is open, nothing was started in it.
    with uds(daemon, b["token"]) as cb:
        tasks = cb.get("/sessions/bravo/tasks").json()
        assert [(t["task_id"], t["status"]) for t in tasks] == [(b["task"], "running")]
        assert cb.get(f"/sessions/bravo/tasks/{b['task']}/output").json()["text"] == "up\n"
        assert cb.get("/sessions/bravo/events").json()["last_seq"] == 1
    with uds(daemon, daemon.token) as admin:
        assert {s["session_id"] for s in admin.get("/sessions").json()} == {"alpha", "bravo"}
        # The admin sees both (the 404s above are about the token, not the ids).
        assert admin.get(f"/sessions/bravo/tasks/{b['task']}").status_code == 200
        assert admin.get(f"/tasks/{b['task']}").json()["session_id"] == "bravo"


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


def test_revoked_token_is_401(daemon: Daemon) -> None:
    with uds(daemon, daemon.token) as admin:
        first = admin.post("/sessions", json={"session_id": "rev"}).json()["token"]
        second = admin.post("/sessions", json={"session_id": "rev"}).json()["token"]
        assert first != second
        with uds(daemon, first) as c1, uds(daemon, second) as c2:
            assert c1.get("/sessions/rev").status_code == 200
            assert c2.get("/sessions/rev").status_code == 200
            r = c1.post("/sessions/rev/tasks", json={"command": "exec sleep 600", "policy": "fast"})
            assert r.status_code == 201
            assert c2.post("/sessions/rev/end").json()["tasks_stopped"] == 1
            for c in (c1, c2):
                for method, path, body in session_routes("rev", r.json()["task_id"]):
                    resp = call(c, method, path, body)
                    assert resp.status_code == 401, (method, path, resp.text)
                    assert resp.json()["error"]["code"] == "unauthorized"
                assert c.get("/sessions").status_code == 401
        # Re-opening the id mints a new token; the old ones stay dead.
        third = admin.post("/sessions", json={"session_id": "rev"}).json()["token"]
        with uds(daemon, third) as c3, uds(daemon, first) as c1:
            assert c3.get("/sessions/rev").status_code == 200
            assert c3.get("/sessions/rev/tasks").json() == []
            assert c1.get("/sessions/rev").status_code == 401
        assert admin.delete("/sessions/rev").status_code == 200


def test_tokens_compared_in_constant_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check goes through hmac.compare_digest, for admin, session and wrong tokens."""
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    # auth.py looks hmac.compare_digest up at call time, so patching the module catches it.
    monkeypatch.setattr(hmac, "compare_digest", spy)
    auth = Auth(tmp_path / "daemon" / "admin.token")
    admin_token = (tmp_path / "daemon" / "admin.token").read_text().strip()
    assert stat.S_IMODE((tmp_path / "daemon" / "admin.token").stat().st_mode) == 0o600
    token, digest = auth.new_session_token("s1")
    assert token not in digest

    p = auth.check(admin_token)
    assert p is not None and p.admin
    assert len(calls) == 1
    calls.clear()
    p = auth.check(token)
    assert p is not None and (p.kind, p.session_id) == ("session", "s1")
    assert any(b == digest or a == digest for a, b in calls)
    calls.clear()
    assert auth.check("sandvisor_session_" + "A" * 43) is None
    assert len(calls) >= 1  # the admin comparison runs even for unknown tokens
    # Compared as fixed-length digests: the token's length does not shape the comparison.
    assert all(len(a) == len(b) == 64 for a, b in calls)
    calls.clear()
    assert auth.check("") is None
    assert auth.check(None) is None
    auth.revoke("s1")
    assert auth.check(token) is None
