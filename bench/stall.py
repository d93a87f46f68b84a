"""stall: detection latency over the stall corpus of tests/integration/test_stall_corpus.py
(default policy, sandvisor/debian): ``task.stalled`` time minus when the command began waiting,
minus ``stall_after_s``; and no false alarm on the commands that do not wait."""

from __future__ import annotations

import asyncio
import sys
import time

from bench.common import REPO, Ctx, Progress, Result, row, say
from supervisor import MemorySink, Supervisor, TaskSpec
from supervisor.core.events import TaskStalled

NAME = "stall"
TITLE = "stdin-stall detection latency (stall corpus, default policy)"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.integration.test_stall_corpus import (  # noqa: E402
    DOES_NOT_WAIT,
    STALL_AFTER_S,
    WAITS_FOR_INPUT,
)


async def _round(
    sup: Supervisor, tag: str, waits: list[tuple[str, float]], quiet: list[str]
) -> tuple[dict[str, float], list[str], list[str], int]:
    sink = MemorySink()
    session = await sup.open_session(f"bench-stall-{tag}", sinks=[sink])
    wait_ids: dict[str, tuple[str, float]] = {}
    quiet_ids: dict[str, str] = {}
    try:
        for cmd, delay in waits:
            info = await session.start(TaskSpec(command=cmd, description=cmd[:60]))
            wait_ids[info.task_id] = (cmd, delay)
        for cmd in quiet:
            limits = {"cpus": 0.25} if "while true; do :" in cmd else None
            info = await session.start(TaskSpec(command=cmd, limits=limits))
            quiet_ids[info.task_id] = cmd
        deadline = time.monotonic() + 60
        prog = Progress(f"stall: {tag} caught", len(wait_ids))
        caught_n = 0
        while time.monotonic() < deadline:
            caught = {e.task_id for e in sink.events if e.type == "task.stalled"}
            now_n = len(set(wait_ids) & caught)
            if now_n > caught_n:
                prog.step(now_n - caught_n)
                caught_n = now_n
            if set(wait_ids) <= caught:
                break
            await asyncio.sleep(0.1)
        # The commands that do not wait get a full stall window more to raise a false alarm.
        await asyncio.sleep(STALL_AFTER_S + 2)
    finally:
        await session.end()
    started = {e.task_id: e.ts for e in sink.events if e.type == "task.started"}
    stalls: dict[str, list[TaskStalled]] = {}
    for e in sink.events:
        if isinstance(e, TaskStalled):
            stalls.setdefault(e.task_id or "", []).append(e)
    latencies: dict[str, float] = {}
    missed = []
    for tid, (cmd, delay) in wait_ids.items():
        if tid not in stalls or tid not in started:
            missed.append(cmd)
            continue
        latencies[cmd] = stalls[tid][0].ts - (started[tid] + delay) - STALL_AFTER_S
    false_alarms = [quiet_ids[t] for t in quiet_ids if t in stalls]
    repeated = sum(1 for t in stalls if len(stalls[t]) > 1)
    return latencies, missed, false_alarms, repeated


async def run(ctx: Ctx) -> Result:
    waits = WAITS_FOR_INPUT[:4] if ctx.quick else list(WAITS_FOR_INPUT)
    quiet = DOES_NOT_WAIT[:2] if ctx.quick else list(DOES_NOT_WAIT)
    rounds = 1 if ctx.quick else 2
    res = Result(NAME, TITLE, percentiles=("p50", "p95", "max"))
    res.config = {
        "waits_for_input": len(waits),
        "does_not_wait": len(quiet),
        "rounds": rounds,
        "stall_after_s": STALL_AFTER_S,
        "policy": "default",
    }
    per_cmd: dict[str, list[float]] = {}
    missed: list[str] = []
    false_alarms: list[str] = []
    repeated = 0
    async with ctx.supervisor(NAME) as sup:
        for i in range(rounds):
            lat, miss, fa, rep = await _round(sup, str(i), waits, quiet)
            for cmd, v in lat.items():
                per_cmd.setdefault(cmd, []).append(v)
            missed += miss
            false_alarms += fa
            repeated += rep
    excess = [v for vs in per_cmd.values() for v in vs]
    res.rows += [
        row(
            "wait began -> task.stalled",
            "s",
            [v + STALL_AFTER_S for v in excess],
            baseline="stall_after_s (ideal)",
            base=STALL_AFTER_S,
        ),
        row("  latency beyond stall_after_s", "s", excess),
        row("missed (no task.stalled)", "count", len(missed), target="= 0", passed=not missed),
        row(
            f"false alarms on {len(quiet)} DOES_NOT_WAIT",
            "count",
            len(false_alarms),
            target="= 0",
            passed=not false_alarms,
        ),
        row("repeated stall events", "count", repeated, target="= 0", passed=repeated == 0),
    ]
    slow = sorted(((max(v), c) for c, v in per_cmd.items()), reverse=True)[:3]
    res.notes.append(
        "Wait start = the task.started event's time plus the corpus's 'seconds it works before "
        "it waits' (the container starts just before task.started is emitted; interpreter "
        "start-up makes the true wait begin slightly later, so latencies are upper bounds). "
        "The watcher looks 0.5 s after start, then about every 1 s (tick 0.2 s). Slowest: "
        + "; ".join(f"{c[:50]!r} {v:.2f} s" for v, c in slow)
    )
    if missed:
        res.notes.append(f"missed: {missed}")
    if false_alarms:
        res.notes.append(f"false alarms: {false_alarms}")
    res.errors = {"missed": len(missed), "false_alarms": len(false_alarms)}
    res.samples = {"per_command_excess_s": per_cmd}
    say(f"{len(excess)} detections")
    return res
