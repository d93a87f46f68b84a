"""``sandvisor mcp``: an MCP server over stdio; one MCP connection is one supervisor session.

The server is a client of the daemon (``SandvisorClient``). At start-up it opens a fresh session
with a random id; when the connection closes (stdin EOF) or on SIGTERM it ends the session,
which stops and removes every container the agent started. What the tools do is in
``bridge``; what the agent reads is in ``texts``.

No ``from __future__ import annotations``: the SDK builds the tools' input schemas from the
signatures of the tool functions, defined inside ``build_server``.
"""

import os
import re
import secrets
import signal
import threading
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning

from supervisor.core.errors import PolicyError, SupervisorError
from supervisor.core.workspace_errors import WorkspaceOutsideRoots
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.launch import ensure_daemon
from supervisor.interfaces.mcp import texts, workspace_texts
from supervisor.interfaces.mcp.bridge import AUTO_BACKGROUND_S, SessionBridge, warn
from supervisor.interfaces.mcp.specs import BashCall
from supervisor.interfaces.mcp.texts import (
    BashPersistent,
    BashTimeout,
    CloseStdin,
    Command,
    Description,
    InBackground,
    InputText,
    LineFilter,
    MonitorCommand,
    MonitorTimeout,
    Offset,
    Pattern,
    Persistent,
    RawOutput,
    TailChars,
    TailEveryMinutes,
    TaskId,
    WaitOffset,
    WaitTimeout,
)
from supervisor.interfaces.mcp.workspace_texts import (
    After,
    Force,
    IncludeDiff,
    IncludeIgnored,
    StopTasks,
    WorkspaceJson,
)

#: How long ending the session may take when the connection closes.
END_TIMEOUT_S: Final = 60.0
#: After a signal ended the session, how long the process may take to exit on its own.
EXIT_GRACE_S: Final = 2.0
_SESSION_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


@dataclass
class McpOptions:
    """What ``sandvisor mcp`` is told."""

    state_dir: Path | None = None
    session_prefix: str = "mcp"
    policy: str | None = None
    workspace: Path | None = None
    """The project directory (None: the current directory, when the daemon allows it)."""
    workspace_mode: str | None = None
    no_workspace: bool = False
    allow_agent_apply: bool = False
    """Offer the ``workspace_apply`` tool (applying is otherwise the user's decision)."""
    auto_background_s: float = AUTO_BACKGROUND_S
    """Move a foreground ``bash`` still running after this long to the background (0: never)."""


def build_server(bridge: SessionBridge, *, allow_apply: bool = False) -> MCPServer:
    """The MCP server: its tools call ``bridge``. ``allow_apply``: offer workspace_apply."""
    server: MCPServer = MCPServer(
        "sandvisor",
        title="sandbox-supervisor",
        instructions=workspace_texts.instructions(bridge.workspace),
        version="0.1.0",
        log_level="WARNING",
    )
    read_only = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    acting = types.ToolAnnotations(destructive_hint=False, open_world_hint=False)
    _workspace_tools(server, bridge, allow_apply)

    @server.tool(
        name="bash",
        description=workspace_texts.bash_description(bridge.workspace, bridge.auto_background_s),
        annotations=types.ToolAnnotations(
            title="Run a command in a sandbox", destructive_hint=False, open_world_hint=False
        ),
        structured_output=False,
    )
    async def bash(
        ctx: Context,
        command: Command,
        description: Description = "",
        timeout: BashTimeout = None,
        run_in_background: InBackground = False,
        tail_every_minutes: TailEveryMinutes = None,
        persistent: BashPersistent = None,
    ) -> types.CallToolResult:
        call = BashCall(
            command,
            description,
            timeout_ms=timeout,
            run_in_background=run_in_background,
            tail_every_minutes=tail_every_minutes,
            persistent=persistent,
        )
        return await bridge.run_tool(ctx, lambda: bridge.bash(call))

    @server.tool(
        name="task_output",
        description=texts.TASK_OUTPUT_DESCRIPTION,
        annotations=read_only,
        structured_output=False,
    )
    async def task_output(
        ctx: Context,
        task_id: TaskId,
        offset: Offset = None,
        tail: TailChars = None,
        filter: LineFilter = None,
        raw: RawOutput = False,
    ) -> types.CallToolResult:
        return await bridge.run_tool(
            ctx, lambda: bridge.task_output(task_id, offset, tail, filter, raw=raw)
        )

    @server.tool(
        name="task_stop",
        description=texts.TASK_STOP_DESCRIPTION,
        annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def task_stop(ctx: Context, task_id: TaskId) -> types.CallToolResult:
        return await bridge.run_tool(ctx, lambda: bridge.task_stop(task_id))

    @server.tool(
        name="task_list",
        description=texts.TASK_LIST_DESCRIPTION,
        annotations=read_only,
        structured_output=False,
    )
    async def task_list(ctx: Context) -> types.CallToolResult:
        return await bridge.run_tool(ctx, bridge.task_list)

    @server.tool(
        name="task_input",
        description=texts.TASK_INPUT_DESCRIPTION,
        annotations=acting,
        structured_output=False,
    )
    async def task_input(
        ctx: Context, task_id: TaskId, text: InputText, eof: CloseStdin = False
    ) -> types.CallToolResult:
        return await bridge.run_tool(ctx, lambda: bridge.task_input(task_id, text, eof))

    @server.tool(
        name="task_wait",
        description=texts.TASK_WAIT_DESCRIPTION,
        annotations=read_only,
        structured_output=False,
    )
    async def task_wait(
        ctx: Context,
        task_id: TaskId,
        pattern: Pattern = None,
        timeout: WaitTimeout = 30_000,
        offset: WaitOffset = 0,
    ) -> types.CallToolResult:
        return await bridge.run_tool(
            ctx, lambda: bridge.task_wait(task_id, pattern, timeout, offset)
        )

    @server.tool(
        name="monitor_start",
        description=texts.MONITOR_START_DESCRIPTION,
        annotations=acting,
        structured_output=False,
    )
    async def monitor_start(
        ctx: Context,
        command: MonitorCommand,
        description: Description = "",
        timeout_ms: MonitorTimeout = 300_000,
        persistent: Persistent = False,
        tail_every_minutes: TailEveryMinutes = None,
    ) -> types.CallToolResult:
        return await bridge.run_tool(
            ctx,
            lambda: bridge.monitor_start(
                command, description, timeout_ms, persistent, tail_every_minutes
            ),
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


def _workspace_tools(server: MCPServer, bridge: SessionBridge, allow_apply: bool) -> None:
    @server.tool(
        name="workspace_changes",
        description=workspace_texts.WORKSPACE_CHANGES_DESCRIPTION,
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def workspace_changes(
        ctx: Context,
        include_diff: IncludeDiff = True,
        ignored: IncludeIgnored = False,
        after: After = None,
    ) -> types.CallToolResult:
        return await bridge.run_tool(
            ctx, lambda: bridge.workspace_changes(include_diff, ignored, after)
        )

    if not allow_apply:
        return

    @server.tool(
        name="workspace_apply",
        description=workspace_texts.WORKSPACE_APPLY_DESCRIPTION,
        annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def workspace_apply(
        ctx: Context, force: Force = False, stop_tasks: StopTasks = False
    ) -> types.CallToolResult:
        return await bridge.run_tool(ctx, lambda: bridge.workspace_apply(force, stop_tasks))


def _where(workspace: Path | None) -> tuple[str, bool]:
    """(realpath of the workspace or the current directory, whether it is / or home)."""
    path = os.path.realpath(workspace or os.getcwd())
    return path, path in ("/", os.path.realpath(Path.home()))


class _Refused(Exception):
    """The workspace asked for by name cannot be had: the server does not start."""


async def _open_session(
    client: SandvisorClient, session_id: str, options: McpOptions
) -> tuple[WorkspaceJson | None, str | None]:
    """Open the connection's session on its workspace: (the workspace as the daemon
    describes it, a note for the agent when there is none). The current directory is only
    a default: when the daemon refuses it, the session opens without a workspace."""
    policy = options.policy
    if options.no_workspace:
        await client.create_session(session_id, policy=policy)
        return None, None
    explicit = options.workspace is not None
    path, at_home = await anyio.to_thread.run_sync(_where, options.workspace)
    why = None
    if not explicit and at_home:
        # Clients that start servers outside any project (at / or in the home directory):
        # that is nobody's project, and an overlay's manifest would walk all of it.
        why = "is not a project directory (the server was started in it)"
    else:
        try:
            body = await client.create_session(
                session_id, workspace=path, workspace_mode=options.workspace_mode, policy=policy
            )
        except PolicyError as exc:
            if explicit:
                raise _Refused(f"--workspace {options.workspace}: {exc}") from exc
            if isinstance(exc, WorkspaceOutsideRoots):
                roots = ", ".join(exc.roots) or "none"
                why = f"is not under the sandvisor daemon's workspace roots ({roots})"
            else:
                why = f"cannot be a workspace ({exc})"
        else:
            ws: WorkspaceJson | None = body.get("workspace")
            return ws, None
    await client.create_session(session_id, policy=policy)
    warn(f"{path} {why}: running without a workspace")
    return None, workspace_texts.no_workspace_note(path, why)


def _started(session_id: str, ws: WorkspaceJson | None) -> str:
    if ws is None:
        return f"session {session_id} open; it ends when this connection closes"
    text = (
        f"session {session_id} open on {ws['path']} ({ws['mode']}); it ends when this "
        "connection closes"
    )
    if ws.get("warning"):
        text += f" (note: {ws['warning']})"
    if ws["mode"] == "overlay":
        text += (
            f". The agent's changes stay out of the project until you apply them: "
            f"sandvisor workspace diff --session {session_id}, then "
            f"sandvisor workspace apply --session {session_id}"
        )
    return text


async def serve(options: McpOptions) -> int:
    """Run the MCP server on stdin/stdout until the client goes away or SIGTERM."""
    # Log notifications are deprecated from protocol 2026-07-28 on; the SDK only sends them
    # on older (handshake) connections, which is what clients speak today.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    if not _SESSION_PREFIX.match(options.session_prefix):
        warn("--session-prefix: 1-40 letters, digits, '_', '.', '-'")
        return 2
    try:
        client = await ensure_daemon(options.state_dir)
    except SupervisorError as exc:
        warn(f"no daemon: {exc}")
        return 1
    return await serve_session(client, options, MCPServer.run_stdio_async)


async def serve_session(
    client: SandvisorClient,
    options: McpOptions,
    run: Callable[[MCPServer], Awaitable[None]],
    *,
    on_signals: bool = True,
) -> int:
    """One MCP connection's session on the daemon ``client`` reaches: open it, serve the
    tools with ``run`` (stdio: until the client goes away) while following its events, then
    end it. ``on_signals``: SIGTERM, SIGINT and SIGHUP end it too (the process's handlers)."""
    session_id = f"{options.session_prefix}-{secrets.token_hex(6)}"
    try:
        workspace, note = await _open_session(client, session_id, options)
    except _Refused as exc:
        warn(str(exc))
        await client.aclose()
        return 2
    except SupervisorError as exc:
        warn(f"could not open a session: {exc}")
        await client.aclose()
        return 1
    warn(_started(session_id, workspace))
    bridge = SessionBridge(
        client,
        session_id,
        options.policy,
        workspace=workspace,
        note=note,
        auto_background_s=options.auto_background_s,
    )
    server = build_server(bridge, allow_apply=options.allow_agent_apply)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bridge.follow_events)
            if on_signals:
                tg.start_soon(_on_signals, bridge, tg.cancel_scope)
            await run(server)
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
            warn(f"got {signal.Signals(signum).name}; ending the session")
            with anyio.CancelScope(shield=True), anyio.move_on_after(END_TIMEOUT_S):
                await bridge.end()
            timer = threading.Timer(EXIT_GRACE_S, os._exit, (0,))
            timer.daemon = True
            timer.start()
            scope.cancel()
            return


def main(options: McpOptions) -> int:
    return anyio.run(serve, options)
