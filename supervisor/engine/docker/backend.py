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

from supervisor.core.container import (
    ContainerRequest,
    ContainerState,
    ContainerSummary,
    EngineCapabilities,
    NetworkSummary,
    Segment,
    VolumeRequest,
    VolumeSummary,
)
from supervisor.core.demux import FrameDemux
from supervisor.core.errors import EngineError, ImageMissing, SupervisorError
from supervisor.core.logs import get_logger
from supervisor.engine.base import AttachedStream
from supervisor.engine.docker import http
from supervisor.engine.docker.attach import open_attach
from supervisor.engine.docker.convert import request_to_config, state_from_inspect, translate_error
from supervisor.engine.endpoint import Endpoint

T = TypeVar("T")
log = get_logger("supervisor.engine.docker")


class _NotFoundError(EngineError):
    """The engine answered 404. The calls that expect one (a container or network that may be
    gone) catch it; anywhere else it stays an ``EngineError`` with the engine's message, so no
    caller meets a bare exception."""

    code = "engine_not_found"


class DockerBackend:
    """The Docker Engine through its API. Every docker-py call runs in one bounded thread pool."""

    name = "docker"
    capabilities = EngineCapabilities()

    def __init__(
        self, base_url: str | None = None, *, max_workers: int = 16, tls_dir: str | None = None
    ) -> None:
        self._endpoint = Endpoint(base_url, tls_dir=tls_dir)
        self.local = self._endpoint.local
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="sandvisor-docker"
        )
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
                        tls=self._endpoint.docker_py_tls(),
                    )

                try:
                    client = await self._offload(make)
                except Exception as exc:
                    raise translate_error(exc, "connect") from exc
                self._api_prefix = f"/v{client.api_version}"
                self._client = client
        return self._client

    async def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        client = await self._api()
        try:
            return await self._offload(getattr(client, method), *args, **kwargs)
        except docker.errors.NotFound as exc:
            if isinstance(exc, docker.errors.ImageNotFound):
                raise translate_error(exc, what) from exc
            raise _NotFoundError(str(exc)) from exc
        except Exception as exc:
            raise translate_error(exc, what) from exc

    async def _raw(
        self, method: str, path: str, *, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """A plain request on its own connection (for long waits that must not hold a thread)."""
        await self._api()
        return await http.exchange(self._endpoint, self._api_prefix, method, path, timeout=timeout)

    async def _raw_stream(self, method: str, path: str) -> AsyncIterator[bytes]:
        """A plain request whose body is yielded as it arrives (for bodies too large to
        hold: a container's whole log)."""
        await self._api()
        async for block in http.stream_body(self._endpoint, self._api_prefix, method, path):
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
                f"`sandvisor images build` ({exc.explanation or exc})"
            ) from exc
        except Exception as exc:
            raise translate_error(exc, f"create container {request.name}") from exc
        return str(result["Id"])

    async def attach(self, container_id: str, *, stdin: bool, logs: bool) -> AttachedStream:
        await self._api()
        request = http.attach_request(self._api_prefix, container_id, stdin=stdin, logs=logs)
        return await open_attach(self._endpoint, request, container_id, stdin=stdin)

    @property
    def endpoint(self) -> Endpoint:
        """Where this engine listens."""
        return self._endpoint

    async def attach_input(self, container_id: str) -> AttachedStream:
        """Attach to stdin alone: no output on this connection (so a connection that is not
        read can never hold up the container's output)."""
        await self._api()
        request = http.attach_request(
            self._api_prefix, container_id, stdin=True, logs=False, output=False
        )
        return await open_attach(self._endpoint, request, container_id, stdin=True)

    async def follow_logs(
        self, container_id: str, *, whole: bool = True
    ) -> AsyncIterator[list[Segment]]:
        """The container's whole log from its first message (``whole``; else only what it
        adds from now on), then what it adds, until the container stops (one connection: no
        gap between the stored part and the live part, unlike an attach with ``logs``).
        Closing the iterator closes the connection."""
        tail = "all" if whole else "0"
        query = urllib.parse.urlencode({"stdout": 1, "stderr": 1, "follow": 1, "tail": tail})
        demux = FrameDemux()
        async for block in self._raw_stream("GET", f"/containers/{container_id}/logs?{query}"):
            pieces: list[Segment] = list(demux.feed(block))
            if pieces:
                yield pieces

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
        return state_from_inspect(data)

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
        # On its own connection, not a thread of the pool: the watchdog's canary is a
        # listing, and behind a burst of starts holding every thread it would wait its
        # turn and make a busy engine look wedged.
        query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": [label]})})
        status, body = await self._raw("GET", f"/containers/json?{query}")
        if status != 200:
            raise EngineError(f"list containers: HTTP {status}: {body[:200]!r}")
        try:
            rows = json.loads(body)
        except ValueError as exc:
            raise EngineError(f"list containers: the engine's answer is not JSON: {exc}") from exc
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

    async def pull_image(self, image: str) -> str:
        repo, tag = _split_reference(image)
        try:
            answer = await self._call(f"pull {image}", "pull", repo, tag=tag)
        except _NotFoundError as exc:
            raise ImageMissing(f"pull {image}: {exc}") from exc
        found = await self.image_id(image)
        if found is None:
            # The engine answers 200 and reports a failure midway inside its progress stream.
            errors = [
                str(line["error"])
                for line in map(_json_or_none, str(answer).splitlines())
                if isinstance(line, dict) and line.get("error")
            ]
            why = errors[-1] if errors else "the engine has no such image afterwards"
            raise ImageMissing(f"pull {image}: {why}")
        return found

    async def info(self) -> dict[str, Any]:
        """The engine's ``GET /info`` answer."""
        return dict(await self._call("info", "info"))

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

    async def ensure_network(
        self, name: str, labels: dict[str, str], *, internal: bool = False
    ) -> None:
        existing = await self._call("networks", "networks", names=[name])
        if any(n.get("Name") == name for n in existing):
            return
        try:
            await self._call(
                "create network",
                "create_network",
                name,
                driver="bridge",
                internal=internal,
                labels=labels,
                check_duplicate=True,
            )
        except EngineError as exc:
            if "already exists" not in str(exc):
                raise

    async def remove_network(self, name: str) -> None:
        with contextlib.suppress(_NotFoundError):
            await self._call("remove network", "remove_network", name)

    async def list_networks(self, label: str) -> list[NetworkSummary]:
        rows = await self._call("list networks", "networks", filters={"label": label})
        return [
            NetworkSummary(name=r["Name"], id=r["Id"], labels=r.get("Labels") or {})
            for r in rows or []
        ]

    async def create_volume(self, request: VolumeRequest) -> None:
        await self._call(
            "create volume",
            "create_volume",
            request.name,
            driver="local",
            driver_opts=dict(request.driver_opts),
            labels=dict(request.labels),
        )

    async def remove_volume(self, name: str) -> None:
        with contextlib.suppress(_NotFoundError):
            await self._call("remove volume", "remove_volume", name)

    async def list_volumes(self, label: str) -> list[VolumeSummary]:
        answer = await self._call("list volumes", "volumes", filters={"label": label})
        return [
            VolumeSummary(name=v["Name"], labels=v.get("Labels") or {})
            for v in (answer or {}).get("Volumes") or []
        ]

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await self._offload(client.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _split_reference(image: str) -> tuple[str, str | None]:
    """``repo[:tag][@digest]`` -> (repo, tag or digest); None when neither is given."""
    if "@" in image:
        repo, digest = image.split("@", 1)
        return repo, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1 :]
    return image, None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
