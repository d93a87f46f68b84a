"""Pure: what the supervisor counts while it runs (tasks, events, output, start latency),
kept as plain numbers that a metrics exporter reads only when it is scraped."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from supervisor.core.container import EngineState
from supervisor.core.events import BaseEvent, Event, EventsGap, TaskStarted, TaskStopped

#: Which way a task's command got running: a container created for it, or a warm one.
StartPath = Literal["cold", "warm"]
START_PATHS: tuple[StartPath, ...] = ("cold", "warm")
#: Upper bounds (seconds) of the start -> first byte histogram: a warm start answers in
#: milliseconds, a cold one in tens to hundreds of them, a command that waits before it
#: prints anything in seconds.
START_BUCKETS: tuple[float, ...] = (
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: The ``reason`` of ``sandvisor_tasks_ended_total`` for a task that never ran (``task.failed``).
FAILED = "failed"
#: Every reason a task can end with, so each series exists (at 0) from the first scrape.
END_REASONS: tuple[str, ...] = (
    "exit",
    "timeout",
    "idle_timeout",
    "user_stopped",
    "session_ended",
    "workspace_full",
    "oom_killed",
    "lost",
    FAILED,
)

#: Every type of event a session logs (``events.gap`` is made per reader, never logged).
EVENT_TYPES: tuple[str, ...] = tuple(
    str(cls.model_fields["type"].default)
    for cls in get_args(get_args(Event)[0])
    if cls is not EventsGap
)


class Histogram:
    """Fixed buckets, Prometheus style (``le``: a value equal to a bound falls in it)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float] = START_BUCKETS) -> None:
        self.bounds = tuple(sorted(bounds))
        #: Per bucket, not cumulative; the last one is ``+Inf``.
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> tuple[tuple[float, int], ...]:
        """(upper bound, observations <= it) per bucket, the last bound ``inf``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return tuple(out)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A histogram as of one scrape."""

    buckets: tuple[tuple[float, int], ...]
    """(upper bound, cumulative count), the last bound ``inf``."""
    count: int
    total: float
    """The sum of every observed value."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything ``/metrics`` shows, as of one moment: counters since this process
    started, and gauges read from the supervisor's live state."""

    tasks_running: int
    """Tasks that have not ended (starting, running or stopping), every session."""
    tasks_started: Mapping[str, int]
    """Policy -> tasks whose command ran (``task.started``)."""
    tasks_ended: Mapping[str, int]
    """Reason -> tasks that ended (``task.stopped``'s reason; ``failed``: never ran)."""
    task_start_seconds: Mapping[str, HistogramSnapshot]
    """``cold`` / ``warm`` -> acceptance to the first byte of output."""
    output_bytes: int
    """Bytes of output received from every task (stdout and stderr)."""
    stalls: int
    """``task.stalled`` events: a task seemed to wait for input."""
    events: Mapping[str, int]
    """Event type -> events logged, every session."""
    sink_lag_events: int
    """Events logged but not yet delivered by the sink furthest behind (0 without sinks)."""
    engine_up: bool
    """Whether the container engine answered (and is not wedged)."""
    pool_ready: Mapping[str, int]
    """Policy -> warm containers ready to take a command (every scope summed)."""
    sessions_open: int
    """Sessions open now."""
    engine_state: EngineState = "up"
    """``up``, ``wedged`` (it takes connections, its operations do not complete) or
    ``down`` (runtime/engine_checks.py)."""


class RuntimeStats:
    """The supervisor's counters. Bumped on the event loop by plain attribute and dict
    updates (no locks, no formatting), so counting costs nothing measurable; an exporter
    takes a :meth:`snapshot` when it is scraped."""

    __slots__ = ("ended", "events", "output_bytes", "stalls", "start_seconds", "started")

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.ended: dict[str, int] = dict.fromkeys(END_REASONS, 0)
        self.events: dict[str, int] = dict.fromkeys(EVENT_TYPES, 0)
        self.stalls = 0
        self.output_bytes = 0
        self.start_seconds = {path: Histogram() for path in START_PATHS}

    def event(self, event: BaseEvent) -> None:
        """Count one logged event (the event log calls this once per event it logs)."""
        kind = event.type
        self.events[kind] = self.events.get(kind, 0) + 1
        if isinstance(event, TaskStarted):
            self.started[event.policy] = self.started.get(event.policy, 0) + 1
        elif isinstance(event, TaskStopped):
            self.ended[event.reason] = self.ended.get(event.reason, 0) + 1
        elif kind == "task.failed":
            self.ended[FAILED] += 1
        elif kind == "task.stalled":
            self.stalls += 1

    def output(self, nbytes: int) -> None:
        """Output received from a task."""
        self.output_bytes += nbytes

    def first_byte(self, path: StartPath, seconds: float) -> None:
        """A task's first output arrived ``seconds`` after it was accepted."""
        self.start_seconds[path].observe(max(0.0, seconds))

    def snapshot(
        self,
        *,
        tasks_running: int,
        sink_lag_events: int,
        engine_up: bool,
        pool_ready: Mapping[str, int],
        sessions_open: int,
        policies: Iterable[str] = (),
        engine_state: EngineState | None = None,
    ) -> MetricsSnapshot:
        """The counters as they are now, with the gauges the caller read (copies: the
        snapshot does not change when the counters move on). ``policies``: names whose
        started count shows (at 0) before any task of theirs started."""
        return MetricsSnapshot(
            tasks_running=tasks_running,
            tasks_started={**dict.fromkeys(policies, 0), **self.started},
            tasks_ended=dict(self.ended),
            task_start_seconds={
                path: HistogramSnapshot(h.cumulative(), h.count, h.total)
                for path, h in self.start_seconds.items()
            },
            output_bytes=self.output_bytes,
            stalls=self.stalls,
            events=dict(self.events),
            sink_lag_events=sink_lag_events,
            engine_up=engine_up,
            pool_ready=dict(pool_ready),
            sessions_open=sessions_open,
            engine_state=engine_state or ("up" if engine_up else "down"),
        )
