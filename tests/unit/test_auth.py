"""Tokens are compared as digests, in constant time (hmac.compare_digest), and the admin
token's file is private. Moved from tests/e2e/test_auth.py: it needs no daemon."""

from __future__ import annotations

import hmac
import stat
from pathlib import Path
from typing import Any

import pytest

from supervisor.interfaces.daemon.auth import Auth

pytestmark = pytest.mark.unit


def test_tokens_compared_in_constant_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check goes through hmac.compare_digest, for admin, session and wrong tokens."""
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    # auth.py looks hmac.compare_digest up at call time, so patching the module catches it.
    monkeypatch.setattr(hmac, "compare_digest", spy)
    auth = Auth(tmp_path / "daemon" / "admin.token")
    admin_token = (tmp_path / "daemon" / "admin.token").read_text().strip()
    assert stat.S_IMODE((tmp_path / "daemon" / "admin.token").stat().st_mode) == 0o600
    token, digest = auth.new_session_token("s1")
    assert token not in digest

    p = auth.check(admin_token)
    assert p is not None and p.admin
    assert len(calls) == 1
    calls.clear()
    p = auth.check(token)
    assert p is not None and (p.kind, p.session_id) == ("session", "s1")
    assert any(b == digest or a == digest for a, b in calls)
    calls.clear()
    assert auth.check("sandvisor_session_" + "A" * 43) is None
    assert len(calls) >= 1  # the admin comparison runs even for unknown tokens
    # Compared as fixed-length digests: the token's length does not shape the comparison.
    assert all(len(a) == len(b) == 64 for a, b in calls)
    calls.clear()
    assert auth.check("") is None
    assert auth.check(None) is None
    auth.revoke("s1")
    assert auth.check(token) is None
