"""What the daemon-client subcommands share: options, sessions, errors, the event loop.

Every ``sandvisor`` command that talks to the daemon runs one coroutine through :func:`call`,
which gets a client from ``ensure_daemon()`` (starting a daemon if none answers) and turns
expected failures into one line on stderr and an exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from supervisor.core.errors import SessionNotFound, SupervisorError, TaskNotFound
from supervisor.core.text import describe_end as end_phrase
from supervisor.interfaces.cli.common import fail
from supervisor.interfaces.client import SandvisorClient, TaskJson
from supervisor.interfaces.http_errors import DaemonError, DaemonNotRunning, NotFound, status_of
from supervisor.interfaces.launch import ensure_daemon

DEFAULT_SESSION = "default"
#: How long a command waits for a task that is still being created before giving up.
START_WAIT_S = 60.0

Command = Callable[[SandvisorClient, argparse.Namespace], Awaitable[int]]


class CliError(SupervisorError):
    """An expected failure of a command: a one-line message for stderr and the exit
    status (``exit_status``) it ends with."""

    code = "cli_error"

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status


# -- options ------------------------------------------------------------------------------


def add_daemon_options(
    parser: argparse.ArgumentParser,
    *,
    session: bool = True,
    by_task: bool = False,
    session_help: str | None = None,
) -> None:
    """``--state-dir`` (which daemon) and, for session-scoped commands, ``--session``
    (``by_task``: commands naming a task find its session unless told)."""
    # Commands that only talk to the daemon log nothing themselves (the daemon does), so
    # they skip setting up logging, a noticeable share of their start-up time.
    parser.set_defaults(configure_logging=False)
    group = parser.add_argument_group("daemon")
    group.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "the daemon's state directory"
            " (default: $SANDVISOR_STATE_DIR or ~/.local/state/sandvisor)"
        ),
    )
    if session:
        group.add_argument(
            "--session",
            default=None,
            metavar="S",
            help=session_help
            or (
                "the task's session (default: whichever open session has the task)"
                if by_task
                else "session id (default: $SANDVISOR_SESSION, else the current directory's "
                f"session if it has one, else {DEFAULT_SESSION!r})"
            ),
        )


# -- running a command --------------------------------------------------------------------


def call(args: argparse.Namespace, command: Command, *, error_code: int = 1) -> int:
    """Run ``command`` against the daemon; expected failures exit ``error_code`` (or the
    status a CliError carries) with one line on stderr, never a traceback."""

    async def main() -> int:
        try:
            client = await ensure_daemon(args.state_dir)
        except DaemonError:
            raise
        except OSError as exc:  # e.g. the admin token cannot be read
            raise DaemonNotRunning(str(exc)) from exc
        async with client:
            return await command(client, args)

    try:
        return asyncio.run(main())
    except SupervisorError as exc:
        status = exc.exit_status if isinstance(exc, CliError) else error_code
        return fail(error_message(exc), status)
    except BrokenPipeError:
        # The reader went away (``sandvisor logs -f | head``): that is how pipelines end.
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        return 130


def error_message(exc: SupervisorError) -> str:
    """One line for stderr."""
    if isinstance(exc, DaemonNotRunning):
        return _daemon_message(exc)
    return str(exc) or f"the daemon answered HTTP {status_of(exc)} ({exc.code})"


def _daemon_message(exc: DaemonNotRunning) -> str:
    """One line: ensure_daemon's message may carry the daemon log's tail on later lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return "cannot reach the daemon"
    head = lines[0].rstrip(":")
    if len(lines) > 1:
        head = f"{head}: {lines[-1]}"
    return f"cannot reach the daemon or start one: {head}"


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush does not fail again."""
    # Best effort on the way out: if fd 1 cannot be replaced, the final flush fails as
    # it would have anyway, and the exit status (141) is already decided.
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


# -- sessions and tasks -------------------------------------------------------------------


async def ensure_session(client: SandvisorClient, sid: str) -> None:
    """Create the session on first use. Looks first: every POST mints another token."""
    if any(s.get("session_id") == sid for s in await client.sessions()):
        return
    try:
        await client.create_session(sid)
    except NotFound as exc:  # a session token may not create sessions
        raise CliError(f"session {sid!r} does not exist and this token cannot create it") from exc
    except SupervisorError as exc:
        raise CliError(error_message(exc)) from exc


async def locate_task(
    client: SandvisorClient, args: argparse.Namespace, task_id: str
) -> tuple[str, TaskJson]:
    """(session id, TaskInfo) of ``task_id``: in ``--session`` if given, else wherever it is."""
    sid = getattr(args, "session", None)
    try:
        info = await client.task(sid, task_id) if sid else await client.find_task(task_id)
    except (TaskNotFound, SessionNotFound, NotFound) as exc:
        where = f"in session {sid!r}" if sid else "in any open session"
        raise CliError(f"no task {task_id!r} {where}") from exc
    return str(info["session_id"]), info


async def wait_started(client: SandvisorClient, sid: str, info: TaskJson) -> TaskJson:
    """The task's info once it is past ``starting`` (its stdin is attached only then)."""
    deadline = time.monotonic() + START_WAIT_S
    while info.get("status") == "starting" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        info = await client.task(sid, str(info["task_id"]))
    return info


# -- formatting ---------------------------------------------------------------------------


def format_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def describe_end(info: dict[str, Any]) -> str:
    """``bg-7f3a9c2e completed, exit code 0`` (or the current status while it runs)."""
    return f"{info.get('task_id')} {end_phrase(info)}"


def one_line(text: str, width: int | None) -> str:
    """Newlines and tabs as spaces (a row stays a row); cut to ``width`` for people."""
    flat = " ".join(text.split())
    if width is not None and len(flat) > width:
        return flat[: max(1, width - 3)] + "..."
    return flat
