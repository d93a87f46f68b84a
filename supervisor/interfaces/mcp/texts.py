"""What the agent reads: the MCP server's instructions, tool descriptions, argument schemas,
and the sentences tool results are made of."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

from supervisor.core.errors import SupervisorError
from supervisor.core.models import TaskInfo
from supervisor.core.render import xml_text
from supervisor.core.text import describe_end, end_clause, format_duration, format_elapsed
from supervisor.core.text import task_label as _task_label
from supervisor.interfaces.http_errors import DaemonError, DaemonNotRunning
from supervisor.interfaces.mcp.specs import POLL_TAIL_CHARS

#: Claude Code's Bash tool truncates at 30000 characters; models are used to that size.
MAX_OUTPUT_CHARS: Final = 30_000
#: Of a truncated foreground output, this much of the start is kept (the rest from the end).
HEAD_CHARS: Final = 8_000
#: Bytes ``task_output`` reads per call.
READ_BYTES: Final = 30_000
#: Characters of notification blocks appended to one tool result; the rest waits.
NOTIFY_MAX_CHARS: Final = 20_000
#: Characters of output the completion of a command moved to the background carries: the
#: agent asked for that command's result, so its end comes with the notification.
COMPLETION_TAIL_CHARS: Final = 4_000

TASK_OUTPUT_DESCRIPTION = (
    "Read a background task's or monitor's output: from a byte `offset` (default 0; pass "
    "the previous next_offset to read on, 30000 bytes per call) or the last `tail` "
    "characters, optionally only the lines matching `filter`. Also says whether the task is "
    "still running. The output is shown as a terminal would show it (no colour codes, a "
    "progress bar at its last frame); `raw` gives the exact text, escape codes included."
)
TASK_STOP_DESCRIPTION = (
    "Stop a background task or monitor (SIGTERM, then SIGKILL after the policy's grace "
    "period) and remove its container. Returns the final status; an error if it had already "
    "ended."
)
TASK_LIST_DESCRIPTION = (
    "List this session's background tasks and monitors with their status, running time and "
    "output file."
)
TASK_INPUT_DESCRIPTION = (
    "Write text to a background task's stdin (e.g. to answer a prompt it is waiting on); "
    "`eof` closes stdin afterwards."
)
TASK_WAIT_DESCRIPTION = (
    "Wait until a background task prints a line matching `pattern` (returns the line) or, "
    "without a pattern, until it ends (returns the final status). Gives up after `timeout` ms "
    "(default 30000) and says so; the task keeps running. Use it when your next step "
    "depends on that line or on the end (a server being ready, a build finishing); to keep "
    "an eye on a long job while you do other work, start it with `tail_every_minutes` "
    "instead."
)
MONITOR_START_DESCRIPTION = (
    "Start a monitor: a background command whose every stdout line is reported to you as a "
    "<task-output> block (in the result of your next tool call). For log tails, file "
    "watchers, polling loops, 'tell me when X happens'. Stop it with task_stop. "
    "`tail_every_minutes` adds a periodic <background_task_poll> with its latest output."
)


# -- argument types -----------------------------------------------------------------------

TaskId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        description="The task id returned by bash (run_in_background) or monitor_start, "
        "e.g. bg-7f3a9c2e.",
    ),
]
Command = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128 * 1024,
        description="The shell command, run as `sh -c COMMAND` in the sandbox image.",
    ),
]
MonitorCommand = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128 * 1024,
        description="The shell command; every line it prints on stdout is an event.",
    ),
]
Description = Annotated[
    str,
    Field(
        max_length=500,
        description="Short label (5-10 words) used in notifications, e.g. 'dev server'.",
    ),
]
BashTimeout = Annotated[
    Annotated[int, Field(ge=1, le=600_000)] | None,
    Field(
        description="Milliseconds before the command is killed (max 600000), in the "
        "foreground and after a move to the background alike. Omitted: background commands "
        "run until they end or are stopped; for foreground ones see the tool description.",
    ),
]
InBackground = Annotated[
    bool, Field(description="Return at once with a task id; the command keeps running.")
]
TailEveryMinutes = Annotated[
    Annotated[
        float,
        # The range is in the schema for clients and models; it is checked by the server,
        # whose error names the field and the whole range.
        Field(strict=True, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1440}),
    ]
    | None,
    Field(
        description="While the command runs, every this many minutes (> 0, at most 1440; "
        "fractions allowed: 0.5 = 30 s) send a <background_task_poll> with the last "
        f"{POLL_TAIL_CHARS} characters of its output, only when there is new output. Omitted: "
        "no polls, only the notification when it ends.",
    ),
]
BashPersistent = Annotated[
    bool | None,
    Field(
        description="Background commands only. true: no timeout, run until task_stop or the "
        "end of the session (what a background command without timeout does anyway; an "
        "error where the policy forbids it); false: stop it after the policy's default "
        "timeout (5 minutes in the shipped policies, 10 in ci) unless timeout is given. Not "
        "together with timeout.",
    ),
]
MonitorTimeout = Annotated[
    int,
    Field(
        ge=1,
        le=3_600_000,
        description="Milliseconds before the monitor is stopped (default 300000 = 5 min, "
        "max 3600000 = 1 h). Ignored when persistent is true.",
    ),
]
Persistent = Annotated[
    bool, Field(description="Ignore timeout_ms; run until task_stop or the session ends.")
]
WaitTimeout = Annotated[
    int,
    Field(ge=1, le=600_000, description="How long to wait, in milliseconds (max 600000)."),
]
WaitOffset = Annotated[
    int, Field(ge=0, description="Only lines starting at or after this byte offset count.")
]
# Optional arguments: the description sits on the outer type so that it is a top-level
# key of the property's schema (next to anyOf), where clients and models look for it.
Offset = Annotated[
    Annotated[int, Field(ge=0)] | None,
    Field(
        description="Byte offset in the output file to read from (default 0 = the start; pass "
        "the next_offset of the previous call to read on). Not together with tail.",
    ),
]
TailChars = Annotated[
    Annotated[int, Field(ge=1, le=MAX_OUTPUT_CHARS)] | None,
    Field(description="Return only the last N characters (max 30000). Not together with offset."),
]
LineFilter = Annotated[
    Annotated[str, Field(min_length=1, max_length=10_000)] | None,
    Field(description="Regular expression (Python syntax); only lines matching it are returned."),
]
Pattern = Annotated[
    Annotated[str, Field(min_length=1, max_length=10_000)] | None,
    Field(
        description="Regular expression (Python syntax) searched in each output line; lines "
        "printed before the call count too. Omit to wait for the task to end.",
    ),
]
RawOutput = Annotated[
    bool,
    Field(
        description="true: the exact output, escape sequences and every progress-bar frame "
        "included; false (default): as a terminal would show it.",
    ),
]
InputText = Annotated[
    str,
    Field(
        max_length=1024 * 1024,
        description="Text written to the task's stdin as is (include the newline, e.g. 'y\\n').",
    ),
]
CloseStdin = Annotated[bool, Field(description="Close stdin after writing.")]


# -- results ------------------------------------------------------------------------------


def error_text(exc: SupervisorError) -> str:
    """A failed tool call's result: the stable code, then what went wrong."""
    if isinstance(exc, DaemonNotRunning):
        return f"Error ({exc.code}): the sandvisor daemon does not answer ({exc})"
    if isinstance(exc, DaemonError):
        return f"Error ({exc.code}): request to the sandvisor daemon failed ({exc})"
    if exc.retryable:
        return (
            f"Error ({exc.code}): {exc}\n"
            "Retryable: nothing was started; call this tool again in a few seconds."
        )
    return f"Error ({exc.code}): {exc}"


def label(info: TaskInfo) -> str:
    """The task's description, else its command (cut to a sensible length)."""
    return _task_label(info.description, info.command)


def running_time(info: TaskInfo) -> str:
    return format_elapsed(info.running_ms)


def _life(info: TaskInfo) -> str:
    """How long a background task may run."""
    if info.persistent:
        return "It runs until it ends, task_stop, or the end of the session."
    return f"It is stopped after {format_duration(info.timeout_ms or 0)} if it runs that long."


def _polls(poll_every_s: float | None) -> str:
    if poll_every_s is None:
        return ""
    every = format_duration(round(poll_every_s * 1000))
    return (
        f" While it runs you also get a <background_task_poll> with its latest output every "
        f"{every} when it printed something new."
    )


def started_in_background(info: TaskInfo, poll_every_s: float | None = None) -> str:
    return (
        f"Command running in background with ID: {info.task_id}. "
        f"Output is being written to: {info.output_path}\n"
        "You will get a <task-notification> when it ends. Use task_wait to wait for a "
        "line (e.g. pattern='ready'), task_output to read its output, task_stop to "
        f"stop it. {_life(info)}{_polls(poll_every_s)}"
    )


def with_last_output(xml: str, tail: str) -> str:
    """A ``<task-notification>`` with the command's last output added (as a stall notice
    carries it), for a command that was moved to the background."""
    body = xml_text(tail.rstrip("\n")) if tail else "(no output)"
    end = "</task-notification>"
    if not xml.endswith(end):
        return xml
    return f"{xml[: -len(end)]}<last-output>\n{body}\n</last-output>\n{end}"


def moved_to_background(
    output: str, info: TaskInfo, after_s: float, poll_every_s: float | None = None
) -> str:
    """A foreground command still running after ``after_s``: what it printed so far, and
    that it now runs on in the background (how to wait for it, read on, stop it)."""
    after = format_duration(round(after_s * 1000))
    tid = info.task_id
    return (
        f"{output or '(no output yet)'}\n"
        f"Command still running after {after}, so it was moved to the background (it was "
        f"not stopped): ID {tid}. Output is being written to: {info.output_path}\n"
        f"You will get a <task-notification> with its last output when it ends (in the "
        f"result of a later tool call). To wait for it: task_wait task_id={tid} (with "
        f"pattern=... for a line); to read what it prints next: task_output task_id={tid} "
        f"offset={info.output_bytes}; to stop it: task_stop task_id={tid}. "
        f"{_life(info)}{_polls(poll_every_s)}"
    )


def monitor_started(info: TaskInfo, timeout_ms: int, poll_every_s: float | None = None) -> str:
    life = (
        "It runs until task_stop or the end of the session."
        if info.persistent
        else f"It stops after {format_duration(info.timeout_ms or timeout_ms)}."
    )
    return (
        f"Monitor started with ID: {info.task_id}. Output is being written to: "
        f"{info.output_path}\nEach line it prints is delivered to you as a <task-output> "
        f"block in the result of your next tool call. {life}{_polls(poll_every_s)}"
    )


def foreground_result(output: str, final: TaskInfo, timeout_ms: int | None) -> str:
    """A foreground command's output, then how it ended (as the Bash tool says it)."""
    if final.reason == "exit":
        trailer = f"Exit code: {final.exit_code}"
    elif final.reason == "timeout":
        trailer = (
            f"Command timed out after {format_duration(final.timeout_ms or timeout_ms or 0)} "
            "and was killed "
            f"(exit code {final.exit_code})."
        )
    else:
        trailer = f"Command {end_clause(final)}."
    return f"{output}\n{trailer}" if output else f"(no output)\n{trailer}"


def truncated(
    head: str, tail: str, final: TaskInfo, left_out: tuple[int, int], *, so_far: bool = False
) -> str:
    """A long foreground output: its start and its end (rendered, in whole lines), and the
    raw bytes ``left_out`` between them (``so_far``: the command is still running)."""
    start, end = left_out
    return (
        f"{head.rstrip(chr(10))}\n\n[... output truncated: {final.output_bytes} bytes "
        f"{'so far' if so_far else 'in all'}; bytes {start}-{end} (the middle) are left out: "
        f"read them with task_output task_id={final.task_id} offset={start}. Full output: "
        f"{final.output_path} ...]\n\n{tail.rstrip(chr(10))}"
    )


def stopped(info: TaskInfo) -> str:
    return (
        f'Stopped task {info.task_id} "{label(info)}": {describe_end(info)} after '
        f"{running_time(info)}. Output file: {info.output_path}"
    )


def task_list(tasks: list[TaskInfo]) -> str:
    if not tasks:
        return "No background tasks or monitors in this session."
    lines = [f"{len(tasks)} task(s):"]
    for t in tasks:
        lines.append(
            f"- {t.task_id} [{t.kind}] {describe_end(t)}, running {running_time(t)}"
            f"{', waiting for input' if t.stalled else ''}: "
            f"{label(t)!r} (output: {t.output_path})"
        )
    return "\n".join(lines)


def wait_ended(info: TaskInfo) -> str:
    return (
        f'Task {info.task_id} "{label(info)}" ended: {describe_end(info)} after '
        f"{running_time(info)}. Output file: {info.output_path}"
    )


def wait_timed_out(info: TaskInfo, timeout_ms: int) -> str:
    return (
        f"Timed out after {format_duration(timeout_ms)}: task {info.task_id} is still "
        f"{info.status} (running {running_time(info)})."
    )


def no_match_yet(info: TaskInfo, pattern: str, timeout_ms: int) -> str:
    return (
        f"Timed out after {format_duration(timeout_ms)}: no line matching {pattern!r} "
        f"yet; task {info.task_id} is {describe_end(info)}."
    )


def ended_without_match(info: TaskInfo, pattern: str) -> str:
    return (
        f"No match: task {info.task_id} ended ({describe_end(info)}) without printing "
        f"a line matching {pattern!r}. Output file: {info.output_path}"
    )


def input_sent(task_id: str, text: str, eof: bool) -> str:
    sent = f"Sent {len(text)} character(s) to the stdin of {task_id}"
    return sent + (" and closed it (EOF)." if eof else ".")
