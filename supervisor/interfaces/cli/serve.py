"""``sandvisor serve``: run the daemon in the foreground."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from supervisor.core.paths import default_state_dir
from supervisor.interfaces.cli.common import HelpFormatter, duration_s, nonnegative_int
from supervisor.interfaces.daemon.limits import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS

EPILOG = f"""\
examples:
  sandvisor serve                                  unix socket in <state-dir>/daemon/sandvisor.sock
  sandvisor serve --listen 127.0.0.1:8377          also loopback TCP (bearer token required)
  sandvisor serve --ui                             also the dashboard on http://127.0.0.1:8377/ui/
                                             (prints a one-time login link; sandvisor ui: another)
  sandvisor serve --stop-tasks-on-exit             stop tasks on SIGTERM instead of leaving them
  sandvisor serve --workspace-root ~/src --workspace-root /srv/projects
                                             projects there may be session workspaces
  sandvisor serve --webhook https://example/hook --webhook-secret-file secret.txt

The admin token is in <state-dir>/daemon/admin.token (mode 0600).
The daemon raises its own open-files limit (nofile) to the hard limit at start. Each
listener holds at most --max-connections connections (default {MAX_CONNECTIONS}, fewer when
the listeners would otherwise use over half of nofile); a connection over it gets a 503.
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
        help="state directory (default: $SANDVISOR_STATE_DIR or ~/.local/state/sandvisor)",
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
        "--ui",
        action="store_true",
        help="serve the web dashboard on the loopback TCP listener (--listen, else "
        "127.0.0.1:8377 or a free port) and print a one-time login link",
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
    p.add_argument(
        "--docker-host",
        default=None,
        help="engine address, or the Swarm manager's with --backend swarm (default: $DOCKER_HOST)",
    )
    p.add_argument(
        "--backend",
        choices=["docker", "swarm"],
        default=None,
        help="one Docker engine, or a Swarm cluster through its manager (default: "
        "$SANDVISOR_BACKEND, else docker)",
    )
    p.add_argument("--webhook", default=None, metavar="URL", help="POST every event here")
    p.add_argument(
        "--webhook-secret-file",
        type=Path,
        default=None,
        help="HMAC key for the webhook's X-Sandvisor-Signature header",
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
        metavar="DIR",
        help="directory under which sessions may have their workspace (repeatable; default: "
        "$SANDVISOR_WORKSPACE_ROOTS, ':'-separated, else the home directory of the user running "
        "the daemon)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"open connections per listener (default {MAX_CONNECTIONS}, lowered to fit nofile)",
    )
    p.add_argument(
        "--header-timeout",
        type=duration_s,
        default=HEADER_TIMEOUT_S,
        metavar="DURATION",
        help="a request's line and headers must arrive within this "
        f"(default {HEADER_TIMEOUT_S:g}s)",
    )
    p.add_argument(
        "--body-timeout",
        type=duration_s,
        default=BODY_TIMEOUT_S,
        metavar="DURATION",
        help=f"a request's body must arrive within this (default {BODY_TIMEOUT_S:g}s)",
    )
    p.add_argument(
        "--engine-timeout",
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="deadline of every engine call; past it the call fails with engine_unresponsive "
        "(default: $SANDVISOR_ENGINE_TIMEOUT_S, else 30s)",
    )
    p.set_defaults(func=run)


def _positive_int(text: str) -> int:
    value = nonnegative_int("a number of connections")(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: FastAPI, uvicorn and the runtime are for this command alone.
    from supervisor.interfaces.daemon.serve import DaemonSettings, main_serve  # noqa: PLC0415

    if args.backend:
        # Read where the backend is made (supervisor.engine.select), as SANDVISOR_BACKEND is.
        os.environ["SANDVISOR_BACKEND"] = args.backend
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
        ui=args.ui,
        event_retention=args.event_retention,
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        engine_timeout_s=args.engine_timeout,
    )
    return main_serve(settings)
