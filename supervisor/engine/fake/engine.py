"""The fake engine (containers, images, networks and injected faults, all in memory) and
FakeBackend, the Backend Protocol on top of it with the Docker backend's error rules."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import re
import shlex
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Literal

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
from supervisor.core.demux import FrameDemux, encode_frame
from supervisor.core.errors import (
    EngineError,
    EngineUnavailable,
    ImageMissing,
    RuntimeUnavailable,
    SupervisorError,
)
from supervisor.core.resolve import MERGE_PREFIX
from supervisor.engine.base import AttachedStream
from supervisor.engine.fake.container import Changes, FakeContainer, rfc3339_ns
from supervisor.engine.fake.script import Clock, ExecFromStdin, FakeClock, Script

#: Which containers a script is for: the task's command (exactly, or a pattern searched in
#: it), or a test on the whole request.
Match = str | re.Pattern[str] | Callable[[ContainerRequest], bool]
#: A script, or a function making one per container (e.g. with its own events).
ScriptSource = Script | Callable[[ContainerRequest], Script]
#: The warm pool's shell loop (supervisor/runtime/pool.py), and the sentinel it waits for.
_POOL_LOOP = re.compile(r'if \[ "\$l" = "([^"]+)" \]; then exec ')
_BUILTIN_NETWORKS = ("none", "host", "bridge", "default")
_LOG_BLOCK = 64 * 1024


def _network_id(name: str) -> str:
    return hashlib.sha256(f"network:{name}".encode()).hexdigest()


def task_command(request: ContainerRequest) -> str:
    """The command a task asked for: without ``/bin/sh -c`` and the stderr merge."""
    argv = request.command
    if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]:
        return argv[2].removeprefix(MERGE_PREFIX)
    return shlex.join(argv)


class FakeEngine:
    """An in-memory container engine for component tests: scripted containers, a json-file
    log, pause, signals, and faults on demand. Deterministic with the default FakeClock.

    ``images``: present image names (None: every image is present). ``registry``: the
    images a pull finds (a pull of any other fails like a registry that has no such name).
    ``paused_kill``:
    ``refuse`` a signal to a paused container (runsc) or ``queue`` it until unpause.
    ``live_restore=False``: :meth:`go_down` kills every running container."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        images: Iterable[str] | None = None,
        registry: Iterable[str] = (),
        runtimes: Iterable[str] = ("runc", "runsc"),
        live_restore: bool = True,
        paused_kill: Literal["refuse", "queue"] = "refuse",
        default: Script | None = None,
    ) -> None:
        self.clock: Clock = clock or FakeClock()
        self.images = None if images is None else set(images)
        self.registry = set(registry)
        self.runtimes = set(runtimes)
        self.live_restore = live_restore
        self.paused_kill = paused_kill
        self.default = default or Script()
        #: Every container ever created, removed ones included, in creation order.
        self.containers: list[FakeContainer] = []
        self.networks: dict[str, dict[str, str]] = {}
        #: Volumes by name: (driver options, labels).
        self.volumes: dict[str, VolumeRequest] = {}
        #: Every backend call as ``(method, container id or name)``, refused ones included.
        self.calls: list[tuple[str, str]] = []
        self.down = False
        self.changes = Changes()
        self._rules: list[tuple[Match, ScriptSource]] = []
        self._failures: dict[str, list[SupervisorError]] = {}
        self._hangs: dict[str, list[asyncio.Event]] = {}
        self._wedged: dict[str, asyncio.Event] = {}
        self._down_at: dict[str, asyncio.Event] = {}
        self._ids = itertools.count(1)

    async def __aenter__(self) -> FakeEngine:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def backend(self) -> FakeBackend:
        """A client of this engine (a restarted supervisor gets a new one; containers stay)."""
        return FakeBackend(self)

    # -- scripts ---------------------------------------------------------------------------

    def script(self, match: Match, script: ScriptSource) -> None:
        """Containers matching ``match`` run ``script`` (the first matching rule wins)."""
        self._rules.append((match, script))

    def choose(self, request: ContainerRequest) -> Script:
        command = task_command(request)
        for match, source in self._rules:
            if isinstance(match, str):
                hit = match == command
            elif isinstance(match, re.Pattern):
                hit = match.search(command) is not None
            else:
                hit = match(request)
            if hit:
                return source if isinstance(source, Script) else source(request)
        pool = _POOL_LOOP.search(command)
        if pool is not None:
            return Script(ExecFromStdin(pool.group(1)))
        return self.default

    # -- for tests -------------------------------------------------------------------------

    def container(self, key: str) -> FakeContainer:
        """A container by id or name (the newest one of that name)."""
        for c in reversed(self.containers):
            if key in (c.id, c.name):
                return c
        raise KeyError(key)

    def find(self, key: str) -> FakeContainer | None:
        """A container the engine still has (not removed, not vanished)."""
        for c in reversed(self.containers):
            if key in (c.id, c.name) and not c.gone:
                return c
        return None

    def go_down(self, *, lose_unread: bool = False) -> None:
        """The engine stops answering: every call raises EngineUnavailable (``alive`` says
        False) and every attach stream ends, until :meth:`restore`."""
        self.down = True
        for c in self.containers:
            c.drop_streams(lose_unread=lose_unread)
            if not self.live_restore and c.running:
                c.deliver("SIGKILL")
        self.changes.notify()

    def restore(self) -> None:
        self.down = False
        self.changes.notify()

    def fail_next(self, method: str, error: SupervisorError | None = None, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (e.g. ``"start"``) raise ``error``."""
        exc = error or EngineError(f"{method}: injected failure")
        self._failures.setdefault(method, []).extend([exc] * times)

    def hang_next(self, method: str) -> asyncio.Event:
        """The next call of ``method`` blocks until the returned event is set."""
        release = asyncio.Event()
        self._hangs.setdefault(method, []).append(release)
        return release

    def go_down_at(self, method: str) -> asyncio.Event:
        """The engine goes down (:meth:`go_down`) when the next call of ``method`` arrives:
        that call is refused, as is every call after it until :meth:`restore`. The
        returned event is set then."""
        went = asyncio.Event()
        self._down_at[method] = went
        return went

    def wedge(self, *methods: str) -> asyncio.Event:
        """A wedged engine: from now on every call of ``methods`` (e.g. ``"create"``) is
        taken and never completes, until the returned event is set; then the held calls
        go on and new ones complete again."""
        release = asyncio.Event()
        for method in methods:
            self._wedged[method] = release
        return release

    def vanish(self, key: str) -> None:
        """The container disappears without an exit (inspect says None, wait fails)."""
        c = self.container(key)
        c.vanished = True
        c.drop_streams()
        c.cancel()
        self.changes.notify()

    def lose(self, key: str, detail: str) -> None:
        """The container's node is lost (a multi-node engine): its streams end, it stops,
        and wait/inspect report ``status="lost"`` with ``error=detail``."""
        c = self.container(key)
        c.lost = detail
        c.drop_streams()
        if c.running:
            c.deliver("SIGKILL")
        self.changes.notify()

    def drop_attach(self, key: str, *, lose_unread: bool = False) -> None:
        """Cut every attach connection of a container (``lose_unread``: also what the
        client has not read yet); the container runs on."""
        self.container(key).drop_streams(lose_unread=lose_unread)

    async def aclose(self) -> None:
        """Stop every script task (test teardown)."""
        tasks = [t for c in self.containers if (t := c.cancel()) is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- for the backend -------------------------------------------------------------------

    async def enter(self, method: str, target: str = "") -> None:
        """Record a call and apply the faults set for it."""
        self.calls.append((method, target))
        self.changes.notify()
        went = self._down_at.pop(method, None)
        if went is not None:
            self.go_down()
            went.set()
        hangs = self._hangs.get(method)
        if hangs:
            await hangs.pop(0).wait()
        wedge = self._wedged.get(method)
        if wedge is not None:
            await wedge.wait()
            if self._wedged.get(method) is wedge:
                del self._wedged[method]
        if self.down:
            raise EngineUnavailable(f"{method}: the Docker engine does not answer (fake: down)")
        failures = self._failures.get(method)
        if failures:
            raise failures.pop(0)

    def create(self, request: ContainerRequest) -> str:
        what = f"create container {request.name}"
        if request.runtime not in self.runtimes:
            raise RuntimeUnavailable(f"{what}: unknown or invalid runtime name: {request.runtime}")
        if self.images is not None and request.image not in self.images:
            raise ImageMissing(f"image {request.image!r} is not present on the engine")
        if self.find(request.name) is not None:
            raise EngineError(f'{what}: Conflict. The container name "/{request.name}" is in use')
        if request.network not in _BUILTIN_NETWORKS and request.network not in self.networks:
            raise EngineError(f"{what}: network {request.network} not found")
        cid = hashlib.sha256(f"{next(self._ids)}:{request.name}".encode()).hexdigest()

        def choose(command: str) -> Script:
            argv = ["/bin/sh", "-c", MERGE_PREFIX + command]
            return self.choose(request.model_copy(update={"command": argv}))

        self.containers.append(
            FakeContainer(
                cid,
                request,
                self.choose(request),
                clock=self.clock,
                changes=self.changes,
                choose=choose,
            )
        )
        return cid


class FakeBackend:
    """The Backend Protocol on a FakeEngine, with the same idempotency rules as Docker's."""

    name = "fake"
    local = False
    capabilities = EngineCapabilities(node_loss=True)

    def __init__(self, engine: FakeEngine | None = None) -> None:
        self.engine = engine or FakeEngine()
        self.closed = False

    async def _get(self, method: str, container_id: str) -> FakeContainer | None:
        await self.engine.enter(method, container_id)
        return self.engine.find(container_id)

    async def ping(self) -> dict[str, str]:
        await self.engine.enter("ping")
        return {"version": "fake", "api_version": "1.41", "os": "linux", "kernel": "fake"}

    async def alive(self) -> bool:
        try:
            await self.engine.enter("alive")
        except SupervisorError:
            return False
        return True

    async def create(self, request: ContainerRequest) -> str:
        await self.engine.enter("create", request.name)
        return self.engine.create(request)

    async def attach(self, container_id: str, *, stdin: bool, logs: bool) -> AttachedStream:
        c = await self._get("attach", container_id)
        if c is None:
            raise EngineError(f"attach: no such container {container_id[:12]}")
        return c.attach(stdin=stdin, logs=logs)

    async def pause(self, container_id: str) -> None:
        c = await self._get("pause", container_id)
        if c is None:
            raise EngineError(f"pause: no such container {container_id[:12]}")
        if c.status != "running":
            raise EngineError(f"pause: container {container_id[:12]} is {c.status}")
        c.status = "paused"
        self.engine.changes.notify()

    async def unpause(self, container_id: str) -> None:
        c = await self._get("unpause", container_id)
        if c is None or c.status != "paused":
            return
        c.status = "running"
        while c.queued_signals and c.running:
            c.deliver(c.queued_signals.pop(0))
        self.engine.changes.notify()

    async def logs(
        self, container_id: str, *, tail: int | None = None, timestamps: bool = False
    ) -> AsyncIterator[list[Segment]]:
        c = await self._get("logs", container_id)
        if c is None:
            raise EngineError(f"GET /containers/{container_id}/logs: no such container")
        messages = c.log if tail is None else c.log[max(0, len(c.log) - tail) :] if tail > 0 else []
        wire = b"".join(
            encode_frame(
                m.stream, (f"{rfc3339_ns(m.time_ns)} ".encode() if timestamps else b"") + m.data
            )
            for m in messages
        )
        # The engine's framing, decoded the way DockerBackend decodes it.
        demux = FrameDemux()
        for at in range(0, len(wire), _LOG_BLOCK):
            block = wire[at : at + _LOG_BLOCK]
            pieces: list[Segment] = list(
                demux.feed_frames(block) if timestamps else demux.feed(block)
            )
            if pieces:
                yield pieces

    async def start(self, container_id: str) -> None:
        c = await self._get("start", container_id)
        if c is None:
            raise EngineError(f"start: container {container_id[:12]} vanished")
        if c.status == "exited":
            raise EngineError(f"start: the fake engine does not restart {container_id[:12]}")
        if c.status == "created":
            c.start()

    async def wait(self, container_id: str) -> ContainerState:
        c = await self._get("wait", container_id)
        if c is None:
            raise EngineError(f"wait: container {container_id[:12]} vanished")
        engine = self.engine
        await engine.changes.until(lambda: not c.running or c.vanished or engine.down)
        if c.vanished:
            raise EngineError(f"wait: container {container_id[:12]} vanished")
        if engine.down:
            # A going engine drops the connection first, whatever it does to containers.
            raise EngineUnavailable(f"engine dropped POST /containers/{container_id}/wait")
        return c.state()

    async def kill(self, container_id: str, signal: Literal["SIGTERM", "SIGKILL"]) -> None:
        c = await self._get("kill", container_id)
        if c is None or not c.running:
            return
        if c.status == "paused":
            if self.engine.paused_kill == "refuse":
                raise EngineError(f"kill: cannot signal paused container {container_id[:12]}")
            c.queued_signals.append(signal)
            return
        c.deliver(signal)

    async def inspect(self, container_id: str) -> ContainerState | None:
        c = await self._get("inspect", container_id)
        return None if c is None else c.state()

    async def remove(self, container_id: str) -> None:
        c = await self._get("remove", container_id)
        if c is None:
            return
        if c.running:
            c.deliver("SIGKILL")
        c.removed = True
        self.engine.changes.notify()

    async def list_labeled(self, label: str) -> list[ContainerSummary]:
        await self.engine.enter("list_labeled", label)
        key, has_value, value = label.partition("=")
        return [
            ContainerSummary(id=c.id, status=c.status, labels=dict(c.request.labels))
            for c in self.engine.containers
            if not c.gone
            and key in c.request.labels
            and (not has_value or c.request.labels[key] == value)
        ]

    async def image_id(self, image: str) -> str | None:
        await self.engine.enter("image_id", image)
        if self.engine.images is not None and image not in self.engine.images:
            return None
        return "sha256:" + hashlib.sha256(image.encode()).hexdigest()

    async def pull_image(self, image: str) -> str:
        await self.engine.enter("pull_image", image)
        if image not in self.engine.registry:
            raise ImageMissing(
                f"pull {image}: pull access denied for {image}, repository does not exist"
            )
        if self.engine.images is not None:
            self.engine.images.add(image)
        return "sha256:" + hashlib.sha256(image.encode()).hexdigest()

    async def runtimes(self) -> set[str]:
        await self.engine.enter("runtimes")
        return set(self.engine.runtimes)

    async def live_restore(self) -> bool:
        await self.engine.enter("live_restore")
        return self.engine.live_restore

    async def cpu_time_ns(self, container_id: str) -> int | None:
        c = await self._get("cpu_time_ns", container_id)
        return None if c is None else c.cpu_ns

    async def ensure_network(
        self, name: str, labels: dict[str, str], *, internal: bool = False
    ) -> None:
        await self.engine.enter("ensure_network", name)
        self.engine.networks.setdefault(name, dict(labels))

    async def remove_network(self, name: str) -> None:
        await self.engine.enter("remove_network", name)
        # Like Docker: a running (or paused) container has an endpoint on it; a created or
        # exited one does not hold it.
        attached = [
            c
            for c in self.engine.containers
            if not c.gone and c.running and c.request.network == name
        ]
        if attached and name in self.engine.networks:
            raise EngineError(
                f"remove network: error while removing network: network {name} has active "
                f"endpoints ({attached[0].id[:12]})"
            )
        if self.engine.networks.pop(name, None) is not None:
            self.engine.changes.notify()

    async def list_networks(self, label: str) -> list[NetworkSummary]:
        await self.engine.enter("list_networks", label)
        key, has_value, value = label.partition("=")
        return [
            NetworkSummary(name=name, id=_network_id(name), labels=dict(labels))
            for name, labels in self.engine.networks.items()
            if key in labels and (not has_value or labels[key] == value)
        ]

    async def create_volume(self, request: VolumeRequest) -> None:
        await self.engine.enter("create_volume", request.name)
        self.engine.volumes.setdefault(request.name, request)

    async def remove_volume(self, name: str) -> None:
        await self.engine.enter("remove_volume", name)
        in_use = [
            c
            for c in self.engine.containers
            if not c.removed and any(m.source == name for m in c.request.mounts)
        ]
        if in_use:
            raise EngineError(f"remove volume: volume {name} is in use by {in_use[0].id[:12]}")
        self.engine.volumes.pop(name, None)

    async def list_volumes(self, label: str) -> list[VolumeSummary]:
        await self.engine.enter("list_volumes", label)
        key, _, value = label.partition("=")
        return [
            VolumeSummary(name=v.name, labels=dict(v.labels))
            for v in self.engine.volumes.values()
            if key in v.labels and (not value or v.labels[key] == value)
        ]

    async def aclose(self) -> None:
        self.closed = True
