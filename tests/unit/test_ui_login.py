"""The dashboard's login codes and cookies (one use, expiry, cap, revocation), cookie
parsing, and the static files' names and refusal pages, without a daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.errors import SessionNotFound
from supervisor.interfaces.daemon import auth as auth_module
from supervisor.interfaces.daemon.auth import Auth, Principal, cookie_value
from supervisor.interfaces.daemon.guard import _take_query_token
from supervisor.interfaces.daemon.ui_assets import ASSET_NAME, CSP, load_assets, ui_error_page
from supervisor.interfaces.http_errors import Forbidden, Unauthorized


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def redeem(auth: Auth, code: str | None, cookie_ttl_s: float) -> str | None:
    """The cookie value a login code gives (None when refused)."""
    granted = auth.redeem_login(code, cookie_ttl_s)
    return None if granted is None else granted.cookie


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def auth(tmp_path: Path, clock: Clock) -> Auth:
    return Auth(tmp_path / "admin.token", clock=clock)


def test_login_code_works_once_and_gives_a_cookie_for_the_same_principal(auth: Auth) -> None:
    who = Principal("session", "s1")
    code = auth.new_login(who, ttl_s=60)
    assert code.startswith("sandvisor_login_")
    assert auth.check(code) is None  # a code is no bearer token
    cookie = redeem(auth, code, cookie_ttl_s=3600)
    assert cookie is not None and cookie != code
    assert auth.check_cookie(cookie) == who
    assert auth.redeem_login(code, cookie_ttl_s=3600) is None  # spent
    assert auth.check_cookie(code) is None
    assert auth.check(cookie) is None  # a cookie is no bearer token either


def test_each_cookie_has_its_own_csrf_token(auth: Auth, clock: Clock) -> None:
    first = auth.redeem_login(auth.new_login(Principal("admin"), 60), 60)
    second = auth.redeem_login(auth.new_login(Principal("admin"), 60), 60)
    assert first is not None and second is not None
    assert first.csrf.startswith("sandvisor_csrf_") and first.csrf != first.cookie
    assert auth.check_csrf(first.cookie, first.csrf)
    assert auth.check_csrf(second.cookie, second.csrf)
    assert not auth.check_csrf(first.cookie, second.csrf)  # bound to its cookie
    assert not auth.check_csrf(first.cookie, None)
    assert not auth.check_csrf(first.cookie, "")
    assert not auth.check_csrf(None, first.csrf)
    assert not auth.check_csrf(first.csrf, first.cookie)
    assert auth.check(first.csrf) is None and auth.check_cookie(first.csrf) is None
    auth.end_cookie(first.cookie)
    assert not auth.check_csrf(first.cookie, first.csrf)
    clock.now += 60
    assert not auth.check_csrf(second.cookie, second.csrf)  # expires with its cookie


def test_codes_and_cookies_expire(auth: Auth, clock: Clock) -> None:
    code = auth.new_login(Principal("admin"), ttl_s=60)
    clock.now += 60
    assert auth.redeem_login(code, cookie_ttl_s=10) is None
    cookie = redeem(auth, auth.new_login(Principal("admin"), ttl_s=60), cookie_ttl_s=10)
    assert auth.check_cookie(cookie) == Principal("admin")
    clock.now += 10
    assert auth.check_cookie(cookie) is None


def test_unknown_values_and_logout(auth: Auth) -> None:
    assert auth.redeem_login(None, 10) is None
    assert auth.redeem_login("sandvisor_login_made-up", 10) is None
    assert auth.check_cookie("") is None
    cookie = redeem(auth, auth.new_login(Principal("admin"), 60), 60)
    auth.end_cookie(cookie)
    assert auth.check_cookie(cookie) is None


def test_revoking_a_session_ends_its_codes_and_cookies_only(auth: Auth) -> None:
    mine = redeem(auth, auth.new_login(Principal("session", "s1"), 60), 60)
    other = redeem(auth, auth.new_login(Principal("session", "s2"), 60), 60)
    code = auth.new_login(Principal("session", "s1"), 60)
    auth.revoke("s1")
    assert auth.check_cookie(mine) is None
    assert auth.redeem_login(code, 60) is None
    assert auth.check_cookie(other) == Principal("session", "s2")


def test_grants_are_capped_oldest_first(auth: Auth, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module, "MAX_UI_GRANTS_ADMIN", 3)
    codes = [auth.new_login(Principal("admin"), 60) for _ in range(4)]
    assert auth.redeem_login(codes[0], 60) is None
    cookies = [redeem(auth, c, 60) for c in codes[1:]]
    assert all(c is not None for c in cookies)
    fourth = redeem(auth, auth.new_login(Principal("admin"), 60), 60)
    assert auth.check_cookie(cookies[0]) is None  # the admin's own oldest cookie went
    assert all(auth.check_cookie(c) == Principal("admin") for c in [*cookies[1:], fourth])


def test_a_session_minting_many_logins_never_logs_the_admin_or_others_out(auth: Auth) -> None:
    """Each principal has its own budget: a session token that mints and redeems a thousand
    links (the old shared cap) drops only its own oldest codes and cookies."""
    admin = Principal("admin")
    admin_cookie = redeem(auth, auth.new_login(admin, 600), 3600)
    admin_code = auth.new_login(admin, 600)
    other = Principal("session", "s2")
    other_cookie = redeem(auth, auth.new_login(other, 600), 3600)
    other_code = auth.new_login(other, 600)
    me = Principal("session", "s1")
    mine = [redeem(auth, auth.new_login(me, 600), 3600) for _ in range(1000)]
    codes = [auth.new_login(me, 600) for _ in range(1000)]
    assert auth.check_cookie(admin_cookie) == admin
    assert auth.check_cookie(other_cookie) == other
    # The session's own budget is what went: its newest cookies and codes still work.
    budget = auth_module.MAX_UI_GRANTS_SESSION
    assert budget < 1000
    assert auth.check_cookie(mine[0]) is None
    assert all(auth.check_cookie(c) == me for c in mine[-budget:])
    assert auth.redeem_login(codes[0], 60) is None
    assert auth.redeem_login(codes[-1], 60) is not None
    # The admin's and the other session's unredeemed codes were not evicted either.
    assert auth.check_cookie(redeem(auth, admin_code, 60)) == admin
    assert auth.check_cookie(redeem(auth, other_code, 60)) == other


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (None, None),
        ("", None),
        ("sandvisor_ui_1=abc", "abc"),
        ("a=1; sandvisor_ui_1=abc; b=2", "abc"),
        ('sandvisor_ui_1="abc"', "abc"),
        ("sandvisor_ui_12=abc", None),
        ("sandvisor_ui_1=", None),
        ("sandvisor_ui_1=first; sandvisor_ui_1=second", "first"),
    ],
)
def test_cookie_value(header: str | None, value: str | None) -> None:
    assert cookie_value(header, "sandvisor_ui_1") == value


def test_assets_load_and_names_are_plain() -> None:
    assets = load_assets()
    for name in ("overview.html", "session.html", "task.html", "style.css", "common.js"):
        assert name in assets, name
        assert assets[name].etag.startswith('"')
    assert assets["task.js"].media_type.startswith("text/javascript")
    for bad in ("../auth.py", ".hidden.js", "a/b.js", "x.py", "UPPER.js", "x.js\n"):
        assert not ASSET_NAME.match(bad), bad
    # Every page loads only its own module and stylesheet: no inline script or style.
    for page in ("overview.html", "session.html", "task.html"):
        html = assets[page].body.decode()
        assert "<script>" not in html and "style=" not in html and "<style" not in html
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP


def test_refusals_of_pages_are_pages_and_of_the_api_json() -> None:
    page = {"type": "http", "method": "GET", "path": "/ui/sessions/x"}
    assert ui_error_page(page, Unauthorized()) is not None
    assert ui_error_page(page, Forbidden("no")) is not None
    assert ui_error_page(page, SessionNotFound("x")) is not None
    for scope in (
        {"type": "http", "method": "GET", "path": "/sessions/x"},
        {"type": "http", "method": "POST", "path": "/ui/logout"},
        {"type": "http", "method": "GET", "path": "/ui/static/style.css"},
        {"type": "http", "method": "GET", "path": "/uix"},
    ):
        assert ui_error_page(scope, Unauthorized()) is None, scope


@pytest.mark.parametrize(
    ("query", "token", "left"),
    [
        (b"", None, b""),
        (b"after=3", None, b"after=3"),
        (b"sandvisor_csrf=t1", "t1", b""),
        (b"after=3&sandvisor_csrf=t1&task_id=bg-1", "t1", b"after=3&task_id=bg-1"),
        (b"sandvisor_csrf=t1&sandvisor_csrf=t2", "t1", b""),
        (b"x_sandvisor_csrf=t1", None, b"x_sandvisor_csrf=t1"),
    ],
)
def test_the_query_token_is_taken_out_of_the_query(
    query: bytes, token: str | None, left: bytes
) -> None:
    scope: dict[str, object] = {"query_string": query}
    assert _take_query_token(scope) == token
    assert scope["query_string"] == left
