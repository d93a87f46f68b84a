"""The dashboard's static files, its security headers and its few server-made pages (login,
not logged in, not found), all answered with a Content-Security-Policy that allows no inline
script or style and nothing from another origin."""

from __future__ import annotations

import hashlib
import html
import re
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import Response
from starlette.types import ASGIApp, Scope

from supervisor.core.errors import SessionNotFound, SupervisorError, TaskNotFound
from supervisor.interfaces.http_errors import Forbidden, NotFound
from supervisor.interfaces.http_errors import Unauthorized as _Unauthorized

#: Where the files are, beside this module (shipped as package data).
ASSET_DIR = Path(__file__).with_name("ui")
#: The names a file may have (no path, no dot files): what the static route accepts.
ASSET_NAME = re.compile(r"\A[a-z0-9][a-z0-9_-]*\.(?:html|js|css|svg|txt)\Z")
_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
    "txt": "text/plain; charset=utf-8",
}
#: No inline script or style (``el.style.x = ...`` from our own script stays allowed: CSP
#: governs markup, not the CSSOM), nothing from another origin, no framing, no plugins.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # The login link carries its code in the URL: never send it on as a referrer.
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@dataclass(frozen=True)
class Asset:
    """One static file, held in memory (they are a few tens of KiB in all)."""

    body: bytes
    media_type: str
    etag: str


def load_assets(directory: Path = ASSET_DIR) -> dict[str, Asset]:
    """Every file of the dashboard by name (blocking: call it from a worker thread)."""
    assets: dict[str, Asset] = {}
    for path in sorted(directory.iterdir()):
        if not path.is_file() or not ASSET_NAME.match(path.name):
            continue
        body = path.read_bytes()
        digest = hashlib.sha256(body).hexdigest()[:16]
        assets[path.name] = Asset(body, _TYPES[path.suffix[1:]], f'"{digest}"')
    return assets


def asset_response(asset: Asset, if_none_match: str | None) -> Response:
    """A static file: revalidated on every use (``no-cache`` + ETag), so a daemon upgrade
    is seen at once while an unchanged file costs a 304."""
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache", "ETag": asset.etag}
    if if_none_match == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


def page_response(asset: Asset) -> Response:
    """One of the dashboard's pages (never cached: it is behind a login)."""
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
    return Response(asset.body, media_type=asset.media_type, headers=headers)


def message_page(title: str, text: str, *, status: int, refresh_to: str | None = None) -> Response:
    """A small page of fixed text (everything escaped; no script)."""
    refresh = ""
    if refresh_to is not None:
        url = html.escape(refresh_to, quote=True)
        refresh = f'<meta http-equiv="refresh" content="0; url={url}">'
    link = "" if refresh_to is None else f'<p><a href="{html.escape(refresh_to)}">Continue</a></p>'
    body = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"{refresh}<title>{html.escape(title)} · sandvisor</title>"
        '<link rel="stylesheet" href="/ui/static/style.css"></head>'
        f'<body class="message"><main><h1>{html.escape(title)}</h1>'
        f"<p>{html.escape(text)}</p>{link}</main></body></html>"
    )
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
    return Response(
        body, status_code=status, media_type="text/html; charset=utf-8", headers=headers
    )


#: What a person is told when the dashboard will not show them something.
NOT_LOGGED_IN = (
    "This browser is not logged in to the dashboard. Open the login link that `sandvisor serve "
    "--ui` printed, or get a new one with `sandvisor ui`."
)
LINK_USED = (
    "This login link was already used or has expired (each link logs one browser in, once). "
    "Get a new one with `sandvisor ui`."
)
NOT_FOUND = "There is no such session or task here, or this login may not see it."


def not_found_page() -> Response:
    return message_page("Not found", NOT_FOUND, status=404)


def ui_error_page(scope: Scope, exc: SupervisorError) -> ASGIApp | None:
    """The request guard's refusals of a page, as a page (the API's routes keep JSON)."""
    path = str(scope.get("path", ""))
    if scope.get("method") not in ("GET", "HEAD") or not (path == "/ui" or path.startswith("/ui/")):
        return None
    if path.startswith("/ui/static/"):
        return None
    if isinstance(exc, _Unauthorized):
        return message_page("Log in", NOT_LOGGED_IN, status=401)
    if isinstance(exc, Forbidden):
        return message_page("Forbidden", str(exc), status=403)
    if isinstance(exc, (NotFound, SessionNotFound, TaskNotFound)):
        return not_found_page()
    return None
