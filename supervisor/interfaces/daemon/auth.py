"""Tokens: an admin token (file, 0600) creates sessions; a session token sees only its session.
The dashboard's one-time login codes and the cookies they are exchanged for live here too."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ADMIN_PREFIX = "sandvisor_admin_"
SESSION_PREFIX = "sandvisor_session_"
LOGIN_PREFIX = "sandvisor_login_"
CSRF_PREFIX = "sandvisor_csrf_"
#: Live login codes, and dashboard cookies, each principal may hold at most: the admin, and
#: each session (all of its tokens together). Minting more drops that principal's own
#: oldest, never another's: a session's token cannot log the admin (or another session) out.
MAX_UI_GRANTS_ADMIN = 1000
MAX_UI_GRANTS_SESSION = 64


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin, or the holder of one session's token."""

    kind: str  # "admin" | "session"
    session_id: str | None = None

    @property
    def admin(self) -> bool:
        return self.kind == "admin"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (no other scheme counts)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def cookie_value(header: str | None, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header (the first, if sent twice)."""
    if not header:
        return None
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"') or None
    return None


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a file of mode 0600 from the start (never
    world-readable, not even briefly). Readers see the old content or the new, never an
    empty or half-written file (a client reading daemon.json while a daemon restarts)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data) :]
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


@dataclass(frozen=True)
class _Grant:
    """What a login code or a dashboard cookie stands for, until when (monotonic clock)."""

    principal: Principal
    expires_at: float
    csrf: str = ""
    """A cookie's: the digest of the CSRF token that must come with its state changes."""


@dataclass(frozen=True)
class UiLogin:
    """What redeeming a login code gives the browser: the cookie's value, and the CSRF
    token the dashboard's script sends (``X-Sandvisor-CSRF``) with every request that
    changes state. The token never travels in a cookie: browsers send cookies to every
    port of a host, so a cookie alone must not be enough to change anything."""

    cookie: str
    csrf: str


def _budget(who: Principal) -> int:
    return MAX_UI_GRANTS_ADMIN if who.admin else MAX_UI_GRANTS_SESSION


class _Grants:
    """Login codes (or cookies) by digest, with one budget per principal."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._all: dict[str, _Grant] = {}
        # principal -> its digests, oldest first (dicts keep insertion order).
        self._by: dict[Principal, dict[str, None]] = {}

    def add(self, digest: str, grant: _Grant) -> None:
        now = self._clock()
        for old in list(self._by.get(grant.principal, ())):
            if self._all[old].expires_at <= now:
                self.remove(old)
        mine = self._by.setdefault(grant.principal, {})
        while len(mine) >= _budget(grant.principal):
            self.remove(next(iter(mine)))
        self._all[digest] = grant
        mine[digest] = None

    def get(self, digest: str) -> _Grant | None:
        grant = self._all.get(digest)
        if grant is not None and grant.expires_at <= self._clock():
            self.remove(digest)
            return None
        return grant

    def remove(self, digest: str) -> None:
        grant = self._all.pop(digest, None)
        if grant is None:
            return
        mine = self._by.get(grant.principal)
        if mine is not None:
            mine.pop(digest, None)
            if not mine:
                del self._by[grant.principal]

    def remove_session(self, session_id: str) -> None:
        for who in [w for w in self._by if w.session_id == session_id]:
            for digest in list(self._by.get(who, ())):
                self.remove(digest)


class Auth:
    """Holds the admin token and the digests of live session tokens (never the tokens), and
    the digests of the dashboard's login codes and cookies."""

    def __init__(self, token_file: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._logins = _Grants(clock)
        self._cookies = _Grants(clock)
        self.token_file = token_file
        if token_file.exists():
            token = token_file.read_text().strip()
            os.chmod(token_file, 0o600)
        else:
            token = ADMIN_PREFIX + secrets.token_urlsafe(32)
            write_private(token_file, token + "\n")
        self._admin_digest = _digest(token)
        self._sessions: dict[str, str] = {}  # digest -> session id

    def new_session_token(self, session_id: str) -> tuple[str, str]:
        """A fresh token for ``session_id``: (token, digest to persist)."""
        token = SESSION_PREFIX + secrets.token_urlsafe(32)
        digest = _digest(token)
        self._sessions[digest] = session_id
        return token, digest

    def restore(self, session_id: str, digest: str) -> None:
        """Re-arm a session token from its stored digest (daemon restart)."""
        self._sessions[digest] = session_id

    def forget(self, digest: str) -> None:
        """Revoke one token by its digest."""
        self._sessions.pop(digest, None)

    def revoke(self, session_id: str) -> None:
        """Revoke every token of a session, and its login codes and dashboard cookies."""
        for digest, sid in list(self._sessions.items()):
            if sid == session_id:
                del self._sessions[digest]
        self._logins.remove_session(session_id)
        self._cookies.remove_session(session_id)

    def check(self, token: str | None) -> Principal | None:
        """The principal for a bearer token, or None. Compared as digests in constant time."""
        if not token:
            return None
        digest = _digest(token)
        if hmac.compare_digest(digest, self._admin_digest):
            return Principal("admin")
        sid = self._sessions.get(digest)
        if sid is not None:
            # The dict lookup is on a digest an attacker cannot steer; confirm exactly anyway.
            for known, known_sid in self._sessions.items():
                if known_sid == sid and hmac.compare_digest(known, digest):
                    return Principal("session", sid)
        return None

    # -- the dashboard ---------------------------------------------------------------------

    def _grant(self, grants: _Grants, prefix: str, who: Principal, ttl_s: float) -> str:
        secret = prefix + secrets.token_urlsafe(32)
        grants.add(_digest(secret), _Grant(who, self._clock() + ttl_s))
        return secret

    def _lookup(self, grants: _Grants, secret: str | None) -> tuple[str, _Grant] | None:
        if not secret:
            return None
        digest = _digest(secret)
        grant = grants.get(digest)
        return None if grant is None else (digest, grant)

    def new_login(self, who: Principal, ttl_s: float) -> str:
        """A one-time login code for ``who``, valid for ``ttl_s`` seconds."""
        return self._grant(self._logins, LOGIN_PREFIX, who, ttl_s)

    def redeem_login(self, code: str | None, cookie_ttl_s: float) -> UiLogin | None:
        """Exchange a login code (once) for a new dashboard cookie and its CSRF token; None
        when the code is unknown, used or expired."""
        found = self._lookup(self._logins, code)
        if found is None:
            return None
        digest, grant = found
        self._logins.remove(digest)  # one use only, whatever happens next
        cookie = secrets.token_urlsafe(32)
        csrf = CSRF_PREFIX + secrets.token_urlsafe(32)
        expires_at = self._clock() + cookie_ttl_s
        self._cookies.add(_digest(cookie), _Grant(grant.principal, expires_at, _digest(csrf)))
        return UiLogin(cookie, csrf)

    def check_cookie(self, value: str | None) -> Principal | None:
        """The principal a dashboard cookie stands for, or None."""
        found = self._lookup(self._cookies, value)
        return None if found is None else found[1].principal

    def check_csrf(self, cookie: str | None, token: str | None) -> bool:
        """Whether ``token`` is the CSRF token of the live dashboard cookie ``cookie``."""
        found = self._lookup(self._cookies, cookie)
        if found is None or not token or not found[1].csrf:
            return False
        return hmac.compare_digest(_digest(token), found[1].csrf)

    def end_cookie(self, value: str | None) -> None:
        """Log a dashboard cookie out."""
        found = self._lookup(self._cookies, value)
        if found is not None:
            self._cookies.remove(found[0])
