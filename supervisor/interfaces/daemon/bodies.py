"""Request bodies of the HTTP API: strict pydantic models (``false`` is not ``0``, ``"1"`` is
not ``1``), durations as strings, and the lone-surrogate check every JSON body goes through."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from supervisor.core.errors import SpecError
from supervisor.core.ids import SESSION_ID_RE
from supervisor.core.models import TaskLimits, TaskSpec
from supervisor.core.problems import InvalidRequest
from supervisor.core.text import parse_duration
from supervisor.interfaces.daemon.limits import (
    MAX_INPUT_BYTES,
    MAX_OFFSET,
    MAX_SEQ,
    MAX_WAIT_S,
    UI_LOGIN_TTL_S,
    UI_MAX_LOGIN_TTL_S,
)
from supervisor.interfaces.http_errors import InputTooLarge

#: What a duration string looks like (the range is checked after conversion).
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h)\s*$"
#: Text without NUL bytes (commands and environment values become C strings).
_NO_NUL = r"^[^\x00]*$"
#: A command: something besides blanks, and no NUL byte.
_COMMAND_PATTERN = r"^[^\x00]*\S[^\x00]*$"
#: Standard base64 with padding.
_BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
#: An environment variable's name.
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A consumer name of the acknowledged drain.
CONSUMER_PATTERN = r"^[A-Za-z0-9_.-]+$"
#: Strict: JSON's types are the API's types. ``{"seq": false}`` or ``{"seq": "1"}`` is an
#: error naming the field, never a silent 0 or 1.
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


def _types(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (``Annotated[int, ...] | None`` -> int, None)."""
    if typing.get_origin(annotation) is Annotated:
        return _types(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_types(a) for a in args))
    return {annotation}


@functools.cache
def _int_fields(model: type[BaseModel]) -> frozenset[str]:
    """Fields of ``model`` that take an integer (and not also a float)."""
    out = set()
    for name, info in model.model_fields.items():
        admitted = _types(info.annotation)
        if int in admitted and float not in admitted:
            out.add(name)
    return frozenset(out)


def whole_numbers_as_int(model: type[BaseModel], data: Any) -> Any:
    """JSON does not tell ``1.0`` from ``1`` (JSON Schema calls both an integer), so a whole
    float is taken for an integer field; strict mode still refuses ``true`` and ``"1"``."""
    if not isinstance(data, dict):
        return data
    fields = _int_fields(model)
    return {
        k: int(v) if k in fields and isinstance(v, float) and v.is_integer() else v
        for k, v in data.items()
    }


class _Body(BaseModel):
    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _whole(cls, data: Any) -> Any:
        return whole_numbers_as_int(cls, data)


#: A policy's name (its file name without ``.toml``).
POLICY_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"


class WorkspaceBody(_Body):
    """The project directory a session's tasks run on, and how they see it."""

    path: Annotated[str, Field(min_length=1, max_length=4096, pattern=_NO_NUL)]
    """An absolute host directory under one of the daemon's workspace roots (a relative
    path is taken from the daemon's working directory: send absolute paths)."""
    mode: Literal["overlay", "ro", "rw"] = "overlay"
    """``overlay``: writes go to a layer of the session's own, reviewed and applied later;
    ``ro``: read-only; ``rw``: read-write (``.git`` stays read-only)."""


class CreateSession(_Body):
    """Open (or re-open) a session and get a token for it."""

    session_id: Annotated[str, Field(pattern=SESSION_ID_RE.pattern)] | None = None
    """1-64 letters, digits, ``_.-``, starting with a letter or digit; omitted: a random id."""
    workspace: WorkspaceBody | None = None
    """The session's workspace, fixed when it opens (re-opening with another one is a
    policy_error). Omitted: none (tasks get the policy's scratch working directory)."""
    policy: Annotated[str, Field(min_length=1, max_length=64, pattern=POLICY_NAME_PATTERN)] = (
        "default"
    )
    """The policy whose ``workspace_root_owner`` decides whom tasks of a root-owned
    workspace run as (each task still names its own policy)."""


class ApplyBody(_Body):
    """Apply a session's workspace changes to the host project."""

    force: bool = False
    """Overwrite host files changed since the session started (conflicts); they are backed
    up, so ``undo`` restores them."""
    stop_tasks: bool = False
    """Stop the session's running tasks first (else a running task is a 409)."""
    reviewed: dict[str, str] | None = Field(default=None, max_length=1_000_000)
    """path -> ``digest`` of each change as the caller reviewed it (from ``changes``):
    after the tasks stop, the changes must be exactly those, or nothing is written (409
    ``workspace_conflict`` naming the paths that differ). Omitted: apply what is there."""


class UndoBody(_Body):
    """Undo the last apply."""

    force: bool = False
    """Also put back files changed on the host since the apply (else a 409 naming them)."""
    stop_tasks: bool = False
    """Stop the session's running tasks first (else a running task is a 409)."""


class DiscardBody(_Body):
    """Drop every change of a session's workspace."""

    stop_tasks: bool = False
    """Stop the session's running tasks first (else a running task is a 409)."""


#: Duration string field -> (TaskSpec field it stands for, seconds-to-unit factor).
_DURATION_FIELDS: dict[str, tuple[str, int]] = {
    "timeout": ("timeout_ms", 1000),
    "poll_every": ("poll_every_s", 1),
    "stall_after": ("stall_after_s", 1),
    "idle_timeout": ("idle_timeout_ms", 1000),
}
_Duration = Annotated[
    str | None,
    Field(json_schema_extra={"pattern": DURATION_PATTERN}),
]


@functools.cache
def _spec_field(name: str) -> TypeAdapter[Any]:
    """Validates one TaskSpec field on its own (its type and range)."""
    annotation = TaskSpec.model_fields[name].annotation
    assert annotation is not None
    return TypeAdapter(annotation)


def _converted(short: str, value: str) -> float | int:
    long, factor = _DURATION_FIELDS[short]
    try:
        number = parse_duration(value, short, default_unit=None) * factor
    except SpecError as exc:
        raise ValueError(str(exc).removeprefix(f"{short}: ")) from None
    return int(number) if long.endswith("_ms") else number


class StrictLimits(TaskLimits):
    """TaskLimits, with JSON's types taken strictly."""

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _whole(cls, data: Any) -> Any:
        return whole_numbers_as_int(cls, data)


class StartTask(TaskSpec):
    """A TaskSpec; durations may also be given as strings (``timeout: "10m"``)."""

    model_config = _STRICT

    command: Annotated[
        str,
        Field(min_length=1, json_schema_extra={"pattern": _COMMAND_PATTERN, "maxLength": 131072}),
    ]
    """Shell command, run as ``sh -c COMMAND`` inside the policy's image (not blank, no NUL
    bytes, at most 128 KiB as UTF-8)."""
    env: Annotated[
        dict[str, str],
        Field(
            json_schema_extra={
                "propertyNames": {"pattern": ENV_NAME_PATTERN},
                "additionalProperties": {"type": "string", "pattern": _NO_NUL},
            }
        ),
    ] = Field(default_factory=dict)
    """Extra environment variables; names must be on the policy's allowlist."""
    limits: StrictLimits | None = None
    """Tighter limits than the policy's; asking for more than the policy allows is an error."""
    timeout: _Duration = None
    """Alternative to timeout_ms: ``500ms``, ``30s``, ``5m``, ``1h``."""
    poll_every: _Duration = None
    """Alternative to poll_every_s, e.g. ``5m``."""
    stall_after: _Duration = None
    """Alternative to stall_after_s, e.g. ``3s``."""
    idle_timeout: _Duration = None
    """Alternative to idle_timeout_ms, e.g. ``2m``."""

    @field_validator("timeout", "poll_every", "stall_after", "idle_timeout")
    @classmethod
    def _duration(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Parse and range-check here, so a bad duration is a 422 naming this field."""
        if value is None or info.field_name is None:
            return value
        long, _ = _DURATION_FIELDS[info.field_name]
        number = _converted(info.field_name, value)
        try:
            _spec_field(long).validate_python(number)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            raise ValueError(f"{value!r} is {number} as {long}: {why}") from None
        return value

    @model_validator(mode="before")
    @classmethod
    def _whole(cls, data: Any) -> Any:
        return whole_numbers_as_int(cls, data)

    @model_validator(mode="after")
    def _no_double(self) -> StartTask:
        for short, (long, _) in _DURATION_FIELDS.items():
            if getattr(self, short) is not None and getattr(self, long) is not None:
                raise ValueError(f"give either {short} or {long}, not both")
        return self

    def to_spec(self) -> TaskSpec:
        """The TaskSpec this body asks for (durations converted); InvalidRequest when the
        converted values break a rule of TaskSpec (``timeout`` with ``persistent``)."""
        data = self.model_dump(exclude_unset=True, exclude=set(_DURATION_FIELDS))
        for short, (long, _) in _DURATION_FIELDS.items():
            value = getattr(self, short)
            if value is not None:
                data[long] = _converted(short, value)
        try:
            return TaskSpec.model_validate(data)
        except ValidationError as exc:
            raise InvalidRequest.from_errors(exc.errors()) from exc


class InputBody(_Body):
    """Bytes for the task's stdin: ``text`` (UTF-8) or ``data_b64``; ``eof`` closes stdin after.
    At most ``MAX_INPUT_BYTES`` per request."""

    # The schema says what ``_one`` refuses: both, as strings (null is as good as left out).
    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra={
            "not": {
                "required": ["text", "data_b64"],
                "properties": {"text": {"type": "string"}, "data_b64": {"type": "string"}},
            }
        },
    )

    text: str | None = None
    """Text, written as UTF-8."""
    data_b64: Annotated[
        str | None,
        Field(json_schema_extra={"pattern": _BASE64_PATTERN, "contentEncoding": "base64"}),
    ] = None
    """Bytes, base64-encoded (any bytes: use this for binary input)."""
    eof: bool = False
    """Close the task's stdin after writing."""

    @model_validator(mode="after")
    def _one(self) -> InputBody:
        if self.text is not None and self.data_b64 is not None:
            raise ValueError("give either text or data_b64, not both")
        return self

    def data(self) -> bytes:
        """The bytes to write; InvalidRequest for bad base64, InputTooLarge over the cap."""
        if self.data_b64 is not None:
            try:
                raw = base64.b64decode(self.data_b64, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequest([("data_b64", f"not valid base64 ({exc})")]) from exc
            field = "data_b64"
        else:
            raw = (self.text or "").encode("utf-8")
            field = "text"
        if len(raw) > MAX_INPUT_BYTES:
            raise InputTooLarge(
                f"{field}: {len(raw)} bytes of input in one request; the limit is "
                f"{MAX_INPUT_BYTES} bytes (send it in several requests)",
                MAX_INPUT_BYTES,
            )
        return raw


_WaitSeconds = Annotated[float, Field(gt=0, le=MAX_WAIT_S)]


class WaitBody(_Body):
    """Wait for the task's final status."""

    timeout_s: _WaitSeconds = 30.0
    """How long the server waits (at most 300 s; clients loop for longer)."""


class WaitForBody(_Body):
    """Wait for an output line matching a pattern."""

    pattern: Annotated[
        str, Field(min_length=1, max_length=10_000, json_schema_extra={"format": "regex"})
    ]
    """A regular expression searched in each output line (400 when it is not one)."""
    timeout_s: _WaitSeconds = 30.0
    """How long the server waits (at most 300 s)."""
    from_offset: Annotated[int, Field(ge=0, le=MAX_OFFSET)] = 0
    """Byte offset where the search starts."""


class AckBody(_Body):
    """Record what a consumer has delivered."""

    consumer: Annotated[str, Field(min_length=1, max_length=64, pattern=CONSUMER_PATTERN)]
    """Who delivers (e.g. one MCP connection); each has its own cursor."""
    seq: Annotated[int, Field(ge=0, le=MAX_SEQ)]
    """Everything up to this seq was delivered."""


class LoginBody(_Body):
    """Ask for a one-time dashboard login link."""

    ttl_s: Annotated[float, Field(gt=0, le=UI_MAX_LOGIN_TTL_S)] = UI_LOGIN_TTL_S
    """How long the link stays valid if nobody uses it (seconds, at most a day)."""


# -- lone surrogates -----------------------------------------------------------------------

#: A JSON escape of a UTF-16 surrogate. Raw UTF-8 cannot carry one, so a body without this
#: cannot hold a lone surrogate (the check is one regex scan on ordinary bodies).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate_at(value: Any, path: list[str]) -> tuple[str, str] | None:
    """(where, the bad string) for the first string or key that is not valid Unicode."""
    if isinstance(value, str):
        return None if _unicode(value) else (".".join(path) or "body", value)
    if isinstance(value, dict):
        items = list(value.items())
        for key, _ in items:
            if not _unicode(key):
                return (".".join(path) or "body") + " (a key)", key
    elif isinstance(value, list):
        items = [(str(i), item) for i, item in enumerate(value)]
    else:
        return None
    for key, item in items:
        if (found := _lone_surrogate_at(item, [*path, key])) is not None:
            return found
    return None


def check_unicode(body: bytes) -> None:
    """InvalidRequest naming the field when a JSON body holds a lone UTF-16 surrogate
    (``"\\ud800"``): such a string cannot be stored, logged or passed to a command, and it
    used to fail later with an internal serialisation error that named no field."""
    if not _SURROGATE_ESCAPE.search(body):
        return
    try:
        doc = json.loads(body)
    except ValueError:
        return  # not JSON: the route's own parsing answers that, naming the body
    found = _lone_surrogate_at(doc, [])
    if found is not None:
        where, text = found
        bad = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
        raise InvalidRequest(
            [
                (
                    where,
                    f"contains a lone UTF-16 surrogate (\\u{ord(bad):04x}), which is not valid "
                    "Unicode (strings must be valid Unicode; send raw bytes as data_b64)",
                )
            ]
        )
