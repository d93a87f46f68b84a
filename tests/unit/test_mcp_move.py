"""Moving a foreground ``bash`` to the background, against a stub of the daemon's client:
its terminal notification is shown exactly once, whichever way a drain races the move."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from supervisor.interfaces.client import Chunk, SandvisorClient
from supervisor.interfaces.mcp.bridge import SessionBridge
from supervisor.interfaces.mcp.specs import BashCall, foreground

TID = "bg-1a2b3c4d"
#: What the task printed (coloured: the agent reads it rendered).
OUTPUT = b"\x1b[1mstep 1\x1b[0m\ndone\n"


class StubDaemon:
    """The few client calls the move and the drain make: a task whose status and events
    the test sets, and a consumer cursor as the daemon keeps it."""

    def __init__(self) -> None:
        self.status = "running"
        self.events: list[dict[str, Any]] = []
        self.acked = 0
        self.task_gate: asyncio.Event | None = None
        self.task_asked = asyncio.Event()

    def end(self) -> None:
        """What the runtime does: the status is final before the terminal event exists."""
        self.status = "completed"
        self.events.append(
            {
                "seq": len(self.events) + 1,
                "task_id": TID,
                "type": "task.stopped",
                "xml": f"<task-notification>\n<task-id>{TID}</task-id>\n</task-notification>",
            }
        )

    async def task(self, session_id: str, task_id: str) -> dict[str, Any]:
        self.task_asked.set()
        ended = self.status == "completed"
        body = {
            "task_id": task_id,
            "session_id": session_id,
            "command": "sleep 45; echo done",
            "description": "",
            "kind": "background",
            "policy": "default",
            "status": self.status,
            "output_path": f"/s/tasks/{task_id}.output",
            "persistent": True,
            "timeout_ms": None,
            "stdin": "closed",
            "created_at": 0.0,
            "reason": "exit" if ended else None,
            "exit_code": 0 if ended else None,
            "output_bytes": len(OUTPUT),
        }
        if self.task_gate is not None:  # the answer is on its way while the task goes on
            await self.task_gate.wait()
        return body

    async def read_output(
        self, session_id: str, task_id: str, *, offset: int = 0, limit: int = 65536
    ) -> Chunk:
        data = OUTPUT[offset : offset + limit]
        return Chunk(data, offset, offset + len(data), self.status == "completed")

    async def pending(self, session_id: str, consumer: str, fmt: str = "xml") -> dict[str, Any]:
        items = [e for e in self.events if e["seq"] > self.acked]
        return {"notifications": items, "acked": self.acked, "cursor": len(self.events)}

    async def ack(self, session_id: str, consumer: str, seq: int) -> None:
        self.acked = max(self.acked, seq)


def _bridge(stub: StubDaemon) -> SessionBridge:
    bridge = SessionBridge(cast(SandvisorClient, stub), "s", auto_background_s=30.0)
    bridge.foreground.add(TID)
    return bridge


PLANNED = foreground(BashCall("sleep 45; echo done"), 30.0)


async def test_a_task_that_ended_before_the_move_stays_a_foreground_answer() -> None:
    stub = StubDaemon()
    bridge = _bridge(stub)
    stub.end()
    assert await bridge.drain() == ""  # hidden: the foreground call answers for it
    assert await bridge._to_background(TID, PLANNED) is None
    assert TID in bridge.foreground
    assert await bridge.drain() == ""


async def test_a_moved_task_is_notified_once_when_it_ends() -> None:
    stub = StubDaemon()
    bridge = _bridge(stub)
    moved = await bridge._to_background(TID, PLANNED)
    assert moved is not None and f"ID {TID}" in moved
    assert TID not in bridge.foreground
    assert await bridge.drain() == ""
    stub.end()
    first, second = await bridge.drain(), await bridge.drain()
    assert first.count(f"<task-id>{TID}</task-id>") == 1
    assert "<last-output>\nstep 1\ndone\n</last-output>" in first  # its result, at last
    assert second == ""


async def test_a_drain_racing_the_move_waits_for_it() -> None:
    """The task ends while the move reads its status: the drain that runs meanwhile waits
    for the move, so the event is shown (the move saw the task running) and not hidden."""
    stub = StubDaemon()
    bridge = _bridge(stub)
    stub.task_gate = asyncio.Event()
    move = asyncio.create_task(bridge._to_background(TID, PLANNED))
    await stub.task_asked.wait()
    drain = asyncio.create_task(bridge.drain())
    await asyncio.sleep(0)  # the drain is now waiting on the lock the move holds
    assert not drain.done()
    stub.task_gate.set()  # the move reads "running" ...
    stub.end()  # ... and the task ends right after
    assert await move is not None
    shown = await drain + await bridge.drain()
    assert shown.count(f"<task-id>{TID}</task-id>") == 1
