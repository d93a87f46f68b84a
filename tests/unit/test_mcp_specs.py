"""The MCP tools' arguments: their checks, the spec fields they set, the texts they give,
and ``sandvisor mcp --auto-background-after``."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from supervisor.core.models import TaskInfo, TaskSpec
from supervisor.core.problems import InvalidRequest
from supervisor.interfaces.cli.main import build_parser
from supervisor.interfaces.mcp import specs, texts, workspace_texts
from supervisor.interfaces.mcp.specs import BashCall

# -- tail_every_minutes -------------------------------------------------------------------


def test_tail_every_minutes_maps_to_polls_on_change_with_a_seed_sized_tail() -> None:
    assert specs.poll_fields(None) == {}
    fields = specs.poll_fields(0.05)
    assert fields == {"poll_every_s": 3.0, "poll_tail_chars": 3000, "poll_only_on_change": True}
    assert 2000 <= fields["poll_tail_chars"] <= 4000  # seed 000
    assert specs.poll_fields(5)["poll_every_s"] == 300.0
    assert specs.poll_fields(1440)["poll_every_s"] == 86_400.0
    # Under a second: the runtime's fastest, once a second.
    assert specs.poll_fields(0.001)["poll_every_s"] == 1.0


@pytest.mark.parametrize("bad", [0, -1, -0.5, 1440.01, 1e9, math.inf, -math.inf, math.nan, True])
def test_a_bad_tail_every_minutes_names_the_field_and_the_range(bad: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        specs.poll_fields(bad)
    assert caught.value.field == "tail_every_minutes"
    message = str(caught.value)
    assert message.startswith("tail_every_minutes: must be a number of minutes > 0")
    assert "at most 1440" in message and "fractions" in message


@given(st.floats(min_value=1e-9, max_value=1440, allow_nan=False))
def test_every_allowed_tail_every_minutes_gives_a_spec_the_runtime_takes(minutes: float) -> None:
    spec = TaskSpec(command="true", **specs.poll_fields(minutes))
    assert spec.poll_every_s is not None and 1.0 <= spec.poll_every_s <= 86_400
    if minutes >= 1 / 60:
        assert spec.poll_every_s == pytest.approx(minutes * 60, abs=0.001)


def test_the_schema_type_refuses_non_numbers_and_advertises_the_range() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(texts.TailEveryMinutes)
    assert adapter.validate_python(None) is None
    assert adapter.validate_python(2) == 2.0
    for bad in (True, "5", [1]):
        with pytest.raises(ValidationError):
            adapter.validate_python(bad)
    schema = adapter.json_schema()
    number = next(s for s in schema["anyOf"] if s.get("type") == "number")
    assert number["exclusiveMinimum"] == 0 and number["maximum"] == 1440
    assert "minutes" in schema["description"]


# -- bash: background ---------------------------------------------------------------------


def test_background_without_timeout_runs_until_stopped_and_may_fall_back() -> None:
    planned = specs.background(BashCall("npm run dev", "dev", run_in_background=True))
    assert planned.spec == {"command": "npm run dev", "description": "dev", "persistent": True}
    assert planned.persistent_fallback  # a policy without persistent tasks: its default


def test_background_persistent_true_is_asked_for_so_it_never_falls_back() -> None:
    planned = specs.background(BashCall("x", run_in_background=True, persistent=True))
    assert planned.spec["persistent"] is True
    assert not planned.persistent_fallback


def test_background_persistent_false_takes_the_policy_default_timeout() -> None:
    planned = specs.background(BashCall("x", run_in_background=True, persistent=False))
    assert "persistent" not in planned.spec and "timeout_ms" not in planned.spec
    given_timeout = specs.background(
        BashCall("x", run_in_background=True, persistent=False, timeout_ms=500)
    )
    assert given_timeout.spec["timeout_ms"] == 500


def test_background_timeout_bounds_it() -> None:
    planned = specs.background(BashCall("x", run_in_background=True, timeout_ms=500))
    assert planned.spec["timeout_ms"] == 500 and "persistent" not in planned.spec
    TaskSpec(**planned.spec)


def test_persistent_with_a_timeout_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest) as caught:
        specs.background(BashCall("x", run_in_background=True, persistent=True, timeout_ms=5))
    assert caught.value.field == "persistent"
    assert "timeout" in str(caught.value)


def test_background_polls() -> None:
    planned = specs.background(BashCall("x", run_in_background=True, tail_every_minutes=0.5))
    assert planned.spec["poll_every_s"] == 30.0
    TaskSpec(**planned.spec)


# -- bash: foreground ---------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_on_a_foreground_command_is_refused_by_name(persistent: bool) -> None:
    for auto in (30.0, 0.0):
        with pytest.raises(InvalidRequest) as caught:
            specs.foreground(BashCall("x", persistent=persistent), auto)
        assert caught.value.field == "persistent"
        assert "only for background commands (run_in_background=true)" in str(caught.value)
    with pytest.raises(InvalidRequest, match="moved to the background by itself"):
        specs.foreground(BashCall("x", persistent=True), 30.0)


def test_foreground_with_auto_background_and_no_timeout_has_none() -> None:
    planned = specs.foreground(BashCall("sleep 45; echo done"), 30.0)
    assert planned.spec == {
        "command": "sleep 45; echo done",
        "description": "",
        "stdin": "closed",
        "persistent": True,
    }
    assert planned.timeout_ms is None and planned.persistent_fallback
    TaskSpec(**planned.spec)


def test_foreground_timeout_given_always_applies() -> None:
    for auto in (30.0, 0.0):
        planned = specs.foreground(BashCall("x", timeout_ms=90_000), auto)
        assert planned.spec["timeout_ms"] == 90_000 and planned.timeout_ms == 90_000
        assert "persistent" not in planned.spec and planned.spec["stdin"] == "closed"


def test_foreground_without_auto_background_keeps_the_default_timeout() -> None:
    planned = specs.foreground(BashCall("x"), 0.0)
    assert planned.spec["timeout_ms"] == specs.FOREGROUND_TIMEOUT_MS == 120_000
    assert planned.timeout_ms == 120_000


def test_foreground_may_ask_for_polls_for_after_a_move() -> None:
    planned = specs.foreground(BashCall("x", tail_every_minutes=1), 30.0)
    assert planned.spec["poll_every_s"] == 60.0


# -- monitor_start ------------------------------------------------------------------------


def test_monitor_spec() -> None:
    spec = specs.monitor("tail -F log", "log", 300_000, False, 2)
    assert spec == {
        "command": "tail -F log",
        "description": "log",
        "kind": "monitor",
        "timeout_ms": 300_000,
        "poll_every_s": 120.0,
        "poll_tail_chars": 3000,
        "poll_only_on_change": True,
    }
    persistent = specs.monitor("tail -F log", "", 300_000, True, None)
    assert persistent["persistent"] is True and "timeout_ms" not in persistent
    with pytest.raises(InvalidRequest, match="tail_every_minutes"):
        specs.monitor("x", "", 1000, False, 0)


# -- texts --------------------------------------------------------------------------------


def _info(**changes: Any) -> TaskInfo:
    base: dict[str, Any] = {
        "task_id": "bg-1a2b3c4d",
        "session_id": "s",
        "command": "sleep 45; echo done",
        "description": "",
        "kind": "background",
        "policy": "default",
        "status": "running",
        "output_path": "/state/sessions/s/tasks/bg-1a2b3c4d.output",
        "persistent": True,
        "timeout_ms": None,
        "stdin": "closed",
        "created_at": 0.0,
        "output_bytes": 12,
    }
    return TaskInfo(**{**base, **changes})


def test_moved_to_background_says_what_how_and_where() -> None:
    text = texts.moved_to_background("step 1\nstep 2", _info(), 30.0)
    assert text.startswith("step 1\nstep 2\n")
    assert "still running after 30s" in text and "not stopped" in text
    assert "ID bg-1a2b3c4d" in text
    assert "/state/sessions/s/tasks/bg-1a2b3c4d.output" in text
    assert "<task-notification>" in text
    assert "task_wait task_id=bg-1a2b3c4d" in text
    assert "task_output task_id=bg-1a2b3c4d offset=12" in text
    assert "task_stop task_id=bg-1a2b3c4d" in text
    assert "runs until it ends" in text and "background_task_poll" not in text

    bounded = texts.moved_to_background("", _info(persistent=False, timeout_ms=90_000), 30.0, 60)
    assert bounded.startswith("(no output yet)\n")
    assert "stopped after 90s" in bounded
    assert "<background_task_poll> with its latest output every 1m" in bounded


def test_a_moved_commands_completion_carries_its_last_output() -> None:
    xml = "<task-notification>\n<task-id>bg-1</task-id>\n</task-notification>"
    out = texts.with_last_output(xml, "a < b\ndone\n")
    assert out == (
        "<task-notification>\n<task-id>bg-1</task-id>\n"
        "<last-output>\na &lt; b\ndone\n</last-output>\n</task-notification>"
    )
    assert "<last-output>\n(no output)\n</last-output>" in texts.with_last_output(xml, "")
    assert texts.with_last_output("<task-output>x</task-output>", "t") == (
        "<task-output>x</task-output>"
    )


def test_started_in_background_says_its_lifetime_and_polls() -> None:
    text = texts.started_in_background(_info(), 3.0)
    assert "Command running in background with ID: bg-1a2b3c4d." in text
    assert "runs until it ends" in text and "every 3s" in text
    assert "stopped after 5m" in texts.started_in_background(
        _info(persistent=False, timeout_ms=300_000)
    )


def test_truncated_output_of_a_running_command_says_so_far() -> None:
    info = _info(output_bytes=50_000)
    cut = texts.truncated("a\n", "y\nz\n", info, (2, 49_996), so_far=True)
    assert "50000 bytes so far" in cut
    assert "bytes 2-49996 (the middle) are left out" in cut and "offset=2." in cut
    assert "50000 bytes in all" in texts.truncated("a\n", "y\nz\n", info, (2, 49_996))


def test_the_bash_description_follows_the_auto_background_setting() -> None:
    on = workspace_texts.bash_description(None, 30.0)
    assert "still running after 30s is not killed" in on
    assert "tail_every_minutes" in on and "task_wait" in on
    off = workspace_texts.bash_description(None, 0)
    assert "moved to the background" not in off and "default 120000" in off


# -- sandvisor mcp --auto-background-after ------------------------------------------------------


def _mcp_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["mcp", *argv])


def test_auto_background_after_option() -> None:
    assert _mcp_args().auto_background_after is None  # the server's default, 30 s
    assert _mcp_args("--auto-background-after", "0").auto_background_after == 0
    assert _mcp_args("--auto-background-after", "2m").auto_background_after == 120
    assert _mcp_args("--auto-background-after", "1.5").auto_background_after == 1.5


@pytest.mark.parametrize("bad", ["-1", "soon", "10d"])
def test_a_bad_auto_background_after_is_a_usage_error(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        _mcp_args("--auto-background-after", bad)
    assert caught.value.code == 2
    assert "--auto-background-after" in capsys.readouterr().err
