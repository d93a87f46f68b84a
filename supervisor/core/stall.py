"""Pure stall decisions: is a task waiting for input on its stdin? Fed observations + times."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Signal = Literal["process_state", "heuristic"]

#: How often a quiet task is looked at while nothing suggests it is waiting.
SAMPLE_EVERY_S = 1.0
#: The first look after start or after output: soon, so a prompt is noticed early.
FIRST_LOOK_S = 0.5
#: CPU use (fraction of one core) below which a quiet task counts as idle (heuristic only).
IDLE_CPU_FRACTION = 0.02

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_PROMPT = re.compile(
    r"""(
        \[\s*(y(es)?\s*/\s*n(o)?|n(o)?\s*/\s*y(es)?)\s*\]   # [y/N] [yes/no]
      | \(\s*(y(es)?\s*/\s*n(o)?|n(o)?\s*/\s*y(es)?)\s*\)   # (y/n) (yes/no)
      | (press|hit)\s+(enter|return|any\s+key)              # press enter
      | (password|passphrase|username|login|token|otp)[^\n]{0,40}$
      | [?:>]\s*$                                           # "Name: " "Continue? " "> "
      | [$#]\s$                                             # shell-like "$ "
    )""",
    re.IGNORECASE | re.VERBOSE,
)


def looks_like_prompt(tail: str) -> bool:
    """True when the last non-empty output line reads like a question or an input prompt."""
    text = _ANSI.sub("", tail).replace("\r", "\n")
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return False
    return bool(_PROMPT.search(lines[-1].rstrip("\n")[-200:]))


@dataclass(frozen=True)
class Verdict:
    """A stall was detected."""

    signal: Signal
    waiting_s: float


class StallDetector:
    """One per task. ``observe_*`` return a Verdict once per stall episode; an episode ends
    when output resumes or input is sent (``output()`` / ``input_sent()``)."""

    __slots__ = ("_cpu_mark", "_first_blocked", "_next_check", "in_episode", "stall_after")

    def __init__(self, stall_after_s: float, now: float) -> None:
        self.stall_after = stall_after_s
        self.in_episode = False
        self._first_blocked: float | None = None
        self._cpu_mark: tuple[float, int] | None = None
        self._next_check = now + min(FIRST_LOOK_S, stall_after_s / 2)

    def _reset(self, now: float) -> None:
        self.in_episode = False
        self._first_blocked = None
        self._cpu_mark = None
        self._next_check = now + min(FIRST_LOOK_S, self.stall_after / 2)

    def output(self, now: float) -> None:
        """Output arrived: whatever the task was waiting for, it is making progress."""
        self._reset(now)

    def input_sent(self, now: float) -> None:
        """Input was written to stdin: a new wait is a new episode."""
        self._reset(now)

    def due(self, now: float) -> bool:
        """Should the watcher take an observation now?"""
        return not self.in_episode and now >= self._next_check

    def next_check_at(self) -> float:
        return self._next_check

    # -- primary signal: the kernel's view of the processes ---------------------------

    def observe_process(self, now: float, *, blocked_on_stdin: bool) -> Verdict | None:
        """A sample of process state: is some process blocked reading the task's stdin?"""
        if self.in_episode:
            return None
        if not blocked_on_stdin:
            self._first_blocked = None
            self._next_check = now + SAMPLE_EVERY_S
            return None
        if self._first_blocked is None:
            self._first_blocked = now
        waited = now - self._first_blocked
        if waited >= self.stall_after - 1e-6:
            self.in_episode = True
            return Verdict("process_state", waited)
        # Look again exactly when the wait would reach the threshold.
        self._next_check = self._first_blocked + self.stall_after
        return None

    # -- fallback: silence, idle CPU and a prompt-like tail ----------------------------

    def observe_heuristic(
        self, now: float, *, quiet_since: float, cpu_ns: int | None, prompt_like: bool
    ) -> Verdict | None:
        """Where process state cannot be read (gVisor, remote engines)."""
        if self.in_episode:
            return None
        quiet = now - quiet_since
        if not prompt_like:
            self._cpu_mark = None
            self._next_check = now + SAMPLE_EVERY_S
            return None
        if self._cpu_mark is None or self._cpu_mark[0] < quiet_since:
            if cpu_ns is not None:
                self._cpu_mark = (now, cpu_ns)
            self._next_check = max(now + SAMPLE_EVERY_S / 2, quiet_since + self.stall_after)
            return None
        if quiet < self.stall_after - 1e-6:
            self._next_check = quiet_since + self.stall_after
            return None
        if not self._idle_since_mark(now, cpu_ns):
            self._next_check = now + SAMPLE_EVERY_S
            return None
        self.in_episode = True
        return Verdict("heuristic", quiet)

    def _idle_since_mark(self, now: float, cpu_ns: int | None) -> bool:
        """Whether the CPU stayed (nearly) idle since the last mark; a busy span moves the
        mark, an unknown one keeps it."""
        assert self._cpu_mark is not None
        mark_t, mark_cpu = self._cpu_mark
        span = now - mark_t
        if cpu_ns is None or span <= 0:
            return False
        if (cpu_ns - mark_cpu) / 1e9 / span > IDLE_CPU_FRACTION:
            self._cpu_mark = (now, cpu_ns)
            return False
        return True
