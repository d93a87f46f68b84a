"""Agent-facing rendering of events: ``<task-notification>`` blocks and their JSON twins.

The task's own text in them (poll and stall tails, monitor lines) is shown as a terminal
would show it (``core.terminal``: no escape sequences, progress bars at their last frame);
the events themselves keep it as it was."""

from __future__ import annotations

from typing import Any

from supervisor.core.events import (
    BaseEvent,
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
from supervisor.core.lifecycle import status_for
from supervisor.core.terminal import render_text
from supervisor.core.text import REASON_TEXT, format_duration, task_label
from supervisor.core.visible import visible


def xml_text(value: str) -> str:
    """Escape text content. Control characters (XML 1.0 forbids most C0 controls; ESC would
    let output drive a terminal), bidirectional overrides and other invisible format
    characters become visible ``\\xNN`` / ``\\uNNNN`` (``core.visible``); tab, newline
    and carriage return stay."""
    value = visible(value, keep="\t\n\r")
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def xml_attr(value: str) -> str:
    """Escape an attribute value (double-quoted)."""
    return xml_text(value).replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;")


def _label(ev: TaskStarted | TaskStopped | TaskFailed | TaskStalled | TaskPoll) -> str:
    return task_label(ev.description, ev.command)


def summary(ev: TaskStopped | TaskFailed) -> str:
    """One sentence saying how the command ended."""
    what = f'Background command "{_label(ev)}"'
    if isinstance(ev, TaskFailed):
        return f"{what} failed to start: {ev.message}"
    if ev.reason == "exit":
        ended = "completed" if ev.exit_code == 0 else "failed"
        return f"{what} {ended} (exit code {ev.exit_code})"
    if ev.reason == "lost":
        return f"{what} failed: lost ({ev.detail or 'the container vanished'})"
    verb = "was killed" if status_for(ev.reason, ev.exit_code) == "killed" else "failed"
    return f"{what} {verb}: {REASON_TEXT[ev.reason]}"


def event_status(ev: TaskStopped | TaskFailed) -> str:
    """completed, failed or killed."""
    if isinstance(ev, TaskFailed):
        return "failed"
    return status_for(ev.reason, ev.exit_code)


def _last_lines(text: str, lines: int = 20, chars: int = 2000) -> str:
    tail = "\n".join(text.rstrip("\n").split("\n")[-lines:])
    return tail[-chars:]


def render_xml(ev: BaseEvent) -> str | None:
    """The agent-facing block for an event, or None for events agents do not see."""
    if isinstance(ev, (TaskStopped, TaskFailed)):
        lines = [
            "<task-notification>",
            f"<task-id>{xml_text(ev.task_id or '')}</task-id>",
            f"<output-file>{xml_text(ev.output_path)}</output-file>",
            f"<status>{event_status(ev)}</status>",
            f"<summary>{xml_text(summary(ev))}</summary>",
        ]
        if isinstance(ev, TaskStopped):
            tail = f"<reason>{ev.reason}</reason>"
            if ev.exit_code is not None:
                tail += f"<exit-code>{ev.exit_code}</exit-code>"
            tail += f"<running-ms>{ev.running_ms}</running-ms>"
            lines.append(tail)
            if ev.dropped_bytes:
                lines.append(
                    f"<note>{ev.dropped_bytes} bytes of output were dropped after the output cap"
                    "</note>"
                )
        else:
            lines.append(
                f"<reason>failed</reason><error-code>{xml_text(ev.error_code)}</error-code>"
            )
        lines.append("</task-notification>")
        return "\n".join(lines)
    if isinstance(ev, TaskStalled):
        return "\n".join(
            [
                "<task-notification>",
                f"<task-id>{xml_text(ev.task_id or '')}</task-id>",
                f"<output-file>{xml_text(ev.output_path)}</output-file>",
                f'<summary>Background command "{xml_text(_label(ev))}" appears to be waiting '
                "for interactive input</summary>",
                f"<last-output>\n{xml_text(_last_lines(render_text(ev.last_output)))}\n"
                "</last-output>",
                "<hint>Either send the answer to its stdin (task_input / sandvisor input, e.g. "
                '"y\\n"), or stop it and rerun the command with its input piped in '
                "(e.g. `yes | CMD`, `CMD &lt; answers.txt`, or a --yes/--non-interactive "
                "flag).</hint>",
                "</task-notification>",
            ]
        )
    if isinstance(ev, TaskPoll):
        return (
            f'<background_task_poll taskId="{xml_attr(ev.task_id or "")}" '
            f'command="{xml_attr(ev.command)}" runningMs="{ev.running_ms}">\n'
            f"<log_tail>\n{xml_text(render_text(ev.tail))}\n</log_tail>\n"
            "</background_task_poll>"
        )
    if isinstance(ev, TaskOutput):
        mark = "\n[line continues in the next event]" if ev.cut else ""
        return (
            f'<task-output task-id="{xml_attr(ev.task_id or "")}" ordinal="{ev.ordinal}" '
            f'lines="{ev.lines}">\n{xml_text(render_text(ev.text))}{mark}\n</task-output>'
        )
    if isinstance(ev, TaskOutputSuppressed):
        return (
            f'<task-output task-id="{xml_attr(ev.task_id or "")}" suppressed="{ev.lines}">'
            f"{ev.lines} lines suppressed by the rate limit (ordinals {ev.first_ordinal}-"
            f"{ev.last_ordinal}); they are in the output file</task-output>"
        )
    return None


def render_json(ev: BaseEvent) -> dict[str, Any]:
    """A JSON-friendly dict with the same information as ``render_xml`` plus the raw event.
    The summary is for people (the dashboard shows it): its unsafe characters are escaped
    as in the XML; the event keeps the task's text exactly."""
    out: dict[str, Any] = {"event": ev.model_dump(mode="json")}
    said: str | None = None
    if isinstance(ev, (TaskStopped, TaskFailed)):
        out["status"] = event_status(ev)
        said = summary(ev)
    elif isinstance(ev, TaskStalled):
        said = f'Background command "{_label(ev)}" appears to be waiting for interactive input'
    elif isinstance(ev, TaskStarted):
        said = f'Background command "{_label(ev)}" started'
    elif isinstance(ev, SessionEnded):
        said = f"Session ended; {ev.tasks_stopped} task(s) stopped"
    elif isinstance(ev, EventsGap):
        said = f"Events {ev.first_seq}-{ev.last_seq} were missed ({ev.why})"
    if said is not None:
        out["summary"] = visible(said)
    out["xml"] = render_xml(ev)
    return out


def duration_text(ms: int) -> str:
    """``300000`` -> ``5m`` (for help texts and summaries)."""
    return format_duration(ms)
