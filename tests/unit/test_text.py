"""core.text: durations parsed and shown once, and how a task ended, in words, for a
TaskInfo and for its JSON alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from supervisor.core import text
from supervisor.core.errors import SpecError
from supervisor.core.models import FINAL_STATUSES, StopReason, TaskInfo, TaskStatus


def task(**fields: Any) -> TaskInfo:
    base: dict[str, Any] = {
        "task_id": "bg-1",
        "session_id": "s",
        "command": "make test",
        "description": "",
        "kind": "background",
        "policy": "default",
        "status": "running",
        "output_path": "/o",
        "persistent": False,
        "timeout_ms": 30_000,
        "stdin": "pipe",
        "created_at": 1.0,
    }
    return TaskInfo.model_validate({**base, **fields})


# -- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h", 3600), ("2", 2), (1.5, 1.5), (0, 0)],
)
def test_parse_duration(value: str | float, seconds: float) -> None:
    assert text.parse_duration(value, "f") == seconds


def test_default_unit() -> None:
    assert text.parse_duration_ms("250", "f", default_unit="ms") == 250
    assert text.parse_duration_ms("2", "f", default_unit="m") == 120_000
    assert text.parse_duration_ms("2s", "f", default_unit="ms") == 2000
    with pytest.raises(SpecError, match="invalid duration '2'"):
        text.parse_duration("2", "f", default_unit=None)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("soon", "invalid duration 'soon': use a number with ms, s, m or h"),
        ("1" * 400, "invalid duration '" + "1" * 40 + "...': too long (at most 1000000000s)"),
        ("1" * 400 + "h", "too long"),
        (10.0**12, "too long"),
        (float("inf"), "too long"),
        (float("nan"), "too long"),
        (-1, "negative"),
        (True, "expected a duration, got True"),
    ],
)
def test_bad_durations_name_the_field(value: Any, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        text.parse_duration(value, "timeout")
    assert info.value.field == "timeout"
    assert str(info.value).startswith("timeout: ")
    assert problem in info.value.problem
    assert str(info.value) == f"timeout: {info.value.problem}"
    assert len(str(info.value)) < 150


@pytest.mark.parametrize("value", ["0", "0.4ms", 0])
def test_parse_duration_ms_wants_at_least_one(value: str | int) -> None:
    with pytest.raises(SpecError, match="must be at least 1ms"):
        text.parse_duration_ms(value, "f")


@pytest.mark.parametrize(
    ("ms", "shown"), [(300_000, "5m"), (3_600_000, "1h"), (30_000, "30s"), (1500, "1500ms")]
)
def test_format_duration_parses_back(ms: int, shown: str) -> None:
    assert text.format_duration(ms) == shown
    assert text.parse_duration_ms(shown, "f") == ms


@pytest.mark.parametrize(
    ("ms", "shown"),
    [(None, "-"), (850, "850ms"), (12_340, "12.3s"), (245_000, "4m05s"), (7_380_000, "2h03m")],
)
def test_format_elapsed(ms: int | None, shown: str) -> None:
    assert text.format_elapsed(ms) == shown


# -- how a task ended -----------------------------------------------------------------------


def test_every_stop_reason_has_words_and_the_final_statuses_agree() -> None:
    assert set(text.REASON_TEXT) == set(get_args(StopReason))
    assert set(text.REASON_SHORT) == set(get_args(StopReason))
    assert text.FINAL_STATUSES == FINAL_STATUSES
    assert set(get_args(TaskStatus)) > FINAL_STATUSES


CASES: list[tuple[dict[str, Any], str, str, str]] = [
    # fields, describe_end, outcome_short, end_clause
    ({"status": "running"}, "running", "-", "is running"),
    ({"status": "running", "stalled": True}, "running", "stalled", "is running"),
    (
        {"status": "completed", "reason": "exit", "exit_code": 0},
        "completed, exit code 0",
        "exit 0",
        "completed (exit code 0)",
    ),
    (
        {"status": "failed", "reason": "exit", "exit_code": 3},
        "failed, exit code 3",
        "exit 3",
        "failed (exit code 3)",
    ),
    (
        {"status": "killed", "reason": "timeout", "exit_code": 143},
        "killed, timeout",
        "timeout",
        "was killed: it reached its timeout (30s)",
    ),
    (
        {"status": "killed", "reason": "user_stopped"},
        "killed, user stopped",
        "user stopped",
        "was killed: stopped by request",
    ),
    (
        {"status": "failed", "reason": "oom_killed"},
        "failed, oom killed",
        "oom killed",
        "failed: killed for running out of memory",
    ),
    (
        {"status": "failed", "reason": "lost", "error": "engine gone"},
        "failed, lost",
        "lost",
        "failed: its container was lost (engine gone)",
    ),
    (
        {"status": "failed", "error": "image not present", "error_code": "image_missing"},
        "failed: image not present",
        "image_missing",
        "failed to start: image not present",
    ),
]


@pytest.mark.parametrize(("fields", "end", "short", "clause"), CASES)
def test_task_texts_read_a_taskinfo_and_its_json_alike(
    fields: dict[str, Any], end: str, short: str, clause: str
) -> None:
    info = task(**fields)
    as_json = info.model_dump(mode="json")
    for given in (info, as_json):
        assert text.describe_end(given) == end
        assert text.outcome_short(given) == short
        assert text.end_clause(given) == clause
        assert text.is_final(given) is info.ended
    # The model's own phrase says the same (until it delegates to core.text).
    assert info.describe_end() == end


def test_task_label_cuts_long_ones() -> None:
    assert text.task_label("dev server", "npm run dev") == "dev server"
    assert text.task_label("", "npm run dev") == "npm run dev"
    assert text.task_label("", "x" * 300) == "x" * 197 + "..."


def test_importing_text_loads_no_pydantic() -> None:
    """The CLI parses options and prints task lists through core.text on every start."""
    code = "import sys, supervisor.core.text; print('pydantic' in sys.modules)"
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=repo)
    assert out.stdout.strip() == b"False"
