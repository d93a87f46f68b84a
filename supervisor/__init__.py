"""sandbox-supervisor: every background command an agent launches, in its own hardened container.

The package is layered (``docs/architecture.md``): ``core`` (pure contracts and logic),
``engine``, ``state``, ``runtime``, ``tooling`` and ``interfaces``, each importing only
from the layers below it. This module is the public facade. It imports nothing until a
name is used, so ``import supervisor.interfaces.client`` (the CLI, the MCP server) loads
neither docker nor the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.core.errors import (
        EngineUnavailable,
        EngineUnresponsive,
        ImageMissing,
        LimitExceeded,
        PolicyError,
        RuntimeUnavailable,
        SessionEnded,
        SessionNotFound,
        SpecError,
        StateStorageError,
        StdinClosed,
        SupervisorError,
        TaskNotFound,
        TaskNotRunning,
        WaitTimeout,
    )
    from supervisor.core.events import (
        BaseEvent,
        Event,
        EventsGap,
        TaskFailed,
        TaskOutput,
        TaskOutputSuppressed,
        TaskPoll,
        TaskStalled,
        TaskStarted,
        TaskStopped,
        parse_event,
    )
    from supervisor.core.events import SessionEnded as SessionEndedEvent
    from supervisor.core.models import OutputSlice, PatternMatch, TaskInfo, TaskLimits, TaskSpec
    from supervisor.core.policy import Policy
    from supervisor.core.render import render_json, render_xml
    from supervisor.core.workspace import WorkspaceSpec
    from supervisor.runtime.session import Session
    from supervisor.runtime.supervisor import Supervisor
    from supervisor.state.sinks import CallbackSink, JsonlSink, MemorySink, Sink

#: Public name -> (module, attribute in it).
_PUBLIC: dict[str, tuple[str, str]] = {
    **{
        name: ("supervisor.core.errors", name)
        for name in (
            "EngineUnavailable",
            "EngineUnresponsive",
            "ImageMissing",
            "LimitExceeded",
            "PolicyError",
            "RuntimeUnavailable",
            "SessionEnded",
            "SessionNotFound",
            "SpecError",
            "StateStorageError",
            "StdinClosed",
            "SupervisorError",
            "TaskNotFound",
            "TaskNotRunning",
            "WaitTimeout",
        )
    },
    **{
        name: ("supervisor.core.events", name)
        for name in (
            "BaseEvent",
            "Event",
            "EventsGap",
            "TaskFailed",
            "TaskOutput",
            "TaskOutputSuppressed",
            "TaskPoll",
            "TaskStalled",
            "TaskStarted",
            "TaskStopped",
            "parse_event",
        )
    },
    "SessionEndedEvent": ("supervisor.core.events", "SessionEnded"),
    **{
        name: ("supervisor.core.models", name)
        for name in ("OutputSlice", "PatternMatch", "TaskInfo", "TaskLimits", "TaskSpec")
    },
    "Policy": ("supervisor.core.policy", "Policy"),
    "render_json": ("supervisor.core.render", "render_json"),
    "render_xml": ("supervisor.core.render", "render_xml"),
    "Session": ("supervisor.runtime.session", "Session"),
    "Supervisor": ("supervisor.runtime.supervisor", "Supervisor"),
    "WorkspaceSpec": ("supervisor.core.workspace", "WorkspaceSpec"),
    **{
        name: ("supervisor.state.sinks", name)
        for name in ("CallbackSink", "JsonlSink", "MemorySink", "Sink")
    },
}

__all__ = [
    "BaseEvent",
    "CallbackSink",
    "EngineUnavailable",
    "EngineUnresponsive",
    "Event",
    "EventsGap",
    "ImageMissing",
    "JsonlSink",
    "LimitExceeded",
    "MemorySink",
    "OutputSlice",
    "PatternMatch",
    "Policy",
    "PolicyError",
    "RuntimeUnavailable",
    "Session",
    "SessionEnded",
    "SessionEndedEvent",
    "SessionNotFound",
    "Sink",
    "SpecError",
    "StateStorageError",
    "StdinClosed",
    "Supervisor",
    "SupervisorError",
    "TaskFailed",
    "TaskInfo",
    "TaskLimits",
    "TaskNotFound",
    "TaskNotRunning",
    "TaskOutput",
    "TaskOutputSuppressed",
    "TaskPoll",
    "TaskSpec",
    "TaskStalled",
    "TaskStarted",
    "TaskStopped",
    "WaitTimeout",
    "WorkspaceSpec",
    "parse_event",
    "render_json",
    "render_xml",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'supervisor' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
