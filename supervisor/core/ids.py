"""Identifiers: task ids, session ids, the supervisor instance id."""

from __future__ import annotations

import re
import secrets

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TASK_ID_RE = re.compile(r"^bg-[0-9a-f]{8}$")


def new_task_id() -> str:
    """``bg-`` + 32 random bits: short to read, hard to guess, checked for collisions."""
    return f"bg-{secrets.token_hex(4)}"


def new_session_id() -> str:
    """A random session id for callers that do not name their session."""
    return f"s-{secrets.token_hex(6)}"


def check_session_id(session_id: str) -> str:
    """Session ids become directory names: letters, digits, ``_.-``; at most 64 chars."""
    if not SESSION_ID_RE.match(session_id) or session_id in (".", ".."):
        raise ValueError(
            f"session id {session_id!r} is invalid: use 1-64 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return session_id
