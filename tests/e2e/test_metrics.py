"""``GET /metrics`` on a real daemon and engine: Prometheus's own parser reads it, every
metric name is there, and the counters match the tasks this test ran (started by policy,
ended by reason, stalls, events, output bytes, cold and warm starts)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Daemon

pytestmark = pytest.mark.timeout(180)

#: Every name the issue fixes (histograms and counters as their samples are named).
NAMES = (
    "sandvisor_tasks_running",
    "sandvisor_tasks_started_total",
    "sandvisor_tasks_ended_total",
    "sandvisor_task_start_seconds_bucket",
    "sandvisor_task_start_seconds_count",
    "sandvisor_task_start_seconds_sum",
    "sandvisor_output_bytes_total",
    "sandvisor_stalls_total",
    "sandvisor_events_total",
    "sandvisor_sink_lag_events",
    "sandvisor_engine_up",
    "sandvisor_pool_ready",
    "sandvisor_sessions_open",
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(c: httpx.Client) -> Samples:
    r = c.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled series that does not exist (yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start(c: httpx.Client, sid: str, **spec: Any) -> str:
    r = c.post(f"/sessions/{sid}/tasks", json=spec)
    assert r.status_code == 201, r.text
    task_id: str = r.json()["task_id"]
    return task_id


def wait(c: httpx.Client, sid: str, tid: str) -> dict[str, Any]:
    r = c.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 60})
    body: dict[str, Any] = r.json()
    assert not body["timed_out"], body
    task: dict[str, Any] = body["task"]
    return task


def wait_event(c: httpx.Client, sid: str, tid: str, kind: str) -> None:
    after, deadline = 0, time.monotonic() + 30
    while time.monotonic() < deadline:
        body = c.get(f"/sessions/{sid}/events", params={"after": after, "wait_s": 5}).json()
        if any(e["type"] == kind and e["task_id"] == tid for e in body["events"]):
            return
        after = body["last_seq"]
    pytest.fail(f"no {kind} for {tid} within 30 s")


def until_metric(c: httpx.Client, name: str, want: float, **labels: str) -> None:
    deadline = time.monotonic() + 30
    while value(scrape(c), name, **labels) != want:
        assert time.monotonic() < deadline, f"{name}{labels} never reached {want}"
        time.sleep(0.1)


def test_metrics_need_the_admin_token(daemon: Daemon) -> None:
    anon = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(daemon.socket)), base_url="http://sandvisor"
    )
    with anon:
        r = anon.get("/metrics")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
        assert anon.get(
            "/metrics", headers={"Authorization": "Bearer sandvisor_admin_wrong"}
        ).status_code == (401)
    with daemon.client() as admin:
        token = admin.post("/sessions", json={"session_id": "peek"}).json()["token"]
    with daemon.client(token=token) as session_client:
        # A session token may not see the whole daemon; like other admin routes: 404.
        assert session_client.get("/metrics").status_code == 404
    # What Prometheus does: loopback TCP, ``Authorization: Bearer`` from bearer_token_file.
    assert daemon.tcp is not None
    with httpx.Client(base_url=f"http://{daemon.tcp}", timeout=30) as tcp:
        assert tcp.get("/metrics").status_code == 401
        r = tcp.get("/metrics", headers={"Authorization": f"Bearer {daemon.token}"})
        assert r.status_code == 200
        assert 'sandvisor_engine_up{state="up"} 1.0' in r.text
        # Prometheus asks for OpenMetrics first; the answer then is OpenMetrics.
        r = tcp.get(
            "/metrics",
            headers={
                "Authorization": f"Bearer {daemon.token}",
                "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
            },
        )
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.endswith("# EOF\n")


def test_metrics_count_the_tasks_this_test_ran(daemon: Daemon) -> None:
    sid = "metrics"
    with daemon.client() as c:
        first = scrape(c)
        for name in NAMES:
            assert any(n == name for n, _ in first), f"{name} missing"
        assert value(first, "sandvisor_engine_up", state="up") == 1
        assert value(first, "sandvisor_sessions_open") == 0
        assert value(first, "sandvisor_tasks_ended_total", reason="exit") == 0

        assert c.post("/sessions", json={"session_id": sid}).status_code == 201
        ok = start(c, sid, command="echo hello", policy="fast")
        bad = start(c, sid, command="echo oops; exit 3", policy="fast")
        late = start(c, sid, command="exec sleep 30", policy="strict")
        failed = start(c, sid, command="echo never", policy="missingimage")
        asks = start(c, sid, command="read x", policy="fast", stall_after="1s")
        assert wait(c, sid, ok)["exit_code"] == 0
        assert wait(c, sid, bad)["exit_code"] == 3
        assert wait(c, sid, late)["reason"] == "timeout"
        assert wait(c, sid, failed)["status"] == "failed"
        wait_event(c, sid, asks, "task.stalled")
        assert c.post(f"/sessions/{sid}/tasks/{asks}/stop").json()["reason"] == "user_stopped"

        # The first task of a pooled policy starts cold and fills the pool; the next is warm.
        cold = start(c, sid, command="echo w1", policy="warm")
        assert wait(c, sid, cold)["exit_code"] == 0
        until_metric(c, "sandvisor_pool_ready", 2, policy="warm")
        warm = start(c, sid, command="echo w2", policy="warm")
        assert wait(c, sid, warm)["exit_code"] == 0

        left = start(c, sid, command="exec sleep 60", policy="fast")
        # Running once its command started (a task still starting counts as running too,
        # but ending the session then would end it before task.started).
        wait_event(c, sid, left, "task.started")
        until_metric(c, "sandvisor_tasks_running", 1)
        during = scrape(c)
        assert value(during, "sandvisor_sessions_open") == 1
        assert value(during, "sandvisor_sink_lag_events") == 0
        assert c.delete(f"/sessions/{sid}").status_code == 200
        assert c.get(f"/sessions/{sid}/tasks/{left}").status_code == 404

        m = scrape(c)
    assert value(m, "sandvisor_tasks_running") == 0
    assert value(m, "sandvisor_sessions_open") == 0
    assert value(m, "sandvisor_engine_up", state="up") == 1
    # Started: the tasks whose command ran, by policy (the missing image never ran).
    assert value(m, "sandvisor_tasks_started_total", policy="fast") == 4
    assert value(m, "sandvisor_tasks_started_total", policy="strict") == 1
    assert value(m, "sandvisor_tasks_started_total", policy="warm") == 2
    assert value(m, "sandvisor_tasks_started_total", policy="missingimage") == 0
    # Ended, by reason.
    assert value(m, "sandvisor_tasks_ended_total", reason="exit") == 4
    assert value(m, "sandvisor_tasks_ended_total", reason="timeout") == 1
    assert value(m, "sandvisor_tasks_ended_total", reason="user_stopped") == 1
    assert value(m, "sandvisor_tasks_ended_total", reason="session_ended") == 1
    assert value(m, "sandvisor_tasks_ended_total", reason="failed") == 1
    assert value(m, "sandvisor_tasks_ended_total", reason="lost") == 0
    assert value(m, "sandvisor_stalls_total") == 1
    assert value(m, "sandvisor_events_total", type="task.started") == 7
    assert value(m, "sandvisor_events_total", type="task.stopped") == 7
    assert value(m, "sandvisor_events_total", type="task.failed") == 1
    assert value(m, "sandvisor_events_total", type="task.stalled") == 1
    assert value(m, "sandvisor_events_total", type="session.ended") == 1
    # Output: exactly what the commands printed.
    assert value(m, "sandvisor_output_bytes_total") == len(b"hello\noops\nw1\nw2\n")
    # First bytes: three cold starts printed something, one warm start did.
    assert value(m, "sandvisor_task_start_seconds_count", path="cold") == 3
    assert value(m, "sandvisor_task_start_seconds_count", path="warm") == 1
    assert value(m, "sandvisor_task_start_seconds_bucket", path="warm", le="+Inf") == 1
    cold_s = value(m, "sandvisor_task_start_seconds_sum", path="cold")
    warm_s = value(m, "sandvisor_task_start_seconds_sum", path="warm")
    assert 0 < warm_s < 5
    assert 0 < cold_s < 60
