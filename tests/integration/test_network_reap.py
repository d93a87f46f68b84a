"""Session networks are never orphaned, for real (issue 29, point 3), on a private dockerd
of the test's own: a network left by an owner gone for good goes at the supervisor's
start; a session ending while dockerd is stopped (SIGSTOP: wedged) ends within the
deadline, and its network goes once dockerd answers again (restarted). Unlabelled
networks and those of a live owner stay."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from supervisor import Supervisor, TaskSpec
from supervisor.core.labels import LABEL_TASK, container_labels
from supervisor.runtime.ownership import lock_state_dir, owner_labels
from tests.private_engine import EngineConfig, PrivateEngine

pytestmark = pytest.mark.timeout(300)

#: Every engine call's deadline in this test.
DEADLINE_S = 3.0
#: Room over the deadline for the session's other work on a loaded machine.
SLACK_S = 5.0

NETTED = """
description = "tests: minimal image on the session's internal network"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
network = "session"
[timeouts]
grace_s = 1.0
"""


def network_names(client: object) -> set[str]:
    return {n["Name"] for n in client.networks()}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "private_engine", [EngineConfig(images=("sandvisor/minimal:latest",))], indirect=True
)
async def test_left_networks_are_removed_and_unlabelled_or_live_ones_stay(
    private_engine: PrivateEngine, tmp_path: Path, policies_dir: Path
) -> None:
    (policies_dir / "netted.toml").write_text(NETTED)
    client = private_engine.client()
    dead = owner_labels("dead0000dead0000", tmp_path / "gone")  # its state dir is no more
    live_fd = lock_state_dir(tmp_path / "live")  # held: a live owner
    live = owner_labels("11ve11ve11ve11ve", tmp_path / "live")
    for name, labels in [
        ("sandvisor-x-dead0000", container_labels(dead, session_id="x")),
        ("sandvisor-y-11ve11ve", container_labels(live, session_id="y")),
        ("not-ours", {}),
    ]:
        client.create_network(name, driver="bridge", internal=True, labels=labels)
    try:
        async with Supervisor(
            state_dir=tmp_path / "state",
            policies_dir=policies_dir,
            docker_host=private_engine.docker_host,
            engine_timeout_s=DEADLINE_S,
        ) as sup:
            # The start's first round: the dead owner's network went, nothing else did.
            assert network_names(client) >= {"sandvisor-y-11ve11ve", "not-ours"}
            assert "sandvisor-x-dead0000" not in network_names(client)

            session = await sup.open_session("left")
            task = await session.start(TaskSpec(command="echo hi", policy="netted"))
            assert (await session.wait(task.task_id, timeout_s=60)).exit_code == 0
            network = session.network_name("session")
            assert network in network_names(client)
            label = f"{LABEL_TASK}={task.task_id}"
            async with asyncio.timeout(30):
                while client.containers(all=True, filters={"label": label}):
                    await asyncio.sleep(0.1)

            # Wedged as the session ends; then restarted (what one does with a deadlocked
            # dockerd), so the removal it held is never done. (A SIGSTOPped dockerd only
            # thawed would still do it: unlike a deadlock, it then answers what it held.)
            loop = asyncio.get_running_loop()
            private_engine.freeze()
            try:
                began = loop.time()
                await session.end()
                took = loop.time() - began
            finally:
                private_engine.kill()
                private_engine.thaw()
            assert DEADLINE_S <= took < DEADLINE_S + SLACK_S, took
            assert sup.sessions() == []
            private_engine.start()
            assert network in network_names(client)  # what the end could not remove

            async with asyncio.timeout(60):
                while network in network_names(client):
                    await sup.reconciler.reap_networks()
                    await asyncio.sleep(0.2)
            assert network_names(client) >= {"sandvisor-y-11ve11ve", "not-ours"}
    finally:
        os.close(live_fd)
        client.close()
