"""``sandvisor events`` and ``sandvisor session``: a session's event stream, listing and
ending sessions."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from supervisor.core.errors import SessionNotFound
from supervisor.interfaces.cli.common import (
    HelpFormatter,
    nonnegative_int,
    print_json,
    print_table,
    want_plain,
)
from supervisor.interfaces.cli.project import current_session
from supervisor.interfaces.cli.remote import (
    CliError,
    add_daemon_options,
    call,
    ensure_session,
    format_time,
)
from supervisor.interfaces.client import FOLLOW_WAIT_S
from supervisor.interfaces.http_errors import NotFound

if TYPE_CHECKING:
    from supervisor.interfaces.client import SandvisorClient

EVENTS_EPILOG = """\
json: one event a line (task.started, task.output, task.poll, task.stalled, task.stopped,
task.failed, session.ended), each with its seq. xml: what an agent is shown, the
<task-notification> and <background_task_poll> blocks. Resume later with --since <last seq>.

examples:
  sandvisor events                                 everything the session still holds
  sandvisor events -f                              and keep following until the session ends
  sandvisor events --format xml --since 41
  sandvisor events -f | jq -c 'select(.type == "task.stopped")'
"""

SESSION_EPILOG = """\
examples:
  sandvisor session list
  sandvisor session end ci-42        stop and remove every container of session ci-42
"""

SESSION_LIST_EPILOG = """\
Columns: SESSION, TASKS (started), RUNNING, LAST SEQ (newest event), CREATED and WORKSPACE
(the project directory its tasks run on, and the mode; - for none).

examples:
  sandvisor session list
  sandvisor session list --json | jq -r '.[].session_id'
"""

SESSION_END_EPILOG = """\
Every task of the session is stopped (SIGTERM, grace, SIGKILL) and its container removed;
the session's tokens are revoked. Its records stay: using the id again opens it anew.

examples:
  sandvisor session end                  the current session ($SANDVISOR_SESSION, the current
                                   directory's, or default)
  sandvisor session end ci-42 --json
"""


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ev = subs.add_parser(
        "events",
        help="print a session's events (json lines) or notifications (xml); -f follows",
        description="Print the events of a session after a seq, as JSON lines or as the "
        "notification blocks an agent sees.",
        epilog=EVENTS_EPILOG,
        formatter_class=HelpFormatter,
    )
    ev.add_argument(
        "-f", "--follow", action="store_true", help="keep following until the session ends"
    )
    ev.add_argument(
        "--since", type=_seq, default=0, metavar="SEQ", help="only events after this seq"
    )
    ev.add_argument(
        "--format", choices=["json", "xml"], default="json", help="json lines or xml blocks"
    )
    ev.add_argument(
        "--json", dest="format", action="store_const", const="json", help="same as --format json"
    )
    add_daemon_options(ev)
    ev.set_defaults(func=lambda a: call(a, _events))

    session = subs.add_parser(
        "session",
        help="list or end sessions",
        description="List the open sessions, or end one (stopping all of its tasks).",
        epilog=SESSION_EPILOG,
        formatter_class=HelpFormatter,
    )

    def usage(_args: argparse.Namespace) -> int:
        session.print_help()
        return 2

    session.set_defaults(func=usage)
    ssubs = session.add_subparsers(dest="session_command", metavar="SUBCOMMAND")
    listing = ssubs.add_parser(
        "list",
        help="the open sessions: tasks, running, last event seq",
        description="List the daemon's open sessions.",
        epilog=SESSION_LIST_EPILOG,
        formatter_class=HelpFormatter,
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add_daemon_options(listing, session=False)
    listing.set_defaults(func=lambda a: call(a, _session_list))

    end = ssubs.add_parser(
        "end",
        help="end a session: stop and remove all of its containers",
        description="End a session: stop every task, remove the containers, revoke its tokens.",
        epilog=SESSION_END_EPILOG,
        formatter_class=HelpFormatter,
    )
    end.add_argument(
        "session_arg",
        nargs="?",
        default=None,
        metavar="S",
        help="session id (default: --session, $SANDVISOR_SESSION, the current directory's "
        "session, or default)",
    )
    end.add_argument("--json", action="store_true", help="machine-readable output")
    add_daemon_options(end)
    end.set_defaults(func=lambda a: call(a, _session_end))


_seq = nonnegative_int("an event seq number")


# -- events -------------------------------------------------------------------------------


async def _events(client: SandvisorClient, args: argparse.Namespace) -> int:
    sid = await current_session(client, args)
    await ensure_session(client, sid)
    try:
        if args.format == "xml":
            await _xml_events(client, sid, args.since, args.follow)
        else:
            async for batch in client.follow_events(sid, args.since, follow=args.follow):
                for ev in batch:
                    sys.stdout.write(json.dumps(ev) + "\n")
                sys.stdout.flush()
    except (SessionNotFound, NotFound):
        if not args.follow:
            raise
        # Following: the session ended and the daemon let go of it; that is the end.
    return 0


async def _xml_events(client: SandvisorClient, sid: str, cursor: int, follow: bool) -> None:
    wait_s = FOLLOW_WAIT_S if follow else 0.0
    while True:
        cursor, ended = await _xml_batch(client, sid, cursor, wait_s)
        if ended:
            return


async def _xml_batch(
    client: SandvisorClient, sid: str, cursor: int, wait_s: float
) -> tuple[int, bool]:
    text, last = await client.notifications(sid, after=cursor, fmt="xml", wait_s=wait_s)
    if text:
        sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()
    if last != cursor:
        return last, False
    if wait_s == 0:
        return last, True
    # No new events at all: the long-poll timed out, or the session's log has closed (then
    # the daemon answers at once, so ask whether that is why).
    body = await client.events(sid, after=cursor, wait_s=0)
    return last, bool(body.get("ended")) and not body["events"]


# -- session ------------------------------------------------------------------------------


async def _session_list(client: SandvisorClient, args: argparse.Namespace) -> int:
    sessions = await client.sessions()
    if args.json:
        print_json(sessions)
        return 0
    if not sessions and not want_plain(args):
        sys.stdout.write("no open sessions\n")
        return 0
    rows = [
        [
            s["session_id"],
            s.get("tasks", 0),
            s.get("running", 0),
            s.get("last_seq", 0),
            format_time(s.get("created_at")),
            _workspace(s.get("workspace")),
        ]
        for s in sessions
    ]
    print_table(["session", "tasks", "running", "last seq", "created", "workspace"], rows)
    return 0


def _workspace(ws: object) -> str:
    """``/path (mode)``, or ``-`` for a session without a workspace."""
    if not isinstance(ws, dict):
        return "-"
    return f"{ws.get('path')} ({ws.get('mode')})"


async def _session_end(client: SandvisorClient, args: argparse.Namespace) -> int:
    sid = args.session_arg or await current_session(client, args)
    try:
        body = await client.end_session(sid)
    except (SessionNotFound, NotFound) as exc:
        raise CliError(f"no open session {sid!r}") from exc
    if args.json:
        print_json(body)
        return 0
    n = int(body.get("tasks_stopped", 0))
    sys.stdout.write(f"session {sid} ended; {n} running task{'s' if n != 1 else ''} stopped\n")
    if body.get("workspace_kept"):
        sys.stdout.write(
            f"its workspace changes are kept: review them with "
            f"`sandvisor workspace diff --session {sid}`, then apply or discard them\n"
        )
    return 0
