"""Async client for the daemon's HTTP API (used by the CLI and the MCP server).

An error answer is raised again as the ``SupervisorError`` subclass its ``code`` names
(``TaskNotRunning`` with the task's final info, ``TaskNotFound``, ...), with ``status`` and
``body`` set; losing the daemon raises :class:`DaemonNotRunning` or :class:`DaemonError`.

Tasks come back as the daemon's JSON (``TaskInfo.model_dump(mode="json")``), not decoded:
the CLI prints that JSON as it is, and its texts (``core.text``) read it directly, so a
command like ``sandvisor ps`` never imports pydantic (which would double its run time). The MCP
server decodes with :func:`task_info`.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from supervisor.core.paths import admin_token_file, daemon_socket
from supervisor.interfaces.client_workspace import WorkspaceCalls
from supervisor.interfaces.http import Endpoint, Response
from supervisor.interfaces.http_errors import DaemonError, DaemonNotRunning, from_wire

if TYPE_CHECKING:
    from supervisor.core.models import TaskInfo

__all__ = [
    "Chunk",
    "DaemonError",
    "DaemonNotRunning",
    "SandvisorClient",
    "task_info",
]

#: Server-side waits are capped at 300 s; the client loops for longer waits.
_SERVER_WAIT_CAP = 300.0
#: Server-side long-poll per request while following output or events.
FOLLOW_WAIT_S = 25.0
#: Bytes per read of the output file.
READ_CHUNK = 1 << 20

#: A task as the daemon answers it: ``TaskInfo`` in JSON form.
TaskJson = dict[str, Any]


class Chunk(NamedTuple):
    """Exact bytes of a task's output file."""

    data: bytes
    offset: int
    """Where ``data`` starts in the file."""
    next_offset: int
    """Where the next read starts."""
    eof: bool
    """The task has ended and nothing follows ``next_offset``."""


def _absolute(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute against our working directory (the daemon's is another):
    a getcwd, no filesystem walk."""
    return os.path.abspath(path)


def daemon_paths(state_dir: Path | None = None) -> tuple[Path, Path]:
    """(socket path, admin token file) of the daemon for ``state_dir``."""
    return daemon_socket(state_dir), admin_token_file(state_dir)


def task_info(body: TaskJson) -> TaskInfo:
    """A task's JSON as a ``TaskInfo``."""
    # Here, not at the top: see the module docstring.
    from supervisor.core.models import TaskInfo  # noqa: PLC0415

    return TaskInfo.model_validate(body)


class SandvisorClient(WorkspaceCalls):
    """Requests to one daemon, over its unix socket (or loopback TCP)."""

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
        self.socket_path = socket_path
        self.endpoint = (
            Endpoint(socket_path=socket_path) if socket_path else Endpoint.from_url(str(base_url))
        )
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout

    @classmethod
    def for_state_dir(
        cls, state_dir: Path | None = None, token: str | None = None
    ) -> SandvisorClient:
        """The local daemon of ``state_dir`` with its admin token.

        ``$SANDVISOR_URL`` and ``$SANDVISOR_TOKEN`` point elsewhere.
        """
        url = os.environ.get("SANDVISOR_URL")
        sock, token_file = daemon_paths(state_dir)
        if token is None:
            token = os.environ.get("SANDVISOR_TOKEN")
        if token is None and token_file.exists():
            token = token_file.read_text().strip()
        if url:
            return cls(base_url=url, token=token)
        return cls(socket_path=sock, token=token)

    async def aclose(self) -> None:
        """Nothing to release (a connection lasts one request); kept for ``async with``."""

    async def __aenter__(self) -> SandvisorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing -------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
    ) -> Response:
        return await self.endpoint.request(
            method,
            path,
            params=params,
            json_body=json,
            headers=self._headers,
            connect_timeout_s=self._timeout,
            # Long-polls last up to the server's cap; a stop waits out a grace period.
            read_timeout_s=_SERVER_WAIT_CAP + self._timeout,
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        ids: tuple[str | None, str | None] = (None, None),
    ) -> Response:
        """The answer, or the error it stands for (``ids``: the session and task the
        request names, for errors whose body does not repeat them)."""
        response = await self._send(method, path, params=params, json=json)
        if response.status >= 400:
            try:
                body = response.json()
            except DaemonError:
                body = {}  # not the API's JSON (a proxy's page): from_wire says HttpError
            sid, tid = ids
            raise from_wire(body, response.status, session_id=sid, task_id=tid)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._request(method, path, **kwargs)).json()

    @staticmethod
    def _task_path(session_id: str, task_id: str, tail: str = "") -> dict[str, Any]:
        """``path`` and ``ids`` of a task's route, as keyword arguments of :meth:`_request`."""
        return {
            "path": f"/sessions/{session_id}/tasks/{task_id}{tail}",
            "ids": (session_id, task_id),
        }

    # -- health and sessions --------------------------------------------------------------

    async def reachable(self) -> bool:
        """Whether the daemon accepts connections (cheaper than :meth:`healthz`)."""
        return await self.endpoint.reachable(self._timeout)

    async def healthz(self) -> dict[str, Any]:
        """Engine state and load (also when the engine is down: ``status: degraded``) with
        the admin token; with any other, only ``{"ok": True}`` (liveness)."""
        return dict((await self._send("GET", "/healthz")).json())

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        workspace: str | os.PathLike[str] | None = None,
        workspace_mode: str | None = None,
        policy: str | None = None,
    ) -> dict[str, Any]:
        """Open (or re-open) a session and mint a token for it (admin token only).
        ``workspace``: the project directory its tasks run on (sent as an absolute path;
        fixed when the session opens), seen as ``workspace_mode`` (overlay, ro, rw);
        ``policy`` decides whom tasks of a root-owned workspace run as."""
        body: dict[str, Any] = {"session_id": session_id} if session_id else {}
        if workspace is not None:
            ws: dict[str, Any] = {"path": _absolute(workspace)}
            if workspace_mode:
                ws["mode"] = workspace_mode
            body["workspace"] = ws
        if policy:
            body["policy"] = policy
        return dict(await self._json("POST", "/sessions", json=body, ids=(session_id, None)))

    async def sessions(self) -> list[dict[str, Any]]:
        return list(await self._json("GET", "/sessions"))

    async def session(self, session_id: str) -> dict[str, Any]:
        """One open session (SessionNotFound when it is not open)."""
        return dict(await self._json("GET", f"/sessions/{session_id}", ids=(session_id, None)))

    async def end_session(self, session_id: str) -> dict[str, Any]:
        return dict(await self._json("DELETE", f"/sessions/{session_id}", ids=(session_id, None)))

    # -- tasks ----------------------------------------------------------------------------

    async def start(self, sid: str, spec: dict[str, Any], *, wait_output_s: float = 0) -> TaskJson:
        """``wait_output_s``: answer once the first output came; it is in ``output``."""
        params = {"wait_output_s": min(wait_output_s, _SERVER_WAIT_CAP)}
        path = f"/sessions/{sid}/tasks"
        return dict(await self._json("POST", path, json=spec, params=params, ids=(sid, None)))

    async def tasks(
        self, session_id: str, *, kind: str | None = None, active: bool = False
    ) -> list[TaskJson]:
        params: dict[str, Any] = {"active": str(active).lower()}
        if kind:
            params["kind"] = kind
        path = f"/sessions/{session_id}/tasks"
        return list(await self._json("GET", path, params=params, ids=(session_id, None)))

    async def task(self, session_id: str, task_id: str) -> TaskJson:
        return dict(await self._json("GET", **self._task_path(session_id, task_id)))

    async def find_task(self, task_id: str) -> TaskJson:
        """The task in whichever open session holds it (that the token may see)."""
        return dict(await self._json("GET", f"/tasks/{task_id}", ids=(None, task_id)))

    async def stop(self, session_id: str, task_id: str) -> TaskJson:
        """The final info; TaskNotRunning (with it) when the task had already ended."""
        return dict(await self._json("POST", **self._task_path(session_id, task_id, "/stop")))

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
            import base64  # noqa: PLC0415 - only input of raw bytes needs it

            body["data_b64"] = base64.b64encode(data).decode()
        else:
            body["text"] = text or ""
        await self._request("POST", json=body, **self._task_path(session_id, task_id, "/input"))

    async def wait(
        self, session_id: str, task_id: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """``{"timed_out": false, "task": <final>}``, or ``timed_out`` true with the task as
        it is when time runs out (None: wait as long as it takes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        where = self._task_path(session_id, task_id, "/wait")
        while True:
            chunk = _SERVER_WAIT_CAP
            if deadline is not None:
                chunk = max(0.001, min(chunk, deadline - time.monotonic()))
            body = dict(await self._json("POST", json={"timeout_s": chunk}, **where))
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
        """``{"matched": true, "line", "offset"}`` for the first line matching ``pattern``,
        or ``matched`` false when time runs out; TaskNotRunning when the task ended without
        printing one."""
        deadline = time.monotonic() + timeout_s
        where = self._task_path(session_id, task_id, "/wait-for")
        while True:
            chunk = max(0.001, min(_SERVER_WAIT_CAP, deadline - time.monotonic()))
            body = {"pattern": pattern, "timeout_s": chunk, "from_offset": from_offset}
            found = dict(await self._json("POST", json=body, **where))
            if found["matched"] or time.monotonic() >= deadline:
                return found

    # -- output ---------------------------------------------------------------------------

    async def read_output(
        self,
        session_id: str,
        task_id: str,
        *,
        offset: int = 0,
        limit: int = READ_CHUNK,
        wait_s: float = 0.0,
    ) -> Chunk:
        """Exact bytes from ``offset``; ``wait_s`` waits for some when there are none yet."""
        wait_s = min(wait_s, _SERVER_WAIT_CAP)
        params = {"offset": offset, "limit": limit, "wait_s": wait_s, "encoding": "raw"}
        where = self._task_path(session_id, task_id, "/output")
        response = await self._request("GET", params=params, **where)
        try:
            next_offset = int(response.headers["x-next-offset"])
            eof = response.headers["x-eof"] == "true"
        except (KeyError, ValueError) as exc:
            raise DaemonError(f"the daemon's output answer lacks its offsets ({exc})") from exc
        return Chunk(response.content, offset, next_offset, eof)

    async def follow_output(
        self,
        session_id: str,
        task_id: str,
        offset: int = 0,
        *,
        follow: bool = True,
        limit: int = READ_CHUNK,
    ) -> AsyncIterator[Chunk]:
        """Output from ``offset`` as it arrives, until the task has ended (``follow``) or
        until what there is now has been read. Never yields an empty chunk."""
        wait_s = FOLLOW_WAIT_S if follow else 0.0
        while True:
            piece = await self.read_output(
                session_id, task_id, offset=offset, limit=limit, wait_s=wait_s
            )
            if piece.data:
                yield piece
            offset = piece.next_offset
            if piece.eof or (not piece.data and not follow):
                return

    async def tail(self, session_id: str, task_id: str, chars: int = 4000) -> str:
        """The last ``chars`` characters of the output."""
        where = self._task_path(session_id, task_id, "/tail")
        return str((await self._json("GET", params={"chars": chars}, **where))["text"])

    # -- events and notifications ---------------------------------------------------------

    async def events(
        self, session_id: str, *, after: int = 0, wait_s: float = 0.0, limit: int = 500
    ) -> dict[str, Any]:
        """``{"events": [...], "last_seq", "ended"}``: events after ``after`` as JSON."""
        wait_s = min(wait_s, _SERVER_WAIT_CAP)
        params = {"after": after, "wait_s": wait_s, "limit": limit}
        path = f"/sessions/{session_id}/events"
        return dict(await self._json("GET", path, params=params, ids=(session_id, None)))

    async def follow_events(
        self, session_id: str, after: int = 0, *, follow: bool = True
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of events (as JSON, in seq order) after ``after``: until the session has
        ended (``follow``, long-polling) or until what there is now has been read."""
        cursor = after
        wait_s = FOLLOW_WAIT_S if follow else 0.0
        while True:
            body = await self.events(session_id, after=cursor, wait_s=wait_s)
            batch: list[dict[str, Any]] = body["events"]
            cursor = max(cursor, int(body["last_seq"]))
            if batch:
                yield batch
                if any(ev.get("type") == "session.ended" for ev in batch):
                    return
            elif not follow or body.get("ended"):
                return

    async def notifications(
        self, session_id: str, *, after: int = 0, fmt: str = "xml", wait_s: float = 0.0
    ) -> tuple[Any, int]:
        """(xml text or list of JSON notifications, last seq they cover)."""
        wait_s = min(wait_s, _SERVER_WAIT_CAP)
        params = {"after": after, "format": fmt, "wait_s": wait_s}
        path = f"/sessions/{session_id}/notifications"
        response = await self._request("GET", path, params=params, ids=(session_id, None))
        if fmt == "xml":
            return response.text, int(response.headers["x-sandvisor-last-seq"])
        body = response.json()
        return body["notifications"], int(body["last_seq"])

    async def pending(self, session_id: str, consumer: str, fmt: str = "xml") -> dict[str, Any]:
        """Notifications ``consumer`` has not acknowledged: ``{"notifications", "cursor",
        "acked"}``."""
        params = {"consumer": consumer, "format": fmt}
        path = f"/sessions/{session_id}/notifications/pending"
        return dict(await self._json("GET", path, params=params, ids=(session_id, None)))

    async def ui_login(self, ttl_s: float) -> dict[str, Any]:
        """A one-time dashboard login link for this token: ``{"url", "expires_at"}``."""
        return dict(await self._json("POST", "/ui/logins", json={"ttl_s": ttl_s}))

    async def ack(self, session_id: str, consumer: str, seq: int) -> None:
        """Record that ``consumer`` delivered everything up to ``seq``."""
        path = f"/sessions/{session_id}/notifications/ack"
        body = {"consumer": consumer, "seq": seq}
        await self._request("POST", path, json=body, ids=(session_id, None))
