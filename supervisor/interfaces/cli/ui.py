"""``sandvisor ui``: print a new one-time login link to the daemon's dashboard
(``sandvisor serve --ui``)."""

from __future__ import annotations

import argparse

from supervisor.interfaces.cli.common import HelpFormatter, duration_s, print_json
from supervisor.interfaces.cli.remote import CliError, add_daemon_options, call
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.http_errors import NotFound

EPILOG = """\
The link logs one browser in, once, as this command's token: the admin (every session), or
with $SANDVISOR_TOKEN set to a session's token, that session only. The browser then holds an
HttpOnly cookie; the link itself is spent. The daemon must run with --ui.

examples:
  sandvisor ui                      a link valid for 10 minutes
  sandvisor ui --ttl 1h --json      {"url": ..., "expires_at": ...}
"""


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subs.add_parser(
        "ui",
        help="print a one-time login link to the web dashboard",
        description="Print a one-time login link to the daemon's web dashboard.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--ttl",
        type=duration_s,
        default=600.0,
        metavar="DURATION",
        help="how long the link works if unused (e.g. 10m, 1h; at most 24h)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_daemon_options(p, session=False)
    p.set_defaults(func=lambda a: call(a, _login))


async def _login(client: SandvisorClient, args: argparse.Namespace) -> int:
    try:
        link = await client.ui_login(args.ttl)
    except NotFound as exc:
        raise CliError(
            "the daemon serves no dashboard: restart it with `sandvisor serve --ui`"
        ) from exc
    if args.json:
        print_json(link)
    else:
        print(link["url"])
    return 0
