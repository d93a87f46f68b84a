"""kill -9 of the daemon at each step of taking a warm container and binding it to a task:
nothing leaks, nothing is handed to the wrong session, no accepted task is lost.

The steps (``supervisor.core.faults``): ``pool_made`` (a warm container is ready, bound to
no one), ``pool_taken`` (a start took it, nothing is recorded yet), ``pool_bound`` (the
task's first record names it, before the start answers), ``pool_created`` (the task runs,
the command is not written yet). After the restart every accepted task ends completed with its exact output
and one terminal event; a new session's task never runs in a container the dead daemon
made; and once the sessions end no container of either daemon remains.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.core.labels import LABEL_PREFIX
from supervisor.runtime.ownership import LOCK_NAME
from tests.conftest import labelled_containers, require_engine
from tests.e2e.conftest import start_daemon
from tests.e2e.test_crash import COMMAND, EXPECTED, wait_final

pytestmark = pytest.mark.timeout(600)

STEPS = ("pool_made", "pool_taken", "pool_bound", "pool_created")
CYCLES = 3
#: Tasks a cycle starts, one after another, until the daemon dies at its step.
MAX_TASKS = 6


def containers_of(state: Path) -> dict[str, dict[str, str]]:
    """Every container a daemon on this state dir made (any run), id -> labels."""
    rows = labelled_containers(LABEL_PREFIX + "owner.lock", str(state.resolve() / LOCK_NAME))
    return {r["Id"]: r["Labels"] for r in rows}


def one_task_problem(c: httpx.Client, sid: str, tid: str, where: str) -> str:
    task = wait_final(c, sid, tid)
    if task["status"] != "completed" or task["exit_code"] != 0:
        return f"{where}: {tid} ended {task['status']} {task['reason']} {task['error']}"
    data = Path(task["output_path"]).read_bytes()
    if data != EXPECTED:
        return f"{where}: {tid} output has {len(data)} bytes, want {len(EXPECTED)}"
    events = c.get(f"/sessions/{sid}/events", params={"limit": 10000}).json()["events"]
    mine = [e for e in events if e.get("task_id") == tid]
    terminal = [e for e in mine if e["type"] in ("task.stopped", "task.failed")]
    if len(terminal) != 1:
        return f"{where}: {tid} has {len(terminal)} terminal events"
    return ""


def run_until_death(state: Path, policies: Path, step: str) -> tuple[list[str], int | None]:
    """Start tasks on the ``warm`` policy until the daemon dies at ``step``; returns the
    ids of the tasks it accepted and its exit code (None: it did not die)."""
    try:
        first = start_daemon(
            state, policies, stop_tasks_on_exit=False, env_extra={"SANDVISOR_TEST_CRASH_AT": step}
        )
    except RuntimeError:
        return [], -9  # died while it started (a warm container made at once)
    accepted: list[str] = []
    try:
        with first.client() as c:
            c.post("/sessions", json={"session_id": "a"}).raise_for_status()
            for _ in range(MAX_TASKS):
                r = c.post("/sessions/a/tasks", json={"command": COMMAND, "policy": "warm"})
                tid = r.json()["task_id"]
                accepted.append(tid)
                wait_final(c, "a", tid, timeout=60)
    except (httpx.TransportError, ValueError, KeyError):
        pass  # the daemon died: before its answer, or while the task ran
    try:
        rc = first.proc.wait(timeout=60)
    except Exception:
        first.stop()
        return accepted, None
    return accepted, rc


def one_cycle(base: Path, policies: Path, step: str, cycle: int) -> str:
    state = base / f"{step}-{cycle}"
    accepted, rc = run_until_death(state, policies, step)
    where = f"{step}#{cycle}"
    if rc != -9:
        return f"{where}: the daemon did not die at {step} (exit {rc})"
    before = containers_of(state)
    second = start_daemon(state, policies, stop_tasks_on_exit=True)
    problems: list[str] = []
    try:
        with second.client() as c:
            r = c.get("/sessions/a/tasks")
            # 404: the daemon died before it opened the session (a warm container made first).
            listed = {t["task_id"] for t in r.json()} if r.status_code == 200 else set()
            if not set(accepted) <= listed:
                problems.append(f"{where}: accepted {sorted(set(accepted) - listed)} are gone")
            for tid in sorted(listed):
                problems.append(one_task_problem(c, "a", tid, where))
            # A new session's task: never in a container the dead daemon made.
            c.post("/sessions", json={"session_id": "b"}).raise_for_status()
            for _ in range(2):  # the second one is warm, from the new daemon's pool
                r = c.post("/sessions/b/tasks", json={"command": COMMAND, "policy": "warm"})
                tid = r.json()["task_id"]
                problems.append(one_task_problem(c, "b", tid, where))
                cid = c.get(f"/sessions/b/tasks/{tid}").json()["container_id"]
                if cid in before:
                    problems.append(f"{where}: session b got the dead daemon's {cid[:12]}")
            if r.status_code == 200:
                c.delete("/sessions/a").raise_for_status()
            c.delete("/sessions/b").raise_for_status()
    finally:
        rc = second.stop()
    if rc != 0:
        problems.append(f"{where}: the restarted daemon exited {rc}")
    left = containers_of(state)
    if left:
        kinds = sorted(labels.get("io.sandvisor.kind", "?") for labels in left.values())
        problems.append(f"{where}: {len(left)} container(s) left behind: {kinds}")
    return "; ".join(p for p in problems if p)


def test_kill_9_at_each_step_of_take_and_bind(short_tmp: Path, policies_dir: Path) -> None:
    require_engine()
    problems: list[str] = []
    done: dict[str, int] = {}

    def worker(step: str) -> None:
        for cycle in range(CYCLES):
            try:
                problem = one_cycle(short_tmp, policies_dir, step, cycle)
            except Exception as exc:  # report, keep the other steps going
                problem = f"{step}#{cycle}: {exc!r}"
            if problem:
                problems.append(problem)
            done[step] = done.get(step, 0) + 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in STEPS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done == dict.fromkeys(STEPS, CYCLES)
    assert not problems, "\n".join(problems)


def test_a_hundred_starts_at_once_all_succeed(tmp_path: Path, policies_dir: Path) -> None:
    """Starts arriving faster than the pool refills degrade to cold starts, never to
    errors: 100 at once over HTTP, ten sessions of ten, on the shipped default policy."""
    require_engine()
    d = start_daemon(tmp_path / "state", policies_dir)
    results: dict[str, Any] = {}
    try:
        with d.client() as c:
            sessions = [f"burst{i}" for i in range(10)]
            for sid in sessions:
                c.post("/sessions", json={"session_id": sid}).raise_for_status()

            def start(sid: str, n: int) -> None:
                with d.client() as cc:
                    r = cc.post(f"/sessions/{sid}/tasks", json={"command": f"echo task{n}"})
                    results[f"{sid}/{n}"] = (r.status_code, r.json())

            threads = [
                threading.Thread(target=start, args=(sid, i * 10 + j))
                for i, sid in enumerate(sessions)
                for j in range(10)
            ]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            accepted = time.monotonic() - t0
            refused = {k: v for k, v in results.items() if v[0] != 201}
            assert not refused, refused
            outputs = {}
            for key, (_, body) in results.items():
                sid = key.split("/")[0]
                task = wait_final(c, sid, body["task_id"])
                assert task["status"] == "completed", task
                outputs[key] = Path(task["output_path"]).read_text()
            assert outputs == {k: f"task{k.split('/')[1]}\n" for k in results}
            print(f"100 starts accepted in {accepted:.2f} s")
            for sid in sessions:
                c.delete(f"/sessions/{sid}").raise_for_status()
    finally:
        assert d.stop() == 0
