"""What the routes share: who is calling, the id path parameters, and a session looked up
for a caller (another session's ids answer exactly like ids that do not exist)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator

from supervisor.core.errors import SessionNotFound
from supervisor.core.ids import SESSION_ID_RE, TASK_ID_RE
from supervisor.core.problems import InvalidRequest
from supervisor.interfaces.daemon.auth import Principal
from supervisor.interfaces.daemon.guard import principal_of
from supervisor.interfaces.http_errors import NotFound, Unauthorized
from supervisor.runtime.session import Session
from supervisor.runtime.supervisor import Supervisor
from supervisor.runtime.workspace import Workspace

#: Declares the bearer scheme in the OpenAPI document; the request guard has already
#: checked the token (before the body was read) when a route runs.
_BEARER = HTTPBearer(
    auto_error=False,
    description="The admin token (`<state-dir>/daemon/admin.token`) or a session's token.",
)


async def principal(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> Principal:
    """The caller, as the request guard admitted it."""
    who = principal_of(request.scope)
    if who is None:  # only on a public route, which does not ask for a principal
        raise Unauthorized()
    return who


Who = Annotated[Principal, Depends(principal)]


async def admin(who: Who) -> Principal:
    """A dependency, so the refusal comes before the body is validated (no 422 leak)."""
    if not who.admin:
        # A session token must not learn whether other sessions exist, nor this route.
        raise NotFound()
    return who


Admin = Annotated[Principal, Depends(admin)]

SessionId = Annotated[
    str,
    Path(pattern=SESSION_ID_RE.pattern, description="1-64 letters, digits, `_.-`"),
]
TaskId = Annotated[str, Path(pattern=TASK_ID_RE.pattern, description="e.g. `bg-7f3a9c2e`")]


# -- query and header values, as strict as JSON bodies --------------------------------------
# A query string is text, so these are parsed from text; but only in the one spelling the
# schema's type has (pydantic alone would also take "1_000", " 1" or "1.0" for an integer and
# "yes", "on" or "1" for a boolean).

_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _spelled(pattern: re.Pattern[str], what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, str) and not pattern.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not {what}")
        return value

    return check


def _boolean(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ("true", "false"):
            raise ValueError(f"{value[:40]!r} is not true or false")
        return value == "true"
    return value


#: Put after ``Query(...)`` in an ``Annotated`` (before it, the range would not reach the
#: OpenAPI document as minimum/maximum).
INTEGER = BeforeValidator(_spelled(_INTEGER, "an integer"))
NUMBER = BeforeValidator(_spelled(_NUMBER, "a number"))
BOOLEAN = BeforeValidator(_boolean)


#: (path template, methods) -> the query parameters that route declares. Keyed by what
#: names a route, since routes themselves are not hashable.
_QUERY_NAMES: dict[tuple[str, frozenset[str]], frozenset[str]] = {}


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` declares, its dependencies' included."""
    key = (route.path, frozenset(route.methods or ()))
    known = _QUERY_NAMES.get(key)
    if known is not None:
        return known
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(p.alias for p in dependant.query_params)
        pending.extend(dependant.dependencies)
    found = _QUERY_NAMES[key] = frozenset(names)
    return found


async def known_query(request: Request) -> None:
    """An app-wide dependency: a query parameter no route declares is a 422 naming it, as
    an unknown field of a JSON body is (a misspelt ``activ=true`` is never silently
    ignored)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    allowed = _query_names(route)
    unknown = sorted({k for k in request.query_params if k not in allowed})
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise InvalidRequest(
            [
                (f"query.{name[:40]}", f"unknown parameter (this route takes: {takes})")
                for name in unknown
            ]
        )


def session_of(sup: Supervisor, session_id: str, who: Principal) -> Session:
    """The session, if ``who`` may see it; SessionNotFound otherwise."""
    if not who.admin and who.session_id != session_id:
        raise SessionNotFound(session_id)
    return sup.session(session_id)


def workspace_info(ws: Workspace | None) -> dict[str, Any] | None:
    """A WorkspaceInfo reply (None without a workspace)."""
    if ws is None:
        return None
    plan = ws.plan
    return {
        "path": plan.host,
        "container_path": plan.container_path,
        "mode": plan.mode,
        "owner": {"uid": plan.owner[0], "gid": plan.owner[1]},
        "warning": plan.warning,
    }


def session_info(session: Session) -> dict[str, Any]:
    """A SessionInfo reply."""
    return {
        "session_id": session.session_id,
        "created_at": session.created_at,
        "ended": session.ended,
        "tasks": session.task_count(),
        "running": session.running_count(),
        "last_seq": session.event_log.last_seq,
        "workspace": workspace_info(session.workspace),
    }
