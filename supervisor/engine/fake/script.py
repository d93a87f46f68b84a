"""What a fake container does: a script of steps (output, waits, exit) and the clock its
sleeps and log times run on."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass
from typing import Protocol

from supervisor.core.demux import STDOUT


@dataclass(frozen=True)
class Out:
    """Write ``data`` to stdout (``stream=1``) or stderr (``stream=2``)."""

    data: bytes | str
    stream: int = STDOUT


@dataclass(frozen=True)
class ReadLine:
    """Wait until stdin holds a whole line (or is closed), and take it; ``echo`` writes it
    back to stdout (a shell's ``read``, or ``head -n1``)."""

    echo: bool = False


@dataclass(frozen=True)
class ReadEOF:
    """Read stdin until it is closed; ``echo`` copies it to stdout as it comes (``cat``)."""

    echo: bool = False


@dataclass(frozen=True)
class Sleep:
    """Wait this many seconds of the engine's clock (a FakeClock moves only when told)."""

    seconds: float


@dataclass(frozen=True)
class WaitFor:
    """Wait until the test sets this event."""

    event: asyncio.Event


@dataclass(frozen=True)
class UntilKilled:
    """Wait for a signal (``sleep infinity``)."""


@dataclass(frozen=True)
class Exit:
    """End with this exit code now; ``oom_killed`` as when the kernel's OOM killer struck."""

    code: int = 0
    oom_killed: bool = False


@dataclass(frozen=True)
class ExecFromStdin:
    """The warm pool's shell loop: read stdin lines until the line ``sentinel``, then run the
    script the engine chooses for the command read so far (stdin stays for that script)."""

    sentinel: str


Step = Out | ReadLine | ReadEOF | Sleep | WaitFor | UntilKilled | Exit | ExecFromStdin


class Script:
    """A container's behaviour: its steps in order, then exit 0.

    ``ignore_sigterm``: SIGTERM is received but changes nothing (``trap '' TERM``); only
    SIGKILL ends it. Otherwise SIGTERM ends it with 143, SIGKILL with 137."""

    __slots__ = ("ignore_sigterm", "steps")

    def __init__(self, *steps: Step, ignore_sigterm: bool = False) -> None:
        self.steps = steps
        self.ignore_sigterm = ignore_sigterm

    def __repr__(self) -> str:
        return f"Script({', '.join(map(repr, self.steps))}, ignore_sigterm={self.ignore_sigterm})"


class Clock(Protocol):
    """Time for the fake engine: wall time for log stamps, and sleeps."""

    def now_ns(self) -> int:
        """Nanoseconds since the Unix epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class LoopClock:
    """Real time: ``time.time_ns`` and ``asyncio.sleep``."""

    def now_ns(self) -> int:
        return time.time_ns()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """Time that moves only when a test calls :meth:`advance` (deterministic sleeps; every
    log message between two advances carries the same time, as on a coarse clock)."""

    def __init__(self, start_ns: int = 1_700_000_000 * 10**9) -> None:
        self._now = start_ns
        self._order = itertools.count()
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []

    def now_ns(self) -> int:
        return self._now

    async def sleep(self, seconds: float) -> None:
        due = self._now + round(seconds * 1e9)
        if due <= self._now:
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (due, next(self._order), future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time forward and wake the sleeps that are due (they run at the loop's next
        turn, in the order they are due)."""
        self._now += round(seconds * 1e9)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting (cancelled ones included until they are due)."""
        return len(self._sleepers)
