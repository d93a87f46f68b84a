"""Server-sent events and long-polling: resume with Last-Event-ID after a disconnect and get
every later event exactly once, in order, through ``session.ended``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon

pytestmark = pytest.mark.timeout(180)

#: A monitor task that prints in three phases, each gated by a line on stdin, so the test
#: decides when events happen without sleeping: ticks 10-29 trickle out at 10 per second.
GATED = (
    'i=0; while [ $i -lt 10 ]; do echo "tick $i"; i=$((i+1)); done; read go; '
    'while [ $i -lt 20 ]; do echo "tick $i"; i=$((i+1)); sleep 0.1; done; read go; '
    'while [ $i -lt 30 ]; do echo "tick $i"; i=$((i+1)); sleep 0.1; done'
)


@dataclass(frozen=True)
class Sse:
    """One complete server-sent event."""

    id: int
    event: str
    data: dict[str, Any]


def sse_events(lines: Iterator[str], comments: list[str] | None = None) -> Iterator[Sse]:
    """Parse the stream; only events terminated by a blank line are yielded."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if fields:
                yield Sse(int(fields["id"]), fields["event"], json.loads(fields["data"]))
                fields = {}
            continue
        if line.startswith(":"):
            if comments is not None:
                comments.append(line)
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


def open_session(daemon: Daemon, sid: str) -> str:
    with daemon.client() as admin:
        r = admin.post("/sessions", json={"session_id": sid})
        assert r.status_code == 201, r.text
        token: str = r.json()["token"]
        return token


def ticks(events: list[Sse]) -> str:
    """The monitor task's stdout rebuilt from its task.output events."""
    out = [e.data for e in events if e.event == "task.output"]
    return "".join(d["text"] + ("\n" if d["eol"] else "") for d in out)


def test_sse_resume_with_last_event_id(daemon: Daemon) -> None:
    sid = "sse"
    tok = open_session(daemon, sid)
    api = daemon.client(token=tok)
    stream_client = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(daemon.socket)),
        base_url="http://sandvisor",
        headers={"Authorization": f"Bearer {tok}"},
        timeout=httpx.Timeout(60, read=60),
    )
    url = f"/sessions/{sid}/events/stream"

    # -- first connection: read until the task trickles out tick 10+, then drop it ----------
    first: list[Sse] = []
    comments: list[str] = []
    with stream_client.stream("GET", url) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-store"
        lines = resp.iter_lines()
        assert next(lines) == ": connected"
        r = api.post(
            f"/sessions/{sid}/tasks",
            json={"command": GATED, "kind": "monitor", "policy": "fast", "description": "ticker"},
        )
        assert r.status_code == 201, r.text
        tid = r.json()["task_id"]
        released = False
        for ev in sse_events(lines, comments):
            first.append(ev)
            text = ticks(first)
            if "tick 9\n" in text and not released:
                # Everything before the gate has arrived; let phase two start.
                assert (
                    api.post(
                        f"/sessions/{sid}/tasks/{tid}/input", json={"text": "go\n"}
                    ).status_code
                    == 204
                )
                released = True
            if "tick 10\n" in text:
                break  # disconnect mid-stream: ticks 11-19 are still being printed
    assert "tick 19" not in ticks(first)
    last_id = first[-1].id
    assert [e.id for e in first] == list(range(1, last_id + 1))
    assert api.get(f"/sessions/{sid}/tasks/{tid}").json()["status"] == "running"

    # -- while disconnected the task goes on: wait (long-poll) until tick 19 is logged -------
    cursor = last_id
    missed: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while "tick 19" not in ticks(first) + "".join(e.get("text", "") for e in missed):
        assert time.monotonic() < deadline, missed
        body = api.get(f"/sessions/{sid}/events", params={"after": cursor, "wait_s": 10}).json()
        missed += body["events"]
        cursor = body["last_seq"]
    assert missed, "no events were produced while the client was away"

    # -- reconnect with Last-Event-ID in a reader thread; it must see the backlog, then live --
    second: list[Sse] = []
    backlog_done = threading.Event()
    reader_error: list[BaseException] = []

    def read_second() -> None:
        try:
            with stream_client.stream("GET", url, headers={"Last-Event-ID": str(last_id)}) as r2:
                assert r2.status_code == 200
                for ev in sse_events(r2.iter_lines()):
                    second.append(ev)
                    if ev.id >= cursor:
                        backlog_done.set()
        except BaseException as exc:  # surfaced in the main thread
            reader_error.append(exc)
        finally:
            backlog_done.set()

    reader = threading.Thread(target=read_second, name="sse-reader")
    reader.start()
    assert backlog_done.wait(60), "the backlog was not replayed"
    assert not reader_error, reader_error
    # Phase three happens live on the second connection.
    assert api.post(f"/sessions/{sid}/tasks/{tid}/input", json={"text": "go\n"}).status_code == 204
    final = api.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 60}).json()
    assert final["task"]["status"] == "completed"
    with daemon.client() as admin:
        assert admin.delete(f"/sessions/{sid}").status_code == 200
    reader.join(30)
    assert not reader.is_alive(), "the stream did not end after session.ended"
    assert not reader_error, reader_error

    # -- exactly once, in order, no gaps, through session.ended ---------------------------
    assert second, "nothing after Last-Event-ID"
    assert [e.id for e in second] == list(range(last_id + 1, second[-1].id + 1))
    everything = first + second
    assert [e.id for e in everything] == list(range(1, len(everything) + 1))
    for ev in everything:
        assert ev.data["seq"] == ev.id
        assert ev.data["type"] == ev.event
        assert ev.data["session_id"] == sid
    assert [e.data for e in second[: len(missed)]] == missed
    assert everything[0].event == "task.started"
    assert [e.event for e in everything[-2:]] == ["task.stopped", "session.ended"]
    assert everything[-2].data["reason"] == "exit"
    assert everything[-2].data["exit_code"] == 0
    assert everything[-1].data["tasks_stopped"] == 0
    assert ticks(everything) == "".join(f"tick {i}\n" for i in range(30))
    ordinals = [e.data["ordinal"] for e in everything if e.event == "task.output"]
    sizes = [e.data["lines"] for e in everything if e.event == "task.output"]
    assert ordinals == [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert not any(e.event in ("events.gap", "task.output_suppressed") for e in everything)

    # Ended session: its token is revoked, so the stream cannot be reopened.
    assert stream_client.get(url).status_code == 401
    api.close()
    stream_client.close()


def test_sse_after_parameter_and_header(daemon: Daemon) -> None:
    sid = "sse-after"
    tok = open_session(daemon, sid)
    with daemon.client(token=tok) as api:
        tid = api.post(
            f"/sessions/{sid}/tasks", json={"command": "echo one", "policy": "fast"}
        ).json()["task_id"]
        api.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 60})
        logged = api.get(f"/sessions/{sid}/events").json()["events"]
        assert [e["type"] for e in logged] == ["task.started", "task.stopped"]

        def first_event(**kwargs: Any) -> Sse:
            with api.stream("GET", f"/sessions/{sid}/events/stream", **kwargs) as resp:
                assert resp.status_code == 200
                return next(sse_events(resp.iter_lines()))

        assert first_event().data == logged[0]
        assert first_event(params={"after": 1}).data == logged[1]
        # The header wins over the query (a browser's EventSource resends only the header).
        assert first_event(params={"after": 0}, headers={"Last-Event-ID": "1"}).data == logged[1]
        r = api.get(f"/sessions/{sid}/events/stream", headers={"Last-Event-ID": "abc"})
        assert r.status_code == 422
        assert r.json()["error"]["code"] == "invalid_request"
        assert api.delete(f"/sessions/{sid}").status_code == 200


def test_long_poll_returns_when_an_event_arrives(daemon: Daemon) -> None:
    sid = "poll"
    tok = open_session(daemon, sid)
    with daemon.client(token=tok) as api:
        r = api.post(
            f"/sessions/{sid}/tasks",
            # The delay is inside the container: the second poll is pending when it prints.
            json={"command": "sleep 2; echo late", "kind": "monitor", "policy": "fast"},
        )
        assert r.status_code == 201
        tid = r.json()["task_id"]
        body = api.get(f"/sessions/{sid}/events", params={"after": 0, "wait_s": 30}).json()
        assert [e["type"] for e in body["events"]] == ["task.started"]
        started = body["last_seq"]
        assert started == 1

        t0 = time.monotonic()
        body = api.get(f"/sessions/{sid}/events", params={"after": started, "wait_s": 60}).json()
        answered_at = time.time()
        assert time.monotonic() - t0 < 30
        ev = body["events"][0]
        assert (ev["seq"], ev["type"], ev["text"]) == (2, "task.output", "late")
        # Prompt: the answer left right after the event was logged, not when wait_s ran out.
        assert answered_at - ev["ts"] < 3.0
        assert body["ended"] is False

        # Notifications long-poll the same way; the terminal event follows the output.
        notes = api.get(
            f"/sessions/{sid}/notifications",
            params={"after": body["last_seq"], "wait_s": 60, "format": "json"},
        ).json()
        assert [n["type"] for n in notes["notifications"]] == ["task.stopped"]
        assert notes["notifications"][0]["task_id"] == tid
        last = notes["last_seq"]

        # Nothing more comes: the poll answers empty once wait_s is over.
        t0 = time.monotonic()
        body = api.get(f"/sessions/{sid}/events", params={"after": last, "wait_s": 0.5}).json()
        elapsed = time.monotonic() - t0
        assert body == {"events": [], "last_seq": last, "ended": False}
        assert 0.45 <= elapsed < 5

        with daemon.client() as admin:
            assert admin.delete(f"/sessions/{sid}").status_code == 200
