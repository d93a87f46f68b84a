"""``sandvisor mcp``: serve the sandbox tools to an AI agent over MCP (stdio)."""

from __future__ import annotations

import argparse
from pathlib import Path

from supervisor.core.errors import SpecError
from supervisor.core.text import parse_duration
from supervisor.interfaces.cli.common import HelpFormatter

EPILOG = """\
examples:
  sandvisor mcp                                 serve on stdin/stdout (start it from an MCP client)
  sandvisor mcp --policy dev                    the toolchain image; tasks reach each other
  sandvisor mcp --policy untrusted              every task under the gVisor policy
  sandvisor mcp --workspace ~/src/app --workspace-mode ro
  claude mcp add sandvisor -- /path/to/.venv/bin/sandvisor mcp --policy dev

One MCP connection is one session: it is created when the server starts and ended (every
container stopped and removed) when the client closes the connection or sends SIGTERM.
If no daemon answers, one is started in the background (said on stderr; stdout carries
the protocol).

Workspace: agent clients start MCP servers in the project, so the current directory is the
session's workspace (at the same path inside, as its owner) when it is under one of the
daemon's workspace roots (sandvisor serve --workspace-root; default: the home directory of the
user running the daemon). Elsewhere the server runs without one and says so, on stderr
and to the agent. In overlay mode (the default) the agent's writes stay out of the project
until you apply them; the session id is on stderr at start, and its changes are kept when
the session ends:
  sandvisor workspace diff --session mcp-1a2b3c4d5e6f
  sandvisor workspace apply --session mcp-1a2b3c4d5e6f

tools: bash, task_output, task_stop, task_list, task_input, task_wait, monitor_start,
workspace_changes (read-only), workspace_apply (only with --allow-agent-apply).
Notifications (<task-notification>, <background_task_poll>, <task-output>) are appended to
every tool result, each exactly once, and also sent as MCP log messages.

A foreground bash command still running after --auto-background-after (30s) is not
killed: it moves to the background, the agent gets its output so far and its task id, and
later its <task-notification>. bash's tail_every_minutes=N sends <background_task_poll>
blocks with the output's tail every N minutes while the command prints.
"""


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subs.add_parser(
        "mcp",
        help="MCP server over stdio: sandboxed bash and background tasks for an agent",
        description="Serve sandboxed bash, background tasks and monitors to an AI agent as "
        "an MCP server on stdin/stdout.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--session-prefix",
        default="mcp",
        metavar="P",
        help="session ids are P-<random> (default: mcp)",
    )
    p.add_argument(
        "--policy",
        default=None,
        metavar="P",
        help="policy for every task this server starts (default: the daemon's 'default')",
    )
    p.add_argument(
        "--auto-background-after",
        type=_off_or_duration,
        default=None,
        metavar="DUR",
        help="move a foreground bash command still running after DUR to the background "
        "instead of waiting on (default: 30s; 0 turns it off: it waits, up to its timeout)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="D",
        help=(
            "the daemon's state directory"
            " (default: $SANDVISOR_STATE_DIR or ~/.local/state/sandvisor)"
        ),
    )
    ws = p.add_argument_group("workspace")
    which = ws.add_mutually_exclusive_group()
    which.add_argument(
        "--workspace",
        type=Path,
        default=None,
        metavar="DIR",
        help="the project directory (default: the current directory, when the daemon allows "
        "it); refused: exit with an error",
    )
    which.add_argument(
        "--no-workspace", action="store_true", help="no project directory: scratch space only"
    )
    ws.add_argument(
        "--workspace-mode",
        choices=("overlay", "ro", "rw"),
        default=None,
        help="overlay (default): the agent's writes stay out of the project until you "
        "apply them; ro: read-only; rw: writes go to the project directly",
    )
    ws.add_argument(
        "--allow-agent-apply",
        action="store_true",
        help="offer the agent a workspace_apply tool (default: applying is yours to do)",
    )
    p.set_defaults(func=run)


def _off_or_duration(text: str) -> float:
    """argparse type: a duration in seconds (``30s``, ``2m``, bare numbers are seconds),
    where 0 means off."""
    try:
        return parse_duration(text, "duration")
    except SpecError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def run(args: argparse.Namespace) -> int:
    from supervisor.interfaces.mcp.server import McpOptions, main  # noqa: PLC0415

    auto = {}
    if args.auto_background_after is not None:
        auto["auto_background_s"] = args.auto_background_after
    return main(
        McpOptions(
            state_dir=args.state_dir,
            session_prefix=args.session_prefix,
            policy=args.policy,
            workspace=args.workspace,
            workspace_mode=args.workspace_mode,
            no_workspace=args.no_workspace,
            allow_agent_apply=args.allow_agent_apply,
            **auto,
        )
    )
