"""Engine outages on a private engine of the test's own: with live-restore tasks survive a
restart and capture resumes with nothing lost or duplicated; without it they end as lost;
starting a task while the engine is down fails fast; deadlines fire once it is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from supervisor import EngineUnavailable, MemorySink, Supervisor, TaskSpec
from supervisor.core.events import BaseEvent
from tests.private_engine import EngineConfig, PrivateEngine

pytestmark = pytest.mark.timeout(300)

LINES = 300
COUNTER = f"i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.02; done"
EXPECTED = "".join(f"line{i}\n" for i in range(1, LINES + 1)).encode()


def terminal(events: list[BaseEvent], task_id: str) -> list[BaseEvent]:
    return [e for e in events if e.task_id == task_id and e.type in ("task.stopped", "task.failed")]


@pytest.mark.parametrize("private_engine", [EngineConfig(live_restore=True)], indirect=True)
async def test_live_restore_keeps_tasks_and_output(
    private_engine: PrivateEngine, tmp_path: Path, policies_dir: Path
) -> None:
    sink = MemorySink()
    async with Supervisor(
        state_dir=tmp_path / "state",
        policies_dir=policies_dir,
        docker_host=private_engine.docker_host,
    ) as sup:
        assert sup.live_restore
        session = await sup.open_session("live", sinks=[sink])
        tasks = [
            await session.start(TaskSpec(command=COUNTER, policy="fast", kind=kind))
            for kind in ("background", "background", "monitor")
        ]
        for t in tasks:
            await session.wait_for(t.task_id, "^line30$", timeout_s=60)
        await asyncio.to_thread(private_engine.restart)
        finals = [await session.wait(t.task_id, timeout_s=120) for t in tasks]
        await session.end()
    for t, final in zip(tasks, finals, strict=True):
        assert final.status == "completed", final
        assert final.exit_code == 0
        assert Path(final.output_path).read_bytes() == EXPECTED
        assert len(terminal(sink.events, t.task_id)) == 1
    monitor = tasks[2].task_id
    ordinals: list[int] = []
    for e in sink.events:
        if e.task_id == monitor and e.type == "task.output":
            ordinals += range(e.ordinal - e.lines + 1, e.ordinal + 1)  # type: ignore[attr-defined]
        elif e.task_id == monitor and e.type == "task.output_suppressed":
            ordinals += range(e.first_ordinal, e.last_ordinal + 1)  # type: ignore[attr-defined]
    assert ordinals == list(range(1, LINES + 1))


@pytest.mark.parametrize("private_engine", [EngineConfig(live_restore=False)], indirect=True)
async def test_without_live_restore_tasks_end_as_lost(
    private_engine: PrivateEngine, tmp_path: Path, policies_dir: Path
) -> None:
    sink = MemorySink()
    async with Supervisor(
        state_dir=tmp_path / "state",
        policies_dir=policies_dir,
        docker_host=private_engine.docker_host,
    ) as sup:
        assert not sup.live_restore
        session = await sup.open_session("nolive", sinks=[sink])
        tasks = [await session.start(TaskSpec(command=COUNTER, policy="fast")) for _ in range(3)]
        for t in tasks:
            await session.wait_for(t.task_id, "^line10$", timeout_s=60)
        await asyncio.to_thread(private_engine.restart)
        finals = [await session.wait(t.task_id, timeout_s=120) for t in tasks]
        await session.end()
    for t, final in zip(tasks, finals, strict=True):
        assert final.status == "failed"
        assert final.reason == "lost"
        assert "live-restore" in (final.error or "")
        (ev,) = terminal(sink.events, t.task_id)
        assert ev.reason == "lost"  # type: ignore[attr-defined]
        assert "engine restarted" in (ev.detail or "")  # type: ignore[attr-defined]


@pytest.mark.parametrize("private_engine", [EngineConfig(live_restore=True)], indirect=True)
async def test_engine_down_fails_fast_and_deadlines_fire_when_back(
    private_engine: PrivateEngine, tmp_path: Path, policies_dir: Path
) -> None:
    async with Supervisor(
        state_dir=tmp_path / "state",
        policies_dir=policies_dir,
        docker_host=private_engine.docker_host,
    ) as sup:
        session = await sup.open_session("down")
        timed = await session.start(
            TaskSpec(command="echo up; sleep 600", policy="fast", timeout_ms=3000)
        )
        await session.wait_for(timed.task_id, "^up$", timeout_s=60)
        await asyncio.to_thread(private_engine.stop)
        try:
            t0 = time.monotonic()
            with pytest.raises(EngineUnavailable):
                await session.start(TaskSpec(command="echo nope", policy="fast"))
            assert time.monotonic() - t0 < 10  # fails fast, never hangs
            # The deadline passes while the engine is away ...
            await asyncio.sleep(4)  # the wall-clock deadline passes while the engine is down
            assert (await session.get(timed.task_id)).status in ("running", "stopping")
        finally:
            await asyncio.to_thread(private_engine.start)
        # ... and fires once it is back.
        final = await session.wait(timed.task_id, timeout_s=120)
        assert final.reason == "timeout"
        accepted = await session.start(TaskSpec(command="echo back", policy="fast"))
        assert (await session.wait(accepted.task_id, timeout_s=60)).status == "completed"
        await session.end()
