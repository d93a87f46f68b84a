"""A deadline on every engine call: a wedged engine (it takes connections, its operations
never complete) fails the call with EngineUnresponsive instead of holding the task, the
session end or the route that awaits it.

``Deadlines`` wraps any Backend and delegates each call under ``asyncio.timeout``, by
kind (create, start, attach, kill, remove, inspect, list, network, volume, ...). The one
call that is long by design, ``wait`` (until the container exits), has no deadline, and a
stream's reading (an attach stream, the blocks of a log) is not bounded as a whole: an
attach is bounded until it opens, a log read between one block and the next. It also
keeps what the watchdog (runtime/engine_checks.py) needs: the calls in flight and when
each kind last timed out or completed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

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
from supervisor.core.errors import EngineUnresponsive
from supervisor.engine.base import AttachedStream, Backend

T = TypeVar("T")

#: The default deadline of every kind of call, seconds (the daemon's ``engine_timeout_s``).
ENGINE_TIMEOUT_S = 30.0
#: A pull fetches an image from a registry: minutes are normal.
PULL_TIMEOUT_S = 600.0
#: ``alive`` (a ``/_ping``, sub-millisecond when the engine is well) is cut off here, below
#: the backend's own bound (2 s), so that a ping taken and never answered (wedged) is told
#: from one refused (down): only the first is a timeout.
ALIVE_S = 1.5

Kind = Literal[
    "ping",
    "create",
    "start",
    "attach",
    "kill",
    "pause",
    "remove",
    "inspect",
    "list",
    "logs",
    "image",
    "pull",
    "network",
    "volume",
]
KINDS: tuple[Kind, ...] = get_args(Kind)


def deadlines_for(timeout_s: float, **overrides: float) -> dict[Kind, float]:
    """Every kind at ``timeout_s`` (a pull at least PULL_TIMEOUT_S), then ``overrides``."""
    out: dict[Kind, float] = dict.fromkeys(KINDS, timeout_s)
    out["pull"] = max(timeout_s, PULL_TIMEOUT_S)
    for kind, value in overrides.items():
        if kind not in out:
            raise ValueError(f"unknown engine call kind {kind!r}; expected one of {KINDS}")
        out[kind] = value
    return out


@dataclass(frozen=True)
class InFlight:
    """One engine call not finished yet."""

    call: str
    """What it is, e.g. ``start 3f2a9c1b0d4e``."""
    kind: Kind
    started: float
    """Loop time it began."""
    deadline_s: float
    evidence: bool = True
    """Whether its lateness says the engine hangs. A liveness ping is cut off early on
    purpose (ALIVE_S) and a loaded machine makes it late: it is not evidence; only the
    watchdog's canary, a real operation, turns it into a verdict."""


@dataclass(frozen=True)
class CallHealth:
    """What the calls made through ``Deadlines`` say about the engine, as of ``now``."""

    oldest: InFlight | None
    """The oldest call in flight (bounded kinds only)."""
    overdue: InFlight | None
    """The oldest call in flight past its deadline (its cancellation did not take)."""
    timed_out: str | None
    """A call that ran out of time recently (within its deadline of now), with no call of
    its kind completed since: the engine is taken as wedged for that long."""


class Deadlines:
    """The Backend port on ``inner``, every call bounded (see the module docstring)."""

    def __init__(self, inner: Backend, deadlines: Mapping[Kind, float] | None = None) -> None:
        self.inner = inner
        self.deadlines: dict[Kind, float] = dict(deadlines or deadlines_for(ENGINE_TIMEOUT_S))
        for kind in KINDS:
            self.deadlines.setdefault(kind, ENGINE_TIMEOUT_S)
        self.name = inner.name
        self.local = inner.local
        self.capabilities: EngineCapabilities = inner.capabilities
        self._ids = itertools.count()
        self._in_flight: dict[int, InFlight] = {}
        #: kind -> (loop time, call, for how long it counts) of its last timeout; cleared
        #: when a call of that kind completes.
        self._timeouts: dict[Kind, tuple[float, str, float]] = {}

    # -- the watchdog's view -------------------------------------------------------------

    def health(self) -> CallHealth:
        now = asyncio.get_running_loop().time()
        calls = sorted(self._in_flight.values(), key=lambda c: c.started)
        overdue = next((c for c in calls if c.evidence and now - c.started > c.deadline_s), None)
        recent = [(when, call) for when, call, hold in self._timeouts.values() if now - when < hold]
        timed_out = max(recent)[1] if recent else None
        return CallHealth(calls[0] if calls else None, overdue, timed_out)

    # -- plumbing --------------------------------------------------------------------------

    async def _bounded(
        self,
        kind: Kind,
        call: str,
        work: Awaitable[T],
        deadline: float | None = None,
        *,
        evidence: bool = True,
    ) -> T:
        deadline = self.deadlines[kind] if deadline is None else deadline
        loop = asyncio.get_running_loop()
        key = next(self._ids)
        self._in_flight[key] = InFlight(call, kind, loop.time(), deadline, evidence)
        try:
            async with asyncio.timeout(deadline):
                result = await work
        except TimeoutError as exc:
            if evidence:
                # Counts for as long as the call was given: then a new call may try again.
                self._timeouts[kind] = (loop.time(), call, deadline)
            raise EngineUnresponsive(call, deadline) from exc
        finally:
            del self._in_flight[key]
        self._timeouts.pop(kind, None)
        return result

    # -- Backend protocol --------------------------------------------------------------

    async def ping(self) -> dict[str, str]:
        return await self._bounded("ping", "ping", self.inner.ping())

    async def alive(self) -> bool:
        deadline = min(ALIVE_S, self.deadlines["ping"])
        try:
            return await self._bounded("ping", "ping", self.inner.alive(), deadline, evidence=False)
        except EngineUnresponsive:
            return False

    async def create(self, request: ContainerRequest) -> str:
        return await self._bounded("create", f"create {request.name}", self.inner.create(request))

    async def attach(self, container_id: str, *, stdin: bool, logs: bool) -> AttachedStream:
        # Bounded until the stream opens; reading it is the task's business (its output
        # may pause for hours).
        return await self._bounded(
            "attach",
            f"attach {container_id[:12]}",
            self.inner.attach(container_id, stdin=stdin, logs=logs),
        )

    async def pause(self, container_id: str) -> None:
        await self._bounded("pause", f"pause {container_id[:12]}", self.inner.pause(container_id))

    async def unpause(self, container_id: str) -> None:
        await self._bounded(
            "pause", f"unpause {container_id[:12]}", self.inner.unpause(container_id)
        )

    async def logs(
        self, container_id: str, *, tail: int | None = None, timestamps: bool = False
    ) -> AsyncIterator[list[Segment]]:
        # What the log holds now (no follow): the engine sends it without pause, so each
        # block (the first one included: the opening) has the deadline, not the whole.
        blocks = self.inner.logs(container_id, tail=tail, timestamps=timestamps)
        call = f"logs {container_id[:12]}"
        try:
            while True:
                try:
                    block = await self._bounded("logs", call, anext(blocks))
                except StopAsyncIteration:
                    return
                yield block
        finally:
            aclose = getattr(blocks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def start(self, container_id: str) -> None:
        await self._bounded("start", f"start {container_id[:12]}", self.inner.start(container_id))

    async def wait(self, container_id: str) -> ContainerState:
        # Until the container exits: no deadline (an outage is the caller's to ride out).
        return await self.inner.wait(container_id)

    async def kill(self, container_id: str, signal: Literal["SIGTERM", "SIGKILL"]) -> None:
        await self._bounded(
            "kill", f"kill {container_id[:12]} {signal}", self.inner.kill(container_id, signal)
        )

    async def inspect(self, container_id: str) -> ContainerState | None:
        return await self._bounded(
            "inspect", f"inspect {container_id[:12]}", self.inner.inspect(container_id)
        )

    async def remove(self, container_id: str) -> None:
        await self._bounded(
            "remove", f"remove {container_id[:12]}", self.inner.remove(container_id)
        )

    async def list_labeled(self, label: str) -> list[ContainerSummary]:
        return await self._bounded("list", f"list {label}", self.inner.list_labeled(label))

    async def image_id(self, image: str) -> str | None:
        return await self._bounded("image", f"inspect image {image}", self.inner.image_id(image))

    async def pull_image(self, image: str) -> str:
        return await self._bounded("pull", f"pull {image}", self.inner.pull_image(image))

    async def runtimes(self) -> set[str]:
        return await self._bounded("inspect", "info (runtimes)", self.inner.runtimes())

    async def live_restore(self) -> bool:
        return await self._bounded("inspect", "info (live-restore)", self.inner.live_restore())

    async def cpu_time_ns(self, container_id: str) -> int | None:
        return await self._bounded(
            "inspect", f"stats {container_id[:12]}", self.inner.cpu_time_ns(container_id)
        )

    async def ensure_network(
        self, name: str, labels: dict[str, str], *, internal: bool = False
    ) -> None:
        await self._bounded(
            "network",
            f"create network {name}",
            self.inner.ensure_network(name, labels, internal=internal),
        )

    async def remove_network(self, name: str) -> None:
        await self._bounded("network", f"remove network {name}", self.inner.remove_network(name))

    async def list_networks(self, label: str) -> list[NetworkSummary]:
        return await self._bounded(
            "network", f"list networks {label}", self.inner.list_networks(label)
        )

    async def create_volume(self, request: VolumeRequest) -> None:
        await self._bounded(
            "volume", f"create volume {request.name}", self.inner.create_volume(request)
        )

    async def remove_volume(self, name: str) -> None:
        await self._bounded("volume", f"remove volume {name}", self.inner.remove_volume(name))

    async def list_volumes(self, label: str) -> list[VolumeSummary]:
        return await self._bounded(
            "volume", f"list volumes {label}", self.inner.list_volumes(label)
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
