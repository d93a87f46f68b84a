"""The one error tree: every class registered by its code, and a daemon's error body turned
back into the same class (what the HTTP client raises)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import supervisor.interfaces.http_errors as edge
from supervisor.core import errors
from supervisor.core.errors import (
    SessionNotFound,
    SpecError,
    SupervisorError,
    TaskNotFound,
    TaskNotRunning,
)
from supervisor.core.models import TaskInfo
from supervisor.core.problems import InvalidRequest, field_problems
from supervisor.core.wire import error_class, make_error, registered_codes
from supervisor.interfaces.http_errors import (
    DaemonError,
    DaemonNotRunning,
    ForbiddenHost,
    HttpError,
    NotFound,
    Unauthorized,
    from_wire,
    status_of,
)

#: Every code the daemon answers with (daemon/app.py), and what it means here.
DAEMON_CODES: dict[str, type[SupervisorError]] = {
    "task_not_found": TaskNotFound,
    "session_not_found": SessionNotFound,
    "session_ended": errors.SessionEnded,
    "task_not_running": TaskNotRunning,
    "stdin_closed": errors.StdinClosed,
    "wait_timeout": errors.WaitTimeout,
    "policy_error": errors.PolicyError,
    "invalid_spec": SpecError,
    "limit_exceeded": errors.LimitExceeded,
    "engine_unavailable": errors.EngineUnavailable,
    "engine_unresponsive": errors.EngineUnresponsive,
    "image_missing": errors.ImageMissing,
    "runtime_unavailable": errors.RuntimeUnavailable,
    "state_storage_error": errors.StateStorageError,
    "engine_error": errors.EngineError,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "invalid_request": InvalidRequest,
    "forbidden_host": ForbiddenHost,
    "forbidden_origin": edge.ForbiddenOrigin,
    "forbidden_csrf": edge.ForbiddenCsrf,
    "method_not_allowed": edge.MethodNotAllowed,
    "request_too_large": edge.RequestTooLarge,
    "input_too_large": edge.InputTooLarge,
    "request_timeout": edge.RequestTimeout,
    "too_many_connections": edge.TooManyConnections,
    "http_error": HttpError,
}


def _subclasses(cls: type[SupervisorError]) -> list[type[SupervisorError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def info(**fields: Any) -> TaskInfo:
    base: dict[str, Any] = {
        "task_id": "bg-1",
        "session_id": "s",
        "command": "true",
        "description": "",
        "kind": "background",
        "policy": "default",
        "status": "completed",
        "reason": "exit",
        "exit_code": 0,
        "output_path": "/o",
        "persistent": False,
        "timeout_ms": 1000,
        "stdin": "pipe",
        "created_at": 1.0,
    }
    return TaskInfo.model_validate({**base, **fields})


def test_every_class_is_registered_by_its_own_code() -> None:
    codes = registered_codes()
    classes: list[type[SupervisorError]] = [SupervisorError, *_subclasses(SupervisorError)]
    for cls in classes:
        assert "code" in cls.__dict__, f"{cls.__qualname__} has no code of its own"
        assert codes[cls.code] is cls
        assert error_class(cls.code) is cls
    assert len(set(codes)) == len(codes)


@pytest.mark.parametrize(("code", "cls"), DAEMON_CODES.items())
def test_every_daemon_code_has_its_class(code: str, cls: type[SupervisorError]) -> None:
    assert error_class(code) is cls


def test_a_second_class_may_not_take_a_code() -> None:
    with pytest.raises(TypeError, match="'task_not_found' is taken by TaskNotFound"):

        class Again(SupervisorError):
            code = "task_not_found"


def test_builtin_families() -> None:
    assert issubclass(DaemonNotRunning, ConnectionError)
    assert issubclass(DaemonNotRunning, DaemonError)
    assert issubclass(NotFound, LookupError)
    assert issubclass(Unauthorized, PermissionError)
    assert issubclass(InvalidRequest, SpecError) and issubclass(InvalidRequest, ValueError)
    assert issubclass(edge.RequestTooLarge, ValueError)


# -- from the wire ----------------------------------------------------------------------------


def test_task_not_running_carries_the_final_task() -> None:
    ended = info(status="killed", reason="user_stopped", exit_code=None)
    body = TaskNotRunning(ended).to_wire()
    assert body["error"]["task"] == ended.model_dump(mode="json")
    exc = from_wire(body, 409)
    assert isinstance(exc, TaskNotRunning)
    assert exc.info == ended
    assert str(exc) == "task bg-1 is not running (killed, user stopped)"
    assert (status_of(exc), exc.body) == (409, body)


def test_ids_come_from_the_body_or_from_the_request() -> None:
    bare = {"error": {"code": "task_not_found", "message": "no task 'bg-9' in this session"}}
    exc = from_wire(bare, 404, task_id="bg-9", session_id="s")
    assert isinstance(exc, TaskNotFound) and isinstance(exc, LookupError)
    assert (exc.task_id, str(exc), status_of(exc)) == (
        "bg-9",
        "no task 'bg-9' in this session",
        404,
    )
    again = from_wire(TaskNotFound("bg-7").to_wire(), 404, task_id="other")
    assert isinstance(again, TaskNotFound) and again.task_id == "bg-7"
    gone = from_wire({"error": {"code": "session_not_found", "message": "m"}}, 404, session_id="x")
    assert isinstance(gone, SessionNotFound) and gone.session_id == "x"


@pytest.mark.parametrize(
    "exc",
    [
        TaskNotFound("bg-2"),
        SessionNotFound("s9"),
        SpecError("policy 'x' does not allow persistent tasks", field="persistent"),
        SpecError("no field named"),
        InvalidRequest("timeout_ms: too big", fields=[{"field": "timeout_ms", "message": "big"}]),
        errors.ImageMissing("image sandvisor/x:latest is not present"),
        Unauthorized("missing or invalid bearer token"),
        DaemonNotRunning("nobody listens"),
    ],
)
def test_round_trip(exc: SupervisorError) -> None:
    back = from_wire(exc.to_wire(), status_of(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.code == exc.code
    assert back.wire_detail() == exc.wire_detail()


def test_spec_error_names_its_field() -> None:
    exc = SpecError("policy 'x' does not allow persistent tasks", field="persistent")
    assert str(exc) == "persistent: policy 'x' does not allow persistent tasks"
    assert exc.problem == "policy 'x' does not allow persistent tasks"
    back = from_wire(exc.to_wire(), 400)
    assert isinstance(back, SpecError) and back.field == "persistent"
    # Without the field in the body (today's daemon) the message is all there is.
    plain = from_wire({"error": {"code": "invalid_spec", "message": str(exc)}}, 400)
    assert isinstance(plain, SpecError) and plain.field is None and str(plain) == str(exc)


def test_unknown_codes_keep_their_code() -> None:
    exc = from_wire({"error": {"code": "from_the_future", "message": "new"}}, 418)
    assert type(exc) is SupervisorError
    assert (exc.code, str(exc)) == ("from_the_future", "new")


@pytest.mark.parametrize("body", [None, "<html>bad gateway</html>", {"detail": "x"}, {"error": 3}])
def test_answers_that_are_not_the_apis_json(body: object) -> None:
    exc = from_wire(body, 502)
    assert isinstance(exc, HttpError)
    assert (str(exc), status_of(exc)) == ("the daemon answered HTTP 502", 502)


def test_task_not_running_without_a_task_falls_back_to_the_root() -> None:
    for task in (None, {"not": "a task"}):
        body = {"error": {"code": "task_not_running", "message": "ended", "task": task}}
        exc = from_wire(body, 409)
        assert type(exc) is SupervisorError
        assert exc.code == "task_not_running"


def test_make_error_builds_the_registered_class() -> None:
    exc = make_error("image_missing", "the command could not be started: no image")
    assert isinstance(exc, errors.ImageMissing)
    assert str(exc) == "the command could not be started: no image"


# -- validation messages ------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = {"extra": "forbid"}
    timeout_s: float
    nested: dict[str, int] = {}


def test_field_problems_and_the_invalid_request_message() -> None:
    with pytest.raises(ValidationError) as info_:
        _Body.model_validate({"timeout_s": "soon", "nested": {"a": "x"}, "extra": 1})
    problems = field_problems(info_.value.errors(include_url=False))
    assert [(p.field, p.kind) for p in problems] == [
        ("timeout_s", "float_parsing"),
        ("nested.a", "int_parsing"),
        ("extra", "extra_forbidden"),
    ]
    assert problems[2].message == "unknown field"
    assert problems[0].value == "soon"
    exc = InvalidRequest.from_problems(problems)
    assert str(exc).endswith("; extra: unknown field")
    assert exc.fields[2] == {"field": "extra", "message": "unknown field"}
    assert exc.to_wire()["error"]["fields"] == exc.fields


def test_field_problems_drop_the_container_and_strip_value_error() -> None:
    raw: list[dict[str, Any]] = [
        {"type": "value_error", "loc": ("body", "env"), "msg": "Value error, bad name"},
        {"type": "json_invalid", "loc": ("body", 12), "msg": "JSON decode error"},
    ]
    problems = field_problems(raw)
    assert [(p.field, p.message) for p in problems] == [
        ("env", "bad name"),
        ("", "not valid JSON"),
    ]
    assert str(InvalidRequest.from_problems(problems)) == "env: bad name; body: not valid JSON"


#: The API's status for every code: the contract clients see (the table lives at the HTTP
#: edge, ``interfaces.http_errors``; moving it there changed none of these).
STATUS_BY_CODE = {
    "daemon_error": 502,
    "daemon_unavailable": 503,
    "engine_error": 502,
    "engine_unavailable": 503,
    "engine_unresponsive": 503,
    "forbidden": 403,
    "forbidden_csrf": 403,
    "forbidden_host": 403,
    "forbidden_origin": 403,
    "http_error": 500,
    "image_build_failed": 500,
    "cli_error": 500,
    "swarm_not_found": 502,
    "engine_not_found": 502,
    "image_missing": 424,
    "input_too_large": 413,
    "invalid_request": 422,
    "invalid_spec": 400,
    "limit_exceeded": 429,
    "method_not_allowed": 405,
    "no_workspace": 404,
    "not_found": 404,
    "placement_unavailable": 503,
    "policy_error": 400,
    "request_timeout": 408,
    "request_too_large": 413,
    "runtime_unavailable": 503,
    "session_ended": 409,
    "session_not_found": 404,
    "state_storage_error": 507,
    "stdin_closed": 409,
    "stdin_not_read": 409,
    "supervisor_error": 500,
    "task_not_found": 404,
    "task_not_running": 409,
    "too_many_connections": 503,
    "unauthorized": 401,
    "unsupported": 501,
    "wait_timeout": 504,
    "workspace_busy": 409,
    "workspace_conflict": 409,
    "workspace_error": 409,
    "workspace_full": 507,
    "workspace_moved": 409,
    "workspace_no_backup": 404,
    "workspace_outside_roots": 400,
    "workspace_unsafe_path": 400,
}


def _instance(cls: type[SupervisorError]) -> SupervisorError:
    try:
        return cls("x")
    except (TypeError, AttributeError):  # classes built from ids or a TaskInfo
        return cls.__new__(cls)


def test_every_code_answers_with_its_status() -> None:
    # The modules that define errors outside core register them when imported.
    for module in (
        "supervisor.engine.swarm.manager",
        "supervisor.interfaces.cli.remote",
        "supervisor.tooling.images.catalogue",
    ):
        importlib.import_module(module)
    got = {
        code: status_of(_instance(cls))
        for code, cls in registered_codes().items()
        if cls.__module__.startswith("supervisor.")  # not the classes other tests define
    }
    assert got == STATUS_BY_CODE


def test_core_errors_know_nothing_of_http() -> None:
    """Core keeps codes and messages; statuses and the HTTP API's own errors are at the edge."""

    for cls in [SupervisorError, *_subclasses(SupervisorError)]:
        assert "status" not in cls.__dict__ or cls is edge.HttpError, cls.__qualname__
        if cls.__module__.startswith("supervisor.core"):
            assert cls.__name__ not in edge.__all__, cls.__qualname__
