"""The dashboard's engine banner in Chromium (issue 29, point 2): shown at the top of every
page while the engine is wedged or down, with what starts meet, hidden again once it is
up, live within seconds; the admin's login also sees the version and its known deadlocks,
a session's login does not; the engine's own text is shown as text.

The shared engine cannot be wedged or stopped for a test, so this runs the daemon
in-process on the fake engine (tests/component/daemon_app.py's ``listening_daemon``, its
TCP app serving the dashboard as ``sandvisor serve --ui`` does), as the API fuzzer does.
The other browser tests drive a real ``sandvisor serve --ui`` on the real engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from supervisor.engine.base import Backend
from supervisor.engine.deadlines import Deadlines, deadlines_for
from supervisor.engine.fake import FakeBackend
from tests.component.daemon_app import ListeningDaemon, listening_daemon

pytestmark = pytest.mark.timeout(120)

#: Markup in the version the engine reports: the banner must show it as text.
VERSION = "20.10.24<img src=x onerror=alert(1)>"
#: Every engine call's deadline (the watchdog's canary counts as hung after half).
DEADLINE = 1.0
#: How soon the banner follows the engine, in ms (it took about 1 s on the fake).
FEW_MS = 5000
WEDGED = "Docker engine wedged: starts are refused with engine_unresponsive until it answers"
DOWN = "Docker engine down: starts fail with engine_unavailable until it answers again"


class MarkupVersion:
    """The fake backend, reporting VERSION."""

    def __init__(self, inner: FakeBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ping(self) -> dict[str, str]:
        return {**await self.inner.ping(), "version": VERSION}


def bounded(backend: FakeBackend) -> Backend:
    return Deadlines(MarkupVersion(backend), deadlines_for(DEADLINE))  # type: ignore[arg-type]


@pytest.fixture
def daemon(tmp_path: Path, policies_dir: Path) -> Iterator[ListeningDaemon]:
    with listening_daemon(tmp_path / "state", policies_dir, ui=True, backend=bounded) as d:
        yield d


@pytest.fixture
def session_page(chromium: Browser) -> Iterator[Page]:
    """A second browser (a context of its own, so a cookie of its own); as ``page``, any
    dialog or script error fails the test."""
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    p = context.new_page()
    problems: list[str] = []
    p.on("dialog", lambda d: (problems.append(d.message), d.dismiss()))
    p.on("pageerror", lambda e: problems.append(str(e)))
    p.set_default_timeout(10_000)
    yield p
    context.close()
    assert not problems, problems


def log_in(page: Page, daemon: ListeningDaemon, url: str, path: str) -> None:
    """Open the login link, then ``path``, and wait for its stream to be live."""
    assert daemon.ui is not None
    page.goto(url)
    page.wait_for_url(f"{daemon.ui.base_url}/ui/")
    if path != "/ui/":
        page.goto(f"{daemon.ui.base_url}{path}")
    page.wait_for_selector("#live-state.live")


def shows(banner: Locator, headline: str) -> None:
    expect(banner).to_be_visible(timeout=FEW_MS)
    expect(banner.locator("strong")).to_have_text(headline, timeout=FEW_MS)


def parts(banner: Locator) -> list[str]:
    """The banner's children: elements only (a stray text node would be shown as is)."""
    names: list[str] = banner.evaluate("b => [...b.childNodes].map((n) => n.nodeName)")
    return names


def test_the_banner_shows_while_the_engine_is_wedged_or_down(
    daemon: ListeningDaemon, page: Page, session_page: Page
) -> None:
    engine = daemon.daemon.engine
    with daemon.client() as api:
        r = api.post("/sessions", json={"session_id": "s1"})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        admin_link = api.post("/ui/logins", json={}).json()["url"]
    with daemon.client(token) as own:
        session_link = own.post("/ui/logins", json={}).json()["url"]
    # The admin on the overview (the merged stream), the session's login on its session's
    # page (that session's stream).
    log_in(page, daemon, admin_link, "/ui/")
    log_in(session_page, daemon, session_link, "/ui/sessions/s1")
    admin = page.locator("#engine-banner")
    scoped = session_page.locator("#engine-banner")
    for banner in (admin, scoped):
        expect(banner).to_be_hidden()

    release = daemon.call(engine.wedge, "list_labeled")
    shows(admin, WEDGED)
    shows(scoped, WEDGED)
    # At the top: under the header, above the page's content.
    box, main = admin.bounding_box(), page.locator("main").bounding_box()
    assert box is not None and main is not None and box["y"] < main["y"]
    # The version and its known deadlocks for the admin, as text (no element from it).
    assert parts(admin) == ["STRONG", "DIV", "DIV"]
    expect(admin).to_contain_text(f"Docker {VERSION}: ")
    expect(admin.locator(".engine-warning")).to_contain_text("known libnetwork deadlocks")
    expect(admin.locator("img")).to_have_count(0)
    # The session's login: what starts meet and why, not the version.
    assert parts(scoped) == ["STRONG", "DIV"]
    expect(scoped.locator(".engine-why")).not_to_be_empty()
    expect(scoped).not_to_contain_text("20.10")
    expect(scoped.locator(".engine-warning")).to_have_count(0)

    daemon.call(release.set)
    for banner in (admin, scoped):
        expect(banner).to_be_hidden(timeout=FEW_MS)

    daemon.call(engine.go_down)
    shows(admin, DOWN)
    shows(scoped, DOWN)
    daemon.call(engine.restore)
    for banner in (admin, scoped):
        expect(banner).to_be_hidden(timeout=FEW_MS)
