"""swarm: ``session.start()`` of ``echo x`` -> first output byte through the Swarm backend
(the 3-node lab of scripts/swarm-lab.sh) against the same supervisor on the single host
engine, interleaved, as a ratio; and a burst of 100 starts at once across the lab's three
nodes (90 runc tasks on the two runc nodes, 10 runsc tasks on the gVisor node)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from pathlib import Path

from bench.common import Ctx, Progress, Result, first_output, row, say, wait_done
from supervisor import Supervisor, TaskSpec
from supervisor.engine.swarm.backend import SwarmBackend
from supervisor.runtime.session import Session

NAME = "swarm"
TITLE = "start -> first byte through Swarm vs one engine; 100 at once over 3 nodes"
COMMAND = "echo x"
LAB = Path(__file__).resolve().parent.parent / "scripts" / "swarm-lab.sh"
#: The gVisor share of the burst: every tenth task.
GVISOR_EVERY = 10
POLICY = """
description = "bench: busybox image on the {what}"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
{extra}
[timeouts]
grace_s = 1.0
[session]
max_running_tasks = 2000
"""


def _lab_up() -> tuple[str, bool]:
    """The lab's manager endpoint, bringing the lab up if needed; and whether it was up."""
    status = subprocess.run([str(LAB), "status"], capture_output=True, text=True, check=False)
    was_up = status.returncode == 0
    up = subprocess.run([str(LAB), "up"], capture_output=True, text=True, timeout=900, check=False)
    if up.returncode != 0:
        raise RuntimeError(f"swarm-lab up failed: {up.stderr[-2000:]}")
    return up.stdout.splitlines()[-1].split("=", 1)[1], was_up


async def _first_byte(session: Session, policy: str) -> float:
    t0 = time.perf_counter()
    info = await session.start(TaskSpec(command=COMMAND, policy=policy, stdin="closed"))
    if not await first_output(session, info.task_id, 120):
        raise RuntimeError(f"{info.task_id}: no output within 120 s")
    took = time.perf_counter() - t0
    await session.wait(info.task_id, timeout_s=120)
    return took


async def _burst(
    sup: Supervisor, session: Session, n: int
) -> tuple[list[float], int, Counter[str]]:
    t0 = time.perf_counter()

    async def one(i: int) -> tuple[str, float]:
        policy = "bench-gvisor" if i % GVISOR_EVERY == 0 else "bench-swarm"
        info = await session.start(TaskSpec(command=COMMAND, policy=policy, stdin="closed"))
        if not await first_output(session, info.task_id, 300):
            raise RuntimeError(f"{info.task_id}: no output within 300 s")
        return info.task_id, time.perf_counter() - t0

    results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    ids = [r[0] for r in results if isinstance(r, tuple)]
    errors = sum(1 for r in results if isinstance(r, BaseException))
    for r in results:
        if isinstance(r, BaseException):
            say(f"swarm burst: {r!r}")
    finals = await asyncio.gather(*(session.wait(t, timeout_s=300) for t in ids))
    errors += sum(1 for f in finals if f.exit_code != 0)
    await wait_done(session, ids, 300)
    backend = sup.backend
    assert isinstance(backend, SwarmBackend)
    nodes: Counter[str] = Counter()
    for task_id in ids:
        node = backend.nodes.get(backend.placed.get(f"sandvisor-{task_id}", ""))
        nodes[node.hostname if node is not None else "?"] += 1
    return [r[1] for r in results if isinstance(r, tuple)], errors, nodes


async def run(ctx: Ctx) -> Result:
    samples = 4 if ctx.quick else 20
    n = 10 if ctx.quick else 100
    rounds = 1 if ctx.quick else 2
    res = Result(NAME, TITLE)
    for name, what, extra in (
        ("bench-swarm", "runc nodes", ""),
        (
            "bench-gvisor",
            "gVisor nodes",
            'runtime = "runsc"\nplacement = ["node.labels.sandbox==gvisor"]',
        ),
    ):
        (ctx.policies_dir / f"{name}.toml").write_text(POLICY.format(what=what, extra=extra))
    manager, was_up = await asyncio.to_thread(_lab_up)
    res.config = {"samples": samples, "burst": n, "rounds": rounds, "manager": manager}
    swarm: list[float] = []
    single: list[float] = []
    bursts: list[float] = []
    lasts: list[float] = []
    errors = 0
    spread: Counter[str] = Counter()
    try:
        async with (
            ctx.supervisor(NAME, backend=SwarmBackend(manager)) as over,
            ctx.supervisor(f"{NAME}-single") as one,
        ):
            s_swarm = await over.open_session("bench-swarm")
            s_one = await one.open_session("bench-single")
            await _first_byte(s_swarm, "bench-swarm")  # network, facts: not measured
            await _first_byte(s_one, "bench-swarm")
            prog = Progress("swarm: start -> first byte (swarm, single)", samples)
            for _ in range(samples):
                swarm.append(await _first_byte(s_swarm, "bench-swarm") * 1000)
                single.append(await _first_byte(s_one, "bench-swarm") * 1000)
                prog.step()
            for _ in range(rounds):
                lat, err, nodes = await _burst(over, s_swarm, n)
                bursts += [v * 1000 for v in lat]
                lasts.append(max(lat, default=0))
                errors += err
                spread.update(nodes)
            await s_swarm.end()
            await s_one.end()
    finally:
        if not was_up:
            await asyncio.to_thread(
                subprocess.run, [str(LAB), "down"], capture_output=True, check=False
            )
    res.rows.append(
        row(
            "start -> first byte, one at a time",
            "ms",
            swarm,
            baseline="the same supervisor on the single host engine (cold)",
            base=single,
        )
    )
    res.rows.append(row(f"start -> first byte, {n} at once over 3 nodes", "ms", bursts))
    res.rows.append(row("whole burst (last first byte)", "s", lasts))
    res.rows.append(row("errors", "count", errors, target="0", passed=errors == 0))
    res.errors = {"swarm": errors}
    res.samples = {
        "swarm_ms": swarm,
        "single_ms": single,
        "burst_ms": bursts,
        "nodes": dict(spread),
    }
    res.notes.append(
        f"Burst placement over the rounds: {dict(spread)}. The lab is three dockerd in network "
        "namespaces of this one machine, so the nodes share its cores: the burst measures the "
        "backend's overhead and Swarm's scheduling, not three machines' capacity. A Swarm start "
        "is a service create, a placement by the manager, the node's agent creating and "
        "starting the container, and the supervisor finding it (GET /tasks) and following its "
        "log on the node's engine."
    )
    return res
