"""The routes over all of a caller's sessions (what the dashboard reads): ``GET /tasks`` and
the merged ``/events/stream`` with ``task.created``, for the admin and for a session token,
and the ``task_id``/``types`` filters of a session's events."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_sse import open_session

pytestmark = pytest.mark.timeout(120)


def _messages(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of each complete server-sent event."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "event" in fields:
                yield fields["event"], json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


class Follower:
    """Reads a merged stream on a thread into a queue."""

    def __init__(self, daemon: Daemon, token: str, params: str) -> None:
        self.items: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.ready = threading.Event()
        self.client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(daemon.socket)),
            base_url="http://sandvisor",
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(60, read=None),
        )
        self.thread = threading.Thread(target=self._run, args=(params,), daemon=True)
        self.thread.start()
        assert self.ready.wait(30)

    def _run(self, params: str) -> None:
        try:
            with self.client.stream("GET", f"/events/stream?{params}") as r:
                assert r.status_code == 200
                self.ready.set()
                for item in _messages(r.iter_lines()):
                    self.items.put(item)
        except httpx.HTTPError:
            return  # closed at the end of the test

    def until(self, name: str, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Everything received up to event ``name`` of ``task_id``."""
        seen = []
        while True:
            item = self.items.get(timeout=30)
            seen.append(item)
            if item[0] == name and item[1].get("task_id") == task_id:
                return seen

    def close(self) -> None:
        self.client.close()


def test_merged_stream_and_all_tasks(daemon: Daemon) -> None:
    tok_a = open_session(daemon, "fa")
    open_session(daemon, "fb")
    admin = Follower(daemon, daemon.token, "types=task.started&types=task.stopped")
    own = Follower(daemon, tok_a, "")
    try:
        with daemon.client() as c:
            a = c.post("/sessions/fa/tasks", json={"command": "echo a", "policy": "fast"}).json()
            b = c.post("/sessions/fb/tasks", json={"command": "echo b", "policy": "fast"}).json()
        got = admin.until("task.stopped", b["task_id"])
        created = [d["task_id"] for n, d in got if n == "task.created"]
        assert b["task_id"] in created and created.index(b["task_id"]) == len(created) - 1
        names = {n for n, _ in got}
        assert names <= {"task.created", "task.started", "task.stopped"}, names
        # The session token's stream carries its own session only, all types.
        mine = own.until("task.stopped", a["task_id"])
        assert {d["session_id"] for _, d in mine} == {"fa"}
        assert ("task.created", a["task_id"]) in [(n, d["task_id"]) for n, d in mine]
        with daemon.client() as c:
            assert {t["session_id"] for t in c.get("/tasks").json()} == {"fa", "fb"}
            assert c.get("/tasks", params={"active": "true"}).json() == []
            only_b = c.get(
                "/sessions/fb/events",
                params={"task_id": b["task_id"], "types": ["task.stopped"]},
            ).json()
            assert [e["type"] for e in only_b["events"]] == ["task.stopped"]
            assert only_b["last_seq"] >= 2  # the cursor moved past the others
            bad = c.get("/sessions/fb/events", params={"task_id": "not a task"})
            assert bad.status_code == 422
        with daemon.client(tok_a) as c:
            assert {t["session_id"] for t in c.get("/tasks").json()} == {"fa"}
            assert c.post("/ui/logins", json={}).status_code == 404  # no --ui: no dashboard
    finally:
        admin.close()
        own.close()
