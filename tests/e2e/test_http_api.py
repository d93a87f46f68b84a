"""The daemon's HTTP API end to end: one task lifecycle through httpx over the unix socket and
the same through ``curl --unix-socket``, and the project's own client. Validation errors,
health and the OpenAPI document need no container: tests/component/test_http_api.py."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from supervisor.core.labels import LABEL_SESSION
from tests.conftest import labelled_containers
from tests.e2e.conftest import Daemon

pytestmark = pytest.mark.timeout(180)

TASK_ID = re.compile(r"^bg-[0-9a-f]{8}$")

#: Prints a known mix (ASCII, multibyte UTF-8, two invalid bytes), then answers two stdin
#: lines and exits 3. Lines are long enough that 777-byte slices cut inside characters.
IO_COMMAND = (
    "printf 'before\\n'; i=0; while [ $i -lt 200 ]; do "
    "printf 'line %d café € — ünïcødé\\n' $i; i=$((i+1)); done; "
    "printf '\\377\\376 binary\\n'; "
    'read x; echo "got $x"; read y; echo "end $y"; exit 3'
)


@dataclass
class Reply:
    """One HTTP answer, whichever client fetched it."""

    status: int
    headers: dict[str, str]
    """Lower-cased header names."""
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()

    def error(self) -> dict[str, Any]:
        body = self.json()
        assert set(body) == {"error"}, body
        err: dict[str, Any] = body["error"]
        return err


Send = Callable[..., Reply]


class HttpxTransport:
    """httpx over the daemon's unix socket."""

    name = "httpx"

    def __init__(self, daemon: Daemon) -> None:
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(daemon.socket)),
            base_url="http://sandvisor",
            timeout=120,
        )

    def __call__(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        r = self._client.request(method, path, json=json, params=params, headers=hdrs)
        return Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    def close(self) -> None:
        self._client.close()


class CurlTransport:
    """The ``curl`` binary with ``--unix-socket``: a client that shares no code with ours."""

    name = "curl"

    def __init__(self, daemon: Daemon) -> None:
        self._socket = str(daemon.socket)
        self._dir = Path(tempfile.mkdtemp(prefix="sandvisor-curl-"))
        self._n = 0

    def __call__(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        import json as jsonlib  # noqa: PLC0415 - the parameter shadows the module

        self._n += 1
        head, body = self._dir / f"{self._n}.h", self._dir / f"{self._n}.b"
        url = "http://sandvisor" + path + ("?" + urlencode(params) if params else "")
        argv = ["curl", "-sS", "--max-time", "120", "--unix-socket", self._socket, "-X", method]
        argv += ["-D", str(head), "-o", str(body), "-w", "%{http_code}"]
        for name, value in (headers or {}).items():
            argv += ["-H", f"{name}: {value}"]
        if token is not None:
            argv += ["-H", f"Authorization: Bearer {token}"]
        data = None
        if json is not None:
            data = jsonlib.dumps(json).encode()
            argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        argv.append(url)
        done = subprocess.run(argv, input=data, capture_output=True, timeout=150, check=False)
        assert done.returncode == 0, done.stderr.decode()
        hdrs: dict[str, str] = {}
        for line in head.read_text("latin-1").splitlines()[1:]:
            name, sep, value = line.partition(":")
            if sep:
                hdrs[name.strip().lower()] = value.strip()
        return Reply(int(done.stdout), hdrs, body.read_bytes())

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture(params=["httpx", "curl"])
def send(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[Send]:
    if request.param == "curl" and shutil.which("curl") is None:
        pytest.fail("curl is not installed (apt-get install -y curl)")
    transport = HttpxTransport(daemon) if request.param == "httpx" else CurlTransport(daemon)
    try:
        yield transport
    finally:
        transport.close()


def session_containers(session_id: str) -> list[dict[str, Any]]:
    return labelled_containers(LABEL_SESSION, session_id)


def read_all(send: Send, token: str, base: str, encoding: str, limit: int) -> list[Reply]:
    """Every slice from offset 0, following next_offset until a read comes back empty."""
    replies = []
    offset = 0
    while True:
        r = send(
            "GET",
            f"{base}/output",
            token=token,
            params={"offset": offset, "limit": limit, "encoding": encoding},
        )
        assert r.status == 200, r.content
        replies.append(r)
        if encoding == "raw":
            assert r.headers["content-type"] == "application/octet-stream"
            nxt = int(r.headers["x-next-offset"])
            assert nxt == offset + len(r.content)
            assert r.headers["x-eof"] == "false"
            empty = not r.content
        else:
            body = r.json()
            assert body["offset"] == offset
            assert body["eof"] is False
            nxt = body["next_offset"]
            empty = nxt == offset
            if encoding == "base64":
                assert nxt == offset + len(base64.b64decode(body["data_b64"]))
        if empty:
            return replies
        assert nxt - offset <= limit
        offset = nxt


def test_task_lifecycle(daemon: Daemon, send: Send) -> None:
    sid = "life"

    # -- a session and its token ------------------------------------------------------
    r = send("POST", "/sessions", token=daemon.token, json={"session_id": sid})
    assert r.status == 201, r.content
    created = r.json()
    assert created["session_id"] == sid
    assert created["ended"] is False
    assert created["tasks"] == 0
    tok = created["token"]
    assert tok.startswith("sandvisor_session_")
    assert len(tok) > 40
    base = f"/sessions/{sid}"

    # -- start (durations as strings) ---------------------------------------------------
    r = send(
        "POST",
        f"{base}/tasks",
        token=tok,
        json={
            "command": IO_COMMAND,
            "description": "io task",
            "policy": "fast",
            "timeout": "2m",
            "poll_every": "1m",
        },
    )
    assert r.status == 201, r.content
    info = r.json()
    tid = info["task_id"]
    assert TASK_ID.match(tid)
    assert info["session_id"] == sid
    assert info["status"] in ("starting", "running")
    assert info["timeout_ms"] == 120_000
    assert info["policy"] == "fast"
    assert info["kind"] == "background"
    assert info["description"] == "io task"
    assert info["output_path"].endswith(f"/sessions/{sid}/tasks/{tid}.output")
    output_file = Path(info["output_path"])
    tbase = f"{base}/tasks/{tid}"

    # -- list and get ---------------------------------------------------------------------
    r = send("GET", f"{base}/tasks", token=tok)
    assert r.status == 200
    assert [t["task_id"] for t in r.json()] == [tid]
    r = send("GET", f"{base}/tasks", token=tok, params={"kind": "monitor"})
    assert r.status == 200
    assert r.json() == []
    r = send("GET", f"{base}/tasks", token=tok, params={"active": "true"})
    assert [t["task_id"] for t in r.json()] == [tid]
    r = send("GET", tbase, token=tok)
    assert r.status == 200
    assert r.json()["task_id"] == tid
    assert r.json()["command"] == IO_COMMAND
    r = send("GET", f"/tasks/{tid}", token=tok)
    assert r.status == 200
    assert r.json()["session_id"] == sid

    # -- follow the output (server-side long-poll) until the task waits for input ----------
    seen = b""
    deadline = time.monotonic() + 60
    while b" binary\n" not in seen:
        assert time.monotonic() < deadline, f"output stalled at {seen[-200:]!r}"
        r = send(
            "GET",
            f"{tbase}/output",
            token=tok,
            params={"offset": len(seen), "encoding": "raw", "wait_s": 10},
        )
        assert r.status == 200
        assert int(r.headers["x-next-offset"]) == len(seen) + len(r.content)
        seen += r.content
    # Blocked in `read` now: the output cannot change until we send a line.
    assert seen == output_file.read_bytes()
    assert seen.startswith(b"before\nline 0 caf\xc3\xa9 \xe2\x82\xac")
    assert seen.endswith(
        b"line 199 caf\xc3\xa9 \xe2\x82\xac \xe2\x80\x94 \xc3\xbcn\xc3\xafc\xc3\xb8d\xc3\xa9\n\xff\xfe binary\n"
    )

    # -- wait-for: a line printed before the call ---------------------------------------
    r = send("POST", f"{tbase}/wait-for", token=tok, json={"pattern": "^before$"})
    assert r.status == 200
    assert r.json() == {"matched": True, "timed_out": False, "line": "before", "offset": 0}
    r = send("POST", f"{tbase}/wait-for", token=tok, json={"pattern": r"^line 1\d\d caf"})
    assert r.json()["matched"] is True
    assert r.json()["offset"] == seen.index(b"line 100 ")
    assert r.json()["line"] == "line 100 café € — ünïcødé"
    r = send(
        "POST",
        f"{tbase}/wait-for",
        token=tok,
        json={"pattern": "^line", "from_offset": seen.index(b"line 150 ")},
    )
    assert r.json()["line"].startswith("line 150 ")

    # -- output by offset and limit: text, base64, raw; stitched slices equal the file ----
    texts = read_all(send, tok, tbase, "text", 777)
    joined = "".join(t.json()["text"] for t in texts)
    assert joined == seen.decode("utf-8", "replace")
    # Slices never cut inside a character: the only U+FFFD are the two invalid bytes.
    assert joined.count("\ufffd") == 2
    assert [t.json()["lossy"] for t in texts if t.json()["text"]].count(True) == 1
    chunks = read_all(send, tok, tbase, "base64", 777)
    assert b"".join(base64.b64decode(c.json()["data_b64"]) for c in chunks) == seen
    raws = read_all(send, tok, tbase, "raw", 1000)
    assert b"".join(r.content for r in raws) == seen
    assert len(raws) > 3
    r = send(
        "GET", f"{tbase}/output", token=tok, params={"offset": 7, "limit": 6, "encoding": "raw"}
    )
    assert r.content == seen[7:13]
    assert r.headers["x-next-offset"] == "13"
    r = send("GET", f"{tbase}/output", token=tok, params={"offset": len(seen) + 100})
    assert r.json() == {
        "offset": len(seen) + 100,
        "next_offset": len(seen) + 100,
        "eof": False,
        "text": "",
        "lossy": False,
    }

    # -- tail -----------------------------------------------------------------------------
    r = send("GET", f"{tbase}/tail", token=tok, params={"chars": 40})
    assert r.status == 200
    assert r.json() == {"text": seen.decode("utf-8", "replace")[-40:], "lossy": True}

    # -- input, and wait-for a line printed after the call ----------------------------------
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            send,
            "POST",
            f"{tbase}/wait-for",
            token=tok,
            json={"pattern": "^got (.*)$", "timeout_s": 60},
        )
        r = send("POST", f"{tbase}/input", token=tok, json={"text": "hello\n"})
        assert r.status == 204
        assert r.content == b""
        matched = pending.result(timeout=90)
    assert matched.status == 200
    assert matched.json() == {
        "matched": True,
        "timed_out": False,
        "line": "got hello",
        "offset": len(seen),
    }
    r = send(
        "POST",
        f"{tbase}/input",
        token=tok,
        json={"data_b64": base64.b64encode(b"world\n").decode(), "eof": True},
    )
    assert r.status == 204

    # -- wait for the final status ----------------------------------------------------------
    r = send("POST", f"{tbase}/wait", token=tok, json={"timeout_s": 60})
    assert r.status == 200
    waited = r.json()
    assert waited["timed_out"] is False
    final = waited["task"]
    assert final["status"] == "failed"
    assert final["reason"] == "exit"
    assert final["exit_code"] == 3
    full = output_file.read_bytes()
    assert full == seen + b"got hello\nend world\n"
    assert final["output_bytes"] == len(full)
    r = send("GET", f"{tbase}/output", token=tok, params={"offset": len(full)})
    assert r.json()["eof"] is True
    r = send("POST", f"{tbase}/input", token=tok, json={"text": "late\n"})
    assert r.status == 409
    assert r.error()["code"] == "task_not_running"

    # -- stop, and 409 with the final status on a second stop --------------------------------
    r = send(
        "POST",
        f"{base}/tasks",
        token=tok,
        json={"command": "echo sleeping; exec sleep 600", "policy": "fast", "timeout": "5m"},
    )
    assert r.status == 201
    sleeper = r.json()["task_id"]
    sbase = f"{base}/tasks/{sleeper}"
    r = send("POST", f"{sbase}/wait-for", token=tok, json={"pattern": "^sleeping$"})
    assert r.json()["matched"] is True
    r = send("POST", f"{sbase}/wait", token=tok, json={"timeout_s": 0.3})
    assert r.json()["timed_out"] is True
    assert r.json()["task"]["status"] == "running"
    r = send("POST", f"{sbase}/stop", token=tok)
    assert r.status == 200
    stopped = r.json()
    assert stopped["status"] == "killed"
    assert stopped["reason"] == "user_stopped"
    r = send("POST", f"{sbase}/stop", token=tok)
    assert r.status == 409
    err = r.error()
    assert err["code"] == "task_not_running"
    assert err["task"]["task_id"] == sleeper
    assert err["task"]["status"] == "killed"
    assert err["task"]["reason"] == "user_stopped"
    assert err["task"]["ended_at"] == stopped["ended_at"]

    # -- events and notifications -----------------------------------------------------------
    r = send("GET", f"{base}/events", token=tok)
    events = r.json()["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [(e["type"], e["task_id"]) for e in events] == [
        ("task.started", tid),
        ("task.stopped", tid),
        ("task.started", sleeper),
        ("task.stopped", sleeper),
    ]
    r = send("GET", f"{base}/notifications", token=tok, params={"format": "xml"})
    assert r.status == 200
    assert r.headers["content-type"].startswith("application/xml")
    assert int(r.headers["x-sandvisor-last-seq"]) == 4
    blocks = re.findall(r"<task-notification>.*?</task-notification>", r.text, re.S)
    assert len(blocks) == 2
    assert f"<task-id>{tid}</task-id>" in blocks[0]
    assert f"<output-file>{output_file}</output-file>" in blocks[0]
    assert "<status>failed</status>" in blocks[0]
    assert '<summary>Background command "io task" failed (exit code 3)</summary>' in blocks[0]
    assert "<reason>exit</reason><exit-code>3</exit-code>" in blocks[0]
    assert f"<task-id>{sleeper}</task-id>" in blocks[1]
    assert "<status>killed</status>" in blocks[1]
    assert "<reason>user_stopped</reason>" in blocks[1]
    r = send("GET", f"{base}/notifications", token=tok, params={"format": "json"})
    body = r.json()
    assert body["last_seq"] == 4
    assert [(n["seq"], n["task_id"], n["status"]) for n in body["notifications"]] == [
        (2, tid, "failed"),
        (4, sleeper, "killed"),
    ]
    assert body["notifications"][0]["xml"] == blocks[0]
    r = send("GET", f"{base}/notifications", token=tok, params={"format": "json", "after": 4})
    assert r.json() == {"notifications": [], "last_seq": 4, "ended": False}

    # -- end the session: running tasks stopped, containers gone, token revoked --------------
    r = send(
        "POST",
        f"{base}/tasks",
        token=tok,
        json={"command": "exec sleep 600", "policy": "fast", "persistent": True},
    )
    assert r.status == 201
    assert r.json()["persistent"] is True
    assert r.json()["timeout_ms"] is None
    r = send("DELETE", base, token=tok)
    assert r.status == 200, r.content
    assert r.json() == {
        "session_id": sid,
        "ended": True,
        "tasks_stopped": 1,
        "workspace_kept": False,
    }
    assert session_containers(sid) == []
    r = send("GET", base, token=tok)
    assert r.status == 401
    assert r.error()["code"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    r = send("GET", "/sessions", token=tok)
    assert r.status == 401
    r = send("GET", base, token=daemon.token)
    assert r.status == 404
    assert r.error()["code"] == "session_not_found"


async def test_sandvisor_client_round_trip(daemon: Daemon) -> None:
    """The project's own async client (what the CLI and MCP server use) against the daemon."""
    from supervisor.core.errors import TaskNotRunning  # noqa: PLC0415
    from supervisor.interfaces.client import SandvisorClient  # noqa: PLC0415
    from supervisor.interfaces.http_errors import Unauthorized, status_of  # noqa: PLC0415

    async with SandvisorClient(socket_path=daemon.socket, token=daemon.token) as admin:
        assert (await admin.healthz())["engine"]["ok"] is True
        created = await admin.create_session("client")
        assert [s["session_id"] for s in await admin.sessions()] == ["client"]
    async with SandvisorClient(socket_path=daemon.socket, token=created["token"]) as c:
        info = await c.start(
            "client",
            {"command": "echo ready; read x; printf 'got %s\\n' \"$x\"", "policy": "fast"},
        )
        tid = info["task_id"]
        assert (await c.find_task(tid))["session_id"] == "client"
        assert (await c.wait_for("client", tid, "^ready$", timeout_s=30))["offset"] == 0
        await c.send_input("client", tid, data=b"bytes\n", eof=True)
        final = await c.wait("client", tid, timeout_s=60)
        assert final["timed_out"] is False
        assert final["task"]["status"] == "completed"
        followed = b"".join([chunk.data async for chunk in c.follow_output("client", tid)])
        assert followed == b"ready\ngot bytes\n"
        assert await c.tail("client", tid, chars=6) == "bytes\n"
        data, offset, nxt, eof = await c.read_output("client", tid, offset=6)
        assert (data, offset, nxt, eof) == (b"got bytes\n", 6, 16, True)
        assert [t["task_id"] for t in await c.tasks("client", active=True)] == []
        with pytest.raises(TaskNotRunning) as stopped:
            await c.stop("client", tid)
        assert (status_of(stopped.value), stopped.value.code) == (409, "task_not_running")
        assert stopped.value.body["error"]["task"]["status"] == "completed"
        assert stopped.value.info.status == "completed"

        xml, last = await c.notifications("client", fmt="xml")
        assert "<status>completed</status>" in xml
        notes, last_json = await c.notifications("client", fmt="json")
        assert last == last_json == 2
        assert [n["type"] for n in notes] == ["task.stopped"]
        # Drain with acknowledgement: delivered once, then nothing pending.
        pending = await c.pending("client", "agent", fmt="json")
        assert (len(pending["notifications"]), pending["cursor"], pending["acked"]) == (1, 2, 0)
        await c.ack("client", "agent", pending["cursor"])
        again = await c.pending("client", "agent")
        assert (again["notifications"], again["acked"]) == ([], 2)
        events = await c.events("client", after=0)
        assert [e["seq"] for e in events["events"]] == [1, 2]

        ended = await c.end_session("client")
        assert ended == {
            "session_id": "client",
            "ended": True,
            "tasks_stopped": 0,
            "workspace_kept": False,
        }
        with pytest.raises(Unauthorized) as refused:
            await c.tasks("client")
        assert (status_of(refused.value), refused.value.code) == (401, "unauthorized")


async def test_a_start_can_answer_with_its_first_output(daemon: Daemon) -> None:
    """``wait_output_s``: one round trip starts the command and brings what it printed
    first; without it the answer is the task alone. A silent task answers when the wait
    runs out; one that already ended answers with ``eof``."""
    from supervisor.interfaces.client import SandvisorClient  # noqa: PLC0415

    async with SandvisorClient(socket_path=daemon.socket, token=daemon.token) as c:
        await c.create_session("first")
        spec = {"command": "echo one; sleep 60", "policy": "fast"}
        task = await c.start("first", spec, wait_output_s=30)
        assert task["output"] == {
            "offset": 0,
            "next_offset": 4,
            "eof": False,
            "text": "one\n",
            "lossy": False,
        }
        assert (task["status"], task["output_bytes"]) == ("running", 4)
        plain = await c.start("first", {"command": "true", "policy": "fast"})
        assert "output" not in plain
        t0 = time.monotonic()
        silent = await c.start("first", {"command": "sleep 60", "policy": "fast"}, wait_output_s=1)
        assert time.monotonic() - t0 >= 1.0
        assert (silent["output"]["text"], silent["output"]["eof"]) == ("", False)
        ended = await c.start("first", {"command": "exit 3", "policy": "fast"}, wait_output_s=30)
        assert (ended["exit_code"], ended["output"]["eof"], ended["output"]["text"]) == (
            3,
            True,
            "",
        )
        assert (await c.end_session("first"))["tasks_stopped"] == 2
