"""Re-open, after a restart, the sessions the last supervisor on a state dir left open."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from supervisor.core.logs import get_logger
from supervisor.core.task_state import TaskRecord
from supervisor.runtime.session import Session
from supervisor.state.store import StateStore

log = get_logger("supervisor")


async def restore_sessions(
    store: StateStore, open_session: Callable[[str], Awaitable[Session]]
) -> None:
    """Re-open every session not ended and re-adopt its tasks from their records (a task
    not finished resumes: its container is found by its labels)."""
    for sid, _created, ended, data in await store.all_sessions():
        if ended is not None:
            continue
        session = await open_session(sid)
        try:
            digests = json.loads(data or "{}").get("token_sha256", [])
        except ValueError:
            digests = []
        session.token_digests = list(digests)
        restored = 0
        for task_id, _, stage, raw in await store.tasks(sid):
            try:
                record = TaskRecord.model_validate_json(raw)
            except ValueError as exc:
                log.warning("task_record_unreadable", task_id=task_id, error=str(exc))
                continue
            session.restore_task(record)
            restored += stage != "ended"
        log.info("session_restored", session_id=sid, resumed_tasks=restored)
