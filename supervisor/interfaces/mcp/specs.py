"""How the MCP tools' arguments become task specs: their checks, and the fields they set."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from supervisor.core.problems import InvalidRequest
from supervisor.core.text import format_duration

#: Characters of output a ``<background_task_poll>`` carries (seed 000 asks for 2000-4000).
POLL_TAIL_CHARS: Final = 3000
#: The runtime polls at most once a second (``TaskSpec.poll_every_s`` >= 1).
MIN_POLL_S: Final = 1.0
#: The runtime's longest poll period (``TaskSpec.poll_every_s`` <= 86400), in minutes.
MAX_TAIL_EVERY_MINUTES: Final = 1440.0
#: A foreground command's timeout when the agent gives none and nothing moves it to the
#: background (Claude Code's Bash tool default).
FOREGROUND_TIMEOUT_MS: Final = 120_000
#: What ``tail_every_minutes`` accepts, as error messages and the schema say it.
TAIL_EVERY_RANGE = (
    f"a number of minutes > 0 and at most {MAX_TAIL_EVERY_MINUTES:g} (24 hours); fractions "
    "are allowed (0.5 = every 30 seconds, 0.05 = every 3 seconds)"
)


def poll_fields(tail_every_minutes: float | None) -> dict[str, Any]:
    """The spec fields for periodic ``<background_task_poll>`` blocks every
    ``tail_every_minutes`` (None: no polls): only when the output changed, with the last
    ``POLL_TAIL_CHARS`` characters. Periods under a second poll every second."""
    if tail_every_minutes is None:
        return {}
    value = tail_every_minutes
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
        or value > MAX_TAIL_EVERY_MINUTES
    ):
        raise InvalidRequest(
            f"must be {TAIL_EVERY_RANGE}; got {value!r}", field="tail_every_minutes"
        )
    return {
        # Whole milliseconds: the period is shown back to people as a duration.
        "poll_every_s": max(MIN_POLL_S, round(value * 60, 3)),
        "poll_tail_chars": POLL_TAIL_CHARS,
        "poll_only_on_change": True,
    }


@dataclass(frozen=True)
class BashCall:
    """One ``bash`` tool call's arguments (None: not given)."""

    command: str
    description: str = ""
    timeout_ms: int | None = None
    run_in_background: bool = False
    tail_every_minutes: float | None = None
    persistent: bool | None = None


@dataclass(frozen=True)
class Planned:
    """A task spec to start and how the bridge treats it."""

    spec: dict[str, Any]
    """The fields sent to the daemon (the session's policy is added by the bridge)."""
    persistent_fallback: bool
    """Whether a policy without persistent tasks may run it with its default timeout
    instead (only when the agent did not ask for ``persistent`` itself)."""
    timeout_ms: int | None = None
    """Foreground: the timeout the command runs under (None: none of its own)."""


def _base(call: BashCall) -> dict[str, Any]:
    return {
        "command": call.command,
        "description": call.description,
        **poll_fields(call.tail_every_minutes),
    }


def background(call: BashCall) -> Planned:
    """``run_in_background``: without ``timeout`` it runs until it ends, ``task_stop`` or
    the session's end (``persistent=false``: the policy's default timeout instead)."""
    spec = _base(call)
    if call.persistent and call.timeout_ms is not None:
        raise InvalidRequest(
            "persistent=true runs the command with no timeout, so it cannot be given together "
            "with timeout: leave out one of them",
            field="persistent",
        )
    if call.timeout_ms is not None:
        spec["timeout_ms"] = call.timeout_ms
    elif call.persistent is not False:
        spec["persistent"] = True
    return Planned(spec, persistent_fallback=call.persistent is None)


def foreground(call: BashCall, auto_background_s: float) -> Planned:
    """A foreground command, stdin closed. With auto-backgrounding on
    (``auto_background_s`` > 0) and no ``timeout`` of its own it gets no timeout: once
    moved to the background it runs until it ends, as a background command would."""
    if call.persistent is not None:
        raise InvalidRequest(
            "only for background commands (run_in_background=true); a foreground command "
            + (
                f"still running after {format_duration(round(auto_background_s * 1000))} is "
                "moved to the background by itself, and runs on without a timeout unless you "
                "give one"
                if auto_background_s > 0
                else "runs until it ends or its timeout"
            ),
            field="persistent",
        )
    spec = {**_base(call), "stdin": "closed"}
    timeout_ms = call.timeout_ms
    if timeout_ms is None and auto_background_s <= 0:
        timeout_ms = FOREGROUND_TIMEOUT_MS
    if timeout_ms is None:
        spec["persistent"] = True
    else:
        spec["timeout_ms"] = timeout_ms
    return Planned(spec, persistent_fallback=True, timeout_ms=timeout_ms)


def monitor(
    command: str,
    description: str,
    timeout_ms: int,
    persistent: bool,
    tail_every_minutes: float | None,
) -> dict[str, Any]:
    """``monitor_start``'s spec."""
    spec: dict[str, Any] = {
        "command": command,
        "description": description,
        "kind": "monitor",
        **poll_fields(tail_every_minutes),
    }
    if persistent:
        spec["persistent"] = True
    else:
        spec["timeout_ms"] = timeout_ms
    return spec
