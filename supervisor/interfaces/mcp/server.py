"""``sbx mcp``: an MCP server over stdio; one MCP connection is one supervisor session.

The server is a client of the daemon (``SbxClient``). At start-up it opens a fresh session
with a random id; when the connection closes (stdin EOF) or on SIGTERM it ends the session,
which stops and removes every container the agent started.

Notifications reach the agent two ways:

* appended to EVERY tool result as ``<task-notification>`` / ``<background_task_poll>`` /
  ``<task-output>`` blocks, drained through the daemon's per-consumer cursor
  (``/notifications/pending`` then ``/notifications/ack``). This is the exactly-once channel.
* as MCP log notifications (``notifications/message``) while they happen, from a background
  task following the session's events. Best-effort: a client may drop or hide them.

No ``from __future__ import annotations``: the SDK builds the tools' input schemas from the
signatures of the tool functions, defined inside ``build_server``.
"""

import base64
import codecs
import contextlib
import os
import re
import secrets
import signal
import sys
import threading
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import anyio
import httpx
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import Field

from supervisor.core.events import EVENT_ADAPTER, NOTIFY_TYPES, TaskFailed, TaskStalled, TaskStopped
from supervisor.core.models import TaskInfo
from supervisor.core.render import duration_text, render_xml
from supervisor.interfaces.client import ApiError, DaemonNotRunning, SbxClient, ensure_daemon

#: Claude Code's Bash tool truncates at 30000 characters; models are used to that size.
MAX_OUTPUT_CHARS: Final = 30_000
#: Of a truncated foreground output, this much of the start is kept (the rest from the end).
HEAD_CHARS: Final = 8_000
#: Bytes ``task_output`` reads per call.
READ_BYTES: Final = 30_000
#: Characters of notification blocks appended to one tool result; the rest waits.
NOTIFY_MAX_CHARS: Final = 20_000
#: Extra time a foreground wait allows after the command's timeout (grace period, removal).
FOREGROUND_SLACK_S: Final = 30.0
#: How long ending the session may take when the connection closes.
END_TIMEOUT_S: Final = 60.0
#: Long-poll length for the log-notification follower.
FOLLOW_WAIT_S: Final = 25.0
_SESSION_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_LOG_LEVELS: Final[tuple[types.LoggingLevel, ...]] = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)

INSTRUCTIONS = """\
Every command runs in its own fresh, hardened Docker sandbox (no network, read-only root \
filesystem, non-root user, capped memory/CPU/processes; /tmp and the working directory are \
writable scratch space). Nothing you run can touch the host.

Use `bash` for short commands (it waits and returns output and exit code) and \
`bash` with run_in_background=true for dev servers, watchers, builds and long test runs: it \
returns at once with a task id and the output file. Then use `task_wait` (for a line such \
as "ready"), `task_output`, `task_input` and `task_stop`. `monitor_start` runs a command \
whose every stdout line is reported to you.

Notifications about background tasks (completion, periodic log tails, stalls on input, \
monitor lines) are appended to the result of whichever tool you call next, each exactly \
once, as <task-notification>, <background_task_poll> and <task-output> blocks. Everything \
still running is stopped when this connection closes."""

BASH_DESCRIPTION = """\
Run a shell command (`sh -c`) in a fresh, isolated sandbox container.

- Foreground (default): waits for the command to finish and returns its output \
(stdout+stderr merged, truncated to 30000 characters with a note) and exit code. The \
command is killed after `timeout` ms (default 120000, max 600000). Stdin is closed.
- run_in_background=true: returns at once with the task id and the output file path. \
The command runs until it exits, `task_stop`, or the end of the session (a `timeout` given \
explicitly still applies). You get a <task-notification> when it ends (in the result of a \
later tool call), so you need not poll; use `task_wait` to wait for a line such as \
"ready", `task_output` to read output, `task_input` to answer prompts.

Each call is a new container: files written in one call are not seen by the next, and \
there is no network access by default."""


# -- argument types (module level: the SDK resolves annotations from the module) ---------

TaskId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        description="The task id returned by bash (run_in_background) or monitor_start, "
        "e.g. bg-7f3a9c2e.",
    ),
]
Command = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128 * 1024,
        description="The shell command, run as `sh -c COMMAND` in the sandbox image.",
    ),
]
Description = Annotated[
    str,
    Field(
        max_length=500,
        description="Short label (5-10 words) used in notifications, e.g. 'dev server'.",
    ),
]
BashTimeout = Annotated[
    int,
    Field(
        ge=1,
        le=600_000,
        description="Milliseconds before the command is killed (max 600000). Background "
        "commands ignore the default and run until stopped unless a timeout is given.",
    ),
]
MonitorTimeout = Annotated[
    int,
    Field(
        ge=1,
        le=3_600_000,
        description="Milliseconds before the monitor is stopped (default 300000 = 5 min, "
        "max 3600000 = 1 h). Ignored when persistent is true.",
    ),
]
WaitTimeout = Annotated[
    int,
    Field(ge=1, le=600_000, description="How long to wait, in milliseconds (max 600000)."),
]
# Optional arguments: the description sits on the outer type so that it is a top-level
# key of the property's schema (next to anyOf), where clients and models look for it.
Offset = Annotated[
    Annotated[int, Field(ge=0)] | None,
    Field(
        description="Byte offset in the output file to read from (default 0 = the start; pass "
        "the next_offset of the previous call to read on). Not together with tail.",
    ),
]
TailChars = Annotated[
    Annotated[int, Field(ge=1, le=MAX_OUTPUT_CHARS)] | None,
    Field(description="Return only the last N characters (max 30000). Not together with offset."),
]
LineFilter = Annotated[
    Annotated[str, Field(min_length=1, max_length=10_000)] | None,
    Field(description="Regular expression (Python syntax); only lines matching it are returned."),
]
Pattern = Annotated[
    Annotated[str, Field(min_length=1, max_length=10_000)] | None,
    Field(
        description="Regular expression (Python syntax) searched in each output line; lines "
        "printed before the call count too. Omit to wait for the task to end.",
    ),
]
InputText = Annotated[
    str,
    Field(
        max_length=1024 * 1024,
        description="Text written to the task's stdin as is (include the newline, e.g. 'y\\n').",
    ),
]


class ToolInputError(Exception):
    """Arguments the schema accepts but that make no sense together."""


@dataclass
class McpOptions:
    """What ``sbx mcp`` is told."""

    state_dir: Path | None = None
    session_prefix: str = "mcp"
    policy: str | None = None


def _level_for(ev: Any) -> types.LoggingLevel:
    if isinstance(ev, TaskFailed):
        return "error"
    if isinstance(ev, TaskStalled):
        return "warning"
    if isinstance(ev, TaskStopped):
        return "notice"
    return "info"


def _label(info: dict[str, Any]) -> str:
    return str(info.get("description") or info.get("command") or "")


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f} s"


def _describe_end(info: dict[str, Any]) -> str:
    """``completed, exit code 0`` / ``killed, user stopped`` / ``failed: image missing``."""
    return TaskInfo.model_validate(info).describe_end()


def _decode(data: bytes, final: bool) -> tuple[str, int]:
    """UTF-8 text of ``data`` and how many bytes it covers: an incomplete character at the
    end of a read that is not final is left for the next read instead of becoming U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=final)
    pending = len(decoder.getstate()[0])
    return text, len(data) - pending


def _api_error_text(exc: ApiError) -> str:
    return f"Error ({exc.code}): {exc}"


class SessionBridge:
    """One MCP connection's session on the daemon: tool logic, the exactly-once notification
    drain, and the follower that mirrors notifications as MCP log messages."""

    def __init__(self, client: SbxClient, session_id: str, policy: str | None = None) -> None:
        self.client = client
        self.session_id = session_id
        self.policy = policy
        self.consumer = f"mcp-{session_id}"
        #: Foreground tasks: their result is the tool result itself, so their lifecycle
        #: notifications are acknowledged but not shown again.
        self.foreground: set[str] = set()
        self.min_log_level: types.LoggingLevel = "debug"
        self._mcp_session: ServerSession | None = None
        self._drain_lock = anyio.Lock()
        self._ended = False

    # -- plumbing -------------------------------------------------------------------------

    def attach(self, session: ServerSession) -> None:
        """Remember the connection's session so the follower can send log notifications."""
        if self._mcp_session is None:
            self._mcp_session = session

    async def run_tool(
        self, ctx: Context, action: Callable[[], Awaitable[str]]
    ) -> types.CallToolResult:
        """Run one tool body; API failures become tool errors; notifications are appended."""
        self.attach(ctx.session)
        is_error = False
        try:
            text = await action()
        except ApiError as exc:
            text, is_error = _api_error_text(exc), True
        except ToolInputError as exc:
            text, is_error = f"Error (invalid_request): {exc}", True
        except DaemonNotRunning as exc:
            text, is_error = (
                f"Error (daemon_unavailable): the sbx daemon does not answer ({exc})",
                True,
            )
        except httpx.HTTPError as exc:
            text, is_error = (
                f"Error (daemon_error): request to the sbx daemon failed ({exc!r})",
                True,
            )
        notes = await self.drain()
        if notes:
            text = f"{text}\n\n{notes}"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=is_error
        )

    async def drain(self) -> str:
        """Pending notification blocks for this connection, each exactly once.

        Reads what the consumer has not acknowledged, keeps what fits, acknowledges exactly
        what is kept, and returns it. Serialized: parallel tool calls never share a block.
        If the acknowledgement fails nothing is returned, so it all comes again next time."""
        async with self._drain_lock:
            try:
                body = await self.client.pending(self.session_id, self.consumer, fmt="xml")
            except (ApiError, DaemonNotRunning, httpx.HTTPError) as exc:
                _warn(f"could not fetch notifications: {exc}")
                return ""
            acked = int(body["acked"])
            ack = int(body["cursor"])
            blocks: list[str] = []
            size = 0
            held_back = 0
            last_seq = acked
            for item in body["notifications"]:
                xml = item.get("xml")
                if not xml or item.get("task_id") in self.foreground:
                    continue
                if blocks and size + len(xml) > NOTIFY_MAX_CHARS:
                    # Acknowledge only up to the last block shown; the rest comes next time.
                    held_back = sum(
                        1
                        for later in body["notifications"]
                        if later["seq"] >= item["seq"]
                        and later.get("xml")
                        and later.get("task_id") not in self.foreground
                    )
                    ack = last_seq
                    break
                blocks.append(str(xml))
                size += len(xml)
                last_seq = int(item["seq"])
            if ack > acked:
                try:
                    await self.client.ack(self.session_id, self.consumer, ack)
                except (ApiError, DaemonNotRunning, httpx.HTTPError) as exc:
                    _warn(f"could not acknowledge notifications: {exc}")
                    return ""
            if held_back:
                blocks.append(
                    f"[{held_back} more notification(s) pending; they follow in the result of "
                    "your next tool call]"
                )
            return "\n".join(blocks)

    async def _start(self, spec: dict[str, Any]) -> dict[str, Any]:
        if self.policy is not None:
            spec = {"policy": self.policy, **spec}
        try:
            return await self.client.start(self.session_id, spec)
        except ApiError as exc:
            # A policy without persistent tasks: run with its default timeout instead.
            if spec.get("persistent") and str(exc).startswith("persistent:"):
                spec = {k: v for k, v in spec.items() if k != "persistent"}
                return await self.client.start(self.session_id, spec)
            raise

    async def _stop_quietly(self, task_id: str) -> dict[str, Any] | None:
        try:
            return await self.client.stop(self.session_id, task_id)
        except ApiError as exc:
            task = exc.body.get("error", {}).get("task")
            return dict(task) if isinstance(task, dict) else None

    # -- tools ----------------------------------------------------------------------------

    async def bash(
        self,
        command: str,
        description: str,
        timeout_ms: int,
        run_in_background: bool,
        timeout_given: bool,
    ) -> str:
        if run_in_background:
            spec: dict[str, Any] = {"command": command, "description": description}
            if timeout_given:
                spec["timeout_ms"] = timeout_ms
            else:
                spec["persistent"] = True
            info = await self._start(spec)
            return (
                f"Command running in background with ID: {info['task_id']}. "
                f"Output is being written to: {info['output_path']}\n"
                "You will get a <task-notification> when it ends. Use task_wait to wait for a "
                "line (e.g. pattern='ready'), task_output to read its output, task_stop to "
                "stop it."
            )
        spec = {
            "command": command,
            "description": description,
            "timeout_ms": timeout_ms,
            "stdin": "closed",
        }
        info = await self._start(spec)
        task_id = str(info["task_id"])
        self.foreground.add(task_id)
        try:
            waited = await self.client.wait(
                self.session_id, task_id, timeout_s=timeout_ms / 1000 + FOREGROUND_SLACK_S
            )
            final = dict(waited["task"])
            if waited["timed_out"]:
                final = await self._stop_quietly(task_id) or final
        except BaseException:
            # Cancelled by the client (or the daemon went away): do not leave it running.
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(30),
                contextlib.suppress(Exception),
            ):
                await self._stop_quietly(task_id)
            raise
        if final["status"] == "failed" and final.get("reason") is None:
            raise ApiError(
                500,
                str(final.get("error_code") or "task_failed"),
                f"the command could not be started: {final.get('error') or 'unknown error'}",
                {},
            )
        output = await self._foreground_output(final)
        reason = final.get("reason")
        if reason == "exit":
            trailer = f"Exit code: {final.get('exit_code')}"
        elif reason == "timeout":
            trailer = (
                f"Command timed out after {duration_text(timeout_ms)} and was killed "
                f"(exit code {final.get('exit_code')})."
            )
        else:
            trailer = f"Command ended: {_describe_end(final)}."
        return f"{output}\n{trailer}" if output else f"(no output)\n{trailer}"

    async def _foreground_output(self, final: dict[str, Any]) -> str:
        task_id = str(final["task_id"])
        total = int(final.get("output_bytes") or 0)
        if total == 0:
            return ""
        if total <= MAX_OUTPUT_CHARS:
            raw = await self.client.output(self.session_id, task_id, limit=total + 1)
            return str(raw["text"]).rstrip("\n")
        head_raw = await self.client.output(
            self.session_id, task_id, limit=HEAD_CHARS, encoding="base64"
        )
        head, _ = _decode(base64.b64decode(head_raw["data_b64"]), final=False)
        tail = await self.client.tail(self.session_id, task_id, MAX_OUTPUT_CHARS - HEAD_CHARS)
        # Cut at line boundaries so neither part starts or ends with half a line.
        if "\n" in head:
            head = head[: head.rindex("\n")]
        if "\n" in tail.rstrip("\n"):
            tail = tail[tail.index("\n") + 1 :]
        return (
            f"{head}\n\n[... output truncated: {total} bytes in all; the middle is left out. "
            f"Full output: {final['output_path']} (or task_output task_id={task_id} "
            f"offset=N) ...]\n\n{tail.rstrip(chr(10))}"
        )

    async def task_output(
        self, task_id: str, offset: int | None, tail: int | None, line_filter: str | None
    ) -> str:
        if offset is not None and tail is not None:
            raise ToolInputError("give either offset or tail, not both")
        regex = None
        if line_filter is not None:
            try:
                regex = re.compile(line_filter)
            except re.error as exc:
                raise ToolInputError(f"filter: not a valid regular expression ({exc})") from exc
        # Status first: if it says ended, the output read afterwards is complete.
        info = await self.client.task(self.session_id, task_id)
        ended = info["status"] in ("completed", "failed", "killed")
        head = f'Task {task_id} "{_label(info)}": {_describe_end(info)}'
        if tail is not None:
            text = await self.client.tail(self.session_id, task_id, tail)
            next_offset = int(info.get("output_bytes") or 0)
            where = f"last {len(text)} characters; next_offset: {next_offset}"
        else:
            start = offset or 0
            raw = await self.client.output(
                self.session_id, task_id, offset=start, limit=READ_BYTES, encoding="base64"
            )
            data = base64.b64decode(raw["data_b64"])
            eof = bool(raw["eof"])
            text, used = _decode(data, final=eof)
            next_offset = start + used
            more = (
                "no (the task has ended)"
                if eof
                else "yes"
                if len(data) >= READ_BYTES
                else ("not yet (the task is still running)" if not ended else "no")
            )
            where = f"bytes {start}-{next_offset}; next_offset: {next_offset}; more: {more}"
        if regex is not None:
            lines = text.splitlines()
            kept = [line for line in lines if regex.search(line)]
            where += f"; filter matched {len(kept)} of {len(lines)} lines"
            text = "\n".join(kept)
        body = text.rstrip("\n") if text else "(no output)"
        return f"{head}\n{where}\n---\n{body}"

    async def task_stop(self, task_id: str) -> str:
        info = await self.client.stop(self.session_id, task_id)
        return (
            f'Stopped task {task_id} "{_label(info)}": {_describe_end(info)} after '
            f"{_seconds(int(info.get('running_ms') or 0))}. Output file: {info['output_path']}"
        )

    async def task_list(self) -> str:
        tasks = await self.client.tasks(self.session_id)
        shown = [t for t in tasks if t["task_id"] not in self.foreground]
        if not shown:
            return "No background tasks or monitors in this session."
        lines = [f"{len(shown)} task(s):"]
        for t in shown:
            lines.append(
                f"- {t['task_id']} [{t['kind']}] {_describe_end(t)}, running "
                f"{_seconds(int(t.get('running_ms') or 0))}"
                f"{', waiting for input' if t.get('stalled') else ''}: "
                f"{_label(t)!r} (output: {t['output_path']})"
            )
        return "\n".join(lines)

    async def task_input(self, task_id: str, text: str, eof: bool) -> str:
        await self.client.send_input(self.session_id, task_id, text, eof=eof)
        sent = f"Sent {len(text)} character(s) to the stdin of {task_id}"
        return sent + (" and closed it (EOF)." if eof else ".")

    async def task_wait(
        self, task_id: str, pattern: str | None, timeout_ms: int, offset: int
    ) -> str:
        timeout_s = timeout_ms / 1000
        if pattern is not None:
            try:
                found = await self.client.wait_for(
                    self.session_id, task_id, pattern, timeout_s=timeout_s, from_offset=offset
                )
            except ApiError as exc:
                task = exc.body.get("error", {}).get("task")
                if exc.code != "task_not_running" or not isinstance(task, dict):
                    raise
                return (
                    f"No match: task {task_id} ended ({_describe_end(task)}) without printing "
                    f"a line matching {pattern!r}. Output file: {task['output_path']}"
                )
            if not found["matched"]:
                info = await self.client.task(self.session_id, task_id)
                return (
                    f"Timed out after {duration_text(timeout_ms)}: no line matching {pattern!r} "
                    f"yet; task {task_id} is {_describe_end(info)}."
                )
            line = str(found["line"])
            after = int(found["offset"]) + len(line.encode()) + 1
            return f"Matched at offset {found['offset']} (next_offset: {after}):\n{line}"
        waited = await self.client.wait(self.session_id, task_id, timeout_s=timeout_s)
        info = dict(waited["task"])
        if waited["timed_out"]:
            return (
                f"Timed out after {duration_text(timeout_ms)}: task {task_id} is still "
                f"{info['status']} (running {_seconds(int(info.get('running_ms') or 0))})."
            )
        return (
            f'Task {task_id} "{_label(info)}" ended: {_describe_end(info)} after '
            f"{_seconds(int(info.get('running_ms') or 0))}. Output file: {info['output_path']}"
        )

    async def monitor_start(
        self, command: str, description: str, timeout_ms: int, persistent: bool
    ) -> str:
        spec: dict[str, Any] = {"command": command, "description": description, "kind": "monitor"}
        if persistent:
            spec["persistent"] = True
        else:
            spec["timeout_ms"] = timeout_ms
        info = await self._start(spec)
        life = (
            "It runs until task_stop or the end of the session."
            if info.get("persistent")
            else f"It stops after {duration_text(int(info.get('timeout_ms') or timeout_ms))}."
        )
        return (
            f"Monitor started with ID: {info['task_id']}. Output is being written to: "
            f"{info['output_path']}\nEach line it prints is delivered to you as a <task-output> "
            f"block in the result of your next tool call. {life}"
        )

    # -- log notifications and the end ----------------------------------------------------

    async def follow_events(self) -> None:
        """Mirror notifications as MCP log messages as they happen (best-effort)."""
        cursor = 0
        while not self._ended:
            try:
                body = await self.client.events(self.session_id, after=cursor, wait_s=FOLLOW_WAIT_S)
            except ApiError as exc:
                if exc.status == 404:
                    return
                await anyio.sleep(1.0)
                continue
            except (DaemonNotRunning, httpx.HTTPError):
                await anyio.sleep(1.0)
                continue
            for raw in body["events"]:
                cursor = max(cursor, int(raw["seq"]))
                if raw["type"] not in NOTIFY_TYPES or raw.get("task_id") in self.foreground:
                    continue
                ev = EVENT_ADAPTER.validate_python(raw)
                xml = render_xml(ev)
                if xml:
                    await self._log(_level_for(ev), xml)
            cursor = max(cursor, int(body["last_seq"]))
            if body["ended"] and not body["events"]:
                return

    async def _log(self, level: types.LoggingLevel, text: str) -> None:
        session = self._mcp_session
        if session is None or _LOG_LEVELS.index(level) < _LOG_LEVELS.index(self.min_log_level):
            return
        try:
            await session.send_log_message(level, text, logger="sbx")
        except Exception as exc:  # noqa: BLE001 - best-effort channel
            _warn(f"could not send a log notification: {exc!r}")

    async def end(self) -> None:
        """End the session on the daemon: stops and removes every container. Idempotent."""
        if self._ended:
            return
        self._ended = True
        try:
            result = await self.client.end_session(self.session_id)
            _warn(
                f"session {self.session_id} ended ({result.get('tasks_stopped', 0)} task(s) "
                "stopped)"
            )
        except ApiError as exc:
            if exc.status != 404:
                _warn(f"could not end session {self.session_id}: {exc}")
        except (DaemonNotRunning, httpx.HTTPError) as exc:
            _warn(f"could not end session {self.session_id}: {exc!r}")


def _warn(message: str) -> None:
    """Diagnostics go to stderr: stdout carries the protocol."""
    sys.stderr.write(f"sbx mcp: {message}\n")
    sys.stderr.flush()


def _given(ctx: Context, name: str) -> bool:
    """Whether the caller passed argument ``name`` (as opposed to taking the default)."""
    params = ctx.request_context.params or {}
    arguments = params.get("arguments") or {}
    return isinstance(arguments, dict) and name in arguments


def build_server(bridge: SessionBridge) -> MCPServer:
    """The MCP server: its tools call ``bridge``."""
    server: MCPServer = MCPServer(
        "sbx",
        title="sandbox-supervisor",
        instructions=INSTRUCTIONS,
        version="0.1.0",
        log_level="WARNING",
    )
    read_only = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(
        name="bash",
        description=BASH_DESCRIPTION,
        annotations=types.ToolAnnotations(
            title="Run a command in a sandbox", destructive_hint=False, open_world_hint=False
        ),
        structured_output=False,
    )
    async def bash(
        ctx: Context,
        command: Command,
        description: Description = "",
        timeout: BashTimeout = 120_000,
        run_in_background: Annotated[
            bool,
            Field(description="Return at once with a task id; the command keeps running."),
        ] = False,
    ) -> types.CallToolResult:
        given = _given(ctx, "timeout")
        return await bridge.run_tool(
            ctx, lambda: bridge.bash(command, description, timeout, run_in_background, given)
        )

    @server.tool(
        name="task_output",
        description="Read a background task's or monitor's output: from a byte `offset` "
        "(default 0; pass the previous next_offset to read on, 30000 bytes per call) or the "
        "last `tail` characters, optionally only the lines matching `filter`. Also says "
        "whether the task is still running.",
        annotations=read_only,
        structured_output=False,
    )
    async def task_output(
        ctx: Context,
        task_id: TaskId,
        offset: Offset = None,
        tail: TailChars = None,
        filter: LineFilter = None,
    ) -> types.CallToolResult:
        return await bridge.run_tool(ctx, lambda: bridge.task_output(task_id, offset, tail, filter))

    @server.tool(
        name="task_stop",
        description="Stop a background task or monitor (SIGTERM, then SIGKILL after the "
        "policy's grace period) and remove its container. Returns the final status; an "
        "error if it had already ended.",
        annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def task_stop(ctx: Context, task_id: TaskId) -> types.CallToolResult:
        return await bridge.run_tool(ctx, lambda: bridge.task_stop(task_id))

    @server.tool(
        name="task_list",
        description="List this session's background tasks and monitors with their status, "
        "running time and output file.",
        annotations=read_only,
        structured_output=False,
    )
    async def task_list(ctx: Context) -> types.CallToolResult:
        return await bridge.run_tool(ctx, bridge.task_list)

    @server.tool(
        name="task_input",
        description="Write text to a background task's stdin (e.g. to answer a prompt it is "
        "waiting on); `eof` closes stdin afterwards.",
        annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False),
        structured_output=False,
    )
    async def task_input(
        ctx: Context,
        task_id: TaskId,
        text: InputText,
        eof: Annotated[bool, Field(description="Close stdin after writing.")] = False,
    ) -> types.CallToolResult:
        return await bridge.run_tool(ctx, lambda: bridge.task_input(task_id, text, eof))

    @server.tool(
        name="task_wait",
        description="Wait until a background task prints a line matching `pattern` (returns "
        "the line) or, without a pattern, until it ends (returns the final status). Gives up "
        "after `timeout` ms (default 30000) and says so; the task keeps running.",
        annotations=read_only,
        structured_output=False,
    )
    async def task_wait(
        ctx: Context,
        task_id: TaskId,
        pattern: Pattern = None,
        timeout: WaitTimeout = 30_000,
        offset: Annotated[
            int,
            Field(ge=0, description="Only lines starting at or after this byte offset count."),
        ] = 0,
    ) -> types.CallToolResult:
        return await bridge.run_tool(
            ctx, lambda: bridge.task_wait(task_id, pattern, timeout, offset)
        )

    @server.tool(
        name="monitor_start",
        description="Start a monitor: a background command whose every stdout line is "
        "reported to you as a <task-output> block (in the result of your next tool call). "
        "For log tails, file watchers, polling loops, 'tell me when X happens'. Stop it with "
        "task_stop.",
        annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False),
        structured_output=False,
    )
    async def monitor_start(
        ctx: Context,
        command: Annotated[
            str,
            Field(
                min_length=1,
                max_length=128 * 1024,
                description="The shell command; every line it prints on stdout is an event.",
            ),
        ],
        description: Description = "",
        timeout_ms: MonitorTimeout = 300_000,
        persistent: Annotated[
            bool,
            Field(description="Ignore timeout_ms; run until task_stop or the session ends."),
        ] = False,
    ) -> types.CallToolResult:
        return await bridge.run_tool(
            ctx, lambda: bridge.monitor_start(command, description, timeout_ms, persistent)
        )

    async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        bridge.attach(ctx.session)
        bridge.min_log_level = params.level
        return types.EmptyResult()

    # MCPServer has no public hook for logging/setLevel; registering it on the low-level
    # server also makes the server declare the logging capability, as the spec requires of
    # servers that send log notifications.
    server._lowlevel_server.add_request_handler(
        "logging/setLevel", types.SetLevelRequestParams, set_level
    )
    return server


async def serve(options: McpOptions) -> int:
    """Run the MCP server on stdin/stdout until the client goes away or SIGTERM."""
    # Log notifications are deprecated from protocol 2026-07-28 on; the SDK only sends them
    # on older (handshake) connections, which is what clients speak today.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    if not _SESSION_PREFIX.match(options.session_prefix):
        _warn("--session-prefix: 1-40 letters, digits, '_', '.', '-'")
        return 2
    try:
        client = await ensure_daemon(options.state_dir)
    except DaemonNotRunning as exc:
        _warn(f"no daemon: {exc}")
        return 1
    session_id = f"{options.session_prefix}-{secrets.token_hex(6)}"
    try:
        await client.create_session(session_id)
    except (ApiError, DaemonNotRunning, httpx.HTTPError) as exc:
        _warn(f"could not open a session: {exc}")
        await client.aclose()
        return 1
    _warn(f"session {session_id} open; it ends when this connection closes")
    bridge = SessionBridge(client, session_id, options.policy)
    server = build_server(bridge)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bridge.follow_events)
            tg.start_soon(_on_signals, bridge, tg.cancel_scope)
            await server.run_stdio_async()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(END_TIMEOUT_S):
            await bridge.end()
            await client.aclose()
    return 0


async def _on_signals(bridge: SessionBridge, scope: anyio.CancelScope) -> None:
    """SIGTERM/SIGINT/SIGHUP: end the session, then exit.

    The SDK reads stdin in a worker thread that cancellation cannot interrupt, so after the
    session has ended a timer makes sure the process exits even while that read blocks."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            _warn(f"got {signal.Signals(signum).name}; ending the session")
            with anyio.CancelScope(shield=True), anyio.move_on_after(END_TIMEOUT_S):
                await bridge.end()
            timer = threading.Timer(2.0, os._exit, (0,))
            timer.daemon = True
            timer.start()
            scope.cancel()
            return


def main(options: McpOptions) -> int:
    return anyio.run(serve, options)
