"""Said once: durations (parsed and shown), how a task ended in words, and UTF-8 cuts.

Every interface (HTTP bodies, CLI options, MCP tools, notifications) parses and prints
through these, so ``30s`` means the same everywhere and a bad value gets the same error.

No pydantic here, not even for types: the CLI parses its options and prints task lists
through this module on every start, and importing pydantic would double the time of
``sandvisor ps``. The task texts take a ``TaskInfo`` or its JSON form (a mapping) alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, Protocol

from supervisor.core.errors import SpecError

Unit = Literal["ms", "s", "m", "h"]
_UNIT_MS: dict[str, int] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
#: Longest duration accepted before range checks: keeps the arithmetic finite (a 400-digit
#: number of seconds would otherwise overflow on its way to an int).
MAX_DURATION_S = 10.0**9
DURATION_HELP = "a number with ms, s, m or h (e.g. 500ms, 30s, 5m, 1h)"


def _shown(value: str | float | int) -> str:
    """The value as quoted in an error, cut so a 400-digit number stays one short line."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= 40 else text[:40] + "...")


def parse_duration(
    value: str | float | int, field: str, *, default_unit: Unit | None = "s"
) -> float:
    """Seconds from ``500ms``, ``30s``, ``5m``, ``1h`` or a bare number (in
    ``default_unit``; None: a unit is required). Raises SpecError naming ``field``; its
    ``problem`` is the message without the name."""
    if isinstance(value, bool):
        raise SpecError(f"expected a duration, got {value!r}", field=field)
    if isinstance(value, (int, float)):
        seconds = float(value) * _UNIT_MS[default_unit or "s"] / 1000
    else:
        match = _DURATION.match(value)
        if not match or (match.group(2) is None and default_unit is None):
            raise SpecError(f"invalid duration {_shown(value)}: use {DURATION_HELP}", field=field)
        unit = match.group(2) or default_unit or "s"
        seconds = float(match.group(1)) * _UNIT_MS[unit] / 1000
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise SpecError(
            f"invalid duration {_shown(value)}: too long (at most {MAX_DURATION_S:.0f}s)",
            field=field,
        )
    if seconds < 0:
        raise SpecError(f"invalid duration {_shown(value)}: negative", field=field)
    return seconds


def parse_duration_ms(value: str | float | int, field: str, *, default_unit: Unit = "s") -> int:
    """Like :func:`parse_duration`, in whole milliseconds (at least 1)."""
    ms = round(parse_duration(value, field, default_unit=default_unit) * 1000)
    if ms < 1:
        raise SpecError(f"invalid duration {_shown(value)}: must be at least 1ms", field=field)
    return ms


def format_duration(ms: int) -> str:
    """Exact, in the largest whole unit: ``5m``, ``30s``, ``1500ms`` (parses back)."""
    for unit in ("h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def format_elapsed(ms: int | None) -> str:
    """For people, rounded: ``850ms``, ``12.3s``, ``4m05s``, ``2h03m`` (``-`` for None)."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


#: The statuses a task ends in (``TaskInfo.ended``).
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "killed"})

#: Why a task stopped (every ``StopReason``), as the end of "... was killed: <this>" /
#: "... failed: <this>".
REASON_TEXT: dict[str, str] = {
    "exit": "it exited",
    "timeout": "it reached its timeout",
    "idle_timeout": "it printed nothing for too long (idle timeout)",
    "user_stopped": "stopped by request",
    "session_ended": "the session ended",
    "workspace_full": "its workspace's changes went past the session's cap "
    "(session.workspace_max_mb / workspace_max_files); apply or discard them",
    "oom_killed": "killed for running out of memory",
    "lost": "its container was lost",
}
#: The reason as a short column value (``user stopped``).
REASON_SHORT: dict[str, str] = {reason: reason.replace("_", " ") for reason in REASON_TEXT}


class TaskFacts(Protocol):
    """The fields of a task these texts read; ``TaskInfo`` has them."""

    @property
    def task_id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def timeout_ms(self) -> int | None: ...
    @property
    def stalled(self) -> bool: ...


#: A task as these texts take it: a TaskInfo, or its JSON (what the daemon answers).
Task = TaskFacts | Mapping[str, Any]


class _Read:
    """Attribute access to a task given either way (missing JSON keys read as None)."""

    __slots__ = ("_get",)

    def __init__(self, task: Task) -> None:
        self._get = task.get if isinstance(task, Mapping) else lambda k: getattr(task, k, None)

    def __getattr__(self, name: str) -> Any:
        return self._get(name)


def is_final(task: Task) -> bool:
    """Whether the task has reached one of the final statuses."""
    return _Read(task).status in FINAL_STATUSES


def describe_end(task: Task) -> str:
    """A short phrase for the final status: ``completed, exit code 0``, ``killed, user
    stopped``, ``failed: <error>``; the status while it has not ended."""
    t = _Read(task)
    if t.status not in FINAL_STATUSES:
        return str(t.status)
    if t.reason is None:
        return f"{t.status}: {t.error or 'never ran'}"
    if t.reason == "exit":
        return f"{t.status}, exit code {t.exit_code}"
    return f"{t.status}, {REASON_SHORT.get(t.reason, str(t.reason))}"


def outcome_short(task: Task) -> str:
    """The reason/exit column: ``exit 0``, ``timeout``, ``user stopped``, ``image_missing``;
    ``stalled`` or ``-`` while it runs."""
    t = _Read(task)
    if t.status not in FINAL_STATUSES:
        return "stalled" if t.stalled else "-"
    if t.reason == "exit":
        return f"exit {t.exit_code}"
    if t.reason is None:
        return str(t.error_code or "never ran")
    return REASON_SHORT.get(t.reason, str(t.reason))


def end_clause(task: Task) -> str:
    """How a task ended, to follow its name: ``completed (exit code 0)``, ``failed (exit code
    3)``, ``was killed: it reached its timeout (30s)``, ``failed to start: <error>``;
    ``is running`` (its status) while it has not ended."""
    t = _Read(task)
    if t.status not in FINAL_STATUSES:
        return f"is {t.status}"
    if t.reason is None:
        return f"failed to start: {t.error or 'it never ran'}"
    if t.reason == "exit":
        return f"{t.status} (exit code {t.exit_code})"
    what = REASON_TEXT.get(t.reason, str(t.reason))
    if t.reason == "timeout" and t.timeout_ms:
        what += f" ({format_duration(t.timeout_ms)})"
    elif t.reason == "lost" and t.error:
        what += f" ({t.error})"
    return f"{'was killed' if t.status == 'killed' else 'failed'}: {what}"


def task_label(description: str, command: str, limit: int = 200) -> str:
    """The description, else the command; cut to ``limit`` characters."""
    label = description or command
    return label if len(label) <= limit else label[: limit - 3] + "..."


def utf8_safe_end(data: bytes | bytearray | memoryview) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence (at most 3 bytes)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 != 0x80:  # a lead byte or ASCII
            if b < 0x80:
                need = 1
            elif b >> 5 == 0b110:
                need = 2
            elif b >> 4 == 0b1110:
                need = 3
            elif b >> 3 == 0b11110:
                need = 4
            else:
                need = 1
            return n - back if need > back else n
    return n


def parse_engine_time(value: str | None) -> float | None:
    """An engine timestamp (RFC 3339, UTC, nanoseconds) as epoch seconds; None for none
    (the engine's zero time ``0001-01-01...`` included)."""
    if not value or value.startswith("0001-"):
        return None
    text = value.rstrip("Z")
    main, _, frac = text.partition(".")
    try:
        stamp = datetime.fromisoformat(main + "+00:00").timestamp()
    except ValueError:
        return None
    return stamp + (float("0." + frac[:6]) if frac else 0.0)
