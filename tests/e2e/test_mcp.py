"""``sandvisor mcp`` through the official MCP Python client (stdio), against a real daemon. The
tools' schemas and the tool errors need no container: tests/component/test_mcp_bridge.py."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from supervisor.core.labels import LABEL_SESSION
from tests.conftest import labelled_containers
from tests.e2e.conftest import REPO, Daemon

pytestmark = pytest.mark.timeout(180)

DEV_SERVER = 'echo starting; sleep 1; echo "ready on :3000"; while true; do sleep 1; done'
_BG = re.compile(
    r"Command running in background with ID: (\S+)\. Output is being written to: (\S+)"
)


@dataclass
class Mcp:
    """A connected MCP client session plus what the server sent on the side."""

    session: ClientSession
    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)
    log_arrived: anyio.Event = field(default_factory=anyio.Event)
    results: list[str] = field(default_factory=list)

    async def call(self, name: str, **arguments: Any) -> types.CallToolResult:
        result = await self.session.call_tool(name, arguments)
        assert isinstance(result, types.CallToolResult)
        self.results.append(text_of(result))
        return result

    async def ok(self, name: str, **arguments: Any) -> str:
        result = await self.call(name, **arguments)
        text = text_of(result)
        assert not result.is_error, text
        return text

    async def wait_for_log(self, needle: str, timeout: float = 30) -> str:
        """The first log notification containing ``needle`` (waits for one to arrive)."""
        with anyio.fail_after(timeout):
            while True:
                for entry in self.logs:
                    if isinstance(entry.data, str) and needle in entry.data:
                        return entry.data
                self.log_arrived = anyio.Event()
                await self.log_arrived.wait()


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


@asynccontextmanager
async def mcp_client(daemon: Daemon, *extra: str, cwd: Path = REPO) -> AsyncIterator[Mcp]:
    """``sandvisor mcp`` as a stdio subprocess of the official client, on the fixture's daemon,
    started in ``cwd`` (as agent clients start it in their project)."""
    env = {**daemon.env, "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "supervisor.interfaces.cli.main",
            "mcp",
            "--state-dir",
            str(daemon.state_dir),
            *extra,
        ],
        env=env,
        cwd=str(cwd),
    )
    errlog = daemon.state_dir.parent / "mcp-stderr.log"
    holder: list[Mcp] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        holder[0].logs.append(params)
        holder[0].log_arrived.set()

    with errlog.open("a") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write, logging_callback=on_log) as session,
        ):
            holder.append(Mcp(session))
            await session.initialize()
            yield holder[0]


def sessions(daemon: Daemon) -> list[str]:
    with daemon.client() as c:
        return [s["session_id"] for s in c.get("/sessions").json()]


def session_containers(session_id: str) -> list[dict[str, Any]]:
    return labelled_containers(LABEL_SESSION, session_id)


def session_of(output_path: str) -> str:
    """``<state>/sessions/<sid>/tasks/<tid>.output`` -> ``<sid>``."""
    return Path(output_path).parent.parent.name


def killed_notifications(text: str, task_id: str) -> int:
    blocks = re.findall(r"<task-notification>.*?</task-notification>", text, re.S)
    return sum(
        1 for b in blocks if f"<task-id>{task_id}</task-id>" in b and "<status>killed</status>" in b
    )


async def test_dev_server_wait_read_stop_and_notified_exactly_once(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        started = await mcp.ok(
            "bash", command=DEV_SERVER, description="dev server", run_in_background=True
        )
        match = _BG.search(started)
        assert match, started
        task_id, output_path = match.groups()
        assert output_path.endswith(f"/tasks/{task_id}.output")

        waited = await mcp.ok("task_wait", task_id=task_id, pattern="ready on", timeout=30_000)
        assert "ready on :3000" in waited

        output = await mcp.ok("task_output", task_id=task_id)
        assert "starting\nready on :3000" in output
        assert "running" in output
        assert Path(output_path).read_text().startswith("starting\nready on :3000\n")

        filtered = await mcp.ok("task_output", task_id=task_id, filter="^ready")
        assert "ready on :3000" in filtered and "starting" not in filtered.split("---", 1)[1]

        before_stop = len(mcp.results)
        stopped = await mcp.ok("task_stop", task_id=task_id)
        assert "killed" in stopped and "user stopped" in stopped
        await mcp.ok("task_list")
        await mcp.ok("task_output", task_id=task_id, tail=200)

        earlier, later = mcp.results[:before_stop], mcp.results[before_stop:]
        assert sum(killed_notifications(t, task_id) for t in earlier) == 0
        counts = [killed_notifications(t, task_id) for t in later]
        assert sum(counts) == 1, later
        block = re.search(r"<task-notification>.*?</task-notification>", "\n".join(later), re.S)
        assert block is not None
        assert f"<output-file>{output_path}</output-file>" in block.group()
        assert "<reason>user_stopped</reason>" in block.group()

        # The same notification was also sent as a log message (best-effort channel).
        logged = await mcp.wait_for_log(f"<task-id>{task_id}</task-id>")
        assert "<status>killed</status>" in logged


async def test_foreground_bash_returns_output_and_exit_code(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        text = await mcp.ok("bash", command="echo hello; echo oops >&2; exit 3")
        assert "hello" in text and "oops" in text
        assert "Exit code: 3" in text

        big = await mcp.ok("bash", command="seq 1 30000", description="many lines")
        assert "output truncated" in big
        assert big.startswith("1\n2\n3\n")
        assert "\n30000\nExit code: 0" in big
        assert len(big) < 32_000

        timed_out = await mcp.ok("bash", command="sleep 30", timeout=500)
        assert "timed out" in timed_out

        # Foreground commands are answered by their own result, never notified again.
        listing = await mcp.ok("task_list")
        assert "No background tasks" in listing
        assert all("<task-notification>" not in r for r in mcp.results), mcp.results


async def test_monitor_lines_arrive_as_task_output_blocks(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        started = await mcp.ok(
            "monitor_start",
            command="echo alpha; echo beta; exec sleep 120",
            description="greek letters",
            timeout_ms=60_000,
        )
        match = re.search(r"Monitor started with ID: (\S+)\.", started)
        assert match, started
        task_id = match.group(1)

        # Wait (on the log channel) until both lines exist as events, then drain them.
        await mcp.wait_for_log("beta")
        await mcp.ok("task_list")
        joined = "\n".join(mcp.results)
        blocks = re.findall(
            rf'<task-output task-id="{task_id}"[^>]*>\n(.*?)\n</task-output>', joined, re.S
        )
        lines = "\n".join(blocks).splitlines()
        assert lines == ["alpha", "beta"], joined

        # Delivered once: further results carry no more output blocks for it.
        again = await mcp.ok("task_list")
        assert "<task-output" not in again
        await mcp.ok("task_stop", task_id=task_id)


#: Coloured test lines, then a 3000-frame progress counter redrawn with \r.
COLOURED = (
    "printf '\\033[1mtest_api\\033[0m ... \\033[32mok\\033[0m\\n'; i=0; "
    "while [ $i -le 3000 ]; do printf '\\rprogress %d%%' $i; i=$((i+1)); done; "
    "printf '\\n\\033]8;;https://example.com\\033\\\\docs\\033]8;;\\033\\\\ done\\n'"
)


async def test_the_agent_reads_output_as_a_terminal_shows_it(daemon: Daemon) -> None:
    """Issue 25: MCP results and monitor blocks are rendered; raw=true and the output file
    keep every byte."""
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        text = await mcp.ok("bash", command=COLOURED)
        assert text.startswith("test_api ... ok\nprogress 3000%\ndocs done\nExit code: 0"), text

        started = await mcp.ok("bash", command=COLOURED, run_in_background=True)
        match = _BG.search(started)
        assert match, started
        task_id, output_path = match.groups()
        await mcp.ok("task_wait", task_id=task_id)
        raw_file = Path(output_path).read_bytes()
        assert raw_file.count(b"\rprogress") == 3001  # the file holds every frame
        shown = await mcp.ok("task_output", task_id=task_id)
        assert "bytes 0-30000; next_offset: 30000; more: yes" in shown, shown
        assert shown.split("---\n", 1)[1].startswith("test_api ... ok\nprogress ")
        rest = await mcp.ok("task_output", task_id=task_id, offset=30_000)
        assert f"next_offset: {len(raw_file)}; more: no" in rest, rest
        assert rest.split("---\n", 1)[1] == "progress 3000%\ndocs done", rest
        tail = await mcp.ok("task_output", task_id=task_id, tail=30)
        assert tail.split("---\n", 1)[1] == "progress 3000%\ndocs done", tail
        raw = await mcp.ok("task_output", task_id=task_id, raw=True)
        assert "\x1b[32mok\x1b[0m" in raw and "\rprogress 2000%\rprogress 2001%" in raw
        matched = await mcp.ok("task_wait", task_id=task_id, pattern="^test_api ... ok$")
        assert matched.startswith("Matched at offset 0") and matched.endswith("test_api ... ok")

        started = await mcp.ok(
            "monitor_start",
            command="printf '\\033[31mFAIL\\033[0m one\\n'; exec sleep 120",
            description="coloured monitor",
            timeout_ms=60_000,
        )
        monitor = re.search(r"Monitor started with ID: (\S+)\.", started)
        assert monitor, started
        await mcp.wait_for_log("FAIL")
        await mcp.ok("task_list")
        joined = "\n".join(mcp.results)
        assert re.search(rf'<task-output task-id="{monitor.group(1)}"[^>]*>\nFAIL one\n', joined)
        await mcp.ok("task_stop", task_id=monitor.group(1))


async def test_closing_the_client_ends_the_session(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast", "--session-prefix", "closing") as mcp:
        started = await mcp.ok("bash", command="echo up; exec sleep 1000", run_in_background=True)
        match = _BG.search(started)
        assert match, started
        task_id, output_path = match.groups()
        sid = session_of(output_path)
        assert sid.startswith("closing-")
        assert sid in sessions(daemon)
        await mcp.ok("task_wait", task_id=task_id, pattern="^up$")
        listing = await mcp.ok("task_list")
        assert task_id in listing and "running" in listing
        assert len(session_containers(sid)) == 1

    # The server ends the session before it exits; allow the daemon a moment to forget it.
    deadline = time.monotonic() + 30
    while sid in sessions(daemon) or session_containers(sid):
        assert time.monotonic() < deadline, (sessions(daemon), session_containers(sid))
        await anyio.sleep(0.1)
    log = (daemon.state_dir.parent / "mcp-stderr.log").read_text()
    assert f"session {sid} ended (1 task(s) stopped)" in log


async def test_sigterm_ends_the_session(daemon: Daemon) -> None:
    """A raw JSON-RPC client (stdout must carry nothing but protocol lines), then SIGTERM
    while stdin is still open: the server ends the session and exits."""
    errlog = daemon.state_dir.parent / "mcp-sigterm.log"
    with errlog.open("ab") as err:
        proc = await anyio.open_process(
            [sys.executable, "-m", "supervisor.interfaces.cli.main", "mcp", "--policy", "fast"],
            env=daemon.env,
            cwd=REPO,
            stderr=err,
        )
    assert proc.stdin is not None and proc.stdout is not None
    stdout = BufferedByteReceiveStream(proc.stdout)
    try:

        async def request(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            assert proc.stdin is not None
            line = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            await proc.stdin.send(json.dumps(line).encode() + b"\n")
            with anyio.fail_after(60):
                while True:
                    message = json.loads(await stdout.receive_until(b"\n", 1 << 20))
                    if message.get("id") == rid:
                        result: dict[str, Any] = message["result"]
                        return result

        init = await request(
            1,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        assert init["serverInfo"]["name"] == "sandvisor"
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await proc.stdin.send(json.dumps(initialized).encode() + b"\n")
        result = await request(
            2,
            "tools/call",
            {
                "name": "bash",
                "arguments": {"command": "echo up; exec sleep 1000", "run_in_background": True},
            },
        )
        match = _BG.search(result["content"][0]["text"])
        assert match, result
        sid = session_of(match.group(2))
        waited = await request(
            3,
            "tools/call",
            {"name": "task_wait", "arguments": {"task_id": match.group(1), "pattern": "^up$"}},
        )
        assert not waited.get("isError"), waited
        assert session_containers(sid)

        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(60):
            assert await proc.wait() == 0
        # The server waited for the daemon to end the session before exiting.
        assert sid not in sessions(daemon)
        assert session_containers(sid) == []
        assert f"session {sid} ended (1 task(s) stopped)" in errlog.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()


async def test_input_and_explicit_background_timeout(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        started = await mcp.ok(
            "bash",
            command='echo "name?"; read -r answer; echo "got $answer"',
            description="asks a question",
            run_in_background=True,
        )
        match = _BG.search(started)
        assert match, started
        asker = match.group(1)
        await mcp.ok("task_wait", task_id=asker, pattern=r"name\?")
        answer = "sandvisor\n"
        sent = await mcp.ok("task_input", task_id=asker, text=answer, eof=True)
        # The count is of the text sent (the rename to "sandvisor" had left it at 4).
        assert f"Sent {len(answer)} character(s)" in sent and "EOF" in sent
        assert "got sandvisor" in await mcp.ok("task_wait", task_id=asker, pattern="^got ")
        ended = await mcp.ok("task_wait", task_id=asker)
        assert "completed, exit code 0" in ended

        # A timeout given explicitly also bounds a background command.
        started = await mcp.ok("bash", command="sleep 60", run_in_background=True, timeout=500)
        match = _BG.search(started)
        assert match, started
        sleeper = match.group(1)
        assert "killed, timeout" in await mcp.ok("task_wait", task_id=sleeper, timeout=30_000)
        joined = "\n".join(mcp.results)
        assert joined.count(f"<task-id>{asker}</task-id>") <= 1
        await mcp.ok("task_list")
        joined = "\n".join(mcp.results)
        assert joined.count(f"<task-id>{asker}</task-id>") == 1
        assert joined.count(f"<task-id>{sleeper}</task-id>") == 1
        assert "<reason>timeout</reason>" in joined


async def test_parallel_tool_calls_share_no_notification(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        started = await mcp.ok("bash", command="echo done", run_in_background=True)
        match = _BG.search(started)
        assert match, started
        task_id = match.group(1)
        # The log channel says when the completion exists; then ten calls race to drain it.
        await mcp.wait_for_log(f"<task-id>{task_id}</task-id>")
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(mcp.ok, "task_list")
        counts = [r.count(f"<task-id>{task_id}</task-id>") for r in mcp.results]
        assert sum(counts) == 1, counts
