"""Getting a command running: a cold start (checks, create, attach, start) or a warm one
(a container already started and attached takes the command on its stdin)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import SupervisorError
from supervisor.core.faults import crash_point
from supervisor.core.policy import Policy
from supervisor.core.task_state import Stage, TaskState
from supervisor.engine.base import AttachedStream, Backend
from supervisor.runtime.task.ports import Preflight, WarmStart


def pooled_command(command: str, env: dict[str, str]) -> str:
    """The command as a warm container runs it: the task's own environment first (the
    container was made before the task was known)."""
    exports = "".join(f"export {name}={_quote(value)}\n" for name, value in env.items())
    return exports + command


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


class Launcher:
    """Creates and starts one task's container. ``persist`` stores the task's record at a
    stage (the container id is stored before anything else can happen to it)."""

    def __init__(
        self,
        backend: Backend,
        preflight: Preflight,
        state: TaskState,
        persist: Callable[[Stage], Awaitable[None]],
    ) -> None:
        self.backend = backend
        self.preflight = preflight
        self.state = state
        self.persist = persist

    async def create(self, request: ContainerRequest, policy: Policy) -> AttachedStream:
        """Checks, create, attach (the command has not started yet)."""
        await self.preflight.check_runtime(policy.runtime)
        await self.preflight.check_image(policy)
        await self.preflight.prepare(policy)
        crash_point("before_create")
        self.state.container_id = await self.backend.create(request)
        crash_point("after_create")
        await self.persist("created")
        return await self.attach_created()

    async def attach_created(self) -> AttachedStream:
        """Attach to the created container: the engine wires stdin before the command runs."""
        cid = self.state.container_id
        assert cid is not None
        return await self.backend.attach(cid, stdin=self.state.stdin_open, logs=False)

    async def start(self) -> None:
        cid = self.state.container_id
        assert cid is not None
        await self.backend.start(cid)
        crash_point("after_start")

    async def warm(self, warm: WarmStart, command: str) -> None:
        """Hand the command to a warm container; then close stdin if the task has none.
        Raises SupervisorError when the container does not take it.

        The task's first record already names the container (the session binds it there):
        a crash before the write leaves a record naming a warm container that never got a
        command, and re-adoption runs the command cold."""
        self.state.container_id = warm.container_id
        crash_point("pool_created")
        # Made before earlier tasks ran: the workspace's checks are for now.
        await self.preflight.check_workspace()
        try:
            await warm.stream.write(warm.payload(command))
            if not self.state.stdin_open:
                await warm.stream.close_stdin()
        except (OSError, ConnectionError) as exc:
            raise SupervisorError(f"the warm container did not take the command: {exc}") from exc
