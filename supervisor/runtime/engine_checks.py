"""Is the engine there, and can it run what a policy asks for? Liveness with reconnects,
the registered runtimes (runsc probed once: registered is not the same as working), and
whether a policy's image is present (short caches: these sit on every task start)."""

from __future__ import annotations

import asyncio
import contextlib

from supervisor.core.errors import (
    EngineUnavailable,
    ImageMissing,
    PolicyError,
    RuntimeUnavailable,
    SupervisorError,
)
from supervisor.core.logs import get_logger
from supervisor.core.policy import Policy, PolicySet
from supervisor.engine.base import Backend
from supervisor.engine.probe import probe_runtime

log = get_logger("supervisor.engine_checks")

_RUNTIME_CACHE_S = 30.0
_IMAGE_CACHE_S = 10.0


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

    async def first_ping(self) -> bool:
        """At start: whether the engine answers (if not, keep trying in the background)."""
        try:
            self._engine_info = await self.backend.ping()
        except EngineUnavailable:
            self._start_reconnect()
            return False
        self._engine_ok = True
        return True

    async def aclose(self) -> None:
        self._closed = True
        for task in (self._reconnect, self._runsc_probe):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @property
    def engine_ok(self) -> bool:
        return self._engine_ok

    @property
    def engine_info(self) -> dict[str, str]:
        return dict(self._engine_info)

    def mark_engine_down(self, why: str) -> None:
        if self._engine_ok:
            log.warning("engine_down", error=why)
        self._engine_ok = False
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
            self._engine_ok = True
            log.info("engine_back", **self._engine_info)
            return

    async def ensure_engine(self) -> None:
        """Fail fast with EngineUnavailable when the engine does not answer (a sub-millisecond
        ``/_ping`` on its own connection, bounded at 2 s)."""
        if await self.backend.alive():
            if not self._engine_ok:
                self._engine_ok = True
                log.info("engine_back")
            return
        self.mark_engine_down("ping failed")
        raise EngineUnavailable(
            "the Docker engine does not answer; start it with `make engine` "
            "(or point DOCKER_HOST at one)"
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
