"""``sandvisor top`` against a real daemon: the ``--json`` snapshot (admin: every session; a
session token: its own), the table when piped, and the live view in a pseudo-terminal,
showing a task as it starts and ends, and quitting on ``q`` and on Ctrl-C."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import SANDVISOR, Daemon

pytestmark = pytest.mark.timeout(120)


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout.decode()


def start(daemon: Daemon, sid: str, command: str, **spec: Any) -> str:
    with daemon.client() as c:
        r = c.post(f"/sessions/{sid}/tasks", json={"command": command, "policy": "fast", **spec})
        assert r.status_code == 201, r.text
        task_id: str = r.json()["task_id"]
        return task_id


def open_session(daemon: Daemon, sid: str) -> str:
    with daemon.client() as c:
        r = c.post("/sessions", json={"session_id": sid})
        assert r.status_code == 201, r.text
        token: str = r.json()["token"]
        return token


def wait_end(daemon: Daemon, sid: str, tid: str) -> None:
    with daemon.client() as c:
        r = c.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 60})
        assert not r.json()["timed_out"], r.text


def test_json_snapshot_admin_and_session_token(daemon: Daemon) -> None:
    token_a = open_session(daemon, "alpha")
    open_session(daemon, "bravo")
    done = start(daemon, "alpha", "echo hi", description="says hi")
    wait_end(daemon, "alpha", done)
    running = start(daemon, "alpha", "exec sleep 60", persistent=True)
    other = start(daemon, "bravo", "exec sleep 60", kind="monitor")

    snap = json.loads(ok(daemon.sandvisor("top", "--json")))
    assert set(snap) == {"taken_at", "sessions", "tasks"}
    assert abs(snap["taken_at"] - time.time()) < 60
    assert {s["session_id"] for s in snap["sessions"]} == {"alpha", "bravo"}
    ids = [t["task_id"] for t in snap["tasks"]]
    assert set(ids) == {done, running, other}
    # Tasks still running come first (newest first), ended ones after.
    assert ids[-1] == done
    alpha = next(s for s in snap["sessions"] if s["session_id"] == "alpha")
    assert alpha["states"].get("completed") == 1
    assert sum(alpha["states"].values()) == 2

    active = json.loads(ok(daemon.sandvisor("top", "--json", "--active")))
    assert {t["task_id"] for t in active["tasks"]} == {running, other}
    only = json.loads(ok(daemon.sandvisor("top", "--json", "--session", "bravo")))
    assert [t["task_id"] for t in only["tasks"]] == [other]

    # A session's token sees its own session only, without being told which.
    env = {**daemon.env, "SANDVISOR_TOKEN": token_a}
    mine = subprocess.run(
        [*SANDVISOR, "top", "--json"], env=env, capture_output=True, timeout=60, check=False
    )
    view = json.loads(ok(mine))
    assert [s["session_id"] for s in view["sessions"]] == ["alpha"]
    assert {t["task_id"] for t in view["tasks"]} == {done, running}
    refused = subprocess.run(
        [*SANDVISOR, "top", "--json", "--session", "bravo"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert b"Traceback" not in refused.stderr

    # Piped without --json: the table once, tab-separated, no header.
    rows = [line.split("\t") for line in ok(daemon.sandvisor("top")).splitlines()]
    by_id = {r[0]: r for r in rows}
    assert set(by_id) == {done, running, other}
    assert by_id[done][2:4] == ["completed", "exit 0"]
    assert by_id[done][-1] == "says hi"
    assert by_id[running][7] == "persistent"
    assert by_id[other][7] == "monitor"


class Pty:
    """``sandvisor top`` on a pseudo-terminal of 120x30, its screen read as it comes."""

    def __init__(self, daemon: Daemon, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        self.proc = subprocess.Popen(
            [*SANDVISOR, "top", *args],
            env={**daemon.env, "TERM": "xterm"},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,  # the pty becomes its controlling terminal
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # noqa: PLW1509
        )
        os.close(slave)
        self.seen = b""

    def read_until(self, marker: bytes, timeout: float = 30) -> bytes:
        """Everything shown since the last call, up to and including ``marker``."""
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} on screen within {timeout} s: {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the program exited and closed the terminal
                    chunk = b""
                assert chunk, f"top exited before {marker!r}: {self.seen[-2000:]!r}"
                self.seen += chunk
        cut = self.seen.index(marker) + len(marker)
        shown, self.seen = self.seen[:cut], self.seen[cut:]
        return shown

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        # Drain what it wrote on its way out (the terminal restored).
        while select.select([self.master], [], [], 0.2)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


@pytest.fixture
def top_pty(daemon: Daemon) -> Iterator[Pty]:
    term = Pty(daemon, "--interval", "200ms")
    try:
        yield term
    finally:
        term.close()


def test_live_view_shows_a_task_and_quits_on_q(daemon: Daemon, top_pty: Pty) -> None:
    open_session(daemon, "live")
    first = top_pty.read_until(b"sandvisor top")
    assert b"\x1b[?1049h" in first  # the alternate screen
    tid = start(daemon, "live", "read x; echo got $x", description="asks for x", stall_after="1s")
    shown = top_pty.read_until(tid.encode())
    assert b"TASK" in shown
    line = top_pty.read_until(b"\n")
    assert b"asks for x" in line, line
    # The stall shows as the "input" flag and in the summary.
    top_pty.read_until(b"1 waiting for input")
    with daemon.client() as c:
        r = c.post(f"/sessions/live/tasks/{tid}/input", json={"text": "yes\n"})
        assert r.status_code == 204, r.text
    top_pty.read_until(b"completed")
    # "a" hides ended tasks.
    top_pty.send(b"a")
    top_pty.read_until(b"no tasks running")
    top_pty.send(b"q")
    assert top_pty.wait() == 0
    # The terminal is given back: the normal screen and the cursor.
    assert b"\x1b[?1049l" in top_pty.seen
    assert b"\x1b[?25h" in top_pty.seen
    assert b"Traceback" not in top_pty.seen


def test_live_view_quits_on_ctrl_c(daemon: Daemon, top_pty: Pty) -> None:
    top_pty.read_until(b"sandvisor top")
    top_pty.read_until(b"no tasks")
    top_pty.send(b"\x03")  # the terminal turns it into SIGINT
    assert top_pty.wait() == 0
    assert b"\x1b[?1049l" in top_pty.seen
    assert b"Traceback" not in top_pty.seen


def test_live_view_survives_the_daemon_going_away(daemon: Daemon, top_pty: Pty) -> None:
    open_session(daemon, "gone")
    tid = start(daemon, "gone", "exec sleep 60", persistent=True)
    top_pty.read_until(tid.encode())
    top_pty.read_until(b"1 running")
    daemon.proc.terminate()
    daemon.proc.wait(timeout=60)
    # The last table stays up with the error; it keeps retrying, and q still quits.
    top_pty.read_until(b"error: retrying every 0.2s \xc2\xb7 ")
    top_pty.read_until(tid.encode())
    top_pty.send(b"q")
    assert top_pty.wait() == 0
    assert b"Traceback" not in top_pty.seen
