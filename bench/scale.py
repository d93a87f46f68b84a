"""scale: 200 quiet tasks plus 20 chatty ones -> this process's CPU and RSS, vs the same
process idle (a started supervisor with no task); then nothing lost."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

from bench.common import Ctx, Progress, Result, row, say, wait_all_running
from supervisor import CallbackSink, Supervisor, TaskSpec
from supervisor.core.events import BaseEvent

NAME = "scale"
TITLE = "200 quiet + 20 chatty tasks: supervisor CPU and RSS"
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUIET = "sleep 3600"


def chatty(lines: int) -> str:
    """A line every 10 ms (python3, so no fork per line), ``lines`` of them, then exit."""
    return (
        "python3 -u -c 'import time\n"
        f"for i in range({lines}):\n"
        "    print(i, flush=True)\n"
        "    time.sleep(0.01)'"
    )


def expected(lines: int) -> bytes:
    return "".join(f"{i}\n" for i in range(lines)).encode()


def cpu_seconds() -> float:
    """utime + stime of this process (all threads), from /proc/self/stat."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(window_s: float, label: str) -> dict[str, float]:
    """CPU % of one core over ``window_s`` and RSS sampled every 0.5 s."""
    gc.collect()
    say(f"measuring {label} for {window_s:.0f} s")
    c0, t0 = cpu_seconds(), time.monotonic()
    rss = [rss_mb()]
    while time.monotonic() - t0 < window_s:
        await asyncio.sleep(0.5)
        rss.append(rss_mb())
    c1, t1 = cpu_seconds(), time.monotonic()
    return {
        "cpu_pct": (c1 - c0) / (t1 - t0) * 100,
        "rss_max_mb": max(rss),
        "rss_mean_mb": sum(rss) / len(rss),
        "window_s": t1 - t0,
    }


async def wait_pool(sup: Supervisor, floor: int, timeout_s: float = 120) -> int:
    """Wait until the default policy's shared pool holds ``floor`` ready containers."""
    deadline = time.monotonic() + timeout_s
    while (ready := sup.pools.ready().get("default", 0)) < floor:
        if time.monotonic() > deadline:
            say(f"the default pool has {ready}/{floor} containers after {timeout_s:.0f} s")
            break
        await asyncio.sleep(0.1)
    return ready


async def run(ctx: Ctx) -> Result:
    n_quiet = 10 if ctx.quick else 200
    n_chatty = 2 if ctx.quick else 20
    window = 3.0 if ctx.quick else 30.0
    lines = int((window + 10) / 0.01)
    res = Result(NAME, TITLE)
    res.config = {
        "quiet_tasks": n_quiet,
        "quiet_command": QUIET,
        "chatty_tasks": n_chatty,
        "chatty_lines": lines,
        "chatty_period_ms": 10,
        "window_s": window,
        "policies": {"quiet": "bench", "chatty": "bench-debian", "pool": "default"},
    }
    terminal: set[str] = set()
    duplicates = 0

    def on_event(ev: BaseEvent) -> None:
        nonlocal duplicates
        if ev.type in ("task.stopped", "task.failed") and ev.task_id:
            if ev.task_id in terminal:
                duplicates += 1
            terminal.add(ev.task_id)

    async with ctx.supervisor(NAME) as sup:
        # As the daemon does at start: the shipped default policy's shared warm pool fills,
        # so every figure below includes what keeping it costs.
        sup.prewarm_shared()
        floor = sup.policies.get("default").warm_pool
        pool_ready = await wait_pool(sup, floor)
        session = await sup.open_session("bench-scale", sinks=[CallbackSink(on_event)])
        await asyncio.sleep(1)
        idle = await measure(window, f"idle supervisor (0 tasks, {pool_ready} warm)")
        pool_mem = await asyncio.to_thread(ctx.raw.pool_memory_mb)

        t0 = time.monotonic()
        quiet = await asyncio.gather(
            *(
                session.start(TaskSpec(command=QUIET, policy="bench", persistent=True))
                for _ in range(n_quiet)
            )
        )
        running, ended = await wait_all_running(
            session, [i.task_id for i in quiet], 600, Progress("scale: quiet tasks up", n_quiet)
        )
        ramp_s = time.monotonic() - t0
        if running < n_quiet:
            say(f"only {running}/{n_quiet} quiet tasks running ({ended} ended)")
        await asyncio.sleep(3)
        only_quiet = await measure(window, f"{n_quiet} quiet tasks")

        chat = await asyncio.gather(
            *(
                session.start(TaskSpec(command=chatty(lines), policy="bench-debian"))
                for _ in range(n_chatty)
            )
        )
        await wait_all_running(
            session, [i.task_id for i in chat], 300, Progress("scale: chatty tasks up", n_chatty)
        )
        await asyncio.sleep(2)
        loaded = await measure(window, f"{n_quiet} quiet + {n_chatty} chatty tasks")

        say("waiting for the chatty tasks to finish")
        finals = await asyncio.gather(
            *(session.wait(i.task_id, timeout_s=600) for i in chat), return_exceptions=True
        )
        want = expected(lines)
        exact = 0
        for f in finals:
            if isinstance(f, BaseException):
                say(f"chatty wait failed: {f!r}")
                continue
            data = await asyncio.to_thread(Path(f.output_path).read_bytes)
            if f.exit_code == 0 and data == want:
                exact += 1
            else:
                say(f"{f.task_id}: exit {f.exit_code}, {len(data)} bytes, expected {len(want)}")
        all_ids = {i.task_id for i in quiet} | {i.task_id for i in chat}
        t_end = time.monotonic()
        await session.end()
        end_s = time.monotonic() - t_end
        left = await asyncio.to_thread(ctx.raw.count_session, "bench-scale")

    total = n_quiet + n_chatty
    got_terminal = len(terminal & all_ids)
    per_task_kb = (loaded["rss_max_mb"] - idle["rss_max_mb"]) * 1024 / total
    per_quiet_kb = (only_quiet["rss_max_mb"] - idle["rss_max_mb"]) * 1024 / n_quiet
    base = "idle supervisor, 0 tasks"
    res.rows += [
        row(
            f"CPU, {n_quiet} quiet tasks",
            "% of a core",
            only_quiet["cpu_pct"],
            baseline=base,
            base=idle["cpu_pct"],
            target="<= 5%",
            passed=only_quiet["cpu_pct"] <= 5,
        ),
        row(
            f"CPU, {n_quiet} quiet + {n_chatty} chatty",
            "% of a core",
            loaded["cpu_pct"],
            baseline=base,
            base=idle["cpu_pct"],
        ),
        row(
            f"RSS max, {n_quiet} quiet",
            "MB",
            only_quiet["rss_max_mb"],
            baseline=base,
            base=idle["rss_max_mb"],
            target="<= 200 MB",
            passed=only_quiet["rss_max_mb"] <= 200,
        ),
        row(
            f"RSS max, {n_quiet} quiet + {n_chatty} chatty",
            "MB",
            loaded["rss_max_mb"],
            baseline=base,
            base=idle["rss_max_mb"],
            target="<= 200 MB",
            passed=loaded["rss_max_mb"] <= 200,
        ),
        row(
            "default policy's warm pool, ready",
            "containers",
            pool_ready,
            target=f"= {floor} (its floor)",
            passed=pool_ready >= floor,
        ),
        row("memory of one warm container (engine stats)", "MB", pool_mem[0]),
        row("memory of its containerd shim on the host (PSS)", "MB", pool_mem[1]),
        row("RSS per task (all tasks)", "KB", per_task_kb),
        row("RSS per task (quiet only)", "KB", per_quiet_kb),
        row(f"time to start {n_quiet} quiet tasks", "s", ramp_s),
        row(
            "chatty output files complete and exact",
            "count",
            exact,
            target=f"= {n_chatty}",
            passed=exact == n_chatty,
        ),
        row(
            "terminal events (one per task)",
            "count",
            got_terminal,
            target=f"= {total}, 0 duplicates",
            passed=got_terminal == total and duplicates == 0,
        ),
        row(f"session.end() with {n_quiet} tasks", "s", end_s),
        row("containers left after end", "count", left, target="= 0", passed=left == 0),
    ]
    res.samples = {"idle": idle, "quiet": only_quiet, "loaded": loaded}
    res.errors = {"duplicate_terminal_events": duplicates, "inexact_chatty": n_chatty - exact}
    res.notes.append(
        "CPU from /proc/self/stat (utime+stime of this whole process: supervisor, its thread "
        f"pools, the idle harness) over {window:.0f} s windows; RSS = max of VmRSS sampled every "
        f"0.5 s. Quiet = `{QUIET}` on busybox; chatty = python3 printing a counter every 10 ms "
        f"({lines} lines, background kind), checked byte for byte after exit. Per-task RSS is "
        "(RSS max - idle RSS max) / tasks."
    )
    return res
