"""The first thing every request meets, before FastAPI reads or parses a byte of it: the
Host/Origin allowlist (TCP), the bearer token (or the dashboard's cookie), the route
(404/405), the route's body limit, the body's deadline and valid Unicode in JSON.

Order matters. The token comes before the route, so nobody without one learns which routes
exist (401, never 404 or 405), and before the body, so nobody without one can make the
daemon read or hold a byte of a body. The body is read here, bounded, and handed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from supervisor.core.errors import SupervisorError
from supervisor.interfaces.daemon.auth import Auth, Principal, bearer_token, cookie_value
from supervisor.interfaces.daemon.bodies import check_unicode
from supervisor.interfaces.daemon.errors import error_response
from supervisor.interfaces.daemon.limits import BODY_TIMEOUT_S, body_limit
from supervisor.interfaces.http_errors import (
    ForbiddenCsrf,
    ForbiddenHost,
    ForbiddenOrigin,
    MethodNotAllowed,
    NotFound,
    RequestTimeout,
    RequestTooLarge,
    Unauthorized,
)

#: Where the guard leaves the caller's Principal for the routes.
SCOPE_PRINCIPAL = "sandvisor.principal"
#: Routes anyone who can connect may call.
PUBLIC_PATHS = frozenset({"/healthz"})
#: Methods that change nothing (the others, on the cookie, also need an Origin).
SAFE_METHODS = frozenset({"GET", "HEAD"})
#: The header the dashboard's script sends its login's CSRF token in.
CSRF_HEADER = "x-sandvisor-csrf"
#: ... or, where a browser cannot send a header (EventSource, a download link), this query
#: parameter of a GET; the guard takes it out before the routes see the query.
CSRF_QUERY = b"sandvisor_csrf"
#: An answer for a refused request in another form than JSON (the dashboard's HTML), or None.
ErrorPage = Callable[[Scope, SupervisorError], ASGIApp | None]


@dataclass
class AppConfig:
    """How one listener's app is exposed."""

    allowed_hosts: set[str] = field(default_factory=set)
    """Host header values accepted (TCP only; empty: any, for the unix socket)."""
    allowed_origins: set[str] = field(default_factory=set)
    """Origin header values accepted when one is sent (TCP only)."""
    body_timeout_s: float = BODY_TIMEOUT_S
    """A request's body must arrive within this many seconds."""
    ui_cookie: str | None = None
    """The dashboard's cookie name (TCP with ``--ui``): with its login's CSRF token, it
    authenticates like a token; alone, it opens the dashboard's pages only."""
    public_paths: frozenset[str] = PUBLIC_PATHS
    """Routes that need no token (the dashboard adds its login)."""
    error_page: ErrorPage | None = None
    """Refusals of the dashboard's pages, as pages."""


class _ClientGone(Exception):
    """The client disconnected while its body was being read: nobody to answer."""


class RequestGuard:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer and copy every body)."""

    def __init__(
        self, app: ASGIApp, *, auth: Auth, config: AppConfig, routes: Callable[[], list[BaseRoute]]
    ) -> None:
        self.app = app
        self.auth = auth
        self.config = config
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            route_path = self._admit(scope, headers)
            body = await self._read_body(scope, headers, receive, route_path)
            if body and "json" in headers.get("content-type", ""):
                check_unicode(body)
        except _ClientGone:
            return
        except SupervisorError as exc:
            # A body refused unread (401, 413) is drained by the connection, within bounds
            # (connections.MAX_DRAIN); a body that stopped coming ends the connection.
            page = self.config.error_page(scope, exc) if self.config.error_page else None
            answer = page or error_response(exc, close=isinstance(exc, RequestTimeout))
            await answer(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _admit(self, scope: Scope, headers: Headers) -> str:
        """The path template of the route this request is for; or the refusal, in order."""
        if self.config.allowed_hosts:
            # Browsers reach only the TCP listener; the unix socket app has no allowlists.
            host = headers.get("host", "")
            if host not in self.config.allowed_hosts:
                raise ForbiddenHost(f"Host {host!r} is not allowed")
            origin = headers.get("origin")
            if origin is not None and origin not in self.config.allowed_origins:
                raise ForbiddenOrigin(f"Origin {origin!r} is not allowed")
        if scope["path"] not in self.config.public_paths:
            who = self.auth.check(bearer_token(headers.get("authorization")))
            if who is None and self.config.ui_cookie:
                who = self._cookie(scope, headers, self.config.ui_cookie)
            if who is None:
                raise Unauthorized()
            scope[SCOPE_PRINCIPAL] = who
        return self._route(scope)

    def _cookie(self, scope: Scope, headers: Headers, name: str) -> Principal | None:
        """The dashboard's cookie, as a principal.

        Browsers send a host's cookies to every port of that host, so any other local
        server the browser visits (``127.0.0.1:<another port>``) receives the cookie, and
        can replay it from a plain client with any Origin it likes. So the cookie alone
        opens only the dashboard's pages and static files (GET, no data in them: their
        script fetches it). Everything else, reads included, also needs the login's CSRF
        token: in ``X-Sandvisor-CSRF``, or for a GET in the ``sandvisor_csrf`` query
        parameter (EventSource and download links cannot send headers). Only the
        dashboard's own origin holds the token (its ``localStorage`` is per origin, port
        included); it never travels in a cookie. A request that changes something must
        also say where it comes from (a browser's fetch always sends Origin with a POST)."""
        cookie = cookie_value(headers.get("cookie"), name)
        who = self.auth.check_cookie(cookie)
        if who is None:
            return None
        safe = scope["method"] in SAFE_METHODS
        token = headers.get(CSRF_HEADER)
        if safe:
            queried = _take_query_token(scope)  # always taken out of the routes' query
            token = token or queried
            if _is_page(scope["path"]):
                return who
        elif not headers.get("origin"):
            raise ForbiddenOrigin("a dashboard request that changes state must send its Origin")
        if not self.auth.check_csrf(cookie, token):
            raise ForbiddenCsrf(
                "a dashboard request must send this login's CSRF token in X-Sandvisor-CSRF "
                "(the dashboard's pages do; open a new login link if a page lost it)"
            )
        return who

    def _route(self, scope: Scope) -> str:
        allowed: set[str] = set()
        for route in self.routes():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return str(getattr(route, "path", scope["path"]))
            if match is Match.PARTIAL:
                allowed |= set(getattr(route, "methods", None) or ())
        if allowed:
            raise MethodNotAllowed(scope["method"], allowed)
        raise NotFound()

    async def _read_body(
        self, scope: Scope, headers: Headers, receive: Receive, route_path: str
    ) -> bytes:
        """The whole body, at most the route's limit, within the body deadline. A body with
        no Content-Length (chunked) is counted as it arrives."""
        limit = body_limit(route_path)
        where = f"{scope['method']} {route_path}"
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise RequestTooLarge(
                f"the body is {int(length)} bytes; {where} takes at most {limit} bytes", limit
            )
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise RequestTooLarge(
                            f"the body is over {limit} bytes, the most {where} takes", limit
                        )
                    if chunk:
                        chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError as exc:
            raise RequestTimeout(
                f"the request body did not arrive within {self.config.body_timeout_s:g} s "
                f"({size} bytes came)"
            ) from exc
        return b"".join(chunks)


def _is_page(path: str) -> bool:
    """The dashboard's pages and static files (the login page is public)."""
    return path == "/ui" or path.startswith("/ui/")


def _take_query_token(scope: Scope) -> str | None:
    """The ``sandvisor_csrf`` query parameter, removed from the scope's query string (the
    routes refuse parameters they do not declare)."""
    query: bytes = scope.get("query_string", b"")
    if CSRF_QUERY not in query:
        return None
    kept: list[bytes] = []
    token: str | None = None
    for part in query.split(b"&"):
        key, _, value = part.partition(b"=")
        if key == CSRF_QUERY:
            token = token or value.decode("ascii", "replace")
        else:
            kept.append(part)
    scope["query_string"] = b"&".join(kept)
    return token


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the real channel (where
    a streaming route learns of the client's disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay


def principal_of(scope: Scope | dict[str, Any]) -> Principal | None:
    """The Principal the guard admitted this request as (None on public routes)."""
    who = scope.get(SCOPE_PRINCIPAL)
    return who if isinstance(who, Principal) else None
