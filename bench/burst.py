"""burst: 100 ``session.start`` at once (one ``asyncio.gather``) -> each task's first output
byte, vs 100 raw docker-py create + attach + start submitted at once to a thread pool of the
supervisor's docker pool size."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from bench.common import Ctx, Progress, Result, first_output, row, say, wait_done
from supervisor import TaskSpec
from supervisor.runtime.session import Session

NAME = "burst"
TITLE = "100 tasks started at once -> first output byte (echo x)"
COMMAND = "echo x"
#: DockerBackend's default max_workers: the raw baseline gets the same concurrency.
POOL_SIZE = 16


async def _ours(session: Session, n: int) -> tuple[list[float], int]:
    t0 = time.perf_counter()

    async def one() -> tuple[str, float]:
        info = await session.start(TaskSpec(command=COMMAND, policy="bench"))
        if not await first_output(session, info.task_id, 120):
            raise RuntimeError(f"{info.task_id}: no output within 120 s")
        return info.task_id, time.perf_counter() - t0

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    latencies = [r[1] for r in results if isinstance(r, tuple)]
    ids = [r[0] for r in results if isinstance(r, tuple)]
    errors = sum(1 for r in results if isinstance(r, BaseException))
    for r in results:
        if isinstance(r, BaseException):
            say(f"ours: {r!r}")
    finals = await asyncio.gather(*(session.wait(t, timeout_s=120) for t in ids))
    errors += sum(1 for f in finals if f.exit_code != 0)
    await wait_done(session, ids, 120)
    return latencies, errors


def _raw(ctx: Ctx, n: int) -> tuple[list[float], int]:
    def one() -> float:
        t_first, cid = ctx.raw.start_to_first_byte_at(COMMAND, "bench")
        ctx.raw.remove(cid)  # the supervisor removes its exited containers meanwhile too
        return t_first

    with ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="raw-burst") as pool:
        t0 = time.perf_counter()
        futures = [pool.submit(one) for _ in range(n)]
        latencies, errors = [], 0
        for f in futures:
            try:
                latencies.append(f.result() - t0)
            except Exception as exc:
                errors += 1
                say(f"raw: {exc!r}")
    return latencies, errors


async def run(ctx: Ctx) -> Result:
    n = 10 if ctx.quick else 100
    rounds = 1 if ctx.quick else 3
    res = Result(NAME, TITLE)
    res.config = {"tasks_per_burst": n, "rounds": rounds, "raw_pool_size": POOL_SIZE}
    ours: list[float] = []
    raw: list[float] = []
    errors = {"ours": 0, "raw": 0}
    per_round: list[dict[str, float]] = []
    async with ctx.supervisor(NAME) as sup:
        session = await sup.open_session("bench-burst")
        prog = Progress("burst: rounds (ours, raw)", rounds)
        for _ in range(rounds):
            lat, err = await _ours(session, n)
            ours += lat
            errors["ours"] += err
            rlat, rerr = await asyncio.to_thread(_raw, ctx, n)
            raw += rlat
            errors["raw"] += rerr
            per_round.append(
                {"ours_last_s": max(lat, default=0), "raw_last_s": max(rlat, default=0)}
            )
            prog.step(
                extra=f"ours last {max(lat, default=0):.1f} s, raw {max(rlat, default=0):.1f} s"
            )
        await session.end()
    ms = [v * 1000 for v in ours]
    rms = [v * 1000 for v in raw]
    base = f"raw docker-py, {POOL_SIZE} threads"
    res.rows.append(row(f"start -> first byte, {n} at once", "ms", ms, baseline=base, base=rms))
    res.rows.append(
        row(
            "whole burst (last first byte)",
            "s",
            [r["ours_last_s"] for r in per_round],
            baseline=base,
            base=[r["raw_last_s"] for r in per_round],
        )
    )
    res.rows.append(
        row(
            "errors",
            "count",
            errors["ours"],
            baseline=base,
            base=errors["raw"],
            target="0",
            passed=errors["ours"] == 0,
        )
    )
    res.errors = errors
    res.samples = {"ours_ms": ms, "raw_ms": rms, "rounds": per_round}
    res.notes.append(
        "Latency of each task is measured from the moment the whole burst was launched (one "
        "asyncio.gather of session.start, or one submit of all raw jobs), so it includes "
        "queueing. Rounds alternate ours/raw; each side removes its exited containers as it "
        "goes, like the supervisor does."
    )
    return res
