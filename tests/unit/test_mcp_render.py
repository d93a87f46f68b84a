"""What the MCP tools hand the agent (issue 25): output rendered as a terminal shows it,
truncated after rendering, with raw byte offsets that never hide a byte."""

from __future__ import annotations

import re
from typing import Any, cast

from supervisor.core.models import TaskInfo
from supervisor.interfaces.client import Chunk, SandvisorClient
from supervisor.interfaces.mcp import texts
from supervisor.interfaces.mcp.bridge import SessionBridge
from supervisor.interfaces.mcp.output import foreground_output

TID = "bg-1a2b3c4d"


class StubDaemon:
    """A finished task whose output the test sets; reads answer from it like the daemon."""

    def __init__(self, output: bytes, *, ended: bool = True) -> None:
        self.output = output
        self.ended = ended

    def body(self) -> dict[str, Any]:
        return {
            "task_id": TID,
            "session_id": "s",
            "command": "make",
            "description": "build",
            "kind": "background",
            "policy": "default",
            "status": "completed" if self.ended else "running",
            "output_path": f"/s/tasks/{TID}.output",
            "persistent": False,
            "timeout_ms": 60_000,
            "stdin": "closed",
            "created_at": 0.0,
            "reason": "exit" if self.ended else None,
            "exit_code": 0 if self.ended else None,
            "output_bytes": len(self.output),
        }

    async def task(self, session_id: str, task_id: str) -> dict[str, Any]:
        return self.body()

    async def read_output(
        self, session_id: str, task_id: str, *, offset: int = 0, limit: int = 65536
    ) -> Chunk:
        data = self.output[offset : offset + limit]
        end = offset + len(data)
        return Chunk(data, offset, end, self.ended and end >= len(self.output))

    async def tail(self, session_id: str, task_id: str, chars: int = 4000) -> str:
        return self.output.decode("utf-8", "replace")[-chars:]

    async def wait_for(self, *args: Any, **kw: Any) -> dict[str, Any]:
        line = "\x1b[32mready\x1b[0m on port 3000"
        return {"matched": True, "line": line, "offset": 7}


def bridge(stub: StubDaemon) -> SessionBridge:
    return SessionBridge(cast(SandvisorClient, stub), "s")


def info(stub: StubDaemon) -> TaskInfo:
    return TaskInfo.model_validate(stub.body())


def progress(frames: int) -> bytes:
    return b"".join(b"\r\x1b[32m%5d/%d\x1b[0m" % (i, frames) for i in range(frames + 1))


async def test_a_progress_bar_result_fits_whole_once_rendered() -> None:
    # 1.6 MB of frames: before issue 25 a truncated head and tail of stale frames.
    out = b"step 1\n" + progress(100_000) + b"\nall done\n"
    stub = StubDaemon(out)
    text = await foreground_output(cast(SandvisorClient, stub), "s", info(stub))
    assert text == "step 1\n100000/100000\nall done"


async def test_a_long_result_is_truncated_after_rendering_with_the_raw_offsets() -> None:
    out = b"".join(b"\x1b[1mline %06d\x1b[0m ok\n" % i for i in range(20_000))
    stub = StubDaemon(out)
    b = bridge(stub)
    text = await foreground_output(cast(SandvisorClient, stub), "s", info(stub))
    assert len(text) <= texts.MAX_OUTPUT_CHARS + 400 and "\\x1b" not in text
    assert text.startswith("line 000000 ok\n") and text.endswith("line 019999 ok")
    found = re.search(r"bytes (\d+)-(\d+) \(the middle\) are left out", text)
    assert found is not None
    start, end = int(found.group(1)), int(found.group(2))
    head, tail = text.split("\n\n[...")[0], text.split("...]\n\n")[1]
    # The bytes left out are exactly those between the two parts: reading from ``start``
    # continues the head, and the tail begins at ``end``.
    read = await b.task_output(TID, start, None, None)
    first = read.split("---\n", 1)[1].split("\n", 1)[0]
    assert int(first.split()[1]) == int(head.rsplit("\n", 1)[1].split()[1]) + 1
    assert out[end:].startswith(b"\x1b[1m" + tail.split("\n", 1)[0].split(" ok")[0][:4].encode())
    assert out[start - 1 : start] == b"\n" and out[end - 1 : end] == b"\n"


async def test_task_output_renders_and_stops_before_a_partial_escape() -> None:
    pad = b"x" * (texts.READ_BYTES - 3) + b"\n"  # the read ends 2 bytes into the SGR below
    out = pad[:-1] + b"\x1b[32mok\x1b[0m\n"
    stub = StubDaemon(out)
    b = bridge(stub)
    first = await b.task_output(TID, 0, None, None)
    assert f"next_offset: {texts.READ_BYTES - 3};" in first and "\\x1b" not in first
    again = await b.task_output(TID, texts.READ_BYTES - 3, None, None)
    assert again.endswith("---\nok")
    raw = await b.task_output(TID, texts.READ_BYTES - 3, None, None, raw=True)
    assert raw.endswith("---\n\x1b[32mok\x1b[0m") and "; raw" in raw


async def test_task_output_tail_and_filter_read_the_rendered_text() -> None:
    out = b"\x1b[31mFAIL\x1b[0m test_a\n" + progress(500) + b"\n\x1b[32mPASS\x1b[0m test_b\n"
    stub = StubDaemon(out)
    b = bridge(stub)
    tail = await b.task_output(TID, None, 200, None)
    assert tail.endswith("---\nFAIL test_a\n  500/500\nPASS test_b")
    only = await b.task_output(TID, 0, None, "^PASS")
    assert only.endswith("---\nPASS test_b") and "filter matched 1 of 3 lines" in only
    # Raw, the same 200 characters are stale frames and escapes.
    raw = await b.task_output(TID, None, 200, None, raw=True)
    assert "FAIL" not in raw and "\x1b[32m  499/500\x1b[0m\r" in raw


async def test_task_wait_shows_the_matched_line_rendered_with_raw_offsets() -> None:
    stub = StubDaemon(b"start\n\x1b[32mready\x1b[0m on port 3000\n")
    text = await bridge(stub).task_wait(TID, "ready", 1000, 0)
    raw_len = len(b"\x1b[32mready\x1b[0m on port 3000") + 1
    assert text == f"Matched at offset 7 (next_offset: {7 + raw_len}):\nready on port 3000"
