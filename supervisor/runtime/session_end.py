"""Stopping a session's tasks together: for its end, and before its workspace changes are
applied or discarded (no container may hold the overlay then). And recording the end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from structlog.stdlib import BoundLogger

from supervisor.core.errors import SupervisorError
from supervisor.core.lifecycle import StopRequest
from supervisor.runtime.task.runner import TaskRunner
from supervisor.state.store import StateStore

#: Attempts at storing that a session ended before giving up (and saying so loudly).
_END_WRITE_ATTEMPTS = 5


async def stop_all(
    runners: Sequence[TaskRunner], reason: StopRequest, *, timeout_s: float
) -> tuple[int, list[TaskRunner]]:
    """Stop every running task and wait until every container is gone (ended tasks' too:
    theirs may still be on their way out), up to each one's grace plus ``timeout_s``.
    Returns how many were running, and the tasks still not done."""
    running = [r for r in runners if not r.ended]
    for runner in running:
        runner.request_stop(reason)
    leaving = [r for r in runners if not r.done.is_set()]
    if leaving:
        grace = max(r.eff.grace_s for r in leaving)
        waits = [asyncio.ensure_future(r.done.wait()) for r in leaving]
        _, late = await asyncio.wait(waits, timeout=grace + timeout_s)
        for w in late:
            w.cancel()
    return len(running), [r for r in runners if not r.done.is_set()]


async def store_end(
    store: StateStore, session_id: str, created_at: float, log: BoundLogger
) -> None:
    """Store that the session ended; a restart must not re-open it. Retried, and
    reported loudly if the store never takes it."""
    delay = 0.2
    for attempt in range(_END_WRITE_ATTEMPTS):
        try:
            await store.put_session(session_id, created_at, time.time())
            return
        except SupervisorError as exc:
            log.warning("session_end_write_failed", attempt=attempt, error=str(exc))
            await asyncio.sleep(delay)
            delay *= 2
    log.error(
        "session_end_not_stored",
        why="the state store refused every write; a restart re-opens this session "
        "(with no tasks running) until it is ended again",
    )
