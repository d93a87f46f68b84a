"""The dashboard's acceptance in Chromium: logging in through the printed link, the live task
table, a task's live transcript (line-bounded), stopping, answering a prompt, one session's
login kept out of another's, escaping, and the refusals (401 without a login, 403 from a
foreign Origin)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from typing import ClassVar

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Ui

pytestmark = pytest.mark.timeout(180)

#: Echoes each stdin line at once; ``part <x>`` prints ``<x>`` with no newline and ``nl``
#: ends that line: the test decides when a line (or half of one) is printed.
ECHO = (
    'while read -r l; do case "$l" in nl) echo;; part\\ *) printf "%s" "${l#part }";; '
    '*) echo "$l";; esac; done'
)


def csrf(page: Page) -> str:
    """The login's CSRF token, where the dashboard's script keeps it."""
    token = page.evaluate("localStorage.getItem('sandvisor.csrf')")
    assert isinstance(token, str), token
    return token


def row(page: Page, tid: str) -> str:
    return f'#tasks-table tr[data-task-id="{tid}"]'


def test_login_through_printed_link_then_live_table_and_transcript(ui: Ui, page: Page) -> None:
    ui.session("live")
    # The link the daemon printed logs the browser in, once.
    ui.login(page, ui.printed_url)
    cookies = page.context.cookies()
    assert len(cookies) == 1
    assert cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict"
    with ui.tcp() as c:
        assert c.get(ui.printed_url.removeprefix(ui.base)).status_code == 401  # spent

    # A task started from the API is in the table within 1 s.
    task = ui.start("live", ECHO, description="echo", policy="fast")
    tid = task["task_id"]
    t0 = time.monotonic()
    page.wait_for_selector(row(page, tid), timeout=1000)
    assert time.monotonic() - t0 < 1.0
    ui.wait_task("live", tid, lambda t: t["status"] == "running")

    # Its page: the command first, then each new line within 1 s of being printed.
    page.click(f'{row(page, tid)} a[href$="{tid}"]')
    page.wait_for_url(re.compile(f"/ui/sessions/live/tasks/{tid}$"))
    expect(page.locator("#command")).to_have_text(ECHO)
    lines = page.locator("#transcript .line")
    for text in ("first line", "second line"):
        ui.send("live", tid, f"{text}\n")
        t0 = time.monotonic()
        expect(lines.last).to_have_text(text, timeout=1000)
        assert time.monotonic() - t0 < 1.0

    # A partial line is held until its newline: once the page has read past the bytes
    # "half" (its offset says so), no line shows them; the newline brings them within 1 s.
    ui.send("live", tid, "part half\n")
    size = len("first line\nsecond line\nhalf")
    ui.wait_task("live", tid, lambda t: t["output_bytes"] >= size)
    expect(page.locator(f'#transcript[data-offset="{size}"]')).to_be_attached(timeout=5000)
    expect(page.locator("#transcript .line", has_text="half")).to_have_count(0)
    ui.send("live", tid, "nl\n")
    t0 = time.monotonic()
    expect(lines.last).to_have_text("half", timeout=1000)
    assert time.monotonic() - t0 < 1.0
    expect(lines).to_have_count(3)


def test_partial_line_flushed_when_the_task_ends(ui: Ui, page: Page) -> None:
    ui.session("flush")
    task = ui.start("flush", "echo whole; printf 'no newline at the end'", policy="fast")
    ui.wait_task("flush", task["task_id"], lambda t: t["status"] == "completed")
    ui.login(page)
    page.goto(f"{ui.base}/ui/sessions/flush/tasks/{task['task_id']}")
    expect(page.locator("#transcript[data-eof=true]")).to_be_attached()
    lines = page.locator("#transcript .line")
    expect(lines).to_have_text(["whole", "no newline at the end"])
    expect(lines.last).to_have_class(re.compile("no-eol"))
    expect(page.locator("#status")).to_contain_text("completed, exit code 0")
    # The download link: the whole output file, as an attachment, on the cookie and the
    # login's CSRF token (a link cannot send a header: it is in the query).
    href = page.locator("#download").get_attribute("href")
    assert (
        href == f"/sessions/flush/tasks/{task['task_id']}/output/file?sandvisor_csrf={csrf(page)}"
    )
    download = page.context.request.get(f"{ui.base}{href}")
    assert download.status == 200
    assert download.body() == b"whole\nno newline at the end"
    assert download.headers["content-disposition"].startswith("attachment")


def test_stop_button_kills_and_table_says_user_stopped(ui: Ui, page: Page) -> None:
    ui.session("stopper")
    ui.login(page)
    task = ui.start("stopper", "sleep 600", description="sleeper", policy="fast")
    tid = task["task_id"]
    ui.wait_task("stopper", tid, lambda t: t["status"] == "running")
    button = page.locator(f"{row(page, tid)} button.stop")
    button.click()
    expect(page.locator(f'{row(page, tid)} td[data-col="status"]')).to_have_text(
        "killed, user stopped", timeout=15_000
    )
    assert ui.task("stopper", tid)["reason"] == "user_stopped"
    expect(button).to_have_count(0)  # an ended task has no stop button


def test_input_box_answers_prompt_and_badge_clears(ui: Ui, page: Page) -> None:
    ui.session("prompt")
    ui.login(page)
    command = "printf 'Your name? '; read -r n; echo \"hello $n\"; sleep 600"
    task = ui.start("prompt", command, description="asks", stall_after_s=1, policy="fast")
    tid = task["task_id"]
    badge = page.locator(f"{row(page, tid)} .badge.stalled")
    expect(badge).to_have_text("waiting for input", timeout=20_000)
    page.click(f'{row(page, tid)} a[href$="{tid}"]')
    expect(page.locator("#status .badge.stalled")).to_be_visible()
    expect(page.locator("#prompt")).to_be_visible()
    expect(page.locator("#prompt-text")).to_have_text("Your name?")
    page.fill("#input-line", "Ada")
    page.press("#input-line", "Enter")
    expect(page.locator("#transcript .line").last).to_have_text("Your name? hello Ada")
    expect(page.locator("#status .badge.stalled")).to_have_count(0)
    expect(page.locator("#prompt")).to_be_hidden()
    assert ui.task("prompt", tid)["stalled"] is False
    assert ui.task("prompt", tid)["status"] == "running"  # the badge cleared, not the task
    page.goto(f"{ui.base}/ui/")
    expect(page.locator(row(page, tid))).to_be_visible()
    expect(badge).to_have_count(0)


def test_session_login_sees_only_its_session(ui: Ui, page: Page) -> None:
    mine = ui.session("mine")
    ui.session("theirs")
    own = ui.start("mine", "sleep 600", description="own task", policy="fast")
    other = ui.start("theirs", "sleep 600", description="other task", policy="fast")
    ui.login(page, ui.login_url(mine))
    expect(page.locator(row(page, own["task_id"]))).to_be_visible()
    expect(page.locator("#sessions-table tbody tr")).to_have_count(1)
    expect(page.locator("#sessions-table tbody tr")).to_have_attribute("data-session-id", "mine")
    expect(page.locator(row(page, other["task_id"]))).to_have_count(0)
    # The other session's pages, and its API behind the cookie, answer 404.
    for path in ("/ui/sessions/theirs", f"/ui/sessions/theirs/tasks/{other['task_id']}"):
        response = page.goto(f"{ui.base}{path}")
        assert response is not None and response.status == 404
        expect(page.locator("h1")).to_have_text("Not found")
    api = page.context.request
    own = {"X-Sandvisor-CSRF": csrf(page)}
    assert api.get(f"{ui.base}/sessions/theirs/tasks", headers=own).status == 404
    assert api.get(f"{ui.base}/sessions/mine/tasks", headers=own).status == 200
    tasks = api.get(f"{ui.base}/tasks", headers=own).json()
    assert {t["session_id"] for t in tasks} == {"mine"}
    with ui.api() as c:
        for sid in ("mine", "theirs"):
            c.post(f"/sessions/{sid}/end")


def test_script_in_command_and_output_is_shown_as_text(ui: Ui, page: Page) -> None:
    ui.session("xss")
    ui.login(page)
    evil = "<script>alert(1)</script>"
    command = f"echo '{evil}'; echo '<img src=x onerror=alert(2)>'"
    task = ui.start("xss", command, description=evil, policy="fast")
    tid = task["task_id"]
    ui.wait_task("xss", tid, lambda t: t["status"] == "completed")
    expect(page.locator(f'{row(page, tid)} td[data-col="command"]')).to_have_text(command)
    expect(page.locator(f'{row(page, tid)} td[data-col="description"]')).to_have_text(evil)
    page.goto(f"{ui.base}/ui/sessions/xss/tasks/{tid}")
    expect(page.locator("#command")).to_have_text(command)
    expect(page.locator("#title")).to_have_text(evil)
    expect(page.locator("#transcript .line")).to_have_text([evil, "<img src=x onerror=alert(2)>"])
    assert page.locator("#transcript script, #transcript img, #title script").count() == 0
    # The session page renders the notifications the agent got: the same text, escaped.
    page.goto(f"{ui.base}/ui/sessions/xss")
    expect(page.locator("#timeline li").last).to_contain_text("alert(1)")
    assert page.locator("#timeline script").count() == 0
    # The page fixture fails the test if any dialog opened.


def test_refusals_without_login_and_from_foreign_origin(ui: Ui, page: Page) -> None:
    ui.session("guarded")
    ui.login(page)
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())
    foreign = "http://evil.example"
    with ui.tcp() as anon:
        for path in ("/ui/", "/ui/sessions/guarded", "/tasks", "/sessions", "/events/stream"):
            assert anon.get(path).status_code == 401, path
        assert anon.post("/ui/logins", json={}).status_code == 401
        assert anon.get("/ui/login?token=sandvisor_login_made-up").status_code == 401
        assert anon.get("/ui/", headers={"Cookie": "sandvisor_ui_1=made-up"}).status_code == 401
        assert anon.get("/tasks", headers={"Origin": foreign}).status_code == 403
    token = csrf(page)
    assert token.startswith("sandvisor_csrf_")
    with ui.tcp(Cookie=cookie) as logged_in:
        # The cookie alone opens the pages (they hold no data), not the API, not even reads.
        assert logged_in.get("/ui/").status_code == 200
        r = logged_in.get("/tasks")
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_csrf"
        assert logged_in.get("/tasks", headers={"X-Sandvisor-CSRF": token}).status_code == 200
        assert logged_in.get(f"/tasks?sandvisor_csrf={token}").status_code == 200
        assert logged_in.get("/tasks", headers={"Origin": foreign}).status_code == 403
        stop = "/sessions/guarded/tasks/bg-00000000/stop"
        assert logged_in.post(stop, headers={"Origin": foreign}).status_code == 403
        # A state change on the cookie alone, with no Origin at all, is refused too.
        assert logged_in.post(stop).status_code == 403
        # An allowed Origin is not enough either: it needs the login's CSRF token.
        r = logged_in.post(stop, headers={"Origin": ui.base})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_csrf"
        own = {"Origin": ui.base, "X-Sandvisor-CSRF": token}
        assert logged_in.post(stop, headers=own).status_code == 404
        assert logged_in.get("/ui/", headers={"Host": "evil.example"}).status_code == 403
    # Logging out ends the cookie at once.
    page.click("#logout")
    expect(page.locator("#notice")).to_contain_text("Logged out")
    with httpx.Client(base_url=ui.base, headers={"Cookie": cookie}) as after:
        assert after.get("/tasks").status_code == 401


class _CookieCatcher(http.server.BaseHTTPRequestHandler):
    """Another local server on another port, as any the user visits: it records the Cookie
    header each request brings."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Cookie", ""))
        body = b"<!doctype html><title>another local app</title><p>hello"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_another_port_gets_the_cookie_but_cannot_change_anything(ui: Ui, page: Page) -> None:
    """Issue 22, item 10: cookies are scoped by host, not port, so a page on another
    loopback port receives the dashboard's cookie. Replayed with a forged Origin it is
    refused for want of the CSRF token; the dashboard itself still stops the task."""
    ui.session("ports")
    ui.login(page)
    assert page.url == f"{ui.base}/ui/"  # the token left the address at once
    task = ui.start("ports", "sleep 600", description="sleeper", policy="fast")
    tid = task["task_id"]
    ui.wait_task("ports", tid, lambda t: t["status"] == "running")
    _CookieCatcher.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CookieCatcher)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        expect(page.locator("p")).to_have_text("hello")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    (dashboard_cookie,) = page.context.cookies()
    leaked = f"{dashboard_cookie['name']}={dashboard_cookie['value']}"
    assert any(leaked in header for header in _CookieCatcher.seen), _CookieCatcher.seen
    # The other port's server replays what it got, with the dashboard's own Origin.
    replay = {"Cookie": _CookieCatcher.seen[0], "Origin": ui.base}
    with ui.tcp(**replay) as attacker:
        for path, body in ((f"/sessions/ports/tasks/{tid}/stop", None), ("/ui/logins", {})):
            r = attacker.post(path, json=body)
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["code"] == "forbidden_csrf"
        # Reading is refused too: the task list, its output, the event stream.
        for path in ("/tasks", f"/sessions/ports/tasks/{tid}/output", "/events/stream"):
            r = attacker.get(path)
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["code"] == "forbidden_csrf"
    assert ui.task("ports", tid)["status"] == "running"
    # The dashboard (its script holds the token) stops it from the UI.
    page.goto(f"{ui.base}/ui/sessions/ports/tasks/{tid}")
    page.click("#stop")
    expect(page.locator("#status")).to_contain_text("user stopped", timeout=15_000)
    assert ui.task("ports", tid)["reason"] == "user_stopped"


def test_sandvisor_ui_prints_a_working_link(ui: Ui, page: Page) -> None:
    token = ui.session("cli-login")
    done = ui.daemon.sandvisor("ui")
    assert done.returncode == 0, done.stderr
    url = done.stdout.decode().strip()
    assert url.startswith(f"{ui.base}/ui/login?token=sandvisor_login_")
    ui.login(page, url)
    expect(page.locator('#sessions-table tr[data-session-id="cli-login"]')).to_be_visible()
    # With a session's token, the link sees that session only.
    ui.daemon.env["SANDVISOR_TOKEN"] = token
    try:
        scoped = ui.daemon.sandvisor("ui", "--json", "--ttl", "1m")
    finally:
        del ui.daemon.env["SANDVISOR_TOKEN"]
    assert scoped.returncode == 0, scoped.stderr
    other = page.context.browser.new_context()  # type: ignore[union-attr]
    try:
        p2 = other.new_page()
        ui.login(p2, json.loads(scoped.stdout)["url"])
        expect(p2.locator("#sessions-table tbody tr")).to_have_count(1)
        expect(p2.locator("#sessions-table tbody tr")).to_have_attribute(
            "data-session-id", "cli-login"
        )
    finally:
        other.close()
