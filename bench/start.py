"""start: ``session.start()`` -> first output byte in the output file, cold and from the warm
pool, each interleaved (ABAB) with raw docker-py create + attach + start -> first byte."""

from __future__ import annotations

import time

from bench.common import Ctx, Progress, Result, first_output, offload, row, say, wait_done
from supervisor import TaskSpec
from supervisor.runtime.session import Session

NAME = "start"
TITLE = "session.start() -> first output byte (echo x, sandvisor/minimal)"
COMMAND = "echo x"


async def _ours(session: Session, policy: str) -> float:
    t0 = time.perf_counter()
    info = await session.start(TaskSpec(command=COMMAND, policy=policy))
    ok = await first_output(session, info.task_id, 30)
    t1 = time.perf_counter()
    if not ok:
        raise RuntimeError(f"task {info.task_id} printed nothing within 30 s")
    # Let it finish and be removed outside the timed part, so samples do not overlap.
    await session.wait(info.task_id, timeout_s=30)
    await wait_done(session, [info.task_id])
    return t1 - t0


async def _refilled(session: Session, policy: str) -> None:
    """The pool back to its size before the next sample (outside the timed part)."""
    await session.prewarm(policy)


async def run(ctx: Ctx) -> Result:
    n = 5 if ctx.quick else 60
    warmup = 1 if ctx.quick else 3
    res = Result(NAME, TITLE)
    res.config = {"n": n, "warmup_discarded": warmup, "command": COMMAND, "policy": "bench"}
    cold: list[float] = []
    raw_cold: list[float] = []
    warm: list[float] = []
    raw_warm: list[float] = []
    errors = {"cold": 0, "warm": 0, "raw": 0}

    async def raw_sample(into: list[float], keep: bool) -> None:
        try:
            value = await offload(ctx.raw.start_to_first_byte, COMMAND, "bench")
        except Exception as exc:
            errors["raw"] += 1
            say(f"raw sample failed: {exc!r}")
            return
        if keep:
            into.append(value)

    async with ctx.supervisor(NAME) as sup:
        session = await sup.open_session("bench-start")
        # Cold path, ABAB with the raw baseline.
        prog = Progress("start: cold/raw ABAB", n)
        for i in range(warmup + n):
            keep = i >= warmup
            try:
                value = await _ours(session, "bench")
                if keep:
                    cold.append(value)
            except Exception as exc:
                errors["cold"] += 1
                say(f"cold sample failed: {exc!r}")
            await raw_sample(raw_cold, keep)
            if keep:
                prog.step(extra=f"cold {cold[-1] * 1000:.0f} ms raw {raw_cold[-1] * 1000:.0f} ms")
        # Warm path: the pool refills between samples (outside the timed part).
        ready = await session.prewarm("bench-warm")
        say(f"warm pool ready: {ready} containers")
        prog = Progress("start: warm/raw ABAB", n)
        for i in range(warmup + n):
            keep = i >= warmup
            await _refilled(session, "bench-warm")
            try:
                value = await _ours(session, "bench-warm")
                if keep:
                    warm.append(value)
            except Exception as exc:
                errors["warm"] += 1
                say(f"warm sample failed: {exc!r}")
            await raw_sample(raw_warm, keep)
            if keep:
                prog.step(extra=f"warm {warm[-1] * 1000:.1f} ms raw {raw_warm[-1] * 1000:.0f} ms")
        await session.end()

    ms = [v * 1000 for v in cold]
    raw_ms = [v * 1000 for v in raw_cold]
    wms = [v * 1000 for v in warm]
    raw_wms = [v * 1000 for v in raw_warm]
    raw_label = "raw docker-py create+attach+start"
    res.rows.append(row("cold start -> first byte", "ms", ms, baseline=raw_label, base=raw_ms))
    warm_row = row(
        "warm-pool start -> first byte",
        "ms",
        wms,
        baseline=raw_label,
        base=raw_wms,
        target="p50 < 10 ms and <= 0.1x raw",
    )
    if warm_row.ratio is not None:
        warm_row.passed = warm_row.ours["p50"] < 10 and warm_row.ratio <= 0.1
    res.rows.append(warm_row)
    res.samples = {"cold_ms": ms, "raw_cold_ms": raw_ms, "warm_ms": wms, "raw_warm_ms": raw_wms}
    res.errors = errors
    res.notes.append(
        "Both paths use the same hardened HostConfig (request_to_config on a request built "
        "like the supervisor's, stdin attached). Ours ends when the first byte is in the output "
        "file (TaskRunner.wait_output, no polling); raw ends when docker-py reads it off the "
        "attach socket. Each sample's container is removed before the next sample."
    )
    return res
