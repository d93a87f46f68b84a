"""sandbox-supervisor: every background command an agent launches, in its own hardened container."""

from supervisor.errors import (
    EngineUnavailable,
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
from supervisor.events import (
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
from supervisor.events import (
    SessionEnded as SessionEndedEvent,
)
from supervisor.models import OutputSlice, PatternMatch, TaskInfo, TaskLimits, TaskSpec
from supervisor.policy import Policy
from supervisor.render import render_json, render_xml
from supervisor.session import Session
from supervisor.sinks import CallbackSink, JsonlSink, MemorySink, Sink
from supervisor.supervisor import Supervisor

__all__ = [
    "BaseEvent",
    "CallbackSink",
    "EngineUnavailable",
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
    "parse_event",
    "render_json",
    "render_xml",
]
