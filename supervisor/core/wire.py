"""Errors on the wire: every error class registered by its ``code`` (the modules that define
them are imported here, so the registry is whole), and a daemon's answer turned back into
the same class. The HTTP side of it (statuses, the client's ``from_wire``) is
``supervisor.interfaces.http_errors``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from supervisor.core import (
    problems,  # noqa: F401 - registers InvalidRequest
    workspace_errors,  # noqa: F401 - registers the workspace errors
)
from supervisor.core.errors import _BY_CODE, SupervisorError


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
