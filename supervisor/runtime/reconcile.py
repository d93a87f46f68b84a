"""Keeping the engine and the store in step. The engine's event stream drops events, so
the reconciler lists our labelled containers now and then: a container no task owns is
reaped (a crash between create and record), other owners' orphans are reaped once their
owner is gone for good, workspaces past retention are removed. Labelled networks go the
same way: ours once their session is not open here (it ended while the engine was wedged,
or before a crash), other owners' once the owner is gone for good. Unlabelled containers
and networks are never touched."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path

from supervisor.core.errors import EngineUnavailable, SupervisorError
from supervisor.core.labels import LABEL_OWNER, LABEL_SESSION, LABEL_TASK
from supervisor.core.logs import get_logger
from supervisor.engine.base import Backend
from supervisor.engine.probe import PROBE_LABEL
from supervisor.runtime.ownership import heartbeat, owner_alive

log = get_logger("supervisor.reconcile")

#: Every this many rounds, other owners' orphans and old workspaces are looked at too.
_SWEEP_EVERY = 6


class Reconciler:
    """One supervisor's reconciliation."""

    def __init__(
        self,
        *,
        backend: Backend,
        io: Executor,
        instance_id: str,
        state_dir: Path,
        grace_s: float,
        owns: Callable[[str], bool],
        session_live: Callable[[str], bool],
        engine_ok: Callable[[], bool],
        reap_more: Callable[[], Awaitable[int]],
        sweep_orphans: bool = True,
    ) -> None:
        self.backend = backend
        self.io = io
        self.instance_id = instance_id
        self.state_dir = state_dir
        self.grace_s = grace_s
        self._owns = owns
        self._session_live = session_live
        #: Networks whose removal was refused (in use, engine not answering), by name, with
        #: their owner: retried every round, said once at info.
        self._networks_later: dict[str, str | None] = {}
        self._engine_ok = engine_ok
        self._reap_more = reap_more
        self.sweep_orphans = sweep_orphans

    async def sweep(self) -> int:
        """Stop and remove containers whose owning supervisor is gone. Never touches
        unlabeled containers or those of a live owner. Returns how many were removed."""
        removed = 0
        loop = asyncio.get_running_loop()
        try:
            rows = await self.backend.list_labeled(LABEL_OWNER)
        except EngineUnavailable:
            return 0
        for row in rows:
            if PROBE_LABEL in row.labels:
                continue
            owner = row.labels.get(LABEL_OWNER)
            if owner == self.instance_id:
                removed += await self.adopt_or_reap(row.id, row.labels)
                continue
            alive = await loop.run_in_executor(self.io, owner_alive, row.labels, self.grace_s)
            if alive is False:
                log.info("reaping_orphan", container=row.id[:12], owner=owner)
                removed += await self._remove(row.id)
        return removed

    async def adopt_or_reap(self, container_id: str, labels: dict[str, str]) -> bool:
        """A container of our own instance: kept when a task (restored from the store) owns
        it, reaped when no record knows it (e.g. a crash between create and record)."""
        task_id = labels.get(LABEL_TASK, "")
        if self._owns(task_id):
            return False
        log.info("reaping_unrecorded", container=container_id[:12], task_id=task_id)
        return await self._remove(container_id)

    async def _remove(self, container_id: str) -> bool:
        try:
            await self.backend.remove(container_id)
        except SupervisorError as exc:
            # The next round tries again.
            log.warning("reap_failed", container=container_id[:12], error=str(exc))
            return False
        return True

    async def find_container(self, task_id: str) -> str | None:
        """Our container for ``task_id``, found by its labels (any state)."""
        rows = await self.backend.list_labeled(f"{LABEL_TASK}={task_id}")
        for row in rows:
            if row.labels.get(LABEL_OWNER) == self.instance_id:
                return row.id
        return None

    async def reap_unowned(self) -> int:
        """Reap our own instance's containers that no task owns (a crash left them: a warm
        container never bound, a container created but not recorded). Returns how many."""
        try:
            rows = await self.backend.list_labeled(f"{LABEL_OWNER}={self.instance_id}")
        except SupervisorError as exc:
            log.info("reconcile_list_failed", error=str(exc))
            return 0
        reaped = 0
        for row in rows:
            reaped += await self.adopt_or_reap(row.id, row.labels)
        return reaped

    async def reap_networks(self, *, others: bool = True) -> int:
        """Remove our labelled networks whose session is not open here (its end could not
        remove them: the engine was wedged or down, a task was still attached, or we
        crashed), and with ``others`` those of owners gone for good. A network still in
        use, or an engine that does not answer, waits for the next round. Returns how many
        went."""
        label = LABEL_OWNER if others else f"{LABEL_OWNER}={self.instance_id}"
        try:
            rows = await self.backend.list_networks(label)
        except SupervisorError as exc:
            log.info("reconcile_list_networks_failed", error=str(exc))
            return 0
        listed = {r.name for r in rows}
        self._networks_later = {
            name: owner
            for name, owner in self._networks_later.items()
            if name in listed or (not others and owner != self.instance_id)
        }
        loop = asyncio.get_running_loop()
        removed = 0
        for row in rows:
            owner = row.labels.get(LABEL_OWNER)
            if owner == self.instance_id:
                session_id = row.labels.get(LABEL_SESSION)
                if session_id is None or self._session_live(session_id):
                    continue  # a session's: only sessions have networks of their own
                why = "session_not_open"
            else:
                alive = await loop.run_in_executor(self.io, owner_alive, row.labels, self.grace_s)
                if alive is not False:
                    continue
                why = "owner_gone"
            removed += await self._remove_network(row.name, why, owner)
        return removed

    async def _remove_network(self, name: str, why: str, owner: str | None) -> bool:
        try:
            await self.backend.remove_network(name)
        except SupervisorError as exc:
            # In use (a container still attached: it is being reaped) or the engine does
            # not answer: the next round tries again.
            first = name not in self._networks_later
            self._networks_later[name] = owner
            (log.info if first else log.debug)(
                "network_reap_later", network=name, why=why, error=str(exc)
            )
            return False
        self._networks_later.pop(name, None)
        log.info("reaped_network", network=name, why=why, owner=owner)
        return True

    async def first_round(self) -> None:
        """At start, with the sessions restored: what the last run left (warm containers
        never bound, unrecorded creates, networks of sessions that ended without removing
        theirs) goes now, not a round later: a restart may be followed by a quick stop.
        With ``sweep_orphans``, owners gone for good lose their containers and networks."""
        await self.reap_unowned()
        if self.sweep_orphans:
            await self.sweep()
        await self.reap_networks(others=self.sweep_orphans)

    async def run(self, every_s: float = 10.0) -> None:
        """The loop: heartbeat, reap our unowned containers and networks; now and then a
        full sweep (other owners' containers and networks, workspaces)."""
        ticks = 0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            ticks += 1
            await loop.run_in_executor(self.io, heartbeat, self.state_dir)
            if not self._engine_ok():
                continue
            await self.reap_unowned()
            full = self.sweep_orphans and ticks % _SWEEP_EVERY == 0
            if full:
                await self.sweep()
            # After the containers: a network goes once nothing is attached to it.
            await self.reap_networks(others=full)
            if full:
                await self._reap_more()
