"""``sbx mcp``: serve the sandbox tools to an AI agent over MCP (stdio)."""

from __future__ import annotations

import argparse
from pathlib import Path

from supervisor.interfaces.cli.common import HelpFormatter

EPILOG = """\
examples:
  sbx mcp                                 serve on stdin/stdout (start it from an MCP client)
  sbx mcp --policy untrusted              every task under the gVisor policy
  claude mcp add sbx -- /path/to/.venv/bin/sbx mcp

One MCP connection is one session: it is created when the server starts and ended (every
container stopped and removed) when the client closes the connection or sends SIGTERM.
If no daemon answers, one is started in the background (said on stderr; stdout carries
the protocol).

tools: bash, task_output, task_stop, task_list, task_input, task_wait, monitor_start.
Notifications (<task-notification>, <background_task_poll>, <task-output>) are appended to
every tool result, each exactly once, and also sent as MCP log messages.
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
        "--state-dir",
        type=Path,
        default=None,
        metavar="D",
        help="the daemon's state directory (default: $SBX_STATE_DIR or ~/.local/state/sbx)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from supervisor.interfaces.mcp.server import McpOptions, main  # noqa: PLC0415

    return main(
        McpOptions(state_dir=args.state_dir, session_prefix=args.session_prefix, policy=args.policy)
    )
