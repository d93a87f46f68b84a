"""The gVisor stall signal, from real ``runsc debug --stacks``/``--ps`` output captured on
this machine (tests/unit/data/gvisor_*.txt; Debian's runsc 0.0~20221219)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.gvisor import Blocked, Proc, parse_ps, parse_stacks, waits_on_stdin

DATA = Path(__file__).parent / "data"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_a_read_of_stdin_shows_with_its_thread_and_fd() -> None:
    blocked = parse_stacks(_read("gvisor_stacks_readx.txt"))
    assert [(b.tid, b.call, b.args[0]) for b in blocked] == [(1, "Read", 0)]


@pytest.mark.parametrize(
    ("case", "waiting"),
    [
        # cat reads fd 0, but it is a pipe from its earlier sibling sleep: no stall.
        ("pipeline", False),
        # select(1, {0}, ...) can only wait on fd 0.
        ("select", True),
        # cat reads the real stdin (grep reads the pipe from cat): a stall.
        ("catgrep", True),
    ],
)
def test_captured_sandboxes(case: str, waiting: bool) -> None:
    blocked = parse_stacks(_read(f"gvisor_stacks_{case}.txt"))
    procs = parse_ps(_read(f"gvisor_ps_{case}.txt"))
    assert procs, "the process list parses despite runsc's log noise"
    assert waits_on_stdin(blocked, procs)[0] is waiting


def test_ps_parses_threads_and_parents() -> None:
    procs = parse_ps(_read("gvisor_ps_pipeline.txt"))
    cmds = {p.cmd: p for p in procs}
    assert {"sleep", "cat"} <= set(cmds)
    assert cmds["sleep"].ppid == cmds["cat"].ppid
    assert cmds["sleep"].pid < cmds["cat"].pid
    assert cmds["cat"].threads == (cmds["cat"].pid,)


def _procs(*rows: tuple[int, int, str]) -> list[Proc]:
    return [Proc(pid, ppid, (pid,), cmd) for pid, ppid, cmd in rows]


def test_what_is_not_taken_for_a_stall() -> None:
    procs = _procs((1, 0, "init"), (2, 1, "python3"))
    # A read of another fd (a pipe the process made, or a duplicated stdin: cannot tell).
    assert not waits_on_stdin([Blocked(2, "Read", (3, 0, 1))], procs)[0]
    # poll/epoll: their fd sets are in the task's memory, out of view.
    assert not waits_on_stdin([Blocked(2, "Poll", (0x7FFF, 1, 0))], procs)[0]
    assert not waits_on_stdin([Blocked(2, "EpollWait", (3, 0x7F, 1))], procs)[0]
    # select with no fds (a sleep) or several.
    assert not waits_on_stdin([Blocked(2, "Select", (0, 0, 0))], procs)[0]
    assert not waits_on_stdin([Blocked(2, "Select", (5, 0x7F, 0))], procs)[0]
    assert not waits_on_stdin([], procs)[0]


def test_a_reader_started_after_a_quiet_sibling_is_a_later_pipeline_stage() -> None:
    procs = _procs((1, 0, "init"), (2, 1, "sh"), (3, 2, "sleep"), (4, 2, "cat"))
    assert not waits_on_stdin([Blocked(4, "Read", (0, 0, 1))], procs)[0]
    # The shell itself reading (its children are gone or were started later) is a stall.
    alone = _procs((1, 0, "init"), (2, 1, "sh"))
    assert waits_on_stdin([Blocked(2, "Read", (0, 0, 1))], alone)[0]
