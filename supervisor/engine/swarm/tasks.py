"""One ``GET /tasks`` for every task waiting to start: a hundred starts at once poll the
manager with one request per round, not a hundred."""

from __future__ import annotations

import asyncio
from typing import Any

from supervisor.core.errors import SupervisorError
from supervisor.engine.swarm.manager import ManagerAPI, NotFoundError
from supervisor.engine.swarm.spec import TaskStatus, pick_task

#: How long a round gathers askers before its request (they share it).
WINDOW_S = 0.02
#: Services per request (the filter goes in the URL).
CHUNK = 40


class TaskPoller:
    """Coalesces task lookups of many services into one request per round."""

    def __init__(self, manager: ManagerAPI) -> None:
        self.manager = manager
        self._pending: dict[str, list[asyncio.Future[TaskStatus | None]]] = {}
        self._runner: asyncio.Task[None] | None = None

    async def status(self, service_id: str) -> TaskStatus | None:
        """The service's task now (None: gone, or no task yet)."""
        future: asyncio.Future[TaskStatus | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(service_id, []).append(future)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="swarm-task-poll")
        return await future

    async def _run(self) -> None:
        while self._pending:
            await asyncio.sleep(WINDOW_S)
            batch, self._pending = self._pending, {}
            try:
                found = await self._fetch(list(batch))
            except SupervisorError as exc:
                for futures in batch.values():
                    for f in futures:
                        if not f.done():
                            f.set_exception(exc)
                continue
            for service_id, futures in batch.items():
                status = pick_task(found.get(service_id, []))
                for f in futures:
                    if not f.done():
                        f.set_result(status)

    async def _fetch(self, service_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        by_service: dict[str, list[dict[str, Any]]] = {}
        for i in range(0, len(service_ids), CHUNK):
            chunk = service_ids[i : i + CHUNK]
            try:
                rows = await self.manager.tasks(chunk)
            except NotFoundError:
                # One of them is gone: ask one by one (the rest still answer).
                rows = []
                for service_id in chunk:
                    try:
                        rows += await self.manager.tasks([service_id])
                    except NotFoundError:
                        continue
            for row in rows:
                by_service.setdefault(str(row.get("ServiceID", "")), []).append(row)
        return by_service
