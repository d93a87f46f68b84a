"""Said once: durations (parsed and shown), how a task ended in words, and UTF-8 cuts.

Every interface (HTTP bodies, CLI options, MCP tools, notifications) parses and prints
through these, so ``30s`` means the same everywhere and a bad value gets the same error.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Literal

from supervisor.core.errors import SpecError
from supervisor.core.models import StopReason, TaskInfo

Unit = Literal["ms", "s", "m", "h"]
_UNIT_MS: dict[str, int] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
#: Longest duration accepted before range checks: keeps the arithmetic finite (a 400-digit
#: number of seconds would otherwise overflow on its way to an int).
MAX_DURATION_S = 10.0**9
DURATION_HELP = "a number with ms, s, m or h (e.g. 500ms, 30s, 5m, 1h)"


def parse_duration(
    value: str | float | int, field: str, *, default_unit: Unit | None = "s"
) -> float:
    """Seconds from ``500ms``, ``30s``, ``5m``, ``1h`` or a bare number (in
    ``default_unit``; None: a unit is required). Raises SpecError naming ``field``."""
    if isinstance(value, bool):
        raise SpecError(f"{field}: expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value) * _UNIT_MS[default_unit or "s"] / 1000
        shown = repr(value)
    else:
        match = _DURATION.match(value)
        if not match or (match.group(2) is None and default_unit is None):
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise SpecError(f"{field}: {shown!r} is not a duration (use {DURATION_HELP})")
        unit = match.group(2) or default_unit or "s"
        seconds = float(match.group(1)) * _UNIT_MS[unit] / 1000
        shown = value if len(value) <= 40 else value[:40] + "..."
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise SpecError(f"{field}: {shown} is far too long (at most {MAX_DURATION_S:.0f} s)")
    if seconds < 0:
        raise SpecError(f"{field}: {shown} is negative")
    return seconds


def parse_duration_ms(value: str | float | int, field: str, *, default_unit: Unit = "s") -> int:
    """Like :func:`parse_duration`, in whole milliseconds (at least 1)."""
    ms = round(parse_duration(value, field, default_unit=default_unit) * 1000)
    if ms < 1:
        raise SpecError(f"{field}: {value!r} is shorter than 1ms")
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


#: Why a task stopped, as the end of "... was killed: <this>" / "... failed: <this>".
REASON_TEXT: dict[StopReason, str] = {
    "exit": "it exited",
    "timeout": "it reached its timeout",
    "idle_timeout": "it printed nothing for too long (idle timeout)",
    "user_stopped": "stopped by request",
    "session_ended": "the session ended",
    "oom_killed": "killed for running out of memory",
    "lost": "its container was lost",
}
#: The reason as a short column value (``user stopped``).
REASON_SHORT: dict[StopReason, str] = {reason: reason.replace("_", " ") for reason in REASON_TEXT}


def outcome_short(info: TaskInfo) -> str:
    """The reason/exit column: ``exit 0``, ``timeout``, ``user stopped``, ``image_missing``;
    ``stalled`` or ``-`` while it runs."""
    if not info.ended:
        return "stalled" if info.stalled else "-"
    if info.reason == "exit":
        return f"exit {info.exit_code}"
    if info.reason is None:
        return info.error_code or "never ran"
    return REASON_SHORT[info.reason]


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
