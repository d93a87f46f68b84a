"""A fake container engine for fast component tests: scripted containers in memory behind
the Backend Protocol (no Docker), like httpcore's mock backend. Start at ``FakeEngine``."""

from __future__ import annotations

from supervisor.engine.fake.container import Copier, FakeAttach, FakeContainer, LogMessage
from supervisor.engine.fake.engine import FakeBackend, FakeEngine, task_command
from supervisor.engine.fake.script import (
    Clock,
    ExecFromStdin,
    Exit,
    FakeClock,
    LoopClock,
    Out,
    ReadEOF,
    ReadLine,
    Script,
    Sleep,
    Step,
    UntilKilled,
    WaitFor,
)

__all__ = [
    "Clock",
    "Copier",
    "ExecFromStdin",
    "Exit",
    "FakeAttach",
    "FakeBackend",
    "FakeClock",
    "FakeContainer",
    "FakeEngine",
    "LogMessage",
    "LoopClock",
    "Out",
    "ReadEOF",
    "ReadLine",
    "Script",
    "Sleep",
    "Step",
    "UntilKilled",
    "WaitFor",
    "task_command",
]
