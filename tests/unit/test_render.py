"""render: the agent-facing <task-notification> envelope, polls, stall notices, escaping."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from supervisor.core.events import (
    EventsGap,
    SessionEnded,
    TaskFailed,
    TaskOutput,
    TaskOutputSuppressed,
    TaskPoll,
    TaskStalled,
    TaskStarted,
    TaskStopped,
)
from supervisor.core.render import (
    duration_text,
    render_json,
    render_xml,
    summary,
    xml_attr,
    xml_text,
)

TID = "bg-7f3a9c2e"
OUT = "/state/sessions/s1/tasks/bg-7f3a9c2e.output"


def stopped(**kw: Any) -> TaskStopped:
    base: dict[str, Any] = {
        "session_id": "s1",
        "task_id": TID,
        "command": "npm run dev",
        "description": "dev server",
        "output_path": OUT,
        "reason": "exit",
        "exit_code": 0,
        "running_ms": 8123,
        "output_bytes": 10,
    }
    base.update(kw)
    return TaskStopped(**base)


def stalled(**kw: Any) -> TaskStalled:
    base: dict[str, Any] = {
        "session_id": "s1",
        "task_id": TID,
        "command": "npm init",
        "description": "",
        "output_path": OUT,
        "signal": "process_state",
        "last_output": "package name: (app) ",
        "waiting_ms": 3000,
    }
    base.update(kw)
    return TaskStalled(**base)


def poll(**kw: Any) -> TaskPoll:
    base: dict[str, Any] = {
        "session_id": "s1",
        "task_id": TID,
        "command": "make test",
        "description": "",
        "running_ms": 4500,
        "tail": "ok 1\nok 2",
        "new_bytes": 10,
    }
    base.update(kw)
    return TaskPoll(**base)


def parse(xml: str | None) -> ET.Element:
    assert xml is not None
    return ET.fromstring(xml)


@pytest.mark.parametrize(
    ("kw", "status", "summary_text", "tail"),
    [
        (
            {"reason": "exit", "exit_code": 0},
            "completed",
            'Background command "dev server" completed (exit code 0)',
            "<reason>exit</reason><exit-code>0</exit-code><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "exit", "exit_code": 1},
            "failed",
            'Background command "dev server" failed (exit code 1)',
            "<reason>exit</reason><exit-code>1</exit-code><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "user_stopped", "exit_code": 143},
            "killed",
            'Background command "dev server" was killed: stopped by request',
            "<reason>user_stopped</reason><exit-code>143</exit-code><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "timeout", "exit_code": 137},
            "killed",
            'Background command "dev server" was killed: it reached its timeout',
            "<reason>timeout</reason><exit-code>137</exit-code><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "idle_timeout", "exit_code": None},
            "killed",
            'Background command "dev server" was killed: it printed nothing for too long '
            "(idle timeout)",
            "<reason>idle_timeout</reason><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "session_ended", "exit_code": None},
            "killed",
            'Background command "dev server" was killed: the session ended',
            "<reason>session_ended</reason><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "oom_killed", "exit_code": 137},
            "failed",
            'Background command "dev server" failed: killed for running out of memory',
            "<reason>oom_killed</reason><exit-code>137</exit-code><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "lost", "exit_code": None, "detail": "engine restarted"},
            "failed",
            'Background command "dev server" failed: lost (engine restarted)',
            "<reason>lost</reason><running-ms>8123</running-ms>",
        ),
        (
            {"reason": "lost", "exit_code": None},
            "failed",
            'Background command "dev server" failed: lost (the container vanished)',
            "<reason>lost</reason><running-ms>8123</running-ms>",
        ),
    ],
    ids=["completed", "failed", "killed", "timeout", "idle", "session", "oom", "lost", "lost2"],
)
def test_task_notification_exact_shape(
    kw: dict[str, Any], status: str, summary_text: str, tail: str
) -> None:
    ev = stopped(**kw)
    expected = "\n".join(
        [
            "<task-notification>",
            f"<task-id>{TID}</task-id>",
            f"<output-file>{OUT}</output-file>",
            f"<status>{status}</status>",
            f"<summary>{summary_text}</summary>",
            tail,
            "</task-notification>",
        ]
    )
    assert render_xml(ev) == expected
    assert summary(ev) == summary_text
    js = render_json(ev)
    assert (js["status"], js["summary"], js["xml"]) == (status, summary_text, expected)
    assert js["event"]["type"] == "task.stopped"
    assert js["event"]["reason"] == kw["reason"]
    json.dumps(js)  # JSON-friendly
    root = parse(expected)
    assert root.findtext("status") == status


def test_dropped_bytes_adds_a_note() -> None:
    xml = render_xml(stopped(dropped_bytes=4096))
    assert xml is not None
    lines = xml.split("\n")
    assert lines[-2] == ("<note>4096 bytes of output were dropped after the output cap</note>")
    assert lines[-1] == "</task-notification>"


def test_task_failed_notification() -> None:
    ev = TaskFailed(
        session_id="s1",
        task_id=TID,
        command="npm run dev",
        description="dev server",
        output_path=OUT,
        error_code="image_missing",
        message="image 'sandvisor/x' is not present",
    )
    summary_text = (
        "Background command \"dev server\" failed to start: image 'sandvisor/x' is not present"
    )
    assert render_xml(ev) == "\n".join(
        [
            "<task-notification>",
            f"<task-id>{TID}</task-id>",
            f"<output-file>{OUT}</output-file>",
            "<status>failed</status>",
            f"<summary>{summary_text}</summary>",
            "<reason>failed</reason><error-code>image_missing</error-code>",
            "</task-notification>",
        ]
    )
    js = render_json(ev)
    assert (js["status"], js["summary"]) == ("failed", summary_text)


def test_label_falls_back_to_command_and_is_truncated() -> None:
    assert summary(stopped(description="")) == (
        'Background command "npm run dev" completed (exit code 0)'
    )
    long = "x" * 300
    assert summary(stopped(description=long)) == (
        f'Background command "{"x" * 197}..." completed (exit code 0)'
    )


def test_stall_notice() -> None:
    xml = render_xml(stalled())
    assert xml is not None
    assert "<status>" not in xml
    lines = xml.split("\n")
    assert lines[:4] == [
        "<task-notification>",
        f"<task-id>{TID}</task-id>",
        f"<output-file>{OUT}</output-file>",
        '<summary>Background command "npm init" appears to be waiting for interactive '
        "input</summary>",
    ]
    assert lines[-1] == "</task-notification>"
    root = parse(xml)
    assert root.findtext("last-output") == "\npackage name: (app) \n"
    hint = root.findtext("hint")
    assert hint is not None
    assert "send the answer to its stdin" in hint  # way out 1: send input
    assert "rerun the command with its input piped in" in hint  # way out 2
    assert "CMD < answers.txt" in hint  # escaped in XML, plain once parsed
    js = render_json(stalled())
    assert js["summary"] == (
        'Background command "npm init" appears to be waiting for interactive input'
    )
    assert "status" not in js


def test_stall_last_output_keeps_only_the_last_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(100)) + "\n"
    root = parse(render_xml(stalled(last_output=text)))
    body = root.findtext("last-output")
    assert body is not None
    assert body.strip("\n").split("\n") == [f"line {i}" for i in range(80, 100)]


def test_poll_shape() -> None:
    assert render_xml(poll()) == (
        f'<background_task_poll taskId="{TID}" command="make test" runningMs="4500">\n'
        "<log_tail>\nok 1\nok 2\n</log_tail>\n"
        "</background_task_poll>"
    )


def test_escaping_in_command_and_output() -> None:
    cmd = 'echo "<b>" & cat a\'b\n\r\x00\x1b[31m'
    out = "<script>&amp; \x00 \x1b[31mred\x1b[0m \x07 tab\tok \x1b"
    xml = render_xml(poll(command=cmd, tail=out))
    assert xml is not None
    assert "\x00" not in xml
    assert "\x1b" not in xml
    assert "\x07" not in xml
    head = xml.split("\n", 1)[0]
    assert head == (
        f'<background_task_poll taskId="{TID}" '
        'command="echo &quot;&lt;b&gt;&quot; &amp; cat a\'b&#10;&#13;\\x00\\x1b[31m" '
        'runningMs="4500">'
    )
    # The tail as a terminal shows it (issue 25): the colour is gone, other controls and a
    # stray ESC are visible.
    assert "&lt;script&gt;&amp;amp; \\x00 red \\x07 tab\tok \\x1b" in xml
    root = parse(xml)  # well-formed XML despite hostile input
    assert root.get("command") == 'echo "<b>" & cat a\'b\n\r\\x00\\x1b[31m'
    assert root.findtext("log_tail") == "\n<script>&amp; \\x00 red \\x07 tab\tok \\x1b\n"


def test_escaping_in_notification_fields() -> None:
    ev = stopped(description="a <b> & \x1b c", output_path="/x/<y>&.output")
    root = parse(render_xml(ev))
    assert root.findtext("output-file") == "/x/<y>&.output"
    assert (
        root.findtext("summary") == 'Background command "a <b> & \\x1b c" completed (exit code 0)'
    )


def test_escaping_in_stall_notice() -> None:
    ev = stalled(description="ask <me>", last_output="Password: \x00\x1b]0;pwn\x07 &")
    xml = render_xml(ev)
    assert xml is not None
    root = parse(xml)
    assert root.findtext("summary") == (
        'Background command "ask <me>" appears to be waiting for interactive input'
    )
    # The title sequence is a terminal's, not text: gone; NUL stays visible.
    assert root.findtext("last-output") == "\nPassword: \\x00 &\n"


def test_task_text_is_rendered_as_a_terminal_shows_it() -> None:
    """Issue 25: what the dashboard screenshot showed, and a progress bar's frames."""
    colour = "\x1b[1mtest_api\x1b[0m ... \x1b[32mok\x1b[0m (37 ms)\n"
    bar = "".join(f"\rdownloading {i:3d}%" for i in range(0, 101, 5)) + "\n"
    root = parse(render_xml(poll(tail=colour + bar)))
    assert root.findtext("log_tail") == "\ntest_api ... ok (37 ms)\ndownloading 100%\n\n"
    ev = stalled(last_output="\x1b[1mProceed?\x1b[0m [y/N] ")
    assert parse(render_xml(ev)).findtext("last-output") == "\nProceed? [y/N] \n"
    # The event keeps the text exactly; only what the agent reads is rendered.
    assert poll(tail=colour).tail == colour


def test_xml_helpers() -> None:
    assert xml_text("a<b>&c") == "a&lt;b&gt;&amp;c"
    assert xml_text("\x00\x1b\x7f\t\n\r") == "\\x00\\x1b\\x7f\t\n\r"
    assert xml_text("\ufffe\uffff") == "\\ufffe\\uffff"  # not XML characters: shown
    assert xml_attr('"q"\n') == "&quot;q&quot;&#10;"


#: A file name that reads ``invoice_txt.exe`` backwards: U+202E (right-to-left override)
#: makes ``invoice_\u202etxt.exe`` look like ``invoice_exe.txt``.
BIDI = "invoice_\u202etxt.exe \u2066isolate\u2069 zw\u200bsp \ufeffbom \U000e0041tag"
BIDI_SHOWN = "invoice_\\u202etxt.exe \\u2066isolate\\u2069 zw\\u200bsp \\ufeffbom \\U000e0041tag"


def test_bidi_and_invisible_format_characters_are_shown() -> None:
    """Issue 22, item 12: bidi overrides passed through into the agent's notifications and
    the dashboard's timeline (its summary and XML)."""
    for ev in (
        stopped(description=BIDI),
        stalled(description=BIDI, last_output=BIDI),
        poll(command=BIDI, tail=BIDI),
        TaskStarted(
            session_id="s1",
            task_id=TID,
            command="x",
            description=BIDI,
            kind="background",
            policy="default",
            output_path=OUT,
            persistent=False,
            timeout_ms=1000,
        ),
        TaskOutput(session_id="s1", task_id=TID, text=BIDI, ordinal=1, lines=1),
    ):
        xml = render_xml(ev)
        body = render_json(ev)
        for text in (xml or "", body.get("summary") or ""):
            for ch in ("\u202e", "\u2066", "\u2069", "\u200b", "\ufeff", "\U000e0041"):
                assert ch not in text, (type(ev).__name__, text)
        if xml is not None:
            assert BIDI_SHOWN in xml, xml
        if "summary" in body:
            assert BIDI_SHOWN in body["summary"]
        # The raw event keeps the task's text exactly (it is data, not display).
        assert BIDI in json.dumps(body["event"], ensure_ascii=False)
    # Joiners stay: emoji and several scripts need them, and they reorder nothing.
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467 \u0646\u200c\u0645"
    assert xml_text(family) == family


def test_monitor_output_and_suppression() -> None:
    out = TaskOutput(session_id="s1", task_id=TID, text="a<b\nc", ordinal=7, lines=2)
    assert (
        render_xml(out)
        == f'<task-output task-id="{TID}" ordinal="7" lines="2">\na&lt;b\nc\n</task-output>'
    )
    sup = TaskOutputSuppressed(
        session_id="s1", task_id=TID, lines=5, first_ordinal=8, last_ordinal=12
    )
    assert render_xml(sup) == (
        f'<task-output task-id="{TID}" suppressed="5">5 lines suppressed by the rate limit '
        "(ordinals 8-12); they are in the output file</task-output>"
    )


def test_json_summaries_for_other_events() -> None:
    started = TaskStarted(
        session_id="s1",
        task_id=TID,
        command="sleep 9",
        description="",
        kind="background",
        policy="default",
        output_path=OUT,
        persistent=False,
        timeout_ms=1000,
    )
    assert render_json(started)["summary"] == 'Background command "sleep 9" started'
    assert render_xml(started) is None
    ended = SessionEnded(session_id="s1", tasks_stopped=2)
    assert render_json(ended)["summary"] == "Session ended; 2 task(s) stopped"
    gap = EventsGap(session_id="s1", seq=9, first_seq=3, last_seq=9, why="overflow")
    assert render_json(gap)["summary"] == "Events 3-9 were missed (overflow)"
    assert render_json(gap)["xml"] is None


@pytest.mark.parametrize(
    ("ms", "text"),
    [(300_000, "5m"), (3_600_000, "1h"), (30_000, "30s"), (1500, "1500ms"), (90_000, "90s")],
)
def test_duration_text(ms: int, text: str) -> None:
    assert duration_text(ms) == text
