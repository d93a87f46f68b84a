"""Two supervisors on one engine, racing, for a bounded time: how often does the engine wedge?

Issue 29 saw Debian 12's engine (docker.io 20.10.24) deadlock in libnetwork while two
supervisors on one host started and removed containers. This bench reproduces the pattern
on a private dockerd (its own roots and socket; the shared engine is never touched):

- two worker processes, each a ``Supervisor`` with its own state dir, repeat the race test's
  pattern (``tests/integration/test_core.py::test_races_give_exactly_one_terminal_event``):
  a batch of tasks stopped as they exit, and a batch of sessions ended as their task exits;
- the parent asks the engine for ``/info`` every 2 s. An answer slower than ``--wedge-s``
  counts as a wedge: the parent saves dockerd's goroutine dump, restarts the engine and
  goes on;
- each worker checks that every task got exactly one terminal event.

Run it as root, with the shared engine up (it lends the minimal image):

    .venv/bin/python -m bench.engine_stress --minutes 5                       # installed dockerd
    .venv/bin/python -m bench.engine_stress --minutes 5 --dockerd /tmp/d2010/root/usr/sbin/dockerd

(Debian 12's 20.10 binary, unpacked without installing it:
``apt-get download docker.io=20.10.24+dfsg1-1+deb12u1+b6 && dpkg-deb -x docker.io_*.deb root``.)
It prints one JSON line: the engine version, rounds, tasks, exactness and wedges.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

from supervisor import MemorySink, Supervisor, SupervisorError, TaskNotRunning, TaskSpec
from tests.engine_watchdog import EngineWatchdog
from tests.private_engine import EngineConfig, PrivateEngine

FAST_POLICY = """
description = "stress: minimal image, 1 s grace"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 1.0
"""
#: Tasks per batch in each worker (the race test uses 20).
BATCH = 10


async def worker(docker_host: str, state_dir: Path, seconds: float, seed: int) -> dict[str, Any]:
    """The race pattern against ``docker_host`` until ``seconds`` pass."""
    policies = state_dir / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    (policies / "fast.toml").write_text(FAST_POLICY)
    rng = random.Random(seed)
    errors: dict[str, int] = {}
    counts = {"rounds": 0, "tasks": 0, "inexact": 0}

    def terminal(sink: MemorySink, task_id: str) -> int:
        return sum(
            1
            for e in sink.events
            if e.task_id == task_id and e.type in ("task.stopped", "task.failed")
        )

    async def stop_race(session: Any, sink: MemorySink) -> str:
        info = await session.start(TaskSpec(command="sleep 0.3", policy="fast"))
        await asyncio.sleep(rng.uniform(0.2, 0.4))
        with contextlib.suppress(TaskNotRunning):
            await session.stop(info.task_id)
        await session.wait(info.task_id, timeout_s=60)
        return str(info.task_id)

    async def end_race(sup: Any, name: str) -> None:
        own = MemorySink()
        s = await sup.open_session(name, sinks=[own])
        info = await s.start(TaskSpec(command="sleep 0.3", policy="fast"))
        await asyncio.sleep(rng.uniform(0.2, 0.4))
        await s.end()
        counts["tasks"] += 1
        if terminal(own, info.task_id) != 1:
            counts["inexact"] += 1

    def count(exc: BaseException) -> None:
        code = getattr(exc, "code", type(exc).__name__)
        errors[str(code)] = errors.get(str(code), 0) + 1

    deadline = time.monotonic() + seconds
    async with Supervisor(
        state_dir=state_dir / "state", policies_dir=policies, docker_host=docker_host
    ) as sup:
        while time.monotonic() < deadline:
            sink = MemorySink()
            try:
                session = await sup.open_session(f"stop-{counts['rounds']}", sinks=[sink])
            except SupervisorError as exc:
                count(exc)
                await asyncio.sleep(1)
                continue
            results = await asyncio.gather(
                *(stop_race(session, sink) for _ in range(BATCH)),
                *(end_race(sup, f"end-{counts['rounds']}-{i}") for i in range(BATCH)),
                return_exceptions=True,
            )
            for r in results:
                if isinstance(r, BaseException):
                    count(r)
                elif isinstance(r, str):
                    counts["tasks"] += 1
                    if terminal(sink, r) != 1:
                        counts["inexact"] += 1
            with contextlib.suppress(SupervisorError):
                await session.end()
            counts["rounds"] += 1
    return {**counts, "errors": errors}


def engine_version(docker_host: str) -> str:
    client = docker.APIClient(base_url=docker_host, version="1.41", timeout=30)
    try:
        return str(client.version().get("Version", "?"))
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the workers race")
    parser.add_argument("--dockerd", default="dockerd", help="the dockerd binary to run")
    parser.add_argument(
        "--wedge-s", type=float, default=30.0, help="an /info slower than this is a wedge"
    )
    parser.add_argument("--workers", type=int, default=2, help="supervisors on the engine")
    parser.add_argument(
        "--worker", nargs=3, metavar=("HOST", "DIR", "SECONDS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        host, folder, secs = args.worker
        out = asyncio.run(worker(host, Path(folder), float(secs), seed=os.getpid()))
        print(json.dumps(out), flush=True)
        return 0

    engine = PrivateEngine(EngineConfig(dockerd=args.dockerd, images=("sandvisor/minimal:latest",)))
    scratch = Path(tempfile.mkdtemp(prefix="svstress-"))
    wedges: list[dict[str, Any]] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engine.start()
        engine.load_images()
        version = engine_version(engine.docker_host)
        # The suite's watchdog probe: an /info slower than --wedge-s is a wedge.
        watchdog = EngineWatchdog(args.wedge_s, docker_host=engine.docker_host)
        seconds = args.minutes * 60
        for i in range(args.workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.engine_stress",
                        "--worker",
                        engine.docker_host,
                        str(scratch / f"w{i}"),
                        str(seconds),
                    ],
                    stdout=subprocess.PIPE,
                    cwd=Path(__file__).resolve().parents[1],
                )
            )
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            took = watchdog.probe()
            if took is not None and took >= args.wedge_s:
                dump = None
                if engine.pid is not None:
                    os.kill(engine.pid, signal.SIGUSR1)
                    time.sleep(2)
                    dumps = sorted(engine.root.rglob("goroutine-stacks-*.log"))
                    if dumps:
                        dump = Path(f"/tmp/{dumps[-1].name}")
                        dump.write_bytes(dumps[-1].read_bytes())
                wedges.append(
                    {
                        "at_s": round(seconds - (end - time.monotonic()), 1),
                        "dump": str(dump) if dump else None,
                    }
                )
                print(f"wedge {len(wedges)}: restarting the engine", file=sys.stderr, flush=True)
                engine.kill()
                engine.start()
            time.sleep(2)
        watchdog.stop()  # closes its client (its thread never ran)
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 600)
            results.append(
                json.loads(out.decode().strip().splitlines()[-1])
                if out.strip()
                else {"rc": p.returncode}
            )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        engine.close()
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    summary = {
        "engine": version,
        "minutes": args.minutes,
        "workers": results,
        "tasks": sum(r.get("tasks", 0) for r in results),
        "inexact": sum(r.get("inexact", 0) for r in results),
        "wedges": wedges,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
