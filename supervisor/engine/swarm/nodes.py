"""The cluster's nodes as the supervisor needs them: what the manager says (GET /nodes,
polled, since jobs ignore node loss), each node's own engine (from its ``io.sandvisor.engine``
label) and what that engine runs, and a change signal for those waiting on a node."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.errors import EngineUnavailable, ImageMissing, SupervisorError
from supervisor.core.logs import get_logger
from supervisor.engine.docker import DockerBackend
from supervisor.engine.swarm.manager import ManagerAPI

log = get_logger("supervisor.engine.swarm")

#: The node label that names the node's own engine endpoint.
ENGINE_LABEL = "io.sandvisor.engine"
#: How often the manager is asked for the nodes (node loss is seen within this of the
#: manager's own verdict).
POLL_S = 1.0
#: How long what a node's engine said (runtimes, liveness) is trusted.
FACTS_TTL_S = 15.0
#: Node states in which the node's tasks are given up.
GONE_STATES = ("down", "disconnected")


@dataclass(frozen=True)
class NodeView:
    """One node, as the manager describes it."""

    id: str
    hostname: str
    role: str
    availability: str
    """active, pause, drain."""
    state: str
    """unknown, down, ready, disconnected."""
    addr: str
    labels: dict[str, str]
    engine_labels: dict[str, str]
    os: str
    arch: str
    engine_version: str

    @property
    def engine_url(self) -> str | None:
        return self.labels.get(ENGINE_LABEL) or None

    @property
    def schedulable(self) -> bool:
        return self.state == "ready" and self.availability == "active"

    @property
    def gone(self) -> bool:
        return self.state in GONE_STATES

    def name(self) -> str:
        """``hostname (id prefix)``: how a node is named in texts."""
        return f"{self.hostname} ({self.id[:12]})"

    def attrs(self) -> dict[str, str]:
        """Its attributes as placement constraints name them."""
        out = {
            "node.id": self.id,
            "node.hostname": self.hostname,
            "node.role": self.role,
            "node.platform.os": self.os,
            "node.platform.arch": self.arch,
        }
        out.update({f"node.labels.{k}": v for k, v in self.labels.items()})
        out.update({f"engine.labels.{k}": v for k, v in self.engine_labels.items()})
        return out


def node_view(raw: dict[str, Any]) -> NodeView:
    """A ``GET /nodes`` entry."""
    spec = raw.get("Spec") or {}
    desc = raw.get("Description") or {}
    status = raw.get("Status") or {}
    engine = desc.get("Engine") or {}
    platform = desc.get("Platform") or {}
    return NodeView(
        id=str(raw.get("ID", "")),
        hostname=str(desc.get("Hostname", "?")),
        role=str(spec.get("Role", "worker")),
        availability=str(spec.get("Availability", "active")),
        state=str(status.get("State", "unknown")),
        addr=str(status.get("Addr", "")),
        labels=dict(spec.get("Labels") or {}),
        engine_labels=dict(engine.get("Labels") or {}),
        os=str(platform.get("OS", "")),
        arch=str(platform.get("Architecture", "")),
        engine_version=str(engine.get("EngineVersion", "")),
    )


@dataclass
class EngineFacts:
    """What a node's own engine said when last asked."""

    answers: bool
    default_runtime: str | None = None
    runtimes: set[str] = field(default_factory=set)
    swarm_node_id: str | None = None
    error: str = ""
    at: float = 0.0


def endpoint_problem(url: str | None, tls_dir: str | None) -> str | None:
    """Why the supervisor will not talk to a node engine at ``url`` (None: it will). A
    remote engine is reached over TCP only with mutual TLS (its API is root on that node)."""
    if not url:
        return f"the node has no {ENGINE_LABEL} label naming its engine"
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "unix":
        return None
    if parsed.scheme in ("tcp", "https"):
        if tls_dir is None and parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
            return (
                f"its engine {url} is remote and no TLS folder is configured "
                "(SANDVISOR_SWARM_TLS_DIR with ca.pem, cert.pem, key.pem); refusing plain TCP"
            )
        return None
    return f"unsupported engine endpoint {url!r} (unix://… or tcp://… with TLS)"


class NodeRegistry:
    """Nodes, their engines and a change signal. ``run`` polls the manager."""

    def __init__(self, manager: ManagerAPI, *, tls_dir: str | None = None) -> None:
        self.manager = manager
        self.tls_dir = tls_dir
        self.nodes: dict[str, NodeView] = {}
        self._engines: dict[str, DockerBackend] = {}
        self._facts: dict[str, EngineFacts] = {}
        self._changed = asyncio.Event()
        self._loaded = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.manager_ok = True

    # -- the manager's view -----------------------------------------------------------

    async def refresh(self) -> dict[str, NodeView]:
        """Ask the manager now; wake whoever waits on a node when anything changed."""
        views = {v.id: v for v in (node_view(n) for n in await self.manager.nodes())}
        if views != self.nodes:
            for node_id, view in views.items():
                old = self.nodes.get(node_id)
                if old is not None and (old.state, old.availability) != (
                    view.state,
                    view.availability,
                ):
                    log.info(
                        "swarm_node_changed",
                        node=view.name(),
                        state=view.state,
                        availability=view.availability,
                    )
            self.nodes = views
            self._wake()
        self._loaded.set()
        return views

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change of any node (a fresh event after each)."""
        return self._changed

    def start(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._loop(), name="swarm-nodes")

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
                self.manager_ok = True
            except SupervisorError as exc:
                if self.manager_ok:
                    log.warning("swarm_manager_unavailable", error=str(exc))
                self.manager_ok = False
            await asyncio.sleep(POLL_S)

    async def loaded(self) -> None:
        """Return once the nodes were listed at least once (listing now if need be)."""
        if not self._loaded.is_set():
            await self.refresh()

    def get(self, node_id: str) -> NodeView | None:
        return self.nodes.get(node_id)

    def describe(self, node_id: str) -> str:
        view = self.nodes.get(node_id)
        return view.name() if view is not None else f"node {node_id[:12]}"

    # -- the nodes' own engines ---------------------------------------------------------

    def engine(self, node_id: str) -> DockerBackend:
        """The node's own engine; EngineUnavailable when it has none we may use."""
        view = self.nodes.get(node_id)
        url = view.engine_url if view is not None else None
        problem = endpoint_problem(url, self.tls_dir)
        if problem is not None or url is None:
            raise EngineUnavailable(f"{self.describe(node_id)}: {problem}")
        engine = self._engines.get(url)
        if engine is None:
            engine = self._engines[url] = DockerBackend(url, max_workers=8, tls_dir=self.tls_dir)
        return engine

    def is_local(self, node_id: str) -> bool:
        """Whether the node's engine is on this host (a unix socket): then its pids and
        cgroups are this kernel's."""
        view = self.nodes.get(node_id)
        url = view.engine_url if view is not None else None
        return bool(url and url.startswith("unix://"))

    async def facts(self, node_id: str, *, fresh: bool = False) -> EngineFacts:
        """What the node's engine runs (cached for FACTS_TTL_S). A node whose engine does
        not answer, or answers as another node, gets ``answers=False``."""
        loop = asyncio.get_running_loop()
        known = self._facts.get(node_id)
        if known is not None and not fresh and loop.time() - known.at < FACTS_TTL_S:
            return known
        try:
            engine = self.engine(node_id)
            info = await asyncio.wait_for(engine.info(), 5.0)
        except (SupervisorError, TimeoutError) as exc:
            facts = EngineFacts(answers=False, error=str(exc) or "no answer within 5 s")
        else:
            swarm_id = str((info.get("Swarm") or {}).get("NodeID") or "")
            facts = EngineFacts(
                answers=True,
                default_runtime=str(info.get("DefaultRuntime") or "runc"),
                runtimes=set((info.get("Runtimes") or {}).keys()),
                swarm_node_id=swarm_id,
            )
            if swarm_id != node_id:
                # A label pointing at the wrong engine would send signals to other tasks.
                facts = EngineFacts(
                    answers=False,
                    error=f"its {ENGINE_LABEL} engine is swarm node {swarm_id or '(none)'}",
                )
        facts.at = loop.time()
        self._facts[node_id] = facts
        return facts

    async def image_id(self, image: str) -> str | None:
        """The image's id on the first schedulable node that has it."""
        await self.loaded()
        for view in list(self.nodes.values()):
            if not view.schedulable:
                continue
            try:
                found = await self.engine(view.id).image_id(image)
            except SupervisorError:
                continue
            if found is not None:
                return found
        return None

    async def pull_image(self, image: str) -> str:
        """Pull ``image`` on every schedulable node; its id from the first that took it."""
        await self.loaded()
        found: str | None = None
        errors: list[str] = []
        for view in list(self.nodes.values()):
            if not view.schedulable:
                continue
            try:
                pulled = await self.engine(view.id).pull_image(image)
            except SupervisorError as exc:
                errors.append(f"{view.id}: {exc}")
                continue
            found = found or pulled
        if found is None:
            raise ImageMissing(f"pull {image}: no node could pull it ({'; '.join(errors)})")
        return found

    async def default_runtimes(self) -> set[str]:
        """The default runtimes of the nodes whose engines answer."""
        await self.loaded()
        facts = await asyncio.gather(*(self.facts(n) for n in list(self.nodes)))
        return {f.default_runtime for f in facts if f.answers and f.default_runtime}

    def forget_facts(self, node_id: str) -> None:
        self._facts.pop(node_id, None)

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            await engine.aclose()
