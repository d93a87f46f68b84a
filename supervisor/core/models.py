"""Public data contracts: what a caller asks for (TaskSpec) and what it gets back."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

#: Hard ceiling on any task's timeout, whatever the policy says (1 hour).
MAX_TIMEOUT_MS = 3_600_000
#: Linux refuses any single argv (or environment) string longer than MAX_ARG_STRLEN,
#: 32 pages, counting its NUL: execve fails with E2BIG, "argument list too long".
#: 4 KiB is the smallest page size of the platforms we run on (x86-64, arm64).
PAGE_SIZE = 4096
MAX_ARG_STRLEN = 32 * PAGE_SIZE
#: The command runs as ``/bin/sh -c MERGE_PREFIX + COMMAND`` with stderr folded into stdout
#: *inside* the container, so the output file keeps the exact order the command wrote in
#: (two engine-side pipes would let stdout and stderr overtake each other).
MERGE_PREFIX = "exec 2>&1; "
#: A warm container's exit code when its stdin ended before a command arrived (the attach
#: connection dropped with a crash): re-adoption knows the command never ran.
POOL_NO_COMMAND = 199
#: Largest command, in UTF-8 bytes: what fits in that one argv string beside the prefix and
#: the NUL, less the newline a warm-pool container's shell adds after the command's last
#: line before it execs the same ``sh -c`` (one limit for cold and pooled tasks).
MAX_COMMAND_BYTES = MAX_ARG_STRLEN - len(MERGE_PREFIX.encode()) - len(b"\n") - len(b"\0")
#: Largest total size of task environment variables.
MAX_ENV_BYTES = 64 * 1024

Kind = Literal["background", "monitor"]
StdinMode = Literal["pipe", "closed"]
StopReason = Literal[
    "exit",
    "timeout",
    "idle_timeout",
    "user_stopped",
    "session_ended",
    "workspace_full",
    "oom_killed",
    "lost",
]
#: starting -> running -> stopping -> one of the final statuses.
TaskStatus = Literal["starting", "running", "stopping", "completed", "failed", "killed"]
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "killed"})

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _utf8(field: str, value: str) -> bytes:
    """``value`` as UTF-8; a lone surrogate (JSON allows ``"\\ud800"``) cannot be sent to
    the engine nor written back as JSON, so it is refused here, by field name."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field}: contains a lone surrogate (not valid UTF-8)") from None


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskLimits(_Frozen):
    """Per-task tightening of the policy's limits. Each must be <= the policy's value."""

    memory_mb: Annotated[int, Field(ge=6)] | None = None
    """Memory limit in MiB (memory+swap; there is no swap)."""
    cpus: Annotated[float, Field(gt=0, le=64)] | None = None
    """CPU quota in cores."""
    pids: Annotated[int, Field(ge=16)] | None = None
    """Maximum number of processes and threads in the container."""
    nofile: Annotated[int, Field(ge=16)] | None = None
    """Maximum open file descriptors per process."""
    fsize_mb: Annotated[int, Field(ge=1)] | None = None
    """Largest file a process may write, in MiB."""
    output_cap_bytes: Annotated[int, Field(ge=1024)] | None = None
    """Bytes of output kept in the output file before the rest is dropped."""


class TaskSpec(_Frozen):
    """What to run. Unknown fields and out-of-range values are rejected by name."""

    command: Annotated[str, Field(min_length=1)]
    """Shell command, run as ``sh -c COMMAND`` inside the policy's image."""
    description: Annotated[str, Field(max_length=500)] = ""
    """Short human label used in notifications; defaults to the command."""
    kind: Kind = "background"
    """``background``: output to the file only. ``monitor``: every stdout line is also an event."""
    timeout_ms: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)] | None = None
    """Stop the task after this many milliseconds (policy default: 300000; max 3600000)."""
    persistent: bool = False
    """Ignore the timeout; run until stopped or until the session ends."""
    policy: Annotated[
        str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    ] = "default"
    """Name of the policy (``policies/<name>.toml``) that sets isolation and limits."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables; names must be on the policy's allowlist."""
    stdin: StdinMode | None = None
    """``pipe`` (input can be sent, stalls are detected) or ``closed`` (EOF at once)."""
    poll_every_s: Annotated[float, Field(ge=1, le=86_400)] | None = None
    """Emit a ``task.poll`` with the output tail this often while the task runs."""
    poll_tail_chars: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """How many characters of output a poll carries (policy default 3000)."""
    poll_only_on_change: bool | None = None
    """Skip a poll when no output arrived since the last one (default true)."""
    stall_after_s: Annotated[float, Field(ge=0.5, le=3_600)] | None = None
    """Report a stall after the task has waited for stdin this long (policy default 3 s)."""
    idle_timeout_ms: Annotated[int, Field(ge=100, le=MAX_TIMEOUT_MS)] | None = None
    """Stop the task if it prints nothing for this long (reason ``idle_timeout``)."""
    limits: TaskLimits | None = None
    """Tighter limits than the policy's; asking for more than the policy allows is an error."""

    @field_validator("command")
    @classmethod
    def _command_size(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("command must not contain NUL bytes")
        size = len(_utf8("command", value))
        if size > MAX_COMMAND_BYTES:
            raise ValueError(
                f"command is longer than {MAX_COMMAND_BYTES} bytes (got {size}; Linux takes "
                f"at most {MAX_ARG_STRLEN} bytes in one argument, and the command runs as "
                f"sh -c {MERGE_PREFIX.strip()!r} + command; pass long scripts as a file in "
                "the workspace or on stdin)"
            )
        if not value.strip():
            raise ValueError("command must not be blank")
        return value

    @field_validator("command", "description", mode="before")
    @classmethod
    def _text(cls, value: object, info: ValidationInfo) -> object:
        # Before pydantic's own check, whose message ("unable to parse raw data as a unicode
        # string") does not say what is wrong.
        if isinstance(value, str):
            _utf8(info.field_name or "text", value)
        return value

    @field_validator("env")
    @classmethod
    def _env_shape(cls, value: dict[str, str]) -> dict[str, str]:
        total = 0
        for name, val in value.items():
            if not _ENV_NAME.match(name):
                raise ValueError(
                    f"env name {name!r} is not a valid variable name (letters, digits, _)"
                )
            if "\x00" in val:
                raise ValueError(f"env {name} must not contain NUL bytes")
            total += len(name) + len(_utf8(f"env.{name}", val)) + 2
        if total > MAX_ENV_BYTES:
            raise ValueError(f"env is larger than {MAX_ENV_BYTES} bytes in total")
        return value

    @model_validator(mode="after")
    def _lifetime(self) -> TaskSpec:
        if self.persistent and self.timeout_ms is not None:
            raise ValueError("timeout_ms and persistent=true exclude each other")
        return self

    @property
    def label(self) -> str:
        """The description, or the command when there is none."""
        return self.description or self.command


class TaskInfo(_Frozen):
    """A snapshot of one task. Final once ``status`` is completed, failed or killed."""

    task_id: str
    """Short unguessable id, e.g. ``bg-7f3a9c2e``."""
    session_id: str
    """The owning session."""
    command: str
    """The command as given."""
    description: str
    """The description as given (may be empty)."""
    kind: Kind
    """background or monitor."""
    policy: str
    """Name of the policy the task runs under."""
    status: TaskStatus
    """starting, running, stopping, or final: completed (exit 0), failed, killed."""
    output_path: str
    """Host path of the merged stdout+stderr file."""
    persistent: bool
    """True when the task has no timeout."""
    timeout_ms: int | None
    """Effective timeout (None when persistent)."""
    stdin: StdinMode
    """Effective stdin mode."""
    created_at: float
    """Wall-clock time the task was accepted (seconds since the epoch)."""
    started_at: float | None = None
    """Wall-clock time the container started."""
    ended_at: float | None = None
    """Wall-clock time the task reached its final status."""
    deadline_at: float | None = None
    """Wall-clock time the timeout fires (None when persistent)."""
    running_ms: int = 0
    """Time spent running so far (final once ended)."""
    reason: StopReason | None = None
    """Why the task stopped (set once final and it ran)."""
    exit_code: int | None = None
    """The command's exit code, when the engine reported one."""
    error: str | None = None
    """For failed tasks that never ran or were lost: what went wrong."""
    error_code: str | None = None
    """Stable code for ``error`` (image_missing, engine_unavailable, ...)."""
    container_id: str | None = None
    """Engine container id (short) while it exists."""
    output_bytes: int = 0
    """Bytes of command output written to the output file."""
    dropped_bytes: int = 0
    """Bytes of output dropped after the output cap was reached."""
    gap_bytes: int = 0
    """Bytes of output that could not be stored (full disk); marked in the file."""
    stalled: bool = False
    """True while the task appears to be waiting for input."""
    runtime: Literal["runc", "runsc"] | None = None
    """The OCI runtime its container runs on (``runsc``: gVisor), as its policy says."""

    @property
    def ended(self) -> bool:
        """True once the task has reached a final status."""
        return self.status in FINAL_STATUSES

    def describe_end(self) -> str:
        """A short phrase for the final status, e.g. ``completed, exit code 0``."""
        if not self.ended:
            return self.status
        if self.reason is None:
            return f"{self.status}: {self.error or 'never ran'}"
        if self.reason == "exit":
            return f"{self.status}, exit code {self.exit_code}"
        return f"{self.status}, {self.reason.replace('_', ' ')}"


class OutputSlice(_Frozen):
    """A byte range of a task's output file."""

    data: bytes
    """Raw bytes as the command wrote them."""
    offset: int
    """Where ``data`` starts in the file."""
    next_offset: int
    """Where the next read should start (``offset + len(data)``)."""
    eof: bool
    """True when the task has ended and nothing follows ``next_offset``."""

    @property
    def text(self) -> str:
        """``data`` decoded as UTF-8, invalid bytes replaced by U+FFFD."""
        return self.data.decode("utf-8", "replace")

    @property
    def lossy(self) -> bool:
        """True when ``text`` had to replace invalid UTF-8."""
        try:
            self.data.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False


class PatternMatch(_Frozen):
    """The first output line matching a ``wait_for`` pattern."""

    line: str
    """The matching line (decoded, without its newline). A line longer than the scan window
    (1 MiB) is searched in windows, and then this is the window that matched."""
    offset: int
    """Byte offset in the output file where ``line`` starts."""
