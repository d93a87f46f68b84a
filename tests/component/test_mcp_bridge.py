"""The MCP server of ``sandvisor mcp`` (``serve_session``: its session, the bridge, the tools)
through the official MCP client, on the in-process daemon (tests/component/daemon_app.py):
memory streams instead of stdio, the daemon's app through httpx's ASGI transport instead of
its socket. Moved from tests/e2e/test_mcp.py: the tools' schemas and the tool errors need no
container; the commands' output, the notifications, stdio and signals stay there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.server.mcpserver import MCPServer
from mcp.shared.memory import create_client_server_memory_streams

from supervisor.interfaces.mcp.server import McpOptions, serve_session
from tests.component.daemon_app import InProcessDaemon
from tests.e2e.conftest import REPO
from tests.e2e.test_mcp import _BG, Mcp, text_of

#: As ``serve`` does: log notifications are deprecated from protocol 2026-07-28 on.
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

#: The tools of a server whose agent may not apply its workspace's changes.
TOOLS = {
    "bash",
    "task_output",
    "task_stop",
    "task_list",
    "task_input",
    "task_wait",
    "monitor_start",
    "workspace_changes",
}


@asynccontextmanager
async def mcp_client(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> AsyncIterator[Mcp]:
    """``sandvisor mcp`` with ``options`` as the e2e tests start it (in the repository, with
    the daemon's admin token), connected to the official client; when the client is done,
    its end of the streams closes (stdin's EOF) and the server ends its session."""
    monkeypatch.chdir(REPO)
    holder: list[Mcp] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        holder[0].logs.append(params)
        holder[0].log_arrived.set()

    async with create_client_server_memory_streams() as (client_streams, server_streams):

        async def run(server: MCPServer) -> None:
            lowlevel = server._lowlevel_server
            await lowlevel.run(*server_streams, lowlevel.create_initialization_options())

        served: list[int] = []

        async def serve() -> None:
            client = daemon.sandvisor_client()
            served.append(await serve_session(client, McpOptions(**options), run, on_signals=False))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            read, write = client_streams
            async with ClientSession(read, write, logging_callback=on_log) as session:
                holder.append(Mcp(session))
                await session.initialize()
                yield holder[0]
            await write.aclose()
        assert served == [0]


async def test_list_tools_shows_every_tool_with_schemas(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with mcp_client(daemon, monkeypatch) as mcp:
        listed = await mcp.session.list_tools()
        tools = {t.name: t for t in listed.tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.description and len(tool.description) > 40, tool.name
            assert tool.input_schema["type"] == "object"
            for name, prop in tool.input_schema.get("properties", {}).items():
                assert prop.get("description"), (tool.name, name)

        bash = tools["bash"].input_schema
        assert bash["required"] == ["command"]
        props = bash["properties"]
        assert props["command"]["type"] == "string"
        # Optional: omitted, a foreground command moves to the background after 30 s.
        assert {"type": "integer", "minimum": 1, "maximum": 600_000} in props["timeout"]["anyOf"]
        assert props["timeout"]["default"] is None
        assert props["run_in_background"]["type"] == "boolean"
        assert props["run_in_background"]["default"] is False
        tail = props["tail_every_minutes"]
        assert {"type": "number", "exclusiveMinimum": 0, "maximum": 1440} in tail["anyOf"]
        assert tail["default"] is None
        assert {"type": "boolean"} in props["persistent"]["anyOf"]
        assert props["persistent"]["default"] is None
        assert "still running after 30s is not killed" in (tools["bash"].description or "")

        monitor = tools["monitor_start"].input_schema["properties"]
        assert monitor["timeout_ms"]["default"] == 300_000
        assert monitor["timeout_ms"]["maximum"] == 3_600_000
        assert monitor["persistent"]["default"] is False
        assert monitor["tail_every_minutes"]["default"] is None

        output = tools["task_output"].input_schema
        assert output["required"] == ["task_id"]
        assert set(output["properties"]) == {"task_id", "offset", "tail", "filter", "raw"}
        assert output["properties"]["raw"]["default"] is False
        assert {"minimum": 0, "type": "integer"} in output["properties"]["offset"]["anyOf"]
        assert tools["task_input"].input_schema["required"] == ["task_id", "text"]
        assert tools["task_wait"].input_schema["properties"]["timeout"]["default"] == 30_000
        assert tools["task_list"].input_schema.get("properties", {}) == {}
        assert set(tools["workspace_changes"].input_schema["properties"]) == {
            "include_diff",
            "ignored",
            "after",
        }
        for name in ("task_output", "task_list", "task_wait", "workspace_changes"):
            annotations = tools[name].annotations
            assert annotations is not None and annotations.read_only_hint is True

        init = mcp.session.initialize_result
        assert init is not None and init.capabilities.logging is not None
        assert init.instructions and "sandbox" in init.instructions


async def test_tool_errors_come_back_as_tool_errors(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with mcp_client(daemon, monkeypatch, policy="fast") as mcp:
        missing = await mcp.call("task_stop", task_id="bg-00000000")
        assert missing.is_error
        assert "task_not_found" in text_of(missing) and "bg-00000000" in text_of(missing)

        both = await mcp.call("task_output", task_id="bg-00000000", offset=0, tail=10)
        assert both.is_error and "either offset or tail" in text_of(both)

        bad_regex = await mcp.call("task_output", task_id="bg-00000000", filter="(")
        assert bad_regex.is_error and "filter" in text_of(bad_regex)

        too_long = await mcp.call("bash", command="true", timeout=600_001)
        assert too_long.is_error

        done = await mcp.ok("bash", command="true", run_in_background=True)
        match = _BG.search(done)
        assert match, done
        task_id = match.group(1)
        await mcp.ok("task_wait", task_id=task_id, timeout=30_000)
        again = await mcp.call("task_stop", task_id=task_id)
        assert again.is_error and "task_not_running" in text_of(again)

        # The server is still serving.
        assert "completed" in await mcp.ok("task_list")
