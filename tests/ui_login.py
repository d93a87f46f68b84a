"""Logging in to the dashboard the way a browser does: mint a login link over the API (the
admin's, or a session token's), follow it with a plain HTTP client, and keep the cookie and
the CSRF token the page hands over. Shared by the dashboard tests."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Protocol

import httpx

#: Where the login page sends the browser, with the CSRF token in the fragment.
REFRESH = re.compile(r'url=/ui/#csrf=([A-Za-z0-9_-]+)"')


class ApiClients(Protocol):
    """A daemon under test: an authenticated API client (the admin's unless told)."""

    def client(self, token: str | None = None) -> httpx.Client: ...


@dataclass
class Login:
    """What a browser holds after a login link: the cookie and the page's CSRF token."""

    cookie: str
    csrf: str


def login_page(d: ApiClients, token: str | None = None) -> tuple[str, re.Match[str] | None]:
    """Follow a fresh login link: the cookie set, and the page's CSRF token (None when
    the page carries none)."""
    with d.client(token) as api:
        r = api.post("/ui/logins", json={})
        assert r.status_code == 201, r.text
        url = r.json()["url"]
    with httpx.Client(timeout=30) as browser:
        page = browser.get(url)
    assert page.status_code == 200, page.text
    (cookie,) = [f"{c.name}={c.value}" for c in page.cookies.jar]
    return cookie, REFRESH.search(html.unescape(page.text))
