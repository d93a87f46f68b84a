"""What the agent reads about its workspace: the server's instructions and the ``bash``
description (both say what persists between calls, which depends on the workspace), the
workspace tools' descriptions and arguments, and their results."""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

from pydantic import Field

from supervisor.core.text import format_duration
from supervisor.interfaces.mcp.specs import POLL_TAIL_CHARS
from supervisor.interfaces.mcp.texts import MAX_OUTPUT_CHARS

#: Changes in one ``workspace_changes`` result (a page; the result gives the next one's
#: ``after``).
MAX_LISTED: Final = 200

#: A workspace as the daemon describes it (``WorkspaceInfo``): path, container_path, mode...
WorkspaceJson = dict[str, Any]

_NETWORK = (
    "Network: none under the default policy. Under a policy with the session network (the "
    "`dev` policy), the tasks of this session reach each other by task id and nothing else: "
    "a server started in the background as bg-1a2b3c4d listening on port 3000 answers at "
    "http://bg-1a2b3c4d:3000/ from another call."
)


def persistence(ws: WorkspaceJson | None) -> str:
    """What survives from one call to the next."""
    if ws is None:
        return (
            "There is no project directory: each call is a new container and nothing "
            "persists between calls (files written in one call are not seen by the next)."
        )
    where = ws["container_path"]
    fresh = "/tmp and HOME are fresh in every call."
    if ws["mode"] == "ro":
        return (
            f"Each call is a new container working in the project directory {where}, which "
            f"is read-only: writes to it fail, and nothing persists between calls. {fresh}"
        )
    kept = (
        f"Each call is a new container working in the project directory {where} (the same "
        "path as on the host). That directory and everything written in it persist between "
        "calls (source edits, a .venv, node_modules, build output)"
    )
    if ws["mode"] == "rw":
        return f"{kept}; writes go straight to the project on the host. {fresh}"
    return (
        f"{kept}, in a copy-on-write layer of this session: the project on the host stays "
        "unchanged until the user reviews and applies your changes (`workspace_changes` "
        f"shows them). {fresh}"
    )


def instructions(ws: WorkspaceJson | None) -> str:
    """The server's instructions for this session."""
    reach = (
        "Nothing you run can touch the host except the project directory."
        if ws is not None and ws["mode"] == "rw"
        else "Nothing you run can touch the host."
    )
    return f"""\
Every command runs in its own fresh, hardened Docker sandbox (read-only root filesystem, \
non-root user, capped memory/CPU/processes). {reach} {persistence(ws)} {_NETWORK}

Use `bash` for short commands (it waits and returns output and exit code) and \
`bash` with run_in_background=true for dev servers, watchers, builds and long test runs: it \
returns at once with a task id and the output file. Then use `task_wait` (for a line such \
as "ready"), `task_output`, `task_input` and `task_stop`; `tail_every_minutes` sends you \
its latest output periodically while you work on. `monitor_start` runs a command whose \
every stdout line is reported to you.

Notifications about background tasks (completion, periodic log tails, stalls on input, \
monitor lines) are appended to the result of whichever tool you call next, each exactly \
once, as <task-notification>, <background_task_poll> and <task-output> blocks. Everything \
still running is stopped when this connection closes."""


def _foreground(auto_background_s: float) -> str:
    """What a foreground command does, with or without auto-backgrounding."""
    if auto_background_s <= 0:
        return (
            "- Foreground (default): waits for the command to finish and returns its output "
            "(stdout+stderr merged, truncated to 30000 characters with a note) and exit code. "
            "The command is killed after `timeout` ms (default 120000, max 600000). Stdin is "
            "closed."
        )
    after = format_duration(round(auto_background_s * 1000))
    return (
        "- Foreground (default): waits for the command to finish and returns its output "
        "(stdout+stderr merged, truncated to 30000 characters with a note) and exit code. "
        f"Stdin is closed. A command still running after {after} is not killed: it is moved "
        "to the background, and the result gives what it printed so far, its task id and "
        "output file; it then runs on like a background command (its completion comes as a "
        "<task-notification>). `timeout` (ms, max 600000), when given, kills it after that "
        "long wherever it runs; without it there is no time limit."
    )


def bash_description(ws: WorkspaceJson | None, auto_background_s: float = 30.0) -> str:
    """The ``bash`` tool's description for this session (``auto_background_s``: after how
    long a foreground command moves to the background; 0: never)."""
    return f"""\
Run a shell command (`sh -c`) in a fresh, isolated sandbox container.

{_foreground(auto_background_s)}
- run_in_background=true: returns at once with the task id and the output file path. \
The command runs until it exits, `task_stop`, or the end of the session (a `timeout` given \
explicitly still applies; persistent=false gives it the policy's default timeout instead). \
You get a <task-notification> when it ends (in the result of a later tool call), so you \
need not poll; use `task_wait` to wait for a line such as "ready" or for the end when your \
next step depends on it, `task_output` to read output, `task_input` to answer prompts.
- tail_every_minutes=N: while the command runs, every N minutes (fractions allowed) \
you get a <background_task_poll> block with the last {POLL_TAIL_CHARS} characters of its \
output, only when it printed something new. Use it to keep an eye on long jobs (builds, \
test suites, CI, training runs, dev servers) while you do other work, instead of calling \
task_output repeatedly; polls stop when it ends.

{persistence(ws)}

{_NETWORK}"""


WORKSPACE_CHANGES_DESCRIPTION = (
    "Show what your commands changed in the project directory and have not been applied to "
    "the project on the host yet: each added, modified, deleted or re-moded file, then the "
    f"changes as a unified diff (bounded in size). {MAX_LISTED} changes at a time, sorted by "
    "path: when there are more, the result ends with the `after` value that gives the next "
    "ones. Read-only: applying them is the user's decision."
)
WORKSPACE_APPLY_DESCRIPTION = (
    "Apply your changes to the project on the host (what workspace_changes shows, ignored "
    "files such as node_modules or .venv left out). Overwritten files are backed up, so the "
    "user can undo it. Refuses when files changed on the host meanwhile (force overwrites "
    "them) or while your background tasks run (stop_tasks stops them first)."
)

IncludeDiff = Annotated[
    bool, Field(description="Also return the changes as a unified diff (default true).")
]
After = Annotated[
    str | None,
    Field(
        description="Only the changes after this one (the `after` value the previous "
        "result gave, exactly as given); omitted: from the first.",
        max_length=8192,
    ),
]
IncludeIgnored = Annotated[
    bool,
    Field(description="Also list ignored changes (node_modules, .venv, build output...)."),
]
Force = Annotated[
    bool, Field(description="Overwrite files changed on the host since the session started.")
]
StopTasks = Annotated[
    bool, Field(description="Stop this session's running background tasks first.")
]


def no_workspace_note(path: str, why: str) -> str:
    """For the agent's first tool result when the server runs without a workspace."""
    return (
        f"[sandvisor: this session has no workspace: {path} {why}. Commands run in a scratch "
        "directory and nothing persists between calls. The user can start the server in a "
        "project directory, or allow it with `sandvisor serve --workspace-root DIR`.]"
    )


def _line(c: dict[str, Any]) -> str:
    path = c["path"] + ("/" if c.get("file_type") == "dir" else "")
    extra = []
    if c.get("file_type") == "file" and c.get("kind") != "deleted":
        extra.append(f"{c.get('size', 0)} bytes")
    if c.get("file_type") == "symlink" and c.get("target") is not None:
        extra.append(f"symlink to {c['target']}")
    if c.get("conflict"):
        extra.append("CONFLICT: " + str(c.get("conflict_reason") or "changed on the host"))
    if c.get("ignored"):
        extra.append("ignored")
    if c.get("note"):
        extra.append(str(c["note"]))
    tail = f" ({'; '.join(extra)})" if extra else ""
    return f"{c['kind']:<9} {path}{tail}"


def changes_text(
    ws: WorkspaceJson,
    session_id: str,
    page: dict[str, Any],
    diff: str | None,
    after: str | None = None,
) -> str:
    """A ``workspace_changes`` result: one page of the list, then its diff, within
    MAX_OUTPUT_CHARS, then the ``after`` of the next page when there is one."""
    where = f"Workspace {ws['path']} (overlay, session {session_id})"
    apply_hint = (
        f"Applying them to the project is the user's decision (`sandvisor workspace apply "
        f"--session {session_id}`)."
    )
    found: list[dict[str, Any]] = page["changes"]
    total, following = int(page["total"]), page.get("next")
    if not found:
        if after is not None:
            return f"{where}: no changes after {json.dumps(after)} ({total} in all)."
        return f"{where}: no changes that are not applied yet."
    conflicts = sum(1 for c in found if c.get("conflict"))
    head = f"{where}: {total} change(s) not applied to the project yet"
    if after is not None or following is not None:
        head += f"; {len(found)} of them here, sorted by path"
        head += f", after {json.dumps(after)}" if after is not None else ""
    head += f", {conflicts} in conflict with edits made on the host meanwhile" if conflicts else ""
    lines = [head + ":"]
    lines += [_line(c) for c in found]
    more = ""
    if following is not None:
        more = (
            f"More changes follow: call workspace_changes with after={json.dumps(following)} "
            "for the next ones."
        )
    text = "\n".join(lines)
    if diff is not None:
        room = MAX_OUTPUT_CHARS - len(text) - len(apply_hint) - len(more) - 200
        if not diff:
            text += "\n\n(the diff is empty: only directories or special files changed)"
        elif len(diff) <= room:
            text += f"\n\n--- diff ---\n{diff.rstrip()}"
        else:
            cut = diff[: max(room, 0)]
            cut = cut[: cut.rfind("\n") + 1] if "\n" in cut else cut
            text += (
                f"\n\n--- diff (first {len(cut)} of {len(diff)} characters) ---\n{cut.rstrip()}"
                "\n[... diff truncated; the user sees all of it with `sandvisor workspace diff "
                f"--session {session_id}` ...]"
            )
    return f"{text}\n\n{more + chr(10) if more else ''}{apply_hint}"


def not_reviewable(ws: WorkspaceJson | None) -> str | None:
    """Why a workspace has no changes to show, or None when it has (overlay)."""
    if ws is None:
        return (
            "This session has no workspace: commands run in a scratch directory, so there "
            "are no changes to a project to show."
        )
    if ws["mode"] == "ro":
        return f"The workspace {ws['path']} is read-only: nothing in it can change."
    if ws["mode"] == "rw":
        return (
            f"The workspace {ws['path']} is mounted read-write: your writes went straight "
            "to the project on the host (use `git status` / `git diff` there)."
        )
    return None


def applied_text(result: dict[str, Any], session_id: str) -> str:
    """A ``workspace_apply`` result."""
    applied = result.get("applied", [])
    if not applied:
        return "Nothing to apply: the project on the host already has every change."
    text = (
        f"Applied {len(applied)} change(s) to the project on the host: "
        f"{result['created']} created, {result['overwritten']} overwritten, "
        f"{result['deleted']} deleted, {result['mode_changed']} mode change(s)."
    )
    if result.get("forced"):
        text += f" Overwrote host edits of: {', '.join(result['forced'][:20])}."
    skipped = result.get("skipped", [])
    if skipped:
        text += f" Left out {len(skipped)} ignored or special path(s)."
    return text + (f" The user can undo it with `sandvisor workspace undo --session {session_id}`.")
