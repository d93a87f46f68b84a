"""The supervisor's metrics as of now: its counters plus gauges read from live state."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.container import EngineState
from supervisor.core.policy import Policy
from supervisor.core.stats import MetricsSnapshot, RuntimeStats
from supervisor.runtime.pool import Pools
from supervisor.runtime.session import Session


def live_metrics(
    stats: RuntimeStats,
    sessions: Sequence[Session],
    pools: Pools,
    policies: Sequence[Policy],
    engine_up: bool,
    *,
    engine_state: EngineState | None = None,
) -> MetricsSnapshot:
    """A snapshot: a walk over the open sessions and pools, done only when asked (a
    Prometheus scrape), so nothing is kept up to date between scrapes. Every policy's
    series exist from the start (a counter first seen at 1 hides that first increase from
    ``rate()``)."""
    pooled = {p.name: 0 for p in policies if p.warm_pool_max > 0}
    return stats.snapshot(
        tasks_running=sum(s.running_count() for s in sessions),
        sink_lag_events=max((s.event_log.sink_lag() for s in sessions), default=0),
        # Up only when it answers and is not wedged.
        engine_up=engine_up and engine_state in (None, "up"),
        engine_state=engine_state,
        pool_ready={**pooled, **pools.ready()},
        sessions_open=len(sessions),
        policies=[p.name for p in policies],
    )
