"""The engine Protocol on Docker Swarm: a task is a one-replica job service the manager
places; its stdio, signals, pause and stats go to the engine of the node it landed on (named
by the node's ``io.sandvisor.engine`` label). The handle the runtime holds is the service id.

Swarm's jobs ignore node loss and drains, so ``wait`` watches the nodes itself and reports a
task whose node went down, was drained or whose engine restarted as ``lost``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Literal

from supervisor.core.container import (
    ContainerRequest,
    ContainerState,
    ContainerSummary,
    EngineCapabilities,
    Segment,
)
from supervisor.core.errors import (
    EngineError,
    EngineUnavailable,
    PlacementUnavailable,
    SupervisorError,
    Unsupported,
)
from supervisor.core.logs import get_logger
from supervisor.engine.base import AttachedStream
from supervisor.engine.docker import DockerBackend
from supervisor.engine.swarm.manager import ManagerAPI, NotFoundError
from supervisor.engine.swarm.network import ensure_isolated_network
from supervisor.engine.swarm.nodes import NodeRegistry
from supervisor.engine.swarm.placing import eligible_nodes
from supervisor.engine.swarm.spec import (
    SWARM_SERVICE,
    TaskStatus,
    pick_task,
    service_spec,
)
from supervisor.engine.swarm.stream import SwarmStream
from supervisor.engine.swarm.tasks import TaskPoller
from supervisor.engine.swarm.unsupported import WithoutHostResources

log = get_logger("supervisor.engine.swarm")

#: How long a task may stay unplaced or unstarted before the start is given up.
START_TIMEOUT_S = 60.0
#: How long a call to the engine of a node that is gone may take (best effort).
GONE_CALL_S = 3.0
#: How many task placements ``placed`` remembers.
PLACED_KEPT = 4096
#: Handles of containers whose service is gone (the 20.10 job-removal bug): ctr:NODE:ID.
ORPHAN = "ctr:"


class SwarmBackend(WithoutHostResources):
    """A Swarm cluster through its manager and its nodes' engines."""

    name = "swarm"
    local = False
    capabilities = EngineCapabilities(
        stdin_eof=False,
        warm_pool=False,
        placement=True,
        node_loss=True,
        workspaces=False,
        session_networks=False,
        exact_replay=True,
    )

    def __init__(self, manager_url: str | None = None, *, tls_dir: str | None = None) -> None:
        self.manager = ManagerAPI(manager_url, tls_dir=tls_dir)
        self.nodes = NodeRegistry(self.manager, tls_dir=tls_dir)
        self.poller = TaskPoller(self.manager)
        #: service id → (node id, container id), once the task has a container.
        self._where: dict[str, tuple[str, str]] = {}
        #: Services created here and not attached yet: the first attach replays everything
        #: (the command may have started before it; on one host attach comes before start).
        self._fresh: set[str] = set()
        #: service name → node id of the tasks placed lately (kept after removal, bounded).
        self.placed: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._ready_lock = asyncio.Lock()
        self._ready = False

    # -- setup ---------------------------------------------------------------------------

    async def _ensure_ready(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            await self.nodes.loaded()
            self.nodes.start()
            await ensure_isolated_network(self.manager)
            self._ready = True

    async def ping(self) -> dict[str, str]:
        info = await self.manager.call("GET", "/version")
        swarm = (await self.manager.call("GET", "/info")).get("Swarm") or {}
        if not swarm.get("ControlAvailable"):
            raise EngineUnavailable(
                f"{self.manager.url} is not a Swarm manager (swarm state: "
                f"{swarm.get('LocalNodeState', '?')})"
            )
        return {
            "version": str(info.get("Version", "?")),
            "api_version": str(info.get("ApiVersion", "?")),
            "os": str(info.get("Os", "?")),
            "kernel": str(info.get("KernelVersion", "?")),
        }

    async def alive(self) -> bool:
        return await self.manager.ping()

    # -- placement ------------------------------------------------------------------------

    async def create(self, request: ContainerRequest) -> str:
        if request.mounts:
            raise Unsupported(
                "the swarm backend cannot mount host folders or volumes (a node does not see "
                "the supervisor's files): use a policy without a workspace"
            )
        if request.network != "none":
            raise Unsupported(
                f"the swarm backend runs tasks without a network only (asked: {request.network})"
            )
        await self._ensure_ready()
        ok, why = await eligible_nodes(self.nodes, request)
        if not ok:
            raise PlacementUnavailable(
                f"no Swarm node can run this task (runtime {request.runtime}, placement "
                f"{request.placement or 'any'}): " + "; ".join(why)
            )
        # Swarm places among the eligible nodes only: one that is not (wrong runtime, mute
        # engine) is excluded by id, so a task never lands where it must not run.
        allowed = {v.id for v in ok}
        exclude = [f"node.id!={n}" for n in self.nodes.nodes if n not in allowed]
        spec = service_spec(request, constraints=[*request.placement, *exclude])
        service_id = await self.manager.create_service(spec)
        self._fresh.add(service_id)
        self._names[service_id] = request.name
        return service_id

    # -- locating a task's container ------------------------------------------------------

    async def task(self, service_id: str) -> TaskStatus | None:
        """The service's task now (None: the service is gone or has no task yet)."""
        try:
            tasks = await self.manager.tasks([service_id])
        except NotFoundError:
            return None
        return pick_task(tasks)

    async def _started(self, service_id: str) -> tuple[str, str]:
        """(node id, container id) of the task, waiting until it has a started container.
        EngineError when it ended without one; PlacementUnavailable when never placed."""
        known = self._where.get(service_id)
        if known is not None:
            return known
        loop = asyncio.get_running_loop()
        give_up = loop.time() + START_TIMEOUT_S
        delay = 0.05
        while True:
            status = await self.poller.status(service_id)
            if status is not None and status.node_id and status.container_id and status.started:
                return self._remember(service_id, status.node_id, status.container_id)
            if status is not None and status.start_failed:
                # Swarm could not start it (e.g. a network the node lacks): not an exit.
                raise EngineError(f"Swarm did not start the task ({status.state}): {status.error}")
            if status is not None and status.refused:
                raise EngineError(
                    f"Swarm did not start the task ({status.state}): "
                    f"{status.error or status.message}"
                )
            if loop.time() > give_up:
                detail = f"{status.state}: {status.error or status.message}" if status else ""
                raise PlacementUnavailable(
                    f"the task was not started within {START_TIMEOUT_S:g} s ({detail})"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    async def _located(self, service_id: str) -> tuple[DockerBackend, str] | None:
        """The node engine and container of a task that has one (None: not yet, or gone)."""
        if service_id.startswith(ORPHAN):
            _, node_id, cid = service_id.split(":", 2)
            return self.nodes.engine(node_id), cid
        where = self._where.get(service_id)
        if where is None:
            status = await self.task(service_id)
            if status is None or not (status.node_id and status.container_id):
                return None
            where = self._remember(service_id, status.node_id, status.container_id)
        await self.nodes.loaded()
        return self.nodes.engine(where[0]), where[1]

    def _remember(self, service_id: str, node_id: str, container_id: str) -> tuple[str, str]:
        where = self._where[service_id] = (node_id, container_id)
        self.placed[self._names.pop(service_id, service_id)] = node_id
        if len(self.placed) > PLACED_KEPT:
            del self.placed[next(iter(self.placed))]
        return where

    async def _require(self, service_id: str) -> tuple[DockerBackend, str]:
        found = await self._located(service_id)
        if found is None:
            raise EngineError(f"task {service_id[:12]} has no container")
        return found

    # -- stdio -----------------------------------------------------------------------------

    async def attach(self, container_id: str, *, stdin: bool, logs: bool) -> AttachedStream:
        node_id, cid = await self._started(container_id)
        engine = self.nodes.engine(node_id)
        whole = logs or container_id in self._fresh
        self._fresh.discard(container_id)
        output = engine.follow_logs(cid, whole=whole)
        channel = await engine.attach_input(cid) if stdin else None
        return SwarmStream(output, channel)

    def logs(
        self, container_id: str, *, tail: int | None = None, timestamps: bool = False
    ) -> AsyncIterator[list[Segment]]:
        return self._logs(container_id, tail, timestamps)

    async def _logs(
        self, service_id: str, tail: int | None, timestamps: bool
    ) -> AsyncIterator[list[Segment]]:
        found = await self._located(service_id)
        if found is None:
            return
        engine, cid = found
        async for segments in engine.logs(cid, tail=tail, timestamps=timestamps):
            yield segments

    async def start(self, container_id: str) -> None:
        """Swarm starts the task itself once placed; wait for that (or its failure)."""
        await self._started(container_id)

    # -- the end of a task ----------------------------------------------------------------

    async def wait(self, container_id: str) -> ContainerState:
        node_id, cid = await self._started(container_id)
        engine = self.nodes.engine(node_id)
        outage = False
        while True:
            changed = self.nodes.changed
            lost = self._node_lost(node_id)
            if lost is not None:
                return await self._give_up(container_id, engine, cid, lost)
            waiter = asyncio.ensure_future(engine.wait(cid))
            watcher = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
                if not waiter.done():
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError, SupervisorError):
                        await waiter
            if not waiter.done() or waiter.cancelled():
                continue  # a node changed: look again
            try:
                state = waiter.result()
            except EngineUnavailable as exc:
                if not outage:
                    log.warning("swarm_node_engine_unavailable", node=node_id, error=str(exc))
                outage = True
                await self._until_engine_back(node_id, engine)
                continue
            if outage:
                # No live-restore in swarm mode: the engine's restart killed the command.
                name = self.nodes.describe(node_id)
                return _lost(
                    state,
                    f"the engine of node {name} restarted (swarm mode has no live-restore): "
                    "the command was killed with it",
                )
            return state.model_copy(update={"node": self.nodes.describe(node_id)})

    def _node_lost(self, node_id: str) -> str | None:
        view = self.nodes.get(node_id)
        if view is None:
            return f"node {node_id[:12]} left the swarm"
        if view.gone:
            return f"node {view.name()} is {view.state}"
        if view.availability == "drain":
            return f"node {view.name()} was drained: the task was stopped"
        return None

    async def _until_engine_back(self, node_id: str, engine: DockerBackend) -> None:
        delay = 0.2
        while self._node_lost(node_id) is None and not await engine.alive():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _give_up(
        self, service_id: str, engine: DockerBackend, cid: str, lost: str
    ) -> ContainerState:
        """Stop what may still run of a task whose node is lost (best effort: the node may be
        unreachable) and report it lost."""
        log.warning("swarm_task_lost", service=service_id[:12], detail=lost)
        with contextlib.suppress(SupervisorError, TimeoutError):
            await asyncio.wait_for(engine.kill(cid, "SIGKILL"), GONE_CALL_S)
        state: ContainerState | None = None
        with contextlib.suppress(SupervisorError, TimeoutError):
            state = await asyncio.wait_for(engine.inspect(cid), GONE_CALL_S)
        if state is None or state.running:
            state = ContainerState(id=cid, status="exited", running=False, exit_code=None)
        return _lost(state, lost)

    async def inspect(self, container_id: str) -> ContainerState | None:
        if not container_id.startswith(ORPHAN) and container_id not in self._where:
            status = await self.task(container_id)
            if status is None:
                return None
            if not status.container_id:
                if status.refused:
                    return None
                return ContainerState(id=container_id, status="created", running=False)
        found = await self._located(container_id)
        if found is None:
            return None
        engine, cid = found
        node_id = self._where.get(container_id, ("", ""))[0]
        lost = self._node_lost(node_id) if node_id else None
        try:
            state = await asyncio.wait_for(engine.inspect(cid), GONE_CALL_S if lost else None)
        except (EngineUnavailable, TimeoutError):
            if lost is None:
                raise
            state = ContainerState(id=cid, status="exited", running=False)
        if state is None or lost is None:
            return state
        return _lost(state, lost)

    async def kill(self, container_id: str, signal: Literal["SIGTERM", "SIGKILL"]) -> None:
        found = await self._located(container_id)
        if found is None:
            # Not started yet: removing the service keeps it from ever starting.
            await self.manager.remove_service(container_id)
            return
        engine, cid = found
        try:
            await asyncio.wait_for(engine.kill(cid, signal), GONE_CALL_S * 5)
        except (EngineUnavailable, TimeoutError):
            if self._node_lost(self._where.get(container_id, ("", ""))[0]) is None:
                raise

    async def remove(self, container_id: str) -> None:
        """The container through its node first (Engine 20.10 leaves a removed job's
        containers behind, even one it creates after the removal), then the service."""
        if container_id.startswith(ORPHAN):
            with contextlib.suppress(SupervisorError):
                found = await self._located(container_id)
                if found is not None:
                    await found[0].remove(found[1])
            return
        node_id = await self._settled_node(container_id)
        if node_id is not None:
            await self._remove_on_node(container_id, node_id)
        await self.manager.remove_service(container_id)
        self._where.pop(container_id, None)
        self._fresh.discard(container_id)
        self._names.pop(container_id, None)

    async def _settled_node(self, service_id: str) -> str | None:
        """The node of a task, once it is past the point where that node may still create
        its container (None: never placed, or the service is gone)."""
        where = self._where.get(service_id)
        if where is not None:
            return where[0]
        loop = asyncio.get_running_loop()
        give_up = loop.time() + START_TIMEOUT_S / 4
        while True:
            status = await self.task(service_id)
            if status is None or status.node_id is None:
                return None
            if status.container_id or status.refused or loop.time() > give_up:
                return status.node_id
            await asyncio.sleep(0.2)

    async def _remove_on_node(self, service_id: str, node_id: str) -> None:
        """Remove every container of the service on its node (by Swarm's service label)."""
        try:
            engine = self.nodes.engine(node_id)
            rows = await asyncio.wait_for(
                engine.list_labeled(f"{SWARM_SERVICE}={service_id}"), GONE_CALL_S * 5
            )
            for row in rows:
                await asyncio.wait_for(engine.remove(row.id), GONE_CALL_S * 5)
        except (SupervisorError, TimeoutError) as exc:
            # A node that is gone keeps it; the next sweep reaps it (an orphan handle).
            log.warning("swarm_remove_unreachable", service=service_id[:12], error=str(exc))

    # -- listing -----------------------------------------------------------------------------

    async def list_labeled(self, label: str) -> list[ContainerSummary]:
        """Our services carrying ``label``, plus containers carrying it whose service is gone
        (left by the 20.10 bug, or by a crash between the two removals)."""
        await self._ensure_ready()
        services = await self.manager.services(label)
        out = [
            ContainerSummary(
                id=str(s["ID"]),
                status="service",
                labels=dict((s.get("Spec") or {}).get("Labels") or {}),
            )
            for s in services
        ]
        known = {row.id for row in out}
        for node_id in list(self.nodes.nodes):
            try:
                engine = self.nodes.engine(node_id)
                rows = await asyncio.wait_for(engine.list_labeled(label), GONE_CALL_S)
            except (SupervisorError, TimeoutError):
                continue
            for row in rows:
                service = row.labels.get(SWARM_SERVICE)
                if service is not None and service not in known:
                    out.append(
                        ContainerSummary(
                            id=f"{ORPHAN}{node_id}:{row.id}", status=row.status, labels=row.labels
                        )
                    )
        return out

    async def image_id(self, image: str) -> str | None:
        return await self.nodes.image_id(image)

    async def pull_image(self, image: str) -> str:
        """Pulled on every schedulable node that answers: a task may land on any of them."""
        return await self.nodes.pull_image(image)

    async def runtimes(self) -> set[str]:
        """The default runtimes of the nodes that answer (a service cannot choose another)."""
        return await self.nodes.default_runtimes()

    async def pause(self, container_id: str) -> None:
        engine, cid = await self._require(container_id)
        await engine.pause(cid)

    async def unpause(self, container_id: str) -> None:
        found = await self._located(container_id)
        if found is not None:
            await found[0].unpause(found[1])

    async def cpu_time_ns(self, container_id: str) -> int | None:
        found = await self._located(container_id)
        return None if found is None else await found[0].cpu_time_ns(found[1])

    async def aclose(self) -> None:
        await self.nodes.aclose()


def _lost(state: ContainerState, detail: str) -> ContainerState:
    """The container given up with its node: status ``lost``, ``error`` naming the node."""
    return state.model_copy(update={"status": "lost", "running": False, "error": detail})
