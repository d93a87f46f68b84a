"""Warm pool: single-use containers started ahead, waiting for their one command."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import docker
import pytest

from supervisor import MemorySink, Supervisor, TaskSpec
from supervisor.core.events import TaskOutput

pytestmark = pytest.mark.timeout(120)


def pooled_ids(sup: Supervisor, *, taken: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    """Containers this supervisor made for its warm pools (the shared ones carry no
    session: a pooled container is bound to a session by its task's record), minus
    ``taken`` (containers that became tasks)."""
    rows = docker.APIClient(version="auto").containers(
        all=True,
        filters={"label": [f"io.sandvisor.owner={sup.instance_id}", "io.sandvisor.kind=pooled"]},
    )
    return {r["Id"] for r in rows} - taken


async def until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_pooled_tasks_behave_like_cold_ones(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("pool", sinks=[sink])
    assert await session.prewarm("warm") == 2
    ready = pooled_ids(sup)
    assert len(ready) == 2
    # Multi-line command, exact output, exit code.
    a = await session.start(TaskSpec(command="echo one\nprintf 'two'\nexit 3", policy="warm"))
    fa = await session.wait(a.task_id, timeout_s=30)
    assert (fa.status, fa.exit_code) == ("failed", 3)
    with open(fa.output_path, "rb") as fh:
        assert fh.read() == b"one\ntwo"
    # stdin stays the task's: the command line was consumed, input reaches the command.
    b = await session.start(TaskSpec(command="read x; echo got:$x", policy="warm"))
    await session.send_input(b.task_id, "hello\n")
    assert (await session.wait_for(b.task_id, "^got:", timeout_s=30)).line == "got:hello"
    # stdin=closed gives EOF at once.
    c = await session.start(TaskSpec(command="cat; echo eof", policy="warm", stdin="closed"))
    assert (await session.wait(c.task_id, timeout_s=30)).exit_code == 0
    with open(c.output_path, "rb") as fh:
        assert fh.read() == b"eof\n"
    # Monitors work from a pooled container too.
    d = await session.start(TaskSpec(command="echo l1; echo l2", policy="warm", kind="monitor"))
    await session.wait(d.task_id, timeout_s=30)
    await sink.wait_for(lambda e: e.task_id == d.task_id and e.type == "task.stopped")
    lines = [e.text for e in sink.events if isinstance(e, TaskOutput) and e.task_id == d.task_id]
    assert "\n".join(lines) == "l1\nl2"
    task_containers = {(await session.get(x.task_id)).task_id for x in (a, b, c, d)}
    await session.end()
    # The tasks' containers went with the session; the shared pool waits for the next one.
    client = docker.APIClient(version="auto")
    for task_id in task_containers:
        assert not client.containers(all=True, filters={"label": f"io.sandvisor.task={task_id}"})
    await until(lambda: len(pooled_ids(sup)) == 2)  # refilled after the last take
    await sup.aclose()
    assert pooled_ids(sup) == set()


async def test_pooled_container_is_single_use_and_hardened_the_same(sup: Supervisor) -> None:
    session = await sup.open_session("pool-hard")
    await session.prewarm("warm")
    client = docker.APIClient(version="auto")
    before = pooled_ids(sup)
    info = await session.start(TaskSpec(command="sleep 30", policy="warm"))
    await until(lambda: session.task_runner(info.task_id).container_id is not None)
    cid = session.task_runner(info.task_id).container_id
    assert cid in before  # it took a warm one ...
    cold = await session.start(
        TaskSpec(command="sleep 30", policy="warm", limits={"output_cap_bytes": 4096})
    )
    await until(lambda: session.task_runner(cold.task_id).container_id is not None)
    cold_cid = session.task_runner(cold.task_id).container_id
    assert cold_cid not in before  # ... a task with its own limits goes the cold way
    warm_hc = client.inspect_container(cid)["HostConfig"]
    cold_hc = client.inspect_container(cold_cid)["HostConfig"]
    for key in (
        "NetworkMode",
        "CapDrop",
        "SecurityOpt",
        "ReadonlyRootfs",
        "Tmpfs",
        "Memory",
        "MemorySwap",
        "NanoCpus",
        "PidsLimit",
        "Ulimits",
        "Init",
        "Runtime",
        "Privileged",
    ):
        assert warm_hc[key] == cold_hc[key], key
    await session.stop(info.task_id)
    # Single use: the container is gone with its task, never handed to another.
    await until(lambda: not client.containers(all=True, filters={"id": cid}))
    # The pool refills to its size (the policy's warm_pool = 2).
    await until(lambda: len(pooled_ids(sup)) == 2)
    # Reconciliation never reaps warm containers (they belong to no session yet).
    await sup.sweep()
    for row in docker.APIClient(version="auto").containers(
        all=True, filters={"label": f"io.sandvisor.owner={sup.instance_id}"}
    ):
        await sup.adopt_or_reap(row["Id"], row["Labels"])
    assert len(pooled_ids(sup)) == 2
    await session.end()
