"""``GET /metrics``: the supervisor's counters and gauges for Prometheus (admin token).

The only place ``prometheus_client`` is used. The runtime counts into a plain
``RuntimeStats`` (core/stats.py); a custom collector turns a snapshot of it into metric
families when Prometheus scrapes, so nothing is formatted or kept up to date in between.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from supervisor.core.errors import EngineUnavailable
from supervisor.core.stats import MetricsSnapshot
from supervisor.interfaces.daemon.deps import Admin
from supervisor.interfaces.daemon.replies import error_responses
from supervisor.runtime.supervisor import Supervisor

#: Every metric family ``/metrics`` serves, as named in the text format.
METRIC_NAMES = (
    "sandvisor_tasks_running",
    "sandvisor_tasks_started_total",
    "sandvisor_tasks_ended_total",
    "sandvisor_task_start_seconds",
    "sandvisor_output_bytes_total",
    "sandvisor_stalls_total",
    "sandvisor_events_total",
    "sandvisor_sink_lag_events",
    "sandvisor_engine_up",
    "sandvisor_pool_ready",
    "sandvisor_sessions_open",
)

_F = TypeVar("_F", CounterMetricFamily, GaugeMetricFamily)


class SupervisorCollector:
    """A prometheus_client collector over ``snapshot()`` (``Supervisor.metrics``)."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield GaugeMetricFamily(
            "sandvisor_tasks_running",
            "Tasks that have not ended (starting, running or stopping), every session.",
            value=s.tasks_running,
        )
        yield _labelled(
            CounterMetricFamily(
                "sandvisor_tasks_started",
                "Tasks whose command started running (task.started), by policy.",
                labels=["policy"],
            ),
            s.tasks_started,
        )
        yield _labelled(
            CounterMetricFamily(
                "sandvisor_tasks_ended",
                "Tasks that ended, by reason: task.stopped's reason (exit, timeout, "
                "idle_timeout, user_stopped, session_ended, workspace_full, oom_killed, lost), "
                "or failed "
                "for a task that never ran (task.failed).",
                labels=["reason"],
            ),
            s.tasks_ended,
        )
        start = HistogramMetricFamily(
            "sandvisor_task_start_seconds",
            "Seconds from a task's acceptance to the first byte of its output, by how it "
            "started: cold (a container created for it) or warm (from a warm pool).",
            labels=["path"],
        )
        for path, hist in sorted(s.task_start_seconds.items()):
            buckets = [(_bound(bound), float(n)) for bound, n in hist.buckets]
            start.add_metric([path], buckets, sum_value=hist.total)
        yield start
        yield CounterMetricFamily(
            "sandvisor_output_bytes",
            "Bytes of output received from tasks (stdout and stderr, before the output cap).",
            value=s.output_bytes,
        )
        yield CounterMetricFamily(
            "sandvisor_stalls",
            "Stall notices: a task appeared to wait for input on its stdin (task.stalled).",
            value=s.stalls,
        )
        yield _labelled(
            CounterMetricFamily(
                "sandvisor_events", "Events logged, every session, by type.", labels=["type"]
            ),
            s.events,
        )
        yield GaugeMetricFamily(
            "sandvisor_sink_lag_events",
            "Events logged but not yet delivered by the event sink furthest behind "
            "(0 without sinks); a sink more than sink_max_lag behind skips events.",
            value=s.sink_lag_events,
        )
        engine = GaugeMetricFamily(
            "sandvisor_engine_up",
            "1 when the container engine answers and its operations complete, else 0; "
            "state: up, wedged (it takes connections, its operations do not complete) or "
            "down (it does not answer).",
            labels=["state"],
        )
        engine.add_metric([s.engine_state], 1 if s.engine_up else 0)
        yield engine
        yield _labelled(
            GaugeMetricFamily(
                "sandvisor_pool_ready",
                "Warm containers ready to take a command, by policy (every scope summed).",
                labels=["policy"],
            ),
            s.pool_ready,
        )
        yield GaugeMetricFamily(
            "sandvisor_sessions_open", "Sessions open now.", value=s.sessions_open
        )


def _labelled(family: _F, values: Mapping[str, int]) -> _F:
    """``family`` with one sample per (label value, number), in label order."""
    for label, value in sorted(values.items()):
        family.add_metric([label], value)
    return family


def _bound(value: float) -> str:
    """A bucket's ``le`` as Prometheus writes it (``0.005``, ``1.0``, ``+Inf``)."""
    return "+Inf" if math.isinf(value) else repr(float(value))


def add_metrics_route(app: FastAPI, sup: Supervisor) -> None:
    """``GET /metrics`` over ``sup`` (a registry of its own: nothing of the process's
    default registry, which other code could fill, is exposed)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SupervisorCollector(sup.metrics))

    @app.get(
        "/metrics",
        tags=["metrics"],
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text format (OpenMetrics when the Accept header "
                "asks for it)",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **error_responses(404),
        },
    )
    async def metrics(request: Request, who: Admin) -> Response:
        """Admin only (a session token gets 404): counters since the daemon started and
        gauges as of now, for Prometheus (``bearer_token_file`` with the admin token)."""
        # The engine flag changes only when something talks to the engine; a scrape asks
        # (a sub-millisecond ping, bounded at 2 s) so sandvisor_engine_up is current.
        with contextlib.suppress(EngineUnavailable):
            await sup.ensure_engine()
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), headers={"Content-Type": content_type})
