"""A session: one agent conversation's tasks, event log and sinks; ending it cleans up."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import (
    LimitExceeded,
    PolicyError,
    SessionEnded,
    SpecError,
    TaskNotFound,
)
from supervisor.core.events import BaseEvent, parse_event
from supervisor.core.events import SessionEnded as SessionEndedEvent
from supervisor.core.ids import new_task_id
from supervisor.core.logs import get_logger
from supervisor.core.models import Kind, OutputSlice, PatternMatch, TaskInfo, TaskSpec
from supervisor.core.policy import Policy
from supervisor.core.resolve import Effective, container_request, resolve, workspace_mount
from supervisor.runtime.pool import WarmPool, eligible
from supervisor.runtime.task.runner import RunnerContext, TaskRecord, TaskRunner
from supervisor.state.eventlog import EventLog
from supervisor.state.output import read_slice, read_tail
from supervisor.state.sinks import Sink, SinkRunner

if TYPE_CHECKING:
    from supervisor.runtime.supervisor import Supervisor

log = get_logger("supervisor.runtime.session")

MAX_READ = 8 * 1024 * 1024


def spec_error(exc: ValidationError) -> SpecError:
    """A pydantic error as one message naming each bad field and what is allowed."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(TaskSpec.model_fields))
            parts.append(f"{loc}: unknown field (allowed: {allowed})")
        else:
            parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})"[:300])
    return SpecError("; ".join(parts))


class Session:
    """Owns tasks and an event log. Obtain one with ``Supervisor.open_session``."""

    def __init__(self, sup: Supervisor, session_id: str, events: EventLog, created_at: float):
        self._sup = sup
        self.session_id = session_id
        self.created_at = created_at
        self._log = events
        self._runners: dict[str, TaskRunner] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended = False
        self._ending: asyncio.Task[None] | None = None
        self._network: asyncio.Task[None] | None = None
        self._pools: dict[str, WarmPool] = {}
        #: Digests of the API tokens minted for this session (the daemon persists them).
        self.token_digests: list[str] = []
        self.log = log.bind(session_id=session_id)
        self.dir = sup.state_dir / "sessions" / session_id

    # -- properties ------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """True once ``end()`` has been called."""
        return self._ended

    @property
    def event_log(self) -> EventLog:
        return self._log

    @property
    def network_name(self) -> str:
        return f"sbx-{self.session_id}-{self._sup.instance_id[:8]}"

    def _runner(self, task_id: str) -> TaskRunner:
        try:
            return self._runners[task_id]
        except KeyError:
            raise TaskNotFound(task_id) from None

    def _check_open(self) -> None:
        if self._ended:
            raise SessionEnded(f"session {self.session_id!r} has ended; open a new session")

    # -- tasks -------------------------------------------------------------------------

    async def start(self, spec: TaskSpec | dict[str, Any]) -> TaskInfo:
        """Validate against the policy and launch; returns at once with id and output path.

        Bad specs raise SpecError/PolicyError; an unreachable engine raises EngineUnavailable;
        problems found while launching (missing image, unusable runtime) end the task with a
        ``task.failed`` event.
        """
        self._check_open()
        if not isinstance(spec, TaskSpec):
            try:
                spec = TaskSpec.model_validate(spec)
            except ValidationError as exc:
                raise spec_error(exc) from exc
        sup = self._sup
        policy = sup.policies.get(spec.policy)
        eff = resolve(spec, policy)
        active = sum(
            1 for r in self._runners.values() if not r.ended and r.eff.policy.name == policy.name
        )
        if active >= policy.session.max_running_tasks:
            raise LimitExceeded(
                f"session {self.session_id!r} already runs {active} tasks under policy "
                f"{policy.name!r} (session.max_running_tasks = {policy.session.max_running_tasks})"
            )
        await sup.ensure_engine()
        pooled = None
        if eligible(spec, policy):
            pool = self._pool(policy)
            pooled = pool.take()
        task_id = pooled.task_id if pooled is not None else await self.unique_task_id()
        request = self.build_request(task_id, spec.command, eff, spec.kind)
        output_path = self.dir / "tasks" / f"{task_id}.output"
        prepare = self._prepare_network if policy.network == "bridge" else None
        ctx = self._context(prepare)
        runner = TaskRunner(
            ctx,
            task_id=task_id,
            session_id=self.session_id,
            spec=spec,
            eff=eff,
            request=request,
            output_path=output_path,
            pooled=pooled,
        )
        # The intent record comes first: a crash between now and the container's creation is
        # recognised on restart. A state volume that cannot take it refuses the task.
        await sup.check_state_space()
        await self._persist_task("intent", runner.record("intent"))
        self._runners[task_id] = runner
        task = asyncio.create_task(runner.run(), name=f"task-{task_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return runner.info()

    @property
    def supervisor(self) -> Supervisor:
        return self._sup

    def owns(self, task_id: str) -> bool:
        """Whether a container labeled with ``task_id`` belongs to this session (a task, or a
        warm container waiting in a pool)."""
        return task_id in self._runners or any(p.holds(task_id) for p in self._pools.values())

    def task_count(self) -> int:
        """Tasks this session has started (any state)."""
        return len(self._runners)

    def running_count(self) -> int:
        """Tasks of this session that have not ended."""
        return sum(1 for r in self._runners.values() if not r.ended)

    def active_count(self, policy_name: str) -> int:
        """Tasks of this session under ``policy_name`` that have not ended."""
        return sum(
            1 for r in self._runners.values() if not r.ended and r.eff.policy.name == policy_name
        )

    def build_request(
        self, task_id: str, command: str, eff: Effective, kind: str
    ) -> ContainerRequest:
        """The container for one task of this session, hardened as its policy says."""
        sup = self._sup
        policy = eff.policy
        network = self.network_name if policy.network == "bridge" else "none"
        return container_request(
            name=f"sbx-{task_id}",
            command=command,
            eff=eff,
            labels=sup.container_labels(
                session_id=self.session_id,
                task_id=task_id,
                kind=kind,
                policy=policy.name,
                timeout_ms=eff.timeout_ms,
            ),
            network=network,
            workspace=workspace_mount(policy, sup.workspace_roots),
            aliases=[task_id] if network != "none" else None,
        )

    def _pool(self, policy: Policy) -> WarmPool:
        pool = self._pools.get(policy.name)
        if pool is None:
            pool = self._pools[policy.name] = WarmPool(self, policy)
        return pool

    async def prewarm(self, policy_name: str = "default") -> int:
        """Fill this session's warm pool for a policy now (its ``warm_pool`` size); returns
        how many containers are ready. Tasks then skip container create and start."""
        self._check_open()
        policy = self._sup.policies.get(policy_name)
        if policy.warm_pool <= 0:
            raise PolicyError(
                f"policy {policy_name!r} has warm_pool = 0; set warm_pool in its file to use a pool"
            )
        await self._sup.ensure_engine()
        pool = self._pool(policy)
        pool.refill()
        await pool.wait_filled()
        return pool.size

    def _context(self, prepare: Any = None) -> RunnerContext:
        sup = self._sup
        return RunnerContext(
            backend=sup.backend,
            io=sup.io,
            emit=self._log.emit,
            caught_up=self._log.caught_up,
            persist=self._persist_task,
            watch=sup.stall_watcher,
            prepare_network=prepare,
            check_runtime=sup.check_runtime,
            check_image=sup.check_image,
            task_events=self._task_events,
            stored_seq=lambda: self._log.last_seq,
            find_container=sup.find_container,
            extra={"live_restore": sup.live_restore},
        )

    async def _task_events(self, task_id: str, types: tuple[str, ...]) -> list[BaseEvent]:
        await self._log.caught_up()
        rows = await self._sup.store.task_events(self.session_id, task_id, types)
        return [parse_event(r) for r in rows]

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
                name=f"sbx-{task_id}",
                command=record.spec.command,
                eff=eff,
                labels=self._sup.container_labels(session_id=self.session_id, task_id=task_id),
                network="none",
                workspace=None,
            )
        prepare = self._prepare_network if policy.network == "bridge" else None
        runner = TaskRunner.from_record(
            self._context(prepare),
            record,
            eff=eff,
            request=request,
            output_path=self.dir / "tasks" / f"{task_id}.output",
        )
        self._runners[task_id] = runner
        if not runner.ended:
            task = asyncio.create_task(runner.resume(record.stage), name=f"task-{task_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return runner

    async def unique_task_id(self) -> str:
        while True:
            task_id = new_task_id()
            if task_id not in self._runners and not await self._sup.store.task_exists(task_id):
                return task_id

    async def _persist_task(self, stage: str, record: TaskRecord) -> None:
        await self._sup.store.put_task(
            record.info.task_id, self.session_id, stage, record.model_dump_json()
        )

    async def _prepare_network(self) -> None:
        if self._network is None:
            self._network = asyncio.create_task(
                self._sup.backend.ensure_network(
                    self.network_name, self._sup.container_labels(session_id=self.session_id)
                )
            )
        await asyncio.shield(self._network)

    async def get(self, task_id: str) -> TaskInfo:
        """Current snapshot of one task."""
        return self._runner(task_id).info()

    async def list(self, kind: Kind | None = None, *, active_only: bool = False) -> list[TaskInfo]:
        """Tasks of this session, oldest first; ``active_only`` drops ended ones."""
        out = []
        for runner in self._runners.values():
            if kind is not None and runner.spec.kind != kind:
                continue
            if active_only and runner.ended:
                continue
            out.append(runner.info())
        return out

    async def read_output(self, task_id: str, offset: int = 0, limit: int = 65536) -> OutputSlice:
        """Bytes ``[offset, offset+limit)`` of the output file, with ``next_offset`` and ``eof``."""
        runner = self._runner(task_id)
        if offset < 0:
            raise SpecError(f"offset: must be >= 0 (got {offset})")
        if not 1 <= limit <= MAX_READ:
            raise SpecError(f"limit: must be between 1 and {MAX_READ} (got {limit})")
        return await read_slice(
            runner.output_path, offset, limit, ended=runner.ended, io=self._sup.io
        )

    async def tail(self, task_id: str, chars: int = 4000) -> str:
        """The last ``chars`` characters of output (UTF-8, invalid bytes replaced)."""
        runner = self._runner(task_id)
        if not 1 <= chars <= 1_000_000:
            raise SpecError(f"chars: must be between 1 and 1000000 (got {chars})")
        return await read_tail(runner.output_path, chars, self._sup.io)

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
        raw = data.encode("utf-8") if isinstance(data, str) else data
        await self._runner(task_id).send_input(raw, eof=eof)

    async def wait_for(
        self, task_id: str, pattern: str, timeout_s: float = 30.0, from_offset: int = 0
    ) -> PatternMatch:
        """The first output line matching the regex ``pattern`` (also lines printed earlier)."""
        runner = self._runner(task_id)
        try:
            compiled = re.compile(pattern.encode("utf-8"))
        except re.error as exc:
            raise SpecError(f"pattern: not a valid regular expression ({exc})") from exc
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
        await asyncio.gather(*(p.aclose() for p in self._pools.values()))
        stopping = [r for r in self._runners.values() if not r.ended]
        for runner in stopping:
            runner.request_stop("session_ended")
        waiting = [asyncio.ensure_future(r.done.wait()) for r in self._runners.values()]
        if waiting:
            grace = max((r.eff.grace_s for r in stopping), default=0.0)
            _, late = await asyncio.wait(waiting, timeout=grace + self._sup.end_timeout_s)
            for w in late:
                w.cancel()
        for runner in self._runners.values():
            if not runner.done.is_set():
                # The engine does not answer: the session still ends now; the container is
                # removed in the background once the engine is back (or reaped later).
                await runner.abandon(
                    "the engine did not answer while the session ended; the container is "
                    "removed once the engine is back"
                )
        if self._network is not None:
            with contextlib.suppress(Exception):
                await self._network
            with contextlib.suppress(Exception):
                await self._sup.backend.remove_network(self.network_name)
        self._log.emit(SessionEndedEvent(session_id=self.session_id, tasks_stopped=len(stopping)))
        await self._log.aclose()
        with contextlib.suppress(Exception):
            await self._sup.store.put_session(self.session_id, self.created_at, time.time())
        self.log.info("session_ended", tasks_stopped=len(stopping))
        self._sup._forget(self)

    async def release(self) -> None:
        """Supervisor shutdown without stopping tasks: let go of containers, keep records
        (idle pool containers are removed: they are not tasks)."""
        await asyncio.gather(*(p.aclose() for p in self._pools.values()))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._log.aclose(sink_timeout=2.0)


def session_dir(state_dir: Path, session_id: str) -> Path:
    return state_dir / "sessions" / session_id
