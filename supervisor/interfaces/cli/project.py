"""The current directory as a workspace: the CLI's session per project directory, and
opening it on the daemon (which decides which directories may be workspaces).

``sandvisor run`` in a project directory runs its command on that directory, in the session
``ws-<name>-<hash of its realpath>``: two projects never share a session, and every
``sandvisor`` command run in the same directory finds it again. Outside the daemon's workspace
roots, commands fall back to the session ``default`` with no workspace.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.errors import PolicyError, SessionNotFound, SupervisorError
from supervisor.core.workspace_errors import WorkspaceOutsideRoots
from supervisor.interfaces.cli.remote import (
    DEFAULT_SESSION,
    CliError,
    ensure_session,
    error_message,
)
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.http_errors import NotFound

try:
    # The hash hashlib would give, without the OpenSSL bindings hashlib loads first (about
    # 20 ms of every `sandvisor` start).
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - CPython always has it
    from hashlib import blake2b

MODES = ("overlay", "ro", "rw")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class WorkspaceChoice:
    """The workspace a command asks for."""

    path: str
    """Absolute realpath."""
    mode: str
    explicit: bool
    """Named with ``--workspace`` (an error when refused) rather than the current
    directory (refused: run without one)."""
    mode_explicit: bool = False


def dir_session_id(path: str | os.PathLike[str]) -> str:
    """The CLI's session for a project directory: ``ws-<name>-<hash>``, where the hash is
    of the realpath (two directories never share one) and the name is the directory's own
    (so that ``sandvisor session list`` says which project a session is)."""
    real = os.path.realpath(path)
    digest = blake2b(os.fsencode(real), digest_size=5).hexdigest()
    name = _UNSAFE.sub("-", os.path.basename(real)).strip("-._")[:24] or "root"
    return f"ws-{name}-{digest}"


def explicit_session(args: argparse.Namespace) -> str | None:
    """``--session``, else ``$SANDVISOR_SESSION``, else None."""
    return getattr(args, "session", None) or os.environ.get("SANDVISOR_SESSION") or None


def cwd() -> str:
    """The current directory (its realpath; ``$PWD`` when the process cannot resolve it)."""
    try:
        return os.path.realpath(os.getcwd())
    except OSError:
        return os.path.realpath(os.environ.get("PWD", "/"))


async def current_session(client: SandvisorClient, args: argparse.Namespace) -> str:
    """The session a command means when none is named: the current directory's, when the
    daemon has it open, else ``default``."""
    named = explicit_session(args)
    if named:
        return named
    candidate = dir_session_id(cwd())
    try:
        await client.session(candidate)
    except (SessionNotFound, NotFound):
        return DEFAULT_SESSION
    return candidate


def add_workspace_options(parser: argparse.ArgumentParser) -> None:
    """``--workspace DIR``, ``--workspace-mode`` and ``--no-workspace``."""
    group = parser.add_argument_group("workspace")
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--workspace",
        type=Path,
        default=None,
        metavar="DIR",
        help="run on this project directory (default: the current directory, when it is "
        "under one of the daemon's workspace roots)",
    )
    which.add_argument(
        "--no-workspace",
        action="store_true",
        help="run with no workspace (the policy's scratch working directory)",
    )
    group.add_argument(
        "--workspace-mode",
        choices=MODES,
        default=None,
        help="overlay (default): writes stay in the session's own layer until you apply "
        "them; ro: read-only; rw: writes go to the project directly",
    )


def workspace_choice(args: argparse.Namespace) -> WorkspaceChoice | None:
    """What the options ask for (None: no workspace). The home directory itself is never
    taken implicitly: it is nobody's project, and the overlay's manifest would walk it all."""
    if args.no_workspace:
        return None
    mode = args.workspace_mode or "overlay"
    explicit_mode = args.workspace_mode is not None
    if args.workspace is not None:
        real = os.path.realpath(args.workspace)
        if not os.path.isdir(real):
            raise CliError(f"--workspace {args.workspace}: not a directory")
        return WorkspaceChoice(real, mode, explicit=True, mode_explicit=explicit_mode)
    here = cwd()
    if here == os.path.realpath(Path.home()) or here == "/":
        if explicit_mode:
            raise CliError(
                f"not using {here} as a workspace (it holds more than one project); "
                "run in a project directory or pass --workspace DIR"
            )
        return None
    return WorkspaceChoice(here, mode, explicit=False, mode_explicit=explicit_mode)


async def _open_now(client: SandvisorClient, sid: str) -> dict[str, object] | None:
    """The session ``sid`` when it is open now (None when it is not)."""
    try:
        return await client.session(sid)
    except (SessionNotFound, NotFound):
        return None


def _join_open(sid: str, info: dict[str, object], choice: WorkspaceChoice | None) -> str:
    """Run in the open session ``sid``: its workspace was fixed when it opened. Asking for
    another one outright is an error; the current directory, just a default, is not."""
    asked = choice is not None and (choice.explicit or choice.mode_explicit)
    if asked and choice is not None and not _same(info, choice):
        raise CliError(_fixed(sid, info, choice))
    return sid


def _same(info: dict[str, object], choice: WorkspaceChoice) -> bool:
    ws = info.get("workspace")
    return isinstance(ws, dict) and ws.get("path") == choice.path and ws.get("mode") == choice.mode


async def open_run_session(
    client: SandvisorClient,
    args: argparse.Namespace,
    policy: str | None = None,
    start_failed: int = 1,
) -> str:
    """The session ``sandvisor run`` runs in, opened on its workspace if it is not open yet.
    A policy refusal exits ``start_failed`` (the task never started)."""
    named = explicit_session(args)
    choice = workspace_choice(args)
    sid = named or (dir_session_id(choice.path) if choice else DEFAULT_SESSION)
    info = await _open_now(client, sid)
    if info is not None:
        return _join_open(sid, info, choice)
    if choice is None:
        await ensure_session(client, sid)
        return sid
    try:
        await client.create_session(
            sid, workspace=choice.path, workspace_mode=choice.mode, policy=policy
        )
    except WorkspaceOutsideRoots as exc:
        if choice.explicit:
            raise CliError(error_message(exc)) from exc
        roots = ", ".join(exc.roots) or "none"
        sys.stderr.write(
            f"sandvisor: {choice.path} is not under the daemon's workspace roots ({roots}): "
            "running without a workspace (sandvisor serve --workspace-root DIR adds one; "
            "--no-workspace says so)\n"
        )
        fallback = named or DEFAULT_SESSION
        await ensure_session(client, fallback)
        return fallback
    except PolicyError as exc:
        # Another command (`sandvisor events -f --session S`, a second `run`) may have
        # opened the session between the look-up above and this create: then it is the
        # session to run in, exactly as if it had been open already.
        raced = await _open_now(client, sid)
        if raced is not None:
            return _join_open(sid, raced, choice)
        # A policy the daemon does not know is refused here too (the session's policy
        # decides whom tasks of a root-owned workspace run as): either way, nothing ran.
        hint = (
            ""
            if choice.explicit
            else f" (opening a session on {choice.path}; --no-workspace runs without one)"
        )
        raise CliError(f"the task did not start: {error_message(exc)}{hint}", start_failed) from exc
    except NotFound as exc:  # a session token may not create sessions
        raise CliError(f"session {sid!r} does not exist and this token cannot create it") from exc
    except SupervisorError as exc:
        raise CliError(error_message(exc)) from exc
    return sid


def _fixed(sid: str, info: dict[str, object], choice: WorkspaceChoice) -> str:
    ws = info.get("workspace")
    have = f"{ws.get('path')} ({ws.get('mode')})" if isinstance(ws, dict) else "no workspace"
    return (
        f"session {sid} is open with {have}; a session's workspace is fixed when it opens. "
        f"End it first (sandvisor session end {sid}) or use another --session for "
        f"{choice.path} ({choice.mode})"
    )
