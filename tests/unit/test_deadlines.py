"""Every engine call has a deadline (engine/deadlines.py): past it the call fails with
EngineUnresponsive naming the call and the deadline; the watchdog sees it; ``wait`` and a
stream's reading are not bounded; the error keeps its meaning on the wire and in MCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from supervisor.core.engine_versions import DEADLOCK_NOTE, deadlock_prone
from supervisor.core.errors import EngineUnavailable, EngineUnresponsive
from supervisor.engine.deadlines import KINDS, Deadlines, deadlines_for
from supervisor.engine.fake import Exit, FakeEngine, Out, Script, WaitFor
from supervisor.interfaces.http_errors import from_wire, status_of
from supervisor.interfaces.mcp.texts import error_text
from tests.unit.test_fake_engine import request

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]

SHORT = 0.2


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    async with FakeEngine() as fake:
        yield fake


def test_every_kind_gets_the_timeout_and_a_pull_more() -> None:
    table = deadlines_for(5.0, start=1.0)
    assert set(table) == set(KINDS)
    assert table["start"] == 1.0
    assert table["create"] == table["remove"] == table["network"] == 5.0
    assert table["pull"] >= 600.0
    with pytest.raises(ValueError, match="unknown engine call kind 'wait'"):
        deadlines_for(5.0, wait=1.0)


async def test_the_error_names_the_call_and_its_deadline(engine: FakeEngine) -> None:
    bounded = Deadlines(engine.backend(), deadlines_for(30.0, start=SHORT))
    cid = await bounded.create(request("true"))
    release = engine.hang_next("start")
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(EngineUnresponsive) as got:
        await bounded.start(cid)
    took = loop.time() - began
    assert SHORT <= took < SHORT + 1.0
    assert isinstance(got.value, EngineUnavailable)  # callers riding out outages catch it
    assert got.value.retryable
    assert (got.value.call, got.value.deadline_s) == (f"start {cid[:12]}", SHORT)
    assert f"start {cid[:12]} within its 0.2 s deadline" in str(got.value)
    # The watchdog's view: a timeout, recent, nothing of its kind done since.
    assert bounded.health().timed_out == f"start {cid[:12]}"
    release.set()
    await bounded.start(cid)
    assert bounded.health().timed_out is None


async def test_calls_in_flight_are_seen_oldest_first(engine: FakeEngine) -> None:
    bounded = Deadlines(engine.backend(), deadlines_for(30.0))
    release = engine.hang_next("list_labeled")
    listing = asyncio.create_task(bounded.list_labeled("io.sandvisor.canary"))
    while bounded.health().oldest is None:
        await asyncio.sleep(0)
    oldest = bounded.health().oldest
    assert oldest is not None
    assert (oldest.call, oldest.kind, oldest.deadline_s) == (
        "list io.sandvisor.canary",
        "list",
        30.0,
    )
    assert bounded.health().overdue is None
    release.set()
    assert await listing == []
    assert bounded.health().oldest is None


async def test_wait_has_no_deadline_and_logs_are_bounded_per_block(engine: FakeEngine) -> None:
    go = asyncio.Event()
    engine.script("slow", Script(Out("one\n"), WaitFor(go), Exit(3)))
    bounded = Deadlines(engine.backend(), deadlines_for(SHORT))
    cid = await bounded.create(request("slow"))
    await bounded.start(cid)
    waiting = asyncio.create_task(bounded.wait(cid))
    # Longer than every deadline: the wait is still there, not failed.
    done, _ = await asyncio.wait([waiting], timeout=3 * SHORT)
    assert not done
    blocks = [b async for b in bounded.logs(cid)]
    assert b"".join(bytes(p) for segments in blocks for _, p in segments) == b"one\n"
    go.set()
    state = await waiting
    assert state.exit_code == 3


def test_on_the_wire_and_in_mcp_it_stays_retryable() -> None:
    exc = EngineUnresponsive("create sandvisor-bg-1", 30.0)
    back = from_wire(exc.to_wire(), status_of(exc))
    assert isinstance(back, EngineUnresponsive)
    assert (back.call, back.deadline_s, back.retryable, status_of(back)) == (
        "create sandvisor-bg-1",
        30.0,
        True,
        503,
    )
    lines = error_text(back).splitlines()
    assert lines[0] == f"Error (engine_unresponsive): {exc}"
    assert lines[1:] == ["Retryable: nothing was started; call this tool again in a few seconds."]


@pytest.mark.parametrize(
    ("version", "prone"),
    [
        ("20.10.24+dfsg1", True),
        ("20.10.5", True),
        ("19.03.15", True),
        ("23.0.1", False),
        ("26.1.5+dfsg1", False),
        ("fake", False),
    ],
)
def test_doctor_names_the_engines_with_the_known_deadlocks(version: str, prone: bool) -> None:
    assert deadlock_prone(version) is prone
    assert "moby #46661, #44682" in DEADLOCK_NOTE
