"""Value types the engine layer takes and returns: a container request, its state, output
segments. Pure data, so the core (resolve, resync) can build and read them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ulimit(_Frozen):
    """One resource limit (soft = hard unless given)."""

    name: str
    soft: int
    hard: int


class Mount(_Frozen):
    """A host directory (``bind``) or a named volume (``volume``) in the container.
    Propagation is always private: nothing mounted inside leaks back to the host."""

    source: str
    """Host path (bind) or volume name (volume)."""
    target: str
    read_only: bool = True
    type: Literal["bind", "volume"] = "bind"
    non_recursive: bool = False
    """Bind only the directory itself, not what is mounted below it on the host."""


class VolumeRequest(_Frozen):
    """A named volume of the engine's ``local`` driver (e.g. an overlay of a workspace)."""

    name: str
    driver_opts: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


class ContainerRequest(_Frozen):
    """Everything needed to create one task container, already validated against a policy."""

    name: str
    image: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    user: str
    working_dir: str
    runtime: str = "runc"
    network: str = "none"
    """A network made by ``Backend.ensure_network``, or ``none``: no connectivity at all
    (not necessarily no interface: on Kubernetes every pod has one, and policy denies)."""
    network_aliases: list[str] = Field(default_factory=list)
    """Names other containers on the same (user-defined) network can use to reach this one.
    At most one is portable (Kubernetes has one ``spec.hostname``); tasks use their id."""
    read_only: bool = True
    tmpfs: dict[str, str] = Field(default_factory=dict)
    memory_bytes: int
    nano_cpus: int
    pids_limit: int
    ulimits: list[Ulimit] = Field(default_factory=list)
    cap_add: list[str] = Field(default_factory=list)
    init: bool = True
    stdin_open: bool = True
    log_max_size: str = "64m"
    log_max_files: int = 4
    mounts: list[Mount] = Field(default_factory=list)
    placement: list[str] = Field(default_factory=list)
    """Constraints on the node that runs it (``node.labels.sandbox==gvisor``), for
    backends that place containers on nodes; a single-host backend ignores them."""


class ContainerState(_Frozen):
    """What the engine says about a container."""

    id: str
    status: str
    """created, running, paused, restarting, removing, exited, dead; ``lost`` (multi-node
    engines: gone with its node, or given up for it: the node went down, was drained, its
    engine restarted), with ``error`` saying what happened and naming the node."""
    running: bool
    exit_code: int | None = None
    oom_killed: bool = False
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    pid: int | None = None
    """Host pid of the container's PID 1 (local engines only; 0/None otherwise)."""
    runtime: str | None = None
    node: str | None = None
    """The node it runs on, for multi-node backends (``hostname (id)``); None on one host."""


class ContainerSummary(_Frozen):
    """One line of a labeled container listing."""

    id: str
    status: str
    labels: dict[str, str]


#: (stream, payload): 1 stdout, 2 stderr; the payload may be a view into a read buffer.
Segment = tuple[int, bytes | memoryview]


class VolumeSummary(_Frozen):
    """One line of a labelled volume listing."""

    name: str
    labels: dict[str, str]


class NetworkSummary(_Frozen):
    """One line of a labelled network listing."""

    name: str
    id: str
    labels: dict[str, str]


#: How the engine is doing: ``up`` (its operations complete), ``wedged`` (it takes
#: connections but operations do not complete in time), ``down`` (it does not answer).
EngineState = Literal["up", "wedged", "down"]
ENGINE_STATES: tuple[EngineState, ...] = ("up", "wedged", "down")


class EngineCapabilities(_Frozen):
    """What a backend can do beyond the Protocol's common ground; the runtime adapts."""

    stdin_eof: bool = True
    """Closing the attached stdin gives the command EOF (Docker: StdinOnce; Swarm cannot:
    it never sets StdinOnce)."""
    warm_pool: bool = True
    """Containers can be started ahead and handed a command over stdin (warm pools)."""
    placement: bool = False
    """The engine places containers on nodes and honours ``ContainerRequest.placement``."""
    node_loss: bool = False
    """``wait``/``inspect`` may report ``status="lost"`` (multi-node engines)."""
    workspaces: bool = True
    """Host directories and named volumes of this host can be mounted (not on a cluster,
    whose nodes do not see the supervisor's files)."""
    session_networks: bool = True
    """Per-session networks (policy ``network = "session"`` or ``"bridge"``)."""
    exact_replay: bool = False
    """``attach(logs=True)`` replays the whole log and follows it on one connection, with
    no gap (a followed log): a re-attach needs no pause to be exact."""
