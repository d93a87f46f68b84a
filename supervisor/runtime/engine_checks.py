"""Is the engine there, and can it run what a policy asks for? Liveness with reconnects,
a watchdog telling a wedged engine (it takes connections, its operations never complete)
from one that is up or down, the registered runtimes (runsc probed once: registered is
not the same as working), and whether a policy's image is present (short caches: these
sit on every task start)."""

from __future__ import annotations

import asyncio
import contextlib

from supervisor.core.container import EngineState
from supervisor.core.errors import (
    EngineUnavailable,
    EngineUnresponsive,
    ImageMissing,
    PolicyError,
    RuntimeUnavailable,
    SupervisorError,
)
from supervisor.core.logs import get_logger
from supervisor.core.policy import Policy, PolicySet
from supervisor.engine.base import Backend
from supervisor.engine.deadlines import Deadlines
from supervisor.engine.probe import probe_runtime

log = get_logger("supervisor.engine_checks")

_RUNTIME_CACHE_S = 30.0
_IMAGE_CACHE_S = 10.0
#: The watchdog's canary: a listing no container matches (cheap on any engine) that goes
#: through the engine's container store, where a deadlocked engine blocks.
CANARY_LABEL = "io.sandvisor.canary"
#: A canary not done within this is a wedged engine (or within half the list deadline,
#: when that is shorter: a start must be refused within its deadline). A busy 2-core
#: machine answers a listing on its own connection in milliseconds; a deadlocked engine
#: never does.
CANARY_S = 5.0
#: How often the watchdog looks.
WATCH_EVERY_S = 1.0


class EngineChecks:
    """Engine health for one supervisor."""

    def __init__(self, backend: Backend, policies: PolicySet) -> None:
        self.backend = backend
        self.policies = policies
        self._engine_ok = False
        self._engine_info: dict[str, str] = {}
        self._reconnect: asyncio.Task[None] | None = None
        self._runtimes: tuple[float, set[str]] = (0.0, set())
        self._runsc_probe: asyncio.Task[str | None] | None = None
        self._images: dict[str, tuple[float, str | None]] = {}
        self._pulls: dict[str, asyncio.Lock] = {}
        self._closed = False
        #: The watchdog's last verdict, and why when it is not ``up``.
        self._state: EngineState = "down"
        self._why = "not checked yet"
        self._canary: asyncio.Task[None] | None = None
        self._canary_began = 0.0
        self._watch: asyncio.Task[None] | None = None
        #: The calls in flight and recent timeouts, when the backend keeps them.
        self._calls = backend if isinstance(backend, Deadlines) else None

    async def first_ping(self) -> bool:
        """At start: whether the engine answers (if not, keep trying in the background)."""
        try:
            self._engine_info = await self.backend.ping()
        except EngineUnavailable:
            self._start_reconnect()
            return False
        self._engine_ok = True
        self._state, self._why = "up", ""
        return True

    def canary_s(self) -> float:
        """How long the canary may take before the engine counts as wedged."""
        if self._calls is None:
            return CANARY_S
        return min(CANARY_S, self._calls.deadlines["list"] / 2)

    def start_watch(self, every_s: float = WATCH_EVERY_S, canary_s: float | None = None) -> None:
        """Look at the engine every ``every_s`` from now on (see :meth:`look`)."""
        canary_s = self.canary_s() if canary_s is None else canary_s
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(
                self._watch_loop(every_s, canary_s), name="engine-watch"
            )

    async def aclose(self) -> None:
        self._closed = True
        for task in (self._reconnect, self._runsc_probe, self._watch, self._canary):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @property
    def engine_ok(self) -> bool:
        return self._engine_ok

    @property
    def engine_state(self) -> EngineState:
        """``up``, ``wedged`` or ``down``: the watchdog's last look, made ``wedged`` at once
        by a call that ran out of time or is overdue meanwhile."""
        return "wedged" if self._hang() is not None else self._state

    @property
    def engine_state_detail(self) -> str:
        """Why the engine is not up ("" when it is)."""
        return self._hang() or self._why

    def _hang(self) -> str | None:
        """A call of the supervisor's own that shows the engine hangs, or the watchdog's."""
        if self._calls is not None:
            health = self._calls.health()
            if health.overdue is not None:
                late = health.overdue
                return f"{late.call} is still running past its {late.deadline_s:g} s deadline"
            if health.timed_out is not None:
                return f"{health.timed_out} did not complete within its deadline"
        return self._why if self._state == "wedged" else None

    async def _watch_loop(self, every_s: float, canary_s: float) -> None:
        while not self._closed:
            await self.look(canary_s)
            await asyncio.sleep(every_s)

    async def look(self, canary_s: float | None = None) -> EngineState:
        """One look: the canary (a container listing) must complete within ``canary_s``;
        refused is ``down``, not done in time ``wedged``, done ``up`` (unless a call of
        ours shows a hang). One canary at a time: a hung one is waited on, not repeated
        (a thread of the engine client stays blocked with each)."""
        canary_s = self.canary_s() if canary_s is None else canary_s
        loop = asyncio.get_running_loop()
        if self._canary is None or self._canary.done():
            self._canary = asyncio.create_task(self._run_canary(), name="engine-canary")
            # A hung canary may end between looks, or after the last one: its error is read
            # here (or below), never left for asyncio to report.
            self._canary.add_done_callback(_retrieve)
            self._canary_began = loop.time()
        canary = self._canary
        left = self._canary_began + canary_s - loop.time()
        await asyncio.wait([canary], timeout=max(0.0, left))
        state: EngineState
        if not canary.done():
            age = loop.time() - self._canary_began
            state, why = "wedged", f"a container listing has not completed in {age:.1f} s"
        elif (exc := canary.exception()) is not None:
            if isinstance(exc, EngineUnresponsive):
                state, why = "wedged", str(exc)
            else:
                state, why = "down", str(exc)
        else:
            state, why = "up", ""
        self._set_state(state, why)
        return self.engine_state

    async def _run_canary(self) -> None:
        await self.backend.list_labeled(CANARY_LABEL)

    def _set_state(self, state: EngineState, why: str) -> None:
        if state != self._state:
            log_at = log.info if state == "up" else log.warning
            log_at("engine_state", state=state, was=self._state, why=why)
        self._state, self._why = state, why
        if state == "up":
            if not self._engine_ok:
                log.info("engine_back")
            self._engine_ok = True
        else:
            self._engine_ok = False

    @property
    def engine_info(self) -> dict[str, str]:
        return dict(self._engine_info)

    def mark_engine_down(self, why: str) -> None:
        if self._engine_ok:
            log.warning("engine_down", error=why)
        self._engine_ok = False
        if self._state != "wedged":  # a wedged engine does not answer either
            self._state, self._why = "down", why
        self._start_reconnect()

    def _start_reconnect(self) -> None:
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = asyncio.create_task(self._reconnect_loop(), name="engine-reconnect")

    async def _reconnect_loop(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                self._engine_info = await asyncio.wait_for(self.backend.ping(), 5)
            except (EngineUnavailable, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if self._state == "wedged":
                # It answers a ping but its operations hang: the watchdog says when it is up.
                return
            self._engine_ok = True
            self._state, self._why = "up", ""
            log.info("engine_back", **self._engine_info)
            return

    async def ensure_engine(self) -> None:
        """Fail fast with EngineUnavailable when the engine does not answer (a sub-millisecond
        ``/_ping`` on its own connection, bounded at 2 s), and at once with
        EngineUnresponsive while it is wedged (nothing would complete: a start would only
        hang until its deadline)."""
        self._refuse_if_wedged()
        if await self.backend.alive():
            self._refuse_if_wedged()
            if not self._engine_ok:
                log.info("engine_back")
            self._engine_ok = True
            self._state, self._why = "up", ""
            return
        # No answer: refused (down), taken and never answered (wedged), or only late (a
        # loaded machine)? A ping that ran out of time says wedged (Deadlines keeps it);
        # else the canary decides, and a canary that completes means the start goes on.
        self._refuse_if_wedged()
        if self._watch is not None:
            verdict = await self.look()
            if verdict == "up":
                log.info("engine_ping_late", why="the canary completed; the start goes on")
                return
            if verdict == "wedged":
                self._refuse_if_wedged()
        self.mark_engine_down("ping failed")
        raise EngineUnavailable(
            "the Docker engine does not answer; start it with `make engine` "
            "(or point DOCKER_HOST at one)"
        )

    def _refuse_if_wedged(self) -> None:
        why = self._hang()
        if why is None:
            return
        deadline = self._calls.deadlines["start"] if self._calls is not None else CANARY_S
        raise EngineUnresponsive(
            "start",
            deadline,
            f"the Docker engine is wedged ({why}): it takes connections but its operations "
            "do not complete, so nothing was started; retry later",
        )

    async def runtimes(self) -> set[str]:
        loop = asyncio.get_running_loop()
        stamp, cached = self._runtimes
        if loop.time() - stamp < _RUNTIME_CACHE_S and cached:
            return cached
        names = await self.backend.runtimes()
        self._runtimes = (loop.time(), names)
        return names

    async def check_runtime(self, runtime: str) -> None:
        """Raise RuntimeUnavailable when ``runtime`` is not registered or (runsc) cannot start
        a container. Never falls back to another runtime."""
        if runtime == "runc":
            return
        if runtime not in await self.runtimes():
            raise RuntimeUnavailable(
                f"runtime {runtime!r} is not registered with the engine, so this policy cannot "
                "run (it never falls back to runc); install gVisor with `make engine`"
            )
        if runtime == "runsc":
            if self._runsc_probe is None:
                self._runsc_probe = asyncio.create_task(self._probe_runsc())
            problem = await asyncio.shield(self._runsc_probe)
            if problem is not None:
                raise RuntimeUnavailable(
                    f"runtime runsc is registered but cannot start a container ({problem}); "
                    "this policy never falls back to runc"
                )

    async def _probe_runsc(self) -> str | None:
        return await probe_runtime(self.backend, "runsc", self.policies)

    async def check_image(self, policy: Policy) -> None:
        """ImageMissing when the policy's image is absent (pulled first only when the policy
        says ``pull = true``); PolicyError when a pin mismatches."""
        loop = asyncio.get_running_loop()
        stamp, image_id = self._images.get(policy.image, (0.0, None))
        if image_id is None or loop.time() - stamp > _IMAGE_CACHE_S:
            image_id = await self.backend.image_id(policy.image)
            if image_id is None and policy.pull:
                image_id = await self._pull(policy)
            self._images[policy.image] = (loop.time(), image_id)
        if image_id is None:
            raise ImageMissing(missing_image_message(policy))
        if policy.image_id is not None and image_id != policy.image_id:
            raise PolicyError(
                f"policy {policy.name!r} pins image_id {policy.image_id} but {policy.image!r} is "
                f"{image_id}; rebuild or update the pin"
            )

    async def _pull(self, policy: Policy) -> str:
        """One pull at a time per image, however many tasks wait for it."""
        lock = self._pulls.setdefault(policy.image, asyncio.Lock())
        async with lock:
            found = await self.backend.image_id(policy.image)
            if found is not None:
                return found
            log.info("image.pull", image=policy.image, policy=policy.name)
            try:
                return await self.backend.pull_image(policy.image)
            except SupervisorError as exc:
                raise ImageMissing(
                    f"image {policy.image!r} (policy {policy.name!r}) is not present on the "
                    f"engine and pulling it failed: {exc}"
                ) from exc


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def missing_image_message(policy: Policy) -> str:
    """What a task whose image is missing is told: the image, and the command that builds it."""
    what = f"image {policy.image!r} (policy {policy.name!r}) is not present on the engine"
    name = sandbox_image_name(policy.image)
    if name is not None:
        return f"{what}; build it with `sandvisor images build {name}` (images are never pulled)"
    return (
        f"{what}; build or load it on the engine (`docker build`, `docker load`), or set "
        "`pull = true` in the policy to let the engine pull it from its registry"
    )


def sandbox_image_name(image: str) -> str | None:
    """``dev`` for ``sandvisor/dev`` or ``sandvisor/dev:<tag>``; None for other images."""
    repo = image.split("@", 1)[0]
    if repo.rfind(":") > repo.rfind("/"):
        repo = repo[: repo.rfind(":")]
    prefix, _, name = repo.partition("/")
    if prefix == "sandvisor" and name and "/" not in name:
        return name
    return None
