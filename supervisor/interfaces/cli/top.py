"""``sandvisor top``: the task table of every session the token may see, redrawn live in the
terminal (``--json``: one snapshot)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from supervisor.core.errors import SessionNotFound, SupervisorError
from supervisor.core.text import FINAL_STATUSES, format_elapsed, outcome_short
from supervisor.interfaces.cli.common import HelpFormatter, duration_s, print_json, print_table
from supervisor.interfaces.cli.remote import add_daemon_options, call, error_message, one_line
from supervisor.interfaces.http_errors import NotFound

if TYPE_CHECKING:
    from supervisor.interfaces.client import SandvisorClient, TaskJson

TOP_EPILOG = """\
The tasks of every session the token may see (the admin token: all of them; a session's
token: its own), those still running first, newest first. Redrawn every --interval.
Columns: TASK, SESSION, STATUS, OUTCOME (exit code, timeout, user stopped, ...), TIME
(running time), OUTPUT (bytes the command printed), POLICY, FLAGS (input: waiting for
input; monitor; persistent) and COMMAND (the description, else the command).

keys: q (or Ctrl-C) quits; a shows only the tasks still running, or all again.
Not on a terminal, it prints the table once (tab-separated, no header) and exits.

examples:
  sandvisor top
  sandvisor top --session ci-42 --active
  sandvisor top --json | jq '.tasks[] | select(.stalled) | .task_id'
  a session's own view:
  SANDVISOR_URL=http://127.0.0.1:8765 SANDVISOR_TOKEN=sandvisor_session_... sandvisor top
"""

HEADERS = ["task", "session", "status", "outcome", "time", "output", "policy", "flags", "command"]

#: ANSI colours of a status (live mode only; piped output stays plain).
_COLOURS = {
    "running": "32",
    "starting": "36",
    "stopping": "33",
    "failed": "31",
    "killed": "35",
    "completed": "2",
}
_RESET = "\x1b[0m"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    top = subs.add_parser(
        "top",
        help="the task table of every session, live (q quits; --json: one snapshot)",
        description="Show the tasks of every session the token may see, refreshed live.",
        epilog=TOP_EPILOG,
        formatter_class=HelpFormatter,
    )
    top.add_argument("--active", action="store_true", help="only tasks that have not ended")
    top.add_argument(
        "--interval",
        type=duration_s,
        default=1.0,
        metavar="DUR",
        help="time between refreshes: 500ms, 2s, ... (default: 1s)",
    )
    top.add_argument(
        "--json",
        action="store_true",
        help="print one snapshot ({taken_at, sessions, tasks}) as JSON and exit",
    )
    add_daemon_options(
        top, session_help="only this session (default: every session the token may see)"
    )
    top.set_defaults(func=lambda a: call(a, _top))


async def _top(client: SandvisorClient, args: argparse.Namespace) -> int:
    if args.json:
        print_json(await snapshot(client, args.session, active=args.active))
        return 0
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        snap = await snapshot(client, args.session, active=args.active)
        print_table(HEADERS, [row(t) for t in snap["tasks"]])
        return 0
    return await Live(client, args).run()


# -- the snapshot ---------------------------------------------------------------------------


async def snapshot(client: SandvisorClient, session: str | None, *, active: bool) -> dict[str, Any]:
    """``{taken_at, sessions, tasks}``: every session the token may see (or ``session``)
    with its task counts by status, and their tasks, running ones first, newest first."""
    sessions = [await client.session(session)] if session else await client.sessions()
    lists = await asyncio.gather(
        *(client.tasks(str(s["session_id"]), active=active) for s in sessions),
        return_exceptions=True,
    )
    shown: list[dict[str, Any]] = []
    tasks: list[TaskJson] = []
    for info, got in zip(sessions, lists, strict=True):
        if isinstance(got, SessionNotFound | NotFound):
            continue  # it ended between the two requests
        if isinstance(got, BaseException):
            raise got
        shown.append({**info, "states": dict(Counter(str(t["status"]) for t in got))})
        tasks += got
    tasks.sort(key=lambda t: (t["status"] in FINAL_STATUSES, -float(t.get("created_at") or 0)))
    return {"taken_at": time.time(), "sessions": shown, "tasks": tasks}


def flags(task: TaskJson) -> str:
    """The dashboard's badges as words: waiting for input, monitor, persistent."""
    out = []
    if task.get("stalled"):
        out.append("input")
    if task.get("kind") == "monitor":
        out.append("monitor")
    if task.get("persistent"):
        out.append("persistent")
    return ",".join(out)


def size(n: int | None) -> str:
    """Bytes for people: ``0 B``, ``812 B``, ``1.2 KB``, ``34 MB``."""
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(n or 0), 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{value:.1f} {units[unit]}" if value < 10 else f"{value:.0f} {units[unit]}"


def row(task: TaskJson) -> list[str]:
    return [
        str(task["task_id"]),
        str(task["session_id"]),
        str(task["status"]),
        outcome_short(task),
        format_elapsed(task.get("running_ms")),
        size(task.get("output_bytes")),
        str(task.get("policy") or ""),
        flags(task),
        printable(one_line(str(task.get("description") or task["command"]), None)),
    ]


def printable(text: str) -> str:
    """Control characters (ESC, BEL, C1, DEL) shown as ``?``: a command or description is
    the agent's text, and an escape sequence in it must not drive the terminal."""
    return _CONTROL.sub("?", text)


def summary(snap: dict[str, Any]) -> str:
    """``2 sessions · 5 tasks: 2 running, 1 waiting for input, 2 completed``."""
    tasks = snap["tasks"]
    states = Counter(str(t["status"]) for t in tasks)
    parts = [f"{n} {status}" for status, n in sorted(states.items(), key=lambda kv: -kv[1])]
    waiting = sum(1 for t in tasks if t.get("stalled"))
    if waiting:
        parts.append(f"{waiting} waiting for input")
    head = f"{_plural(len(snap['sessions']), 'session')} · {_plural(len(tasks), 'task')}"
    return head + (": " + ", ".join(parts) if parts else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def screen(
    snap: dict[str, Any] | None, error: str | None, *, width: int, height: int, active: bool
) -> list[str]:
    """The lines of one frame, each at most ``width`` columns (colour codes aside)."""
    clock = time.strftime("%H:%M:%S")
    title = f"sandvisor top · {summary(snap) if snap else 'connecting...'} · {clock}"
    lines = [_cut(title, width)]
    lines.append(_cut(printable(f"error: {error}"), width) if error else "")
    rows = [row(t) for t in snap["tasks"]] if snap else []
    room = max(1, height - 4)
    shown, hidden = rows[:room], len(rows) - room
    widths = [max([len(h)] + [len(r[i]) for r in shown]) for i, h in enumerate(HEADERS)]
    widths[-1] = max(10, width - sum(w + 2 for w in widths[:-1]))
    lines.append(
        _cut("  ".join(h.upper().ljust(w) for h, w in zip(HEADERS, widths, strict=True)), width)
    )
    for cells in shown:
        cells[-1] = one_line(cells[-1], widths[-1])
        text = _cut("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)), width)
        lines.append(_colour_status(text, cells[2], widths[:2]))
    if not rows and snap is not None:
        lines.append("no tasks" + (" running" if active else ""))
    keys = f"q quit · a {'all tasks' if active else 'only running tasks'}"
    more = f"{hidden} more (a larger window shows them) · " if hidden > 0 else ""
    lines.append(_cut(more + keys, width))
    return lines


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _colour_status(line: str, status: str, before: list[int]) -> str:
    """Colour the status cell (found by its column) of an already cut line."""
    code = _COLOURS.get(status)
    start = sum(w + 2 for w in before)
    if code is None or len(line) < start + len(status):
        return line
    end = start + len(status)
    return f"{line[:start]}\x1b[{code}m{line[start:end]}{_RESET}{line[end:]}"


# -- the live view --------------------------------------------------------------------------


class Live:
    """The alternate screen, redrawn every interval and on a key or a resize."""

    def __init__(self, client: SandvisorClient, args: argparse.Namespace) -> None:
        self.client = client
        self.session: str | None = args.session
        self.active: bool = args.active
        self.interval: float = args.interval
        self.quit = asyncio.Event()
        self.wake = asyncio.Event()
        self.snap: dict[str, Any] | None = None
        self.error: str | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        fd = sys.stdin.fileno()
        with _terminal(fd):
            loop.add_reader(fd, self._key, fd)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.quit.set)
            loop.add_signal_handler(signal.SIGWINCH, self.wake.set)
            try:
                while not self.quit.is_set():
                    await self._refresh()
                    self._draw()
                    self.wake.clear()
                    await _first(self.quit.wait(), self.wake.wait(), timeout=self.interval)
            finally:
                loop.remove_reader(fd)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGWINCH):
                    loop.remove_signal_handler(sig)
        return 0

    def _key(self, fd: int) -> None:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b"q"
        if not data or b"q" in data or b"Q" in data or b"\x03" in data:
            self.quit.set()  # q, Ctrl-C (when the terminal does not signal), or EOF
        elif b"a" in data or b"A" in data:
            self.active = not self.active
            self.wake.set()
        else:
            self.wake.set()  # any other key redraws now

    async def _refresh(self) -> None:
        """A new snapshot (the last one stays shown, with the error, if this fails). A quit
        meanwhile does not wait for the daemon."""
        fetch = asyncio.ensure_future(snapshot(self.client, self.session, active=self.active))
        quit_wait = asyncio.ensure_future(self.quit.wait())
        try:
            await asyncio.wait({fetch, quit_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            quit_wait.cancel()
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, SupervisorError, OSError):
                await fetch
            return
        try:
            self.snap, self.error = fetch.result(), None
        except (SupervisorError, OSError) as exc:
            msg = error_message(exc) if isinstance(exc, SupervisorError) else str(exc)
            # The retry note first: a long message is cut at the window's edge.
            self.error = f"retrying every {self.interval:g}s · {msg}"

    def _draw(self) -> None:
        cols, lines = shutil.get_terminal_size()
        frame = screen(self.snap, self.error, width=cols, height=lines, active=self.active)
        # Home, each line cleared to its end, then the rest of the screen: no flicker.
        out = "\x1b[H" + "".join(f"{line}\x1b[K\r\n" for line in frame[:-1])
        out += frame[-1] + "\x1b[K\x1b[J"
        sys.stdout.write(out)
        sys.stdout.flush()


@contextlib.contextmanager
def _terminal(fd: int) -> Iterator[None]:
    """Keys without Enter and without echo, on the alternate screen with the cursor
    hidden; all of it put back on the way out (also after an error)."""
    import termios  # noqa: PLC0415 - only the live view needs a terminal
    import tty  # noqa: PLC0415

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    sys.stdout.write("\x1b[?1049h\x1b[?25l\x1b[2J")
    sys.stdout.flush()
    try:
        yield
    finally:
        sys.stdout.write("\x1b[?25h\x1b[?1049l")
        sys.stdout.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _first(*waits: Any, timeout: float) -> None:
    """Return when one of ``waits`` (coroutines) finishes or ``timeout`` passes."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
