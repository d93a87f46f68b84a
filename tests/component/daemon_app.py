"""An in-process daemon for the HTTP tests that need no real engine, socket or process: the
daemon's own start-up (``serve.open_daemon``: the supervisor, the warm pool, the tokens) over
a Supervisor on the fake engine, and its app (``create_app``) driven through httpx's ASGI
transport (:meth:`InProcessDaemon.client`), or the project's own client through the same
(:meth:`InProcessDaemon.sandvisor_client`, for the MCP server). No listener, no
subprocess, no Docker.

What it cannot show, the e2e tests keep: the daemon's listeners (its guarded h11 protocol:
head and body deadlines, the connection cap, bodies refused before they are sent), the unix
socket's file modes, the TCP listener's bound address and allowlist, a real process's crash
and signals, and what a real container and engine do.

Lifespan: the daemon runs uvicorn with ``lifespan="off"``, and the app has no lifespan of its
own; its start-up and shutdown are ``open_daemon`` and ``Supervisor.aclose``, which
:func:`in_process_daemon` runs around it, as ``run_daemon`` does.

Async tests use :func:`in_process_daemon` (the ``daemon`` fixture of tests/component). Sync
code that opens connections of its own (schemathesis, Chromium) and streams that never end
use :func:`listening_daemon`: the same daemon on an event loop of its own in a thread, its
TCP app (with the dashboard, if asked) served by plain uvicorn on a loopback port.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI

from supervisor.core.container import ContainerRequest
from supervisor.core.paths import admin_token_file
from supervisor.engine.base import Backend
from supervisor.engine.fake import (
    Exit,
    FakeBackend,
    FakeEngine,
    LoopClock,
    Out,
    Script,
    Sleep,
    Step,
    task_command,
)
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.daemon.app import AppConfig, UiConfig, create_app
from supervisor.interfaces.daemon.auth import Auth
from supervisor.interfaces.daemon.limits import BODY_TIMEOUT_S
from supervisor.interfaces.daemon.serve import bind_tcp, dashboard_config, open_daemon, tcp_config
from supervisor.interfaces.daemon.ui_assets import load_assets
from supervisor.interfaces.http import Response, request_parts
from supervisor.interfaces.http_errors import DaemonError
from supervisor.runtime.supervisor import Supervisor

#: Where the clients send their requests (the unix socket clients' host too).
BASE_URL = "http://sandvisor"
_ECHO = re.compile(r"echo ([\w .:!-]*)")
_SLEEP = re.compile(r"(?:exec )?sleep (\d+)")
_EXIT = re.compile(r"exit (\d+)")


def shell_script(command: str) -> Script | None:
    """What ``/bin/sh`` would do with the few commands the HTTP tests start: ``; ``-separated
    ``echo WORDS`` (plain words only), ``[exec] sleep N`` (N seconds of real time, or until
    stopped), ``true`` and ``exit N``. None for any other command (the engine's default
    script then runs: no output, exit 0)."""
    steps: list[Step] = []
    for part in command.split("; "):
        if (echo := _ECHO.fullmatch(part)) is not None:
            steps.append(Out(echo.group(1) + "\n"))
        elif (sleep := _SLEEP.fullmatch(part)) is not None:
            steps.append(Sleep(float(sleep.group(1))))
        elif (code := _EXIT.fullmatch(part)) is not None:
            steps.append(Exit(int(code.group(1))))
        elif part != "true":
            return None
    return Script(*steps)


def script_shell(engine: FakeEngine) -> None:
    """The engine's containers run :func:`shell_script` for the commands it knows."""

    def knows(request: ContainerRequest) -> bool:
        return shell_script(task_command(request)) is not None

    def script(request: ContainerRequest) -> Script:
        made = shell_script(task_command(request))
        assert made is not None
        return made

    engine.script(knows, script)


@dataclass
class InProcessDaemon:
    """The daemon's app over a Supervisor on a fake engine; the clients are ASGI, in-process."""

    engine: FakeEngine
    sup: Supervisor
    auth: Auth
    app: FastAPI
    state_dir: Path
    token: str
    """The admin token (from ``<state>/daemon/admin.token``, made by the start-up)."""

    def client(self, token: str | None = None, **kw: Any) -> httpx.AsyncClient:
        """httpx into the app, authenticated as admin unless told otherwise (like the e2e
        ``Daemon.client``)."""
        return self.anon(headers={"Authorization": f"Bearer {token or self.token}"}, **kw)

    def anon(self, **kw: Any) -> httpx.AsyncClient:
        """httpx into the app with no token (``headers`` to send others)."""
        kw.setdefault("base_url", BASE_URL)
        kw.setdefault("timeout", 60)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), **kw)

    def sandvisor_client(self, token: str | None = None) -> SandvisorClient:
        """The project's own client (the CLI's, the MCP server's) into the app."""
        client = SandvisorClient(base_url=BASE_URL, token=token or self.token)
        client.endpoint = AsgiEndpoint(self.app)  # type: ignore[assignment]
        return client


class AsgiEndpoint:
    """The app where ``SandvisorClient``'s Endpoint (interfaces/http.py) would open a
    connection: the same request (its Host, Accept and Content-Type headers, the query as
    ``urlencode`` writes it) through httpx's ASGI transport, and the whole answer. Set as a
    client's ``endpoint``, it takes the CLI's and the MCP server's requests in-process."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    def __str__(self) -> str:
        return "the in-process daemon"

    async def reachable(self, timeout_s: float) -> bool:
        return True

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> Response:
        target, sent, body = request_parts(method, path, params, json_body, headers)
        sent = {"Host": "sandvisor", **sent}
        transport = httpx.ASGITransport(app=self._app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            try:
                async with asyncio.timeout(read_timeout_s):
                    r = await client.request(method, target, content=body, headers=sent)
            except TimeoutError as exc:
                raise DaemonError(f"lost the connection to the daemon ({self}): timeout") from exc
        return Response(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)


@asynccontextmanager
async def in_process_daemon(
    state_dir: Path,
    policies_dir: Path,
    *,
    engine: FakeEngine | None = None,
    workspace_roots: Sequence[Path] = (),
    config: AppConfig | None = None,
    ui: UiConfig | None = None,
    backend: Callable[[FakeBackend], Backend] | None = None,
) -> AsyncIterator[InProcessDaemon]:
    """A daemon as ``sandvisor serve --stop-tasks-on-exit`` starts one, minus the listeners:
    ``config`` is the listener's (default: the unix socket's; ``serve.tcp_config`` for the
    loopback TCP one), ``ui`` its dashboard (``serve.dashboard_config``). Its own fake engine
    (real time) unless given one; either way its containers run the commands
    :func:`shell_script` knows (rules a test adds come after). ``backend`` wraps the fake's
    backend (e.g. in ``Deadlines``)."""
    async with _engine(engine) as fake:
        script_shell(fake)
        sup = Supervisor(
            state_dir,
            policies_dir,
            backend=fake.backend() if backend is None else backend(fake.backend()),
            stop_tasks_on_close=True,
            require_engine=False,
            workspace_roots=workspace_roots,
        )
        try:
            auth = await open_daemon(sup, admin_token_file(state_dir))
            token = admin_token_file(state_dir).read_text().strip()
            app = create_app(sup, auth, config or AppConfig(), ui)
            yield InProcessDaemon(fake, sup, auth, app, state_dir, token)
        finally:
            await sup.aclose()


@asynccontextmanager
async def _engine(engine: FakeEngine | None) -> AsyncIterator[FakeEngine]:
    if engine is not None:
        yield engine  # its owner closes it
        return
    async with FakeEngine(clock=LoopClock()) as fake:
        yield fake


# -- the same daemon for sync code ---------------------------------------------------------


class _Server(uvicorn.Server):
    """Uvicorn without signal handlers (the test's process has its own)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ListeningDaemon:
    """An :class:`InProcessDaemon` on an event loop of its own (in a thread), its loopback
    TCP listener's app served by uvicorn on a real port: for sync callers, and for those
    that open connections of their own (schemathesis' auth probes drop the session they
    are given, so an in-process transport cannot reach them)."""

    daemon: InProcessDaemon
    tcp: str
    """``127.0.0.1:PORT``."""
    portal: BlockingPortal
    """The daemon's event loop (:meth:`call` runs code there)."""
    ui: UiConfig | None = None
    """The dashboard, when asked for (``ui=True``)."""

    @property
    def token(self) -> str:
        return self.daemon.token

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the daemon's loop (awaited when it is async): what touches the
        fake engine from a sync test (``engine.wedge``, an event's ``set``) goes through it."""
        return self.portal.call(fn, *args)

    def client(self, token: str | None = None) -> httpx.Client:
        """httpx over loopback TCP, authenticated as admin unless told otherwise."""
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.Client(base_url=f"http://{self.tcp}", headers=headers, timeout=60)


@contextmanager
def listening_daemon(
    state_dir: Path, policies_dir: Path, *, ui: bool = False, **kw: Any
) -> Iterator[ListeningDaemon]:
    """:func:`in_process_daemon` (same arguments but ``config`` and ``ui``) on a loop in a
    thread of its own, its app (``serve.tcp_config``'s: the Host/Origin allowlist of its
    port) listening on a free loopback port; with ``ui``, serving the dashboard there too,
    as ``sandvisor serve --ui`` does."""
    sock = bind_tcp("127.0.0.1:0")  # the daemon's own listener socket
    port = sock.getsockname()[1]
    config = tcp_config(port, [], BODY_TIMEOUT_S)
    dashboard = dashboard_config(config, "127.0.0.1", port, load_assets()) if ui else None
    with (
        sock,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            in_process_daemon(state_dir, policies_dir, config=config, ui=dashboard, **kw)
        ) as daemon,
    ):
        # No log_config: uvicorn's own would stop its records (an app's traceback) from
        # reaching the test's log capture.
        server = _Server(
            uvicorn.Config(
                daemon.app, lifespan="off", log_config=None, log_level="warning", access_log=False
            )
        )
        serving = portal.start_task_soon(server.serve, [sock])
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                assert not serving.done(), serving.result()
                assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
                time.sleep(0.01)
            yield ListeningDaemon(daemon, f"127.0.0.1:{port}", portal, dashboard)
        finally:
            server.should_exit = True
            serving.result(timeout=30)
