"""Errors on the wire: every error class registered by its ``code`` (the modules that define
them are imported here, so the registry is whole), and a daemon's answer turned back into
the same class. The daemon answers with ``exc.status`` and ``exc.to_wire()``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from supervisor.core import (
    problems,  # noqa: F401 - registers InvalidRequest
    workspace_errors,  # noqa: F401 - registers the workspace errors
)
from supervisor.core.errors import _BY_CODE, HttpError, SupervisorError


def error_class(code: str) -> type[SupervisorError]:
    """The class registered for ``code`` (the root class for a code nobody registered)."""
    return _BY_CODE.get(code, SupervisorError)


def registered_codes() -> Mapping[str, type[SupervisorError]]:
    """Every registered code and its class (read-only)."""
    return MappingProxyType(_BY_CODE)


def make_error(
    code: str,
    message: str,
    detail: Mapping[str, Any] | None = None,
    *,
    task_id: str | None = None,
    session_id: str | None = None,
) -> SupervisorError:
    """An instance of the class registered for ``code``. Keeps ``code`` when nobody
    registered it (an error of a newer daemon), so callers can still show it."""
    known = {k: v for k, v in (("task_id", task_id), ("session_id", session_id)) if v}
    cls = error_class(code)
    exc = cls._rebuild(message, detail or {}, known)
    if not isinstance(exc, SupervisorError):
        exc = SupervisorError(message)
    if exc.code != code:
        exc.code = code
    return exc


def from_wire(
    body: object, status: int, *, task_id: str | None = None, session_id: str | None = None
) -> SupervisorError:
    """The error a daemon's answer ``{"error": {"code", "message", ...}}`` stands for, with
    ``status`` and ``body`` set. ``task_id``/``session_id``: the ids the request named, for
    errors whose body does not carry them. An answer that is not the API's JSON (a proxy's
    error page) becomes :class:`HttpError`."""
    detail = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(detail, Mapping):
        detail = {}
    code = str(detail.get("code") or HttpError.code)
    message = str(detail.get("message") or "") or f"the daemon answered HTTP {status}"
    exc = make_error(code, message, detail, task_id=task_id, session_id=session_id)
    exc.status = status
    exc.body = dict(body) if isinstance(body, Mapping) else {}
    return exc
