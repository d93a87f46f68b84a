"""A running task's timers: its deadline, the idle timeout, periodic polls, and its place
in the stall watcher."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from supervisor.core import task_events
from supervisor.core.lifecycle import StopRequest
from supervisor.core.resolve import Effective
from supervisor.core.task_state import TaskState
from supervisor.runtime.task.capture import Capture
from supervisor.runtime.task.ports import EventPort, StallPort, StallSignal
from supervisor.state.output import read_rendered_tail


class Watchers:
    """Armed once the command runs (or is re-adopted), disarmed when it ends. It is also
    what the stall watcher sees of the task (``runtime.task.ports.Watchable``)."""

    def __init__(
        self,
        state: TaskState,
        eff: Effective,
        capture: Capture,
        events: EventPort,
        io: Executor,
        *,
        request_stop: Callable[[StopRequest], bool],
        stalls: StallPort | None,
    ) -> None:
        self.state = state
        self.eff = eff
        self.capture = capture
        self.events = events
        self.io = io
        self.request_stop = request_stop
        self.stalls = stalls
        self._timers: list[asyncio.TimerHandle] = []
        self._poller: asyncio.Task[None] | None = None
        self._bytes_at_last_poll = 0

    def arm(self) -> None:
        loop = asyncio.get_running_loop()
        state = self.state
        if state.deadline_at is not None:
            # Re-armed from the persisted wall-clock deadline after a restart, never restarted.
            remaining = max(0.0, state.deadline_at - time.time())
            self._timers.append(loop.call_later(remaining, self.request_stop, "timeout"))
        if self.eff.idle_timeout_ms is not None:
            self._timers.append(loop.call_later(self.eff.idle_timeout_ms / 1000, self._idle))
        if self.eff.poll_every_s is not None:
            self._poller = asyncio.create_task(self._poll_loop(self.eff.poll_every_s))
        if self.stalls is not None and self.eff.stall_after_s is not None:
            self.stalls.register(self)

    def disarm(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._poller is not None:
            self._poller.cancel()
        if self.stalls is not None:
            self.stalls.unregister(self.state.ident.task_id)

    # -- Watchable ---------------------------------------------------------------------

    @property
    def task_id(self) -> str:
        return self.state.ident.task_id

    @property
    def container_id(self) -> str | None:
        return self.state.container_id

    @property
    def runtime(self) -> str:
        return self.eff.policy.runtime

    @property
    def stall_after_s(self) -> float | None:
        return self.eff.stall_after_s

    @property
    def output_path(self) -> Path:
        return self.capture.path

    @property
    def watching(self) -> bool:
        lc = self.state.lc
        return lc.started and not lc.ended and lc.stop_reason is None and self.state.stdin_open

    @property
    def last_output_mono(self) -> float:
        return self.capture.last_output_mono

    @property
    def started_mono(self) -> float:
        return self.state.started_mono or 0.0

    async def report_stall(self, signal: StallSignal, waiting_s: float) -> None:
        """Emit one ``task.stalled`` for the current episode (called by the stall watcher)."""
        lc = self.state.lc
        if lc.ended or lc.stop_reason is not None:
            return
        # What the agent reads: the prompt as a terminal shows it (detection saw raw bytes).
        tail = await read_rendered_tail(self.capture.path, 2000, self.io)
        if lc.ended:
            return
        self.state.stalled = True
        self.capture.log.info("task_stalled", signal=signal, waiting_s=round(waiting_s, 2))
        self.events.emit(task_events.stalled(self.state.ident, signal, tail, waiting_s))

    # -- timers --------------------------------------------------------------------------

    def _idle(self) -> None:
        if self.state.lc.ended or self.eff.idle_timeout_ms is None:
            return
        idle_s = self.eff.idle_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self.capture.last_output_mono
        if quiet >= idle_s:
            self.request_stop("idle_timeout")
        else:
            self._timers.append(loop.call_later(idle_s - quiet, self._idle))

    async def _poll_loop(self, every_s: float) -> None:
        state = self.state
        loop = asyncio.get_running_loop()
        while not state.lc.ended:
            await asyncio.sleep(every_s)
            if state.lc.ended or state.lc.stop_reason is not None:
                return
            counts = self.capture.counts()
            new = counts.task_bytes + counts.dropped - self._bytes_at_last_poll
            if new == 0 and self.eff.poll_only_on_change:
                continue
            self._bytes_at_last_poll += new
            tail = await read_rendered_tail(self.capture.path, self.eff.poll_tail_chars, self.io)
            if state.lc.ended:
                return
            self.events.emit(
                task_events.poll(
                    state.ident, running_ms=state.running_ms(loop.time()), tail=tail, new_bytes=new
                )
            )
