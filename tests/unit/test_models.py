"""TaskSpec and friends: unknown fields and out-of-range values are rejected by name."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from supervisor.core.models import (
    MAX_ARG_STRLEN,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_TIMEOUT_MS,
    MERGE_PREFIX,
    OutputSlice,
    TaskInfo,
    TaskLimits,
    TaskSpec,
)


def rejected(**kw: Any) -> str:
    with pytest.raises(ValidationError) as info:
        TaskSpec(**kw)
    return str(info.value)


def test_minimal_spec_defaults() -> None:
    spec = TaskSpec(command="npm run dev")
    assert spec.kind == "background"
    assert spec.timeout_ms is None
    assert spec.persistent is False
    assert spec.policy == "default"
    assert spec.env == {}
    assert spec.stdin is None
    assert spec.limits is None
    assert spec.label == "npm run dev"
    assert TaskSpec(command="x", description="dev server").label == "dev server"


def test_unknown_field_is_rejected_by_name() -> None:
    message = rejected(command="ls", workdir="/proc/self/cwd")
    assert "workdir" in message
    assert "Extra inputs are not permitted" in message
    with pytest.raises(ValidationError, match="swap_mb"):
        TaskLimits(swap_mb=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("value", [0, -1, MAX_TIMEOUT_MS + 1])
def test_timeout_out_of_range(value: int) -> None:
    message = rejected(command="ls", timeout_ms=value)
    assert "timeout_ms" in message
    bound = "greater than or equal to 1" if value < 1 else "less than or equal to 3600000"
    assert bound in message


@pytest.mark.parametrize("value", [1, 300_000, MAX_TIMEOUT_MS])
def test_timeout_in_range(value: int) -> None:
    assert TaskSpec(command="ls", timeout_ms=value).timeout_ms == value


def test_persistent_excludes_timeout() -> None:
    message = rejected(command="ls", persistent=True, timeout_ms=1000)
    assert "timeout_ms and persistent=true exclude each other" in message
    assert TaskSpec(command="ls", persistent=True).persistent


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("", "at least 1 character"),
        ("   \n\t", "must not be blank"),
        ("echo a\x00b", "must not contain NUL bytes"),
        ("x" * (MAX_COMMAND_BYTES + 1), f"longer than {MAX_COMMAND_BYTES} bytes"),
        ("€" * (MAX_COMMAND_BYTES // 3 + 1), f"longer than {MAX_COMMAND_BYTES} bytes"),
    ],
    ids=["empty", "blank", "nul", "too-long", "too-long-in-bytes"],
)
def test_bad_commands(command: str, why: str) -> None:
    message = rejected(command=command)
    assert "command" in message
    assert why in message


def test_longest_command_is_accepted() -> None:
    assert len(TaskSpec(command="x" * MAX_COMMAND_BYTES).command) == MAX_COMMAND_BYTES


def test_the_command_limit_is_what_one_argv_string_holds() -> None:
    """Issue 14, defect 7: commands of 131,061-131,072 bytes were accepted, then failed with
    'argument list too long'. ``sh -c`` gets MERGE_PREFIX + command (+ a newline from the
    warm pool's shell) as one argument, NUL included, and Linux caps that at 32 pages."""
    assert MAX_ARG_STRLEN == 131_072
    assert len(MERGE_PREFIX) + MAX_COMMAND_BYTES + len("\n") + len("\0") == MAX_ARG_STRLEN
    assert MAX_COMMAND_BYTES < 131_061
    message = rejected(command="x" * 131_061)
    assert f"command is longer than {MAX_COMMAND_BYTES} bytes (got 131061" in message
    assert f"at most {MAX_ARG_STRLEN} bytes in one argument" in message


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"command": "echo \ud800"}, "command"),
        ({"command": "ls", "description": "dev \udfff server"}, "description"),
        ({"command": "ls", "env": {"FOO": "a\ud800b"}}, "env.FOO"),
    ],
)
def test_lone_surrogates_are_refused_by_field(fields: dict[str, Any], name: str) -> None:
    """Issue 14, defect 8: an env value of "\\ud800" passed validation, then broke JSON
    serialization with an internal error that named no field."""
    message = rejected(**fields)
    assert f"{name}: contains a lone surrogate (not valid UTF-8)" in message


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "A=B", "", "É"])
def test_invalid_env_names(name: str) -> None:
    message = rejected(command="ls", env={name: "1"})
    assert "env" in message
    assert "is not a valid variable name" in message
    assert repr(name) in message


def test_env_values() -> None:
    assert TaskSpec(command="ls", env={"_A1": "x=y", "b": ""}).env == {"_A1": "x=y", "b": ""}
    assert "must not contain NUL bytes" in rejected(command="ls", env={"A": "a\x00"})
    big = {f"V{i}": "x" * 1000 for i in range(MAX_ENV_BYTES // 1000 + 1)}
    assert f"larger than {MAX_ENV_BYTES} bytes" in rejected(command="ls", env=big)


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("description", "d" * 501, "at most 500 characters"),
        ("kind", "daemon", "'background' or 'monitor'"),
        ("policy", "Default", "should match pattern"),
        ("policy", "../etc", "should match pattern"),
        ("policy", "p" * 65, "at most 64 characters"),
        ("stdin", "tty", "'pipe' or 'closed'"),
        ("poll_every_s", 0.5, "greater than or equal to 1"),
        ("poll_every_s", 86_401, "less than or equal to 86400"),
        ("poll_tail_chars", 0, "greater than or equal to 1"),
        ("poll_tail_chars", 100_001, "less than or equal to 100000"),
        ("stall_after_s", 0.1, "greater than or equal to 0.5"),
        ("stall_after_s", 3601, "less than or equal to 3600"),
        ("idle_timeout_ms", 99, "greater than or equal to 100"),
        ("idle_timeout_ms", MAX_TIMEOUT_MS + 1, "less than or equal to 3600000"),
        ("persistent", "sometimes", "valid boolean"),
        ("env", ["A=1"], "valid dictionary"),
    ],
)
def test_out_of_range_fields_are_named(field: str, value: object, bound: str) -> None:
    message = rejected(command="ls", **{field: value})
    assert field in message
    assert bound in message


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("memory_mb", 5, "greater than or equal to 6"),
        ("cpus", 0, "greater than 0"),
        ("cpus", 65, "less than or equal to 64"),
        ("pids", 15, "greater than or equal to 16"),
        ("nofile", 15, "greater than or equal to 16"),
        ("fsize_mb", 0, "greater than or equal to 1"),
        ("output_cap_bytes", 1023, "greater than or equal to 1024"),
    ],
)
def test_task_limits_ranges(field: str, value: object, bound: str) -> None:
    message = rejected(command="ls", limits={field: value})
    assert f"limits.{field}" in message
    assert bound in message


def test_spec_is_frozen_and_round_trips() -> None:
    spec = TaskSpec(command="ls", env={"A": "1"}, limits=TaskLimits(pids=32), timeout_ms=5)
    with pytest.raises(ValidationError, match="frozen"):
        spec.command = "rm"  # type: ignore[misc]
    assert TaskSpec.model_validate_json(spec.model_dump_json()) == spec


def info(**kw: Any) -> TaskInfo:
    base: dict[str, Any] = {
        "task_id": "bg-00000001",
        "session_id": "s1",
        "command": "ls",
        "description": "",
        "kind": "background",
        "policy": "default",
        "status": "running",
        "output_path": "/x",
        "persistent": False,
        "timeout_ms": 1000,
        "stdin": "pipe",
        "created_at": 1.0,
    }
    base.update(kw)
    return TaskInfo(**base)


@pytest.mark.parametrize(
    ("kw", "ended", "text"),
    [
        ({"status": "running"}, False, "running"),
        ({"status": "completed", "reason": "exit", "exit_code": 0}, True, "completed, exit code 0"),
        ({"status": "killed", "reason": "user_stopped"}, True, "killed, user stopped"),
        ({"status": "failed", "error": "image missing"}, True, "failed: image missing"),
        ({"status": "failed"}, True, "failed: never ran"),
    ],
)
def test_task_info_describe_end(kw: dict[str, Any], ended: bool, text: str) -> None:
    ti = info(**kw)
    assert ti.ended is ended
    assert ti.describe_end() == text


def test_output_slice_text_and_lossy() -> None:
    good = OutputSlice(data="é".encode(), offset=0, next_offset=2, eof=False)
    assert (good.text, good.lossy) == ("é", False)
    bad = OutputSlice(data=b"a\xff", offset=0, next_offset=2, eof=True)
    assert (bad.text, bad.lossy) == ("a\ufffd", True)
