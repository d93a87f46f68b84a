"""The HTTP API (FastAPI) over one Supervisor: the app, health and session routes; the task
and event routes live in ``task_routes`` and ``event_routes``."""

from __future__ import annotations

import functools
import json
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from supervisor.core.errors import EngineUnavailable
from supervisor.core.ids import check_session_id
from supervisor.core.problems import InvalidRequest
from supervisor.core.workspace import WorkspaceSpec
from supervisor.interfaces.daemon import errors
from supervisor.interfaces.daemon.auth import Auth, Principal, bearer_token
from supervisor.interfaces.daemon.bodies import CreateSession
from supervisor.interfaces.daemon.deps import (
    Admin,
    SessionId,
    Who,
    known_query,
    session_info,
    session_of,
)
from supervisor.interfaces.daemon.event_routes import add_event_routes
from supervisor.interfaces.daemon.fleet_routes import add_fleet_routes
from supervisor.interfaces.daemon.guard import PUBLIC_PATHS, AppConfig, RequestGuard
from supervisor.interfaces.daemon.limits import (
    BODY_LIMITS,
    DEFAULT_BODY_LIMIT,
    MAX_INPUT_BYTES,
    MAX_TOKENS_PER_SESSION,
)
from supervisor.interfaces.daemon.metrics import add_metrics_route
from supervisor.interfaces.daemon.replies import (
    ERROR_DESCRIPTIONS,
    CreatedSession,
    EndedSession,
    ErrorBody,
    Health,
    Liveness,
    SessionInfo,
    error_responses,
)
from supervisor.interfaces.daemon.task_routes import add_task_routes
from supervisor.interfaces.daemon.ui_routes import UiConfig, add_ui_routes
from supervisor.interfaces.daemon.workspace_routes import add_workspace_routes
from supervisor.runtime.supervisor import Supervisor

#: The OpenAPI description of the API.
API_DESCRIPTION = f"""\
sandbox-supervisor: every background command an agent launches, in its own hardened container.

Every route except `/healthz` needs `Authorization: Bearer <token>`, this document included;
without one, every path answers 401 (never 404 or 405). `/healthz` without the admin token
answers only `{{"ok": true}}` (liveness); with it, the engine and the load. Errors are
`{{"error": {{"code", "message", ...}}}}`.

Request bodies: at most {DEFAULT_BODY_LIMIT} bytes, except a task start
({BODY_LIMITS["/sessions/{session_id}/tasks"]}), `/input`
({BODY_LIMITS["/sessions/{session_id}/tasks/{task_id}/input"]}, and at most
{MAX_INPUT_BYTES} bytes of stdin per request), the workspace's apply (its reviewed digests,
{BODY_LIMITS["/sessions/{session_id}/workspace/apply"]}), undo and discard
({BODY_LIMITS["/sessions/{session_id}/workspace/undo"]}); over it: 413 before the body is
read.

A session may have a workspace (`POST /sessions` with `workspace`): the project directory
its tasks run in. In `overlay` mode their writes stay in a layer of the session's own,
listed, diffed, applied (with a backup, so it can be undone) or discarded under
`/sessions/{{id}}/workspace/`. When the session ends, changes not yet applied are kept
(7 days by default); those routes then answer to the admin token.
JSON types are strict (`false` is not `0`, `"1"` is not `1`) and strings must be valid
Unicode.
"""

__all__ = ["AppConfig", "UiConfig", "create_app"]


def create_app(
    sup: Supervisor, auth: Auth, config: AppConfig | None = None, ui: UiConfig | None = None
) -> FastAPI:
    """Build the API for ``sup``, with the dashboard's routes when ``ui`` is given. The
    caller owns the supervisor's lifetime."""
    config = config or AppConfig()
    app = FastAPI(
        title="sandbox-supervisor",
        version="0.1.0",
        description=API_DESCRIPTION,
        # No documentation UI: Swagger UI and ReDoc load their code from a CDN. The spec
        # itself is served to authenticated callers only.
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(known_query)],
    )
    app.add_middleware(RequestGuard, auth=auth, config=config, routes=lambda: app.router.routes)
    errors.install(app)
    _health_routes(app, sup, auth)
    _session_routes(app, sup, auth)
    add_task_routes(app, sup)
    add_event_routes(app, sup)
    add_fleet_routes(app, sup)
    add_workspace_routes(app, sup)
    add_metrics_route(app, sup)
    if ui is not None:
        add_ui_routes(app, sup, auth, ui)
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, plus the error answers every route can give (401 before anything
    else; 403 Host/Origin on TCP; 408 a late head or body; 422 a bad request; 503 a full
    listener), each error answer with the one error schema, as JSON (also on routes whose
    success is text, bytes or an event stream)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            common = [403, 408, 503]
            if path not in PUBLIC_PATHS:
                common.append(401)
            if "parameters" in operation or "requestBody" in operation:
                common.append(422)
            responses = operation.setdefault("responses", {})
            for status in common:
                responses.setdefault(str(status), {"description": ERROR_DESCRIPTIONS[status]})
            for status, entry in responses.items():
                if int(status) >= 400 and not (path in PUBLIC_PATHS and status == "503"):
                    entry["content"] = error
                    if status == "422":  # FastAPI's default names its own error shape
                        entry["description"] = ERROR_DESCRIPTIONS[422]
    schemas = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    app.openapi_schema = schema
    return schema


def _health_routes(app: FastAPI, sup: Supervisor, auth: Auth) -> None:
    @app.get(
        "/healthz",
        tags=["health"],
        response_model=Health | Liveness,
        responses={
            503: {
                "description": "The admin token: the engine does not answer (a Health body); "
                "anyone: the listener is full (too_many_connections, an error body)",
                "model": Health | ErrorBody,
            },
        },
    )
    async def healthz(request: Request) -> JSONResponse:
        """Liveness for anyone: ``{"ok": true}``, 200, whenever the daemon answers (it
        neither asks the engine nor says anything about it, the sessions or the tasks).
        With the admin token (``Authorization: Bearer``): engine state (``up``, ``wedged``:
        it takes connections but its operations do not complete, ``down``), versions and
        load; 200 when the engine is up, 503 otherwise."""
        who = auth.check(bearer_token(request.headers.get("authorization")))
        if who is None or not who.admin:
            return JSONResponse({"ok": True})
        ok = True
        ready = {policy: count for policy, count in sup.pools.ready().items() if count}
        try:
            await sup.ensure_engine()
        except EngineUnavailable:
            ok = False
        state = sup.engine_state
        ok = ok and state == "up"
        engine: dict[str, object] = {"ok": ok, "state": state, **sup.engine_info}
        if state != "up":
            engine["detail"] = sup.checks.engine_state_detail
        body = {
            "status": "ok" if ok else "degraded",
            "engine": engine,
            "sessions": len(sup.sessions()),
            "running_tasks": sum(s.running_count() for s in sup.sessions()),
            "pool": {"containers": sum(ready.values()), "ready": ready},
        }
        return JSONResponse(body, status_code=200 if ok else 503)


def _session_routes(app: FastAPI, sup: Supervisor, auth: Auth) -> None:
    @app.post(
        "/sessions",
        status_code=201,
        tags=["sessions"],
        response_model=CreatedSession,
        responses=error_responses(400, 404, 413, 507),
    )
    async def create_session(body: CreateSession, who: Admin) -> dict[str, Any]:
        """Admin only: open a session (idempotent per id) and mint a token for it.
        ``workspace``: the project its tasks run on, fixed when it opens; a path outside
        the daemon's workspace roots is a 400 (workspace_outside_roots) naming them."""
        if body.session_id is not None:
            try:
                check_session_id(body.session_id)
            except ValueError as exc:
                raise InvalidRequest([("session_id", str(exc))]) from exc
        spec = None
        if body.workspace is not None:
            spec = WorkspaceSpec(path=body.workspace.path, mode=body.workspace.mode)
        session = await sup.open_session(body.session_id, workspace=spec, policy=body.policy)
        token, digest = auth.new_session_token(session.session_id)
        session.token_digests.append(digest)
        # Each call mints a token; keep the newest few live so "ensure the session exists"
        # loops cannot grow this forever (older tokens of the session are revoked).
        for old in session.token_digests[:-MAX_TOKENS_PER_SESSION]:
            auth.forget(old)
        del session.token_digests[:-MAX_TOKENS_PER_SESSION]
        await sup.store.set_session_data(
            session.session_id, json.dumps({"token_sha256": session.token_digests})
        )
        return {**session_info(session), "token": token}

    @app.get("/sessions", tags=["sessions"], response_model=list[SessionInfo])
    async def list_sessions(who: Who) -> list[dict[str, Any]]:
        """Admin: every open session. A session token: just its own."""
        return [
            session_info(s) for s in sup.sessions() if who.admin or s.session_id == who.session_id
        ]

    @app.get(
        "/sessions/{session_id}",
        tags=["sessions"],
        response_model=SessionInfo,
        responses=error_responses(404),
    )
    async def get_session(session_id: SessionId, who: Who) -> dict[str, Any]:
        """One session."""
        return session_info(session_of(sup, session_id, who))

    async def _end(session_id: str, who: Principal) -> dict[str, Any]:
        session = session_of(sup, session_id, who)
        running = session.running_count()
        await session.end()
        auth.revoke(session_id)
        return {
            "session_id": session_id,
            "ended": True,
            "tasks_stopped": running,
            # The session's end has handed its workspace over: kept when it has changes.
            "workspace_kept": sup.workspaces.get(session_id) is not None,
        }

    @app.delete(
        "/sessions/{session_id}",
        tags=["sessions"],
        response_model=EndedSession,
        responses=error_responses(404),
    )
    async def end_session(session_id: SessionId, who: Who) -> dict[str, Any]:
        """Stop every task, remove the containers, revoke the session's tokens."""
        return await _end(session_id, who)

    @app.post(
        "/sessions/{session_id}/end",
        tags=["sessions"],
        response_model=EndedSession,
        responses=error_responses(404, 413),
    )
    async def end_session_post(session_id: SessionId, who: Who) -> dict[str, Any]:
        """Same as DELETE /sessions/{id}."""
        return await _end(session_id, who)
