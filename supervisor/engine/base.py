"""The engine Protocol: what the supervisor needs from a container engine, and nothing more."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

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


class AttachedStream(Protocol):
    """A live connection to a container's stdio."""

    async def read(self) -> list[Segment] | None:
        """Next output segments ``(stream, bytes)``; None once the output has ended."""
        ...

    async def write(self, data: bytes) -> None:
        """Write to the container's stdin."""
        ...

    async def close_stdin(self) -> None:
        """Give the command EOF on stdin; output keeps flowing."""
        ...

    async def aclose(self) -> None:
        """Close the connection (idempotent)."""
        ...

    def is_open(self) -> bool:
        """False once the connection is known to be gone: closed here, or ended by the
        engine (the container exited, the engine went away)."""
        ...


class Backend(Protocol):
    """A container engine. Implementations translate their errors into SupervisorError: the
    engine away (refused, reset, a broken pipe, a socket timeout, an answer cut short) is
    always EngineUnavailable, never a raw OSError, so callers ride outages out by that one
    type (their transports, ``engine/docker/http.py`` and the Swarm manager's, do it)."""

    name: str
    local: bool
    """True when the engine runs on this host, so host pids and /proc are meaningful (a
    multi-node backend: when some nodes may be local; it gives ``pid`` only for those)."""
    capabilities: EngineCapabilities
    """What it can do beyond the common ground (stdin EOF, warm pools, placement, node
    loss, workspaces, session networks)."""

    async def ping(self) -> dict[str, str]:
        """Engine version info; raises EngineUnavailable."""
        ...

    async def alive(self) -> bool:
        """A cheap liveness probe (no thread, no version negotiation)."""
        ...

    async def create(self, request: ContainerRequest) -> str:
        """Create (not start) a container; return its id."""
        ...

    async def attach(self, container_id: str, *, stdin: bool, logs: bool) -> AttachedStream:
        """Attach to stdio; with ``logs`` the engine first replays what it has stored."""
        ...

    async def pause(self, container_id: str) -> None:
        """Freeze every process of a running container (its output stops at once). An
        engine that cannot pause (Kubernetes has no pause) raises EngineError; a re-attach
        then falls back to a replay (docs/kubernetes.md, "No pause")."""
        ...

    async def unpause(self, container_id: str) -> None:
        """Thaw a paused container; one that is not paused or is gone is not an error."""
        ...

    def logs(
        self, container_id: str, *, tail: int | None = None, timestamps: bool = False
    ) -> AsyncIterator[list[Segment]]:
        """What the engine's log holds now (no follow), as segments in log order: every
        message, or the last ``tail``. With ``timestamps`` each segment is one whole
        message, starting with the engine's RFC 3339 time (UTC, nanoseconds) and a space."""
        ...

    async def start(self, container_id: str) -> None:
        """Start a created container."""
        ...

    async def wait(self, container_id: str) -> ContainerState:
        """Block until the container is not running; return its final state."""
        ...

    async def kill(self, container_id: str, signal: Literal["SIGTERM", "SIGKILL"]) -> None:
        """Signal PID 1; a container that is already gone or stopped is not an error."""
        ...

    async def inspect(self, container_id: str) -> ContainerState | None:
        """Current state, or None when the container no longer exists."""
        ...

    async def remove(self, container_id: str) -> None:
        """Force-remove; a container already gone is not an error."""
        ...

    async def list_labeled(self, label: str) -> list[ContainerSummary]:
        """Containers (any state) carrying ``label`` (``key`` or ``key=value``)."""
        ...

    async def image_id(self, image: str) -> str | None:
        """The id of a local image, or None when it is not present."""
        ...

    async def pull_image(self, image: str) -> str:
        """Pull ``image`` from its registry and return its id. Called only for a policy
        with ``pull = true``: nothing else in the supervisor reaches a registry."""
        ...

    async def runtimes(self) -> set[str]:
        """The runtimes the engine can run containers with, by the names policies use in
        ``runtime`` (Docker: its registered OCI runtimes)."""
        ...

    async def live_restore(self) -> bool:
        """Whether containers keep running while the engine restarts."""
        ...

    async def cpu_time_ns(self, container_id: str) -> int | None:
        """Total CPU time the container has used, or None when unknown."""
        ...

    async def ensure_network(
        self, name: str, labels: dict[str, str], *, internal: bool = False
    ) -> None:
        """Make sure the network exists: containers on it reach each other by their
        aliases; ``internal``: nothing else (no route out). Defined by what it allows, not
        how: Docker makes a bridge network, an engine where every container has an
        interface (Kubernetes) makes a policy."""
        ...

    async def remove_network(self, name: str) -> None:
        """Remove a network; missing is not an error; in use (containers attached) is
        EngineError."""
        ...

    async def list_networks(self, label: str) -> list[NetworkSummary]:
        """Networks carrying ``label`` (``key`` or ``key=value``); none on an engine
        without session networks."""
        ...

    async def create_volume(self, request: VolumeRequest) -> None:
        """Create a named volume (a volume of that name already there is not an error)."""
        ...

    async def remove_volume(self, name: str) -> None:
        """Remove a volume (unmounting it); missing is not an error; in use is EngineError."""
        ...

    async def list_volumes(self, label: str) -> list[VolumeSummary]:
        """Volumes carrying ``label`` (``key`` or ``key=value``)."""
        ...

    async def aclose(self) -> None:
        """Release connections and threads."""
        ...
