"""``sbx serve``: run the daemon in the foreground."""

from __future__ import annotations

import argparse
from pathlib import Path

from supervisor.core.paths import default_state_dir
from supervisor.interfaces.cli.common import HelpFormatter

EPILOG = """\
examples:
  sbx serve                                  unix socket in <state-dir>/daemon/sbx.sock
  sbx serve --listen 127.0.0.1:8377          also loopback TCP (bearer token required)
  sbx serve --stop-tasks-on-exit             stop tasks on SIGTERM instead of leaving them
  sbx serve --webhook https://example/hook --webhook-secret-file secret.txt

The admin token is in <state-dir>/daemon/admin.token (mode 0600).
On SIGTERM/SIGINT the daemon stops taking requests, flushes its state and leaves running
containers for the next start to re-adopt.
"""


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subs.add_parser(
        "serve",
        help="run the daemon (HTTP API on a unix socket)",
        description="Run the supervisor daemon in the foreground.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state directory (default: $SBX_STATE_DIR or ~/.local/state/sbx)",
    )
    p.add_argument("--policies-dir", type=Path, default=None, help="policies directory")
    p.add_argument("--socket", type=Path, default=None, help="unix socket path")
    p.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="also listen on loopback TCP (127.0.0.1 or ::1 only)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="extra Host header value to accept on the TCP listener",
    )
    p.add_argument(
        "--stop-tasks-on-exit",
        action="store_true",
        help="stop every task on shutdown instead of leaving it for re-adoption",
    )
    p.add_argument("--docker-host", default=None, help="engine address (default: $DOCKER_HOST)")
    p.add_argument("--webhook", default=None, metavar="URL", help="POST every event here")
    p.add_argument(
        "--webhook-secret-file",
        type=Path,
        default=None,
        help="HMAC key for the webhook's X-Sbx-Signature header",
    )
    p.add_argument(
        "--event-retention",
        type=int,
        default=100_000,
        metavar="N",
        help="events kept per session (older ones: an explicit events.gap); default 100000",
    )
    p.add_argument(
        "--banner",
        action="store_true",
        help="print how to connect (socket, token, MCP client config) once ready",
    )
    p.add_argument(
        "--workspace-root",
        action="append",
        type=Path,
        default=[],
        help="host directory policies may mount as a workspace (repeatable)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: FastAPI, uvicorn and the runtime are for this command alone.
    from supervisor.interfaces.daemon.serve import DaemonSettings, main_serve  # noqa: PLC0415

    settings = DaemonSettings(
        state_dir=args.state_dir or default_state_dir(),
        policies_dir=args.policies_dir,
        socket_path=args.socket,
        listen=args.listen,
        allow_hosts=args.allow_host,
        stop_tasks_on_exit=args.stop_tasks_on_exit,
        docker_host=args.docker_host,
        webhook_url=args.webhook,
        webhook_secret_file=args.webhook_secret_file,
        workspace_roots=args.workspace_root,
        banner=args.banner,
        event_retention=args.event_retention,
    )
    return main_serve(settings)
