"""The webhook sink against a real HTTP receiver: HMAC-signed, retried with backoff, in seq
order, exactly once per event; a dead endpoint never holds a session up."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_engine
from tests.e2e.conftest import Daemon, start_daemon

pytestmark = pytest.mark.timeout(180)

SECRET = b"webhook-test-secret-\x01\x02"


@dataclass
class Receiver:
    """What the test's endpoint saw."""

    fail_first: int = 0
    delivered: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    """The X-Sandvisor-Seq of every request, accepted or not."""
    bad_signatures: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, predicate: Any, timeout: float = 60) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.delivered), timeout), self.delivered


def make_handler(rx: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            stamp = self.headers.get("X-Sandvisor-Timestamp", "")
            expected = (
                "sha256="
                + hmac.new(SECRET, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
            )
            good = hmac.compare_digest(
                self.headers.get("X-Sandvisor-Signature", ""), expected
            ) and (abs(time.time() - int(stamp or 0)) < 300)
            with rx.cond:
                rx.attempts.append(int(self.headers.get("X-Sandvisor-Seq", "-1")))
                if not good:
                    rx.bad_signatures += 1
                    status = 401
                elif rx.fail_first > 0:
                    rx.fail_first -= 1
                    status = 500
                else:
                    rx.delivered.append(json.loads(body))
                    rx.headers.append({k.lower(): v for k, v in self.headers.items()})
                    status = 204
                rx.cond.notify_all()
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    rx = Receiver(fail_first=3)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(rx))
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield rx, f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def webhook_daemon(tmp_path: Path, policies_dir: Path, url: str) -> Daemon:
    require_engine()
    secret_file = tmp_path / "webhook.secret"
    secret_file.write_bytes(SECRET + b"\n")
    secret_file.chmod(0o600)
    return start_daemon(
        tmp_path / "state",
        policies_dir,
        "--webhook",
        url,
        "--webhook-secret-file",
        str(secret_file),
    )


def stop(d: Daemon) -> None:
    rc = d.stop()
    assert rc == 0, d.log.read_text()[-3000:]


def test_webhook_retries_in_order_and_signed(
    tmp_path: Path, policies_dir: Path, receiver: tuple[Receiver, str]
) -> None:
    rx, url = receiver
    d = webhook_daemon(tmp_path, policies_dir, url)
    try:
        with d.client() as admin:
            tok = admin.post("/sessions", json={"session_id": "hooked"}).json()["token"]
            with d.client(token=tok) as c:
                base = "/sessions/hooked/tasks"
                monitor = c.post(
                    base,
                    json={
                        "command": "echo a; echo b; exit 4",
                        "kind": "monitor",
                        "policy": "fast",
                    },
                ).json()["task_id"]
                plain = c.post(base, json={"command": "echo quiet", "policy": "fast"}).json()[
                    "task_id"
                ]
                for tid in (monitor, plain):
                    final = c.post(f"{base}/{tid}/wait", json={"timeout_s": 60}).json()
                    assert final["task"]["status"] in ("completed", "failed")
                produced = c.get("/sessions/hooked/events").json()["events"]
                last = produced[-1]["seq"]
                # The first three requests got 500s; backoff must still get everything through.
                rx.wait_for(lambda got: bool(got) and got[-1]["seq"] == last)
                t0 = time.monotonic()
                assert c.delete("/sessions/hooked").status_code == 200
                end_s = time.monotonic() - t0
            rx.wait_for(lambda got: got[-1]["type"] == "session.ended")
    finally:
        stop(d)

    assert rx.bad_signatures == 0
    got = rx.delivered
    assert got[:-1] == produced
    assert got[-1]["type"] == "session.ended"
    assert got[-1]["session_id"] == "hooked"
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    types = [e["type"] for e in got]
    assert types.count("task.started") == 2
    assert types.count("task.stopped") == 2
    assert "task.output" in types
    # Retries: the first event was tried four times (3 x 500, then 204); nothing else twice.
    assert rx.attempts[:4] == [1, 1, 1, 1]
    assert rx.attempts[4:] == list(range(2, len(got) + 1))
    for event, headers in zip(got, rx.headers, strict=True):
        assert headers["content-type"] == "application/json"
        assert headers["x-sandvisor-event"] == event["type"]
        assert headers["x-sandvisor-seq"] == str(event["seq"])
        assert headers["x-sandvisor-session"] == "hooked"
    assert end_s < 10


def _dead_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("kind", ["refused", "black-hole"])
def test_dead_webhook_never_blocks_the_session(
    tmp_path: Path, policies_dir: Path, kind: str
) -> None:
    hole: socket.socket | None = None
    if kind == "refused":
        port = _dead_port()
    else:
        # Accepts connections (the kernel's backlog) and never answers a byte.
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        port = hole.getsockname()[1]
    d = webhook_daemon(tmp_path, policies_dir, f"http://127.0.0.1:{port}/hook")
    try:
        with d.client() as admin:
            tok = admin.post("/sessions", json={"session_id": "deaf"}).json()["token"]
            with d.client(token=tok) as c:
                base = "/sessions/deaf/tasks"
                t0 = time.monotonic()
                done = c.post(base, json={"command": "echo hi", "policy": "fast"}).json()
                final = c.post(f"{base}/{done['task_id']}/wait", json={"timeout_s": 60}).json()
                assert final["timed_out"] is False
                assert final["task"]["status"] == "completed"
                assert time.monotonic() - t0 < 15
                # Events are still served to API readers while the webhook is stuck.
                events = c.get("/sessions/deaf/events").json()["events"]
                assert [e["type"] for e in events] == ["task.started", "task.stopped"]
                c.post(base, json={"command": "exec sleep 600", "policy": "fast"})
                t0 = time.monotonic()
                r = c.delete("/sessions/deaf")
                ended_in = time.monotonic() - t0
                assert r.status_code == 200
                assert r.json()["tasks_stopped"] == 1
            # Bounded by the sink close timeout (5 s) plus the task's 1 s grace.
            assert ended_in < 10, ended_in
            assert admin.get("/healthz").json()["running_tasks"] == 0
            assert admin.get("/sessions").json() == []
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=str(d.socket)), base_url="http://sandvisor"
            ) as anon:
                assert anon.get("/healthz").status_code == 200
        t0 = time.monotonic()
    finally:
        stop(d)
        if hole is not None:
            hole.close()
    assert time.monotonic() - t0 < 30
