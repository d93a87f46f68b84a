"""Routes of events: the long-poll, the SSE stream, notifications and the acknowledged drain."""

from __future__ import annotations

from collections.abc import AsyncIterator
from enum import Enum
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from supervisor.core.events import NOTIFY_TYPES, BaseEvent
from supervisor.core.ids import TASK_ID_RE
from supervisor.core.problems import InvalidRequest
from supervisor.core.render import render_json, render_xml
from supervisor.interfaces.daemon.bodies import CONSUMER_PATTERN, AckBody
from supervisor.interfaces.daemon.deps import INTEGER, NUMBER, SessionId, Who, session_of
from supervisor.interfaces.daemon.engine_feed import ENGINE_EVERY_S, EngineFlag, EngineNews
from supervisor.interfaces.daemon.limits import MAX_SEQ, MAX_WAIT_S
from supervisor.interfaces.daemon.replies import (
    Acked,
    Events,
    Notifications,
    Pending,
    error_responses,
)
from supervisor.runtime.session import Session
from supervisor.runtime.supervisor import Supervisor

#: How often an idle SSE stream sends a comment, so proxies and clients see it is alive.
KEEP_ALIVE_S = 15.0
_Seq = Annotated[int, Query(ge=0, le=MAX_SEQ), INTEGER]
_Limit = Annotated[int, Query(ge=1, le=10_000), INTEGER]
_WaitS = Annotated[float, Query(ge=0, le=MAX_WAIT_S), NUMBER]
_Format = Literal["xml", "json"]
_EVENTS: list[str | Enum] = ["events"]
#: Every event type a reader can meet (``events.gap`` included); ``types=`` takes these.
EventType = Literal[
    "task.started",
    "task.output",
    "task.output_suppressed",
    "task.poll",
    "task.stalled",
    "task.stopped",
    "task.failed",
    "session.ended",
    "events.gap",
]
#: ``task_id=``: only this task's events (``seq`` and cursors still count every event).
TaskFilter = Annotated[
    str | None,
    Query(pattern=TASK_ID_RE.pattern, description="Only this task's events, e.g. `bg-7f3a9c2e`"),
]
#: ``types=``: only events of these types (repeat the parameter for more than one).
TypesFilter = Annotated[
    list[EventType] | None,
    Query(description="Only events of these types (repeat: `types=task.started&types=...`)"),
]


def matching(
    batch: list[BaseEvent], task_id: str | None, types: list[EventType] | None
) -> list[BaseEvent]:
    """The events of ``batch`` that pass the filters (all of them without filters)."""
    if task_id is None and not types:
        return batch
    wanted = set(types or ())
    return [
        e
        for e in batch
        if (task_id is None or e.task_id == task_id) and (not wanted or e.type in wanted)
    ]


def sse_message(ev: BaseEvent) -> bytes:
    """One server-sent event: ``id: <seq>``, ``event: <type>``, ``data: <event JSON>``."""
    return f"id: {ev.seq}\nevent: {ev.type}\ndata: {ev.model_dump_json()}\n\n".encode()


class EventStreamResponse(StreamingResponse):
    """Server-sent events (documented as ``text/event-stream``, not JSON)."""

    media_type = "text/event-stream"


_XML: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "`format=json`: JSON; `format=xml`: the blocks as text",
        "content": {"application/xml": {"schema": {"type": "string"}}},
        "headers": {
            "X-Sandvisor-Last-Seq": {
                "description": "`format=xml`: seq of the last event read",
                "schema": {"type": "integer"},
            },
            "X-Sandvisor-Ended": {
                "description": "`format=xml`: `true` once the session ended and all was read",
                "schema": {"type": "string", "enum": ["true", "false"]},
            },
        },
    }
}
_SSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "`id: <seq>`, `event: <type>`, `data: <event JSON>` per event; "
        "comments as keep-alives",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


async def _read(session: Session, after: int, limit: int, wait_s: float) -> list[BaseEvent]:
    log = session.event_log
    await log.caught_up()  # everything emitted before the request is readable
    events = await log.read_after(after, limit)
    if not events and wait_s > 0 and not log.closed:
        await log.wait_beyond(after, wait_s)
        events = await log.read_after(after, limit)
    return events


def _render(ev: BaseEvent, fmt: _Format) -> dict[str, Any]:
    item: dict[str, Any] = {"seq": ev.seq, "type": ev.type, "task_id": ev.task_id}
    if fmt == "xml":
        item["xml"] = render_xml(ev)
    else:
        item.update(render_json(ev))
    return item


def _notifications(batch: list[BaseEvent]) -> list[BaseEvent]:
    return [e for e in batch if e.type in NOTIFY_TYPES]


async def _sse(
    session: Session,
    cursor: int,
    task_id: str | None,
    types: list[EventType] | None,
    engine: EngineNews | None,
) -> AsyncIterator[bytes]:
    log = session.event_log
    yield b": connected\n\n"
    # With the engine's state on, an idle stream wakes every ENGINE_EVERY_S to look at it
    # (reading past the last event costs nothing: it is in memory).
    step = KEEP_ALIVE_S if engine is None else ENGINE_EVERY_S
    quiet = 0.0
    while True:
        if engine is not None and (news := engine.poll()) is not None:
            yield news
        batch = await log.read_after(cursor, 500)
        if batch:
            cursor = batch[-1].seq
            quiet = 0.0
            for ev in matching(batch, task_id, types):
                yield sse_message(ev)
            continue
        if log.closed:
            return
        if await log.wait_beyond(cursor, step):
            continue
        quiet += step
        if quiet >= KEEP_ALIVE_S:
            quiet = 0.0
            yield b": keep-alive\n\n"


def add_event_routes(api: FastAPI, sup: Supervisor) -> None:
    """The event routes over ``sup`` (on the app itself, like the task routes)."""

    @api.get(
        "/sessions/{session_id}/events",
        tags=_EVENTS,
        response_model=Events,
        responses=error_responses(404),
    )
    async def events(
        session_id: SessionId,
        who: Who,
        after: _Seq = 0,
        limit: _Limit = 500,
        wait_s: _WaitS = 0.0,
        task_id: TaskFilter = None,
        types: TypesFilter = None,
    ) -> Response:
        """Events with seq > ``after`` in seq order; long-polls up to ``wait_s`` when none.
        With ``task_id`` or ``types``, only the events that match, out of the next
        ``limit`` (``last_seq`` still moves past the others: go on from it)."""
        session = session_of(sup, session_id, who)
        batch = await _read(session, after, limit, wait_s)
        # Built directly (the events are already validated models): a long-poll answer of
        # hundreds of events skips a second validation against the Events schema.
        return JSONResponse(
            {
                "events": [e.model_dump(mode="json") for e in matching(batch, task_id, types)],
                "last_seq": batch[-1].seq if batch else after,
                "ended": session.event_log.closed,
            }
        )

    @api.get(
        "/sessions/{session_id}/events/stream",
        tags=_EVENTS,
        response_class=EventStreamResponse,
        responses={**_SSE, **error_responses(404)},
    )
    async def event_stream(
        session_id: SessionId,
        who: Who,
        after: Annotated[int | None, Query(ge=0, le=MAX_SEQ), INTEGER] = None,
        last_event_id: Annotated[
            int | None,
            Header(alias="Last-Event-ID", ge=0, le=MAX_SEQ, description="Resume after this seq"),
            INTEGER,
        ] = None,
        task_id: TaskFilter = None,
        types: TypesFilter = None,
        engine: EngineFlag = False,
    ) -> EventStreamResponse:
        """Server-sent events, ``id: <seq>``; reconnect with ``Last-Event-ID`` to resume
        (it wins over ``after``). ``task_id`` and ``types`` keep only the events that
        match. ``engine=true`` adds ``engine.state`` (no ``id``; whatever ``types`` says):
        the engine's state when the stream opens, then each change."""
        session = session_of(sup, session_id, who)
        cursor = last_event_id if last_event_id is not None else (after or 0)
        news = EngineNews(sup, who) if engine else None
        return EventStreamResponse(
            _sse(session, cursor, task_id, types, news),
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @api.get(
        "/sessions/{session_id}/notifications",
        tags=_EVENTS,
        response_model=Notifications,
        responses={**_XML, **error_responses(404)},
    )
    async def notifications(
        session_id: SessionId,
        who: Who,
        after: _Seq = 0,
        format: _Format = "xml",
        wait_s: _WaitS = 0.0,
        limit: _Limit = 500,
        task_id: TaskFilter = None,
    ) -> Response:
        """Agent-facing renderings of events after ``after``: ``<task-notification>`` and
        ``<background_task_poll>`` blocks (``format=xml``, as text) or JSON. ``task_id``:
        only that task's (``last_seq`` still moves past the others)."""
        session = session_of(sup, session_id, who)
        batch = await _read(session, after, limit, wait_s)
        last = batch[-1].seq if batch else after
        items = matching(_notifications(batch), task_id, None)
        ended = session.event_log.closed and last >= session.event_log.last_seq
        if format == "xml":
            text = "\n".join(x for x in (render_xml(e) for e in items) if x)
            return PlainTextResponse(
                text,
                headers={
                    "X-Sandvisor-Last-Seq": str(last),
                    "X-Sandvisor-Ended": str(ended).lower(),
                },
                media_type="application/xml",
            )
        return JSONResponse(
            {
                "notifications": [_render(e, "json") for e in items],
                "last_seq": last,
                "ended": ended,
            }
        )

    @api.get(
        "/sessions/{session_id}/notifications/pending",
        tags=_EVENTS,
        response_model=Pending,
        responses=error_responses(404),
    )
    async def pending(
        session_id: SessionId,
        who: Who,
        consumer: Annotated[str, Query(min_length=1, max_length=64, pattern=CONSUMER_PATTERN)],
        format: _Format = "xml",
        limit: Annotated[int, Query(ge=1, le=10_000), INTEGER] = 200,
    ) -> Response:
        """Notifications ``consumer`` has not acknowledged yet. Deliver them, then POST
        .../ack with ``cursor``: nothing reaches the agent twice, nothing is lost."""
        session = session_of(sup, session_id, who)
        acked = await sup.store.get_cursor(session_id, consumer)
        await session.event_log.caught_up()
        batch = await session.event_log.read_after(acked, limit)
        cursor = batch[-1].seq if batch else acked
        items = [_render(e, format) for e in _notifications(batch)]
        return JSONResponse({"notifications": items, "cursor": cursor, "acked": acked})

    @api.post(
        "/sessions/{session_id}/notifications/ack",
        tags=_EVENTS,
        response_model=Acked,
        responses=error_responses(404, 413),
    )
    async def ack(session_id: SessionId, body: AckBody, who: Who) -> dict[str, Any]:
        """Record that ``consumer`` delivered everything up to ``seq`` (never moves back)."""
        session = session_of(sup, session_id, who)
        if body.seq > session.event_log.last_seq:
            last = session.event_log.last_seq
            raise InvalidRequest([("seq", f"{body.seq} is beyond the last event ({last})")])
        await sup.store.set_cursor(session_id, body.consumer, body.seq)
        return {
            "consumer": body.consumer,
            "acked": await sup.store.get_cursor(session_id, body.consumer),
        }
