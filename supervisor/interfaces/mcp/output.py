"""What the MCP tools read of a task's output: rendered as a terminal shows it
(``core.terminal``), truncated after rendering, with raw byte offsets."""

from __future__ import annotations

import re
from typing import Final

from supervisor.core.models import TaskInfo
from supervisor.core.problems import InvalidRequest
from supervisor.core.terminal import Rendered, render, render_head, render_tail
from supervisor.core.text import describe_end, utf8_safe_end
from supervisor.interfaces.client import SandvisorClient, task_info
from supervisor.interfaces.mcp import texts
from supervisor.interfaces.mcp.texts import HEAD_CHARS, MAX_OUTPUT_CHARS, READ_BYTES

#: An output up to this size is read whole and rendered for a ``bash`` result; a longer one
#: is rendered from its first and last ``EDGE_BYTES`` (the middle is left out either way
#: when the rendering is over ``MAX_OUTPUT_CHARS``).
WHOLE_BYTES: Final = 4 << 20
EDGE_BYTES: Final = 1 << 20


def decode(data: bytes, final: bool) -> tuple[str, int]:
    """UTF-8 text of ``data`` and how many bytes it covers: an incomplete character at the
    end of a read that is not final is left for the next read instead of becoming U+FFFD."""
    used = len(data) if final else utf8_safe_end(data)
    return data[:used].decode("utf-8", "replace"), used


async def foreground_output(client: SandvisorClient, session_id: str, info: TaskInfo) -> str:
    """What the task printed up to ``info``'s snapshot (all of it once it has ended),
    as a terminal shows it, cut to fit a result after rendering: its start and its
    end, with the raw bytes left out between them named."""
    sid, tid, size = session_id, info.task_id, info.output_bytes
    if size == 0:
        return ""
    ended = info.ended
    if size <= WHOLE_BYTES:
        # An ended task's file is complete: read one byte more to reach its end.
        piece = await client.read_output(sid, tid, limit=size + int(ended))
        whole = render(piece.data, final=ended)
        if len(whole.text) <= MAX_OUTPUT_CHARS:
            return whole.text.rstrip("\n")
        head = render_head(piece.data, HEAD_CHARS, final=False)
        tail = render_tail(piece.data, MAX_OUTPUT_CHARS - HEAD_CHARS, final=ended, floor=head.end)
        left_out = (head.end, tail.start)
    else:
        first = await client.read_output(sid, tid, limit=EDGE_BYTES)
        head = render_head(first.data, HEAD_CHARS, final=False)
        tail, start = await rendered_tail(
            client, sid, tid, MAX_OUTPUT_CHARS - HEAD_CHARS, size=size
        )
        left_out = (head.end, start)
    return texts.truncated(head.text, tail.text, info, left_out, so_far=not ended)


async def rendered_tail(
    client: SandvisorClient, session_id: str, task_id: str, chars: int, *, size: int | None = None
) -> tuple[Rendered, int]:
    """The last ``chars`` characters as a terminal shows them, rendered from the last
    ``EDGE_BYTES`` of the file (up to ``size``, default: as long as it is now); and the
    file offset where the bytes shown begin."""
    if size is None:
        size = task_info(await client.task(session_id, task_id)).output_bytes
    start = max(0, size - EDGE_BYTES)
    piece = await client.read_output(session_id, task_id, offset=start, limit=EDGE_BYTES + 1)
    shown = render_tail(piece.data, chars, final=piece.eof, whole=start == 0)
    return shown, start + shown.start


async def task_output(
    client: SandvisorClient,
    session_id: str,
    task_id: str,
    offset: int | None,
    tail: int | None,
    line_filter: str | None,
    *,
    raw: bool = False,
) -> str:
    """The ``task_output`` tool's result: rendered (or ``raw``) output by offset or tail."""

    if offset is not None and tail is not None:
        raise InvalidRequest("give either offset or tail, not both")
    regex = None
    if line_filter is not None:
        try:
            regex = re.compile(line_filter)
        except re.error as exc:
            raise InvalidRequest(f"not a valid regular expression ({exc})", field="filter") from exc
    # Status first: if it says ended, the output read afterwards is complete.
    info = task_info(await client.task(session_id, task_id))
    head = f'Task {task_id} "{texts.label(info)}": {describe_end(info)}'
    if tail is not None and raw:
        text = await client.tail(session_id, task_id, tail)
        where = f"last {len(text)} characters (raw); next_offset: {info.output_bytes}"
    elif tail is not None:
        shown, _ = await rendered_tail(client, session_id, task_id, tail, size=info.output_bytes)
        text = shown.text
        where = f"last {len(text)} characters; next_offset: {info.output_bytes}"
    else:
        start = offset or 0
        piece = await client.read_output(session_id, task_id, offset=start, limit=READ_BYTES)
        if raw:
            text, used = decode(piece.data, final=piece.eof)
        else:
            # A partial escape sequence at the end is not consumed: next_offset stops
            # before it, and the next read renders it whole.
            rendered = render(piece.data, final=piece.eof)
            text, used = rendered.text, rendered.end
        more = (
            "no (the task has ended)"
            if piece.eof
            else "yes"
            if len(piece.data) >= READ_BYTES
            else ("not yet (the task is still running)" if not info.ended else "no")
        )
        where = f"bytes {start}-{start + used}; next_offset: {start + used}; more: {more}"
        if raw:
            where += "; raw"
    if regex is not None:
        lines = text.splitlines()
        kept = [line for line in lines if regex.search(line)]
        where += f"; filter matched {len(kept)} of {len(lines)} lines"
        text = "\n".join(kept)
    body = text.rstrip("\n") if text else "(no output)"
    return f"{head}\n{where}\n---\n{body}"
