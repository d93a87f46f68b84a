"""throughput: a task writing 1 GiB to stdout -> MB/s into its output file, vs (a) a raw
asyncio attach stream read and discarded, (b) ``docker logs -f`` into a pipe that is read and
discarded, (c) a plain host pipe (the ceiling)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time

from bench.common import (
    CountingDemux,
    Ctx,
    Progress,
    Result,
    close_writer,
    offload,
    raw_attach,
    row,
    say,
)
from supervisor import TaskSpec
from supervisor.runtime.session import Session

NAME = "throughput"
TITLE = "1 GiB on stdout -> MB/s (NUL bytes and 100-byte text lines, sandvisor/minimal)"
MB = 1_000_000

# A 100-byte line (99 printable characters and a newline), the shape of a build or test log.
LINE = "".join(chr(33 + i % 94) for i in range(99)).replace("'", "_")
# Two shapes of output, because the engine's json-file log (which every container path
# pays, ours included) costs very differently on them: NUL bytes without newlines become a
# few large records, escaped as \u0000 (6x); text lines become one record per line.
CONTENTS = {
    "zeros": "head -c SIZE /dev/zero",
    "lines": "yes '" + LINE + "' | head -c SIZE",
}


def command(size: int, content: str) -> str:
    return CONTENTS[content].replace("SIZE", str(size))


async def _ours(session: Session, size: int, content: str) -> dict[str, float]:
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    info = await session.start(TaskSpec(command=command(size, content), policy="bench"))
    runner = session.task_runner(info.task_id)
    await runner.wait_output(0, 120)
    t_first = time.perf_counter()
    # Poll (5 ms) rather than wait_output: a waiter woken by every written chunk would add
    # its own cost to the capture loop it measures.
    deadline = time.monotonic() + 1800
    while runner.info().output_bytes < size and not runner.ended and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    t_last = time.perf_counter()
    cpu = time.process_time() - cpu0
    final = await session.wait(info.task_id, timeout_s=120)
    await runner.done.wait()
    with contextlib.suppress(OSError):
        os.remove(final.output_path)
    if final.output_bytes != size or final.dropped_bytes:
        raise RuntimeError(
            f"output file has {final.output_bytes} bytes (dropped {final.dropped_bytes}), "
            f"expected {size}"
        )
    return {
        "bytes": size,
        "first_to_last_s": t_last - t_first,
        "total_s": t_last - t0,
        "cpu_s": cpu,
    }


async def _raw_attach(ctx: Ctx, size: int, content: str) -> dict[str, float]:
    raw = ctx.raw
    cid = await offload(raw.create, command(size, content), "bench")
    try:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        reader, writer = await raw_attach(raw, cid, stdin=True)
        await offload(raw.client.start, cid)
        demux = CountingDemux()
        t_first = None
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                if t_first is None:
                    t_first = time.perf_counter()
                demux.feed(data)
        finally:
            await close_writer(writer)
        t_last = time.perf_counter()
        cpu = time.process_time() - cpu0
    finally:
        await offload(raw.remove, cid)
    if demux.payload != size or t_first is None:
        raise RuntimeError(f"raw attach read {demux.payload} bytes, expected {size}")
    return {
        "bytes": demux.payload,
        "first_to_last_s": t_last - t_first,
        "total_s": t_last - t0,
        "cpu_s": cpu,
    }


async def _docker_logs(ctx: Ctx, size: int, content: str) -> dict[str, float]:
    raw = ctx.raw
    cid = await offload(raw.create, command(size, content), "bench")
    try:
        t0 = time.perf_counter()
        await offload(raw.client.start, cid)
        proc = await asyncio.create_subprocess_exec(
            "docker",
            "logs",
            "-f",
            cid,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=1 << 20,
        )
        assert proc.stdout is not None
        got = 0
        t_first = None
        try:
            while True:
                data = await proc.stdout.read(1 << 20)
                if not data:
                    break
                if t_first is None:
                    t_first = time.perf_counter()
                got += len(data)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
        t_last = time.perf_counter()
    finally:
        await offload(raw.remove, cid)
    if t_first is None:
        raise RuntimeError("docker logs -f printed nothing")
    return {
        "bytes": got,
        "first_to_last_s": t_last - t_first,
        "total_s": t_last - t0,
        "lost_bytes": size - got,
    }


def _pipe_python(size: int, content: str) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(["sh", "-c", command(size, content)], stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    got = 0
    t_first = None
    fd = proc.stdout.fileno()
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            break
        if t_first is None:
            t_first = time.perf_counter()
        got += len(data)
    proc.wait()
    t_last = time.perf_counter()
    assert t_first is not None
    return {"bytes": got, "first_to_last_s": t_last - t_first, "total_s": t_last - t0}


def _pipe_shell(size: int, content: str) -> dict[str, float]:
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", f"{command(size, content)} | cat > /dev/null"], check=True)
    elapsed = time.perf_counter() - t0
    return {"bytes": size, "first_to_last_s": elapsed, "total_s": elapsed}


def mbps(sample: dict[str, float]) -> float:
    return sample["bytes"] / MB / sample["first_to_last_s"]


async def run(ctx: Ctx) -> Result:
    size = 64 * 1024 * 1024 if ctx.quick else 1024 * 1024 * 1024
    rounds = 1 if ctx.quick else 2
    res = Result(NAME, TITLE)
    res.config = {
        "bytes": size,
        "rounds": rounds,
        "commands": {c: command(size, c) for c in CONTENTS},
        "policy": "bench",
    }
    variants = ["ours", "raw_attach", "docker_logs", "pipe_python", "pipe_shell"]
    samples: dict[str, list[dict[str, float]]] = {
        f"{c}/{v}": [] for c in CONTENTS for v in variants
    }
    errors = dict.fromkeys(samples, 0)
    async with ctx.supervisor(NAME) as sup:
        session = await sup.open_session("bench-throughput")

        async def measure(content: str, name: str) -> None:
            key = f"{content}/{name}"
            try:
                if name == "ours":
                    s = await _ours(session, size, content)
                elif name == "raw_attach":
                    s = await _raw_attach(ctx, size, content)
                elif name == "docker_logs":
                    s = await _docker_logs(ctx, size, content)
                elif name == "pipe_python":
                    s = await asyncio.to_thread(_pipe_python, size, content)
                else:
                    s = await asyncio.to_thread(_pipe_shell, size, content)
            except Exception as exc:
                errors[key] += 1
                say(f"{key} failed: {exc!r}")
                return
            samples[key].append(s)
            prog.step(extra=f"{key} {mbps(s):.0f} MB/s")

        prog = Progress("throughput: runs", rounds * len(samples))
        for content in CONTENTS:
            for i in range(rounds):
                # ABCDE then EDCBA: drift over the run hits every variant alike.
                for name in variants if i % 2 == 0 else list(reversed(variants)):
                    await measure(content, name)
        await session.end()

    rate = {k: [mbps(s) for s in v] for k, v in samples.items()}
    per_gib = 1024**3 / size
    for c in CONTENTS:
        what = "NUL bytes" if c == "zeros" else "100-byte lines"
        # (metric, our variant, baseline label, baseline variant): MB/s rows.
        for metric, mine, label, theirs in (
            ("into output file vs raw attach", "ours", "raw asyncio attach+demux", "raw_attach"),
            ("into output file vs docker logs -f", "ours", "docker logs -f | read", "docker_logs"),
            ("into output file vs host pipe", "ours", "host pipe, Python read", "pipe_python"),
            ("host pipe, shell (... | cat)", "pipe_shell", "host pipe, Python read", "pipe_python"),
        ):
            res.rows.append(
                row(
                    f"{what}: {metric}",
                    "MB/s",
                    rate[f"{c}/{mine}"],
                    baseline=label,
                    base=rate[f"{c}/{theirs}"],
                    higher_is_better=True,
                )
            )
        res.rows.append(
            row(
                f"{what}: our process CPU per GiB",
                "cpu-s",
                [s["cpu_s"] * per_gib for s in samples[f"{c}/ours"]],
                baseline="raw attach reader",
                base=[s["cpu_s"] * per_gib for s in samples[f"{c}/raw_attach"]],
            )
        )
        lost = [s.get("lost_bytes", 0) for s in samples[f"{c}/docker_logs"]]
        if any(lost):
            res.notes.append(
                f"{what}: docker logs -f missed {max(lost):,} bytes in a run (json-file "
                "rotation overtook the follower); its MB/s counts only what it delivered."
            )
    res.errors = errors
    res.samples = samples
    res.notes.append(
        "MB/s = bytes / (last byte - first byte). Ours: bytes in the task's output file (first "
        "byte via wait_output, the last by a 5 ms poll of the file size), checked complete, "
        "file deleted afterwards. The engine also writes each byte to the container's "
        "json-file log, on every container path alike (NUL bytes are stored as \\u0000, about "
        "6x; text lines cost one JSON record each); the host pipe pays none of it. CPU per GiB "
        "is this process's (all threads), not dockerd's."
    )
    return res
