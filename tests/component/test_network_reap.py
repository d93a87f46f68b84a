"""A session's network is never orphaned (issue 29, point 3): a session that ends while the
engine is wedged, or while a task it could not stop is still attached, ends within the
deadline and leaves its network behind; the reconciler removes that network once the
engine lets it. It also removes networks of owners gone for good, never unlabelled ones
or those of a live (or maybe restarting) owner, nor those of a session open here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from supervisor import Session, Supervisor
from supervisor.core.labels import LABEL_OWNER, LABEL_SESSION, container_labels
from supervisor.engine.fake import Exit, FakeEngine, Out, Script, UntilKilled
from supervisor.runtime.ownership import LOCK_NAME, owner_labels
from tests.component.conftest import Runtime, bounded_supervisor, container, reconciling

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]

#: Every engine call's deadline here: small, so a wedge costs the test little.
DEADLINE = 0.3
#: Room over the deadline for the work around the call on a loaded 2-core machine.
SLACK = 1.0
#: How long a session's end waits for its tasks beyond their grace.
END_TIMEOUT = 0.5


@pytest.fixture
async def bounded(
    engine: FakeEngine, tmp_path: Path, fake_policies: Path
) -> AsyncIterator[Supervisor]:
    async with bounded_supervisor(
        engine, tmp_path / "state", fake_policies, DEADLINE, end_timeout_s=END_TIMEOUT
    ) as sup:
        yield sup


async def gone(engine: FakeEngine, network: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        await engine.changes.until(lambda: network not in engine.networks)


async def until_up(sup: Supervisor) -> None:
    """Until the watchdog says the engine is up again (it looks every second)."""
    async with asyncio.timeout(10):
        while not sup.engine_ok:
            await asyncio.sleep(0.05)


def reconcile_records(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "supervisor.reconcile" and isinstance(r.msg, dict) and r.msg["event"] == event
    ]


@pytest.mark.parametrize("kind", ["session", "bridge"])
async def test_a_session_ended_while_network_removal_is_wedged_loses_its_network_later(
    engine: FakeEngine, bounded: Supervisor, kind: str
) -> None:
    engine.script("quick", Script(Out("hi\n"), Exit(0)))
    ses = await bounded.open_session("s1")
    task = await ses.start({"command": "quick", "policy": f"net-{kind}"})
    assert (await ses.wait(task.task_id, timeout_s=10)).exit_code == 0
    network = ses.network_name(kind)
    assert network in engine.networks
    c = container(engine, task.task_id)
    await engine.changes.until(lambda: c.removed)

    release = engine.wedge("remove_network")
    loop = asyncio.get_running_loop()
    began = loop.time()
    await ses.end()
    assert loop.time() - began < DEADLINE + SLACK
    assert bounded.sessions() == []
    assert network in engine.networks  # what the end could not remove

    # While the engine stays wedged, a round costs one deadline and keeps it for later.
    began = loop.time()
    assert await bounded.reconciler.reap_networks() == 0
    assert loop.time() - began < DEADLINE + SLACK
    assert network in engine.networks

    release.set()
    await until_up(bounded)
    async with reconciling(bounded):
        await gone(engine, network)


async def test_a_network_still_in_use_waits_for_its_container_without_a_warning_storm(
    engine: FakeEngine, bounded: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="supervisor.reconcile")
    engine.script("hold", Script(Out("up\n"), UntilKilled()))
    ses: Session = await bounded.open_session("s1")
    task = await ses.start({"command": "hold", "policy": "net-session"})
    await ses.wait_for(task.task_id, "up", timeout_s=5)
    network = ses.network_name("session")
    c = container(engine, task.task_id)

    # The container can be neither stopped nor removed: the session ends without it, and
    # its network is still in use, so the end cannot remove the network either.
    release = engine.wedge("kill", "remove")
    loop = asyncio.get_running_loop()
    began = loop.time()
    await ses.end()
    assert loop.time() - began < 0.2 + END_TIMEOUT + 2 * (DEADLINE + SLACK)
    assert c.running
    assert network in engine.networks

    # Rounds meanwhile: the removal is refused (active endpoints), said once at info.
    for _ in range(3):
        assert await bounded.reconciler.reap_networks() == 0
    later = reconcile_records(caplog, "network_reap_later")
    assert [r.levelno for r in later] == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert "active endpoints" in later[0].msg["error"]  # type: ignore[index]

    # The engine answers again: the stopper reaps the container, then the network goes.
    release.set()
    async with reconciling(bounded):
        await engine.changes.until(lambda: c.removed)
        await gone(engine, network)
    assert not [
        r
        for r in caplog.records
        if r.name == "supervisor.reconcile" and r.levelno >= logging.WARNING
    ]
    assert len(reconcile_records(caplog, "reaped_network")) == 1


async def test_only_networks_of_closed_sessions_and_gone_owners_are_removed(
    engine: FakeEngine, runtime: Runtime, tmp_path: Path
) -> None:
    backend = engine.backend()
    # Left before this supervisor starts: an owner gone for good (no lock file any more),
    # one maybe restarting (its lock not held, touched just now), nobody's.
    dead = owner_labels("dead0000dead0000", tmp_path / "dead")
    await backend.ensure_network("of-the-dead", container_labels(dead, session_id="x"))
    restarting_dir = tmp_path / "restarting"
    restarting_dir.mkdir()
    (restarting_dir / LOCK_NAME).touch()
    restarting = owner_labels("b0000000b0000000", restarting_dir)
    await backend.ensure_network("restarting", container_labels(restarting, session_id="x"))
    await backend.ensure_network("unlabelled", {})
    await backend.ensure_network("someone-elses", {"io.sandvisor.kind": "x"})

    sup = await runtime.supervisor()
    # The start's first round: the dead owner's network went at once.
    assert "of-the-dead" not in engine.networks

    # A live other owner: a second supervisor on its own state dir.
    other = Supervisor(
        state_dir=tmp_path / "other",
        policies_dir=runtime.policies_dir,
        backend=engine.backend(),
    )
    await other.start()
    try:
        await backend.ensure_network("live-other", other.container_labels(session_id="y"))
        await sup.open_session("open")
        await backend.ensure_network("ours-open", sup.container_labels(session_id="open"))
        await backend.ensure_network("ours-closed", sup.container_labels(session_id="closed"))
        await backend.ensure_network("ours-no-session", sup.container_labels())
        await backend.ensure_network("of-the-dead-2", container_labels(dead, session_id="x"))

        # Without the sweep (most rounds): only our own closed session's.
        assert await sup.reconciler.reap_networks(others=False) == 1
        assert "ours-closed" not in engine.networks
        assert "of-the-dead-2" in engine.networks
        assert await sup.reconciler.reap_networks() == 1
        assert await sup.reconciler.reap_networks() == 0
    finally:
        await other.aclose()
    assert set(engine.networks) == {
        "restarting",
        "unlabelled",
        "someone-elses",
        "live-other",
        "ours-open",
        "ours-no-session",
    }
    owners = {n: labels.get(LABEL_OWNER) for n, labels in engine.networks.items()}
    assert owners["ours-open"] == sup.instance_id
    assert engine.networks["ours-open"][LABEL_SESSION] == "open"


async def test_a_restarted_supervisor_keeps_its_restored_sessions_networks(
    engine: FakeEngine, runtime: Runtime, fake_policies: Path
) -> None:
    engine.script("hold", Script(Out("up\n"), UntilKilled()))
    sup = await runtime.supervisor()
    ses = await sup.open_session("s1")
    task = await ses.start({"command": "hold", "policy": "net-session"})
    await ses.wait_for(task.task_id, "up", timeout_s=5)
    network = ses.network_name("session")

    sup = await runtime.restart(sup)
    # The start's round ran with the session restored: its network stays.
    assert network in engine.networks
    assert await sup.reconciler.reap_networks() == 0
    assert network in engine.networks

    # Its end (the restored session never made the network in this run) leaves it to the
    # reconciler, which removes it now that the session is closed.
    await sup.session("s1").end()
    assert container(engine, task.task_id).removed
    await sup.reconciler.reap_networks(others=False)
    assert network not in engine.networks
