"""Re-attach to a container that may still be running, losing and repeating nothing.

Attaching with the log replayed first has a window: the engine replays its log, then
subscribes to live output, and a line printed in between reaches neither. So attach live
first, pause the container, let what is in flight arrive, store the part of the log from
before the live stream began, thaw, and go on with the live stream. Where the live stream
begins in the log follows from the engine's line-by-line log copier
(supervisor/core/resync.py) and is checked against the log's last messages.
"""

from __future__ import annotations

import asyncio
import itertools

from structlog.stdlib import BoundLogger

from supervisor.core.container import Segment
from supervisor.core.errors import EngineError, SupervisorError
from supervisor.core.faults import REATTACH_PAUSED, crash_point
from supervisor.core.resync import (
    COPIER_CHUNK,
    Bulk,
    Message,
    after_anchor,
    drop_known,
    live_cut,
    split_stamp,
    stream_of,
)
from supervisor.engine.base import AttachedStream, Backend
from supervisor.runtime.task.capture import Capture

#: How long the live stream must be quiet after the pause (and at least, and at most, how
#: long to wait for it) before the engine's log is read.
QUIET_S = 0.05
SETTLE_MIN_S = 0.1
SETTLE_MAX_S = 2.0
#: The longest log tail (in messages) and the most bytes read after the bulk read, with the
#: container paused, before falling back to reading the whole log.
TAIL_MAX = 1 << 16
AFTER_MAX = 64 << 20


class Reattacher:
    """Re-attaches one task's container; stores what the log adds through ``capture``.
    ``thawed`` is cleared while the container is held paused (signals wait for it)."""

    def __init__(
        self, backend: Backend, capture: Capture, thawed: asyncio.Event, log: BoundLogger
    ) -> None:
        self.backend = backend
        self.capture = capture
        self.thawed = thawed
        self.log = log

    async def attach_replay(self, cid: str) -> AttachedStream:
        """Attach with the engine's log replayed first; skip what is already stored."""
        await self.capture.set_replay_skip()
        return await self.backend.attach(cid, stdin=False, logs=True)

    async def store_log_rest(self, cid: str) -> None:
        """Store what the (stopped) container's log holds beyond the file, read without
        following: the read ends at the log's end."""
        await self.capture.set_replay_skip()
        skip, self.capture.skip = self.capture.skip, {1: 0, 2: 0}
        async for segments in self.backend.logs(cid):
            rest = drop_known(skip, segments)
            if rest:
                await self.capture.consume(rest)

    async def reattach(self, cid: str) -> AttachedStream:
        """A live stream of the container's output, with everything before it stored."""
        backend = self.backend
        state = await backend.inspect(cid)
        if state is not None and state.status == "paused":
            # A re-attach cut short by a supervisor crash left it paused.
            self.log.warning("reattach_unpausing")
            await backend.unpause(cid)
        elif state is None or not state.running:
            # Stopped: its log is complete, so a replay holds everything.
            return await self.attach_replay(cid)
        if backend.capabilities.exact_replay:
            # The replay and the live part come on one connection: nothing falls between.
            return await self.attach_replay(cid)
        await self.capture.set_replay_skip()
        skip, self.capture.skip = self.capture.skip, {1: 0, 2: 0}
        # What the log holds already is stored while the command runs; only what it adds
        # from here on is read with the container paused.
        bulk = await self._store_log_bulk(cid, skip)
        live = await backend.attach(cid, stdin=False, logs=False)
        held: list[Segment] = []
        try:
            self.thawed.clear()
            try:
                try:
                    await backend.pause(cid)
                except EngineError as exc:
                    # It stopped meanwhile (then a replay is exact) or cannot be paused.
                    self.log.info("reattach_without_pause", error=str(exc))
                    await live.aclose()
                    return await self.attach_replay(cid)
                loop = asyncio.get_running_loop()
                paused_at = loop.time()
                try:
                    held, ended = await self._settle(live)
                    from_log = await self._store_log_before(cid, held, bulk, ended=ended)
                finally:
                    await asyncio.shield(self._thaw(cid))
                self.log.info(
                    "reattached",
                    from_log=bulk.written + from_log,
                    live_bytes=sum(len(p) for _, p in held),
                    paused_ms=round((loop.time() - paused_at) * 1000),
                )
            finally:
                self.thawed.set()
        except BaseException:
            await live.aclose()
            raise
        if held:
            await self.capture.consume(held)
        return live

    async def _thaw(self, cid: str) -> None:
        delay = 0.1
        for _ in range(8):
            try:
                await self.backend.unpause(cid)
                return
            except SupervisorError as exc:
                self.log.warning("reattach_unpause_failed", error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        # Left paused: the next re-attach (the stream ends when the engine goes away) or
        # re-adoption finds it paused and thaws it first.
        self.log.error("reattach_left_paused", container=cid[:12])

    async def _settle(self, live: AttachedStream) -> tuple[list[Segment], bool]:
        """After the pause: collect the live output still in flight until it goes quiet.
        Returns it and whether the stream ended (the container stopped)."""
        loop = asyncio.get_running_loop()
        held: list[Segment] = []
        began = loop.time()
        while loop.time() - began < SETTLE_MAX_S:
            try:
                segments = await asyncio.wait_for(live.read(), QUIET_S)
            except TimeoutError:
                if loop.time() - began >= SETTLE_MIN_S:
                    break
                continue
            if segments is None:
                return held, True
            held.extend((kind, bytes(payload)) for kind, payload in segments)
        return held, False

    async def _store_log_bulk(self, cid: str, skip: dict[int, int]) -> Bulk:
        """Before the pause: store what the engine's log holds beyond the file (``skip``:
        what the file holds, in log bytes) and note the last message's time as an anchor."""
        bulk = Bulk(skip)
        async for segments in self.backend.logs(cid, timestamps=True):
            out = bulk.take(segments)
            if out:
                await self.capture.consume(out)
            if bulk.stopped:
                # Not stamped as expected: what was taken is stored; the rest is read
                # with the container paused.
                self.log.warning("reattach_unstamped_log")
                break
        return bulk

    async def _stamped_tail(self, cid: str, messages: int) -> list[Message] | None:
        """The log's last ``messages`` messages with their times (None: unstamped, or
        more than the bytes a paused read may hold)."""
        out: list[Message] = []
        size = 0
        async for segments in self.backend.logs(cid, tail=messages, timestamps=True):
            for kind, frame in segments:
                message = split_stamp(kind, bytes(frame))
                if message is None or size > AFTER_MAX:
                    return None
                size += len(message[2])
                out.append(message)
        return out

    async def _log_after(self, cid: str, bulk: Bulk, messages: int) -> list[Message] | None:
        """With the container paused: the messages the log gained after the bulk read, once
        two reads agree (the copier may still be writing what it held before the pause).
        None when that cannot be told from the messages' times."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + SETTLE_MAX_S
        previous: list[Message] | None = None
        tail = max(messages, 64)
        while True:
            stamped = await self._stamped_tail(cid, tail)
            if stamped is None or any(k == 2 for k, _, _ in stamped):
                return None
            if any(a[1] > b[1] for a, b in itertools.pairwise(stamped)):
                return None  # the engine's clock went back: times cannot place the rest
            whole = len(stamped) < tail
            after = after_anchor(stamped, bulk.anchor, bulk.seen, whole_log=whole)
            if after is None:
                if whole or tail >= TAIL_MAX:
                    return None
                tail *= 4
                previous = None
                continue
            if sum(len(p) for _, _, p in after) > AFTER_MAX:
                return None
            if stamped == previous or loop.time() > give_up:
                return after
            previous = stamped
            await asyncio.sleep(QUIET_S)

    async def _log_tail(self, cid: str, messages: int, *, timestamps: bool) -> dict[int, bytes]:
        parts: dict[int, list[bytes]] = {1: [], 2: []}
        async for segments in self.backend.logs(cid, tail=messages, timestamps=timestamps):
            for kind, payload in segments:
                parts[stream_of(kind)].append(bytes(payload))
        return {k: b"".join(v) for k, v in parts.items()}

    def _cut(
        self, live: dict[int, bytes], tails: dict[int, bytes], *, ended: bool
    ) -> dict[int, int]:
        cut, unverified = live_cut(live, tails, ended=ended)
        for k in unverified:
            self.log.warning("reattach_unverified", stream=k, live_bytes=len(live[k]))
        return cut

    async def _store_log_before(
        self, cid: str, held: list[Segment], bulk: Bulk, *, ended: bool
    ) -> int:
        """With the container paused: write the engine's log from where the bulk read (or
        the file) ends up to where the live bytes ``held`` begin. Returns how many bytes
        that was."""
        crash_point(REATTACH_PAUSED)
        live = {k: b"".join(bytes(p) for kind, p in held if stream_of(kind) == k) for k in (1, 2)}
        messages = sum(d.count(b"\n") + len(d) // COPIER_CHUNK + 2 for d in live.values())
        after = await self._log_after(cid, bulk, messages) if bulk.anchored else None
        if after is not None:
            rest = b"".join(p for _, _, p in after)
            cut = self._cut(live, {1: rest, 2: b""}, ended=ended)
            rest = rest[bulk.skip[1] : len(rest) - cut[1]]
            if rest:
                await self.capture.consume([(1, rest)])
            return len(rest)
        self.log.info("reattach_reads_whole_log")
        return await self._store_whole_log(cid, live, bulk, messages, ended=ended)

    async def _store_whole_log(
        self, cid: str, live: dict[int, bytes], bulk: Bulk, messages: int, *, ended: bool
    ) -> int:
        """The fallback: read the whole log with the container paused."""
        loop = asyncio.get_running_loop()
        # Wait until two reads of the log's last messages (each stamped with its time) agree.
        previous: dict[int, bytes] | None = None
        give_up = loop.time() + SETTLE_MAX_S
        while True:
            stamped = await self._log_tail(cid, messages, timestamps=True)
            if stamped == previous or loop.time() > give_up:
                break
            previous = stamped
            await asyncio.sleep(QUIET_S)
        tails = await self._log_tail(cid, messages, timestamps=False)
        cut = self._cut(live, tails, ended=ended)
        # The log minus what the file and the bulk read hold (skip) and minus what the
        # live bytes hold (cut).
        skip = {k: bulk.consumed[k] + bulk.skip[k] for k in (1, 2)}
        pending = {1: bytearray(), 2: bytearray()}
        written = 0
        async for segments in self.backend.logs(cid):
            out: list[Segment] = []
            for kind, data in drop_known(skip, segments):
                buf = pending[stream_of(kind)]
                buf += data
                excess = len(buf) - cut[stream_of(kind)]
                if excess > 0:
                    out.append((kind, bytes(buf[:excess])))
                    del buf[:excess]
            if out:
                written += sum(len(p) for _, p in out)
                await self.capture.consume(out)
        return written
