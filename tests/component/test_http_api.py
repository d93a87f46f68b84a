"""The daemon's HTTP API in-process (tests/component/daemon_app.py): validation errors and
their wire format, strict JSON types, lone surrogates, durations as strings, health and the
OpenAPI document, and the running-task cap under parallel starts. Moved from tests/e2e:
nothing here needs a real container, engine or socket (the task lifecycle through httpx and
curl over the unix socket stays there)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.core.ids import SESSION_ID_RE, TASK_ID_RE
from tests.component.daemon_app import InProcessDaemon

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def policies_dir(policies_dir: Path) -> Path:
    """The test policies and ``capped``: 8 running tasks per session (the cap test's, as
    tests/e2e/test_daemon_attacks.py has it)."""
    (policies_dir / "capped.toml").write_text(
        'description = "tests: 8 running tasks per session"\n'
        'image = "sandvisor/minimal:latest"\nworking_dir = "/tmp"\n'
        "[timeouts]\ngrace_s = 1.0\n[session]\nmax_running_tasks = 8\n"
    )
    return policies_dir


async def open_session(admin: httpx.AsyncClient, sid: str) -> str:
    r = await admin.post("/sessions", json={"session_id": sid})
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def expect_error(r: httpx.Response, status: int, code: str, *fields: str) -> str:
    """Assert the error envelope; every name in ``fields`` must appear in the message (and in
    ``fields`` when the API lists them). Returns the message."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert err["code"] == code, err
    message: str = err["message"]
    for name in fields:
        assert name in message, (name, message)
        if "fields" in err:
            assert name in [f["field"] for f in err["fields"]], err["fields"]
    return message


async def test_validation_errors(daemon: InProcessDaemon) -> None:
    async with daemon.client() as admin:
        tok = await open_session(admin, "valid")
        async with daemon.client(token=tok) as c:
            await _validation_errors(admin, c)


async def _validation_errors(admin: httpx.AsyncClient, c: httpx.AsyncClient) -> None:
    tasks = "/sessions/valid/tasks"
    ok = {"command": "echo ready", "policy": "fast"}

    msg = expect_error(
        await c.post(tasks, json={**ok, "bogus": 1}), 422, "invalid_request", "bogus"
    )
    assert "unknown field" in msg
    msg = expect_error(
        await c.post(tasks, json={**ok, "timeout_ms": 3_600_001}),
        422,
        "invalid_request",
        "timeout_ms",
    )
    assert "3600000" in msg
    expect_error(
        await c.post(tasks, json={**ok, "timeout_ms": 0}), 422, "invalid_request", "timeout_ms"
    )
    msg = expect_error(
        await c.post(tasks, json={**ok, "timeout": "2h"}), 422, "invalid_request", "timeout"
    )
    assert "3600000" in msg
    msg = expect_error(
        await c.post(tasks, json={**ok, "timeout": "ten seconds"}),
        422,
        "invalid_request",
        "timeout",
    )
    assert "500ms, 30s, 5m, 1h" in msg
    # A 400-digit duration once escaped as an OverflowError (HTTP 500).
    expect_error(
        await c.post(tasks, json={**ok, "timeout": "9" * 400 + "s"}),
        422,
        "invalid_request",
        "timeout",
    )
    expect_error(
        await c.post(tasks, json={**ok, "idle_timeout": "9" * 400 + "ms"}),
        422,
        "invalid_request",
        "idle_timeout",
    )
    expect_error(
        await c.post(tasks, json={**ok, "poll_every": "100ms"}),
        422,
        "invalid_request",
        "poll_every",
    )
    msg = expect_error(
        await c.post(tasks, json={**ok, "timeout": "10s", "timeout_ms": 10_000}),
        422,
        "invalid_request",
    )
    assert "timeout" in msg
    assert "timeout_ms" in msg
    expect_error(
        await c.post(tasks, json={"command": "   ", "policy": "fast"}),
        422,
        "invalid_request",
        "command",
    )
    expect_error(await c.post(tasks, json={"policy": "fast"}), 422, "invalid_request", "command")
    msg = expect_error(await c.post(tasks, json={**ok, "policy": "nope"}), 400, "policy_error")
    assert "'nope'" in msg
    # Valid on its own, refused by the policy (strict allows at most 1000 ms).
    expect_error(
        await c.post(tasks, json={**ok, "policy": "strict", "timeout_ms": 2000}),
        400,
        "invalid_spec",
        "timeout_ms",
    )
    expect_error(
        await c.post(tasks, content=b"{not json", headers={"Content-Type": "application/json"}),
        422,
        "invalid_request",
        "body",
    )
    expect_error(
        await c.post(
            tasks, content=b'{"command": "\xff"}', headers={"Content-Type": "application/json"}
        ),
        422,
        "invalid_request",
        "body",
    )
    expect_error(
        await admin.post("/sessions", json={"session_id": "../escape"}),
        422,
        "invalid_request",
        "session_id",
    )

    r = await c.post(tasks, json=ok)
    assert r.status_code == 201
    tbase = f"{tasks}/{r.json()['task_id']}"
    waited = await c.post(f"{tbase}/wait", json={"timeout_s": 60})
    assert waited.json()["task"]["status"] == "completed"
    msg = expect_error(
        await c.post(f"{tbase}/wait-for", json={"pattern": "("}), 400, "invalid_spec"
    )
    assert msg.startswith("pattern: not a valid regular expression")
    expect_error(
        await c.post(f"{tbase}/wait-for", json={"pattern": "x", "from_offset": -1}),
        422,
        "invalid_request",
        "from_offset",
    )
    # Found by the fuzzer: a from_offset past what the filesystem can seek to was a 500.
    expect_error(
        await c.post(
            f"{tbase}/wait-for", json={"pattern": "x", "from_offset": 304_250_263_527_210}
        ),
        422,
        "invalid_request",
        "from_offset",
    )
    msg = expect_error(
        await c.post(f"{tbase}/wait-for", json={"pattern": "x", "from_offset": 2**40}),
        409,
        "task_not_running",
    )
    assert "without printing a line matching 'x'" in msg
    expect_error(
        await c.post(f"{tbase}/wait-for", json={"pattern": "x", "timeout_s": 301}),
        422,
        "invalid_request",
        "timeout_s",
    )
    expect_error(
        await c.get(f"{tbase}/output", params={"offset": -1}),
        422,
        "invalid_request",
        "query.offset",
    )
    expect_error(
        await c.get(f"{tbase}/output", params={"limit": 0}), 422, "invalid_request", "query.limit"
    )
    expect_error(
        await c.get(f"{tbase}/output", params={"encoding": "utf-16"}),
        422,
        "invalid_request",
        "query.encoding",
    )
    expect_error(
        await c.get(f"{tbase}/output", params={"offset": 2**64}),
        422,
        "invalid_request",
        "query.offset",
    )
    expect_error(
        await c.post(f"{tbase}/wait", json={"timeout_s": 0}), 422, "invalid_request", "timeout_s"
    )
    expect_error(await c.post(f"{tbase}/input", json={"data_b64": "!!!"}), 422, "invalid_request")
    expect_error(
        await c.get("/sessions/valid/events", params={"after": -1}),
        422,
        "invalid_request",
        "query.after",
    )
    expect_error(
        await c.get("/sessions/valid/events/stream", headers={"Last-Event-ID": "-3"}),
        422,
        "invalid_request",
        "header.Last-Event-ID",
    )
    expect_error(
        await c.post("/sessions/valid/notifications/ack", json={"consumer": "a", "seq": 10**6}),
        422,
        "invalid_request",
        "seq",
    )


async def test_json_types_are_strict(daemon: InProcessDaemon) -> None:
    """A boolean or a string where the schema says integer (or boolean) is refused, naming
    the field, never coerced (``{"seq": false}`` was a silent 0)."""
    async with daemon.client() as admin:
        tok = await open_session(admin, "strict")
    async with daemon.client(token=tok) as c:
        ack = "/sessions/strict/notifications/ack"
        for seq in (False, True, "1", "0", 0.5, None):
            expect_error(
                await c.post(ack, json={"consumer": "a", "seq": seq}),
                422,
                "invalid_request",
                "seq",
            )
        # JSON (and JSON Schema) does not tell 0 from 0.0: both are the integer 0.
        for seq in (0, 0.0):
            assert (await c.post(ack, json={"consumer": "a", "seq": seq})).json() == {
                "consumer": "a",
                "acked": 0,
            }
        tasks = "/sessions/strict/tasks"
        ok = {"command": "echo ready", "policy": "fast"}
        for field, value in (
            ("timeout_ms", "1000"),
            ("timeout_ms", True),
            ("persistent", 1),
            ("persistent", "true"),
            ("poll_every_s", "60"),
            ("command", 1),
            ("env.A", 1),
            ("limits.memory_mb", "64"),
        ):
            outer, _, inner = field.partition(".")
            body = {**ok, outer: {inner: value} if inner else value}
            expect_error(await c.post(tasks, json=body), 422, "invalid_request", field)
        r = await c.post(
            tasks, json={**ok, "timeout_ms": 60_000, "poll_every_s": 60, "persistent": False}
        )
        assert r.status_code == 201, r.text
        tbase = f"{tasks}/{r.json()['task_id']}"
        waited = await c.post(f"{tbase}/wait", json={"timeout_s": 60})
        assert waited.json()["task"]["status"] == "completed"
        for body in ({"pattern": "x", "from_offset": False}, {"pattern": "x", "from_offset": "0"}):
            expect_error(
                await c.post(f"{tbase}/wait-for", json=body), 422, "invalid_request", "from_offset"
            )
        expect_error(await c.post(f"{tbase}/wait", json={"timeout_s": "1"}), 422, "invalid_request")
        # An integer where a number is asked for is a number (JSON does not tell 1 from 1.0).
        assert (await c.post(f"{tbase}/wait", json={"timeout_s": 1})).json()["timed_out"] is False
        expect_error(
            await c.post(f"{tbase}/input", json={"text": "x", "eof": "yes"}),
            422,
            "invalid_request",
            "eof",
        )
        # Query strings and headers are text, read in the one spelling of their type.
        for params, field in (
            ({"offset": "1_0"}, "query.offset"),
            ({"offset": " 1"}, "query.offset"),
            ({"limit": "1.0"}, "query.limit"),
            ({"wait_s": "1,5"}, "query.wait_s"),
        ):
            expect_error(
                await c.get(f"{tbase}/output", params=params), 422, "invalid_request", field
            )
        read = await c.get(f"{tbase}/output", params={"offset": "0", "wait_s": "1e-3"})
        assert read.status_code == 200
        for active in ("yes", "1", "True", "on"):
            expect_error(
                await c.get(tasks, params={"active": active}),
                422,
                "invalid_request",
                "query.active",
            )
        assert (await c.get(tasks, params={"active": "true"})).json() == []
        assert len((await c.get(tasks, params={"active": "false"})).json()) == 1
        expect_error(
            await c.get("/sessions/strict/events/stream", headers={"Last-Event-ID": "1.0"}),
            422,
            "invalid_request",
            "header.Last-Event-ID",
        )


async def test_lone_surrogate_is_refused_naming_the_field(daemon: InProcessDaemon) -> None:
    """A lone UTF-16 surrogate (``"\\ud800"``, valid JSON but not Unicode) was a 422 that
    said "Error serializing to JSON: UnicodeEncodeError" and named no field."""
    async with daemon.client() as admin:
        tok = await open_session(admin, "surrogate")
    tasks = "/sessions/surrogate/tasks"
    json_type = {"Content-Type": "application/json"}
    async with daemon.client(token=tok) as c:

        async def post(path: str, raw: str) -> httpx.Response:
            return await c.post(path, content=raw.encode(), headers=json_type)

        cases = [
            ('{"command": "echo hi", "policy": "fast", "env": {"A": "\\ud800"}}', "env.A"),
            ('{"command": "echo \\udfff", "policy": "fast"}', "command"),
            ('{"command": "echo hi", "description": "x\\ud83d", "policy": "fast"}', "description"),
            ('{"command": "echo hi", "policy": "fast", "env": {"\\ud800": "v"}}', "env (a key)"),
        ]
        for raw, field in cases:
            msg = expect_error(await post(tasks, raw), 422, "invalid_request", field)
            assert "lone UTF-16 surrogate" in msg, msg
            assert "serializ" not in msg.lower()
        # A surrogate pair is a valid character (U+1F600), and so is an escaped backslash-u.
        r = await post(tasks, '{"command": "echo \\ud83d\\ude00 \\\\ud800", "policy": "fast"}')
        assert r.status_code == 201, r.text
        tid = r.json()["task_id"]
        assert r.json()["command"] == "echo \U0001f600 \\ud800"
        waited = await c.post(f"{tasks}/{tid}/wait", json={"timeout_s": 60})
        assert waited.json()["task"]["status"] == "completed"
        # Nothing was started by the refused requests.
        assert [t["task_id"] for t in (await c.get(tasks)).json()] == [tid]


async def test_durations_as_strings_take_effect(daemon: InProcessDaemon) -> None:
    async with daemon.client() as admin:
        tok = await open_session(admin, "durations")
    async with daemon.client(token=tok) as c:
        r = await c.post(
            "/sessions/durations/tasks",
            json={
                "command": "exec sleep 60",
                "policy": "fast",
                "timeout": "1500ms",
                "poll_every": "1m",
                "stall_after": "2s",
                "idle_timeout": "1h",
            },
        )
        assert r.status_code == 201, r.text
        info = r.json()
        assert info["timeout_ms"] == 1500
        t0 = time.monotonic()
        r = await c.post(
            f"/sessions/durations/tasks/{info['task_id']}/wait", json={"timeout_s": 60}
        )
        final = r.json()["task"]
        assert final["status"] == "killed"
        assert final["reason"] == "timeout"
        assert time.monotonic() - t0 < 30
        assert (await c.delete("/sessions/durations")).json()["tasks_stopped"] == 0


async def test_healthz_and_openapi(daemon: InProcessDaemon) -> None:
    async with daemon.anon() as anon:
        # Without a token: liveness only, nothing of the engine, kernel, sessions or tasks.
        for headers in ({}, {"Authorization": "Bearer sandvisor_admin_wrong"}):
            r = await anon.get("/healthz", headers=headers)
            assert r.status_code == 200
            assert r.json() == {"ok": True}, r.text
    async with daemon.client() as admin:
        r = await admin.get("/healthz")
        assert r.status_code == 200
        health = r.json()
        assert health["status"] == "ok"
        assert health["engine"]["ok"] is True
        assert health["engine"]["api_version"]
        assert health["sessions"] == 0
        assert health["running_tasks"] == 0
        # A session's token sees its own session, not the daemon's: liveness only.
        async with daemon.client(token=await open_session(admin, "health-scoped")) as scoped:
            assert (await scoped.get("/healthz")).json() == {"ok": True}
        assert (await admin.delete("/sessions/health-scoped")).status_code == 200
    async with daemon.anon() as anon:
        # The document is for authenticated callers only (it was public).
        r = await anon.get("/openapi.json")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
    async with daemon.client() as admin:
        doc = (await admin.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path in (
        "/sessions",
        "/sessions/{session_id}/tasks",
        "/sessions/{session_id}/tasks/{task_id}/output",
        "/sessions/{session_id}/tasks/{task_id}/wait-for",
        "/sessions/{session_id}/events/stream",
        "/sessions/{session_id}/notifications",
    ):
        assert path in paths, path
    assert "timeout" in doc["components"]["schemas"]["StartTask"]["properties"]
    check_openapi_is_exact(doc)

    # running_tasks counts live tasks across sessions.
    async with daemon.client() as admin:
        tok = await open_session(admin, "health")
        async with daemon.client(token=tok) as c:
            r = await c.post(
                "/sessions/health/tasks",
                json={"command": "echo up; exec sleep 600", "policy": "fast"},
            )
            tid = r.json()["task_id"]
            matched = await c.post(f"/sessions/health/tasks/{tid}/wait-for", json={"pattern": "up"})
            assert matched.json()["matched"]
            health = (await admin.get("/healthz")).json()
            assert (health["sessions"], health["running_tasks"]) == (1, 1)
            assert (await c.delete("/sessions/health")).json()["tasks_stopped"] == 1
        assert (await admin.get("/healthz")).json()["running_tasks"] == 0


def check_openapi_is_exact(doc: dict[str, Any]) -> None:
    """What the document used to get wrong: only 200 and 422 documented (422 in FastAPI's own
    shape, not ours), SSE as JSON, the XML notifications missing, no id patterns, a string
    Last-Event-ID."""
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["ErrorBody"]["properties"]) == {"error"}
    assert {"code", "message"} <= set(schemas["ErrorDetail"]["required"])
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            where = f"{method.upper()} {path}"
            responses = op["responses"]
            public = path == "/healthz"
            assert ("security" in op) is not public, where
            expected = {"403", "408", "503"} | (set() if public else {"401"})
            if op.get("parameters") or "requestBody" in op:
                expected |= {"422"}
            if "requestBody" in op:
                expected |= {"413"}
            if "{session_id}" in path or "{task_id}" in path:
                expected |= {"404"}
            assert expected <= set(responses), (where, sorted(responses))
            for status, entry in responses.items():
                if int(status) >= 400 and not public:
                    assert entry["content"] == {"application/json": {"schema": error_ref}}, (
                        where,
                        status,
                    )
            for param in op.get("parameters", []):
                # An optional filter (``?task_id=``) is a string or null: the string has it.
                schemas = param["schema"].get("anyOf", [param["schema"]])
                patterns = [s.get("pattern") for s in schemas if s.get("type") == "string"]
                if param["name"] == "session_id":
                    assert patterns == [SESSION_ID_RE.pattern], where
                if param["name"] == "task_id":
                    assert patterns == [TASK_ID_RE.pattern], where
    tasks = doc["paths"]["/sessions/{session_id}/tasks"]["post"]["responses"]
    assert {"400", "409", "424", "429", "502", "507"} <= set(tasks)
    stream = doc["paths"]["/sessions/{session_id}/events/stream"]["get"]
    assert set(stream["responses"]["200"]["content"]) == {"text/event-stream"}
    (last_event_id,) = [p for p in stream["parameters"] if p["in"] == "header"]
    assert last_event_id["name"] == "Last-Event-ID"
    assert {"type": "integer", "minimum": 0} in [
        {k: v for k, v in option.items() if k in ("type", "minimum")}
        for option in last_event_id["schema"]["anyOf"]
    ]
    notes = doc["paths"]["/sessions/{session_id}/notifications"]["get"]["responses"]["200"]
    assert set(notes["content"]) == {"application/json", "application/xml"}
    output = doc["paths"]["/sessions/{session_id}/tasks/{task_id}/output"]["get"]
    assert set(output["responses"]["200"]["content"]) == {
        "application/json",
        "application/octet-stream",
    }
    stop = doc["paths"]["/sessions/{session_id}/tasks/{task_id}/stop"]["post"]["responses"]
    assert "409" in stop
    assert "/docs" not in doc["paths"]


# -- limits --------------------------------------------------------------------------------


async def test_the_running_task_cap_holds_under_parallel_starts(
    daemon: InProcessDaemon,
) -> None:
    """Defect 3 of issue 14: 100 parallel starts were all accepted against a cap of 64. The
    cap is per session, counted across policies, and reserved before any await."""
    async with daemon.client() as c:
        (await c.post("/sessions", json={"session_id": "cap"})).raise_for_status()
        # One task under another policy counts against the same session.
        r = await c.post("/sessions/cap/tasks", json={"command": "sleep 120", "policy": "fast"})
        assert r.status_code == 201, r.text
        gate = asyncio.Semaphore(16)  # 16 at a time, as the e2e test's 16 threads

        async def one() -> int:
            async with gate, daemon.client() as own:
                r = await own.post(
                    "/sessions/cap/tasks", json={"command": "sleep 120", "policy": "capped"}
                )
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "limit_exceeded"
            return r.status_code

        codes = list(await asyncio.gather(*(one() for _ in range(40))))
        assert sorted(set(codes)) == [201, 429], codes
        assert codes.count(201) == 7, codes  # 8 in the session, the first one included
        tasks = (await c.get("/sessions/cap/tasks")).json()
        running_now = [t for t in tasks if t["status"] in ("starting", "running", "stopping")]
        assert len(running_now) == 8
        # Another session has its own cap.
        (await c.post("/sessions", json={"session_id": "cap2"})).raise_for_status()
        r = await c.post("/sessions/cap2/tasks", json={"command": "true", "policy": "capped"})
        assert r.status_code == 201
        await c.delete("/sessions/cap")
        await c.delete("/sessions/cap2")
