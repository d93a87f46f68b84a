"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright (its
Python package only; ``executable_path`` points at the system browser, none is downloaded),
against a real ``sandvisor serve --ui`` on a real engine."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI, POLICIES, TEST_POLICIES, require_engine
from tests.e2e.conftest import Daemon, start_daemon

try:
    from playwright.sync_api import Browser, Page, Playwright, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

#: The login link ``sandvisor serve --ui`` prints.
LOGIN_URL = re.compile(r"(http://\S+/ui/login\?token=sandvisor_login_[A-Za-z0-9_-]+)")


def _missing(why: str) -> None:
    if IN_CI:
        pytest.fail(f"CI needs the browser tests to run: {why}", pytrace=False)
    pytest.skip(why)


def chromium_path() -> str:
    """Debian's Chromium (``make browser`` installs it), or ``$SANDVISOR_CHROMIUM``."""
    for name in (os.environ.get("SANDVISOR_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (found := shutil.which(name)):
            return found
    _missing("no chromium binary (run `make browser`, or set SANDVISOR_CHROMIUM)")
    raise AssertionError("unreachable")


@dataclass
class Ui:
    """A daemon serving the dashboard, and what a test needs to use it."""

    daemon: Daemon
    base: str
    """``http://127.0.0.1:<port>``"""
    printed_url: str
    """The login link the daemon printed at start (one use)."""
    projects: Path
    """The daemon's workspace root."""
    tokens: dict[str, str] = field(default_factory=dict)
    """Session id -> the session token it was created with."""

    def api(self, token: str | None = None) -> httpx.Client:
        """The API over the unix socket, as the admin or a session's token."""
        return self.daemon.client(token)

    def tcp(self, **headers: str) -> httpx.Client:
        """The loopback TCP listener, with no credentials unless given as headers."""
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)

    def session(self, sid: str, **body: Any) -> str:
        """Open session ``sid``; its token."""
        with self.api() as c:
            r = c.post("/sessions", json={"session_id": sid, **body})
            assert r.status_code in (200, 201), r.text
            self.tokens[sid] = r.json()["token"]
        return self.tokens[sid]

    def start(self, sid: str, command: str, **spec: Any) -> dict[str, Any]:
        with self.api() as c:
            r = c.post(f"/sessions/{sid}/tasks", json={"command": command, **spec})
            assert r.status_code == 201, r.text
            return dict(r.json())

    def task(self, sid: str, tid: str) -> dict[str, Any]:
        with self.api() as c:
            r = c.get(f"/sessions/{sid}/tasks/{tid}")
            assert r.status_code == 200, r.text
            return dict(r.json())

    def send(self, sid: str, tid: str, text: str) -> None:
        with self.api() as c:
            r = c.post(f"/sessions/{sid}/tasks/{tid}/input", json={"text": text})
            assert r.status_code == 204, r.text

    def wait_task(
        self, sid: str, tid: str, check: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        """The task's info once ``check`` holds (polled: the API has no push for this)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.task(sid, tid)
            if check(info):
                return info
            assert time.monotonic() < deadline, f"task never got there: {info}"
            time.sleep(0.05)

    def login_url(self, token: str | None = None, ttl_s: float = 600) -> str:
        """A new one-time link, as ``sandvisor ui`` gets it (the admin's, or a session token's)."""
        with self.api(token) as c:
            r = c.post("/ui/logins", json={"ttl_s": ttl_s})
            assert r.status_code == 201, r.text
            return str(r.json()["url"])

    def login(self, page: Page, url: str | None = None) -> None:
        """Open a login link in ``page`` and wait for the dashboard."""
        page.goto(url or self.login_url())
        page.wait_for_url(f"{self.base}/ui/")
        page.wait_for_selector("#live-state.live")


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """One ``sandvisor serve --ui`` for a module's tests (each test opens its own sessions)."""
    require_engine()
    root = tmp_path_factory.mktemp("ui")
    policies = root / "policies"
    shutil.copytree(POLICIES, policies)
    for name, text in TEST_POLICIES.items():
        (policies / f"{name}.toml").write_text(text)
    projects = root / "projects"
    projects.mkdir()
    d = start_daemon(
        root / "state",
        policies,
        "--listen",
        "127.0.0.1:0",
        "--ui",
        "--workspace-root",
        str(projects),
    )
    try:
        deadline = time.monotonic() + 10
        while not (m := LOGIN_URL.search(d.log.read_text())):
            assert time.monotonic() < deadline, d.log.read_text()
            time.sleep(0.05)
        assert d.tcp is not None
        yield Ui(d, f"http://{d.tcp}", m.group(1), projects)
    finally:
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc}:\n{d.log.read_text()[-3000:]}"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """One browser per module: Playwright's sync API keeps an event loop running in this
    thread until it stops, and the asyncio tests collected after the browser ones need the
    thread's loop free again."""
    if sync_playwright is None:
        _missing("the playwright package is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    pw: Playwright = sync_playwright().start()
    try:
        # --no-sandbox: the tests run as root, where Chromium's own sandbox cannot start.
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()
    finally:
        pw.stop()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookies) and page; any dialog fails the test."""
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    p = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []
    p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.set_default_timeout(10_000)
    yield p
    context.close()
    assert not dialogs, f"a dialog opened: {dialogs}"
    assert not errors, f"script errors on the page: {errors}"


def docs_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "docs"
