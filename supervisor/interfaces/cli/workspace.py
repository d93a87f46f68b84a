"""``sandvisor workspace``: review what a session's tasks changed in its project, then apply,
undo or discard it."""

from __future__ import annotations

import argparse
import base64
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from supervisor.core.errors import SessionNotFound
from supervisor.core.problems import InvalidRequest
from supervisor.core.visible import quote_name, visible
from supervisor.core.workspace_errors import NoBackup, NoWorkspace, WorkspaceBusy, WorkspaceConflict
from supervisor.core.workspace_pages import B64, PAGE_MAX, check_limit
from supervisor.interfaces.cli.common import HelpFormatter, print_json, print_table, want_plain
from supervisor.interfaces.cli.project import cwd, dir_session_id, explicit_session
from supervisor.interfaces.cli.remote import CliError, add_daemon_options, call, one_line
from supervisor.interfaces.http_errors import NotFound

if TYPE_CHECKING:
    from supervisor.interfaces.client import SandvisorClient

#: Paths a conflict error lists before it says how many more there are.
SHOWN_PATHS = 20

WORKSPACE_EPILOG = """\
A session opened on a project directory in overlay mode (what `sandvisor run` does in one) keeps
every write of its tasks in a layer of its own: the project on disk does not change until
you apply. Each subcommand acts on the current directory's session unless --session names
one; an ended session's changes stay reviewable (7 days by default).

examples:
  sandvisor run --policy dev -- 'python3 -m pytest -q && black .'
  sandvisor workspace changes          what the tasks added, modified, deleted
  sandvisor workspace diff | less      the same as a unified diff (git apply accepts it)
  sandvisor workspace apply            write them into the project (backed up)
  sandvisor workspace undo             put the project back as it was before the apply
  sandvisor workspace discard          drop them all
"""

CHANGES_EPILOG = """\
Columns: KIND (added, modified, deleted, replaced, mode), PATH, SIZE and NOTES: conflict
(the file changed on the host since the session started: apply refuses it without
--force), ignored (.gitignore and the default ignores such as node_modules and .venv:
apply leaves it out), binary, mode changes, symlink targets. Piped: tab-separated rows.
On a terminal, names and targets with control, bidi or invisible characters are quoted as
git quotes them ("a\\x1b[2Kb"); piped, they are printed exactly.

Like git status, it lists every change: the daemon answers in pages of 10000 (one
snapshot of the layer), read in turn, with the count on stderr while a long listing is
read. --limit N prints one page of N instead (1 to 10000), then how to get the next one
(--after PATH: the changes after PATH in the listing's order, by path). With --json: a
JSON list of every change; with --limit, the page as {"changes", "total", "next"}, where
"next" is the --after of the next page (null after the last).

examples:
  sandvisor workspace changes
  sandvisor workspace changes --ignored               also node_modules, .venv, build output...
  sandvisor workspace changes --session mcp-1a2b3c4d5e6f
  sandvisor workspace changes --json | jq -r '.[] | select(.conflict) | .path'
  sandvisor workspace changes --limit 100             the first 100, and the --after of the rest
  sandvisor workspace changes --limit 100 --after src/app.py
"""

DIFF_EPILOG = """\
What apply would write, as one unified diff with a/ and b/ paths relative to the project
(ignored changes and special files are left out; binary files as git binary patches;
files over 1 MiB as a comment with their sizes and sha256 unless --full; old content the
sandbox could not read as a comment). On a terminal, control characters (ESC, CR, ...),
bidi overrides and invisible characters show as \\x1b, \\x0d, \\u202e; piped or
redirected, the diff is byte-exact (git apply takes it).

examples:
  sandvisor workspace diff
  sandvisor workspace diff --full > agent.patch && git apply --check agent.patch
  sandvisor workspace diff --session mcp-1a2b3c4d5e6f | less
"""

APPLY_EPILOG = """\
Writes every change that is not ignored into the project on the host, atomically, as the
project's owner; what it overwrites or deletes is backed up first (`sandvisor workspace undo`).
It refuses, writing nothing, when a file it would touch changed on the host since the
session started (--force overwrites them; their old versions are backed up too), and while
the session's tasks run (--stop-tasks stops them first).

examples:
  sandvisor workspace apply
  sandvisor workspace apply --stop-tasks          the dev server is still running: stop it first
  sandvisor workspace apply --force               overwrite the conflicting host edits
  sandvisor workspace apply --session mcp-1a2b3c4d5e6f --json
"""

DISCARD_EPILOG = """\
Drops every change of the session's workspace, and the backups of earlier applies (no
undo after it). The project on disk is not touched. For an ended session, everything
kept of it goes.

examples:
  sandvisor workspace discard
  sandvisor workspace discard --stop-tasks
  sandvisor workspace discard --session mcp-1a2b3c4d5e6f
"""

UNDO_EPILOG = """\
Puts the project back as it was before the last apply: overwritten and deleted files
return from the backup, files the apply created are removed. The changes are pending
again. When files the apply wrote were edited on the host since, it refuses and changes
nothing; --force undoes the rest and leaves those as they are.

examples:
  sandvisor workspace undo
  sandvisor workspace undo --force
"""

Action = Callable[["SandvisorClient", argparse.Namespace, str], Awaitable[int]]


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ws = subs.add_parser(
        "workspace",
        help="review a session's changes to its project: changes, diff, apply, undo, discard",
        description="Review what a session's tasks changed in its overlay workspace, then "
        "apply it to the project, undo that, or discard it.",
        epilog=WORKSPACE_EPILOG,
        formatter_class=HelpFormatter,
    )

    def usage(_args: argparse.Namespace) -> int:
        ws.print_help()
        return 2

    ws.set_defaults(func=usage)
    wsubs = ws.add_subparsers(dest="workspace_command", metavar="SUBCOMMAND")

    def sub(name: str, help_text: str, epilog: str, action: Action) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = wsubs.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=epilog,
            formatter_class=HelpFormatter,
        )
        add_daemon_options(
            p,
            session_help="the session (default: $SANDVISOR_SESSION, else the current directory's)",
        )
        p.set_defaults(func=lambda a: call(a, _with_session(action)))
        return p

    changes = sub("changes", "list what the session's tasks changed", CHANGES_EPILOG, _changes)
    changes.add_argument(
        "--ignored", action="store_true", help="also list ignored changes (node_modules, ...)"
    )
    changes.add_argument("--json", action="store_true", help="a JSON list, one object a change")
    changes.add_argument(
        "--limit",
        type=_page_size,
        metavar="N",
        help=f"print one page of at most N changes (1 to {PAGE_MAX}) instead of all of them",
    )
    changes.add_argument(
        "--after",
        metavar="PATH",
        help="only the changes after PATH in the listing's order (a page's next cursor)",
    )
    diff = sub("diff", "show the changes as a unified diff", DIFF_EPILOG, _diff)
    diff.add_argument(
        "--full",
        action="store_true",
        help="also the content of files over 1 MiB (else their sizes and sha256)",
    )
    apply = sub("apply", "write the changes into the project on the host", APPLY_EPILOG, _apply)
    apply.add_argument(
        "--force", action="store_true", help="overwrite files changed on the host meanwhile"
    )
    apply.add_argument("--stop-tasks", action="store_true", help="stop the session's tasks first")
    apply.add_argument("--json", action="store_true", help="the result as JSON")
    discard = sub("discard", "drop every change", DISCARD_EPILOG, _discard)
    discard.add_argument("--stop-tasks", action="store_true", help="stop the session's tasks first")
    discard.add_argument("--json", action="store_true", help="the result as JSON")
    undo = sub("undo", "put the project back as it was before the last apply", UNDO_EPILOG, _undo)
    undo.add_argument(
        "--force",
        action="store_true",
        help="undo anyway, leaving files edited on the host since as they are",
    )
    undo.add_argument("--stop-tasks", action="store_true", help="stop the session's tasks first")
    undo.add_argument("--json", action="store_true", help="the result as JSON")


def _page_size(text: str) -> int:
    """``--limit``: a page size, or argparse's error naming the range."""
    try:
        return check_limit(int(text))
    except (ValueError, InvalidRequest):
        raise argparse.ArgumentTypeError(
            f"must be an integer from 1 to {PAGE_MAX} (got {text!r})"
        ) from None


def _with_session(
    action: Action,
) -> Callable[[SandvisorClient, argparse.Namespace], Awaitable[int]]:
    """The action on the named session (or the current directory's), its errors as
    sentences that say what to do."""

    async def run(client: SandvisorClient, args: argparse.Namespace) -> int:
        named = explicit_session(args)
        sid = named or dir_session_id(cwd())
        try:
            return await action(client, args, sid)
        except (SessionNotFound, NotFound) as exc:
            if named:
                raise CliError(f"no open session {sid!r}, and no changes of it are kept") from exc
            raise CliError(
                f"no session for {cwd()} ({sid}): `sandvisor run` in this directory opens one; "
                "or name one with --session S (sandvisor session list)"
            ) from exc
        except NoWorkspace as exc:
            raise CliError(f"session {sid!r} has no workspace (it was opened without one)") from exc
        except WorkspaceBusy as exc:
            what = str(args.workspace_command)
            ids = ", ".join(exc.task_ids) or "some"
            raise CliError(
                f"cannot {what}: session {sid} still runs {len(exc.task_ids) or 'some'} task(s): "
                f"{ids} (see sandvisor ps --session {sid}); stop them, or pass --stop-tasks to "
                "stop them first"
            ) from exc
        except WorkspaceConflict as exc:
            raise CliError(_conflict_text(str(args.workspace_command), exc.paths)) from exc
        except NoBackup as exc:
            raise CliError(f"nothing to undo: no apply of session {sid} is left to undo") from exc

    return run


def _conflict_text(what: str, paths: list[str]) -> str:
    since = "the apply" if what == "undo" else "the session started"
    lines = [f"{what} refused, nothing was written: {len(paths)} path(s) changed on the host "]
    lines[0] += f"since {since}:"
    shown = quote_name if sys.stderr.isatty() else _plain_text
    lines += [f"  {shown(p)}" for p in paths[:SHOWN_PATHS]]
    if len(paths) > SHOWN_PATHS:
        lines.append(f"  ... and {len(paths) - SHOWN_PATHS} more")
    if what == "undo":
        lines.append("--force undoes the rest and leaves these as they are")
    else:
        lines.append(
            "review them (sandvisor workspace diff), then --force overwrites them (their host "
            "versions are backed up: sandvisor workspace undo restores them)"
        )
    return "\n".join(lines)


# -- changes and diff ---------------------------------------------------------------------


def _size(n: int | None, plain: bool) -> str:
    if n is None:
        return ""
    if plain or n < 1024:
        return str(n)
    for unit in ("KiB", "MiB", "GiB"):
        n_f = n / 1024
        if n_f < 1024 or unit == "GiB":
            return f"{n_f:.1f} {unit}"
        n = int(n_f)
    return str(n)  # pragma: no cover - the loop always returns


def _plain_text(text: str) -> str:
    return text


def _terminal_text(text: str) -> str:
    return visible(text)


def _notes(
    change: dict[str, Any],
    name: Callable[[str], str] = _plain_text,
    text: Callable[[str], str] = _plain_text,
) -> str:
    """The NOTES cell; ``name`` shows a file name (a symlink's target), ``text`` the rest."""
    notes = []
    if change.get("conflict"):
        notes.append(f"CONFLICT: {text(change.get('conflict_reason') or 'changed on the host')}")
    if change.get("ignored"):
        notes.append("ignored")
    if change.get("binary"):
        notes.append("binary")
    old, new = change.get("old_mode"), change.get("new_mode")
    if change.get("kind") in ("mode", "modified") and old is not None and new not in (None, old):
        notes.append(f"mode {old:o} -> {new:o}")
    if change.get("file_type") == "symlink" and change.get("target") is not None:
        notes.append(f"-> {name(change['target'])}")
    if change.get("kind") == "replaced" and change.get("old_type"):
        notes.append(f"was a {change['old_type']}")
    if change.get("note"):
        notes.append(text(str(change["note"])))
    return "; ".join(notes)


def _progress() -> Callable[[int, int], None]:
    """``on_page`` for a listing read page by page: the count on stderr (a terminal's) while
    a listing of more than one page is read, erased when it is done."""
    shown = [False]

    def step(listed: int, total: int) -> None:
        if not sys.stderr.isatty() or total <= PAGE_MAX:
            return
        done = listed >= total
        if done and not shown[0]:
            return
        sys.stderr.write("\r\x1b[K" if done else f"\rsandvisor: listed {listed} of {total} changes")
        sys.stderr.flush()
        shown[0] = not done

    return step


def _cursor_arg(cursor: str) -> str:
    """The ``--after`` of the next page, as a shell word that cannot drive the terminal: a
    name with control or invisible characters goes as ``b64:`` and its bytes' base64."""
    if not cursor.startswith(B64) and visible(cursor) != cursor:
        cursor = B64 + base64.b64encode(os.fsencode(cursor)).decode()
    return shlex.quote(cursor)


async def _changes(client: SandvisorClient, args: argparse.Namespace, sid: str) -> int:
    page: dict[str, Any] | None = None
    if args.limit is None:
        found = await client.workspace_changes(
            sid, ignored=args.ignored, after=args.after, on_page=_progress()
        )
    else:
        page = await client.workspace_changes_page(
            sid, ignored=args.ignored, limit=args.limit, after=args.after
        )
        found = page["changes"]
    if args.json:
        print_json(found if page is None else page)
        return 0
    plain = want_plain(args)
    following = None if page is None else page.get("next")
    more = ""
    if page is not None and following is not None:
        more = (
            f"{len(found)} of {page['total']} change(s) listed; the next page: sandvisor workspace "
            f"changes{_session_flag(args, sid)} --limit {args.limit} --after "
            f"{_cursor_arg(following)}\n"
        )
    if not found:
        if not plain:
            after = "" if args.after is None else " after that path"
            sys.stdout.write(f"no changes{after} in the workspace of session {sid}\n")
        return 0
    # Piped: the names exactly (tab-separated rows for scripts). On a terminal: quoted as git
    # quotes them, so a name cannot drive the terminal (OSC 52, erase line) or reorder text.
    name, text = (_plain_text, _plain_text) if plain else (quote_name, _terminal_text)
    rows = []
    for c in found:
        path = name(c["path"]) + ("/" if c.get("file_type") == "dir" else "")
        size = None if c.get("file_type") == "dir" or c.get("kind") == "deleted" else c["size"]
        rows.append([c["kind"], path, _size(size, plain), one_line(_notes(c, name, text), None)])
    print_table(["kind", "path", "size", "notes"], rows)
    if plain:
        if following is not None:  # stdout stays the rows
            sys.stderr.write(f"sandvisor: {more}")
        return 0
    conflicts = sum(1 for c in found if c.get("conflict"))
    tail = f", {conflicts} in conflict with host edits" if conflicts else ""
    if following is not None:
        sys.stdout.write(f"\n{more}")
    sys.stdout.write(
        f"\n{len(found)} change(s){tail}. Review: sandvisor workspace diff; keep them: "
        f"sandvisor workspace apply{_session_flag(args, sid)}\n"
    )
    return 0


def _session_flag(args: argparse.Namespace, sid: str) -> str:
    return f" --session {sid}" if explicit_session(args) else ""


async def _diff(client: SandvisorClient, args: argparse.Namespace, sid: str) -> int:
    text = await client.workspace_diff(sid, full=args.full)
    if sys.stdout.isatty():
        # For a person: nothing in a file (its name, its content) may drive the terminal.
        # Tab and newline stay; everything else unsafe shows as \x1b, \x0d, \u202e, ...
        text = visible(text, keep="\t\n")
    out = sys.stdout.buffer
    out.write(text.encode("utf-8", "surrogateescape"))
    out.flush()
    if not text and sys.stderr.isatty():
        sys.stderr.write(f"sandvisor: no changes to show in the workspace of session {sid}\n")
    return 0


# -- apply, discard, undo -----------------------------------------------------------------


def _names(paths: list[str]) -> list[str]:
    """Paths for the messages on stdout: quoted as git quotes them on a terminal."""
    return [quote_name(p) for p in paths] if sys.stdout.isatty() else list(paths)


async def _apply(client: SandvisorClient, args: argparse.Namespace, sid: str) -> int:
    # What apply writes is what this listing shows (every page of it): a task stopped by
    # --stop-tasks that writes on its way out makes the apply refuse (nothing written), never
    # slip in.
    review = client.reviewed(await client.workspace_changes(sid, on_page=_progress()))
    result = await client.apply_changes(
        sid, force=args.force, stop_tasks=args.stop_tasks, reviewed=review
    )
    if args.json:
        print_json(result)
        return 0
    applied = result.get("applied", [])
    if not applied:
        sys.stdout.write(f"nothing to apply in the workspace of session {sid}\n")
    else:
        sys.stdout.write(
            f"applied {len(applied)} change(s) to the project: {result['created']} created, "
            f"{result['overwritten']} overwritten, {result['deleted']} deleted, "
            f"{result['mode_changed']} mode change(s); {result['bytes_written']} bytes written\n"
        )
    forced = result.get("forced", [])
    if forced:
        listed = ", ".join(_names(forced[:10]))
        sys.stdout.write(f"overwrote {len(forced)} host edit(s): {listed}\n")
    skipped = result.get("skipped", [])
    if skipped:
        reasons: dict[str, int] = {}
        for s in skipped:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        said = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in sorted(reasons.items()))
        sys.stdout.write(f"left out: {said} (sandvisor workspace changes --ignored lists them)\n")
    if applied:
        sys.stdout.write(f"undo: sandvisor workspace undo{_session_flag(args, sid)}\n")
    return 0


async def _discard(client: SandvisorClient, args: argparse.Namespace, sid: str) -> int:
    await client.discard_changes(sid, stop_tasks=args.stop_tasks)
    if args.json:
        print_json({"session_id": sid, "discarded": True})
    else:
        sys.stdout.write(f"discarded every change in the workspace of session {sid}\n")
    return 0


async def _undo(client: SandvisorClient, args: argparse.Namespace, sid: str) -> int:
    result = await client.undo_apply(sid, force=args.force, stop_tasks=args.stop_tasks)
    if args.json:
        print_json(result)
        return 0
    restored, removed, kept = result["restored"], result["removed"], result["kept"]
    sys.stdout.write(
        f"undid the last apply: {len(restored)} path(s) restored, {len(removed)} removed "
        "(the applied changes are not pending again: rerun the task to get them back)\n"
    )
    if kept:
        sys.stdout.write(
            f"left {len(kept)} path(s) edited on the host since as they are: "
            f"{', '.join(_names(kept))}\n"
        )
    return 0
