"""Fault injection for crash tests: ``SANDVISOR_TEST_CRASH_AT=<point>[:<n>]`` makes the process
SIGKILL itself the n-th time (default: first) it reaches ``point``. Off unless set."""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("SANDVISOR_TEST_CRASH_AT", "")
_POINT, _, _NTH = _SPEC.partition(":")
_COUNTS: dict[str, int] = {}

#: The points the supervisor passes through, in task order.
POINTS = ("before_create", "after_create", "after_start", "mid_stream", "after_exit")
#: Reached only while re-attaching: the container is paused until the log is read.
REATTACH_PAUSED = "reattach_paused"


def crash_point(name: str, amount: int = 1) -> None:
    """Die here (SIGKILL, like ``kill -9``) if the environment asks for it."""
    if not _POINT or name != _POINT:
        return
    _COUNTS[name] = _COUNTS.get(name, 0) + amount
    if _COUNTS[name] >= int(_NTH or 1):
        os.kill(os.getpid(), signal.SIGKILL)
