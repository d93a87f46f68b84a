"""Run the benchmarks: ``python -m bench.run [NAME ...] [--quick] [--out DIR]``.

Each benchmark prints its table and writes ``<out>/<name>-<timestamp>.json``; ``summary.md``
in the same folder is then rewritten from the latest result of every benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.common import (
    RESULTS,
    Ctx,
    RawDocker,
    machine_info,
    make_policies_dir,
    render_table,
    rewrite_summary,
    write_result,
)
from supervisor.core.logs import configure_logging

#: name -> module, in the order ``make bench`` runs them.
BENCHMARKS = {
    "start": "bench.start",
    "http-start": "bench.http_start",
    "burst": "bench.burst",
    "throughput": "bench.throughput",
    "latency": "bench.latency",
    "scale": "bench.scale",
    "metrics-scrape": "bench.metrics_scrape",
    "teardown": "bench.teardown",
    "stall": "bench.stall",
    "attack": "bench.attack",
    "workspace": "bench.workspace",
    "workspace-start": "bench.workspace_start",
    "dashboard": "bench.dashboard",
    "swarm": "bench.swarm",
    "terminal": "bench.terminal",
}
ALIASES = {"event-latency": "latency", "events": "latency", "under-attack": "attack"}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"results folder ({RESULTS})")
    p.add_argument(
        "--log-level", default="warning", help="supervisor log level on stderr (warning)"
    )
    args = p.parse_args(argv)
    names = [ALIASES.get(n, n) for n in args.names] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    args.names = names
    return args


async def run_all(args: argparse.Namespace, ctx: Ctx, command: str) -> int:
    machine = await asyncio.to_thread(machine_info)
    print(
        f"machine: {machine['cpu_model']} · {machine['cores']} cores · {machine['ram_gib']} GiB"
        f" · kernel {machine['kernel']} · Docker {machine['engine'].get('version')}"
        f" · load {' '.join(machine['loadavg'])}",
        flush=True,
    )
    failed = 0
    for name in args.names:
        module = importlib.import_module(BENCHMARKS[name])
        print(f"\n== {name}: {module.TITLE}{' (quick)' if args.quick else ''}", flush=True)
        started = time.time()
        # Load at this benchmark's start (the file also records it at its end).
        machine["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
        try:
            result = await module.run(ctx)
        except Exception:
            failed += 1
            traceback.print_exc()
            print(f"!! {name} failed", flush=True)
            continue
        finally:
            left = await asyncio.to_thread(ctx.raw.cleanup)
            if left:
                print(f"  (removed {left} leftover container(s))", file=sys.stderr)
        print(render_table(result))
        for note in result.notes:
            print(f"  - {note}")
        errors = {k: v for k, v in result.errors.items() if v}
        if errors:
            print(f"  errors: {errors}")
        path = write_result(
            result,
            out_dir=args.out,
            command=command,
            machine=machine,
            quick=args.quick,
            started=started,
        )
        print(f"  -> {path}  ({time.time() - started:.0f} s)", flush=True)
    summary = rewrite_summary(args.out, list(BENCHMARKS))
    print(f"\nsummary: {summary}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    configure_logging(args.log_level, json=False)
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    command = shlex.join([sys.executable, "-m", "bench.run", *argv])
    tmp = Path(tempfile.mkdtemp(prefix="sandvisor-bench-"))
    policies = make_policies_dir(tmp / "policies")
    raw = RawDocker(policies)
    ctx = Ctx(quick=args.quick, tmp=tmp, policies_dir=policies, raw=raw)
    rc = 1
    try:
        # asyncio.run turns Ctrl-C into a cancellation of run_all: every benchmark's
        # `async with` / `finally` ends its sessions and removes its raw containers.
        rc = asyncio.run(run_all(args, ctx, command))
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        rc = 130
    finally:
        left = raw.cleanup()
        if left:
            print(f"removed {left} leftover container(s)", file=sys.stderr)
        raw.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
