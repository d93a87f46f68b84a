"""Long commands through ``sandvisor mcp`` and the official MCP client, on a real daemon and
engine: log polls (``tail_every_minutes``), foreground commands moved to the background
instead of killed, and ``persistent`` background commands."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_mcp import Mcp, mcp_client, text_of

pytestmark = pytest.mark.timeout(180)

_BG = re.compile(r"Command running in background with ID: (bg-[0-9a-f]+)\.")
_MOVED = re.compile(r"moved to the background \(it was not stopped\): ID (bg-[0-9a-f]+)\.")

#: A policy whose default timeout is short, so "outlives the default timeout" takes seconds.
SHORT_LIFE = """
description = "tests: 3 s default timeout, persistent tasks allowed"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
default_ms = 3000
allow_persistent = true
grace_s = 1.0
"""


@pytest.fixture
def policies_dir(policies_dir: Path) -> Path:
    """The test policies plus ``shortlife`` (read by the daemon when it starts)."""
    (policies_dir / "shortlife.toml").write_text(SHORT_LIFE)
    return policies_dir


def notifications(text: str, task_id: str) -> list[str]:
    blocks = re.findall(r"<task-notification>.*?</task-notification>", text, re.S)
    return [b for b in blocks if f"<task-id>{task_id}</task-id>" in b]


def polls(text: str, task_id: str) -> list[str]:
    blocks = re.findall(r"<background_task_poll .*?</background_task_poll>", text, re.S)
    return [b for b in blocks if f'taskId="{task_id}"' in b]


def started(text: str) -> str:
    match = _BG.search(text)
    assert match, text
    return match.group(1)


def moved(text: str) -> str:
    match = _MOVED.search(text)
    assert match, text
    return match.group(1)


async def elapse(mcp: Mcp, seconds: float) -> None:
    """Let ``seconds`` pass on the daemon's side: wait for a sleeper task to end (a
    condition), so tool results go on collecting whatever arrives meanwhile."""
    tid = started(
        await mcp.ok("bash", command=f"sleep {seconds}", run_in_background=True, timeout=60_000)
    )
    assert "completed" in await mcp.ok("task_wait", task_id=tid, timeout=60_000)


async def test_polls_carry_tails_in_later_results_once_each_and_stop_at_the_end(
    daemon: Daemon,
) -> None:
    # 12 lines of 500 characters, one a second: a tail is 3000 characters of a longer log.
    command = (
        "pad=$(head -c 490 /dev/zero | tr '\\0' x); i=0; "
        'while [ $i -lt 12 ]; do echo "tick $i $pad"; i=$((i+1)); sleep 1; done'
    )
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        first = await mcp.ok(
            "bash",
            command=command,
            description="ticker",
            run_in_background=True,
            tail_every_minutes=0.05,
        )
        tid = started(first)
        assert "<background_task_poll> with its latest output every 3s" in first
        # Tool calls spread over the task's life: each result carries what arrived since.
        for n in (4, 8):
            await mcp.ok("task_wait", task_id=tid, pattern=f"^tick {n} ", timeout=30_000)
            await mcp.wait_for_log(f'<background_task_poll taskId="{tid}"')
            await mcp.ok("task_list")
        assert "completed" in await mcp.ok("task_wait", task_id=tid, timeout=30_000)
        await mcp.ok("task_list")
        ended_at = len(mcp.results)
        # Two more poll periods after the end: nothing more may come.
        await elapse(mcp, 7)
        await mcp.ok("task_list")

        per_result = [polls(r, tid) for r in mcp.results]
        every = [p for ps in per_result for p in ps]
        assert len(every) >= 3, mcp.results
        assert len(set(every)) == len(every), "a poll was delivered twice"
        sizes = []
        for block in every:
            tail = re.search(r"<log_tail>\n(.*)\n</log_tail>", block, re.S)
            assert tail is not None, block
            assert re.search(r"tick \d+ x{490}\n$", tail.group(1)), block
            sizes.append(len(tail.group(1)))
            assert 'command="pad=' in block and 'runningMs="' in block
            # Rendered (issue 25), in whole lines: it starts where a line starts.
            assert tail.group(1).startswith("tick "), block
        # The whole log while it is short, then its last whole lines within 3000 characters
        # (seed: 2000-4000).
        assert max(sizes) > 3000 - 501 and all(s <= 3000 for s in sizes), sizes
        # The completion comes once, and no poll after it: in the result that carries it,
        # polls come first; in later results there are none.
        done = [i for i, r in enumerate(mcp.results) if notifications(r, tid)]
        assert len(done) == 1 and len(notifications(mcp.results[done[0]], tid)) == 1
        assert done[0] < ended_at
        in_it = mcp.results[done[0]]
        last_poll = max((in_it.rfind(p) for p in polls(in_it, tid)), default=-1)
        assert last_poll < in_it.index(notifications(in_it, tid)[0])
        assert all(not ps for ps in per_result[done[0] + 1 :]), per_result
        # The polls also went out as MCP log notifications.
        assert await mcp.wait_for_log("<log_tail>")


async def test_a_long_foreground_command_moves_to_the_background_after_30s(
    daemon: Daemon,
) -> None:
    """The default: ``sandvisor mcp`` with no option moves it after 30 s."""
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        began = time.monotonic()
        result = await mcp.ok("bash", command="sleep 45; echo done", description="slow one")
        took = time.monotonic() - began
        tid = moved(result)
        assert 29.5 <= took <= 40, took
        assert result.startswith("(no output yet)\n")
        assert "still running after 30s" in result
        assert f"task_wait task_id={tid}" in result and f"task_stop task_id={tid}" in result
        assert f"/tasks/{tid}.output" in result
        assert f"- {tid} [background] running" in await mcp.ok("task_list")

        ended = await mcp.ok("task_wait", task_id=tid, timeout=60_000)
        assert "completed, exit code 0" in ended
        await mcp.ok("task_list")
        joined = "\n".join(mcp.results)
        [block] = notifications(joined, tid)
        assert "<status>completed</status>" in block and "<exit-code>0</exit-code>" in block
        assert "<last-output>\ndone\n</last-output>" in block
        logged = await mcp.wait_for_log(f"<task-id>{tid}</task-id>")
        assert "<last-output>\ndone\n</last-output>" in logged


async def test_moved_commands_keep_their_timeout_and_a_closed_stdin(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast", "--auto-background-after", "2s") as mcp:
        # Output so far comes with the move; stdin stays closed (cat reads EOF at once).
        result = await mcp.ok(
            "bash",
            command="echo started; sleep 4; cat; echo after-cat; sleep 2; echo done",
            tail_every_minutes=0.05,
        )
        reader = moved(result)
        assert result.startswith("started\nCommand still running after 2s")
        assert f"task_output task_id={reader} offset=8" in result
        refused = await mcp.call("task_input", task_id=reader, text="hello\n")
        assert refused.is_error and "stdin_closed" in text_of(refused)

        # The command's own timeout still applies once it is in the background.
        bounded = moved(await mcp.ok("bash", command="echo up; sleep 60", timeout=5_000))

        # Quick commands are answered in the foreground as ever.
        quick = await mcp.ok("bash", command="echo quick")
        assert quick.startswith("quick\nExit code: 0")

        assert "completed" in await mcp.ok("task_wait", task_id=reader, timeout=30_000)
        assert "killed, timeout" in await mcp.ok("task_wait", task_id=bounded, timeout=30_000)
        await mcp.ok("task_list")
        joined = "\n".join(mcp.results)
        [done] = notifications(joined, reader)
        assert "<last-output>\nstarted\nafter-cat\ndone\n</last-output>" in done
        [killed] = notifications(joined, bounded)
        assert "<reason>timeout</reason>" in killed and "<last-output>\nup\n" in killed
        # Polls asked for on a foreground command come once it is in the background.
        assert polls(joined, reader)

        # Argument errors name the field and what is allowed.
        both = await mcp.call("bash", command="true", persistent=True)
        assert both.is_error
        assert "persistent: only for background commands (run_in_background=true)" in (
            text_of(both)
        )
        for bad in (0, -2, 1441):
            wrong = await mcp.call(
                "bash", command="true", run_in_background=True, tail_every_minutes=bad
            )
            assert wrong.is_error
            assert "tail_every_minutes: must be a number of minutes > 0 and at most 1440" in (
                text_of(wrong)
            )
        not_a_number = await mcp.call("bash", command="true", tail_every_minutes="often")
        assert not_a_number.is_error and "tail_every_minutes" in text_of(not_a_number)


async def test_auto_background_off_kills_at_the_foreground_timeout(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast", "--auto-background-after", "0") as mcp:
        timed_out = await mcp.ok("bash", command="echo up; sleep 30", timeout=1_500)
        assert timed_out.startswith("up\nCommand timed out after 1500ms and was killed")
        listed = await mcp.session.list_tools()
        [bash] = [t for t in listed.tools if t.name == "bash"]
        assert bash.description and "moved to the background" not in bash.description


async def test_persistent_background_commands_outlive_the_default_timeout(
    daemon: Daemon,
) -> None:
    command = "echo begun; sleep 5; echo alive"
    async with mcp_client(daemon, "--policy", "shortlife") as mcp:
        persistent = started(
            await mcp.ok("bash", command=command, run_in_background=True, persistent=True)
        )
        bounded = started(
            await mcp.ok("bash", command=command, run_in_background=True, persistent=False)
        )
        default = started(await mcp.ok("bash", command=command, run_in_background=True))

        outlived = await mcp.ok("task_wait", task_id=persistent, timeout=30_000)
        assert "completed, exit code 0" in outlived
        assert "killed, timeout" in await mcp.ok("task_wait", task_id=bounded, timeout=30_000)
        assert "completed" in await mcp.ok("task_wait", task_id=default, timeout=30_000)
        output = await mcp.ok("task_output", task_id=persistent)
        assert "---\nbegun\nalive" in output

        both = await mcp.call(
            "bash", command="true", run_in_background=True, persistent=True, timeout=1_000
        )
        assert both.is_error and "persistent: " in text_of(both)

    # A policy without persistent tasks: asked for, it is an error; not asked for, the
    # policy's default timeout applies.
    async with mcp_client(daemon, "--policy", "strict") as mcp:
        refused = await mcp.call("bash", command="sleep 5", run_in_background=True, persistent=True)
        assert refused.is_error and "persistent" in text_of(refused)
        fallback = started(await mcp.ok("bash", command="sleep 5", run_in_background=True))
        assert "killed, timeout" in await mcp.ok("task_wait", task_id=fallback, timeout=30_000)


async def test_monitor_start_polls_too(daemon: Daemon) -> None:
    async with mcp_client(daemon, "--policy", "fast") as mcp:
        text = await mcp.ok(
            "monitor_start",
            command="i=0; while [ $i -lt 6 ]; do echo line $i; i=$((i+1)); sleep 1; done",
            timeout_ms=60_000,
            tail_every_minutes=0.05,
        )
        match = re.search(r"Monitor started with ID: (\S+)\.", text)
        assert match, text
        tid = match.group(1)
        assert "every 3s" in text
        await mcp.wait_for_log(f'<background_task_poll taskId="{tid}"')
        await mcp.ok("task_wait", task_id=tid, timeout=30_000)
        await mcp.ok("task_list")
        joined = "\n".join(mcp.results)
        assert polls(joined, tid) and "line 0" in polls(joined, tid)[0]
        assert len(notifications(joined, tid)) == 1
