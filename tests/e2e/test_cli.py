"""The ``sandvisor`` CLI as a client of a real daemon: run (foreground and background), ps, logs,
stop, input, wait, events, session; errors and help; starting a daemon when none runs."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import require_engine
from tests.e2e.conftest import REPO, SANDVISOR, Daemon

pytestmark = pytest.mark.timeout(180)

TASK_ID = re.compile(r"^bg-[0-9a-f]{8}$")


def _owned_containers(state_dir: Path) -> list[str]:
    """Names of containers (running or not) whose owner is the daemon of ``state_dir``."""
    client = docker.APIClient(version="auto", timeout=10)
    lock = str(state_dir.resolve() / "supervisor.lock")
    rows = client.containers(all=True, filters={"label": f"io.sandvisor.owner.lock={lock}"})
    return [r["Names"][0] for r in rows]


@pytest.fixture
def cli(daemon: Daemon) -> Iterator[Daemon]:
    """The fixture daemon; after the test it is stopped and must have left no container."""
    yield daemon
    daemon.stop()
    assert _owned_containers(daemon.state_dir) == []


def sandvisor(
    d: Daemon, *args: str, input: bytes = b"", timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """The CLI with an empty stdin (a foreground run forwards stdin to its task)."""
    return d.sandvisor(*args, input=input, timeout=timeout)


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout.decode()


def start_bg(d: Daemon, command: str, *extra: str) -> str:
    out = ok(sandvisor(d, "run", "--bg", "--policy", "fast", *extra, "--", command))
    lines = out.splitlines()
    assert len(lines) == 2, out  # piped: the id and the output path, nothing else
    assert TASK_ID.match(lines[0]), out
    assert lines[1].endswith(f"/tasks/{lines[0]}.output"), out
    return lines[0]


def popen(d: Daemon, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*SANDVISOR, *args],
        env=d.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def read_until(proc: subprocess.Popen[bytes], marker: bytes, timeout: float = 30) -> bytes:
    """Read the process's stdout until ``marker`` appears (bounded)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} within {timeout} s: {seen!r}"
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        assert chunk, f"stdout closed before {marker!r}: {seen!r}"
        seen += chunk
    os.set_blocking(fd, True)
    return seen


def blocks(xml: str) -> list[str]:
    return [b + "</task-notification>" for b in xml.split("</task-notification>")[:-1]]


# -- the round trip -----------------------------------------------------------------------


def test_round_trip_bg_ps_logs_stop_events(cli: Daemon) -> None:
    tid = start_bg(cli, "echo ready; i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done")

    tasks = json.loads(ok(sandvisor(cli, "ps", "--json")))
    [mine] = [t for t in tasks if t["task_id"] == tid]
    assert mine["session_id"] == "default"
    assert mine["policy"] == "fast"
    assert mine["status"] in ("starting", "running")

    assert (
        ok(sandvisor(cli, "wait", "--pattern", "^tick 2$", "--timeout", "30s", tid)) == "tick 2\n"
    )
    follower = popen(cli, "logs", "-f", tid)
    try:
        read_until(follower, b"tick 3\n")
        stopped = ok(sandvisor(cli, "stop", tid))
        assert stopped.strip() == f"{tid} killed, user stopped"
        _, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    # -f ended by itself once the task had ended.

    xml = ok(sandvisor(cli, "events", "--format", "xml"))
    [note] = [b for b in blocks(xml) if f"<task-id>{tid}</task-id>" in b]
    assert "<status>killed</status>" in note
    assert "<reason>user_stopped</reason>" in note

    lines = [json.loads(line) for line in ok(sandvisor(cli, "events")).splitlines()]
    types = [e["type"] for e in lines if e["task_id"] == tid]
    assert types[0] == "task.started" and types[-1] == "task.stopped"
    seqs = [e["seq"] for e in lines]
    assert seqs == sorted(seqs)
    later = ok(sandvisor(cli, "events", "--since", str(seqs[-1])))
    assert later == ""

    again = sandvisor(cli, "stop", tid)
    assert again.returncode == 1
    assert b"already ended (killed, user stopped)" in again.stderr
    assert b"Traceback" not in again.stderr


def test_logs_follow_prints_everything_then_exits(cli: Daemon) -> None:
    tid = start_bg(cli, "for i in 1 2 3; do echo part$i; sleep 0.3; done")
    out = ok(sandvisor(cli, "logs", "-f", tid, timeout=60))
    assert out == "part1\npart2\npart3\n"
    # Without -f a finished task prints the same and returns.
    assert ok(sandvisor(cli, "logs", tid)) == out


# -- foreground ---------------------------------------------------------------------------


def test_foreground_streams_output_and_exits_with_the_exit_code(cli: Daemon) -> None:
    result = sandvisor(
        cli, "run", "--no-workspace", "--policy", "fast", "--", "sh", "-c", "echo out; exit 3"
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == b"out\n"
    assert result.stderr == b""


def test_foreground_timeout_exits_124(cli: Daemon) -> None:
    started = time.monotonic()
    result = sandvisor(cli, "run", "--policy", "fast", "--timeout", "1s", "--", "sleep", "10")
    assert result.returncode == 124, result.stderr
    assert b"was killed: it reached its timeout (1s)" in result.stderr
    assert time.monotonic() - started < 9


def test_foreground_forwards_stdin(cli: Daemon) -> None:
    result = sandvisor(cli, "run", "--policy", "fast", "--", "tr a-z A-Z", input=b"hello\nworld\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"HELLO\nWORLD\n"


def test_foreground_start_failure_exits_125(cli: Daemon) -> None:
    result = sandvisor(cli, "run", "--policy", "missingimage", "--", "true")
    assert result.returncode == 125
    assert b"failed to start" in result.stderr and b"not present" in result.stderr
    unknown = sandvisor(cli, "run", "--policy", "no-such-policy", "--", "true")
    assert unknown.returncode == 125
    assert b"unknown policy 'no-such-policy'" in unknown.stderr
    assert b"Traceback" not in result.stderr + unknown.stderr


def test_ctrl_c_stops_the_foreground_task(cli: Daemon) -> None:
    proc = popen(cli, "run", "--policy", "fast", "--", "echo started; sleep 60")
    try:
        read_until(proc, b"started\n")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"stopping task" in err
    [task] = json.loads(ok(sandvisor(cli, "ps", "--json")))
    assert task["status"] == "killed"
    assert task["reason"] == "user_stopped"


# -- wait, input, logs --tail ---------------------------------------------------------------


def test_wait_pattern(cli: Daemon) -> None:
    tid = start_bg(cli, "echo booting; sleep 0.5; echo 'listening on 8080'; sleep 60")
    found = sandvisor(cli, "wait", "--pattern", "listening on [0-9]+", "--timeout", "30s", tid)
    assert ok(found) == "listening on 8080\n"
    as_json = json.loads(ok(sandvisor(cli, "wait", "--json", "--pattern", "booting", tid)))
    assert as_json["matched"] is True and as_json["line"] == "booting"

    missing = sandvisor(cli, "wait", "--pattern", "never printed", "--timeout", "500ms", tid)
    assert missing.returncode == 1
    assert b"within 0.5s" in missing.stderr

    still = sandvisor(cli, "wait", "--timeout", "500ms", tid)
    assert still.returncode == 1
    assert b"still running" in still.stderr
    ok(sandvisor(cli, "stop", tid))

    done = start_bg(cli, "echo only this")
    assert ok(sandvisor(cli, "wait", done)) == f"{done} completed, exit code 0\n"
    ended = sandvisor(cli, "wait", "--pattern", "something else", done)
    assert ended.returncode == 2
    assert b"without printing a line matching" in ended.stderr


def test_input_reaches_the_task(cli: Daemon) -> None:
    tid = start_bg(cli, "read x; echo got:$x")
    assert ok(sandvisor(cli, "input", tid, "hello")) == ""
    assert ok(sandvisor(cli, "wait", tid)).endswith("completed, exit code 0\n")
    assert ok(sandvisor(cli, "logs", tid)) == "got:hello\n"

    raw = start_bg(cli, "cat")
    ok(sandvisor(cli, "input", "--eof", raw, "-", input=b"bytes \xff\x00 as they are"))
    ok(sandvisor(cli, "wait", raw))
    out = sandvisor(cli, "logs", raw)
    assert out.stdout == b"bytes \xff\x00 as they are"

    closed = sandvisor(cli, "input", raw, "too late")
    assert closed.returncode == 1
    assert b"has ended" in closed.stderr


def test_logs_tail(cli: Daemon) -> None:
    tid = start_bg(cli, "for i in 1 2 3 4 5; do echo line$i; done")
    ok(sandvisor(cli, "wait", tid))
    assert ok(sandvisor(cli, "logs", "--tail", "2", tid)) == "line4\nline5\n"
    assert ok(sandvisor(cli, "logs", "--tail", "0", tid)) == ""
    assert ok(sandvisor(cli, "logs", "--tail", "99", tid)) == "".join(
        f"line{i}\n" for i in range(1, 6)
    )
    body = json.loads(ok(sandvisor(cli, "logs", "--json", "--tail", "1", tid)))
    assert body["text"] == "line5\n" and body["eof"] is True and body["lossy"] is False

    # Longer than the first read-back step (64 KiB): the tail reads further back.
    big = start_bg(cli, "i=0; while [ $i -lt 3000 ]; do printf '%050d\\n' $i; i=$((i+1)); done")
    ok(sandvisor(cli, "wait", big))
    last = ok(sandvisor(cli, "logs", "--tail", "2000", big)).splitlines()
    assert len(last) == 2000
    assert last[0] == f"{1000:050d}" and last[-1] == f"{2999:050d}"


# -- listing and sessions -------------------------------------------------------------------


def test_ps_piped_is_plain(cli: Daemon) -> None:
    tid = start_bg(cli, "sleep 60", "--description", "two\twords\nand lines")
    out = ok(sandvisor(cli, "ps"))
    lines = out.splitlines()
    assert len(lines) == 1  # no header, no rule, no decoration
    fields = lines[0].split("\t")
    assert fields[:2] == [tid, "default"]
    assert fields[2] in ("starting", "running")
    assert fields[-1] == "two words and lines"
    assert len(fields) == 6
    assert ok(sandvisor(cli, "ps", "--session", "nobody-used-this")) == ""
    ok(sandvisor(cli, "stop", tid))
    assert ok(sandvisor(cli, "ps", "--active")) == ""


def test_sessions_and_following_events_until_the_session_ends(cli: Daemon) -> None:
    follower = popen(cli, "events", "-f", "--session", "s2")
    try:
        tid = start_bg(cli, "echo one; sleep 60", "--session", "s2")
        assert ok(sandvisor(cli, "wait", "--pattern", "one", tid))  # found without --session
        listed = ok(sandvisor(cli, "session", "list")).splitlines()
        assert any(line.split("\t")[0] == "s2" for line in listed)
        ended = json.loads(ok(sandvisor(cli, "session", "end", "s2", "--json")))
        assert ended == {
            "session_id": "s2",
            "ended": True,
            "tasks_stopped": 1,
            "workspace_kept": False,
        }
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert [e["type"] for e in events][-2:] == ["task.stopped", "session.ended"]
    assert events[-2]["reason"] == "session_ended"
    gone = sandvisor(cli, "session", "end", "s2")
    assert gone.returncode == 1
    assert gone.stderr.strip() == b"sandvisor: error: no open session 's2'"


# -- errors and help -----------------------------------------------------------------------


def test_bad_duration_names_the_option(cli: Daemon) -> None:
    for args in (
        ["run", "--timeout", "5parsecs", "--", "true"],
        ["wait", "--timeout", "5parsecs", "bg-00000000"],
    ):
        result = sandvisor(cli, *args)
        assert result.returncode == 2, result
        assert b"argument --timeout: invalid duration '5parsecs'" in result.stderr
        assert b"Traceback" not in result.stderr
    env = sandvisor(cli, "run", "--env", "NOEQUALS", "--", "true")
    assert env.returncode == 2
    assert b"argument --env" in env.stderr


def test_unknown_task_is_a_clear_error(cli: Daemon) -> None:
    for args in (
        ["logs", "bg-00000000"],
        ["stop", "bg-00000000"],
        ["wait", "bg-00000000"],
        ["input", "bg-00000000", "x"],
        ["logs", "--session", "default", "bg-00000000"],
    ):
        result = sandvisor(cli, *args)
        assert result.returncode == 1, (args, result)
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("sandvisor: error: no task 'bg-00000000' in ")


def test_over_loopback_tcp_with_sandvisor_url_and_token(cli: Daemon) -> None:
    """$SANDVISOR_URL and $SANDVISOR_TOKEN point the CLI at the daemon's TCP listener (no autostart);
    a wrong token and a port nobody listens on are one-line errors."""
    assert cli.tcp is not None
    port = cli.tcp.rsplit(":", 1)[1]
    tcp = {**cli.env, "SANDVISOR_URL": f"http://localhost:{port}", "SANDVISOR_TOKEN": cli.token}

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*SANDVISOR, *args], env=env, input=b"", capture_output=True, timeout=120, check=False
        )

    tid = ok(run(tcp, "run", "--bg", "--policy", "fast", "--", "echo over tcp")).splitlines()[0]
    assert ok(run(tcp, "wait", tid)) == f"{tid} completed, exit code 0\n"
    assert ok(run(tcp, "logs", tid)) == "over tcp\n"
    [task] = json.loads(ok(run(tcp, "ps", "--json")))
    assert task["task_id"] == tid

    refused = run({**tcp, "SANDVISOR_TOKEN": "not-the-token"}, "ps")
    assert refused.returncode == 1
    assert refused.stderr == b"sandvisor: error: missing or invalid bearer token\n"

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        nobody = free.getsockname()[1]
    gone = run({**tcp, "SANDVISOR_URL": f"http://127.0.0.1:{nobody}"}, "ps")
    assert gone.returncode == 1
    [line] = gone.stderr.decode().splitlines()
    assert line.startswith(
        "sandvisor: error: cannot reach the daemon or start one: http://127.0.0.1:"
    )


def _subcommands() -> list[list[str]]:
    from supervisor.interfaces.cli.main import build_parser  # noqa: PLC0415

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append([*path, name])
                    walk(sub, [*path, name])

    walk(build_parser(), [])
    return found


def test_help_for_every_subcommand() -> None:
    commands = _subcommands()
    names = {" ".join(c) for c in commands}
    assert {"run", "ps", "logs", "stop", "input", "wait", "events", "top"} <= names
    assert {"session", "session list", "session end"} <= names
    procs = {
        " ".join(c): subprocess.Popen(
            [*SANDVISOR, *c, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
        )
        for c in commands
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (name, err)
        assert b"examples" in out, name
        assert out.startswith(b"usage: sandvisor " + name.encode()), name


# -- a daemon started on demand ---------------------------------------------------------------


def _gone(pid: int) -> bool:
    """True when the process no longer runs (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_cli_starts_a_daemon_when_none_runs(tmp_path: Path, policies_dir: Path) -> None:
    require_engine()
    state = tmp_path / "fresh-state"
    env = {
        **os.environ,
        "SANDVISOR_STATE_DIR": str(state),
        "SANDVISOR_POLICIES_DIR": str(policies_dir),
        # Leave nothing running if the test fails before it stops the daemon cleanly.
        "SANDVISOR_DAEMON_ARGS": "--stop-tasks-on-exit",
    }
    for name in ("SANDVISOR_URL", "SANDVISOR_TOKEN", "SANDVISOR_SESSION", "SANDVISOR_SOCKET"):
        env.pop(name, None)

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*SANDVISOR, *args], env=env, input=b"", capture_output=True, timeout=120, check=False
        )

    info_file = state / "daemon" / "daemon.json"
    pid = None
    try:
        first = run("run", "--bg", "--policy", "fast", "--", "echo", "hi")
        assert first.returncode == 0, first.stderr
        assert b"no daemon was running; started one in the background" in first.stderr
        pid = json.loads(info_file.read_text())["pid"]
        tid = first.stdout.decode().splitlines()[0]
        assert TASK_ID.match(tid)
        second = run("wait", "--timeout", "30s", tid)
        assert second.returncode == 0, second.stderr
        assert second.stderr == b""  # the daemon from before answered
        assert run("logs", tid).stdout == b"hi\n"
    finally:
        if pid is None and info_file.exists():
            pid = json.loads(info_file.read_text())["pid"]
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while not _gone(pid):
                assert time.monotonic() < deadline, f"daemon {pid} did not exit after SIGTERM"
                time.sleep(0.05)
    assert not info_file.exists()  # removed on a clean exit
    assert _owned_containers(state) == []
    log = (state / "daemon" / "daemon.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_serve_refuses_a_socket_path_too_long_for_a_unix_socket(
    tmp_path: Path, policies_dir: Path
) -> None:
    require_engine()
    state = tmp_path / "state"
    long_socket = tmp_path / ("d" * 60) / ("s" * 60 + ".sock")
    done = subprocess.run(
        [
            *SANDVISOR, "serve", "--state-dir", str(state), "--policies-dir", str(policies_dir),
            "--socket", str(long_socket),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    size = len(os.fsencode(long_socket))
    assert f"the socket path {long_socket} is {size} bytes" in done.stderr, done.stderr
    assert "at most 107: use a shorter --state-dir, or --socket" in done.stderr
    assert not long_socket.exists()
