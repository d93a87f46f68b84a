"""``sandvisor run`` in the foreground on a real terminal (a pty): Ctrl-Z detaches and the task
runs on, Ctrl-C stops it. And the warm pool as ``sandvisor ps --all`` and ``/healthz`` count it."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

from supervisor.core.labels import LABEL_SESSION
from supervisor.runtime.ownership import LOCK_NAME
from tests.e2e.conftest import SANDVISOR, Daemon
from tests.e2e.test_cli import cli, ok

__all__ = ["cli"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(180)

_DETACHED = re.compile(rb"sandvisor: detached; task (bg-[0-9a-f]+) keeps running in session (\S+)")


@dataclass
class Terminal:
    """``sandvisor`` with a pty as its controlling terminal: keys typed there become signals to it,
    as in an interactive shell (the line discipline turns ^Z into SIGTSTP, ^C into SIGINT)."""

    proc: subprocess.Popen[bytes]
    master: int
    screen: bytes = field(default=b"")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def read_until(self, marker: bytes, timeout: float = 30) -> bytes:
        """What the terminal shows, read until ``marker`` appears on it (bounded)."""
        deadline = time.monotonic() + timeout
        while marker not in self.screen:
            left = deadline - time.monotonic()
            assert left > 0, (marker, self.screen)
            readable, _, _ = select.select([self.master], [], [], left)
            if readable:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the process closed the terminal (it exited)
                    chunk = b""
                assert chunk, (marker, self.screen)
                self.screen += chunk
        return self.screen

    def exit_code(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)


@contextmanager
def terminal(d: Daemon, *args: str) -> Iterator[Terminal]:
    master, slave = os.openpty()
    # setsid --ctty: a session of its own with the pty as controlling terminal, so that sandvisor
    # is its foreground process group (then exec: same pid).
    proc = subprocess.Popen(
        ["setsid", "--ctty", *SANDVISOR, *args],
        env=d.env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    try:
        yield Terminal(proc, master)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def task_of(d: Daemon, tid: str) -> dict[str, object]:
    [task] = [t for t in json.loads(ok(d.sandvisor("ps", "--json"))) if t["task_id"] == tid]
    return dict(task)


def test_ctrl_z_detaches_and_the_task_runs_on(cli: Daemon) -> None:
    with terminal(
        cli, "run", "--policy", "fast", "--", "echo started; read line; echo got $line"
    ) as term:
        term.read_until(b"started")
        term.type(b"\x1a")  # Ctrl-Z
        screen = term.read_until(b"stop: sandvisor stop")
        assert term.exit_code() == 0, screen
    match = _DETACHED.search(screen)
    assert match, screen
    tid = match.group(1).decode()
    assert f"follow: sandvisor logs -f {tid}".encode() in screen
    assert f"wait: sandvisor wait --timeout 1h {tid}".encode() in screen
    assert f"input: sandvisor input {tid} TEXT".encode() in screen  # its stdin is a pipe
    assert b"stopping task" not in screen

    # Still running, and still reading: input sent from elsewhere reaches it.
    assert task_of(cli, tid)["status"] == "running"
    ok(cli.sandvisor("input", tid, "hello"))
    assert ok(cli.sandvisor("wait", "--timeout", "30s", tid)) == f"{tid} completed, exit code 0\n"
    assert ok(cli.sandvisor("logs", tid)) == "started\ngot hello\n"


def test_ctrl_c_on_the_terminal_stops_the_task(cli: Daemon) -> None:
    with terminal(cli, "run", "--policy", "fast", "--", "echo started; sleep 60") as term:
        term.read_until(b"started")
        term.type(b"\x03")  # Ctrl-C
        screen = term.read_until(b"stopping task")
        assert term.exit_code() == 130, screen
    assert b"detached" not in screen
    [task] = json.loads(ok(cli.sandvisor("ps", "--json")))
    assert (task["status"], task["reason"]) == ("killed", "user_stopped")


def shared_pool_containers(state: Path) -> int:
    """The daemon's containers that belong to no session: its shared warm pool."""
    lock = str(state.resolve() / LOCK_NAME)
    client = docker.APIClient(version="auto", timeout=10)
    try:
        rows = client.containers(filters={"label": f"io.sandvisor.owner.lock={lock}"})
    finally:
        client.close()
    return sum(1 for r in rows if r["Labels"].get(LABEL_SESSION) == "")


def test_the_warm_pool_is_counted_in_healthz_and_ps_all(cli: Daemon) -> None:
    deadline = time.monotonic() + 60
    with cli.client() as admin:  # the details are the admin's (anyone else: liveness)
        # The shipped default policy keeps 2 ready (warm_pool = 2); the daemon fills it as
        # it starts, in the background: wait until it is full.
        while (pool := admin.get("/healthz").json()["pool"])["containers"] < 2:
            assert time.monotonic() < deadline, pool
            time.sleep(0.2)
    assert pool == {"containers": 2, "ready": {"default": 2}}
    assert shared_pool_containers(cli.state_dir) == 2

    rows = [line.split("\t") for line in ok(cli.sandvisor("ps", "--all")).splitlines()]
    assert ["pool", "-", "pool", "2 ready", "-", "warm containers of policy default"] in rows
    # Without --all: tasks only (there are none).
    assert ok(cli.sandvisor("ps")) == ""
    assert all(
        t["task_id"] != "pool" for t in json.loads(ok(cli.sandvisor("ps", "--all", "--json")))
    )
