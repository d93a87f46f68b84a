"""teardown: ``session.end()`` with 100 running tasks (ones that exit on SIGTERM, and ones that
ignore it), vs raw docker-py kill + remove of 100 containers on a thread pool of the
supervisor's docker pool size; and nothing left behind."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from bench.common import Ctx, Progress, Result, row, say, wait_all_running
from supervisor import CallbackSink, Supervisor, TaskSpec
from supervisor.core.events import BaseEvent

NAME = "teardown"
TITLE = "session.end() with 100 running tasks"
VARIANTS = {
    "sigterm": "sleep 3600",
    # SIG_IGN survives exec, so sleep ignores SIGTERM too: only the SIGKILL after the
    # grace period ends these.
    "ignore_term": "trap '' TERM; sleep 3600",
}
POOL_SIZE = 16
GRACE_S = 1.0  # the bench policy's timeouts.grace_s


async def _ours(ctx: Ctx, sup: Supervisor, n: int, cmd: str, tag: str) -> dict[str, float]:
    sid = f"bench-teardown-{tag}"
    terminal: set[str] = set()

    def on_event(ev: BaseEvent) -> None:
        if ev.type in ("task.stopped", "task.failed") and ev.task_id:
            terminal.add(ev.task_id)

    session = await sup.open_session(sid, sinks=[CallbackSink(on_event)])
    infos = await asyncio.gather(
        *(session.start(TaskSpec(command=cmd, policy="bench", persistent=True)) for _ in range(n))
    )
    running, _ = await wait_all_running(session, [i.task_id for i in infos], 600)
    if running < n:
        say(f"only {running}/{n} tasks running before end()")
    await asyncio.sleep(1)  # the shell has installed its trap
    t0 = time.perf_counter()
    await session.end()
    elapsed = time.perf_counter() - t0
    left = await asyncio.to_thread(ctx.raw.count_session, sid)
    return {
        "end_s": elapsed,
        "left": left,
        "terminal": len(terminal),
        "running_before": running,
    }


def _raw(ctx: Ctx, n: int) -> dict[str, float]:
    raw = ctx.raw
    with ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="raw-teardown") as pool:
        cids = list(pool.map(lambda _: raw.create("sleep 3600", "bench"), range(n)))
        list(pool.map(raw.client.start, cids))

        def kill_remove(cid: str) -> None:
            raw.client.kill(cid, signal="SIGKILL")
            raw.client.remove_container(cid, force=True, v=True)

        time.sleep(1)
        t0 = time.perf_counter()
        list(pool.map(kill_remove, cids))
        elapsed = time.perf_counter() - t0
    left = len(raw.ours())
    return {"end_s": elapsed, "left": left}


async def run(ctx: Ctx) -> Result:
    n = 5 if ctx.quick else 100
    rounds = 1 if ctx.quick else 2
    res = Result(NAME, TITLE)
    res.config = {
        "tasks": n,
        "rounds": rounds,
        "variants": VARIANTS,
        "grace_s": GRACE_S,
        "raw_pool_size": POOL_SIZE,
    }
    ours: dict[str, list[dict[str, float]]] = {k: [] for k in VARIANTS}
    raw: list[dict[str, float]] = []
    errors = {"ours": 0, "raw": 0}
    # raw after each variant, then the other order: A R B R / R B R A
    order = ["sigterm", "raw", "ignore_term", "raw"]
    prog = Progress("teardown: runs", rounds * len(order))
    async with ctx.supervisor(NAME) as sup:
        for i in range(rounds):
            for step in order if i % 2 == 0 else list(reversed(order)):
                try:
                    if step == "raw":
                        s = await asyncio.to_thread(_raw, ctx, n)
                        raw.append(s)
                    else:
                        s = await _ours(ctx, sup, n, VARIANTS[step], f"{step}-{i}")
                        ours[step].append(s)
                except Exception as exc:
                    errors["raw" if step == "raw" else "ours"] += 1
                    say(f"{step} failed: {exc!r}")
                    continue
                prog.step(extra=f"{step} {s['end_s']:.2f} s, left {s['left']}")
    base_s = [s["end_s"] for s in raw]
    base = f"raw kill+remove, {POOL_SIZE} threads"
    for key, label in (("sigterm", "exit on SIGTERM"), ("ignore_term", "ignore SIGTERM")):
        runs = ours[key]
        ends = [s["end_s"] for s in runs]
        res.rows.append(
            row(f"end(), {n} tasks that {label}", "s", ends, baseline=base, base=base_s)
        )
        if key == "ignore_term":
            res.rows.append(
                row(
                    f"  same, minus the {GRACE_S:.0f} s grace",
                    "s",
                    [e - GRACE_S for e in ends],
                    baseline=base,
                    base=base_s,
                )
            )
        left = sum(s["left"] for s in runs)
        terminal_ok = all(s["terminal"] == n for s in runs)
        res.rows.append(
            row(
                f"  containers left / terminal events ({label})",
                "count",
                left,
                target=f"0 left, {n} events each",
                passed=left == 0 and terminal_ok and bool(runs),
                note=f"terminal events per run: {[s['terminal'] for s in runs]}",
            )
        )
    res.errors = errors
    res.samples = {"ours": ours, "raw": raw}
    res.notes.append(
        f"end() = stop every task (SIGTERM, {GRACE_S:.0f} s grace, SIGKILL), collect exits, emit "
        "terminal events and session.ended, remove containers. Containers left are counted by "
        "their io.sandvisor.session label right after end() returns. The raw baseline only kills "
        "(SIGKILL at once) and removes: it has no grace period and no bookkeeping."
    )
    return res
