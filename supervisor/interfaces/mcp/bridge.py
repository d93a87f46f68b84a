"""One MCP connection's session on the daemon: what each tool does, the exactly-once
notification drain, and the follower that mirrors notifications as MCP log messages.

Notifications reach the agent two ways:

* appended to EVERY tool result as ``<task-notification>`` / ``<background_task_poll>`` /
  ``<task-output>`` blocks, drained through the daemon's per-consumer cursor
  (``/notifications/pending`` then ``/notifications/ack``). This is the exactly-once channel.
* as MCP log notifications (``notifications/message``) while they happen, from a background
  task following the session's events. Best-effort: a client may drop or hide them.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
from mcp import types
from mcp.server.mcpserver import Context
from mcp.server.session import ServerSession

from supervisor.core.errors import SessionNotFound, SpecError, SupervisorError, TaskNotRunning
from supervisor.core.events import EVENT_ADAPTER, NOTIFY_TYPES, TaskFailed, TaskStalled, TaskStopped
from supervisor.core.models import TaskInfo
from supervisor.core.problems import InvalidRequest
from supervisor.core.render import render_xml
from supervisor.core.terminal import render_text
from supervisor.core.wire import make_error
from supervisor.interfaces.client import SandvisorClient, task_info
from supervisor.interfaces.http_errors import NotFound
from supervisor.interfaces.mcp import output as reading
from supervisor.interfaces.mcp import specs, texts, workspace_texts
from supervisor.interfaces.mcp.specs import BashCall, Planned
from supervisor.interfaces.mcp.texts import (
    COMPLETION_TAIL_CHARS,
    NOTIFY_MAX_CHARS,
)
from supervisor.interfaces.mcp.workspace_texts import WorkspaceJson

#: Extra time a foreground wait allows after the command's timeout (grace period, removal).
FOREGROUND_SLACK_S: Final = 30.0
#: How long stopping a cancelled foreground command may take.
STOP_TIMEOUT_S: Final = 30.0
#: Pause before following events again after the daemon failed to answer.
RETRY_S: Final = 1.0
#: How long a foreground command runs before it is moved to the background (``sandvisor mcp
#: --auto-background-after``; 0: never, it runs in the foreground until it ends).
AUTO_BACKGROUND_S: Final = 30.0
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


def warn(message: str) -> None:
    """Diagnostics go to stderr: stdout carries the protocol."""
    sys.stderr.write(f"sandvisor mcp: {message}\n")
    sys.stderr.flush()


def _level_for(ev: Any) -> types.LoggingLevel:
    if isinstance(ev, TaskFailed):
        return "error"
    if isinstance(ev, TaskStalled):
        return "warning"
    if isinstance(ev, TaskStopped):
        return "notice"
    return "info"


class SessionBridge:
    """One MCP connection's session on the daemon (see the module docstring)."""

    def __init__(
        self,
        client: SandvisorClient,
        session_id: str,
        policy: str | None = None,
        *,
        workspace: WorkspaceJson | None = None,
        note: str | None = None,
        auto_background_s: float = AUTO_BACKGROUND_S,
    ) -> None:
        self.client = client
        #: See ``AUTO_BACKGROUND_S``.
        self.auto_background_s = auto_background_s
        self.session_id = session_id
        self.policy = policy
        #: The session's workspace as the daemon described it when it opened (None: none).
        self.workspace = workspace
        #: Said once, in the first tool result (e.g. why there is no workspace).
        self.note = note
        self.consumer = f"mcp-{session_id}"
        #: Foreground tasks: their result is the tool result itself, so their lifecycle
        #: notifications are acknowledged but not shown again. A task moved to the
        #: background leaves this set (under the drain lock), and is notified from then on.
        self.foreground: set[str] = set()
        #: Foreground tasks moved to the background: their completion carries their output.
        self.moved: set[str] = set()
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
        """Run one tool body; its failures become tool errors; notifications are appended."""
        self.attach(ctx.session)
        is_error = False
        try:
            text = await action()
        except SupervisorError as exc:
            text, is_error = texts.error_text(exc), True
        notes = await self.drain()
        if notes:
            text = f"{text}\n\n{notes}"
        if self.note:
            text, self.note = f"{text}\n\n{self.note}", None
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
            except SupervisorError as exc:
                warn(f"could not fetch notifications (they come with a later result): {exc}")
                return ""
            shown = [
                await self._completed(item)
                for item in body["notifications"]
                if item.get("xml") and item.get("task_id") not in self.foreground
            ]
            blocks, ack = self._fit(shown, acked=int(body["acked"]), cursor=int(body["cursor"]))
            if ack > int(body["acked"]):
                try:
                    await self.client.ack(self.session_id, self.consumer, ack)
                except SupervisorError as exc:
                    warn(f"could not acknowledge notifications (they come again): {exc}")
                    return ""
            return "\n".join(blocks)

    async def _completed(self, item: dict[str, Any]) -> dict[str, Any]:
        """``item``, with the output's tail when it ends a task moved to the background."""
        tid = item.get("task_id")
        if tid not in self.moved or item.get("type") not in ("task.stopped", "task.failed"):
            return item
        try:
            tail = (
                await reading.rendered_tail(
                    self.client, self.session_id, str(tid), COMPLETION_TAIL_CHARS
                )
            )[0].text
        except SupervisorError as exc:
            warn(f"could not read the output of {tid}: {exc}")
            return item
        return {**item, "xml": texts.with_last_output(str(item["xml"]), tail)}

    @staticmethod
    def _fit(items: list[dict[str, Any]], *, acked: int, cursor: int) -> tuple[list[str], int]:
        """The blocks that fit in one result, and the seq to acknowledge: the whole batch
        when all fit, else up to the last block shown (the rest comes next time)."""
        blocks: list[str] = []
        size = 0
        last_seq = acked
        for index, item in enumerate(items):
            xml = str(item["xml"])
            if blocks and size + len(xml) > NOTIFY_MAX_CHARS:
                blocks.append(
                    f"[{len(items) - index} more notification(s) pending; they follow in the "
                    "result of your next tool call]"
                )
                return blocks, last_seq
            blocks.append(xml)
            size += len(xml)
            last_seq = int(item["seq"])
        return blocks, cursor

    async def _start(self, spec: dict[str, Any], *, persistent_fallback: bool = True) -> TaskInfo:
        if self.policy is not None:
            spec = {"policy": self.policy, **spec}
        try:
            return task_info(await self.client.start(self.session_id, spec))
        except InvalidRequest:
            raise  # a malformed request stays malformed without ``persistent``
        except SpecError as exc:
            # A policy without persistent tasks: run with its default timeout instead,
            # unless the agent asked for persistent itself (then it is told it cannot).
            if (
                not persistent_fallback
                or not spec.get("persistent")
                or exc.field not in (None, "persistent")
            ):
                raise
            spec = {k: v for k, v in spec.items() if k != "persistent"}
            return task_info(await self.client.start(self.session_id, spec))

    async def _stop_quietly(self, task_id: str) -> TaskInfo | None:
        """Stop the task; its final info (also when it had ended), None if that failed."""
        try:
            return task_info(await self.client.stop(self.session_id, task_id))
        except TaskNotRunning as exc:
            return exc.info
        except SupervisorError as exc:
            warn(f"could not stop task {task_id}: {exc}")
            return None

    # -- tools ----------------------------------------------------------------------------

    async def bash(self, call: BashCall) -> str:
        if not call.run_in_background:
            return await self._bash_foreground(specs.foreground(call, self.auto_background_s))
        planned = specs.background(call)
        info = await self._start(planned.spec, persistent_fallback=planned.persistent_fallback)
        return texts.started_in_background(info, planned.spec.get("poll_every_s"))

    async def _bash_foreground(self, planned: Planned) -> str:
        info = await self._start(planned.spec, persistent_fallback=planned.persistent_fallback)
        tid = info.task_id
        self.foreground.add(tid)
        limit_s = None if planned.timeout_ms is None else planned.timeout_ms / 1000
        auto_s = self.auto_background_s if self.auto_background_s > 0 else None
        # Moved to the background when it outlives ``auto_s``, unless its own timeout ends
        # it first (then the engine's deadline decides; the slack covers its grace period).
        to_background = auto_s is not None and (limit_s is None or auto_s < limit_s)
        wait_s = auto_s if to_background else (limit_s or 0) + FOREGROUND_SLACK_S
        try:
            waited = await self.client.wait(self.session_id, tid, timeout_s=wait_s)
            final = task_info(waited["task"])
            if waited["timed_out"] and to_background:
                moved = await self._to_background(tid, planned)
                if moved is not None:
                    return moved
                # It ended meanwhile: answer as a foreground command, once it is final.
                waited = await self.client.wait(self.session_id, tid, timeout_s=STOP_TIMEOUT_S)
                final = task_info(waited["task"])
            if waited["timed_out"]:
                final = await self._stop_quietly(tid) or final
        except BaseException:
            # Cancelled by the client (or the daemon went away): do not leave it running.
            if tid in self.foreground:
                with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_TIMEOUT_S):
                    await self._stop_quietly(tid)
            raise
        if final.status == "failed" and final.reason is None:
            raise make_error(
                final.error_code or "task_failed",
                f"the command could not be started: {final.error or 'unknown error'}",
            )
        output = await reading.foreground_output(self.client, self.session_id, final)
        return texts.foreground_result(output, final, planned.timeout_ms)

    async def _to_background(self, task_id: str, planned: Planned) -> str | None:
        """Move a foreground task that is still running to the background: its terminal
        notification is shown from now on. None (and it stays foreground) if it has ended.

        Under the drain lock, so no drain runs between the status read and the move: the
        runtime settles a task's status before it emits its terminal event, so an event
        some drain already hid belongs to a task this read sees ended, and any later one is
        shown, exactly once."""
        async with self._drain_lock:
            info = task_info(await self.client.task(self.session_id, task_id))
            if info.ended:
                return None
            self.foreground.discard(task_id)
            self.moved.add(task_id)
        try:
            output = await reading.foreground_output(self.client, self.session_id, info)
        except SupervisorError as exc:  # it runs on all the same: say where its output is
            output = f"(its output so far could not be read: {exc})"
        return texts.moved_to_background(
            output, info, self.auto_background_s, planned.spec.get("poll_every_s")
        )

    async def task_output(
        self,
        task_id: str,
        offset: int | None,
        tail: int | None,
        line_filter: str | None,
        *,
        raw: bool = False,
    ) -> str:
        return await reading.task_output(
            self.client, self.session_id, task_id, offset, tail, line_filter, raw=raw
        )

    async def task_stop(self, task_id: str) -> str:
        return texts.stopped(task_info(await self.client.stop(self.session_id, task_id)))

    async def task_list(self) -> str:
        tasks = [task_info(t) for t in await self.client.tasks(self.session_id)]
        return texts.task_list([t for t in tasks if t.task_id not in self.foreground])

    async def task_input(self, task_id: str, text: str, eof: bool) -> str:
        await self.client.send_input(self.session_id, task_id, text, eof=eof)
        return texts.input_sent(task_id, text, eof)

    async def task_wait(
        self, task_id: str, pattern: str | None, timeout_ms: int, offset: int
    ) -> str:
        timeout_s = timeout_ms / 1000
        if pattern is None:
            waited = await self.client.wait(self.session_id, task_id, timeout_s=timeout_s)
            info = task_info(waited["task"])
            if waited["timed_out"]:
                return texts.wait_timed_out(info, timeout_ms)
            return texts.wait_ended(info)
        try:
            found = await self.client.wait_for(
                self.session_id, task_id, pattern, timeout_s=timeout_s, from_offset=offset
            )
        except TaskNotRunning as exc:
            return texts.ended_without_match(exc.info, pattern)
        if not found["matched"]:
            info = task_info(await self.client.task(self.session_id, task_id))
            return texts.no_match_yet(info, pattern, timeout_ms)
        line = str(found["line"])
        after = int(found["offset"]) + len(line.encode()) + 1
        # The offsets are the raw line's; the line is shown as a terminal shows it.
        return f"Matched at offset {found['offset']} (next_offset: {after}):\n{render_text(line)}"

    async def monitor_start(
        self,
        command: str,
        description: str,
        timeout_ms: int,
        persistent: bool,
        tail_every_minutes: float | None = None,
    ) -> str:
        spec = specs.monitor(command, description, timeout_ms, persistent, tail_every_minutes)
        info = await self._start(spec)
        return texts.monitor_started(info, timeout_ms, spec.get("poll_every_s"))

    async def workspace_changes(
        self, include_diff: bool, ignored: bool, after: str | None = None
    ) -> str:
        why = workspace_texts.not_reviewable(self.workspace)
        if why is not None or self.workspace is None:
            return why or ""
        limit = workspace_texts.MAX_LISTED
        page = await self.client.workspace_changes_page(
            self.session_id, ignored=ignored, limit=limit, after=after
        )
        diff = None
        if include_diff:  # of this page's changes only
            diff = await self.client.workspace_diff(
                self.session_id, limit=limit, after=after, ignored=ignored
            )
        return workspace_texts.changes_text(self.workspace, self.session_id, page, diff, after)

    async def workspace_apply(self, force: bool, stop_tasks: bool) -> str:
        why = workspace_texts.not_reviewable(self.workspace)
        if why is not None:
            return why
        listed = await self.client.workspace_changes(self.session_id)  # every page
        result = await self.client.apply_changes(
            self.session_id,
            force=force,
            stop_tasks=stop_tasks,
            reviewed=self.client.reviewed(listed),
        )
        return workspace_texts.applied_text(result, self.session_id)

    # -- log notifications and the end ----------------------------------------------------

    async def follow_events(self) -> None:
        """Mirror notifications as MCP log messages as they happen (best-effort), until the
        session ends."""
        cursor = 0
        while not self._ended:
            try:
                async for batch in self.client.follow_events(self.session_id, cursor):
                    for raw in batch:
                        cursor = max(cursor, int(raw["seq"]))
                        await self._mirror(raw)
                return
            except (SessionNotFound, NotFound):
                return  # the session has ended and the daemon let go of it
            except SupervisorError as exc:
                warn(f"following events failed, again in {RETRY_S:g} s: {exc}")
                await anyio.sleep(RETRY_S)

    async def _mirror(self, raw: dict[str, Any]) -> None:
        if raw["type"] not in NOTIFY_TYPES or raw.get("task_id") in self.foreground:
            return
        ev = EVENT_ADAPTER.validate_python(raw)
        item = await self._completed({**raw, "xml": render_xml(ev)})
        if item["xml"]:
            await self._log(_level_for(ev), str(item["xml"]))

    async def _log(self, level: types.LoggingLevel, text: str) -> None:
        session = self._mcp_session
        if session is None or _LOG_LEVELS.index(level) < _LOG_LEVELS.index(self.min_log_level):
            return
        try:
            await session.send_log_message(level, text, logger="sandvisor")
        except Exception as exc:  # noqa: BLE001 - best-effort channel; the drain delivers
            warn(f"could not send a log notification: {exc!r}")

    async def end(self) -> None:
        """End the session on the daemon: stops and removes every container. Idempotent."""
        if self._ended:
            return
        self._ended = True
        try:
            result = await self.client.end_session(self.session_id)
        except (SessionNotFound, NotFound):
            return  # already gone: nothing left to stop
        except SupervisorError as exc:
            warn(f"could not end session {self.session_id}: {exc}")
            return
        stopped = result.get("tasks_stopped", 0)
        sid = self.session_id
        if result.get("workspace_kept"):
            warn(
                f"session {sid} ended ({stopped} task(s) stopped); its changes to "
                f"{(self.workspace or {}).get('path', 'the project')} are kept: review them "
                f"with `sandvisor workspace diff --session {sid}`, then `sandvisor workspace apply "
                f"--session {sid}` (or `sandvisor workspace discard --session {sid}`)"
            )
        else:
            warn(f"session {sid} ended ({stopped} task(s) stopped)")
