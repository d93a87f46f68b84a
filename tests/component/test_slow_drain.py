"""A stream that is still delivering when the container exits is read to its end, however
long that takes, as long as it keeps delivering (a loaded machine, or a long log replayed
after an engine restart): only a stream that delivers nothing for DRAIN_S is given up. A
fixed 10 s drain lost the last lines of a task on a loaded machine
(test_live_restore_keeps_tasks_and_output, with the load average at 17)."""

from __future__ import annotations

import asyncio

import pytest

from supervisor import Session
from supervisor.core.container import Segment
from supervisor.engine.fake import Exit, FakeContainer, FakeEngine, Out, Script
from supervisor.engine.fake.container import FakeAttach
from supervisor.runtime.task import supervise

pytestmark = [pytest.mark.component, pytest.mark.timeout(30)]

LINES = 20
#: Between two deliveries: a third of the drain's limit, so the whole drain takes twice it.
GAP_S = 0.1


async def test_a_slow_stream_is_drained_to_its_end(
    engine: FakeEngine, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervise, "DRAIN_S", 3 * GAP_S)
    real_read = FakeAttach.read
    held: dict[int, list[Segment]] = {}

    async def one_at_a_time(self: FakeAttach) -> list[Segment] | None:
        """The engine hands over one segment per read, each a while after the last."""
        queue = held.setdefault(id(self), [])
        if not queue:
            segments = await real_read(self)
            if segments is None:
                return None
            queue.extend(segments)
        await asyncio.sleep(GAP_S)
        return [queue.pop(0)]

    monkeypatch.setattr(FakeAttach, "read", one_at_a_time)
    engine.script("count", Script(*(Out(f"line{i}\n") for i in range(LINES)), Exit(0)))
    task = await session.start({"command": "count", "policy": "fake"})
    final = await session.wait(task.task_id, timeout_s=20)
    assert (final.status, final.exit_code) == ("completed", 0)
    expected = "".join(f"line{i}\n" for i in range(LINES)).encode()
    assert (await session.read_output(task.task_id, 0)).data == expected


async def test_a_catch_up_replay_that_stalls_is_completed_from_the_log(
    engine: FakeEngine, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops with the last line in flight, the command exits, and the replay
    that should bring that line back delivers part of the log and then nothing, without
    ending (three replays did so at once on a loaded machine after a live-restore). After
    DRAIN_S without a read the rest comes from the log read without following."""
    monkeypatch.setattr(supervise, "DRAIN_S", 0.3)
    emit = FakeContainer.emit
    real_attach = FakeContainer.attach
    replays: list[FakeAttach] = []

    def emit_then_drop(self: FakeContainer, stream: int, data: bytes) -> None:
        emit(self, stream, data)
        if data == b"last words\n":
            self.drop_streams(lose_unread=True)

    def stalling_replay(self: FakeContainer, *, stdin: bool, logs: bool) -> FakeAttach:
        stream = real_attach(self, stdin=stdin, logs=logs)
        if logs and not self.running:
            stream = FakeAttach(self, stdin=False)  # never ended: it stalls
            for message in self.log[: len(self.log) // 2]:
                stream.push(message.stream, message.data)
            replays.append(stream)
        return stream

    monkeypatch.setattr(FakeContainer, "emit", emit_then_drop)
    monkeypatch.setattr(FakeContainer, "attach", stalling_replay)
    lines = [f"line{i}\n" for i in range(LINES)]
    engine.script("p", Script(*(Out(x) for x in lines), Out("last words\n"), Exit(0)))
    task = await session.start({"command": "p", "policy": "fake"})
    final = await session.wait(task.task_id, timeout_s=20)
    assert (final.status, final.exit_code) == ("completed", 0)
    assert len(replays) == 1  # the stalled replay was taken, and given up
    expected = ("".join(lines) + "last words\n").encode()
    assert (await session.read_output(task.task_id, 0)).data == expected
