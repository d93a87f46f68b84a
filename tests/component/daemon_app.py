"""An in-process daemon for the HTTP tests that need no real engine, socket or process: the
daemon's own start-up (``serve.open_daemon``: the supervisor, the warm pool, the tokens) over
a Supervisor on the fake engine, and its app (``create_app``) driven through httpx's ASGI
transport. No listener, no subprocess, no Docker.

What it cannot show, the e2e tests keep: the real listener (uvicorn and the guarded h11
protocol: head and body deadlines, the connection cap, bodies refused before they are
sent), the unix socket's file modes, the TCP listener's bound address, a real process's
crash and signals, and what a real container and engine do.

Lifespan: the daemon runs uvicorn with ``lifespan="off"``, and the app has no lifespan of its
own; its start-up and shutdown are ``open_daemon`` and ``Supervisor.aclose``, which
:func:`in_process_daemon` runs around it, as ``run_daemon`` does.

Async tests use :func:`in_process_daemon` (the ``daemon`` fixture of tests/component). Sync
code (schemathesis, hypothesis) uses :func:`threaded_daemon`: the same daemon on an event
loop of its own in a thread, reached through sync httpx and requests clients.
"""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import requests
import requests.adapters
import urllib3
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI

from supervisor.core.container import ContainerRequest
from supervisor.core.paths import admin_token_file
from supervisor.engine.fake import (
    Exit,
    FakeEngine,
    LoopClock,
    Out,
    Script,
    Sleep,
    Step,
    task_command,
)
from supervisor.interfaces.daemon.app import AppConfig, create_app
from supervisor.interfaces.daemon.auth import Auth
from supervisor.interfaces.daemon.serve import open_daemon
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


@asynccontextmanager
async def in_process_daemon(
    state_dir: Path,
    policies_dir: Path,
    *,
    engine: FakeEngine | None = None,
    workspace_roots: Sequence[Path] = (),
    config: AppConfig | None = None,
) -> AsyncIterator[InProcessDaemon]:
    """A daemon as ``sandvisor serve --stop-tasks-on-exit`` starts one, minus the listeners:
    ``config`` is the listener's (default: the unix socket's; ``serve.tcp_config`` for the
    loopback TCP one). Its own fake engine (real time) unless given one; either way its
    containers run the commands :func:`shell_script` knows (rules a test adds come after)."""
    async with _engine(engine) as fake:
        script_shell(fake)
        sup = Supervisor(
            state_dir,
            policies_dir,
            backend=fake.backend(),
            stop_tasks_on_close=True,
            require_engine=False,
            workspace_roots=workspace_roots,
        )
        try:
            auth = await open_daemon(sup, admin_token_file(state_dir))
            token = admin_token_file(state_dir).read_text().strip()
            app = create_app(sup, auth, config or AppConfig())
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


class PortalTransport(httpx.BaseTransport):
    """A sync httpx transport into the app, run on the daemon's loop (in its thread)."""

    def __init__(self, portal: BlockingPortal, app: FastAPI) -> None:
        self._portal = portal
        self._asgi = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
            response = await self._asgi.handle_async_request(request)
            return response.status_code, response.headers.raw, await response.aread()

        status, headers, content = self._portal.call(send)
        return httpx.Response(status, headers=headers, content=content, request=request)


class PortalAdapter(requests.adapters.BaseAdapter):
    """requests into the app, through :class:`PortalTransport`: what a ``requests.Session``
    (schemathesis' client) sends reaches the app as it would over a socket (headers as
    latin-1 bytes, the body as sent)."""

    def __init__(self, transport: PortalTransport) -> None:
        super().__init__()
        self._transport = transport
        self._builder = requests.adapters.HTTPAdapter()

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        body = request.body
        if isinstance(body, str):
            body = body.encode("utf-8")
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        answer = self._transport.handle_request(
            httpx.Request(str(request.method), str(request.url), headers=headers, content=body)
        )
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(answer.content),
            headers=list(answer.headers.multi_items()),
            status=answer.status_code,
            reason=answer.reason_phrase,
            version=11,
            preload_content=False,
            decode_content=False,
            request_method=request.method,
        )
        return self._builder.build_response(request, raw)

    def close(self) -> None:
        self._builder.close()


@dataclass
class ThreadedDaemon:
    """An :class:`InProcessDaemon` on its own loop in a thread, for sync callers."""

    daemon: InProcessDaemon
    portal: BlockingPortal

    @property
    def token(self) -> str:
        return self.daemon.token

    def call(self, func: Any, *args: Any) -> Any:
        """Run ``func(*args)`` (a coroutine function) on the daemon's loop."""
        return self.portal.call(func, *args)

    def client(self, token: str | None = None, base_url: str = BASE_URL) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return self.anon(base_url=base_url, headers=headers)

    def anon(self, base_url: str = BASE_URL, **kw: Any) -> httpx.Client:
        transport = PortalTransport(self.portal, self.daemon.app)
        return httpx.Client(transport=transport, base_url=base_url, timeout=60, **kw)

    def requests_session(self) -> requests.Session:
        """A requests session whose every http:// request goes to the app."""
        session = requests.Session()
        session.mount("http://", PortalAdapter(PortalTransport(self.portal, self.daemon.app)))
        return session


@contextmanager
def threaded_daemon(state_dir: Path, policies_dir: Path, **kw: Any) -> Iterator[ThreadedDaemon]:
    """:func:`in_process_daemon` (same arguments) on an event loop in a thread of its own."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(in_process_daemon(state_dir, policies_dir, **kw)) as d,
    ):
        yield ThreadedDaemon(d, portal)
