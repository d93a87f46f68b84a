"""The Swarm backend on the real 3-node lab (scripts/swarm-lab.sh): a hundred tasks at once
spread over the nodes with exact output and one terminal event each, untrusted tasks on the
gVisor node only (and failing closed when it is drained), a drained node's and a cut node's
tasks ended as lost naming the node, and nothing of ours left on any node afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from supervisor import MemorySink, Supervisor, TaskSpec
from supervisor.core.errors import PlacementUnavailable
from supervisor.core.events import BaseEvent
from supervisor.engine.swarm.backend import SwarmBackend
from tests.integration.test_swarm_lab import (  # noqa: F401 - the lab fixture
    Lab,
    engine,
    lab,
    lab_nodes,
    node_state,
    run_lab,
)

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]

#: Test policies: runc tasks anywhere, and runc tasks pinned to w1 (the node cut below).
SWARM_POLICIES = {
    "swarm": """
description = "tests: minimal image on any runc node of the lab"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 1.0
[session]
max_running_tasks = 128
""",
    "gvisor": """
description = "tests: minimal image on the lab's gVisor node"
image = "sandvisor/minimal:latest"
runtime = "runsc"
working_dir = "/tmp"
placement = ["node.labels.sandbox==gvisor"]
[timeouts]
grace_s = 1.0
[session]
max_running_tasks = 128
""",
    "onw1": """
description = "tests: minimal image on the lab's w1"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
placement = ["node.hostname==sandvisor-lab-w1"]
[timeouts]
grace_s = 1.0
""",
}


@pytest.fixture
def swarm_policies(policies_dir: Path) -> Path:
    for name, text in SWARM_POLICIES.items():
        (policies_dir / f"{name}.toml").write_text(text)
    return policies_dir


@pytest.fixture
async def swarm(
    lab: Lab,  # noqa: F811 - the fixture imported above
    state_dir: Path,
    swarm_policies: Path,
) -> AsyncIterator[Supervisor]:
    backend = SwarmBackend(lab.docker_host)
    async with Supervisor(
        state_dir=state_dir, policies_dir=swarm_policies, backend=backend
    ) as supervisor:
        yield supervisor
    leftovers(lab, supervisor.instance_id)


def leftovers(where: Lab, instance_id: str) -> None:
    """Nothing of this supervisor on any node: services, containers (also those Engine 20.10
    leaves behind when a job service is removed), networks."""
    label = f"io.sandvisor.owner={instance_id}"
    manager = docker.APIClient(base_url=where.docker_host, version="auto", timeout=30)
    try:
        assert manager.services(filters={"label": label}) == []
    finally:
        manager.close()
    for name, url in where.engines.items():
        with engine(url) as node:
            rows = node.containers(all=True, filters={"label": label})
            assert rows == [], (name, [r["Names"] for r in rows])
            nets = node.networks(filters={"label": label})
            assert nets == [], (name, [n["Name"] for n in nets])


def terminal(events: list[BaseEvent], task_id: str) -> list[BaseEvent]:
    return [e for e in events if e.task_id == task_id and e.type in ("task.stopped", "task.failed")]


def node_of(sup: Supervisor, task_id: str) -> str:
    """The hostname of the node Swarm placed a task on (its service is ``sandvisor-<task id>``)."""
    backend = sup.backend
    assert isinstance(backend, SwarmBackend)
    view = backend.nodes.get(backend.placed[f"sandvisor-{task_id}"])
    assert view is not None
    return view.hostname


def wait_ready(manager: Any, node_id: str) -> None:
    """The next test needs the node back: wait until the manager says Ready."""
    deadline = time.monotonic() + 90
    while node_state(manager, node_id) != "ready":
        assert time.monotonic() < deadline, f"node {node_id} not Ready again"
        time.sleep(0.5)


async def wait_for_output(session: Any, task_id: str, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in await session.tail(task_id, chars=4000):
        assert time.monotonic() < deadline, f"{task_id}: no {needle!r} within {timeout_s} s"
        await asyncio.sleep(0.1)


async def test_hundred_tasks_at_once_spread_exact_one_terminal_event_each(
    swarm: Supervisor,
) -> None:
    sink = MemorySink()
    session = await swarm.open_session("burst", sinks=[sink])
    lines = 300
    specs = [
        TaskSpec(
            command=f"i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo t{n}-$i; done",
            policy="gvisor" if n % 10 == 0 else "swarm",
            stdin="closed",
        )
        for n in range(100)
    ]
    began = time.monotonic()
    infos = await asyncio.gather(*(session.start(s) for s in specs))
    done = await asyncio.gather(*(session.wait(i.task_id, timeout_s=300) for i in infos))
    hosts = {info.task_id: node_of(swarm, info.task_id) for info in done}
    took = time.monotonic() - began
    for n, info in enumerate(done):
        assert info.status == "completed", (n, info.status, info.reason, info.error)
        expected = "".join(f"t{n}-{i}\n" for i in range(1, lines + 1)).encode()
        assert Path(info.output_path).read_bytes() == expected, n
        # runsc tasks land on the gVisor node only; runc tasks never do.
        on_gvisor = hosts[info.task_id] == "sandvisor-lab-w2"
        assert on_gvisor == (n % 10 == 0), (n, hosts[info.task_id])
    spread = {h: list(hosts.values()).count(h) for h in set(hosts.values())}
    print(f"\n100 tasks on the lab: {took:.1f} s, by node {spread}")
    assert set(spread) == {"sandvisor-lab-manager", "sandvisor-lab-w1", "sandvisor-lab-w2"}
    await session.end()
    for info in done:
        assert len(terminal(sink.events, info.task_id)) == 1, info.task_id


async def test_untrusted_on_gvisor_only_drain_stops_it_and_fails_closed(
    swarm: Supervisor,
    lab: Lab,  # noqa: F811
) -> None:
    sink = MemorySink()
    session = await swarm.open_session("gvisor", sinks=[sink])
    info = await session.start(
        TaskSpec(command="dmesg | head -1; echo ready; sleep 600", policy="untrusted")
    )
    await wait_for_output(session, info.task_id, "ready", 60)
    assert node_of(swarm, info.task_id) == "sandvisor-lab-w2"
    assert "gVisor" in await session.tail(info.task_id, chars=4000)  # gVisor's own dmesg
    assert run_lab("drain", "w2").returncode == 0
    try:
        drained_at = time.monotonic()
        ended = await session.wait(info.task_id, timeout_s=60)
        took = time.monotonic() - drained_at
        assert ended.status == "lost" or ended.reason == "lost", ended
        assert "sandvisor-lab-w2" in (ended.error or "") and "drained" in (ended.error or ""), ended
        # Its container is stopped on w2, not left running.
        with engine(lab.engines["w2"]) as w2:
            running = w2.containers(filters={"label": f"io.sandvisor.task={info.task_id}"})
        assert running == []
        print(f"\ndrained w2: task ended lost after {took:.1f} s")
        # No gVisor node left: an untrusted task fails at once, never runs elsewhere.
        refused = await session.start(TaskSpec(command="echo never", policy="untrusted"))
        refused = await session.wait(refused.task_id, timeout_s=30)
        assert refused.status == "failed" and refused.reason is None, refused
        assert refused.error_code == PlacementUnavailable.code, refused
        assert "sandvisor-lab-w2" in (refused.error or "") and "drain" in (refused.error or "")
        assert Path(refused.output_path).read_bytes() == b""
    finally:
        assert run_lab("activate", "w2").returncode == 0
    await session.end()
    assert len(terminal(sink.events, info.task_id)) == 1


async def test_cut_worker_ends_its_task_lost_within_30s(
    swarm: Supervisor,
    lab: Lab,  # noqa: F811
) -> None:
    manager = docker.DockerClient(base_url=lab.docker_host, version="auto", timeout=30)
    w1 = lab_nodes(manager)["w1"].id
    sink = MemorySink()
    session = await swarm.open_session("cut", sinks=[sink])
    info = await session.start(TaskSpec(command="seq 1 5; sleep 600", policy="onw1"))
    await wait_for_output(session, info.task_id, "5\n", 60)
    assert node_of(swarm, info.task_id) == "sandvisor-lab-w1"
    assert run_lab("cut", "w1").returncode == 0
    try:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + 90
        while await loop.run_in_executor(None, node_state, manager, w1) != "down":
            assert time.monotonic() < deadline, "w1 never went down"
            await asyncio.sleep(0.5)
        down_at = time.monotonic()
        ended = await session.wait(info.task_id, timeout_s=30)
        took = time.monotonic() - down_at
        assert ended.reason == "lost", ended
        assert "sandvisor-lab-w1" in (ended.error or ""), ended
        assert Path(ended.output_path).read_bytes() == b"1\n2\n3\n4\n5\n"
        print(f"\ncut w1: task lost {took:.1f} s after the node was Down")
    finally:
        assert run_lab("heal", "w1").returncode == 0
        wait_ready(manager, w1)
        manager.close()
    await session.end()
    assert len(terminal(sink.events, info.task_id)) == 1


LINES = 1000
SLOW = f"i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.01; done"
EXPECTED = "".join(f"line{i}\n" for i in range(1, LINES + 1)).encode()


def test_sigkill_during_output_on_two_nodes_exact_after_restart(
    lab: Lab,  # noqa: F811
    tmp_path: Path,
    swarm_policies: Path,
) -> None:
    from tests.e2e.conftest import start_daemon  # noqa: PLC0415 - the e2e daemon helper
    from tests.e2e.test_crash import wait_final  # noqa: PLC0415

    state = tmp_path / "daemon"
    backend = ("--backend", "swarm", "--docker-host", lab.docker_host)
    first = start_daemon(state, swarm_policies, *backend, stop_tasks_on_exit=False)
    tids: dict[str, str] = {}
    try:
        with first.client() as c:
            c.post("/sessions", json={"session_id": "s"}).raise_for_status()
            for policy in ("onw1", "gvisor"):
                r = c.post("/sessions/s/tasks", json={"command": SLOW, "policy": policy})
                r.raise_for_status()
                tids[policy] = r.json()["task_id"]
            deadline = time.monotonic() + 120
            # Killed while both commands are printing, on two nodes.
            while not all(
                (t := c.get(f"/sessions/s/tasks/{tid}").json())["output_bytes"] > 0
                and t["status"] == "running"
                for tid in tids.values()
            ):
                assert time.monotonic() < deadline, "the tasks never began printing"
                time.sleep(0.05)
        with docker.APIClient(base_url=lab.docker_host, version="auto", timeout=30) as m:
            for tid in tids.values():  # they run as Swarm services, not on the host engine
                assert len(m.services(filters={"label": f"io.sandvisor.task={tid}"})) == 1
    finally:
        first.proc.kill()
        first.proc.wait(timeout=30)
    second = start_daemon(state, swarm_policies, *backend, stop_tasks_on_exit=True)
    try:
        with second.client() as c:
            for policy, tid in tids.items():
                task = wait_final(c, "s", tid)
                assert task["status"] == "completed", (policy, task)
                assert Path(task["output_path"]).read_bytes() == EXPECTED, policy
            events = c.get("/sessions/s/events", params={"limit": 10000}).json()["events"]
            for tid in tids.values():
                ends = [
                    e
                    for e in events
                    if e.get("task_id") == tid and e["type"] in ("task.stopped", "task.failed")
                ]
                assert len(ends) == 1, ends
            c.delete("/sessions/s").raise_for_status()
    finally:
        assert second.stop() == 0
    manager = docker.APIClient(base_url=lab.docker_host, version="auto", timeout=30)
    try:
        for tid in tids.values():
            assert manager.services(filters={"label": f"io.sandvisor.task={tid}"}) == []
    finally:
        manager.close()
    for name, url in lab.engines.items():
        with engine(url) as node:
            for tid in tids.values():
                rows = node.containers(all=True, filters={"label": f"io.sandvisor.task={tid}"})
                assert rows == [], (name, tid)


async def test_node_engine_restart_ends_its_task_lost_with_output_so_far(
    swarm: Supervisor,
    lab: Lab,  # noqa: F811
) -> None:
    sink = MemorySink()
    session = await swarm.open_session("restart", sinks=[sink])
    info = await session.start(TaskSpec(command="seq 1 5; sleep 600", policy="onw1"))
    await wait_for_output(session, info.task_id, "5\n", 60)
    env = run_lab("env").stdout
    run_dir = dict(line.split("=", 1) for line in env.splitlines() if "=" in line).get(
        "SANDVISOR_LAB_RUN_DIR", "/run/sandvisor-swarm-lab"
    )
    pid = int(Path(run_dir, "n2", "dockerd.pid").read_text())  # w1's dockerd, the lab's own
    os.kill(pid, signal.SIGTERM)  # no live-restore in swarm mode: its containers die
    try:
        ended = await session.wait(info.task_id, timeout_s=90)
        assert ended.reason == "lost", ended
        assert "sandvisor-lab-w1" in (ended.error or ""), ended
        assert Path(ended.output_path).read_bytes() == b"1\n2\n3\n4\n5\n"
    finally:
        up = run_lab("up", timeout_s=300)
        assert up.returncode == 0, up.stderr
        with contextlib.closing(
            docker.DockerClient(base_url=lab.docker_host, version="auto", timeout=30)
        ) as manager:
            wait_ready(manager, lab_nodes(manager)["w1"].id)
    await session.end()
    assert len(terminal(sink.events, info.task_id)) == 1


async def test_doctor_reports_every_node_its_engine_runtime_and_labels(
    lab: Lab,  # noqa: F811
    tmp_path: Path,
    swarm_policies: Path,
) -> None:
    from supervisor.tooling.doctor import run_checks  # noqa: PLC0415

    backend = SwarmBackend(lab.docker_host)
    try:
        report = await run_checks(
            backend, state_dir=tmp_path / "state", policies_dir=swarm_policies, probe=False
        )
    finally:
        await backend.aclose()
    summary = report.get("swarm nodes")
    assert summary is not None and summary.status == "ok", summary
    runtimes = {"manager": "runc", "w1": "runc", "w2": "runsc"}
    for name, url in lab.engines.items():
        check = report.get(f"node sandvisor-lab-{name}")
        assert check is not None and check.status == "ok", check
        assert check.facts["engine"] == url and check.facts["answers"] is True
        assert check.facts["default_runtime"] == runtimes[name]
        assert (check.facts["labels"].get("sandbox") == "gvisor") == (name == "w2")
