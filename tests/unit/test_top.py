"""``sandvisor top``'s pure parts: rows, sizes, flags, the summary line and a frame's layout."""

from __future__ import annotations

import re
from typing import Any

from supervisor.interfaces.cli.top import flags, printable, row, screen, size, summary

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def task(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_id": "bg-00000001",
        "session_id": "s1",
        "status": "running",
        "command": "npm run dev",
        "description": None,
        "kind": "background",
        "persistent": False,
        "stalled": False,
        "policy": "default",
        "running_ms": 1500,
        "output_bytes": 2048,
        "reason": None,
        "exit_code": None,
    }
    return {**base, **fields}


def test_size_for_people() -> None:
    assert size(None) == "0 B"
    assert size(812) == "812 B"
    assert size(1230) == "1.2 KB"
    assert size(34 * 1024 * 1024) == "34 MB"


def test_flags_name_the_badges() -> None:
    assert flags(task()) == ""
    assert flags(task(stalled=True, kind="monitor", persistent=True)) == (
        "input,monitor,persistent"
    )


def test_row_of_an_ended_task() -> None:
    cells = row(task(status="completed", reason="exit", exit_code=0, description="build"))
    assert cells == [
        "bg-00000001",
        "s1",
        "completed",
        "exit 0",
        "1.5s",
        "2.0 KB",
        "default",
        "",
        "build",
    ]


def test_escape_sequences_in_a_command_do_not_reach_the_terminal() -> None:
    evil = "echo \x1b]0;owned\x07\x1b[2J\x9b31m done"
    cells = row(task(command=evil))
    assert "\x1b" not in cells[-1]
    assert "\x07" not in cells[-1]
    assert "\x9b" not in cells[-1]
    assert cells[-1].startswith("echo ?]0;owned??[2J?31m")
    assert printable("plain text") == "plain text"


def test_summary_counts_states_and_waiting() -> None:
    snap = {
        "sessions": [{"session_id": "a"}, {"session_id": "b"}],
        "tasks": [
            task(),
            task(stalled=True),
            task(status="completed"),
        ],
    }
    assert summary(snap) == "2 sessions · 3 tasks: 2 running, 1 completed, 1 waiting for input"
    assert summary({"sessions": [], "tasks": []}) == "0 sessions · 0 tasks"


def test_a_frame_fits_the_window_and_says_what_is_hidden() -> None:
    tasks = [task(task_id=f"bg-{i:08d}", command="x" * 300) for i in range(20)]
    snap = {"sessions": [{"session_id": "s1"}], "tasks": tasks}
    lines = screen(snap, None, width=80, height=10, active=False)
    assert len(lines) == 10
    assert all(len(ANSI.sub("", line)) <= 80 for line in lines)
    assert lines[0].startswith("sandvisor top · 1 session · 20 tasks: 20 running")
    assert lines[2].startswith("TASK")
    assert sum(1 for line in lines if "bg-" in line) == 6
    assert lines[-1].startswith("14 more")
    assert "\x1b[32mrunning\x1b[0m" in lines[3]  # the status coloured


def test_a_frame_before_the_first_answer_and_on_an_error() -> None:
    lines = screen(None, "daemon not running", width=60, height=24, active=True)
    assert "connecting..." in lines[0]
    assert lines[1] == "error: daemon not running"
    assert lines[-1] == "q quit · a all tasks"
    empty = screen({"sessions": [], "tasks": []}, None, width=60, height=24, active=True)
    assert "no tasks running" in empty
