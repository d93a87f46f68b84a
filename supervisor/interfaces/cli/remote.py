"""What the daemon-client subcommands share: options, sessions, errors, the event loop.

Every ``sbx`` command that talks to the daemon runs one coroutine through :func:`call`,
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

import httpx

from supervisor.core.models import TaskInfo
from supervisor.interfaces.cli.common import fail
from supervisor.interfaces.client import ApiError, DaemonNotRunning, SbxClient, ensure_daemon

DEFAULT_SESSION = "default"
#: How long a command waits for a task that is still being created before giving up.
START_WAIT_S = 60.0

Command = Callable[[SbxClient, argparse.Namespace], Awaitable[int]]


class CliError(Exception):
    """An expected failure: a one-line message for stderr and the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# -- options ------------------------------------------------------------------------------


def add_daemon_options(
    parser: argparse.ArgumentParser, *, session: bool = True, by_task: bool = False
) -> None:
    """``--state-dir`` (which daemon) and, for session-scoped commands, ``--session``
    (``by_task``: commands naming a task find its session unless told)."""
    group = parser.add_argument_group("daemon")
    group.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the daemon's state directory (default: $SBX_STATE_DIR or ~/.local/state/sbx)",
    )
    if session:
        group.add_argument(
            "--session",
            default=None,
            metavar="S",
            help="the task's session (default: whichever open session has the task)"
            if by_task
            else f"session id (default: $SBX_SESSION or {DEFAULT_SESSION!r})",
        )


def session_id(args: argparse.Namespace) -> str:
    """``--session``, else ``$SBX_SESSION``, else ``default``."""
    return str(getattr(args, "session", None) or os.environ.get("SBX_SESSION") or DEFAULT_SESSION)


# -- running a command --------------------------------------------------------------------


def call(args: argparse.Namespace, command: Command, *, error_code: int = 1) -> int:
    """Run ``command`` against the daemon; expected failures exit ``error_code`` (or the
    code a CliError carries) with one line on stderr."""

    async def main() -> int:
        try:
            client = await ensure_daemon(args.state_dir)
        except OSError as exc:  # e.g. the state directory cannot be created
            raise DaemonNotRunning(str(exc)) from exc
        try:
            return await command(client, args)
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except CliError as exc:
        return fail(exc.message, exc.code)
    except ApiError as exc:
        return fail(api_message(exc), error_code)
    except DaemonNotRunning as exc:
        return fail(_daemon_message(exc), error_code)
    except httpx.TransportError as exc:
        return fail(f"lost the connection to the daemon: {exc or type(exc).__name__}", error_code)
    except BrokenPipeError:
        # The reader went away (``sbx logs -f | head``): that is how pipelines end.
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        return 130


def api_message(exc: ApiError) -> str:
    return str(exc) or f"the daemon answered HTTP {exc.status} ({exc.code})"


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
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


# -- sessions and tasks -------------------------------------------------------------------


async def ensure_session(client: SbxClient, sid: str) -> None:
    """Create the session on first use. Looks first: every POST mints another token."""
    if any(s.get("session_id") == sid for s in await client.sessions()):
        return
    try:
        await client.create_session(sid)
    except ApiError as exc:
        if exc.status == 404:  # a session token may not create sessions
            raise CliError(
                f"session {sid!r} does not exist and this token cannot create it"
            ) from exc
        raise CliError(api_message(exc)) from exc


async def locate_task(
    client: SbxClient, args: argparse.Namespace, task_id: str
) -> tuple[str, dict[str, Any]]:
    """(session id, TaskInfo) of ``task_id``: in ``--session`` if given, else wherever it is."""
    sid = getattr(args, "session", None)
    try:
        if sid:
            return sid, await client.task(sid, task_id)
        info = await client.find_task(task_id)
    except ApiError as exc:
        if exc.status == 404:
            where = f"in session {sid!r}" if sid else "in any open session"
            raise CliError(f"no task {task_id!r} {where}") from exc
        raise
    return str(info["session_id"]), info


async def wait_started(client: SbxClient, sid: str, info: dict[str, Any]) -> dict[str, Any]:
    """The task's info once it is past ``starting`` (its stdin is attached only then)."""
    deadline = time.monotonic() + START_WAIT_S
    while info.get("status") == "starting" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        info = await client.task(sid, str(info["task_id"]))
    return info


# -- formatting ---------------------------------------------------------------------------

FINAL = frozenset({"completed", "failed", "killed"})


def is_final(info: dict[str, Any]) -> bool:
    return info.get("status") in FINAL


def format_ms(ms: int | None) -> str:
    """``850ms``, ``12.3s``, ``4m05s``, ``2h03m``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def outcome(info: dict[str, Any]) -> str:
    """The reason/exit column: ``exit 0``, ``timeout``, ``user stopped``, ``image_missing``."""
    if not is_final(info):
        return "stalled" if info.get("stalled") else "-"
    reason = info.get("reason")
    if reason == "exit":
        return f"exit {info.get('exit_code')}"
    if reason is None:
        return str(info.get("error_code") or "never ran")
    return str(reason).replace("_", " ")


def end_phrase(info: dict[str, Any]) -> str:
    """``completed, exit code 0``, ``killed, user stopped``, ``failed: <error>``, ``running``."""
    return TaskInfo.model_validate(info).describe_end()


def describe_end(info: dict[str, Any]) -> str:
    """``bg-7f3a9c2e completed, exit code 0`` (or the current status while it runs)."""
    return f"{info.get('task_id')} {end_phrase(info)}"


def one_line(text: str, width: int | None) -> str:
    """Newlines and tabs as spaces (a row stays a row); cut to ``width`` for people."""
    flat = " ".join(text.split())
    if width is not None and len(flat) > width:
        return flat[: max(1, width - 3)] + "..."
    return flat
