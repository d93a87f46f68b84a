"""Policies: named, validated sets of isolation settings and limits, from ``policies/*.toml``."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from supervisor.core.errors import PolicyError
from supervisor.core.models import MAX_TIMEOUT_MS
from supervisor.core.paths import shipped_data_dir
from supervisor.core.placement import parse_constraint

#: EngineCapabilities a policy may add back after ``cap_drop=ALL``. Everything that reaches
#: outside the container (SYS_ADMIN, NET_ADMIN, SYS_PTRACE, SYS_MODULE, DAC_READ_SEARCH, ...)
#: is deliberately absent, so no policy file can grant it.
SAFE_CAPABILITIES = frozenset(
    {"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"}
)
#: Paths a workspace or tmpfs may never be mounted over.
_FORBIDDEN_MOUNT_TARGETS = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/usr", "/lib")
#: runsc counts its own threads against the pids limit; below this it cannot start.
RUNSC_MIN_PIDS = 64
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Model):
    """Resource limits of every container under the policy."""

    memory_mb: Annotated[int, Field(ge=6, le=65_536)] = 512
    """Memory limit in MiB; memory+swap is set to the same value, so there is no swap."""
    cpus: Annotated[float, Field(gt=0, le=64)] = 1.0
    """CPU quota in cores (``nano_cpus``)."""
    pids: Annotated[int, Field(ge=16, le=32_768)] = 256
    """Processes+threads in the container. runsc needs at least 64 for its own threads."""
    nofile: Annotated[int, Field(ge=16, le=1_048_576)] = 1024
    """Open file descriptors per process (soft = hard)."""
    fsize_mb: Annotated[int, Field(ge=1, le=1_048_576)] = 1024
    """Largest file a process may write, in MiB (RLIMIT_FSIZE)."""
    core_mb: Annotated[int, Field(ge=0, le=1024)] = 0
    """Core dump size; 0 disables core dumps."""
    output_cap_bytes: Annotated[int, Field(ge=1024, le=64 * 1024**3)] = 256 * 1024**2
    """Bytes of output kept in a task's output file; the rest is dropped and counted."""


class Tmpfs(_Model):
    """A size- and inode-capped tmpfs mount (its usage counts against the memory limit)."""

    path: str
    """Absolute path inside the container."""
    size_mb: Annotated[int, Field(ge=1, le=65_536)] = 64
    """Size cap in MiB."""
    nr_inodes: Annotated[int, Field(ge=16, le=10_000_000)] = 16_384
    """Inode cap: bounds floods of tiny files."""
    mode: Annotated[str, Field(pattern=r"^[0-7]{3,4}$")] = "1777"
    """Octal permission bits of the mount point."""
    exec_allowed: bool = True
    """False mounts it ``noexec``."""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _container_path(value, "tmpfs path")


class Timeouts(_Model):
    """Lifetimes."""

    default_ms: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)] = 300_000
    """Timeout of a task that names none."""
    max_ms: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)] = MAX_TIMEOUT_MS
    """Largest timeout a task may ask for."""
    allow_persistent: bool = True
    """Whether tasks may run without a timeout (until stopped or the session ends)."""
    grace_s: Annotated[float, Field(ge=0, le=60)] = 5.0
    """Seconds between SIGTERM and SIGKILL when a task is stopped."""
    idle_timeout_ms: Annotated[int, Field(ge=100, le=MAX_TIMEOUT_MS)] | None = None
    """Default idle timeout (None: off)."""

    @model_validator(mode="after")
    def _order(self) -> Timeouts:
        if self.default_ms > self.max_ms:
            raise ValueError(
                f"default_ms ({self.default_ms}) must not exceed max_ms ({self.max_ms})"
            )
        return self


class Env(_Model):
    """Environment variables."""

    fixed: dict[str, str] = Field(default_factory=dict)
    """Set in every container; a task cannot override them."""
    allow: list[str] = Field(default_factory=list)
    """Names (fnmatch patterns, e.g. ``NODE_*``) a task may set."""

    @field_validator("fixed")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, val in value.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(
                    f"env name {name!r} is not a valid variable name (letters, digits, _)"
                )
            if "\x00" in val:
                raise ValueError(f"env {name} must not contain NUL bytes")
        return value

    def allows(self, name: str) -> bool:
        """Whether a task may set ``name``."""
        return name not in self.fixed and any(fnmatch.fnmatchcase(name, p) for p in self.allow)


class Watch(_Model):
    """Watcher defaults: stall detection and periodic polls."""

    stall_after_s: Annotated[float, Field(ge=0.5, le=3_600)] = 3.0
    """Report a stall after this long blocked on stdin."""
    stall_detection: bool = True
    """Whether to watch for stdin stalls at all."""
    poll_every_s: Annotated[float, Field(ge=1, le=86_400)] | None = None
    """Default poll period (None: no polls unless a task asks)."""
    poll_tail_chars: Annotated[int, Field(ge=1, le=100_000)] = 3000
    """Characters of output in each poll."""
    poll_only_on_change: bool = True
    """Skip polls when nothing was printed since the last one."""


class Monitor(_Model):
    """Monitor-kind settings: how stdout lines become events."""

    batch_window_ms: Annotated[int, Field(ge=0, le=10_000)] = 200
    """Lines arriving within this window share one event."""
    max_chunk_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 256 * 1024
    """Largest event text; longer lines are cut with a visible mark."""
    lines_per_s: Annotated[float, Field(gt=0, le=1_000_000)] = 200.0
    """Sustained line rate turned into events (token bucket refill)."""
    burst_lines: Annotated[int, Field(ge=1, le=10_000_000)] = 2000
    """Token bucket size: lines allowed in a burst before suppression."""
    bytes_per_s: Annotated[float, Field(gt=0, le=1024**3)] = 1024 * 1024
    """Sustained event text rate (a second token bucket, in bytes): a few huge lines are a
    flood too."""
    burst_bytes: Annotated[int, Field(ge=1024, le=1024**3)] = 8 * 1024 * 1024
    """Bytes of event text allowed in a burst before suppression."""


class Session(_Model):
    """Per-session limits."""

    max_running_tasks: Annotated[int, Field(ge=1, le=10_000)] = 64
    """Running tasks of this policy one session may have at once."""
    workspace_max_mb: Annotated[int, Field(ge=1, le=1_048_576)] = 4096
    """Most the session's workspace layer (an overlay's changes, on the host disk) may hold
    while a task of this policy runs: past it the task is stopped (``workspace_full``) and
    new ones are refused until the changes are applied or discarded."""
    workspace_max_files: Annotated[int, Field(ge=16, le=100_000_000)] = 200_000
    """Most entries (files, directories, links: host inodes) the layer may hold, likewise."""


class Logs(_Model):
    """The engine-side json-file log of each container (used to recover after a crash)."""

    max_size_mb: Annotated[int, Field(ge=1, le=4096)] = 64
    """Size of one log file before rotation."""
    max_files: Annotated[int, Field(ge=1, le=32)] = 4
    """Files kept; output older than ``max_size_mb * max_files`` of JSON is gone from the engine."""


class Workspace(_Model):
    """A host directory mounted into the container; must lie under a configured root."""

    host_path: str
    """Absolute host path; it must be under one of the supervisor's ``workspace_roots``."""
    container_path: str = "/workspace"
    """Where it appears in the container."""
    mode: Literal["ro", "rw"] = "ro"
    """Read-only (default) or read-write."""

    @field_validator("host_path")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("host_path must be absolute")
        return os.path.normpath(value)

    @field_validator("container_path")
    @classmethod
    def _container(cls, value: str) -> str:
        return _container_path(value, "container_path")


class Policy(_Model):
    """A named set of isolation settings and limits."""

    name: str = "default"
    """The policy's name (its file name without ``.toml``)."""
    description: str = ""
    """What the policy is for."""
    image: Annotated[str, Field(min_length=1)] = "sandvisor/debian:latest"
    """Image every task of the policy runs in. Built offline by ``sandvisor images build``."""
    image_id: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    """Pin: refuse to run unless ``image`` resolves to exactly this image id."""
    pull: StrictBool = False
    """Whether the engine may pull ``image`` from its registry when it is missing. Off:
    a task whose image is missing fails at once and no request reaches a registry (a
    name like ``sandvisor/dev`` could otherwise resolve to someone else's namespace)."""
    runtime: Literal["runc", "runsc"] = "runc"
    """OCI runtime; runsc is gVisor. A missing runtime fails the task (never falls back)."""
    network: Literal["none", "session", "bridge"] = "none"
    """``none``: loopback only. ``session``: a per-session internal network, no egress:
    tasks of the session reach each other by task id, nothing else. ``bridge``: the
    per-session network with egress."""
    user: Annotated[str, Field(pattern=r"^[1-9][0-9]{0,9}(:[0-9]{1,10})?$")] = "65534:65534"
    """Numeric uid[:gid]; root (0) is not allowed."""
    working_dir: str = "/tmp"
    """Fixed working directory. Never taken from the task (CVE-2024-21626)."""
    read_only_rootfs: bool = True
    """Mount the image read-only; writable space comes from tmpfs mounts only."""
    stdin: Literal["pipe", "closed"] = "pipe"
    """Default stdin mode."""
    init: bool = True
    """Run a tiny init as PID 1 that forwards signals and reaps zombies."""
    cap_add: list[str] = Field(default_factory=list)
    """EngineCapabilities added back after dropping all; only a safe subset is allowed."""
    limits: Limits = Field(default_factory=Limits)
    tmpfs: list[Tmpfs] = Field(default_factory=lambda: [Tmpfs(path="/tmp")])
    timeouts: Timeouts = Field(default_factory=Timeouts)
    env: Env = Field(default_factory=Env)
    watch: Watch = Field(default_factory=Watch)
    monitor: Monitor = Field(default_factory=Monitor)
    session: Session = Field(default_factory=Session)
    logs: Logs = Field(default_factory=Logs)
    workspace: Workspace | None = None
    workspace_root_owner: Literal["nobody", "root", "refuse"] = "nobody"
    """Whom tasks run as when the session's workspace is owned by root (CI machines,
    containers): ``nobody`` (uid 65534), ``root`` (runsc only: its kernel has its own root
    user) or ``refuse`` (an error). A workspace owned by a user always runs as that user."""
    placement: list[str] = Field(default_factory=list)
    """Where the tasks may run on a multi-node engine (Swarm): constraints in Swarm's
    syntax, all of which must hold, e.g. ``["node.labels.sandbox==gvisor"]``. A task no node
    can take fails at once (never waits). Ignored by the single-host Docker backend."""
    warm_pool: Annotated[int, Field(ge=0, le=64)] = 0
    """Containers kept started and waiting for a command even when nothing starts, shared
    by every session whose tasks mount no workspace and use no session network (0: none)."""
    warm_pool_max: Annotated[int, Field(ge=0, le=256)] = 0
    """Most ready containers a pool of this policy grows to when tasks start often (the
    size follows the start rate of the last 30 s); 0 turns warm starts off."""
    warm_pool_idle_s: Annotated[float, Field(ge=1, le=86_400)] = 300.0
    """A ready container unused this long is removed (down to ``warm_pool``)."""

    @field_validator("working_dir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if (
            not value.startswith("/")
            or "/proc" in value
            or "/.." in value
            or value != (str(PurePosixPath(value)))
        ):
            raise ValueError(
                "working_dir must be a plain absolute path (no /proc, no '..'), e.g. /tmp"
            )
        return value

    @field_validator("placement")
    @classmethod
    def _placement(cls, value: list[str]) -> list[str]:
        return [str(parse_constraint(c)) for c in value]

    @field_validator("cap_add")
    @classmethod
    def _caps(cls, value: list[str]) -> list[str]:
        out = []
        for cap in value:
            name = cap.upper().removeprefix("CAP_")
            if name not in SAFE_CAPABILITIES:
                allowed = ", ".join(sorted(SAFE_CAPABILITIES))
                raise ValueError(f"capability {cap!r} is not allowed; allowed: {allowed}")
            out.append(name)
        return out

    @model_validator(mode="after")
    def _coherent(self) -> Policy:
        if self.runtime == "runsc" and self.limits.pids < RUNSC_MIN_PIDS:
            raise ValueError(
                f"limits.pids must be at least {RUNSC_MIN_PIDS} with runtime runsc "
                f"(gVisor counts its own threads), got {self.limits.pids}"
            )
        paths = [t.path for t in self.tmpfs]
        if self.workspace is not None:
            paths.append(self.workspace.container_path)
        if len(set(paths)) != len(paths):
            raise ValueError(f"mount paths must be distinct, got {paths}")
        if self.warm_pool > self.warm_pool_max:
            # ``warm_pool = N`` alone (the older spelling) keeps N and grows no further.
            object.__setattr__(self, "warm_pool_max", self.warm_pool)
        if self.env.fixed.get("PATH") is None:
            object.__setattr__(
                self,
                "env",
                Env(fixed={"PATH": _DEFAULT_PATH, **self.env.fixed}, allow=self.env.allow),
            )
        return self


def _container_path(value: str, what: str) -> str:
    # The engine collapses repeated slashes ("//proc" is /proc): so do we, before checking.
    norm = str(PurePosixPath(re.sub(r"/+", "/", value)))
    if not value.startswith("/") or ".." in PurePosixPath(value).parts:
        raise ValueError(f"{what} must be an absolute path without '..', got {value!r}")
    for bad in _FORBIDDEN_MOUNT_TARGETS:
        if norm == bad or norm.startswith(bad + "/") or norm == "/":
            raise ValueError(f"{what} {value!r} would shadow a system directory ({bad})")
    return norm


def default_policies_dir() -> Path | None:
    """``$SANDVISOR_POLICIES_DIR``, else None: the shipped policies alone."""
    env = os.environ.get("SANDVISOR_POLICIES_DIR")
    return Path(env) if env else None


def shipped_policies_dir() -> Path | None:
    """The policies shipped with sandvisor: the installed wheel's copy, else the checkout's
    ``policies/`` (None when neither is there: only the built-in ``default``)."""
    return shipped_data_dir("policies")


def _format_validation(path: Path, exc: ValidationError, raw: dict[str, Any]) -> str:
    lines = [f"policy file {path}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        bad: Any = raw
        for part in err["loc"]:
            try:
                bad = bad[part]
            except (KeyError, IndexError, TypeError):
                bad = err.get("input")
                break
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(err["loc"][:-1])
            lines.append(f"  {loc}: unknown key; allowed keys here: {allowed}")
        elif isinstance(bad, dict):  # a check across several keys: the message names them
            lines.append(f"  {loc}: {err['msg']}")
        else:
            lines.append(f"  {loc} = {bad!r}: {err['msg']}")
    return "\n".join(lines)


def _allowed_keys(loc: tuple[Any, ...]) -> str:
    model: type[BaseModel] = Policy
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nxt is None:
            for c in candidates:
                for sub in getattr(c, "__args__", ()):
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        nxt = sub
        if nxt is None:
            return "(none)"
        model = nxt
    return ", ".join(sorted(model.model_fields))


def load_policy_file(path: Path) -> Policy:
    """Load and validate one policy file; errors name the file, key, value and what is allowed."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise PolicyError(f"policy file {path}: cannot read: {exc}") from exc
    name = path.stem
    if "name" in raw and raw["name"] != name:
        raise PolicyError(
            f"policy file {path}: name = {raw['name']!r} must match the file name ({name!r})"
        )
    raw.setdefault("name", name)
    try:
        return Policy.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(_format_validation(path, exc, raw)) from exc


def _read_folder(folder: Path, into: dict[str, Policy]) -> None:
    for path in sorted(folder.glob("*.toml")):
        policy = load_policy_file(path)
        into[policy.name] = policy


class PolicySet:
    """The policies a supervisor knows, by name. Loaded once; ``reload()`` re-reads the files.

    ``shipped`` (the policies that come with sandvisor) is read first; a file of the same
    name in ``directory`` overrides a shipped one, other files add policies."""

    def __init__(self, directory: Path | None, *, shipped: Path | None = None) -> None:
        self.directory = directory
        self.shipped = shipped
        self._policies: dict[str, Policy] = {}
        self.reload()

    @classmethod
    def load(cls, directory: Path | None = None) -> PolicySet:
        """The shipped policies, then ``directory`` (default ``$SANDVISOR_POLICIES_DIR``)."""
        return cls(directory or default_policies_dir(), shipped=shipped_policies_dir())

    def reload(self) -> None:
        """Read every ``*.toml`` of the shipped folder, then the directory; any invalid file
        is an error."""
        policies: dict[str, Policy] = {}
        if self.shipped is not None and self.shipped.is_dir():
            _read_folder(self.shipped, policies)
        if self.directory is not None:
            if not self.directory.is_dir():
                raise PolicyError(f"policies directory {self.directory} does not exist")
            _read_folder(self.directory, policies)
        policies.setdefault("default", Policy(name="default", description="built-in default"))
        self._policies = policies

    def sources(self) -> list[Path]:
        """The folders read, in order (a later one overrides an earlier one)."""
        folders = [self.shipped] if self.shipped is not None and self.shipped.is_dir() else []
        if self.directory is not None and self.directory not in folders:
            folders.append(self.directory)
        return folders

    def names(self) -> list[str]:
        """Known policy names, sorted."""
        return sorted(self._policies)

    def get(self, name: str) -> Policy:
        """The policy called ``name``; unknown names are a PolicyError listing the known ones."""
        try:
            return self._policies[name]
        except KeyError:
            raise PolicyError(
                f"unknown policy {name!r}; known policies: {', '.join(self.names())}"
            ) from None

    def all(self) -> list[Policy]:
        """Every policy, sorted by name."""
        return [self._policies[n] for n in self.names()]
