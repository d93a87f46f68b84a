"""Exceptions to HTTP answers: one status per error class (``interfaces.http_errors``), one
JSON shape for every error (``{"error": {"code", "message", ...}}``), and FastAPI's own
errors brought into it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from supervisor.core.errors import SupervisorError
from supervisor.core.problems import InvalidRequest
from supervisor.interfaces.http_errors import MethodNotAllowed, NotFound, Unauthorized, status_of


def error_body(exc: SupervisorError) -> dict[str, Any]:
    """The JSON answer for ``exc``, with what its code carries besides the message."""
    return exc.to_wire()


def error_response(exc: SupervisorError, *, close: bool = False) -> JSONResponse:
    """``exc`` as an HTTP answer. ``close``: end the connection after it (what is left of
    the request is not worth waiting for)."""
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(exc, MethodNotAllowed):
        headers["Allow"] = ", ".join(exc.allowed)
    if close:
        headers["Connection"] = "close"
    return JSONResponse(error_body(exc), status_code=status_of(exc), headers=headers)


def install(app: FastAPI) -> None:
    """Route every error the app can raise into ``error_response``."""

    @app.exception_handler(SupervisorError)
    async def _ours(request: Request, exc: SupervisorError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(InvalidRequest.from_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The request guard answers unknown routes and methods before routing; these are the
        # router's own answers, kept in the same shape.
        if exc.status_code == 404:
            return error_response(NotFound())
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "").split(", ")
            return error_response(MethodNotAllowed(request.method, filter(None, allowed)))
        if exc.status_code == 400:
            # FastAPI's "error parsing the body": the same 422 as a JSON decode error.
            return error_response(InvalidRequest([("body", str(exc.detail))]))
        body = {"error": {"code": "http_error", "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback after this answer; the client gets JSON, not text.
        body = {"error": {"code": "internal_error", "message": "internal error (see the log)"}}
        return JSONResponse(body, status_code=500)
