"""The supervisor's metrics as of now: its counters plus gauges read from live state."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.stats import MetricsSnapshot, RuntimeStats
from supervisor.runtime.pool import Pools
from supervisor.runtime.session import Session


def live_metrics(
    stats: RuntimeStats, sessions: Sequence[Session], pools: Pools, *, engine_up: bool
) -> MetricsSnapshot:
    """A snapshot: a walk over the open sessions and pools, done only when asked (a
    Prometheus scrape), so nothing is kept up to date between scrapes."""
    return stats.snapshot(
        tasks_running=sum(s.running_count() for s in sessions),
        sink_lag_events=max((s.event_log.sink_lag() for s in sessions), default=0),
        engine_up=engine_up,
        pool_ready=pools.ready(),
        sessions_open=len(sessions),
    )
