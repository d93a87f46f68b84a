"""Warm pools: single-use containers started ahead of demand, each waiting to read its one
command (and the task's environment) from stdin. A task that takes one skips create and
start: its first output byte comes about a millisecond after the command is written.

Pools are kept per (policy, scope): the shared scope when the container names no session
(no workspace, no session network), so every session draws from it; else the session's own
scope, made on its first start and closed with the session. A pool keeps ``warm_pool``
containers ready; it grows with the recent start rate up to ``warm_pool_max`` and
gives back what sits idle for ``warm_pool_idle_s``. A container taken from a pool is bound
to its session and task by the task's record in the store; until then it belongs to no
session, and the reconciler reaps it after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import SupervisorError
from supervisor.core.faults import crash_point
from supervisor.core.logs import get_logger
from supervisor.core.models import MAX_COMMAND_BYTES, POOL_NO_COMMAND, TaskSpec
from supervisor.core.policy import Policy
from supervisor.core.resolve import (
    MERGE_PREFIX,
    Effective,
    container_request,
    resolve,
    workspace_mount,
)
from supervisor.engine.base import Backend
from supervisor.runtime.aio import Background
from supervisor.runtime.task.launch import pooled_command
from supervisor.runtime.task.ports import WarmStart

log = get_logger("supervisor.runtime.pool")

#: The scope of pools that every session shares.
SHARED = ""
#: Starts counted over this window set a pool's size (rate x refill horizon).
_RATE_WINDOW_S = 30.0
_REFILL_HORIZON_S = 4.0
_REFILL_DELAY_S = 0.1
#: How often a pool looks after its ready containers (no engine call unless one needs it):
#: one whose connection ended is replaced, and a fill or removal the engine refused is
#: tried again; less often (up to _CHECK_MAX_S) while fills keep failing.
CHECK_S = 1.0
_CHECK_MAX_S = 8.0


def pool_script(sentinel: str) -> str:
    """Shell builtins only (no fork): read lines until the sentinel, then become the task.

    ``read`` takes one byte at a time from a pipe, so everything after the sentinel line
    stays on stdin for the command itself."""
    return (
        'c=; while IFS= read -r l; do if [ "$l" = "' + sentinel + '" ]; then '
        'exec /bin/sh -c "' + MERGE_PREFIX + '$c"; fi; c="$c$l\n"; done; '
        f"exit {POOL_NO_COMMAND}"
    )


def eligible(spec: TaskSpec, policy: Policy) -> bool:
    """A warm container was made before the task was known: a task may take one when it
    needs nothing decided at create time (``limits``) and its command still fits."""
    if policy.warm_pool_max <= 0 or spec.limits is not None:
        return False
    size = len(pooled_command(spec.command, spec.env).encode("utf-8", "surrogatepass"))
    return size <= MAX_COMMAND_BYTES


@dataclass
class PoolPorts:
    """What a pool needs: the engine, the checks before a create, task ids, requests."""

    backend: Backend
    check_runtime: Callable[[str], Awaitable[None]]
    check_image: Callable[[Policy], Awaitable[None]]
    prepare: Callable[[Policy], Awaitable[None]]
    """What a container of the scope needs first (a session's network, its workspace)."""
    new_task_id: Callable[[], Awaitable[str]]
    """A task id no task and no pooled container has."""
    build_request: Callable[[str, str, Effective, str], ContainerRequest]
    """(task_id, command, settings, kind) -> the hardened container for it."""


def shared_pool_ports(
    *,
    backend: Backend,
    check_runtime: Callable[[str], Awaitable[None]],
    check_image: Callable[[Policy], Awaitable[None]],
    new_task_id: Callable[[], Awaitable[str]],
    labels: Callable[..., dict[str, str]],
    workspace_roots: Sequence[Path],
    state_dir: Path,
) -> PoolPorts:
    """The ports of a pool every session shares: its containers name no session (labels
    with an empty session), join no network and mount only a policy's fixed workspace."""

    async def nothing_to_prepare(policy: Policy) -> None:
        return None

    def build(task_id: str, command: str, eff: Effective, kind: str) -> ContainerRequest:
        return container_request(
            name=f"sandvisor-{task_id}",
            command=command,
            eff=eff,
            labels=labels(session_id="", task_id=task_id, kind=kind, policy=eff.policy.name),
            network="none",
            workspace=workspace_mount(eff.policy, workspace_roots, state_dir),
        )

    return PoolPorts(
        backend=backend,
        check_runtime=check_runtime,
        check_image=check_image,
        prepare=nothing_to_prepare,
        new_task_id=new_task_id,
        build_request=build,
    )


class WarmPool:
    """Ready containers of one policy in one scope; the size follows the start rate."""

    def __init__(self, ports: PoolPorts, policy: Policy, scope: str) -> None:
        self.ports = ports
        self.policy = policy
        self.scope = scope
        #: Kept even when idle (a session's own pool is made on the session's first start).
        self.floor = policy.warm_pool
        self._ready: list[tuple[float, WarmStart]] = []
        self._making: set[str] = set()
        self._takes: deque[float] = deque()
        self._prefill = 0
        self._filling: asyncio.Task[None] | None = None
        self._idle: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        #: Fills in a row that the engine refused (the keeper backs off meanwhile).
        self._fill_failures = 0
        #: Containers of this pool whose removal the engine refused: tried again.
        self._leftover: set[str] = set()
        self._dropping = Background()
        self._closed = False
        self.log = log.bind(policy=policy.name, scope=scope or "shared")

    @property
    def size(self) -> int:
        return len(self._ready)

    def holds(self, task_id: str) -> bool:
        """Whether a ready (or being made) container carries this task id."""
        return task_id in self._making or any(w.task_id == task_id for _, w in self._ready)

    def target(self, now: float) -> int:
        """How many to keep ready: the recent start rate times the refill horizon, within
        the floor and the policy's ``warm_pool_max``."""
        while self._takes and now - self._takes[0] > _RATE_WINDOW_S:
            self._takes.popleft()
        rate = len(self._takes) / _RATE_WINDOW_S
        wanted = round(rate * _REFILL_HORIZON_S)
        return min(self.policy.warm_pool_max, max(self.floor, wanted, self._prefill))

    def prefill(self, count: int) -> None:
        """Keep at least ``count`` ready from now on (``Session.prewarm``), and fill now."""
        self._prefill = max(self._prefill, count)
        self.refill()

    def take(self) -> WarmStart | None:
        """A ready container whose connection is still up, or None (the caller starts
        cold). Triggers a refill. Ready containers whose connection ended (they exited, the
        engine went away) are removed on the way."""
        loop = asyncio.get_running_loop()
        self._takes.append(loop.time())
        self._drop_dead()
        taken = self._ready.pop(0)[1] if self._ready else None
        if taken is None:
            self.refill()
        else:
            crash_point("pool_taken")
            # Refill a moment later: creating a container right now would compete with the
            # task's own first milliseconds on the engine.
            loop.call_later(_REFILL_DELAY_S, self.refill)
        return taken

    def _drop_dead(self) -> None:
        """Remove the ready containers whose connection ended: when the engine goes away,
        their stdin closes with it and they exit without a command."""
        live = []
        for entry in self._ready:
            if entry[1].stream.is_open():
                live.append(entry)
            else:
                self.log.info("pool_drop_dead", container=entry[1].container_id[:12])
                self._dropping.start(self.discard(entry[1]), name="pool-drop")
        self._ready = live

    def refill(self) -> None:
        if self._closed:
            return
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._keep(), name="pool-keep")
        if self._filling is not None and not self._filling.done():
            return
        self._filling = asyncio.create_task(self._fill(), name="pool-fill")
        if self._idle is None or self._idle.done():
            self._idle = asyncio.create_task(self._retire_idle(), name="pool-idle")

    async def _fill(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed and len(self._ready) + len(self._making) < self.target(loop.time()):
            try:
                made = await self._make()
            except SupervisorError as exc:
                # The keeper tries again (the engine may be away for a moment).
                self._fill_failures += 1
                (self.log.warning if self._fill_failures == 1 else self.log.debug)(
                    "pool_fill_failed", error=str(exc), failures=self._fill_failures
                )
                return
            self._fill_failures = 0
            if self._closed:
                await self.discard(made)
                return
            self._ready.append((loop.time(), made))
            crash_point("pool_made")

    async def _make(self) -> WarmStart:
        task_id = await self.ports.new_task_id()
        self._making.add(task_id)
        try:
            return await self._make_as(task_id)
        finally:
            self._making.discard(task_id)

    async def _make_as(self, task_id: str) -> WarmStart:
        ports = self.ports
        sentinel = f"sandvisor-start-{secrets.token_hex(12)}"
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

    async def _keep(self) -> None:
        """Every CHECK_S (backing off while fills fail): replace ready containers whose
        connection ended, fill up to the target, remove what the engine refused to."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            await asyncio.sleep(min(CHECK_S * 2 ** min(self._fill_failures, 5), _CHECK_MAX_S))
            self._drop_dead()
            for container_id in list(self._leftover):
                with contextlib.suppress(SupervisorError):
                    await self.ports.backend.remove(container_id)
                    self._leftover.discard(container_id)
                    self.log.info("pool_leftover_removed", container=container_id[:12])
            if len(self._ready) + len(self._making) < self.target(loop.time()):
                self.refill()

    async def wait_filled(self) -> None:
        """Wait for the current fill round to finish."""
        if self._filling is not None:
            with contextlib.suppress(SupervisorError):
                await asyncio.shield(self._filling)

    async def _retire_idle(self) -> None:
        """Give back containers that sat ready for ``warm_pool_idle_s``, down to the floor."""
        loop = asyncio.get_running_loop()
        idle_s = self.policy.warm_pool_idle_s
        while not self._closed and len(self._ready) > self.floor:
            oldest = self._ready[0][0]
            await asyncio.sleep(max(1.0, oldest + idle_s - loop.time()))
            now = loop.time()
            old = [r for r in self._ready if now - r[0] >= idle_s]
            retire = old[: max(0, len(self._ready) - self.floor)]
            if retire:
                self.log.info("pool_retire_idle", removed=len(retire))
                self._ready = [r for r in self._ready if r not in retire]
                await asyncio.gather(*(self.discard(w) for _, w in retire))

    async def discard(self, pooled: WarmStart) -> None:
        """Remove a warm container that will not become a task."""
        await pooled.stream.aclose()
        try:
            await self.ports.backend.remove(pooled.container_id)
        except SupervisorError as exc:
            # Tried again by the keeper (and, labelled as ours and owned by no session,
            # reaped by the reconciler after a restart).
            self._leftover.add(pooled.container_id)
            self.log.warning(
                "pool_discard_failed", container=pooled.container_id[:12], error=str(exc)
            )

    async def aclose(self) -> None:
        """Remove every ready container (never one that became a task)."""
        self._closed = True
        for task in (self._idle, self._keeper):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, SupervisorError):
                    await task
        # A fill is not cancelled: the engine may already be creating its container (in a
        # thread a cancel does not stop), which would then belong to no one. Once closed,
        # the fill removes what it makes and stops.
        if self._filling is not None:
            with contextlib.suppress(asyncio.CancelledError, SupervisorError):
                await asyncio.shield(self._filling)
        ready, self._ready = self._ready, []
        await asyncio.gather(*(self.discard(w) for _, w in ready), self._dropping.wait())


class Pools:
    """Every warm pool of a supervisor, by (policy, scope), made on first use."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, str], WarmPool] = {}

    def get(self, policy: Policy, scope: str, ports: Callable[[], PoolPorts]) -> WarmPool:
        key = (policy.name, scope)
        pool = self._pools.get(key)
        if pool is None or pool.policy != policy:
            if pool is not None:
                # The policy file changed: its old containers are no longer what it says.
                asyncio.get_running_loop().create_task(pool.aclose())
            pool = self._pools[key] = WarmPool(ports(), policy, scope)
        return pool

    def holds(self, task_id: str) -> bool:
        return any(p.holds(task_id) for p in self._pools.values())

    def ready(self) -> dict[str, int]:
        """Ready containers per policy (every scope summed)."""
        out: dict[str, int] = {}
        for (policy, _), pool in self._pools.items():
            out[policy] = out.get(policy, 0) + pool.size
        return out

    async def close_scope(self, scope: str) -> None:
        """Remove a session's own pools (it ended, or its workspace is being applied)."""
        mine = [k for k in self._pools if k[1] == scope]
        await asyncio.gather(*(self._pools.pop(k).aclose() for k in mine))

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.aclose() for p in pools))
