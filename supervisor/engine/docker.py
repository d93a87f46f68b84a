"""Docker Engine backend: docker-py for control calls (offloaded), raw asyncio for streams."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import docker
import docker.errors
import requests.exceptions

from supervisor.core.container import ContainerRequest, ContainerState, ContainerSummary, Segment
from supervisor.core.demux import FrameDemux
from supervisor.core.errors import (
    EngineError,
    EngineUnavailable,
    ImageMissing,
    RuntimeUnavailable,
    SupervisorError,
)
from supervisor.core.logs import get_logger
from supervisor.engine.base import AttachedStream
from supervisor.engine.endpoint import READ_SIZE, Endpoint

T = TypeVar("T")
log = get_logger("supervisor.engine.docker")

#: Attach streams land in buffers of these sizes (a new one when 1/16 is left).
_CHUNK = 1 << 20
_SMALL_CHUNK = 16 * 1024
#: Stop reading from the engine while this much output waits for the capture loop.
_PAUSE_AT = 8 << 20


class _NotFoundError(Exception):
    """Internal: the engine answered 404."""


def _translate(exc: BaseException, what: str) -> SupervisorError:
    """Map docker-py / requests errors to our tree."""
    if isinstance(exc, SupervisorError):
        return exc
    if isinstance(exc, docker.errors.ImageNotFound):
        return ImageMissing(f"{what}: image not found: {exc.explanation or exc}")
    if isinstance(exc, docker.errors.APIError):
        text = str(exc.explanation or exc)
        if "unknown or invalid runtime" in text or ("runtime" in text and "not" in text):
            return RuntimeUnavailable(f"{what}: {text}")
        if exc.status_code == 404 and "No such image" in text:
            return ImageMissing(f"{what}: {text}")
        return EngineError(f"{what}: {text}")
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError, OSError)):
        return EngineUnavailable(f"{what}: the Docker engine does not answer ({exc})")
    if isinstance(exc, docker.errors.DockerException):
        return EngineUnavailable(f"{what}: {exc}")
    return EngineError(f"{what}: {type(exc).__name__}: {exc}")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
        raise EngineUnavailable(f"engine closed the connection: {exc}") from exc
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    return b"".join([block async for block in _body_blocks(reader, headers)])


async def _body_blocks(
    reader: asyncio.StreamReader, headers: dict[str, str]
) -> AsyncIterator[bytes]:
    """The body in blocks as they arrive (content-length, chunked, or until close)."""
    if "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            block = await reader.read(min(remaining, READ_SIZE))
            if not block:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(block)
            yield block
        return
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            while size > 0:
                block = await reader.read(min(size, READ_SIZE))
                if not block:
                    raise asyncio.IncompleteReadError(b"", size)
                size -= len(block)
                yield block
            await reader.readexactly(2)
    while block := await reader.read(READ_SIZE):
        yield block


class _AttachProtocol(asyncio.BufferedProtocol):
    """A hijacked attach connection: the engine's bytes land directly in our own buffers
    (no intermediate copies), are split into frames on arrival, and wait as zero-copy views
    until the capture loop takes all of them at once. Reading pauses while too much waits.
    """

    def __init__(self, request: bytes) -> None:
        self._request = request
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.status: int | None = None
        self.head_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Quiet tasks keep a small buffer; a stream that fills one fast gets large ones.
        self._buf = bytearray(_SMALL_CHUNK)
        self._pos = 0
        self._buf_since = 0.0
        self._demux = FrameDemux()
        self._segments: list[Segment] = []
        self._pending = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.eof = False
        self._can_write = asyncio.Event()
        self._can_write.set()

    # -- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buf) - self._pos < len(self._buf) // 16:
            # A fresh buffer (views handed out keep the old one alive until written): large
            # when the last one filled within 50 ms (a flood), small otherwise (a quiet task
            # costs 16 KiB, not 1 MiB).
            now = asyncio.get_running_loop().time()
            fast = now - self._buf_since < 0.05
            self._buf = bytearray(_CHUNK if fast else _SMALL_CHUNK)
            self._pos = 0
            self._buf_since = now
        return memoryview(self._buf)[self._pos :]

    def buffer_updated(self, nbytes: int) -> None:
        data = memoryview(self._buf)[self._pos : self._pos + nbytes]
        self._pos += nbytes
        if self.status is None:
            self._handshake(bytes(data))
            return
        self._take(data)

    def _handshake(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > 65536:
                self._fail(EngineError("attach: the engine's answer has no end of headers"))
            return
        line = bytes(self.head[: self.head.find(b"\r\n")]).decode("latin-1")
        try:
            self.status = int(line.split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail(EngineError(f"attach: unexpected answer {line!r}"))
            return
        rest = bytes(self.head[end + 4 :])
        del self.head[end + 4 :]
        if not self.head_done.done():
            self.head_done.set_result(None)
        if rest and self.status in (101, 200):
            self._take(memoryview(rest))

    def _fail(self, exc: Exception) -> None:
        if not self.head_done.done():
            self.head_done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _take(self, data: memoryview) -> None:
        pieces = self._demux.feed_views(data)
        if pieces:
            self._segments.extend(pieces)
            self._pending += len(data)
            self._wake()
        if self._pending > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._can_write.set()
        if not self.head_done.done():
            self.head_done.set_exception(
                EngineUnavailable(f"attach: the engine closed the connection ({exc})")
            )
        self._wake()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- for the stream -----------------------------------------------------------------

    async def next_segments(self) -> list[Segment] | None:
        while not self._segments:
            if self.eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        segments, self._segments, self._pending = self._segments, [], 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return segments

    async def drain(self) -> None:
        await self._can_write.wait()


class DockerAttach:
    """A hijacked attach connection read with asyncio: no thread per task."""

    def __init__(self, protocol: _AttachProtocol, *, stdin: bool) -> None:
        self._protocol = protocol
        self._stdin_open = stdin
        self._closed = False

    async def read(self) -> list[Segment] | None:
        return await self._protocol.next_segments()

    async def write(self, data: bytes) -> None:
        transport = self._protocol.transport
        if not self._stdin_open or self._closed or transport is None or transport.is_closing():
            raise BrokenPipeError("stdin is closed")
        transport.write(data)
        await self._protocol.drain()

    async def close_stdin(self) -> None:
        transport = self._protocol.transport
        if self._stdin_open and not self._closed and transport is not None:
            self._stdin_open = False
            with contextlib.suppress(OSError, RuntimeError):
                if transport.can_write_eof():
                    transport.write_eof()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._protocol.transport is not None:
            self._protocol.transport.close()


def _state_from_inspect(data: dict[str, Any]) -> ContainerState:
    state = data.get("State") or {}
    config = data.get("Config") or {}
    return ContainerState(
        id=data["Id"],
        status=state.get("Status", "unknown"),
        running=bool(state.get("Running")),
        exit_code=state.get("ExitCode") if state.get("Status") in ("exited", "dead") else None,
        oom_killed=bool(state.get("OOMKilled")),
        error=state.get("Error") or None,
        started_at=state.get("StartedAt"),
        finished_at=state.get("FinishedAt"),
        labels=config.get("Labels") or {},
        pid=state.get("Pid") or None,
        runtime=(data.get("HostConfig") or {}).get("Runtime"),
    )


def request_to_config(req: ContainerRequest) -> dict[str, Any]:
    """Engine API body for POST /containers/create (pure; tested without an engine)."""
    host_config: dict[str, Any] = {
        "NetworkMode": req.network,
        "CapDrop": ["ALL"],
        "CapAdd": list(req.cap_add),
        "SecurityOpt": ["no-new-privileges:true"],
        "Privileged": False,
        "ReadonlyRootfs": req.read_only,
        "Tmpfs": dict(req.tmpfs),
        "Memory": req.memory_bytes,
        "MemorySwap": req.memory_bytes,
        "NanoCpus": req.nano_cpus,
        "PidsLimit": req.pids_limit,
        "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in req.ulimits],
        "Init": req.init,
        "Runtime": req.runtime,
        "AutoRemove": False,
        "RestartPolicy": {"Name": "no"},
        "IpcMode": "private",
        "LogConfig": {
            "Type": "json-file",
            "Config": {"max-size": req.log_max_size, "max-file": str(req.log_max_files)},
        },
        "Mounts": [
            {"Type": "bind", "Source": m.source, "Target": m.target, "ReadOnly": m.read_only}
            for m in req.mounts
        ],
    }
    config: dict[str, Any] = {
        "Image": req.image,
        "Cmd": list(req.command),
        "Entrypoint": [],
        "Env": [f"{k}={v}" for k, v in req.env.items()],
        "Labels": dict(req.labels),
        "User": req.user,
        "WorkingDir": req.working_dir,
        "Tty": False,
        "OpenStdin": req.stdin_open,
        # StdinOnce: when our attach half-closes, the engine closes the command's stdin
        # (that is how send_input(eof=True) works). The price: if the supervisor dies, the
        # dropped connection also gives the command EOF. See README "Crash semantics".
        "StdinOnce": req.stdin_open,
        "AttachStdin": req.stdin_open,
        "AttachStdout": True,
        "AttachStderr": True,
        "StopSignal": "SIGTERM",
        "HostConfig": host_config,
    }
    if req.network not in ("none", "host", "bridge", "default") and req.network_aliases:
        config["NetworkingConfig"] = {
            "EndpointsConfig": {req.network: {"Aliases": list(req.network_aliases)}}
        }
    return config


class DockerBackend:
    """The Docker Engine through its API. Every docker-py call runs in one bounded thread pool."""

    name = "docker"

    def __init__(self, base_url: str | None = None, *, max_workers: int = 16) -> None:
        self._endpoint = Endpoint(base_url)
        self.local = self._endpoint.local
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sbx-docker")
        self._max_workers = max_workers
        self._client: Any = None
        self._api_prefix = "/v1.41"
        self._client_lock = asyncio.Lock()

    # -- plumbing ---------------------------------------------------------------------

    async def _offload(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def _api(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:

                def make() -> Any:
                    return docker.APIClient(
                        base_url=self._endpoint.url,
                        version="auto",
                        timeout=60,
                        max_pool_size=self._max_workers,
                        tls=bool(self._endpoint.ssl),
                    )

                try:
                    client = await self._offload(make)
                except Exception as exc:
                    raise _translate(exc, "connect") from exc
                self._api_prefix = f"/v{client.api_version}"
                self._client = client
        return self._client

    async def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        client = await self._api()
        try:
            return await self._offload(getattr(client, method), *args, **kwargs)
        except docker.errors.NotFound as exc:
            if isinstance(exc, docker.errors.ImageNotFound):
                raise _translate(exc, what) from exc
            raise _NotFoundError(str(exc)) from exc
        except Exception as exc:
            raise _translate(exc, what) from exc

    @contextlib.asynccontextmanager
    async def _request(
        self, method: str, path: str
    ) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        """A plain request (no body) sent on its own connection, closed afterwards."""
        await self._api()
        reader, writer = await self._endpoint.connect()
        try:
            writer.write(
                f"{method} {self._api_prefix}{path} HTTP/1.1\r\nHost: docker\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            try:
                yield reader, writer
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise EngineUnavailable(f"engine dropped {method} {path}: {exc}") from exc
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)

    async def _raw(
        self, method: str, path: str, *, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """A plain request on its own connection (for long waits that must not hold a thread)."""
        async with self._request(method, path) as (reader, _):

            async def exchange() -> tuple[int, bytes]:
                status, headers = await _read_head(reader)
                return status, await _read_body(reader, headers)

            return await asyncio.wait_for(exchange(), timeout)

    async def _raw_stream(self, method: str, path: str) -> AsyncIterator[bytes]:
        """A plain request whose body is yielded as it arrives (for bodies too large to
        hold: a container's whole log)."""
        async with self._request(method, path) as (reader, _):
            status, headers = await _read_head(reader)
            if status == 404:
                raise EngineError(f"{method} {path}: no such container")
            if status != 200:
                body = await _read_body(reader, headers)
                raise EngineError(f"{method} {path}: HTTP {status}: {body[:200]!r}")
            async for block in _body_blocks(reader, headers):
                yield block

    # -- Backend protocol -------------------------------------------------------------

    async def ping(self) -> dict[str, str]:
        info = await self._call("ping", "version")
        return {
            "version": str(info.get("Version", "?")),
            "api_version": str(info.get("ApiVersion", "?")),
            "os": str(info.get("Os", "?")),
            "kernel": str(info.get("KernelVersion", "?")),
        }

    async def alive(self) -> bool:
        if self._client is None:
            try:
                await self._api()
            except SupervisorError:
                return False
        try:
            status, body = await self._raw("GET", "/_ping", timeout=2.0)
        except (SupervisorError, TimeoutError, OSError):
            return False
        return status == 200 and body.strip() == b"OK"

    async def create(self, request: ContainerRequest) -> str:
        client = await self._api()
        config = request_to_config(request)
        try:
            result = await self._offload(client.create_container_from_config, config, request.name)
        except docker.errors.NotFound as exc:
            raise ImageMissing(
                f"image {request.image!r} is not present on the engine; build it with "
                f"`sbx images build` ({exc.explanation or exc})"
            ) from exc
        except Exception as exc:
            raise _translate(exc, f"create container {request.name}") from exc
        return str(result["Id"])

    async def attach(self, container_id: str, *, stdin: bool, logs: bool) -> AttachedStream:
        await self._api()
        query = urllib.parse.urlencode(
            {"stream": 1, "stdout": 1, "stderr": 1, "stdin": int(stdin), "logs": int(logs)}
        )
        request = (
            f"POST {self._api_prefix}/containers/{container_id}/attach?{query} HTTP/1.1\r\n"
            "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
        protocol = await self._endpoint.connect_protocol(lambda: _AttachProtocol(request))
        try:
            await asyncio.wait_for(asyncio.shield(protocol.head_done), 60)
        except BaseException:
            if protocol.transport is not None:
                protocol.transport.close()
            raise
        if protocol.status not in (101, 200):
            if protocol.transport is not None:
                protocol.transport.close()
            if protocol.status == 404:
                raise EngineError(f"attach: no such container {container_id[:12]}")
            raise EngineError(f"attach {container_id[:12]}: HTTP {protocol.status}")
        return DockerAttach(protocol, stdin=stdin)

    async def pause(self, container_id: str) -> None:
        try:
            await self._call("pause", "pause", container_id)
        except _NotFoundError as exc:
            raise EngineError(f"pause: no such container {container_id[:12]}") from exc

    async def unpause(self, container_id: str) -> None:
        try:
            await self._call("unpause", "unpause", container_id)
        except _NotFoundError:
            return
        except EngineError as exc:
            if "is not paused" in str(exc) or "is not running" in str(exc):
                return
            raise

    async def logs(
        self, container_id: str, *, tail: int | None = None, timestamps: bool = False
    ) -> AsyncIterator[list[Segment]]:
        query = urllib.parse.urlencode(
            {
                "stdout": 1,
                "stderr": 1,
                "follow": 0,
                "timestamps": int(timestamps),
                "tail": "all" if tail is None else str(tail),
            }
        )
        demux = FrameDemux()
        async for block in self._raw_stream("GET", f"/containers/{container_id}/logs?{query}"):
            pieces: list[Segment] = list(
                demux.feed_frames(block) if timestamps else demux.feed(block)
            )
            if pieces:
                yield pieces

    async def start(self, container_id: str) -> None:
        try:
            await self._call("start", "start", container_id)
        except _NotFoundError as exc:
            raise EngineError(f"start: container {container_id[:12]} vanished") from exc

    async def wait(self, container_id: str) -> ContainerState:
        status, body = await self._raw(
            "POST", f"/containers/{container_id}/wait?condition=not-running"
        )
        if status == 404:
            raise EngineError(f"wait: container {container_id[:12]} vanished")
        if status != 200:
            raise EngineError(f"wait {container_id[:12]}: HTTP {status}: {body[:200]!r}")
        state = await self.inspect(container_id)
        if state is None:
            code = json.loads(body or b"{}").get("StatusCode")
            return ContainerState(id=container_id, status="exited", running=False, exit_code=code)
        return state

    async def kill(self, container_id: str, signal: Literal["SIGTERM", "SIGKILL"]) -> None:
        try:
            await self._call("kill", "kill", container_id, signal=signal)
        except _NotFoundError:
            return
        except EngineError as exc:
            if "is not running" in str(exc):
                return
            raise

    async def inspect(self, container_id: str) -> ContainerState | None:
        try:
            data = await self._call("inspect", "inspect_container", container_id)
        except _NotFoundError:
            return None
        return _state_from_inspect(data)

    async def remove(self, container_id: str) -> None:
        try:
            await self._call("remove", "remove_container", container_id, force=True, v=True)
        except _NotFoundError:
            return
        except EngineError as exc:
            if "already in progress" in str(exc) or "No such container" in str(exc):
                return
            raise

    async def list_labeled(self, label: str) -> list[ContainerSummary]:
        rows = await self._call("list", "containers", all=True, filters={"label": label})
        return [
            ContainerSummary(id=r["Id"], status=r.get("State", "?"), labels=r.get("Labels") or {})
            for r in rows
        ]

    async def image_id(self, image: str) -> str | None:
        try:
            data = await self._call("inspect image", "inspect_image", image)
        except (_NotFoundError, ImageMissing):
            return None
        return str(data["Id"])

    async def runtimes(self) -> set[str]:
        info = await self._call("info", "info")
        return set((info.get("Runtimes") or {}).keys())

    async def live_restore(self) -> bool:
        info = await self._call("info", "info")
        return bool(info.get("LiveRestoreEnabled"))

    async def cpu_time_ns(self, container_id: str) -> int | None:
        try:
            stats = await self._call("stats", "stats", container_id, stream=False, one_shot=True)
        except (_NotFoundError, EngineError):
            return None
        try:
            return int(stats["cpu_stats"]["cpu_usage"]["total_usage"])
        except (KeyError, TypeError, ValueError):
            return None

    async def host_pids(self, container_id: str) -> list[int] | None:
        if not self.local:
            return None
        try:
            top = await self._call("top", "top", container_id, ps_args="-o pid")
        except (_NotFoundError, EngineError):
            return None
        titles = top.get("Titles") or []
        if "PID" not in titles:
            return None
        idx = titles.index("PID")
        pids: list[int] = []
        for row in top.get("Processes") or []:
            with contextlib.suppress(ValueError, IndexError):
                pids.append(int(row[idx]))
        return pids

    async def ensure_network(self, name: str, labels: dict[str, str]) -> None:
        existing = await self._call("networks", "networks", names=[name])
        if any(n.get("Name") == name for n in existing):
            return
        try:
            await self._call(
                "create network",
                "create_network",
                name,
                driver="bridge",
                labels=labels,
                check_duplicate=True,
            )
        except EngineError as exc:
            if "already exists" not in str(exc):
                raise

    async def remove_network(self, name: str) -> None:
        with contextlib.suppress(_NotFoundError):
            await self._call("remove network", "remove_network", name)

    async def connect_network(self, container_id: str, network: str) -> None:
        await self._call("connect network", "connect_container_to_network", container_id, network)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await self._offload(client.close)
        self._pool.shutdown(wait=False, cancel_futures=True)
