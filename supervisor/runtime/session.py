"""A session: one agent conversation's tasks, event log and sinks; ending it cleans up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import (
    LimitExceeded,
    PolicyError,
    SessionEnded,
    SpecError,
    TaskNotFound,
    Unsupported,
)
from supervisor.core.events import BaseEvent
from supervisor.core.events import SessionEnded as SessionEndedEvent
from supervisor.core.faults import crash_point
from supervisor.core.ids import new_task_id
from supervisor.core.logs import get_logger
from supervisor.core.models import Kind, OutputSlice, PatternMatch, TaskInfo, TaskSpec
from supervisor.core.policy import Policy
from supervisor.core.resolve import Effective, container_request, resolve
from supervisor.core.scan import compile_pattern
from supervisor.core.task_state import TaskIdentity, TaskRecord, TaskState
from supervisor.core.validation import spec_error
from supervisor.runtime.aio import Background
from supervisor.runtime.pool import SHARED, PoolPorts, WarmPool, eligible
from supervisor.runtime.session_end import stop_all, store_end
from supervisor.runtime.session_ports import (
    SessionEvents,
    SessionServices,
    SessionTaskPorts,
    network_name,
    task_identity,
    task_request,
)
from supervisor.runtime.session_workspace import WorkspaceReview
from supervisor.runtime.task.ports import TaskPorts
from supervisor.runtime.task.runner import TaskRunner
from supervisor.runtime.workspace import Workspace
from supervisor.runtime.workspace_cap import LayerCap
from supervisor.state.eventlog import EventLog
from supervisor.state.output import read_slice, read_tail
from supervisor.state.sinks import Sink, SinkRunner

log = get_logger("supervisor.session")

MAX_READ = 8 * 1024 * 1024


class Session(WorkspaceReview):
    """Owns tasks and an event log. Obtain one with ``Supervisor.open_session``."""

    def __init__(
        self,
        services: SessionServices,
        session_id: str,
        events: EventLog,
        created_at: float,
        *,
        workspace: Workspace | None = None,
    ) -> None:
        self._svc = services
        self.workspace = workspace
        self.session_id = session_id
        self.created_at = created_at
        self._log = events
        self._events = SessionEvents(events, services.store, session_id)
        self._runners: dict[str, TaskRunner] = {}
        #: The runners not yet seen ended (counting them stays O(running), not O(all)).
        self._live: dict[str, TaskRunner] = {}
        #: Task ids between taking a warm container and registering the runner: the
        #: reconciler must not reap that container meanwhile.
        self._binding: set[str] = set()
        self._tasks = Background()
        #: Starts admitted under the running-task limit that have no runner yet.
        self._reserved = 0
        self._ended = False
        self._ending: asyncio.Task[None] | None = None
        self._task_ports = SessionTaskPorts(services, session_id, workspace)
        #: Digests of the API tokens minted for this session (the daemon persists them).
        self.token_digests: list[str] = []
        self.log = log.bind(session_id=session_id)
        self.dir = services.state_dir / "sessions" / session_id
        #: Holds the overlay layer's size to the running tasks' policies.
        self._cap = LayerCap(workspace, self._live.values, self.log)
        self._init_review()

    # -- properties ------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """True once ``end()`` has been called."""
        return self._ended

    @property
    def event_log(self) -> EventLog:
        return self._log

    def network_name(self, kind: str = "bridge") -> str:
        """The session's network of a kind (``bridge``: egress; ``session``: internal)."""
        return network_name(self.session_id, self._svc.instance_id, kind)

    def _runner(self, task_id: str) -> TaskRunner:
        try:
            return self._runners[task_id]
        except KeyError:
            raise TaskNotFound(task_id) from None

    def task_runner(self, task_id: str) -> TaskRunner:
        """The runner driving one task (for diagnostics, tests and benchmarks)."""
        return self._runner(task_id)

    def _check_open(self) -> None:
        if self._ended:
            raise SessionEnded(f"session {self.session_id!r} has ended; open a new session")

    def task_count(self) -> int:
        """Tasks this session has started (any state)."""
        return len(self._runners)

    def running_count(self) -> int:
        """Tasks of this session that have not ended."""
        for task_id in [t for t, r in self._live.items() if r.ended]:
            del self._live[task_id]
        return len(self._live)

    def owns(self, task_id: str) -> bool:
        """Whether a container labeled with ``task_id`` belongs to this session: a task not
        done yet, or a warm container being bound to one. A done task's container is gone
        or its stopper keeps removing it; another one with its label is left over (a create
        the engine carried out after its deadline) and the reconciler may reap it."""
        if task_id in self._binding:
            return True
        runner = self._runners.get(task_id)
        return runner is not None and not runner.done.is_set()

    # -- tasks -------------------------------------------------------------------------

    async def start(self, spec: TaskSpec | dict[str, Any]) -> TaskInfo:
        """Validate against the policy and launch; returns at once with id and output path.

        Bad specs raise SpecError/PolicyError; more running tasks than the policy's
        ``session.max_running_tasks`` (counted over the whole session) raise LimitExceeded;
        an unreachable engine raises EngineUnavailable; problems found while launching
        (missing image, unusable runtime) end the task with a ``task.failed`` event.
        """
        self._check_open()
        if not isinstance(spec, TaskSpec):
            try:
                spec = TaskSpec.model_validate(spec)
            except ValidationError as exc:
                raise spec_error(exc) from exc
        policy = self._svc.policies.get(spec.policy)
        eff = resolve(spec, policy)
        await self._cap.check_start(policy)
        # Count and reserve with no await in between: parallel starts cannot all pass.
        limit = policy.session.max_running_tasks
        running = self.running_count() + self._reserved
        if running >= limit:
            raise LimitExceeded(
                f"session {self.session_id!r} already runs {running} tasks "
                f"(session.max_running_tasks = {limit} in policy {policy.name!r})"
            )
        self._reserved += 1
        try:
            async with self._admitted():
                self._check_open()
                return await self._launch(spec, policy, eff)
        finally:
            self._reserved -= 1

    async def _launch(self, spec: TaskSpec, policy: Policy, eff: Effective) -> TaskInfo:
        pooled = self._svc.backend.capabilities.warm_pool and eligible(spec, policy)
        pool = self._pool(policy) if pooled else None
        # A warm container's live attach connection shows the engine answers; a cold start
        # asks it first (a fast, clear EngineUnavailable instead of a failed task).
        warm = pool.take() if pool is not None else None
        if warm is None:
            await self._svc.ensure_engine()
        task_id = warm.task_id if warm is not None else await self.unique_task_id()
        request = self.build_request(task_id, spec.command, eff, spec.kind)
        ident = self._identity(task_id, spec, eff)
        runner = TaskRunner(self._ports(), ident=ident, eff=eff, request=request, warm=warm)
        if warm is not None:
            # Bound in the first record: a crash from here on finds the warm container by
            # this record (re-adoption runs the command cold if it never reached it).
            runner.state.container_id = warm.container_id
        # The first record comes before anything runs: a crash from now on is recognised
        # on restart. A state volume that cannot take it refuses the task.
        self._binding.add(task_id)
        try:
            await self._svc.check_state_space()
            await self._task_ports.persist(runner.state.stage, runner.record())
        except BaseException:
            if pool is not None and warm is not None:
                await pool.discard(warm)
            raise
        finally:
            self._binding.discard(task_id)
        crash_point("pool_bound" if warm is not None else "intent")
        self._runners[task_id] = self._live[task_id] = runner
        self._spawn(runner.run(), task_id)
        self._cap.task_started()
        return runner.info()

    def _spawn(self, work: Any, task_id: str) -> None:
        self._tasks.start(work, name=f"task-{task_id}")

    def _identity(self, task_id: str, spec: TaskSpec, eff: Effective) -> TaskIdentity:
        return task_identity(self.session_id, self.dir, task_id, spec, eff)

    def _ports(self) -> TaskPorts:
        svc = self._svc
        return TaskPorts(
            backend=svc.backend,
            io=svc.io,
            events=self._events,
            records=self._task_ports,
            preflight=self._task_ports,
            stalls=svc.stalls,
            find_container=svc.find_container,
            live_restore=svc.live_restore(),
            search_io=svc.search_io,
            stats=svc.stats,
        )

    def build_request(
        self, task_id: str, command: str, eff: Effective, kind: str
    ) -> ContainerRequest:
        """The container for one task of this session, hardened as its policy says."""
        return task_request(
            self._svc, self.session_id, self.workspace, task_id, command, eff, kind=kind
        )

    def _pool(self, policy: Policy) -> WarmPool:
        """The pool this session's tasks of ``policy`` take from: the shared one unless
        the container names this session (its workspace, its network)."""
        shared = self.workspace is None and policy.network == "none"
        scope = SHARED if shared else self.session_id
        return self._svc.pools.get(policy, scope, lambda: self._pool_ports(shared))

    def _pool_ports(self, shared: bool) -> PoolPorts:
        svc = self._svc
        if shared:
            return svc.shared_pool_ports()
        return PoolPorts(
            backend=svc.backend,
            check_runtime=svc.check_runtime,
            check_image=svc.check_image,
            prepare=self._task_ports.prepare,
            new_task_id=self.unique_task_id,
            build_request=self.build_request,
        )

    async def prewarm(self, policy_name: str = "default") -> int:
        """Fill the warm pool this session's tasks of a policy take from, now, to the
        policy's ``warm_pool`` (at least one); returns how many containers are ready."""
        self._check_open()
        policy = self._svc.policies.get(policy_name)
        if policy.warm_pool_max <= 0:
            raise PolicyError(
                f"policy {policy_name!r} has warm_pool_max = 0 (warm starts are off); set "
                "warm_pool or warm_pool_max in its file to use a pool"
            )
        if not self._svc.backend.capabilities.warm_pool:
            raise Unsupported(
                f"the {self._svc.backend.name} backend has no warm pools (a container started "
                "ahead cannot be handed its command there); tasks start cold"
            )
        await self._svc.ensure_engine()
        pool = self._pool(policy)
        pool.prefill(max(policy.warm_pool, 1))
        await pool.wait_filled()
        return pool.size

    def restore_task(self, record: TaskRecord) -> TaskRunner:
        """Rebuild one task from its stored record (after a restart); resume it if it was
        not finished."""
        policy = record.policy
        eff = resolve(record.spec, policy)
        task_id = record.info.task_id
        try:
            request = self.build_request(task_id, record.spec.command, eff, record.spec.kind)
        except PolicyError:
            # The workspace root was removed from the config meanwhile: the container (if
            # any) exists already; a re-create would be refused, which ends the task clearly.
            request = container_request(
                name=f"sandvisor-{task_id}",
                command=record.spec.command,
                eff=eff,
                labels=self._svc.labels(session_id=self.session_id, task_id=task_id),
                network="none",
                workspace=(),
            )
        ident = self._identity(task_id, record.spec, eff)
        state = TaskState.from_record(ident, record)
        runner = TaskRunner(self._ports(), ident=ident, eff=eff, request=request, state=state)
        self._runners[task_id] = self._live[task_id] = runner
        if runner.ended:
            runner.final.set()
            runner.exited.set()
            # A crash between the "ended" record and the removal leaves the container:
            # remove it now (done is set once it is gone, as for any ended task).
            self._spawn(_remove_after_restore(runner), task_id)
        else:
            self._spawn(runner.resume(record.stage), task_id)
            self._cap.task_started()
        return runner

    async def unique_task_id(self) -> str:
        while True:
            task_id = new_task_id()
            if self.owns(task_id):
                continue
            if not await self._svc.store.task_exists(task_id):
                return task_id

    # -- reading -------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskInfo:
        """Current snapshot of one task."""
        return self._runner(task_id).info()

    async def list(self, kind: Kind | None = None, *, active_only: bool = False) -> list[TaskInfo]:
        """Tasks of this session, oldest first; ``active_only`` drops ended ones."""
        return [
            r.info()
            for r in self._runners.values()
            if (kind is None or r.ident.kind == kind) and not (active_only and r.ended)
        ]

    async def read_output(self, task_id: str, offset: int = 0, limit: int = 65536) -> OutputSlice:
        """Bytes ``[offset, offset+limit)`` of the output file, with ``next_offset`` and ``eof``."""
        runner = self._runner(task_id)
        if offset < 0:
            raise SpecError(f"offset: must be >= 0 (got {offset})")
        if not 1 <= limit <= MAX_READ:
            raise SpecError(f"limit: must be between 1 and {MAX_READ} (got {limit})")
        return await read_slice(
            runner.output_path,
            offset,
            limit,
            ended=runner.ended,
            io=self._svc.io,
            writer=runner.capture.out,
        )

    async def tail(self, task_id: str, chars: int = 4000) -> str:
        """The last ``chars`` characters of output (UTF-8, invalid bytes replaced)."""
        runner = self._runner(task_id)
        if not 1 <= chars <= 1_000_000:
            raise SpecError(f"chars: must be between 1 and 1000000 (got {chars})")
        return await read_tail(runner.output_path, chars, self._svc.io)

    async def wait_output(self, task_id: str, offset: int, timeout_s: float) -> None:
        """Return once the output file grows past ``offset``, the task ends, or time runs out."""
        await self._runner(task_id).wait_output(offset, timeout_s)

    async def wait(self, task_id: str, timeout_s: float | None = None) -> TaskInfo:
        """Wait for the task's final status; raises WaitTimeout (a TimeoutError)."""
        return await self._runner(task_id).wait_final(timeout_s)

    async def stop(self, task_id: str) -> TaskInfo:
        """Stop a task (SIGTERM, grace, SIGKILL); raises TaskNotRunning if it already ended."""
        return await self._runner(task_id).stop("user_stopped")

    async def send_input(self, task_id: str, data: bytes | str, *, eof: bool = False) -> None:
        """Write to the task's stdin; ``eof=True`` then closes it."""
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        await self._runner(task_id).send_input(raw, eof=eof)

    async def wait_for(
        self, task_id: str, pattern: str, timeout_s: float = 30.0, from_offset: int = 0
    ) -> PatternMatch:
        """The first output line matching the regex ``pattern`` (also lines printed earlier)."""
        runner = self._runner(task_id)
        compiled = compile_pattern(pattern)
        if timeout_s <= 0:
            raise SpecError(f"timeout_s: must be > 0 (got {timeout_s})")
        if from_offset < 0:
            raise SpecError(f"from_offset: must be >= 0 (got {from_offset})")
        return await runner.wait_for_pattern(compiled, timeout_s, from_offset)

    # -- events ---------------------------------------------------------------------

    def events(self, after_seq: int = 0, *, follow: bool = True) -> AsyncIterator[BaseEvent]:
        """Events with seq > ``after_seq`` still held, then live ones until the session ends."""
        return self._log.follow(after_seq, follow=follow)

    def add_sink(
        self, sink: Sink, *, after_seq: int | None = None, max_lag: int | None = None
    ) -> SinkRunner:
        """Deliver this session's events to ``sink`` (after ``after_seq`` if given, else from
        now on). A sink more than ``max_lag`` events behind (default: the supervisor's
        ``sink_max_lag``) skips the oldest and receives an ``events.gap`` naming them."""
        return self._log.add_sink(sink, after_seq=after_seq, max_lag=max_lag)

    async def remove_sink(self, runner: SinkRunner) -> None:
        await self._log.remove_sink(runner)

    # -- ending ----------------------------------------------------------------------

    async def end(self) -> None:
        """Stop every task in parallel, emit their terminal events and ``session.ended``,
        remove the containers. Idempotent; survives cancellation of the caller."""
        if self._ending is None:
            self._ended = True
            self._ending = asyncio.create_task(self._end(), name=f"end-{self.session_id}")
        await asyncio.shield(self._ending)

    async def _end(self) -> None:
        self._cap.close()
        await self._svc.pools.close_scope(self.session_id)
        stopped, late = await stop_all(
            list(self._runners.values()), "session_ended", timeout_s=self._svc.end_timeout_s
        )
        for runner in late:
            # The engine does not answer: the session still ends now; the container is
            # removed in the background once the engine is back (or reaped later).
            await runner.abandon(
                "the engine did not answer while the session ended; the container is "
                "removed once the engine is back"
            )
        await self._task_ports.remove_networks(self.log)
        self._log.emit(SessionEndedEvent(session_id=self.session_id, tasks_stopped=stopped))
        await self._log.aclose()
        await store_end(self._svc.store, self.session_id, self.created_at, self.log)
        self.log.info("session_ended", tasks_stopped=stopped)
        await self._svc.on_ended(self.session_id)

    @property
    def settled(self) -> bool:
        """Whether none of its work runs any more: no task's runner, and no kill or removal
        kept trying in the background (after an end that met the engine away)."""
        return not self._tasks.busy and not any(r.stopper.busy for r in self._runners.values())

    async def release(self) -> None:
        """Supervisor shutdown without stopping tasks: let go of containers, keep records
        (its own idle pool containers are removed: they are not tasks). An ended session
        drops the removals it kept trying: the next supervisor's first round reaps those
        containers by their labels."""
        self._cap.close()
        await self._svc.pools.close_scope(self.session_id)
        self._tasks.cancel()
        await self._tasks.wait()
        for runner in self._runners.values():
            runner.stopper.cancel()
        await self._log.aclose(sink_timeout=2.0)


async def _remove_after_restore(runner: TaskRunner) -> None:
    """An ended task restored from the store: remove its container if it is left."""
    try:
        await runner.stopper.remove()
    finally:
        runner.done.set()
