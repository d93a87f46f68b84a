"""Authentication and isolation of the daemon's API, in-process (tests/component/daemon_app.py):
401 without a valid token, on every route and method, decided before the body; 404 (never
403) across sessions; revocation. Moved from tests/e2e/test_auth.py, which keeps what needs
the real server: the TCP listener's Host/Origin checks and the files' modes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.component.daemon_app import InProcessDaemon

pytestmark = pytest.mark.timeout(60)

NO_SUCH_TASK = "bg-00000000"
NO_SUCH_SESSION = "never-existed"


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


async def call(
    client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None
) -> httpx.Response:
    return await client.request(method, path, json=body)


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
async def two_sessions(daemon: InProcessDaemon) -> AsyncIterator[dict[str, Any]]:
    """Sessions A and B, each with its token and a running sleeper task."""
    out: dict[str, Any] = {}
    async with daemon.client() as admin:
        for name in ("alpha", "bravo"):
            r = await admin.post("/sessions", json={"session_id": name})
            assert r.status_code == 201
            token = r.json()["token"]
            async with daemon.client(token) as c:
                r = await c.post(
                    f"/sessions/{name}/tasks",
                    json={"command": "echo up; exec sleep 600", "policy": "fast"},
                )
                assert r.status_code == 201
                tid = r.json()["task_id"]
                matched = await c.post(
                    f"/sessions/{name}/tasks/{tid}/wait-for", json={"pattern": "up"}
                )
                assert matched.json()["matched"] is True
            out[name] = {"token": token, "task": tid}
        yield out
        for name in ("alpha", "bravo"):
            await admin.delete(f"/sessions/{name}")


async def test_missing_or_bad_token_is_401(
    daemon: InProcessDaemon, two_sessions: dict[str, Any]
) -> None:
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
    async with daemon.anon() as anon:
        for headers in bad_headers:
            for method, path, body in routes:
                r = await anon.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (headers, method, path, r.text)
                assert r.json() == {
                    "error": {"code": "unauthorized", "message": "missing or invalid bearer token"}
                }
                assert r.headers["www-authenticate"] == "Bearer"
        # No token in query strings.
        r = await anon.get("/sessions", params={"token": daemon.token})
        assert r.status_code == 401
        # Even a malformed body: authentication is decided first (this was a 422).
        r = await anon.post(
            "/sessions/alpha/tasks",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
        for garbage in (b"{nope", b'{"session_id": "\xff"}'):  # bad JSON; JSON that is not UTF-8
            r = await anon.post(
                "/sessions", content=garbage, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "unauthorized"
        # Health needs no token and then tells nothing but that the daemon answers.
        r = await anon.get("/healthz")
        assert (r.status_code, r.json()) == (200, {"ok": True})
    # Nothing happened to the sessions.
    async with daemon.client() as admin:
        listed = (await admin.get("/sessions")).json()
        assert {s["session_id"] for s in listed} == {"alpha", "bravo"}
        assert (await admin.get(f"/sessions/alpha/tasks/{tid}")).json()["status"] == "running"
        assert len((await admin.get("/sessions/alpha/tasks")).json()) == 1


async def test_nothing_but_healthz_answers_without_a_token(daemon: InProcessDaemon) -> None:
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
    async with daemon.anon() as anon:
        for method, path in probes:
            r = await anon.request(method, path)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.json() == {
                "error": {"code": "unauthorized", "message": "missing or invalid bearer token"}
            }
            assert "allow" not in r.headers
        assert (await anon.get("/healthz")).status_code == 200
    async with daemon.client() as admin:
        # Authenticated: the docs pages do not exist at all (no UI, no CDN); the spec does.
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            r = await admin.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"]["code"] == "not_found"
        spec = (await admin.get("/openapi.json")).json()
        assert spec["info"]["title"] == "sandbox-supervisor"
        # 405 lists every method of the path (it listed one route's: GET, not DELETE).
        for method, path, allowed in (
            ("PUT", "/sessions", "GET, POST"),
            ("PUT", "/sessions/alpha", "DELETE, GET"),
            ("POST", "/healthz", "GET"),
            ("DELETE", "/sessions/alpha/tasks", "GET, POST"),
        ):
            r = await admin.request(method, path)
            assert r.status_code == 405, (method, path, r.text)
            assert r.headers["allow"] == allowed
            assert r.json()["error"] == {
                "code": "method_not_allowed",
                "message": f"{method} is not allowed here (allowed: {allowed})",
                "allowed": allowed.split(", "),
            }


async def test_cross_session_access_is_404(
    daemon: InProcessDaemon, two_sessions: dict[str, Any]
) -> None:
    a, b = two_sessions["alpha"], two_sessions["bravo"]
    async with daemon.client(a["token"]) as c:
        # B's URLs with A's token answer exactly like a session that never existed.
        real_routes = session_routes("bravo", b["task"])
        fake_routes = session_routes(NO_SUCH_SESSION, b["task"])
        for (method, path, body), (_, fake_path, _) in zip(real_routes, fake_routes, strict=True):
            real = await call(c, method, path, body)
            fake = await call(c, method, fake_path, body)
            assert real.status_code == 404, (method, path, real.text)
            assert real.json()["error"]["code"] == "session_not_found"
            same_answer(real, fake, "bravo", NO_SUCH_SESSION)

        # B's task id under A's own URL: like a task id that never existed.
        for (method, path, body), (_, fake_path, _) in zip(
            task_routes("alpha", b["task"]), task_routes("alpha", NO_SUCH_TASK), strict=True
        ):
            real = await call(c, method, path, body)
            fake = await call(c, method, fake_path, body)
            assert real.status_code == 404, (method, path, real.text)
            assert real.json()["error"]["code"] == "task_not_found"
            same_answer(real, fake, b["task"], NO_SUCH_TASK)

        # The cross-session lookup route: B's task is as unknown as a made-up one.
        same_answer(
            await c.get(f"/tasks/{b['task']}"),
            await c.get(f"/tasks/{NO_SUCH_TASK}"),
            b["task"],
            NO_SUCH_TASK,
        )
        assert (await c.get(f"/tasks/{b['task']}")).status_code == 404
        assert (await c.get(f"/tasks/{a['task']}")).json()["session_id"] == "alpha"

        # Admin-only routes: a 404 identical to a route that does not exist at all.
        for body in ({"session_id": "mine"}, {}, {"bogus": 1}):
            r = await c.post("/sessions", json=body)
            nothing = await c.post("/no-such-route", json=body)
            assert r.status_code == nothing.status_code == 404, (r.text, nothing.text)
            assert (
                r.json()
                == nothing.json()
                == {"error": {"code": "not_found", "message": "no such resource"}}
            )
        # Listing shows only the token's own session.
        assert [s["session_id"] for s in (await c.get("/sessions")).json()] == ["alpha"]

    # B is untouched: its task still runs, its session is open, nothing was started in it.
    async with daemon.client(b["token"]) as cb:
        tasks = (await cb.get("/sessions/bravo/tasks")).json()
        assert [(t["task_id"], t["status"]) for t in tasks] == [(b["task"], "running")]
        output = await cb.get(f"/sessions/bravo/tasks/{b['task']}/output")
        assert output.json()["text"] == "up\n"
        assert (await cb.get("/sessions/bravo/events")).json()["last_seq"] == 1
    async with daemon.client() as admin:
        listed = (await admin.get("/sessions")).json()
        assert {s["session_id"] for s in listed} == {"alpha", "bravo"}
        # The admin sees both (the 404s above are about the token, not the ids).
        assert (await admin.get(f"/sessions/bravo/tasks/{b['task']}")).status_code == 200
        assert (await admin.get(f"/tasks/{b['task']}")).json()["session_id"] == "bravo"


async def test_revoked_token_is_401(daemon: InProcessDaemon) -> None:
    async with daemon.client() as admin:
        first = (await admin.post("/sessions", json={"session_id": "rev"})).json()["token"]
        second = (await admin.post("/sessions", json={"session_id": "rev"})).json()["token"]
        assert first != second
        async with daemon.client(first) as c1, daemon.client(second) as c2:
            assert (await c1.get("/sessions/rev")).status_code == 200
            assert (await c2.get("/sessions/rev")).status_code == 200
            r = await c1.post(
                "/sessions/rev/tasks", json={"command": "exec sleep 600", "policy": "fast"}
            )
            assert r.status_code == 201
            assert (await c2.post("/sessions/rev/end")).json()["tasks_stopped"] == 1
            for c in (c1, c2):
                for method, path, body in session_routes("rev", r.json()["task_id"]):
                    resp = await call(c, method, path, body)
                    assert resp.status_code == 401, (method, path, resp.text)
                    assert resp.json()["error"]["code"] == "unauthorized"
                assert (await c.get("/sessions")).status_code == 401
        # Re-opening the id mints a new token; the old ones stay dead.
        third = (await admin.post("/sessions", json={"session_id": "rev"})).json()["token"]
        async with daemon.client(third) as c3, daemon.client(first) as c1:
            assert (await c3.get("/sessions/rev")).status_code == 200
            assert (await c3.get("/sessions/rev/tasks")).json() == []
            assert (await c1.get("/sessions/rev")).status_code == 401
        assert (await admin.delete("/sessions/rev")).status_code == 200
