"""The dashboard's routes: its pages and static files (TCP, with ``sandvisor serve --ui``), the
one-time login link exchanged for a cookie, and logging out.

The pages are static files; their script reads the ids from the address and talks to the
same API as every other client, authenticated by the cookie and the login's CSRF token (the
request guard takes them in place of a bearer token; the cookie alone opens the pages). A
page of a session or task the login may not see answers 404, as the API does."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request
from fastapi.responses import RedirectResponse, Response

from supervisor.core.errors import SupervisorError
from supervisor.interfaces.daemon.auth import Auth, cookie_value
from supervisor.interfaces.daemon.bodies import LoginBody
from supervisor.interfaces.daemon.deps import SessionId, TaskId, Who, session_of
from supervisor.interfaces.daemon.limits import UI_COOKIE_TTL_S
from supervisor.interfaces.daemon.replies import LoginLink, error_responses
from supervisor.interfaces.daemon.ui_assets import (
    ASSET_NAME,
    LINK_USED,
    Asset,
    asset_response,
    message_page,
    not_found_page,
    page_response,
)
from supervisor.runtime.supervisor import Supervisor

LOGIN_PATH = "/ui/login"
#: The login page's redirect carries the CSRF token as ``/ui/#csrf=<token>``.
CSRF_FRAGMENT = "csrf"
_TAGS: list[str | Enum] = ["dashboard"]


@dataclass(frozen=True)
class UiConfig:
    """The dashboard as one listener's app serves it."""

    base_url: str
    """The TCP listener's address, e.g. ``http://127.0.0.1:8377`` (login links point here)."""
    cookie: str
    """The cookie's name; it names the port, since browsers share cookies across ports."""
    assets: dict[str, Asset] = field(default_factory=dict)
    """The pages and static files, by name."""
    pages: bool = True
    """Serve the pages (the TCP app); the unix socket's app only mints login links."""
    cookie_ttl_s: float = UI_COOKIE_TTL_S
    """How long a login lasts."""

    def login_url(self, code: str) -> str:
        return f"{self.base_url}{LOGIN_PATH}?token={code}"


def cookie_name(port: int) -> str:
    return f"sandvisor_ui_{port}"


def add_ui_routes(api: FastAPI, sup: Supervisor, auth: Auth, ui: UiConfig) -> None:
    """The dashboard's routes over ``sup``."""
    _login_routes(api, auth, ui)
    if ui.pages:
        _page_routes(api, sup, auth, ui)


def _login_routes(api: FastAPI, auth: Auth, ui: UiConfig) -> None:
    @api.post(
        "/ui/logins",
        tags=_TAGS,
        status_code=201,
        response_model=LoginLink,
        responses=error_responses(413),
    )
    async def new_login(body: LoginBody, who: Who) -> dict[str, Any]:
        """A one-time link that logs a browser in to the dashboard as the caller: the admin
        sees every session; a session's token sees that session only. The link works once,
        within ``ttl_s``; the browser then holds an HttpOnly, SameSite=Strict cookie."""
        code = auth.new_login(who, body.ttl_s)
        return {"url": ui.login_url(code), "expires_at": time.time() + body.ttl_s}


def _page_routes(api: FastAPI, sup: Supervisor, auth: Auth, ui: UiConfig) -> None:
    def page(name: str) -> Response:
        return page_response(ui.assets[name])

    @api.get(LOGIN_PATH, include_in_schema=False)
    async def login(token: Annotated[str | None, Query(max_length=200)] = None) -> Response:
        granted = auth.redeem_login(token, ui.cookie_ttl_s)
        if granted is None:
            return message_page("Login link not valid", LINK_USED, status=401)
        # A page that moves on by itself rather than a redirect: a navigation this page
        # starts is same-site, so the SameSite=Strict cookie goes with it even when the
        # link was opened from another site (a redirect would keep that site as initiator).
        # The CSRF token rides in the fragment, which no browser sends to any server: the
        # dashboard's script moves it into this origin's localStorage and drops it from
        # the address (common.js).
        response = message_page(
            "Logged in",
            "Opening the dashboard.",
            status=200,
            refresh_to=f"/ui/#{CSRF_FRAGMENT}={granted.csrf}",
        )
        # Not a ``__Host-`` cookie: that prefix needs ``Secure``, which plain-http loopback
        # cannot always have (browsers differ on Secure cookies over http://127.0.0.1), and
        # it would not help here anyway: a ``__Host-`` cookie, too, goes to every port of
        # the host. The port in the name keeps two daemons' cookies apart; the CSRF token
        # is what keeps another port's page from using ours.
        response.set_cookie(
            ui.cookie,
            granted.cookie,
            max_age=int(ui.cookie_ttl_s),
            path="/",
            httponly=True,
            samesite="strict",
        )
        return response

    @api.post("/ui/logout", tags=_TAGS, status_code=204, response_class=Response)
    async def logout(request: Request, who: Who) -> Response:
        """End this browser's dashboard login (its cookie stops working at once)."""
        auth.end_cookie(cookie_value(request.headers.get("cookie"), ui.cookie))
        response = Response(status_code=204)
        response.delete_cookie(ui.cookie, path="/", httponly=True, samesite="strict")
        return response

    @api.get("/ui", include_in_schema=False)
    async def ui_root(who: Who) -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @api.get("/ui/", include_in_schema=False)
    async def overview(who: Who) -> Response:
        return page("overview.html")

    @api.get("/ui/sessions/{session_id}", include_in_schema=False)
    async def session_page(session_id: SessionId, who: Who) -> Response:
        try:
            session_of(sup, session_id, who)
        except SupervisorError:
            return not_found_page()
        return page("session.html")

    @api.get("/ui/sessions/{session_id}/tasks/{task_id}", include_in_schema=False)
    async def task_page(session_id: SessionId, task_id: TaskId, who: Who) -> Response:
        try:
            await session_of(sup, session_id, who).get(task_id)
        except SupervisorError:
            return not_found_page()
        return page("task.html")

    @api.get("/ui/static/{name}", include_in_schema=False)
    async def static(
        name: Annotated[str, Path(max_length=64)],
        who: Who,
        if_none_match: Annotated[str | None, Header()] = None,
    ) -> Response:
        asset = ui.assets.get(name) if ASSET_NAME.match(name) else None
        if asset is None:
            return not_found_page()
        return asset_response(asset, if_none_match)
