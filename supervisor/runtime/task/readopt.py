"""Re-adoption after a restart: pick a task up exactly where the last supervisor left it.

What happens depends on how far the task got: never created (run it now), created but not
started (start it), ran (re-attach and capture from where the file ends), or already
given its terminal event (finish quietly). Nothing is emitted twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

from supervisor.core import task_events
from supervisor.core.container import ContainerState
from supervisor.core.errors import EngineUnavailable, SupervisorError
from supervisor.core.events import TaskFailed, TaskOutput, TaskOutputSuppressed, TaskStopped
from supervisor.core.labels import LABEL_KIND
from supervisor.core.models import POOL_NO_COMMAND
from supervisor.core.task_state import Stage, TaskIdentity, TaskState
from supervisor.core.text import parse_engine_time
from supervisor.engine.base import AttachedStream
from supervisor.runtime.task.capture import Capture, MonitorFeed
from supervisor.runtime.task.launch import Launcher
from supervisor.runtime.task.ports import TaskPorts
from supervisor.runtime.task.stopper import Stopper
from supervisor.runtime.task.supervise import Supervision
from supervisor.state.output import read_range

#: How long re-adoption waits for a warm container's pool script to end on its EOF.
_POOL_EXIT_WAIT_S = 3.0


class Adoptable(Protocol):
    """The parts of a task runner re-adoption drives."""

    ident: TaskIdentity
    ports: TaskPorts
    state: TaskState
    capture: Capture
    monitor: MonitorFeed | None
    launcher: Launcher
    supervision: Supervision
    stopper: Stopper
    final: asyncio.Event
    done: asyncio.Event

    @property
    def task_id(self) -> str: ...

    @property
    def log(self) -> Any: ...

    async def persist(self, stage: Stage | None = None) -> None: ...

    def attach_stdin(self, stream: AttachedStream) -> None: ...

    async def run_fresh(self) -> None: ...

    async def after_start(self) -> None: ...

    async def supervise(self, meanwhile: Coroutine[Any, Any, None] | None = None) -> None: ...

    async def finish_after_exit(self, state: ContainerState | None) -> None: ...

    async def finish_unstarted(self) -> None: ...

    async def finish_lost(self, detail: str) -> None: ...

    async def finish_failed(self, exc: SupervisorError) -> None: ...


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def readopt(runner: Adoptable, stage: str) -> None:
    """Main coroutine of a re-adopted task (replaces ``run``)."""
    loop = asyncio.get_running_loop()
    state = runner.state
    capture = runner.capture
    out = capture.out
    # The file is the truth about what was written before the crash.
    size = await loop.run_in_executor(runner.ports.io, _file_size, capture.path)
    growth = max(0, size - state.capture.file_size)
    await out.open(task_bytes=out.task_bytes)
    if not out.dropped:
        out.task_bytes += growth
        state.capture.stdout_bytes += growth
    out.file_size = size
    if await _terminal_already_logged(runner):
        return
    finder = runner.ports.find_container
    found_by_label = False
    if state.container_id is None and finder is not None:
        delay = 0.2
        while True:
            try:
                state.container_id = await finder(runner.task_id)
                break
            except EngineUnavailable as exc:  # away: ask again once it answers
                runner.log.info("readopt_find_waiting", error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        found_by_label = state.container_id is not None
    if state.container_id is not None and await _warm_and_unused(runner, found_by_label):
        # A warm container the command never reached: run the task as accepted.
        runner.log.info("readopt_unused_warm_container")
        await runner.stopper.remove()
        state.container_id = None
    if state.container_id is None:
        # Crashed before the container existed: run the task now, as accepted.
        runner.log.info("readopt_create")
        await out.close()
        await runner.run_fresh()
        return
    engine = await runner.supervision.inspect_patiently(state.container_id)
    if engine is None:
        if state.lc.started or stage == "running":
            state.lc.mark_started()
            await runner.finish_lost("the container disappeared while the supervisor was down")
        else:
            await runner.finish_failed(
                SupervisorError("the container disappeared before it started")
            )
        return
    if engine.status == "lost":
        # Its node went away while we were down: what the file holds is all there is.
        state.lc.mark_started()
        await runner.finish_lost(engine.error or "the node of its container was lost")
        return
    if engine.status == "created":
        runner.log.info("readopt_start")
        await _start_created(runner)
        return
    # It ran: pick up its output where the file ends.
    state.mark_readopted(time.time(), loop.time(), parse_engine_time(engine.started_at))
    capture.last_output_mono = loop.time()
    if not await _has_event(runner, "task.started"):
        runner.ports.events.emit(task_events.started(runner.ident))
    await _resume_monitor(runner)
    try:
        runner.supervision.stream = await runner.supervision.reattacher.reattach(state.container_id)
    except EngineUnavailable as exc:
        # The engine went away (or wedged) since the inspect: the capture re-attaches once
        # it answers (as after any dropped stream), and the log fills in what ran meanwhile.
        runner.log.warning("readopt_reattach_deferred", error=str(exc))
        runner.supervision.engine_outage = True
        runner.supervision.stream = None
    runner.log.info("readopted", running=engine.running, skip=capture.skip[1])
    await runner.persist("running")
    if not engine.running:
        # It exited while we were away: collect it (no watchers to arm).
        exit_state = await runner.supervision.run(state.container_id)
        state.ended_mono = loop.time()
        await runner.finish_after_exit(exit_state)
        return
    await runner.supervise()


async def _warm_and_unused(runner: Adoptable, found_by_label: bool) -> bool:
    """Whether the task's container came from a warm pool and never ran its command: the
    record did not name it yet (it is bound, then the command is written), or its pool
    script ended on the crash's EOF (POOL_NO_COMMAND) having printed nothing."""
    cid = runner.state.container_id
    assert cid is not None
    backend = runner.ports.backend
    engine = await runner.supervision.inspect_patiently(cid)
    if engine is None or engine.labels.get(LABEL_KIND) != "pooled":
        return False
    if found_by_label:
        return True
    if engine.running:
        # The crash closed its stdin: a pool script still waiting ends at once.
        try:
            engine = await asyncio.wait_for(backend.wait(cid), _POOL_EXIT_WAIT_S)
        except TimeoutError:
            return False  # running longer than that: it runs the command
    if engine.exit_code != POOL_NO_COMMAND:
        return False
    async for segments in backend.logs(cid, tail=1):
        if segments:
            return False
    return True


async def _start_created(runner: Adoptable) -> None:
    """A container created but never started before the crash: attach and start it."""
    try:
        stream = await runner.launcher.attach_created()
        runner.supervision.stream = stream
        runner.attach_stdin(stream)
        if runner.state.lc.stop_reason is not None:
            await runner.finish_unstarted()
            return
        await runner.launcher.start()
    except SupervisorError as exc:
        await runner.finish_failed(exc)
        return
    await runner.after_start()


async def _has_event(runner: Adoptable, kind: str) -> bool:
    return bool(await runner.ports.events.task_events(runner.task_id, (kind,)))


async def _terminal_already_logged(runner: Adoptable) -> bool:
    """Crashed after the terminal event was stored: finish quietly (no second event)."""
    events = await runner.ports.events.task_events(runner.task_id, ("task.stopped", "task.failed"))
    if not events:
        return False
    ev = events[-1]
    assert isinstance(ev, TaskStopped | TaskFailed)
    runner.state.end_from_event(ev)
    await runner.capture.out.close()
    runner.final.set()
    await runner.persist("ended")
    await asyncio.shield(runner.stopper.remove())
    runner.done.set()
    return True


async def _resume_monitor(runner: Adoptable) -> None:
    """Continue ordinals exactly; re-send lines captured but not delivered before the
    crash (consumers de-duplicate by ordinal anyway)."""
    monitor = runner.monitor
    if monitor is None:
        return
    delivered = 0
    for ev in await runner.ports.events.task_events(
        runner.task_id, ("task.output", "task.output_suppressed")
    ):
        if isinstance(ev, TaskOutput):
            delivered = max(delivered, ev.ordinal)
        elif isinstance(ev, TaskOutputSuppressed):
            delivered = max(delivered, ev.last_ordinal)
    cap = runner.state.capture
    monitor.resume(ordinal=cap.monitor_ordinal, offset=cap.monitor_offset, floor=delivered)
    out = runner.capture.out
    if out.dropped:
        return  # the file no longer mirrors the stream past the cap
    loop = asyncio.get_running_loop()
    pending = await loop.run_in_executor(
        runner.ports.io, read_range, runner.capture.path, cap.monitor_offset, out.task_bytes
    )
    if pending:
        monitor.feed(pending, loop.time())
