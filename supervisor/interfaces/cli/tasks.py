"""``sandvisor ps``, ``logs``, ``stop``, ``input``, ``wait``: look at and steer tasks via the
daemon."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
from typing import TYPE_CHECKING

from supervisor.core.errors import SessionNotFound, TaskNotRunning
from supervisor.core.text import format_elapsed, outcome_short
from supervisor.interfaces.cli.common import (
    HelpFormatter,
    duration_s,
    fail,
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
    describe_end,
    locate_task,
    one_line,
    wait_started,
)
from supervisor.interfaces.client import READ_CHUNK
from supervisor.interfaces.http_errors import NotFound

if TYPE_CHECKING:
    from supervisor.interfaces.client import SandvisorClient, TaskJson

PS_EPILOG = """\
Columns: TASK, SESSION, STATUS (starting, running, stopping, completed, failed, killed),
OUTCOME (exit code, timeout, user stopped, ...; stalled while waiting for input), TIME
(running time) and COMMAND (the description, else the command; cut to fit a terminal).
Piped, the rows are tab-separated with no header and nothing cut. With --all, the warm
pool's containers come last: TASK pool, SESSION -, STATUS pool, OUTCOME "N ready",
COMMAND the policy (not in --json, which lists tasks only; see GET /healthz).

examples:
  sandvisor ps                          tasks of the current session ($SANDVISOR_SESSION, else the
                                  current directory's, else default)
  sandvisor ps --active                 only those still running
  sandvisor ps --all-sessions
  sandvisor ps --all                    also the warm pool: a `pool` row per policy, with how
                                  many containers wait ready for a task
  sandvisor ps --json | jq -r '.[] | select(.status == "running") | .task_id'
"""

LOGS_EPILOG = """\
The output file holds the command's stdout and stderr merged, as exact bytes.

examples:
  sandvisor logs bg-7f3a9c2e                 everything so far
  sandvisor logs --tail 20 bg-7f3a9c2e       the last 20 lines
  sandvisor logs -f bg-7f3a9c2e              follow until the task ends
  sandvisor logs --json bg-7f3a9c2e | jq -r .text
"""

STOP_EPILOG = """\
SIGTERM, the policy's grace period, then SIGKILL; the container is removed. A task that
already ended is left alone: exit status 1, naming how it ended.

examples:
  sandvisor stop bg-7f3a9c2e
  sandvisor stop --json bg-7f3a9c2e | jq .status
"""

INPUT_EPILOG = """\
The task must have been started with stdin pipe (the default of most policies).

examples:
  sandvisor input bg-7f3a9c2e yes                   sends "yes\\n"
  sandvisor input --no-newline bg-7f3a9c2e q        sends "q"
  sandvisor input --eof bg-7f3a9c2e 'last line'     then closes the task's stdin (EOF)
  printf 'a\\nb\\n' | sandvisor input bg-7f3a9c2e -   sends stdin's bytes as they are
"""

WAIT_EPILOG = """\
exit status: without --pattern 0 when the task ended, 1 on timeout; with --pattern 0 when a
line matched (printed; earlier lines count too), 1 on timeout, 2 when the task ended
without a match.

examples:
  sandvisor wait bg-7f3a9c2e                                 until it ends (up to 30 s)
  sandvisor wait --timeout 10m --json bg-7f3a9c2e | jq .exit_code
  sandvisor wait --pattern 'listening on :[0-9]+' --timeout 1m bg-7f3a9c2e
"""


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ps = subs.add_parser(
        "ps",
        help="list tasks: id, session, status, outcome, running time, command",
        description="List the tasks of a session (or of every open session).",
        epilog=PS_EPILOG,
        formatter_class=HelpFormatter,
    )
    ps.add_argument("--all-sessions", action="store_true", help="tasks of every open session")
    ps.add_argument(
        "--all",
        action="store_true",
        help="tasks of every open session, and a row per policy for the warm pool's "
        "ready containers (status pool)",
    )
    ps.add_argument("--active", action="store_true", help="only tasks that have not ended")
    ps.add_argument("--json", action="store_true", help="the full TaskInfo list as JSON")
    add_daemon_options(ps)
    ps.set_defaults(func=lambda a: call(a, _ps))

    logs = subs.add_parser(
        "logs",
        help="print a task's output (--tail N, -f to follow)",
        description="Print a task's output file to stdout, as exact bytes.",
        epilog=LOGS_EPILOG,
        formatter_class=HelpFormatter,
    )
    logs.add_argument("task_id", metavar="TASK", help="task id, e.g. bg-7f3a9c2e")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the task ends"
    )
    logs.add_argument(
        "--tail", type=_count, default=None, metavar="N", help="start with the last N lines"
    )
    logs.add_argument(
        "--json",
        action="store_true",
        help="JSON with the text (UTF-8, invalid bytes replaced); with -f one object a chunk",
    )
    add_daemon_options(logs, by_task=True)
    logs.set_defaults(func=lambda a: call(a, _logs))

    stop = subs.add_parser(
        "stop",
        help="stop a task and print its final status",
        description="Stop a task (SIGTERM, grace period, SIGKILL) and print its final status.",
        epilog=STOP_EPILOG,
        formatter_class=HelpFormatter,
    )
    stop.add_argument("task_id", metavar="TASK", help="task id")
    stop.add_argument("--json", action="store_true", help="the final TaskInfo as JSON")
    add_daemon_options(stop, by_task=True)
    stop.set_defaults(func=lambda a: call(a, _stop))

    inp = subs.add_parser(
        "input",
        help="send a line (or stdin's bytes) to a task's stdin",
        description="Write TEXT and a newline to a task's stdin.",
        epilog=INPUT_EPILOG,
        formatter_class=HelpFormatter,
    )
    inp.add_argument("task_id", metavar="TASK", help="task id")
    inp.add_argument("text", metavar="TEXT", help="what to send; - sends this program's stdin")
    inp.add_argument("--eof", action="store_true", help="close the task's stdin afterwards")
    inp.add_argument("--no-newline", action="store_true", help="do not add a newline")
    add_daemon_options(inp, by_task=True)
    inp.set_defaults(func=lambda a: call(a, _input))

    wait = subs.add_parser(
        "wait",
        help="wait for a task to end, or for an output line matching --pattern",
        description="Wait for a task's final status, or for a line of output matching a "
        "regular expression.",
        epilog=WAIT_EPILOG,
        formatter_class=HelpFormatter,
    )
    wait.add_argument("task_id", metavar="TASK", help="task id")
    wait.add_argument(
        "--pattern", default=None, metavar="RE", help="wait for an output line matching RE"
    )
    wait.add_argument(
        "--timeout",
        type=duration_s,
        default=30.0,
        metavar="DUR",
        help="give up after this long: 500ms, 30s, 5m, 1h (default: 30s)",
    )
    wait.add_argument("--json", action="store_true", help="the result as JSON")
    add_daemon_options(wait, by_task=True)
    wait.set_defaults(func=_wait_checked)


_count = nonnegative_int("a number of lines")


# -- ps -----------------------------------------------------------------------------------


async def _ps(client: SandvisorClient, args: argparse.Namespace) -> int:
    args.all_sessions = args.all_sessions or args.all
    if args.all_sessions:
        sids = [str(s["session_id"]) for s in await client.sessions()]
    else:
        sids = [await current_session(client, args)]
    tasks: list[TaskJson] = []
    for sid in sids:
        # A session nobody used yet has no tasks (and the daemon does not know it).
        with contextlib.suppress(SessionNotFound, NotFound):
            tasks += await client.tasks(sid, active=args.active)
    tasks.sort(key=lambda t: (t.get("created_at") or 0, t["task_id"]))
    if args.json:
        print_json(tasks)
        return 0
    plain = want_plain(args)
    headers = ["task", "session", "status", "outcome", "time", "command"]
    rows = [
        [
            t["task_id"],
            t["session_id"],
            t["status"],
            outcome_short(t),
            format_elapsed(t.get("running_ms")),
            t.get("description") or t["command"],
        ]
        for t in tasks
    ]
    if args.all:
        rows += await _pool_rows(client)
    # Cut the command so a row fits the terminal (piped: never cut).
    width = None
    if not plain:
        used = sum(
            max([len(h)] + [len(r[i]) for r in rows]) + 2 for i, h in enumerate(headers[:-1])
        )
        width = max(20, shutil.get_terminal_size().columns - used)
    for row in rows:
        row[-1] = one_line(row[-1], width)
    if not rows and not plain:
        where = "any open session" if args.all_sessions else f"session {sids[0]!r}"
        sys.stdout.write(f"no tasks in {where}\n")
        return 0
    print_table(headers, rows)
    return 0


async def _pool_rows(client: SandvisorClient) -> list[list[str]]:
    """A row per policy with warm containers ready (they belong to no task yet)."""
    pool = (await client.healthz()).get("pool") or {}
    ready: dict[str, int] = pool.get("ready") or {}
    return [
        ["pool", "-", "pool", f"{count} ready", "-", f"warm containers of policy {policy}"]
        for policy, count in sorted(ready.items())
        if count
    ]


# -- logs ---------------------------------------------------------------------------------


async def _read_until(
    client: SandvisorClient, sid: str, tid: str, start: int, end: int | None
) -> tuple[bytes, int, bool]:
    """Bytes from ``start`` up to ``end`` (None: what is there now), next offset, eof."""
    parts: list[bytes] = []
    offset, eof = start, False
    while end is None or offset < end:
        limit = READ_CHUNK if end is None else min(READ_CHUNK, end - offset)
        piece = await client.read_output(sid, tid, offset=offset, limit=limit)
        offset, eof = piece.next_offset, piece.eof
        if not piece.data:
            break
        parts.append(piece.data)
    return b"".join(parts), offset, eof


def _last_lines_start(data: bytes, lines: int) -> int | None:
    """Index in ``data`` where its last ``lines`` lines begin; None if it has fewer (a last
    line without a newline counts as a line)."""
    if lines == 0:
        return len(data)
    pos = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return None
    return pos + 1


async def _tail(
    client: SandvisorClient, sid: str, info: TaskJson, lines: int
) -> tuple[bytes, int, bool]:
    """The last ``lines`` lines, read backwards from the end in growing steps."""
    tid = str(info["task_id"])
    # output_bytes counts the command's bytes; the file can only be longer (gap markers),
    # and reading forward from the guess picks up the rest.
    step = 64 * 1024
    start = max(0, int(info.get("output_bytes") or 0) - step)
    data, next_offset, eof = await _read_until(client, sid, tid, start, None)
    while True:
        cut = _last_lines_start(data, lines)
        if cut is not None:
            return data[cut:], next_offset, eof
        if start == 0:
            return data, next_offset, eof
        step *= 4
        earlier = max(0, start - step)
        head, _, _ = await _read_until(client, sid, tid, earlier, start)
        data, start = head + data, earlier


def _json_chunk(info: TaskJson, data: bytes, offset: int, next_offset: int, eof: bool) -> str:
    try:
        text, lossy = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, lossy = data.decode("utf-8", "replace"), True
    body = {
        "task_id": info["task_id"],
        "session_id": info["session_id"],
        "offset": offset,
        "next_offset": next_offset,
        "eof": eof,
        "text": text,
        "lossy": lossy,
    }
    return json.dumps(body)


async def _logs(client: SandvisorClient, args: argparse.Namespace) -> int:
    sid, info = await locate_task(client, args, args.task_id)
    tid = str(info["task_id"])
    if args.json and not args.follow:
        if args.tail is not None:
            data, offset, eof = await _tail(client, sid, info, args.tail)
        else:
            data, offset, eof = await _read_until(client, sid, tid, 0, None)
        _emit(info, data, offset - len(data), offset, eof, as_json=True)
        return 0
    offset, eof = 0, False
    if args.tail is not None:
        data, offset, eof = await _tail(client, sid, info, args.tail)
        if data:
            _emit(info, data, offset - len(data), offset, eof, as_json=args.json)
        if not args.follow or eof:
            return 0
    # Without -f: what is there now. With -f: long-poll for more until the task has ended.
    async for piece in client.follow_output(sid, tid, offset, follow=args.follow):
        _emit(info, piece.data, piece.offset, piece.next_offset, piece.eof, as_json=args.json)
    return 0


def _emit(info: TaskJson, data: bytes, start: int, end: int, eof: bool, *, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(_json_chunk(info, data, start, end, eof) + "\n")
        sys.stdout.flush()
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


# -- stop ---------------------------------------------------------------------------------


async def _stop(client: SandvisorClient, args: argparse.Namespace) -> int:
    sid, info = await locate_task(client, args, args.task_id)
    try:
        final = await client.stop(sid, str(info["task_id"]))
    except TaskNotRunning as exc:
        if args.json:
            print_json(exc.info.model_dump(mode="json"))
        ended = exc.info.describe_end()
        raise CliError(f"task {args.task_id} had already ended ({ended})") from exc
    if args.json:
        print_json(final)
    else:
        sys.stdout.write(describe_end(final) + "\n")
    return 0


# -- input --------------------------------------------------------------------------------


async def _input(client: SandvisorClient, args: argparse.Namespace) -> int:
    if args.text == "-":
        data = sys.stdin.buffer.read()
    else:
        data = (args.text if args.no_newline else args.text + "\n").encode(
            "utf-8", "surrogateescape"
        )
    sid, info = await locate_task(client, args, args.task_id)
    # A task still being created has no stdin attached yet; the daemon would refuse.
    info = await wait_started(client, sid, info)
    await client.send_input(sid, str(info["task_id"]), data=data, eof=args.eof)
    return 0


# -- wait ---------------------------------------------------------------------------------


def _wait_checked(args: argparse.Namespace) -> int:
    if args.pattern is not None:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            return fail(f"argument --pattern: not a valid regular expression ({exc})", 2)
    return call(args, _wait)


async def _wait(client: SandvisorClient, args: argparse.Namespace) -> int:
    sid, info = await locate_task(client, args, args.task_id)
    tid = str(info["task_id"])
    if args.pattern is None:
        return await _wait_end(client, sid, tid, args)
    try:
        found = await client.wait_for(sid, tid, args.pattern, timeout_s=args.timeout)
    except TaskNotRunning as exc:
        if args.json:
            print_json({"matched": False, "timed_out": False, "ended": True, **exc.body})
        sys.stderr.write(f"sandvisor: {exc}\n")
        return 2
    if args.json:
        print_json(found)
    if not found["matched"]:
        sys.stderr.write(
            f"sandvisor: no line of task {tid} matched {args.pattern!r} within {args.timeout:g}s\n"
        )
        return 1
    if not args.json:
        sys.stdout.write(str(found["line"]) + "\n")
    return 0


async def _wait_end(client: SandvisorClient, sid: str, tid: str, args: argparse.Namespace) -> int:
    """Without --pattern: until the task ends (0) or time runs out (1)."""
    body = await client.wait(sid, tid, timeout_s=args.timeout)
    task = body["task"]
    if args.json:
        print_json(task if not body["timed_out"] else body)
    if body["timed_out"]:
        sys.stderr.write(
            f"sandvisor: task {tid} is still {task['status']} after {args.timeout:g}s\n"
        )
        return 1
    if not args.json:
        sys.stdout.write(describe_end(task) + "\n")
    return 0
