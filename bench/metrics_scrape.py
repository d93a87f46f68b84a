"""metrics-scrape: the daemon's CPU with 200 quiet tasks while Prometheus scrapes ``/metrics``
every 15 s, against the same daemon and tasks unscraped, in alternating windows (ABAB)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx

from bench.common import Ctx, Progress, Result, offload, row, say
from bench.daemon import Daemon
from supervisor.core.models import FINAL_STATUSES

NAME = "metrics-scrape"
TITLE = "daemon CPU, 200 quiet tasks, /metrics scraped every 15 s (sandvisor serve)"
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUIET = "sleep 3600"
SID = "bench-metrics"


def cpu_seconds(pid: int) -> float:
    """utime + stime of the daemon (every thread), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _start_quiet(c: httpx.Client, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = c.post(
            f"/sessions/{SID}/tasks",
            json={"command": QUIET, "policy": "bench", "persistent": True},
        )
        r.raise_for_status()
        ids.append(r.json()["task_id"])
    return ids


def _states(c: httpx.Client) -> tuple[int, int]:
    """(running, ended) tasks of the session."""
    r = c.get(f"/sessions/{SID}/tasks")
    r.raise_for_status()
    tasks = r.json()
    running = sum(1 for t in tasks if t["status"] == "running")
    return running, sum(1 for t in tasks if t["status"] in FINAL_STATUSES)


def _scrape(c: httpx.Client) -> tuple[float, int]:
    """One scrape as Prometheus makes it: (seconds, body bytes)."""
    t0 = time.perf_counter()
    r = c.get("/metrics")
    r.raise_for_status()
    return time.perf_counter() - t0, len(r.content)


async def _window(
    pid: int, c: httpx.Client, seconds: float, every_s: float | None
) -> tuple[float, list[float], int]:
    """The daemon's CPU % of one core over ``seconds``, scraping every ``every_s`` (the
    first scrape at once, as a Prometheus target's first scrape falls anywhere)."""
    scrapes: list[float] = []
    size = 0
    c0, t0 = await offload(cpu_seconds, pid), time.monotonic()
    next_at = t0
    while (left := t0 + seconds - time.monotonic()) > 0:
        if every_s is None:
            await asyncio.sleep(left)
            break
        if time.monotonic() >= next_at:
            took, size = await offload(_scrape, c)
            scrapes.append(took)
            next_at += every_s
        await asyncio.sleep(max(0.0, min(next_at, t0 + seconds) - time.monotonic()))
    c1, t1 = await offload(cpu_seconds, pid), time.monotonic()
    return (c1 - c0) / (t1 - t0) * 100, scrapes, size


async def run(ctx: Ctx) -> Result:
    n_quiet = 10 if ctx.quick else 200
    every = 1.0 if ctx.quick else 15.0
    window = 3.0 if ctx.quick else 60.0
    rounds = 1 if ctx.quick else 3
    res = Result(NAME, TITLE)
    res.config = {
        "quiet_tasks": n_quiet,
        "quiet_command": QUIET,
        "policy": "bench",
        "scrape_every_s": every,
        "window_s": window,
        "rounds": rounds,
        "order": "ABAB: unscraped, scraped, per round",
    }
    scraped: list[float] = []
    quiet: list[float] = []
    scrape_s: list[float] = []
    body = 0
    running = ended = left = 0
    daemon = await offload(Daemon, ctx, NAME)
    try:
        pid = daemon.proc.pid  # prlimit execs the daemon: the same pid
        with daemon.client() as c:
            c.post("/sessions", json={"session_id": SID}).raise_for_status()
            ids = await offload(_start_quiet, c, n_quiet)
            prog = Progress("metrics-scrape: quiet tasks up", n_quiet)
            deadline, seen = time.monotonic() + 600, 0
            while True:
                running, ended = await offload(_states, c)
                prog.step(running + ended - seen)
                seen = running + ended
                if seen >= len(ids) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            if running < n_quiet:
                say(f"only {running}/{n_quiet} quiet tasks running ({ended} ended)")
            await asyncio.sleep(3)  # the starts' after-work (pool refills, checkpoints)
            for i in range(rounds):
                say(f"round {i + 1}/{rounds}: {window:.0f} s unscraped, {window:.0f} s scraped")
                pct, _, _ = await _window(pid, c, window, None)
                quiet.append(pct)
                pct, took, body = await _window(pid, c, window, every)
                scraped.append(pct)
                scrape_s += took
            c.delete(f"/sessions/{SID}").raise_for_status()
        left = await offload(ctx.raw.count_session, SID)
    finally:
        await offload(daemon.stop)
    main = row(
        f"daemon CPU, {n_quiet} quiet tasks, scraped every {every:g} s",
        "% of a core",
        scraped,
        baseline="the same daemon and tasks, unscraped",
        base=quiet,
        target="<= 5%",
    )
    main.passed = main.ours["p50"] <= 5
    res.rows += [
        main,
        row("one scrape of /metrics (HTTP on the unix socket)", "ms", [s * 1000 for s in scrape_s]),
        row("/metrics body", "bytes", body),
        row(
            "quiet tasks running",
            "count",
            running,
            target=f"= {n_quiet}",
            passed=running == n_quiet,
        ),
        row("containers left after end", "count", left, target="= 0", passed=left == 0),
    ]
    res.samples = {
        "scraped_cpu_pct": scraped,
        "unscraped_cpu_pct": quiet,
        "scrape_ms": [s * 1000 for s in scrape_s],
    }
    res.notes.append(
        "CPU = utime+stime of the `sandvisor serve` process (every thread) from /proc/<pid>/stat "
        f"over {window:.0f} s windows, alternating unscraped and scraped; a scrape is "
        "`GET /metrics` with the admin token, as Prometheus makes it (it pings the engine "
        "first, for sandvisor_engine_up)."
    )
    return res
