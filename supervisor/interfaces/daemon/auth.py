"""Tokens: an admin token (file, 0600) creates sessions; a session token sees only its session."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

ADMIN_PREFIX = "sbxa_"
SESSION_PREFIX = "sbxs_"


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


class Auth:
    """Holds the admin token and the digests of live session tokens (never the tokens)."""

    def __init__(self, token_file: Path) -> None:
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
        for digest, sid in list(self._sessions.items()):
            if sid == session_id:
                del self._sessions[digest]

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
