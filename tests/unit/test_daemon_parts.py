"""The daemon's pure parts: error statuses and bodies, validation messages, the lone-surrogate
check, strict bodies that still take whole floats, the connection cap's arithmetic, the TCP
listener's socket."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from pydantic import ValidationError

from supervisor.core.errors import SessionNotFound, SpecError, SupervisorError
from supervisor.core.problems import InvalidRequest, field_problems
from supervisor.interfaces.daemon.bodies import AckBody, InputBody, StartTask, check_unicode
from supervisor.interfaces.daemon.connections import connection_cap, raw_response
from supervisor.interfaces.daemon.errors import error_body, status_of
from supervisor.interfaces.daemon.limits import MAX_INPUT_BYTES
from supervisor.interfaces.daemon.serve import bind_tcp
from supervisor.interfaces.http_errors import (
    InputTooLarge,
    MethodNotAllowed,
    NotFound,
    TooManyConnections,
    Unauthorized,
)

pytestmark = pytest.mark.unit


class _Unlisted(SupervisorError, TimeoutError):
    code = "unlisted"


def test_status_per_class_then_parent_then_builtin() -> None:
    assert status_of(Unauthorized()) == 401
    assert status_of(NotFound()) == 404
    assert status_of(SessionNotFound("s")) == 404
    assert status_of(SpecError("x")) == 400  # PolicyError's status
    assert status_of(InputTooLarge("x", 1)) == 413  # RequestTooLarge's status
    assert status_of(TooManyConnections("x")) == 503
    assert status_of(_Unlisted("x")) == 504  # a class not in the table: by its builtin
    assert status_of(SupervisorError("x")) == 500


def test_error_bodies_carry_what_their_code_promises() -> None:
    assert error_body(MethodNotAllowed("PUT", ["POST", "GET"])) == {
        "error": {
            "code": "method_not_allowed",
            "message": "PUT is not allowed here (allowed: GET, POST)",
            "allowed": ["GET", "POST"],
        }
    }
    assert error_body(InputTooLarge("too much", 5))["error"]["limit"] == 5
    body = error_body(InvalidRequest([("env.A", "bad"), ("seq", "worse")]))
    assert body["error"]["message"] == "env.A: bad; seq: worse"
    assert body["error"]["fields"] == [
        {"field": "env.A", "message": "bad"},
        {"field": "seq", "message": "worse"},
    ]
    head, _, rest = raw_response(TooManyConnections("full")).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"connection: close" in head
    assert json.loads(rest)["error"]["code"] == "too_many_connections"


def test_validation_problems_name_fields_as_people_read_them() -> None:
    errors = [
        {"loc": ("body", "env", "A"), "msg": "Input should be a valid string", "type": "x"},
        {
            "loc": ("body", "bogus"),
            "msg": "Extra inputs are not permitted",
            "type": "extra_forbidden",
        },
        {"loc": ("query", "limit"), "msg": "Value error, too big", "type": "value_error"},
        {"loc": ("header", "last-event-id"), "msg": "not an integer", "type": "int_parsing"},
        {
            "loc": ("body", 12),
            "msg": "JSON decode error",
            "type": "json_invalid",
            "ctx": {"error": "Expecting value"},
        },
        {"loc": (), "msg": "Value error, give one", "type": "value_error"},
    ]
    assert [(p.field or "body", p.message) for p in field_problems(errors)] == [
        ("env.A", "Input should be a valid string"),
        ("bogus", "unknown field"),
        ("query.limit", "too big"),
        ("header.Last-Event-ID", "not an integer"),
        ("body", "not valid JSON (Expecting value)"),
        ("body", "give one"),
    ]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"env": {"A": "\\ud800"}}', "env.A"),
        (b'{"command": "x\\uDFFF"}', "command"),
        (b'{"list": ["ok", "\\udc00"]}', "list.1"),
        (b'{"env": {"\\ud800": "v"}}', "env (a key)"),
        (b'"\\ud800"', "body"),
    ],
)
def test_lone_surrogates_are_found_with_their_field(raw: bytes, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_unicode(raw)
    assert caught.value.fields[0]["field"] == field
    assert "lone UTF-16 surrogate" in caught.value.fields[0]["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"command": "echo \\ud83d\\ude00"}',  # a pair is one character
        b'{"command": "echo \\\\ud800"}',  # an escaped backslash, then text
        b'{"command": "plain"}',
        b"{not json \\ud800",  # not JSON: the route's parser says so
    ],
)
def test_valid_unicode_passes(raw: bytes) -> None:
    check_unicode(raw)


def test_bodies_are_strict_but_take_whole_floats() -> None:
    for bad in (False, "1", 1.5):
        with pytest.raises(ValidationError):
            AckBody.model_validate({"consumer": "c", "seq": bad})
    assert AckBody.model_validate({"consumer": "c", "seq": 3.0}).seq == 3
    spec = StartTask.model_validate(
        {"command": "x", "timeout_ms": 1000.0, "limits": {"pids": 64.0}}
    ).to_spec()
    assert (spec.timeout_ms, spec.limits and spec.limits.pids) == (1000, 64)
    with pytest.raises(ValidationError):
        StartTask.model_validate({"command": "x", "limits": {"pids": "64"}})
    with pytest.raises(InvalidRequest):
        StartTask.model_validate({"command": "x", "timeout": "5s", "persistent": True}).to_spec()


def test_input_is_capped() -> None:
    assert InputBody(text="é").data() == "é".encode()
    with pytest.raises(InputTooLarge) as caught:
        InputBody(text="a" * (MAX_INPUT_BYTES + 1)).data()
    assert caught.value.limit == MAX_INPUT_BYTES
    with pytest.raises(InvalidRequest):
        InputBody(data_b64="!!!").data()


def test_connection_cap_fits_the_descriptor_limit() -> None:
    assert connection_cap(None, 2048, 2, 20000) == 2048
    assert connection_cap(None, 2048, 2, 1024) == 256
    assert connection_cap(None, 2048, 2, 40) == 16  # never below 16
    assert connection_cap(5000, 2048, 2, 1024) == 5000  # asked for: taken as given


async def test_tcp_connections_send_at_once() -> None:
    """The loopback listener's connections have TCP_NODELAY: asyncio sets it only on sockets
    made with IPPROTO_TCP, and without it every answer on a kept-alive connection waited
    ~40 ms for the client's delayed ACK (the API fuzzer took 70 s instead of about 20)."""
    listener = bind_tcp("127.0.0.1:0")
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _, w: accepted.append(w), sock=listener)
    async with server:
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        async with asyncio.timeout(10):
            while not accepted:
                await asyncio.sleep(0.01)
        conn = accepted[0].get_extra_info("socket")
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writer.close()
        accepted[0].close()
