"""http-start: a task start through the daemon's HTTP API on the shipped ``default`` policy
with no configuration -> its first output byte, interleaved (ABAB) with raw docker-py
create + attach + start -> first byte of the same hardened container, cold.

The daemon (``sbx serve``) fills the default policy's shared warm pool at start. The
client starts ``echo x`` (``POST /sessions/{id}/tasks``) and asks for its output with
``wait_s`` (the daemon answers when the first byte is in the output file); the sample is
the time from sending the start to that answer: two HTTP round trips on the unix socket
included. Starts come one a second, an agent's pace, after a warm-up. A burst of starts
faster than the pool refills is measured too: those degrade to cold starts, never errors.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from bench.common import Ctx, Progress, Result, offload, row, say
from bench.daemon import Daemon

NAME = "http-start"
TITLE = "POST /sessions/{id}/tasks -> first output byte, shipped default policy (sbx serve)"
COMMAND = "echo x"
POLICY = "default"
#: One start a second, the pace of an agent that launches commands as it works.
PACE_S = 1.0


def _start_to_first_byte(c: httpx.Client, sid: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = c.post(f"/sessions/{sid}/tasks", json={"command": COMMAND})
    r.raise_for_status()
    tid = r.json()["task_id"]
    out = c.get(f"/sessions/{sid}/tasks/{tid}/output", params={"offset": 0, "wait_s": 30})
    out.raise_for_status()
    t1 = time.perf_counter()
    if not out.json().get("text"):
        raise RuntimeError(f"task {tid} printed nothing within 30 s")
    return t1 - t0, tid


def _ended(c: httpx.Client, sid: str, tid: str) -> None:
    r = c.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 30})
    r.raise_for_status()


def _burst(daemon: Daemon, sid: str, n: int) -> tuple[list[float], int]:
    """``n`` starts at once, each on its own connection; their start -> first byte."""
    times: list[float] = []
    errors = 0
    lock = threading.Lock()

    def one() -> None:
        nonlocal errors
        with daemon.client() as c:
            try:
                value, tid = _start_to_first_byte(c, sid)
                _ended(c, sid, tid)
            except (httpx.HTTPError, RuntimeError, KeyError) as exc:
                say(f"burst start failed: {exc!r}")
                with lock:
                    errors += 1
                return
            with lock:
                times.append(value)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times, errors


async def run(ctx: Ctx) -> Result:
    n = 5 if ctx.quick else 60
    warmup = 2 if ctx.quick else 5
    burst_n = 4 if ctx.quick else 20
    res = Result(NAME, TITLE)
    res.config = {
        "n": n,
        "warmup_discarded": warmup,
        "command": COMMAND,
        "policy": f"{POLICY} (shipped, unchanged)",
        "pace_s": PACE_S,
        "burst": burst_n,
    }
    ours: list[float] = []
    raw: list[float] = []
    errors = {"ours": 0, "raw": 0, "burst": 0}
    daemon = await offload(Daemon, ctx, NAME)
    try:
        with daemon.client() as c:
            c.post("/sessions", json={"session_id": "bench"}).raise_for_status()
            prog = Progress("http-start: ours/raw ABAB", n)
            for i in range(warmup + n):
                keep = i >= warmup
                paced = time.monotonic() + PACE_S
                try:
                    value, tid = await offload(_start_to_first_byte, c, "bench")
                    await offload(_ended, c, "bench", tid)
                    if keep:
                        ours.append(value)
                except (httpx.HTTPError, RuntimeError, KeyError) as exc:
                    errors["ours"] += 1
                    say(f"sample failed: {exc!r}")
                try:
                    base = await offload(ctx.raw.start_to_first_byte, COMMAND, POLICY)
                    if keep:
                        raw.append(base)
                except Exception as exc:
                    errors["raw"] += 1
                    say(f"raw sample failed: {exc!r}")
                if keep and ours and raw:
                    prog.step(extra=f"ours {ours[-1] * 1000:.1f} ms raw {raw[-1] * 1000:.0f} ms")
                # The agent's pace: what is left of the second (the pool refills meanwhile).
                await asyncio.sleep(max(0.0, paced - time.monotonic()))
            burst, errors["burst"] = await offload(_burst, daemon, "bench", burst_n)
            c.delete("/sessions/bench")
    finally:
        await offload(daemon.stop)
    ms = [v * 1000 for v in ours]
    raw_ms = [v * 1000 for v in raw]
    main = row(
        "HTTP start -> first byte, default policy",
        "ms",
        ms,
        baseline="raw docker-py create+attach+start (cold)",
        base=raw_ms,
        target="p50 <= 10 ms and <= 0.1x raw",
    )
    if main.ratio is not None:
        main.passed = main.ours["p50"] <= 10 and main.ratio <= 0.1
    res.rows.append(main)
    burst_ms = [v * 1000 for v in burst]
    res.rows.append(row(f"burst of {burst_n} at once -> first byte each", "ms", burst_ms))
    res.samples = {"ours_ms": ms, "raw_ms": raw_ms, "burst_ms": burst_ms}
    res.errors = errors
    res.notes.append(
        "Ours includes two HTTP round trips on the unix socket (the start, then the output "
        "read that waits for the first byte). The raw baseline creates the same hardened "
        "container (request_to_config on the default policy's request) cold."
    )
    res.notes.append(
        f"The burst: {burst_n} starts at once drain the pool (floor 2, cap 8, sized by the "
        "recent start rate); the rest start cold. Errors there would be a failure."
    )
    return res
