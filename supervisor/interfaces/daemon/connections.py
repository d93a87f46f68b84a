"""Each listener's connections: a cap, a deadline for every request head, a clear 503 for a
connection over the cap, accept errors logged at most once per interval, and the process's
file descriptor limit raised at start.

uvicorn has none of these for h11: ``limit_concurrency`` answers 503 only once a request
has arrived (a silent connection is never counted against it), and ``timeout_keep_alive``
runs only between requests, so a client that sends half a request line and stops holds a
descriptor forever. ``GuardedH11Protocol`` is uvicorn's h11 protocol with both added; it
relies on uvicorn's ``conn`` (the h11 connection), ``transport`` and
``on_response_complete``.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from supervisor.core.errors import SupervisorError
from supervisor.core.logs import get_logger
from supervisor.interfaces.daemon.errors import error_body
from supervisor.interfaces.daemon.limits import MAX_DRAIN, MAX_REFUSING, REFUSE_LINGER_S
from supervisor.interfaces.http_errors import RequestTimeout, TooManyConnections, status_of

log = get_logger("supervisor.interfaces.daemon")

#: Our side's h11 states while a request is being answered (its head has arrived).
_SERVING = (h11.SEND_RESPONSE, h11.SEND_BODY)
#: Descriptors a raised soft limit aims for when the hard limit is unlimited.
_NOFILE_TARGET = 1 << 20


@dataclass
class Listener:
    """One listener's limits and counters (shared by all of its connections)."""

    name: str
    """``unix`` or ``tcp``, for logs."""
    max_connections: int
    header_timeout_s: float
    open: int = 0
    """Connections being served now."""
    refusing: int = 0
    """Connections over the cap being told so (503) right now."""
    refused: int = 0
    """Connections refused since start."""
    timed_out: int = 0
    """Connections closed since start because their request head came too late."""


def raw_response(exc: SupervisorError) -> bytes:
    """A whole HTTP/1.1 error answer that closes the connection, written without h11 (no
    request was parsed, or the one being parsed is abandoned)."""
    body = json.dumps(error_body(exc)).encode()
    status = status_of(exc)
    reason = {408: "Request Timeout", 503: "Service Unavailable"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a per-listener connection cap and a header deadline."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        listener: Listener,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.listener = listener
        self._refused = False
        self._counted = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._drained = 0

    # -- the cap ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        lst = self.listener
        if lst.open >= lst.max_connections:
            self._refuse(transport)
            return
        lst.open += 1
        self._counted = True
        super().connection_made(transport)
        self._arm_header_timer()

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 and close. The answer is written at once; the connection lingers a
        moment so the client can read it (closing with its request unread would reset the
        connection and lose the answer). Beyond ``MAX_REFUSING`` of them, cut at once."""
        lst = self.listener
        self._refused = True
        self.transport = transport
        lst.refused += 1
        if lst.refusing >= MAX_REFUSING:
            transport.abort()
            return
        lst.refusing += 1
        if lst.refused == 1 or lst.refused % 1000 == 0:
            log.warning(
                "connections_refused",
                listener=lst.name,
                max_connections=lst.max_connections,
                refused_total=lst.refused,
            )
        transport.write(
            raw_response(
                TooManyConnections(
                    f"this listener already holds {lst.max_connections} connections "
                    "(the most it allows); retry shortly"
                )
            )
        )
        if transport.can_write_eof():
            transport.write_eof()  # the client reads the answer, then EOF; its close ends it
        self._linger = self.loop.call_later(REFUSE_LINGER_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped, so closing cannot reset the connection
        # Answered before its body was read (401, 413): the rest of the body is read and
        # dropped, so the client gets to read the answer (closing on unread data resets a
        # TCP connection, and the answer is lost), but only up to MAX_DRAIN bytes.
        draining = self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY
        super().data_received(data)
        if draining:
            self._drained += len(data)
            if self._drained > MAX_DRAIN and not self.transport.is_closing():
                self.transport.close()
                return
        if self._header_timer is not None:
            if self.conn.our_state in _SERVING:
                self._cancel_header_timer()  # the next request's head is complete
            elif self.conn.their_state is h11.IDLE:
                self._head_bytes += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            if self._linger is not None:  # it was counted among the refusing ones
                self._linger.cancel()
                self._linger = None
                self.listener.refusing -= 1
            return
        if self._counted:
            self.listener.open -= 1
            self._counted = False
        self._cancel_header_timer()
        super().connection_lost(exc)

    # -- the header deadline ---------------------------------------------------------------

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A kept-alive connection now waits for the rest of an unread body and its next
        # request head, within the same deadline (uvicorn's keep-alive timer closes it if
        # nothing comes at all; this one bounds what starts and stalls).
        if not self.transport.is_closing() and self.conn.our_state not in _SERVING:
            self._drained = 0
            self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._head_bytes = 0
        self._header_timer = self.loop.call_later(
            self.listener.header_timeout_s, self._header_timed_out
        )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.our_state in _SERVING:
            return
        self.listener.timed_out += 1
        if self._head_bytes and self.conn.their_state is h11.IDLE:
            # Half a request came: say why it is cut. A connection that sent nothing (a
            # kept-alive one between requests) is closed silently, as clients expect.
            timeout = self.listener.header_timeout_s
            self.transport.write(
                raw_response(
                    RequestTimeout(
                        f"the request line and headers did not arrive within {timeout:g} s"
                    )
                )
            )
        self.transport.close()


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (or 2**20 when that is
    unlimited): every connection, output file and engine stream costs a descriptor, and the
    usual soft default of 1024 runs out long before memory or CPU do. Returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NOFILE_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("nofile_not_raised", soft=soft, hard=hard, error=str(exc))
    return soft, hard


def connection_cap(requested: int | None, default: int, listeners: int, nofile: int) -> int:
    """Connections per listener: the requested number as given; else ``default``, lowered so
    that all listeners together hold at most half of the descriptor limit (the other half
    is the runtime's: output files, engine streams, the state database)."""
    if requested is not None:
        return requested
    return max(16, min(default, nofile // (2 * max(listeners, 1))))


class AcceptErrorLog:
    """A loop exception handler that logs failed ``accept()`` calls (EMFILE, ENFILE, ...) as
    one line per interval with a count, instead of a traceback per attempt (asyncio logs
    one for every try, thousands a second once descriptors run out); other errors go to the
    handler that was there before."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 10.0) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.previous = loop.get_exception_handler()
        self.count = 0
        self.total = 0
        self._last = -interval_s

    def install(self) -> None:
        self.loop.set_exception_handler(self)

    def uninstall(self) -> None:
        self.loop.set_exception_handler(self.previous)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.count += 1
        self.total += 1
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            exc = context.get("exception")
            log.error(
                "accept_failed",
                error=str(exc),
                failures=self.count,
                failures_total=self.total,
                hint="out of file descriptors: too many connections or tasks for the nofile limit",
            )
            self._last = now
            self.count = 0
