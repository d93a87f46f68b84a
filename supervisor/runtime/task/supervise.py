"""While the command runs: capture its output and collect its exit, riding out engine
outages and dropped connections (re-attaching without losing or repeating a byte)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from structlog.stdlib import BoundLogger

from supervisor.core.container import ContainerState
from supervisor.core.errors import EngineError, EngineUnavailable, SupervisorError
from supervisor.core.faults import crash_point
from supervisor.core.resync import engine_log_bytes
from supervisor.engine.base import AttachedStream, Backend
from supervisor.runtime.task.capture import Capture
from supervisor.runtime.task.reattach import Reattacher
from supervisor.state.output import read_range

#: After the container exits, how long the output stream may go without delivering
#: anything before its drain is given up (a slow drain that still delivers is waited for:
#: a loaded machine, or a long log replayed after an outage, is slow, not stuck).
DRAIN_S = 10.0


class Supervision:
    """Owns the task's current attach stream from the start until it is closed."""

    def __init__(
        self,
        backend: Backend,
        capture: Capture,
        reattacher: Reattacher,
        exited: asyncio.Event,
        log: BoundLogger,
        *,
        on_stream_lost: Callable[[], None],
    ) -> None:
        self.backend = backend
        self.capture = capture
        self.reattacher = reattacher
        self.exited = exited
        self.log = log
        self._on_stream_lost = on_stream_lost
        self.stream: AttachedStream | None = None
        #: Set once the engine stopped answering while this task ran.
        self.engine_outage = False
        #: A stream ended without a re-attach after it: a normal end, or a connection that
        #: dropped just before the exit (then the last output is only in the engine's log).
        #: Checked against the log's last message after the exit.
        self._maybe_short = False

    async def run(
        self, cid: str, *, meanwhile: Awaitable[None] | None = None
    ) -> ContainerState | None:
        """Capture until the output ends, then collect the exit. None: the container is
        gone. Output produced during an outage comes from the engine's log. ``meanwhile``
        (e.g. recording the start) is awaited once the capture runs, so the first output
        reaches the file without waiting for it."""
        capture = asyncio.create_task(self._capture_all(cid), name="capture")
        try:
            if meanwhile is not None:
                await meanwhile
            state = await self._wait_exit(cid)
        except BaseException:
            capture.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await capture
            raise
        self.exited.set()
        await self._drain(capture, "capture_drain_timeout")
        if state is not None and (self.engine_outage or self._maybe_short):
            # The stream may have missed the end: catch up from the engine's log.
            try:
                if self.engine_outage or not await self._ends_like_the_log(cid):
                    await self._catch_up(cid)
            except SupervisorError as exc:
                self.log.warning("catch_up_failed", error=str(exc))
        crash_point("after_exit")
        return state

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def _wait_exit(self, cid: str) -> ContainerState | None:
        """Wait for the container to stop; ride out engine outages (None = container gone)."""
        delay = 0.2
        while True:
            try:
                return await self.backend.wait(cid)
            except EngineUnavailable as exc:
                # Engine away: refused, reset, timed out (each backend's transport says so
                # with this one type). The task runs on (live-restore); wait again.
                if not self.engine_outage:
                    self.log.warning("engine_unavailable_while_waiting", error=str(exc))
                self.engine_outage = True
            except EngineError as exc:
                try:
                    state = await self.backend.inspect(cid)
                except EngineUnavailable as again:
                    # The engine went away between the two calls: not a vanished container.
                    self.log.info("inspect_after_wait_failed", error=str(again))
                    self.engine_outage = True
                except SupervisorError as again:
                    self.log.info("inspect_after_wait_failed", error=str(again))
                    self.log.warning("container_vanished", error=str(exc))
                    return None
                else:
                    if state is None:
                        self.log.warning("container_vanished", error=str(exc))
                        return None
                    if not state.running:
                        return state
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _capture_all(self, cid: str) -> None:
        """Read the attached stream; after it ends early (engine lost, connection dropped),
        re-attach and skip what is already captured."""
        empty_reattaches = 0
        while True:
            before = self.capture.received
            if self.stream is not None:
                await self.capture.run(self.stream)
                await self.close()
                self._on_stream_lost()
                # Ended with the command, or dropped just before it exited (then its last
                # output is only in the log): told apart after the exit, from the log's end.
                self._maybe_short = True
            if self.exited.is_set():
                return
            got = self.capture.received - before
            empty_reattaches = empty_reattaches + 1 if got == 0 else 0
            if not await self._still_running(cid) or self.exited.is_set():
                return
            if empty_reattaches >= 2:
                # The command closed its stdout and stderr but keeps running: nothing more
                # will come; its exit is still collected.
                return
            self.log.info("capture_reattach")
            try:
                self.stream = await self.reattacher.reattach(cid)
            except SupervisorError as exc:
                self.log.warning("reattach_failed", error=str(exc))
                self.engine_outage = True
                await asyncio.sleep(0.5)

    async def _still_running(self, cid: str) -> bool:
        """After a stream ended: whether the container still runs (a re-attach is due).
        Outages are waited out; an error answer (say a 500) is asked again a moment later,
        as the exit wait, running meanwhile, settles what became of the container."""
        delay = 0.2
        while not self.exited.is_set():
            try:
                state = await self.inspect_patiently(cid)
            except SupervisorError as exc:
                self.log.info("capture_inspect_failed", error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            return state is not None and state.running
        return False

    async def inspect_patiently(self, cid: str) -> ContainerState | None:
        """The container's state, waiting out engine outages (None: gone, or it exited)."""
        delay = 0.2
        while not self.exited.is_set():
            try:
                return await self.backend.inspect(cid)
            except EngineUnavailable:
                self.engine_outage = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        return None

    async def _ends_like_the_log(self, cid: str) -> bool:
        """Whether the output file ends with the engine log's last message (as the log
        stores it): then the stream missed nothing. One small read at the log's end."""
        out = self.capture.out
        if out.dropped or out.gap_bytes:
            return True  # the file no longer mirrors the stream; nothing to compare
        last = b"".join(
            [
                bytes(p)
                for segments in [s async for s in self.backend.logs(cid, tail=1)]
                for _, p in segments
            ]
        )
        if not last:
            return True
        await out.flush()
        size = out.file_size
        start = max(0, size - 3 * len(last) - 4)
        loop = asyncio.get_running_loop()
        end = await loop.run_in_executor(
            self.capture.io, read_range, self.capture.path, start, size
        )
        return engine_log_bytes(end).endswith(last)

    async def _catch_up(self, cid: str) -> None:
        """After an outage and the container's exit: fetch output the stream missed."""
        stream = await self.reattacher.attach_replay(cid)
        try:
            replay = asyncio.create_task(self.capture.run(stream), name="catch-up")
            if await self._drain(replay, "catch_up_stalled"):
                return
        finally:
            await stream.aclose()
        # The replay stopped delivering without ending (seen on a loaded machine just after
        # a live-restore: three replays stalled at once, short of their last lines). The
        # exited container's log, read without following, always ends: the rest from it.
        await self.reattacher.store_log_rest(cid)

    async def _drain(self, reading: asyncio.Task[None], what: str) -> bool:
        """Wait for ``reading`` (a stream read to its end) while it makes progress; give
        it up (logged as ``what``) after ``DRAIN_S`` without a read. True: it ended."""
        seen = -1
        try:
            while seen != self.capture.reads:
                seen = self.capture.reads
                try:
                    await asyncio.wait_for(asyncio.shield(reading), DRAIN_S)
                    return True
                except TimeoutError:
                    continue
        except asyncio.CancelledError:
            reading.cancel()
            raise
        self.log.warning(what, reads=seen)
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        return False


def lost_detail(state: ContainerState | None, *, outage: bool, stopping: bool) -> str | None:
    """Why a container that exited counts as lost (None: it ended on its own terms).
    ``outage``: the engine restarted meanwhile without live-restore; ``stopping``: we were
    stopping it anyway, so its exit is the stop's."""
    if state is None:
        return "the container disappeared"
    if stopping:
        return None
    if state.status == "lost":
        # A multi-node engine gave the container up with its node (down, drained, its
        # engine restarted): the output up to then is stored; say which node.
        return state.error or "the node of its container was lost"
    if outage:
        return (
            "the engine restarted without live-restore and stopped the container "
            f"(exit code {state.exit_code})"
        )
    return None
