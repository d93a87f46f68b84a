"""Warm pool: single-use containers started ahead of demand, each waiting to read its one
command from stdin. A task that takes one skips create+start (the first output byte comes
about a millisecond after the command is written). Per session and policy; never shared."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import SupervisorError
from supervisor.core.logs import get_logger
from supervisor.core.models import TaskSpec
from supervisor.core.policy import Policy
from supervisor.core.resolve import MERGE_PREFIX, Effective, resolve
from supervisor.engine.base import Backend
from supervisor.runtime.task.ports import WarmStart

log = get_logger("supervisor.runtime.pool")

#: Containers idle this long are removed (the pool refills on the next use).
IDLE_S = 300.0
_REFILL_DELAY_S = 0.1


def pool_script(sentinel: str) -> str:
    """Shell builtins only (no fork): read lines until the sentinel, then become the task.

    ``read`` takes one byte at a time from a pipe, so everything after the sentinel line
    stays on stdin for the command itself."""
    return (
        'c=; while IFS= read -r l; do if [ "$l" = "' + sentinel + '" ]; then '
        'exec /bin/sh -c "' + MERGE_PREFIX + '$c"; fi; c="$c$l\n"; done; exit 125'
    )


def eligible(spec: TaskSpec, policy: Policy) -> bool:
    """A pooled container was made before the task was known: only tasks that need nothing
    it does not already have can use it (no extra env, no tighter limits)."""
    return policy.warm_pool > 0 and not spec.env and spec.limits is None


@dataclass
class PoolPorts:
    """What a pool needs from its session."""

    backend: Backend
    check_runtime: Callable[[str], Awaitable[None]]
    check_image: Callable[[Policy], Awaitable[None]]
    new_task_id: Callable[[], Awaitable[str]]
    """A task id no task and no pooled container has."""
    build_request: Callable[[str, str, Effective, str], ContainerRequest]
    """(task_id, command, settings, kind) -> the hardened container for it."""
    busy: Callable[[], int]
    """Running tasks of the session (the pool never outgrows the session's limit)."""
    prepare: Callable[[Policy], Awaitable[None]]
    """What a container of the session needs first (its network, its workspace volume)."""


class WarmPool:
    """Keeps ``policy.warm_pool`` containers ready for one session."""

    def __init__(self, ports: PoolPorts, policy: Policy, session_id: str) -> None:
        self.ports = ports
        self.policy = policy
        self._ready: list[WarmStart] = []
        self._making: set[str] = set()
        self._filling: asyncio.Task[None] | None = None
        self._closed = False
        self._last_use = 0.0
        self._idle: asyncio.Task[None] | None = None
        self.log = log.bind(session_id=session_id, policy=policy.name)

    @property
    def size(self) -> int:
        return len(self._ready)

    def holds(self, task_id: str) -> bool:
        """Whether a ready (or being made) container carries this task id."""
        return task_id in self._making or any(p.task_id == task_id for p in self._ready)

    def target(self) -> int:
        """How many to keep: the policy's size, within the session's running-task limit."""
        busy = self.ports.busy()
        return max(0, min(self.policy.warm_pool, self.policy.session.max_running_tasks - busy))

    def take(self) -> WarmStart | None:
        """A ready container, or None (the caller goes the cold way). Triggers a refill."""
        loop = asyncio.get_running_loop()
        self._last_use = loop.time()
        pooled = self._ready.pop(0) if self._ready else None
        if pooled is None:
            self.refill()
        else:
            # Refill a moment later: creating a container right now would compete with the
            # task's own first milliseconds on the engine.
            loop.call_later(_REFILL_DELAY_S, self.refill)
        return pooled

    def refill(self) -> None:
        if self._closed or (self._filling is not None and not self._filling.done()):
            return
        self._filling = asyncio.create_task(self._fill(), name="pool-fill")
        if self._idle is None or self._idle.done():
            self._idle = asyncio.create_task(self._shrink_when_idle(), name="pool-idle")

    async def _fill(self) -> None:
        while not self._closed and len(self._ready) < self.target():
            try:
                pooled = await self._make()
            except SupervisorError as exc:
                self.log.warning("pool_fill_failed", error=str(exc))
                return
            if self._closed:
                await self.discard(pooled)
                return
            self._ready.append(pooled)

    async def _make(self) -> WarmStart:
        task_id = await self.ports.new_task_id()
        self._making.add(task_id)
        try:
            return await self._make_as(task_id)
        finally:
            self._making.discard(task_id)

    async def _make_as(self, task_id: str) -> WarmStart:
        ports = self.ports
        sentinel = f"sbx-start-{secrets.token_hex(12)}"
        script = pool_script(sentinel)
        eff = resolve(
            TaskSpec(
                command=script,
                policy=self.policy.name,
                stdin="pipe",
                persistent=self.policy.timeouts.allow_persistent,
            ),
            self.policy,
        )
        request = ports.build_request(task_id, script, eff, "pooled")
        # The script runs as the container's command itself (not behind the merge prefix).
        request = request.model_copy(update={"command": ["/bin/sh", "-c", script]})
        await ports.check_runtime(self.policy.runtime)
        await ports.check_image(self.policy)
        await ports.prepare(self.policy)
        cid = await ports.backend.create(request)
        try:
            stream = await ports.backend.attach(cid, stdin=True, logs=False)
            await ports.backend.start(cid)
        except BaseException:
            with contextlib.suppress(SupervisorError):
                await ports.backend.remove(cid)
            raise
        return WarmStart(task_id, cid, stream, sentinel)

    async def wait_filled(self) -> None:
        """Wait for the current fill round to finish."""
        if self._filling is not None:
            with contextlib.suppress(SupervisorError):
                await asyncio.shield(self._filling)

    async def _shrink_when_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed and self._ready:
            await asyncio.sleep(max(1.0, self._last_use + IDLE_S - loop.time()))
            if loop.time() - self._last_use >= IDLE_S:
                self.log.info("pool_shrink", removed=len(self._ready))
                ready, self._ready = self._ready, []
                await asyncio.gather(*(self.discard(p) for p in ready))

    async def discard(self, pooled: WarmStart) -> None:
        """Remove a warm container that will not become a task."""
        await pooled.stream.aclose()
        try:
            await self.ports.backend.remove(pooled.container_id)
        except SupervisorError as exc:
            # Labelled as ours: the reconciler reaps it once the engine lets it.
            self.log.warning(
                "pool_discard_failed", container=pooled.container_id[:12], error=str(exc)
            )

    async def aclose(self) -> None:
        """Remove every idle container (never one that became a task)."""
        self._closed = True
        for task in (self._filling, self._idle):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, SupervisorError):
                    await task
        ready, self._ready = self._ready, []
        await asyncio.gather(*(self.discard(p) for p in ready))


class Pools:
    """One warm pool per policy, made on first use."""

    def __init__(self, ports: PoolPorts, session_id: str) -> None:
        self._ports = ports
        self._session_id = session_id
        self._pools: dict[str, WarmPool] = {}

    def get(self, policy: Policy) -> WarmPool:
        pool = self._pools.get(policy.name)
        if pool is None:
            pool = self._pools[policy.name] = WarmPool(self._ports, policy, self._session_id)
        return pool

    def take(self, spec: TaskSpec, policy: Policy) -> WarmStart | None:
        """A warm container for this task, or None (it starts cold)."""
        return self.get(policy).take() if eligible(spec, policy) else None

    def holds(self, task_id: str) -> bool:
        return any(p.holds(task_id) for p in self._pools.values())

    async def aclose(self) -> None:
        await asyncio.gather(*(p.aclose() for p in self._pools.values()))
