"""Run the daemon: the Supervisor, the API on a 0600 unix socket (and optional loopback TCP)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import sys
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from supervisor.core.logs import get_logger
from supervisor.core.paths import admin_token_file, daemon_dir, daemon_info_file, default_state_dir
from supervisor.interfaces.daemon.app import AppConfig, UiConfig, create_app
from supervisor.interfaces.daemon.auth import Auth, Principal, write_private
from supervisor.interfaces.daemon.connections import (
    AcceptErrorLog,
    GuardedH11Protocol,
    Listener,
    connection_cap,
    raise_nofile_limit,
)
from supervisor.interfaces.daemon.limits import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_S,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    UI_BANNER_LOGIN_TTL_S,
    UI_PORT,
)
from supervisor.interfaces.daemon.ui_assets import load_assets, ui_error_page
from supervisor.interfaces.daemon.ui_routes import LOGIN_PATH, cookie_name
from supervisor.runtime.supervisor import Supervisor
from supervisor.state.sinks import Sink

log = get_logger("supervisor.interfaces.daemon")


@dataclass
class DaemonSettings:
    """Everything ``sandvisor serve`` can be told."""

    state_dir: Path = field(default_factory=default_state_dir)
    policies_dir: Path | None = None
    socket_path: Path | None = None
    listen: str | None = None
    """``127.0.0.1:PORT`` (port 0 picks one) for loopback TCP; needs the bearer token."""
    allow_hosts: list[str] = field(default_factory=list)
    stop_tasks_on_exit: bool = False
    docker_host: str | None = None
    webhook_url: str | None = None
    webhook_secret_file: Path | None = None
    workspace_roots: list[Path] = field(default_factory=list)
    event_retention: int = 100_000
    """Events kept per session in the store."""
    banner: bool = False
    """Print how to connect (socket, token, MCP client configuration) once listening."""
    max_connections: int | None = None
    """Open connections per listener; None: MAX_CONNECTIONS, lowered to fit the nofile limit."""
    header_timeout_s: float = HEADER_TIMEOUT_S
    """A request's line and headers must arrive within this many seconds."""
    body_timeout_s: float = BODY_TIMEOUT_S
    """A request's body must arrive within this many seconds of its headers."""
    engine_timeout_s: float | None = None
    """The deadline of every engine call (create, start, remove, ...); None:
    ``SANDVISOR_ENGINE_TIMEOUT_S``, else 30 s. A call past it fails with
    engine_unresponsive (retryable) instead of holding its caller."""
    ui: bool = False
    """Serve the dashboard on the loopback TCP listener (on ``UI_PORT``, or a free port,
    when ``listen`` names none) and print a one-time login link."""

    @property
    def daemon_dir(self) -> Path:
        return daemon_dir(self.state_dir)

    @property
    def socket(self) -> Path:
        return self.socket_path or self.daemon_dir / "sandvisor.sock"

    @property
    def token_file(self) -> Path:
        return admin_token_file(self.state_dir)

    @property
    def info_file(self) -> Path:
        return daemon_info_file(self.state_dir)


#: Pending connections the kernel queues per listener. Kept moderate: when descriptors run
#: out, asyncio retries accept() once per queued connection on every loop pass (CPython
#: 3.11), so the queue's length multiplies that spin.
_BACKLOG = 256


class _Server(uvicorn.Server):
    """Uvicorn without its own signal handling: the daemon handles signals for all listeners."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


#: sockaddr_un's sun_path is 108 bytes on Linux, the last one the terminating NUL.
_SUN_PATH_MAX = 107


def _bind_unix(path: Path) -> socket.socket:
    """A 0600 socket in a 0700 directory. A stale socket file (nobody answers) is replaced;
    a live one means another daemon owns this state dir."""
    size = len(os.fsencode(path))
    if size > _SUN_PATH_MAX:
        raise SystemExit(
            f"sandvisor serve: the socket path {path} is {size} bytes, and a unix socket's "
            f"path holds at most {_SUN_PATH_MAX}: use a shorter --state-dir, or --socket "
            "with a shorter path"
        )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
        else:
            probe.close()
            raise SystemExit(f"sandvisor serve: another daemon is already listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


def _bind_ui_default() -> socket.socket:
    """The dashboard's listener when none was named: its usual port, else any free one (a
    second daemon on the machine still gets a dashboard)."""
    try:
        return bind_tcp(f"127.0.0.1:{UI_PORT}")
    except OSError:
        return bind_tcp("127.0.0.1:0")


def bind_tcp(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise SystemExit(
            f"sandvisor serve: --listen {listen}: only loopback addresses are allowed "
            "(127.0.0.1, ::1, localhost)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it every answer on a kept-alive connection waited ~40 ms (Nagle's algorithm against
    # the client's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host if host != "localhost" else "127.0.0.1", int(port)))
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


def _webhook_sinks(settings: DaemonSettings) -> object | None:
    if not settings.webhook_url:
        return None
    from supervisor.interfaces.daemon.webhook import WebhookSink  # noqa: PLC0415

    secret = b""
    if settings.webhook_secret_file is not None:
        secret = settings.webhook_secret_file.read_bytes().strip()
    url = settings.webhook_url

    def factory(session_id: str) -> Iterable[Sink]:
        return [WebhookSink(url, secret)]

    return factory


def _servers(
    sockets: list[tuple[str, socket.socket]],
    apps: dict[str, FastAPI],
    settings: DaemonSettings,
    cap: int,
) -> list[tuple[_Server, socket.socket]]:
    """One uvicorn server per listener, each with its own connection cap and header deadline
    (so a flood on the TCP port does not take the unix socket's connections)."""
    servers = []
    for kind, sock in sockets:
        listener = Listener(kind, cap, settings.header_timeout_s)
        uconfig = uvicorn.Config(
            apps[kind],
            http=functools.partial(GuardedH11Protocol, listener=listener),  # type: ignore[arg-type]
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=KEEP_ALIVE_S,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            backlog=_BACKLOG,
        )
        servers.append((_Server(uconfig), sock))
    return servers


def tcp_config(port: int, allow_hosts: Iterable[str], body_timeout_s: float) -> AppConfig:
    """The loopback TCP listener's app: the Host names of its port (and ``--allow-host``)
    and their origins only."""
    names = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", *allow_hosts}
    return AppConfig(
        allowed_hosts=names,
        allowed_origins={f"http://{n}" for n in names},
        body_timeout_s=body_timeout_s,
    )


def dashboard_config(config: AppConfig, host: str, port: int, assets: dict[str, Any]) -> UiConfig:
    """The dashboard on the TCP listener ``host:port`` whose app ``config`` is (made to take
    the dashboard's cookie, its login page and its error pages)."""
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    ui = UiConfig(base_url=base, cookie=cookie_name(port), assets=assets)
    config.ui_cookie = ui.cookie
    config.public_paths = config.public_paths | {LOGIN_PATH}
    config.error_page = ui_error_page
    return ui


def _apps(
    settings: DaemonSettings, sup: Supervisor, auth: Auth, ui_assets: dict[str, Any]
) -> tuple[list[tuple[str, socket.socket]], dict[str, FastAPI], str | None, UiConfig | None]:
    """The bound sockets, one app per listener, the TCP address (if any) and the dashboard's
    configuration (with ``--ui``). The Host/Origin guard applies to TCP only (on the 0600
    unix socket, reachability already is the credential's first half); so does the
    dashboard's cookie (the unix socket only mints login links)."""
    sockets: list[tuple[str, socket.socket]] = [("unix", _bind_unix(settings.socket))]
    body_timeout = settings.body_timeout_s
    tcp_address = None
    ui: UiConfig | None = None
    apps: dict[str, FastAPI] = {}
    tcp: socket.socket | None = None
    if settings.listen:
        tcp = bind_tcp(settings.listen)
    elif settings.ui:
        tcp = _bind_ui_default()
    if tcp is not None:
        host, port = tcp.getsockname()[:2]
        tcp_address = f"{host}:{port}"
        config = tcp_config(port, settings.allow_hosts, body_timeout)
        if settings.ui:
            ui = dashboard_config(config, host, port, ui_assets)
        apps["tcp"] = create_app(sup, auth, config, ui)
        sockets.append(("tcp", tcp))
    unix_ui = None if ui is None else UiConfig(base_url=ui.base_url, cookie=ui.cookie, pages=False)
    apps["unix"] = create_app(sup, auth, AppConfig(body_timeout_s=body_timeout), unix_ui)
    return sockets, apps, tcp_address, ui


async def open_daemon(sup: Supervisor, token_file: Path) -> Auth:
    """What the daemon does before its apps answer: start the supervisor (it re-adopts what
    a previous run left), start filling the default policy's warm pool, and load the admin
    token (made on the first start) and the open sessions' tokens (their digests)."""
    await sup.start()
    # The default policy's first start is warm too (its pool fills in the background).
    sup.prewarm_shared()
    auth = Auth(token_file)
    for session in sup.sessions():
        for digest in session.token_digests:
            auth.restore(session.session_id, digest)
    return auth


async def run_daemon(settings: DaemonSettings, *, ready: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT; then stop listening, flush, and leave running containers
    for the next start to re-adopt (or stop them with ``stop_tasks_on_exit``)."""
    nofile, _ = raise_nofile_limit()  # before the supervisor opens its first descriptor
    factory = _webhook_sinks(settings)
    sup = Supervisor(
        settings.state_dir,
        settings.policies_dir,
        docker_host=settings.docker_host,
        stop_tasks_on_close=settings.stop_tasks_on_exit,
        require_engine=False,
        sinks=factory,  # type: ignore[arg-type]
        workspace_roots=settings.workspace_roots,
        event_retention=settings.event_retention,
        engine_timeout_s=settings.engine_timeout_s,
    )
    auth = await open_daemon(sup, settings.token_file)
    assets = await asyncio.to_thread(load_assets) if settings.ui else {}
    sockets, apps, tcp_address, ui = _apps(settings, sup, auth, assets)
    cap = connection_cap(settings.max_connections, MAX_CONNECTIONS, len(sockets), nofile)
    servers = _servers(sockets, apps, settings, cap)
    loop = asyncio.get_running_loop()
    accept_errors = AcceptErrorLog(loop)
    accept_errors.install()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in servers]
    info = {
        "pid": os.getpid(),
        "socket": str(settings.socket),
        "tcp": tcp_address,
        "token_file": str(settings.token_file),
        "state_dir": str(settings.state_dir),
        "instance_id": sup.instance_id,
    }
    write_private(settings.info_file, json.dumps(info) + "\n")
    log.info(
        "daemon_listening",
        **info,
        nofile=nofile,
        max_connections=cap,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
    )
    if settings.banner:
        sys.stdout.write(connect_banner(settings, sup, tcp_address) + "\n")
    if ui is not None:
        # Printed, never logged: the link is a credential (one use, a day at most).
        code = auth.new_login(Principal("admin"), UI_BANNER_LOGIN_TTL_S)
        sys.stdout.write(dashboard_banner(ui.login_url(code)) + "\n")
    sys.stdout.flush()
    if ready is not None:
        ready.set()
    try:
        await asyncio.wait(
            [*tasks, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await sup.aclose()
        accept_errors.uninstall()
        with contextlib.suppress(OSError):
            settings.socket.unlink()
        with contextlib.suppress(OSError):
            settings.info_file.unlink()
        log.info("daemon_stopped")
    return 0


def connect_banner(settings: DaemonSettings, sup: Supervisor, tcp: str | None) -> str:
    """What a person needs to connect: the socket, the token, ready-to-paste MCP configs."""
    sandvisor = Path(sys.executable).parent / "sandvisor"
    sock, token = settings.socket, settings.token_file
    engine = sup.engine_info.get("version", "unreachable")
    custom = settings.state_dir.resolve() != default_state_dir().resolve()
    env = f"SANDVISOR_STATE_DIR={settings.state_dir} " if custom else ""
    mcp_json = json.dumps(
        {
            "mcpServers": {
                "sandvisor": {
                    "command": str(sandvisor),
                    "args": ["mcp"],
                    **({"env": {"SANDVISOR_STATE_DIR": str(settings.state_dir)}} if env else {}),
                }
            }
        },
        indent=2,
    )
    lines = [
        f"sandbox-supervisor is running (pid {os.getpid()}, Docker engine {engine}, "
        f"policies: {', '.join(sup.policies.names())})",
        f"  socket       {sock}  (mode 0600, directory 0700)",
        f"  admin token  {token}  (mode 0600)",
    ]
    if tcp:
        lines.append(f"  loopback     http://{tcp}  (Authorization: Bearer <admin token>)")
    lines += [
        "",
        "Try it from another terminal:",
        f"  {env}{sandvisor} run -- echo hello from a sandbox",
        f"  {env}{sandvisor} run --bg -- 'for i in 1 2 3; do echo tick $i; sleep 1; done'",
        f"  {env}{sandvisor} ps",
        f'  curl --unix-socket {sock} -H "Authorization: Bearer $(cat {token})" http://sandvisor/healthz',
        "",
        "MCP clients (stdio; one connection = one session, ended when it closes):",
        f"  Claude Code:   claude mcp add sandvisor -- {env}{sandvisor} mcp",
        "  .mcp.json / Claude Desktop (claude_desktop_config.json):",
        *("    " + line for line in mcp_json.splitlines()),
        "",
        "Ctrl-C stops the daemon; running tasks are left for the next start to re-adopt.",
    ]
    return "\n".join(lines)


def dashboard_banner(url: str) -> str:
    """The dashboard's login link, Jupyter style."""
    return "\n".join(
        [
            "",
            "Dashboard: open this link to log in (it works once, within a day):",
            f"    {url}",
            "  A new link any time: sandvisor ui",
        ]
    )


def main_serve(settings: DaemonSettings) -> int:
    try:
        return asyncio.run(run_daemon(settings))
    except KeyboardInterrupt:  # pragma: no cover - signal handler normally wins
        return 130
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
            return 1
        raise
