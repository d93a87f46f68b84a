"""Routes over every session the caller may see at once: all their tasks, and one live event
stream that merges theirs (what a dashboard or ``top`` watches, in one connection)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from enum import Enum
from typing import Annotated, Any

from fastapi import FastAPI, Query

from supervisor.core.models import Kind, TaskInfo
from supervisor.interfaces.daemon.auth import Principal
from supervisor.interfaces.daemon.deps import BOOLEAN, Who
from supervisor.interfaces.daemon.engine_feed import EngineFlag, EngineNews
from supervisor.interfaces.daemon.event_routes import (
    KEEP_ALIVE_S,
    EventStreamResponse,
    EventType,
    TypesFilter,
    matching,
    sse_message,
)
from supervisor.interfaces.daemon.task_feed import feed_of, sse_created
from supervisor.runtime.session import Session
from supervisor.runtime.supervisor import Supervisor

#: How often the merged stream looks for sessions opened since it started.
RESCAN_S = 1.0
#: Events held for a slow client, at most; the sessions' followers wait beyond it (each
#: reads its log at its own pace, so a slow client slows only itself).
_QUEUE = 1000
_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "`id: <seq>` (of the event's own session), `event: <type>`, "
        "`data: <event JSON>` per event, `session_id` in the data; comments as keep-alives",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


def visible(sup: Supervisor, who: Principal) -> list[Session]:
    """The open sessions ``who`` may see: all of them for the admin, else its own."""
    return [s for s in sup.sessions() if who.admin or s.session_id == who.session_id]


class _Merged:
    """One follower per visible session, each feeding a shared bounded queue."""

    def __init__(
        self,
        sup: Supervisor,
        who: Principal,
        types: list[EventType] | None,
        engine: EngineNews | None = None,
    ) -> None:
        self.sup = sup
        self.who = who
        self.types = types
        self.engine = engine
        # Messages ready to send: the sessions' events, and tasks just created.
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(_QUEUE)
        self.followers: dict[str, asyncio.Task[None]] = {}
        self.since = time.time()
        self._scanned = False

    async def _follow(self, session: Session, cursor: int, newer_than: float) -> None:
        async for ev in session.events(after_seq=cursor):
            if ev.ts >= newer_than and matching([ev], None, self.types):
                await self.queue.put(sse_message(ev))

    def created(self, info: TaskInfo) -> None:
        """A task just created: sent at once when there is room (else its ``task.started``
        or the client's next full read shows it)."""
        if self.who.admin or info.session_id == self.who.session_id:
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(sse_created(info))

    def scan(self) -> None:
        """Follow sessions not followed yet. Those open when the stream began are read from
        their newest event on; later ones from their first (their events all came after
        the stream began: none is missed between a session's opening and this scan)."""
        sessions = visible(self.sup, self.who)
        open_ids = {s.session_id for s in sessions}
        for sid, task in list(self.followers.items()):
            if task.done() and sid not in open_ids:
                del self.followers[sid]
        for s in sessions:
            if s.session_id in self.followers:
                continue
            if self._scanned:
                cursor, newer_than = 0, self.since
            else:
                cursor, newer_than = s.event_log.last_seq, 0.0
            self.followers[s.session_id] = asyncio.create_task(
                self._follow(s, cursor, newer_than), name=f"merged-events-{s.session_id}"
            )
        self._scanned = True

    async def aclose(self) -> None:
        tasks = list(self.followers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stream(self) -> AsyncIterator[bytes]:
        yield b": connected\n\n"
        quiet = 0.0
        unsubscribe = feed_of(self.sup).subscribe(self.created)
        try:
            while True:
                # Looked at on each turn: at least every RESCAN_S, when the queue is idle.
                if self.engine is not None and (news := self.engine.poll()) is not None:
                    yield news
                self.scan()
                try:
                    ev = await asyncio.wait_for(self.queue.get(), RESCAN_S)
                except TimeoutError:
                    quiet += RESCAN_S
                    if quiet >= KEEP_ALIVE_S:
                        quiet = 0.0
                        yield b": keep-alive\n\n"
                    continue
                quiet = 0.0
                chunk = [ev]
                with contextlib.suppress(asyncio.QueueEmpty):
                    while len(chunk) < 500:
                        chunk.append(self.queue.get_nowait())
                yield b"".join(chunk)
        finally:
            unsubscribe()
            await self.aclose()


def add_fleet_routes(api: FastAPI, sup: Supervisor) -> None:
    """The routes over all of the caller's sessions."""
    tags: list[str | Enum] = ["fleet"]

    @api.get("/tasks", tags=tags, response_model=list[TaskInfo])
    async def all_tasks(
        who: Who,
        kind: Kind | None = None,
        active: Annotated[bool, Query(), BOOLEAN] = False,
    ) -> list[TaskInfo]:
        """Every task of every open session the caller may see (the admin: all; a session
        token: its own), by session, oldest first; ``active=true``: only those not ended."""
        tasks: list[TaskInfo] = []
        for session in visible(sup, who):
            tasks += await session.list(kind, active_only=active)
        return tasks

    @api.get(
        "/events/stream",
        tags=tags,
        response_class=EventStreamResponse,
        responses=_SSE_DOC,
    )
    async def merged_stream(
        who: Who, types: TypesFilter = None, engine: EngineFlag = False
    ) -> EventStreamResponse:
        """Server-sent events of every open session the caller may see, merged, from now on
        (sessions opened later included), and ``task.created`` (data: the TaskInfo, no
        ``id``) for each task started through the API, as soon as it is. There is no
        resume: seqs are per session, so after a reconnect read the current state again
        (``GET /tasks``). ``types`` keeps
        only events of those types (e.g. a task table needs only ``task.started``,
        ``task.stalled``, ``task.stopped`` and ``task.failed``). ``engine=true`` adds
        ``engine.state`` (no ``id``; whatever ``types`` says): the engine's state when the
        stream opens, then each change (the dashboard's banner)."""
        news = EngineNews(sup, who) if engine else None
        return EventStreamResponse(
            _Merged(sup, who, types, news).stream(),
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
