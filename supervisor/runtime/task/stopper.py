"""Ending a container: SIGTERM, a grace period, SIGKILL until it exits; then removal, retried,
and (while the engine is away) kept trying in the background."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from structlog.stdlib import BoundLogger

from supervisor.core.errors import SupervisorError
from supervisor.engine.base import Backend

#: Removal attempts in a row; then it is kept trying in the background (reap_later).
REMOVE_ATTEMPTS = 5


class Stopper:
    """Signals and removes one task's container. ``exited`` is set once the container has
    stopped; ``thawed`` is cleared while a re-attach holds it paused."""

    def __init__(
        self,
        backend: Backend,
        container_id: Callable[[], str | None],
        *,
        grace_s: float,
        exited: asyncio.Event,
        thawed: asyncio.Event,
        log: BoundLogger,
    ) -> None:
        self.backend = backend
        self._cid = container_id
        self.grace_s = grace_s
        self.exited = exited
        self.thawed = thawed
        self.log = log
        self._kill: asyncio.Task[None] | None = None
        self._reap: asyncio.Task[None] | None = None

    def begin(self, *, at_once: bool = False) -> None:
        """Start the kill sequence (once): SIGTERM and the grace period, or with
        ``at_once`` straight to SIGKILL (a task that must not write one more byte)."""
        if self._kill is None:
            self._kill = asyncio.create_task(self._sequence(at_once), name="kill")

    async def _sequence(self, at_once: bool) -> None:
        cid = self._cid()
        if cid is None:
            return
        await self.thawed.wait()  # a paused container cannot take signals on every runtime
        if not at_once:
            try:
                await self.backend.kill(cid, "SIGTERM")
            except SupervisorError as exc:
                self.log.info("sigterm_failed", error=str(exc))
            try:
                await asyncio.wait_for(self.exited.wait(), self.grace_s)
                return
            except TimeoutError:
                pass
        while not self.exited.is_set():
            await self.thawed.wait()
            try:
                await self.backend.kill(cid, "SIGKILL")
            except SupervisorError as exc:
                self.log.warning("sigkill_failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), 1.0)

    async def remove(self) -> None:
        """Force-remove the container, retrying a few times; then keep trying in the
        background until the engine answers (the session's task owns the container, so
        the reconciler leaves it alone while the session is open)."""
        cid = self._cid()
        if cid is None:
            return
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                await self.backend.remove(cid)
                return
            except SupervisorError as exc:
                self.log.warning("remove_failed", attempt=attempt, error=str(exc))
            if attempt + 1 < REMOVE_ATTEMPTS:
                await asyncio.sleep(0.5 * (attempt + 1))
        self.log.warning("remove_later", container=cid[:12], attempts=REMOVE_ATTEMPTS)
        self.reap_later()

    def reap_later(self) -> None:
        """The engine does not answer: kill and remove once it is back (in the background)."""
        if self._cid() is not None and self._reap is None:
            self._reap = asyncio.create_task(self._reap_when_back(), name="reap")

    async def _reap_when_back(self) -> None:
        cid = self._cid()
        assert cid is not None
        delay = 1.0
        while True:
            try:
                await self.backend.kill(cid, "SIGKILL")
                await self.backend.remove(cid)
                self.log.info("abandoned_container_removed")
                return
            except SupervisorError as exc:
                self.log.debug("reap_retry", error=str(exc), delay_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    @property
    def busy(self) -> bool:
        """Whether a kill sequence or a removal kept trying in the background still runs."""
        return any(t is not None and not t.done() for t in (self._kill, self._reap))

    def cancel(self) -> None:
        """Drop the background work (the supervisor shuts down; the container is kept)."""
        for task in (self._kill, self._reap):
            if task is not None and not task.done():
                task.cancel()
