"""``sandvisor``: entry point. Each subcommand lives in its own module with ``register()``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from supervisor.interfaces.cli.common import HelpFormatter

#: Subcommand modules, in help order. Each has ``register(subparsers)`` which sets
#: ``func(args) -> int`` on its parser(s). Every one is imported on every start, so they
#: import nothing heavy at the top (docker, FastAPI, uvicorn, pydantic models): a command
#: imports what it needs when it runs.
_MODULES = (
    "supervisor.interfaces.cli.run",
    "supervisor.interfaces.cli.tasks",
    "supervisor.interfaces.cli.top",
    "supervisor.interfaces.cli.sessions",
    "supervisor.interfaces.cli.workspace",
    "supervisor.interfaces.cli.serve",
    "supervisor.interfaces.cli.ui",
    "supervisor.interfaces.cli.mcp",
    "supervisor.interfaces.cli.policies",
    "supervisor.interfaces.cli.images",
    "supervisor.interfaces.cli.doctor",
)

EPILOG = """\
examples:
  sandvisor run -- make test       run a command in a sandbox, stream its output
  sandvisor run --bg -- npm start  in the background; then sandvisor ps, logs -f, stop
  sandvisor top                    every session's tasks, live (q quits)
  sandvisor workspace diff         in a project: what the commands changed (then apply)
  sandvisor doctor                 check the engine, runtimes and images
  sandvisor images build           build the sandbox images (offline)
  sandvisor serve --banner --ui    run the daemon (what `make run` does), print how to connect
                             and a login link to the web dashboard
  sandvisor mcp                    an MCP server over stdio for agent clients
"""


def _version() -> str:
    """The installed distribution's version (a checkout without an install: unknown)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("sandbox-supervisor")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the metadata is read only when asked (``--help`` loads nothing heavy)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        sys.stdout.write(f"sandvisor {_version()}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandvisor",
        description="Run every background command an AI agent launches in its own hardened "
        "Docker container.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--log-level", default=None, help="debug, info, warning, error")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version of the installed sandbox-supervisor and exit",
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(subs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    if getattr(args, "configure_logging", True):
        # Only for commands that log (serve, mcp, images, doctor): the daemon's clients log
        # nothing, and structlog is a noticeable share of their start-up time.
        from supervisor.core.logs import configure_logging  # noqa: PLC0415

        configure_logging(args.log_level)
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
