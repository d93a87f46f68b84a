"""Async client for the daemon's HTTP API (used by the CLI and the MCP server)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from supervisor.core.paths import admin_token_file, daemon_socket, default_state_dir

#: Server-side waits are capped at 300 s; the client loops for longer waits.
_SERVER_WAIT_CAP = 300.0


class ApiError(Exception):
    """The daemon answered with an error: HTTP status, stable code, message."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body


class DaemonNotRunning(Exception):
    """No daemon answers at the expected address."""


def daemon_paths(state_dir: Path | None = None) -> tuple[Path, Path]:
    """(socket path, admin token file) of the daemon for ``state_dir``."""
    return daemon_socket(state_dir), admin_token_file(state_dir)


class SbxClient:
    """One connection pool to the daemon, over its unix socket (or loopback TCP)."""

    def __init__(
        self,
        *,
        socket_path: Path | None = None,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if base_url is None and socket_path is None:
            raise ValueError("give socket_path or base_url")
        transport = httpx.AsyncHTTPTransport(uds=str(socket_path)) if socket_path else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.socket_path = socket_path
        self._http = httpx.AsyncClient(
            base_url=base_url or "http://sbx",
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(timeout, read=_SERVER_WAIT_CAP + 30),
        )

    @classmethod
    def for_state_dir(cls, state_dir: Path | None = None, token: str | None = None) -> SbxClient:
        """The local daemon of ``state_dir`` with its admin token (``$SBX_URL``/``$SBX_TOKEN``
        point elsewhere)."""
        url = os.environ.get("SBX_URL")
        env_token = os.environ.get("SBX_TOKEN")
        sock, token_file = daemon_paths(state_dir)
        if token is None:
            token = env_token
        if token is None and token_file.exists():
            token = token_file.read_text().strip()
        if url:
            return cls(base_url=url, token=token)
        return cls(socket_path=sock, token=token)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> SbxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing -------------------------------------------------------------------

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonNotRunning(str(exc)) from exc
        if response.status_code >= 400:
            try:
                body = response.json()
                err = body.get("error", {})
                code, message = str(err.get("code", "error")), str(err.get("message", ""))
            except (ValueError, AttributeError):
                body, code, message = {}, "error", response.text
            raise ApiError(response.status_code, code, message or response.reason_phrase, body)
        if response.status_code == 204:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response

    # -- API ------------------------------------------------------------------------

    async def healthz(self) -> dict[str, Any]:
        try:
            response = await self._http.get("/healthz")
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonNotRunning(str(exc)) from exc
        return dict(response.json())

    async def create_session(self, session_id: str | None = None) -> dict[str, Any]:
        body = {"session_id": session_id} if session_id else {}
        return dict(await self._request("POST", "/sessions", json=body))

    async def sessions(self) -> list[dict[str, Any]]:
        return list(await self._request("GET", "/sessions"))

    async def end_session(self, session_id: str) -> dict[str, Any]:
        return dict(await self._request("DELETE", f"/sessions/{session_id}"))

    async def start(self, session_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._request("POST", f"/sessions/{session_id}/tasks", json=spec))

    async def tasks(
        self, session_id: str, *, kind: str | None = None, active: bool = False
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"active": str(active).lower()}
        if kind:
            params["kind"] = kind
        return list(await self._request("GET", f"/sessions/{session_id}/tasks", params=params))

    async def task(self, session_id: str, task_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/sessions/{session_id}/tasks/{task_id}"))

    async def find_task(self, task_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/tasks/{task_id}"))

    async def stop(self, session_id: str, task_id: str) -> dict[str, Any]:
        return dict(await self._request("POST", f"/sessions/{session_id}/tasks/{task_id}/stop"))

    async def send_input(
        self,
        session_id: str,
        task_id: str,
        text: str | None = None,
        *,
        data: bytes | None = None,
        eof: bool = False,
    ) -> None:
        body: dict[str, Any] = {"eof": eof}
        if data is not None:
            import base64  # noqa: PLC0415

            body["data_b64"] = base64.b64encode(data).decode()
        else:
            body["text"] = text or ""
        await self._request("POST", f"/sessions/{session_id}/tasks/{task_id}/input", json=body)

    async def output(
        self,
        session_id: str,
        task_id: str,
        *,
        offset: int = 0,
        limit: int = 65536,
        wait_s: float = 0.0,
        encoding: str = "text",
    ) -> dict[str, Any]:
        params = {
            "offset": offset,
            "limit": limit,
            "wait_s": min(wait_s, _SERVER_WAIT_CAP),
            "encoding": encoding,
        }
        return dict(
            await self._request(
                "GET", f"/sessions/{session_id}/tasks/{task_id}/output", params=params
            )
        )

    async def output_raw(
        self,
        session_id: str,
        task_id: str,
        *,
        offset: int = 0,
        limit: int = 1 << 20,
        wait_s: float = 0.0,
    ) -> tuple[bytes, int, bool]:
        """(bytes, next_offset, eof), exact bytes."""
        params = {
            "offset": offset,
            "limit": limit,
            "wait_s": min(wait_s, _SERVER_WAIT_CAP),
            "encoding": "raw",
        }
        response = await self._request(
            "GET", f"/sessions/{session_id}/tasks/{task_id}/output", params=params
        )
        return (
            response.content,
            int(response.headers["X-Next-Offset"]),
            response.headers["X-EOF"] == "true",
        )

    async def follow_output(
        self, session_id: str, task_id: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        """Output bytes from ``offset`` as they arrive, until the task has ended."""
        while True:
            data, offset, eof = await self.output_raw(
                session_id, task_id, offset=offset, wait_s=25.0
            )
            if data:
                yield data
            if eof:
                return

    async def tail(self, session_id: str, task_id: str, chars: int = 4000) -> str:
        body = await self._request(
            "GET", f"/sessions/{session_id}/tasks/{task_id}/tail", params={"chars": chars}
        )
        return str(body["text"])

    async def wait(
        self, session_id: str, task_id: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Wait for the final status; ``{"timed_out": True, ...}`` when time runs out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            chunk = _SERVER_WAIT_CAP
            if deadline is not None:
                chunk = max(0.001, min(chunk, deadline - time.monotonic()))
            body = dict(
                await self._request(
                    "POST",
                    f"/sessions/{session_id}/tasks/{task_id}/wait",
                    json={"timeout_s": chunk},
                )
            )
            if not body["timed_out"] or (deadline is not None and time.monotonic() >= deadline):
                return body

    async def wait_for(
        self,
        session_id: str,
        task_id: str,
        pattern: str,
        timeout_s: float = 30.0,
        from_offset: int = 0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            chunk = max(0.001, min(_SERVER_WAIT_CAP, deadline - time.monotonic()))
            body = dict(
                await self._request(
                    "POST",
                    f"/sessions/{session_id}/tasks/{task_id}/wait-for",
                    json={"pattern": pattern, "timeout_s": chunk, "from_offset": from_offset},
                )
            )
            if body["matched"] or time.monotonic() >= deadline:
                return body

    async def events(
        self, session_id: str, *, after: int = 0, wait_s: float = 0.0, limit: int = 500
    ) -> dict[str, Any]:
        params = {"after": after, "wait_s": min(wait_s, _SERVER_WAIT_CAP), "limit": limit}
        return dict(await self._request("GET", f"/sessions/{session_id}/events", params=params))

    async def notifications(
        self, session_id: str, *, after: int = 0, fmt: str = "xml", wait_s: float = 0.0
    ) -> tuple[Any, int]:
        params = {"after": after, "format": fmt, "wait_s": min(wait_s, _SERVER_WAIT_CAP)}
        result = await self._request("GET", f"/sessions/{session_id}/notifications", params=params)
        if fmt == "xml":
            return result.text, int(result.headers["X-Sbx-Last-Seq"])
        return result["notifications"], int(result["last_seq"])

    async def pending(self, session_id: str, consumer: str, fmt: str = "xml") -> dict[str, Any]:
        return dict(
            await self._request(
                "GET",
                f"/sessions/{session_id}/notifications/pending",
                params={"consumer": consumer, "format": fmt},
            )
        )

    async def ack(self, session_id: str, consumer: str, seq: int) -> None:
        await self._request(
            "POST",
            f"/sessions/{session_id}/notifications/ack",
            json={"consumer": consumer, "seq": seq},
        )


async def ensure_daemon(
    state_dir: Path | None = None, *, quiet: bool = False, wait_s: float = 30.0
) -> SbxClient:
    """A client for the local daemon, starting ``sbx serve`` in the background if none
    answers (and saying so on stderr). ``$SBX_DAEMON_ARGS`` adds options to that command."""
    if os.environ.get("SBX_URL"):
        return SbxClient.for_state_dir(state_dir)
    if await _answers(state_dir):
        return SbxClient.for_state_dir(state_dir)
    state = state_dir or default_state_dir()
    log_path = state / "daemon" / "daemon.log"
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    cmd = [
        sys.executable,
        "-m",
        "supervisor.interfaces.cli.main",
        "serve",
        "--state-dir",
        str(state),
    ]
    # Extra `sbx serve` options for daemons started this way (e.g. --stop-tasks-on-exit).
    cmd += shlex.split(os.environ.get("SBX_DAEMON_ARGS", ""))
    proc = await asyncio.to_thread(_spawn, cmd, log_path)
    if not quiet:
        sys.stderr.write(
            f"sbx: no daemon was running; started one in the background "
            f"(pid {proc.pid}, log {log_path})\n"
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise DaemonNotRunning(f"the daemon exited with {proc.returncode}:\n{tail}")
        if await _answers(state_dir):
            return SbxClient.for_state_dir(state_dir)
        await asyncio.sleep(0.1)
    raise DaemonNotRunning(f"the daemon did not answer within {wait_s:.0f} s (log: {log_path})")


async def _answers(state_dir: Path | None) -> bool:
    """Whether the daemon of ``state_dir`` answers. The client callers use is built only
    afterwards: a daemon writes its admin token before it listens, so a client built before
    the daemon answered could lack the token (and get 401 from a daemon it just started)."""
    async with SbxClient.for_state_dir(state_dir) as probe:
        try:
            await probe.healthz()
        except DaemonNotRunning:
            return False
    return True


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the daemon detached from our session, logging to ``log_path``."""
    with open(log_path, "ab") as log_fh:
        return subprocess.Popen(
            cmd, stdout=log_fh, stderr=log_fh, stdin=subprocess.DEVNULL, start_new_session=True
        )


def load_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))
