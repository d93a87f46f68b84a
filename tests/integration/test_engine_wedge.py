"""A wedged engine, for real (issue 29): a private dockerd of the test's own is SIGSTOPped
(it takes connections, answers nothing) in the middle of a burst of starts while a task
prints steadily. Starts fail fast with engine_unresponsive, the watchdog says wedged, and
after SIGCONT the running task's output is exact, with one terminal event."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor import EngineUnresponsive, MemorySink, Supervisor, TaskSpec
from supervisor.core.events import BaseEvent
from tests.private_engine import EngineConfig, PrivateEngine

pytestmark = pytest.mark.timeout(300)

#: Every engine call's deadline in this test.
DEADLINE_S = 3.0
#: Room over a call's deadline for the start's work around the call.
SLACK_S = 0.5
#: How long the engine stays stopped.
FROZEN_S = 20.0
#: Starts made as the engine stops (before the watchdog can know), then once it is wedged.
BURST = 6
LINES = 250
COUNTER = f"i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.1; done"
EXPECTED = "".join(f"line{i}\n" for i in range(1, LINES + 1)).encode()


def terminal(events: list[BaseEvent], task_id: str) -> list[BaseEvent]:
    return [e for e in events if e.task_id == task_id and e.type in ("task.stopped", "task.failed")]


async def timed_start(session: object, loop: asyncio.AbstractEventLoop) -> tuple[str, float]:
    """Start a task on the stopped engine: how it failed, and how long that took (from the
    call to the refusal, or to the task's task.failed)."""
    began = loop.time()
    try:
        task = await session.start(TaskSpec(command="echo never", policy="fast"))  # type: ignore[attr-defined]
    except EngineUnresponsive:
        return "refused engine_unresponsive", loop.time() - began
    final = await session.wait(task.task_id, timeout_s=6 * DEADLINE_S)  # type: ignore[attr-defined]
    return f"{final.status} {final.error_code}", loop.time() - began


async def until_state(sup: Supervisor, state: str, timeout_s: float) -> float:
    """Wait for the watchdog to say ``state``; how long it took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with asyncio.timeout(timeout_s):
        while sup.engine_state != state:
            await asyncio.sleep(0.05)
    return loop.time() - began


@pytest.mark.parametrize("private_engine", [EngineConfig(live_restore=True)], indirect=True)
async def test_a_stopped_engine_fails_starts_fast_and_loses_no_output(
    private_engine: PrivateEngine,
    tmp_path: Path,
    policies_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = MemorySink()
    loop = asyncio.get_running_loop()
    async with Supervisor(
        state_dir=tmp_path / "state",
        policies_dir=policies_dir,
        docker_host=private_engine.docker_host,
        engine_timeout_s=DEADLINE_S,
    ) as sup:
        session = await sup.open_session("wedge", sinks=[sink])
        ticker = await session.start(TaskSpec(command=COUNTER, policy="fast"))
        await session.wait_for(ticker.task_id, "^line20$", timeout_s=60)
        assert sup.engine_state == "up"
        private_engine.freeze()
        frozen_at = loop.time()
        try:
            first = await asyncio.gather(*(timed_start(session, loop) for _ in range(BURST)))
            detected = await until_state(sup, "wedged", 3 * DEADLINE_S)
            snap = sup.metrics()
            assert (snap.engine_state, snap.engine_up) == ("wedged", False)
            then = await asyncio.gather(*(timed_start(session, loop) for _ in range(BURST)))
            # The ticker is still running as far as the supervisor knows.
            assert (await session.get(ticker.task_id)).status == "running"
            # The rest of the freeze: the scenario's length, not a wait for a condition.
            await asyncio.sleep(max(0.0, frozen_at + FROZEN_S - loop.time()))
        finally:
            private_engine.thaw()
        back = await until_state(sup, "up", 60)
        final = await session.wait(ticker.task_id, timeout_s=120)
        accepted = await session.start(TaskSpec(command="echo back", policy="fast"))
        after = await session.wait(accepted.task_id, timeout_s=60)
        await session.end()
    with capsys.disabled():
        print(
            f"\nwedge: first burst {sorted((how, round(s, 2)) for how, s in first)}"
            f"\nwedge: watchdog said wedged {detected:.2f} s after the first burst ended"
            f"\nwedge: second burst {sorted((how, round(s, 3)) for how, s in then)}"
            f"\nwedge: up again {back:.2f} s after SIGCONT"
        )
    for how, took in first:
        # Refused at the call (a ping taken and never answered is a wedge, not an outage),
        # or accepted and failed by a call's deadline: within the deadline either way, never
        # the freeze's 20 s.
        assert how in ("refused engine_unresponsive", "failed engine_unresponsive"), first
        # A call's deadline ends it at DEADLINE_S; the start's own work around the call
        # comes on top (3.006 s was seen for a create cut off at 3 s).
        assert took < DEADLINE_S + SLACK_S, first
    for how, took in then:
        assert how == "refused engine_unresponsive", then
        assert took < 0.5, then
    assert (final.status, final.exit_code) == ("completed", 0), final
    assert Path(final.output_path).read_bytes() == EXPECTED
    assert len(terminal(sink.events, ticker.task_id)) == 1
    assert (after.status, after.exit_code) == ("completed", 0)
    assert Path(after.output_path).read_bytes() == b"back\n"
    for event in sink.events:
        if event.type == "task.failed":
            assert len(terminal(sink.events, event.task_id)) == 1
