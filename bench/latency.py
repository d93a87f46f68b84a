"""latency: a monitor task's stdout line -> ``task.output`` event at a CallbackSink, with 1 and
with 100 concurrent monitors, vs the same line read straight off a raw attach stream."""

from __future__ import annotations

import asyncio
import contextlib
import time

from bench.common import (
    Ctx,
    LineDemux,
    Progress,
    Result,
    close_writer,
    offload,
    raw_attach,
    row,
    say,
    wait_all_running,
)
from supervisor import CallbackSink, Supervisor, TaskOutput, TaskSpec
from supervisor.core.events import BaseEvent

NAME = "latency"
TITLE = "monitor line -> event at a CallbackSink (wall clock, sandvisor/debian python3)"
#: Lines 250 ms apart: wider than the default 200 ms batch window, so each line is the first
#: after a quiet window and goes out at once (what is measured is the pipeline, not batching).
PERIOD_S = 0.25
#: The task prints its own send time (CLOCK_REALTIME, ns; containers share the host kernel's
#: clock, so the receiver's time.time_ns() minus it is a valid latency).
SCRIPT = (
    "python3 -u -c 'import time\n"
    "while True:\n"
    "    print(time.time_ns(), flush=True)\n"
    f"    time.sleep({PERIOD_S})'"
)
POLICY = "bench-debian"
SETTLE_S = 1.0


def _in_window(pairs: list[tuple[int, int]], lo: int, hi: int) -> list[float]:
    return [(recv - sent) / 1e6 for sent, recv in pairs if lo <= sent <= hi]


async def _ours(sup: Supervisor, n: int, duration: float, tag: str) -> list[float]:
    pairs: list[tuple[int, int]] = []

    def on_event(ev: BaseEvent) -> None:
        if isinstance(ev, TaskOutput):
            now = time.time_ns()
            for line in ev.text.split("\n"):
                with contextlib.suppress(ValueError):
                    pairs.append((int(line), now))

    session = await sup.open_session(f"lat-{tag}", sinks=[CallbackSink(on_event)])
    try:
        infos = await asyncio.gather(
            *(
                session.start(
                    TaskSpec(command=SCRIPT, policy=POLICY, kind="monitor", persistent=True)
                )
                for _ in range(n)
            )
        )
        running, _ = await wait_all_running(session, [i.task_id for i in infos], 180)
        if running < n:
            say(f"ours: only {running}/{n} monitors running")
        lo = time.time_ns() + int(SETTLE_S * 1e9)
        hi = lo + int(duration * 1e9)
        await asyncio.sleep(SETTLE_S + duration + 0.5)
    finally:
        await session.end()
    return _in_window(pairs, lo, hi)


async def _raw(ctx: Ctx, n: int, duration: float) -> list[float]:
    raw = ctx.raw
    pairs: list[tuple[int, int]] = []
    cids = await asyncio.gather(*(offload(raw.create, SCRIPT, POLICY) for _ in range(n)))
    conns = []
    readers: list[asyncio.Task[None]] = []

    async def read_loop(reader: asyncio.StreamReader) -> None:
        demux = LineDemux()
        while True:
            data = await reader.read(65536)
            if not data:
                return
            now = time.time_ns()
            for line in demux.feed(data):
                with contextlib.suppress(ValueError):
                    pairs.append((int(line), now))

    try:
        for cid in cids:
            conns.append(await raw_attach(raw, cid, stdin=True))
        readers = [asyncio.create_task(read_loop(r)) for r, _ in conns]
        await asyncio.gather(*(offload(raw.client.start, cid) for cid in cids))
        lo = time.time_ns() + int(SETTLE_S * 1e9)
        hi = lo + int(duration * 1e9)
        await asyncio.sleep(SETTLE_S + duration + 0.5)
    finally:
        for t in readers:
            t.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await asyncio.gather(*(close_writer(w) for _, w in conns))
        await asyncio.gather(*(offload(raw.remove, cid) for cid in cids))
    return _in_window(pairs, lo, hi)


async def run(ctx: Ctx) -> Result:
    many = 5 if ctx.quick else 100
    dur_one = 2.0 if ctx.quick else 15.0
    dur_many = 2.0 if ctx.quick else 10.0
    rounds = 1 if ctx.quick else 2
    res = Result(NAME, TITLE, percentiles=("p50", "p95", "p99"))
    res.config = {
        "monitors": [1, many],
        "line_period_s": PERIOD_S,
        "batch_window_ms": 200,
        "window_s": {"1": dur_one, str(many): dur_many},
        "rounds": rounds,
        "policy": POLICY,
        "clock": "python3 time.time_ns() in the container vs time.time_ns() at the receiver",
    }
    data: dict[str, list[float]] = {"ours_1": [], "raw_1": [], "ours_many": [], "raw_many": []}
    errors = dict.fromkeys(data, 0)
    phases = [("ours_1", 1), ("raw_1", 1), ("ours_many", many), ("raw_many", many)]
    prog = Progress("latency: phases", rounds * len(phases))
    async with ctx.supervisor(NAME) as sup:
        for i in range(rounds):
            for key, n in phases if i % 2 == 0 else list(reversed(phases)):
                dur = dur_one if n == 1 else dur_many
                try:
                    if key.startswith("ours"):
                        got = await _ours(sup, n, dur, f"{key}-{i}")
                    else:
                        got = await _raw(ctx, n, dur)
                except Exception as exc:
                    errors[key] += 1
                    say(f"{key} failed: {exc!r}")
                    got = []
                data[key] += got
                p50 = sorted(got)[len(got) // 2] if got else float("nan")
                prog.step(extra=f"{key} n={len(got)} p50 {p50:.2f} ms")
    res.rows.append(
        row(
            "1 monitor: line -> CallbackSink",
            "ms",
            data["ours_1"],
            baseline="raw attach read",
            base=data["raw_1"],
        )
    )
    res.rows.append(
        row(
            f"{many} monitors: line -> CallbackSink",
            "ms",
            data["ours_many"],
            baseline=f"{many} raw attach reads",
            base=data["raw_many"],
        )
    )
    res.errors = errors
    res.samples = {k: [round(v, 3) for v in vs] for k, vs in data.items()}
    res.notes.append(
        f"Each monitor prints python3 time.time_ns() every {PERIOD_S * 1000:.0f} ms (wider than "
        "the 200 ms batch window, so every line leaves the chunker at once); latency = "
        "time.time_ns() in the CallbackSink - the printed time. The path includes the output "
        "file write, the chunker, the durable event log (SQLite group commit) and the sink "
        "runner. Baseline: the same container read over a raw asyncio attach stream in this "
        f"process. Only lines sent in a window starting {SETTLE_S:.0f} s after all tasks run."
    )
    return res
