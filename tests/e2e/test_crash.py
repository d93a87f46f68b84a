"""kill -9 of the daemon at five points of a task's life, ten times each: after a restart
every output file is exactly what the command printed, every task has exactly one terminal
event, monitor ordinals continue without gaps or repeats, and nothing is left behind."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from supervisor.core.faults import POINTS, REATTACH_PAUSED
from tests.conftest import require_engine
from tests.e2e.conftest import Daemon, start_daemon

pytestmark = pytest.mark.timeout(900)

LINES = 400
COMMAND = f"i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.002; done"
EXPECTED = "".join(f"line{i}\n" for i in range(1, LINES + 1)).encode()
CYCLES = 10


def wait_final(c: httpx.Client, sid: str, tid: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = c.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 10}).json()
        if not body["timed_out"]:
            return dict(body["task"])
    raise AssertionError(f"task {tid} did not end within {timeout} s")


def monitor_ordinals(events: list[dict[str, Any]]) -> list[int]:
    """Every line ordinal the monitor events account for, in event order."""
    ordinals: list[int] = []
    for e in events:
        if e["type"] == "task.output":
            ordinals += range(e["ordinal"] - e["lines"] + 1, e["ordinal"] + 1)
        elif e["type"] == "task.output_suppressed":
            ordinals += range(e["first_ordinal"], e["last_ordinal"] + 1)
    return ordinals


def one_cycle(base: Path, policies: Path, point: str, cycle: int, rng: random.Random) -> str:
    """Run one task through a crash at ``point`` and a restart; return a problem or ''."""
    state = base / f"{point}-{cycle}"
    crash = f"{point}:{rng.randint(200, len(EXPECTED) - 200)}" if point == "mid_stream" else point
    kind = "monitor" if cycle % 2 else "background"
    first = start_daemon(
        state, policies, stop_tasks_on_exit=False, env_extra={"SANDVISOR_TEST_CRASH_AT": crash}
    )
    tid = None
    with first.client() as c:
        c.post("/sessions", json={"session_id": "s"}).raise_for_status()
        try:
            r = c.post(
                "/sessions/s/tasks", json={"command": COMMAND, "policy": "fast", "kind": kind}
            )
            tid = r.json()["task_id"]
        except (httpx.TransportError, ValueError):
            pass  # the daemon died before its answer left: the task was still accepted
    rc = first.proc.wait(timeout=120)
    if rc != -9:
        return f"{point}#{cycle}: the daemon did not die at {crash} (exit {rc})"
    second: Daemon = start_daemon(state, policies, stop_tasks_on_exit=True)
    try:
        with second.client() as c:
            if tid is None:
                (only,) = c.get("/sessions/s/tasks").json()
                tid = only["task_id"]
            task = wait_final(c, "s", tid)
            if task["status"] != "completed" or task["exit_code"] != 0:
                return (
                    f"{point}#{cycle} ({kind}): ended {task['status']} {task['reason']} "
                    f"{task['exit_code']} {task['error']}"
                )
            data = Path(task["output_path"]).read_bytes()
            if data != EXPECTED:
                return (
                    f"{point}#{cycle} ({kind}): output differs: {len(data)} bytes, "
                    f"want {len(EXPECTED)}"
                )
            events = c.get("/sessions/s/events", params={"limit": 10000}).json()["events"]
            mine = [e for e in events if e.get("task_id") == tid]
            terminal = [e for e in mine if e["type"] in ("task.stopped", "task.failed")]
            started = [e for e in mine if e["type"] == "task.started"]
            if len(terminal) != 1 or len(started) != 1:
                return f"{point}#{cycle}: {len(terminal)} terminal, {len(started)} started events"
            seqs = [e["seq"] for e in events]
            if seqs != sorted(set(seqs)):
                return f"{point}#{cycle}: seqs not strictly increasing"
            if kind == "monitor":
                ordinals = monitor_ordinals(mine)
                if ordinals != list(range(1, LINES + 1)):
                    seen = set(ordinals)
                    missing = [o for o in range(1, LINES + 1) if o not in seen]
                    repeats = len(ordinals) - len(seen)
                    return (
                        f"{point}#{cycle}: monitor ordinals not 1..{LINES} exactly once "
                        f"(missing {missing[:10]}, {repeats} repeated)"
                    )
            c.delete("/sessions/s").raise_for_status()
    finally:
        rc = second.stop()
    if rc != 0:
        return f"{point}#{cycle}: restarted daemon exited {rc}"
    left = docker.APIClient(version="auto").containers(
        all=True, filters={"label": f"io.sandvisor.task={tid}"}
    )
    if left:
        return f"{point}#{cycle}: container of {tid} left behind"
    return ""


def test_kill_9_at_every_point_ten_times(policies_dir: Path, short_tmp: Path) -> None:
    require_engine()
    problems: list[str] = []
    done: dict[str, int] = {}

    def worker(point: str) -> None:
        rng = random.Random(point)
        for cycle in range(CYCLES):
            try:
                problem = one_cycle(short_tmp, policies_dir, point, cycle, rng)
            except Exception as exc:  # report, keep the other points going
                problem = f"{point}#{cycle}: {exc!r}"
            if problem:
                problems.append(problem)
            done[point] = done.get(point, 0) + 1

    threads = [threading.Thread(target=worker, args=(p,)) for p in POINTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done == dict.fromkeys(POINTS, CYCLES)
    assert not problems, "\n".join(problems)


def test_notification_drain_never_repeats_across_a_restart(
    tmp_path: Path, policies_dir: Path
) -> None:
    require_engine()
    state = tmp_path / "state"
    d = start_daemon(state, policies_dir, stop_tasks_on_exit=False)
    try:
        with d.client() as c:
            c.post("/sessions", json={"session_id": "s"}).raise_for_status()
            tid = c.post("/sessions/s/tasks", json={"command": "echo hi", "policy": "fast"}).json()[
                "task_id"
            ]
            wait_final(c, "s", tid)
            deadline = time.monotonic() + 10
            while True:
                first = c.get(
                    "/sessions/s/notifications/pending", params={"consumer": "agent"}
                ).json()
                if first["notifications"] or time.monotonic() > deadline:
                    break
            assert [n["task_id"] for n in first["notifications"]] == [tid]
            c.post(
                "/sessions/s/notifications/ack", json={"consumer": "agent", "seq": first["cursor"]}
            ).raise_for_status()
    finally:
        assert d.stop() == 0
    d = start_daemon(state, policies_dir, stop_tasks_on_exit=True)
    try:
        with d.client() as c:
            again = c.get("/sessions/s/notifications/pending", params={"consumer": "agent"}).json()
            assert again["notifications"] == []
            assert again["acked"] == first["cursor"]
            tid2 = c.post(
                "/sessions/s/tasks", json={"command": "echo two", "policy": "fast"}
            ).json()["task_id"]
            wait_final(c, "s", tid2)
            deadline = time.monotonic() + 10
            while True:
                later = c.get(
                    "/sessions/s/notifications/pending", params={"consumer": "agent"}
                ).json()
                if later["notifications"] or time.monotonic() > deadline:
                    break
            assert [n["task_id"] for n in later["notifications"]] == [tid2]
            c.delete("/sessions/s")
    finally:
        assert d.stop() == 0


def test_kill_9_while_a_reattach_holds_the_container_paused(
    tmp_path: Path, policies_dir: Path
) -> None:
    """A re-attach pauses the container while it reads the engine's log. A crash in that
    moment leaves it paused; the next start thaws it and loses nothing.

    The command prints its lines and then keeps running (it sleeps until stopped): the
    second daemon must find it running, or it never re-attaches and never reaches the
    crash point (on a loaded machine a command that just exits can end before that)."""
    require_engine()
    state = tmp_path / "state"
    first = start_daemon(
        state,
        policies_dir,
        stop_tasks_on_exit=False,
        env_extra={"SANDVISOR_TEST_CRASH_AT": "mid_stream:800"},
    )
    with first.client() as c:
        c.post("/sessions", json={"session_id": "s"}).raise_for_status()
        tid = c.post(
            "/sessions/s/tasks",
            json={"command": f"{COMMAND}; exec sleep 600", "policy": "fast", "kind": "monitor"},
        ).json()["task_id"]
    assert first.proc.wait(timeout=120) == -9
    # The second start re-adopts the task and dies while the container is paused.
    died_early = ""
    try:
        second = start_daemon(
            state,
            policies_dir,
            stop_tasks_on_exit=False,
            env_extra={"SANDVISOR_TEST_CRASH_AT": REATTACH_PAUSED},
        )
    except RuntimeError as exc:  # it died before it answered
        died_early = str(exc)
    if died_early:
        assert "exited with -9" in died_early, died_early
    else:
        assert second.proc.wait(timeout=120) == -9
    engine = docker.APIClient(version="auto")
    (container,) = engine.containers(all=True, filters={"label": f"io.sandvisor.task={tid}"})
    assert engine.inspect_container(container["Id"])["State"]["Status"] == "paused"
    third = start_daemon(state, policies_dir, stop_tasks_on_exit=True)
    try:
        with third.client() as c:
            found = c.post(
                f"/sessions/s/tasks/{tid}/wait-for",
                json={"pattern": f"^line{LINES}$", "timeout_s": 120},
            ).json()
            assert found["matched"], found
            c.post(f"/sessions/s/tasks/{tid}/stop").raise_for_status()
            task = wait_final(c, "s", tid)
            assert (task["status"], task["reason"]) == ("killed", "user_stopped"), task
            assert Path(task["output_path"]).read_bytes() == EXPECTED
            events = c.get("/sessions/s/events", params={"limit": 10000}).json()["events"]
            mine = [e for e in events if e.get("task_id") == tid]
            assert len([e for e in mine if e["type"] in ("task.stopped", "task.failed")]) == 1
            assert monitor_ordinals(mine) == list(range(1, LINES + 1))
            c.delete("/sessions/s").raise_for_status()
    finally:
        assert third.stop() == 0
    assert not engine.containers(all=True, filters={"label": f"io.sandvisor.task={tid}"})
