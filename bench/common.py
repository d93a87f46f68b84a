"""Shared benchmark plumbing: statistics, tables, result files, machine info, policies, raw
Docker baselines (docker-py and a raw asyncio attach stream) and supervisor helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.utils.socket

from supervisor import Supervisor, TaskSpec
from supervisor.core.demux import FrameDemux
from supervisor.core.labels import LABEL_KIND, LABEL_OWNER, LABEL_PREFIX
from supervisor.core.policy import PolicySet
from supervisor.core.resolve import container_request, resolve
from supervisor.engine.docker import attach_request, request_to_config
from supervisor.engine.docker.http import read_head
from supervisor.engine.endpoint import Endpoint
from supervisor.runtime.session import Session

REPO = Path(__file__).resolve().parent.parent
POLICIES = REPO / "policies"
RESULTS = Path(__file__).resolve().parent / "results"
PID = os.getpid()
#: Every container a benchmark creates without the supervisor carries this label, so the
#: benchmark (and tests/conftest.py's leftover check) can find and remove exactly its own.
TEST_LABEL = LABEL_PREFIX + "test"
#: Where the supervisor records its owner's pid and a task's session.
OWNER_PID_LABEL = LABEL_OWNER + ".pid"
SESSION_LABEL = LABEL_PREFIX + "session"

#: Benchmark policies, added to a private copy of policies/. Monitor limits are generous so
#: rate limiting never interferes with a measurement; the batch window stays the default
#: 200 ms (the latency benchmark spaces its lines wider than that).
BENCH_POLICIES = {
    "bench": """
description = "bench: busybox image, 1 s grace, 4 GiB output cap, no rate limits"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[limits]
output_cap_bytes = 4294967296
[timeouts]
grace_s = 1.0
[monitor]
lines_per_s = 1000000.0
burst_lines = 10000000
[session]
max_running_tasks = 2000
""",
    "bench-warm": """
description = "bench: like bench, with a warm pool of 4"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
warm_pool = 4
[limits]
output_cap_bytes = 4294967296
[timeouts]
grace_s = 1.0
[monitor]
lines_per_s = 1000000.0
burst_lines = 10000000
[session]
max_running_tasks = 2000
""",
    "bench-debian": """
description = "bench: Debian image (python3), 1 s grace, no rate limits"
image = "sandvisor/debian:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 1.0
[monitor]
lines_per_s = 1000000.0
burst_lines = 10000000
[session]
max_running_tasks = 2000
""",
}


# -- statistics -------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, min, p50, p95, p99, max, mean of ``values``."""
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0}
    return {
        "n": len(vals),
        "min": min(vals),
        "p50": percentile(vals, 50),
        "p95": percentile(vals, 95),
        "p99": percentile(vals, 99),
        "max": max(vals),
        "mean": sum(vals) / len(vals),
    }


@dataclass
class Row:
    """One line of a result table: our figure next to its baseline, measured in the same run."""

    metric: str
    unit: str
    ours: dict[str, float]
    baseline: str = ""
    base: dict[str, float] | None = None
    ratio: float | None = None
    """ours p50 / baseline p50."""
    target: str = ""
    passed: bool | None = None
    note: str = ""
    higher_is_better: bool = False


def row(
    metric: str,
    unit: str,
    ours: Sequence[float] | float,
    *,
    baseline: str = "",
    base: Sequence[float] | float | None = None,
    target: str = "",
    passed: bool | None = None,
    note: str = "",
    higher_is_better: bool = False,
) -> Row:
    """A row from samples (or one value); the ratio is computed from the medians."""
    ours_s = summarize([ours] if isinstance(ours, int | float) else ours)
    base_s = None
    if base is not None:
        base_s = summarize([base] if isinstance(base, int | float) else base)
    ratio = None
    if base_s and base_s.get("n") and ours_s.get("n") and base_s["p50"]:
        ratio = ours_s["p50"] / base_s["p50"]
    return Row(
        metric, unit, ours_s, baseline, base_s, ratio, target, passed, note, higher_is_better
    )


@dataclass
class Result:
    """What one benchmark hands back: its table, its raw samples and what it noticed."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    samples: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    percentiles: tuple[str, ...] = ("p50", "p95")
    """Which percentiles the table shows (the JSON keeps all of them)."""


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if float(value).is_integer() and abs(value) < 1e6:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table_head(result: Result) -> list[str]:
    pcts = result.percentiles
    return [
        "metric",
        "unit",
        *(f"ours {p}" for p in pcts),
        "baseline",
        *(f"base {p}" for p in pcts),
        "ratio (p50)",
        "target",
    ]


def table_rows(result: Result) -> list[list[str]]:
    out = []
    for r in result.rows:
        target = r.target
        if r.passed is not None:
            target = f"{target} {'PASS' if r.passed else 'MISS'}".strip()
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        base = r.base
        out.append(
            [
                r.metric + (f" (n={int(r.ours['n'])})" if r.ours.get("n", 0) > 1 else ""),
                r.unit,
                *(_fmt(r.ours.get(p)) for p in result.percentiles),
                r.baseline or "-",
                *((_fmt(base.get(p)) if base else "-") for p in result.percentiles),
                ratio,
                target or "-",
            ]
        )
    return out


def render_table(result: Result) -> str:
    """A plain-text table for the terminal."""
    head = table_head(result)
    rows = [head, *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) for j, c in enumerate(r)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(result: Result) -> str:
    rows = table_rows(result)
    head = table_head(result)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


# -- machine info -------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, kernel, engine version, Python, load: what the numbers ran on."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem_kb = next(
        (
            int(line.split()[1])
            for line in _read("/proc/meminfo").splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    info: dict[str, Any] = {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "docker_py": docker.__version__,
        "loadavg": _read("/proc/loadavg").split()[:3],
        "hostname": socket.gethostname(),
    }
    try:
        client = engine_client(timeout=10)
        ver = client.version()
        dinfo = client.info()
        info["engine"] = {
            "version": ver.get("Version"),
            "api_version": ver.get("ApiVersion"),
            "storage_driver": dinfo.get("Driver"),
            "logging_driver": dinfo.get("LoggingDriver"),
            "cgroup_version": dinfo.get("CgroupVersion"),
            "default_runtime": dinfo.get("DefaultRuntime"),
            "containers_running": dinfo.get("ContainersRunning"),
        }
        client.close()
    except Exception as exc:
        info["engine"] = {"error": str(exc)}
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "supervisor"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
        info["git"] = head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        info["git"] = "?"
    return info


# -- context ---------------------------------------------------------------------------


class Progress:
    """Progress on stderr: a rewritten line on a terminal, a line per ~10% otherwise."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self._tty = sys.stderr.isatty()
        self._last_decile = -1
        self._t0 = time.monotonic()

    def step(self, n: int = 1, extra: str = "") -> None:
        self.done += n
        text = f"  [{self.label}] {self.done}/{self.total} {extra}".rstrip()
        if self._tty:
            sys.stderr.write("\r\x1b[K" + text)
            sys.stderr.flush()
            if self.done >= self.total:
                sys.stderr.write("\n")
            return
        decile = self.done * 10 // self.total
        if decile != self._last_decile:
            self._last_decile = decile
            print(f"{text} ({time.monotonic() - self._t0:.0f} s)", file=sys.stderr, flush=True)


def say(msg: str) -> None:
    """A status line on stderr (tables go to stdout)."""
    print(f"  {msg}", file=sys.stderr, flush=True)


@dataclass
class Ctx:
    """What a benchmark gets from run.py."""

    quick: bool
    tmp: Path
    """Private scratch folder (state dirs, policies); removed by run.py."""
    policies_dir: Path
    raw: RawDocker
    _counter: int = 0

    def scratch(self, name: str) -> Path:
        self._counter += 1
        path = self.tmp / f"{name}-{self._counter}"
        path.mkdir(parents=True)
        return path

    @contextlib.asynccontextmanager
    async def supervisor(self, name: str, **kwargs: Any) -> AsyncIterator[Supervisor]:
        """A fresh supervisor on a private state dir; never sweeps other owners' containers."""
        state = self.scratch(name) / "state"
        async with Supervisor(
            state_dir=state, policies_dir=self.policies_dir, sweep_orphans=False, **kwargs
        ) as sup:
            yield sup
        shutil.rmtree(state, ignore_errors=True)


def make_policies_dir(target: Path) -> Path:
    """The shipped policies plus the bench ones, in ``target``."""
    shutil.copytree(POLICIES, target)
    for name, text in BENCH_POLICIES.items():
        (target / f"{name}.toml").write_text(text)
    return target


# -- raw Docker baselines -----------------------------------------------------------------


def engine_client(**kwargs: Any) -> Any:
    """A docker-py client for the engine the supervisor uses ($DOCKER_HOST)."""
    endpoint = Endpoint(None)
    return docker.APIClient(base_url=endpoint.url, version="auto", tls=bool(endpoint.ssl), **kwargs)


class RawDocker:
    """Containers made with docker-py directly, hardened exactly like the supervisor's (the
    same ``request_to_config`` on a request built the same way), labeled ``io.sandvisor.test``."""

    def __init__(self, policies_dir: Path, max_pool_size: int = 32) -> None:
        self.policies = PolicySet(policies_dir)
        #: The engine the supervisor's DockerBackend would use ($DOCKER_HOST).
        self.endpoint = Endpoint(None)
        if not self.endpoint.local:
            raise SystemExit(f"the benchmarks need a local engine, not {self.endpoint.url}")
        self.client = engine_client(timeout=120, max_pool_size=max_pool_size)
        self.api_version = self.client.api_version
        self._n = 0

    def config(
        self, command: str, policy: str = "bench", *, stdin: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """The engine body for ``command`` under ``policy``, and a unique container name."""
        pol = self.policies.get(policy)
        eff = resolve(TaskSpec(command=command, policy=policy, stdin=stdin), pol)
        self._n += 1
        name = f"sandvisor-bench-{PID}-{self._n}-{os.urandom(3).hex()}"
        req = container_request(
            name=name,
            command=command,
            eff=eff,
            labels={TEST_LABEL: str(PID), LABEL_PREFIX + "bench": "raw"},
            network="none",
            workspace=(),
        )
        return request_to_config(req), name

    def create(self, command: str, policy: str = "bench", *, stdin: str | None = None) -> str:
        config, name = self.config(command, policy, stdin=stdin)
        return str(self.client.create_container_from_config(config, name)["Id"])

    def attach_socket(self, cid: str, *, stdin: bool = True) -> Any:
        return self.client.attach_socket(
            cid,
            params={"stdin": int(stdin), "stdout": 1, "stderr": 1, "stream": 1, "logs": 0},
        )

    def remove(self, cid: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.client.remove_container(cid, force=True, v=True)

    def start_to_first_byte(self, command: str = "echo x", policy: str = "bench") -> float:
        """create + raw attach + start -> first payload byte, in seconds (then removes it)."""
        t0 = time.perf_counter()
        elapsed, cid = self.start_to_first_byte_at(command, policy)
        self.remove(cid)
        return elapsed - t0

    def start_to_first_byte_at(self, command: str, policy: str = "bench") -> tuple[float, str]:
        """create + attach + start; returns (perf_counter at the first byte, container id)."""
        cid = self.create(command, policy)
        try:
            sock = self.attach_socket(cid, stdin=True)
            try:
                self.client.start(cid)
                read_first_payload(sock)
                t1 = time.perf_counter()
            finally:
                with contextlib.suppress(OSError):
                    sock.close()
        except BaseException:
            self.remove(cid)
            raise
        return t1, cid

    def ours(self) -> list[dict[str, Any]]:
        return list(self.client.containers(all=True, filters={"label": f"{TEST_LABEL}={PID}"}))

    def cleanup(self) -> int:
        """Remove every container this process labeled (raw ones and, by owner pid, the
        supervisor's). Returns how many were left."""
        rows = self.ours()
        with contextlib.suppress(docker.errors.APIError):
            rows += self.client.containers(all=True, filters={"label": f"{OWNER_PID_LABEL}={PID}"})
        for r in rows:
            with contextlib.suppress(docker.errors.APIError):
                self.client.remove_container(r["Id"], force=True, v=True)
        return len(rows)

    def pool_memory_mb(self) -> tuple[float, float]:
        """What one warm container waiting in a pool costs in memory, in MB (means; NaN when
        there is none): inside it (engine stats, page cache excluded), and on the host its
        containerd shim (PSS, so pages shared with other shims are split among them)."""
        inside: list[float] = []
        shim: list[float] = []
        mine = [f"{LABEL_KIND}=pooled", f"{OWNER_PID_LABEL}={PID}"]
        ids = [c["Id"] for c in self.client.containers(filters={"label": mine})]
        for cid in ids:
            stats = self.client.stats(cid, stream=False)
            mem = stats.get("memory_stats", {})
            cache = mem.get("stats", {}).get("inactive_file", 0)
            inside.append((mem.get("usage", 0) - cache) / 2**20)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                args = (proc / "cmdline").read_bytes().split(b"\0")
                if b"containerd-shim" in args[0] and any(i.encode() in args for i in ids):
                    for line in (proc / "smaps_rollup").read_text().splitlines():
                        if line.startswith("Pss:"):
                            shim.append(int(line.split()[1]) / 1024)

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else float("nan")

        return mean(inside), mean(shim)

    def count_session(self, session_id: str) -> int:
        return len(
            self.client.containers(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def read_first_payload(sock: Any) -> None:
    """Block until the first payload byte of a multiplexed attach stream arrives (the
    engine's framing decoded by supervisor.core.demux, as the supervisor does)."""
    demux = FrameDemux()
    while True:
        chunk = docker.utils.socket.read(sock, 4096)
        if not chunk:
            raise EOFError("attach stream ended before any output")
        if any(len(piece) for _, piece in demux.feed_views(chunk)):
            return


class CountingDemux:
    """The engine's stream framing (supervisor.core.demux) counting payload bytes, no copies."""

    def __init__(self) -> None:
        self._demux = FrameDemux()
        self.payload = 0

    def feed(self, data: bytes) -> None:
        self.payload += sum(len(piece) for _, piece in self._demux.feed_views(data))


class LineDemux:
    """The engine's stream framing returning complete payload lines (small streams)."""

    def __init__(self) -> None:
        self._demux = FrameDemux()
        self._partial = b""

    def feed(self, data: bytes) -> list[bytes]:
        pieces = self._demux.feed(data)
        if not pieces:
            return []
        buf = self._partial + b"".join(piece for _, piece in pieces)
        *lines, self._partial = buf.split(b"\n")
        return lines


async def raw_attach(
    raw: RawDocker, cid: str, *, stdin: bool = True
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A hijacked attach connection opened with plain asyncio streams (no docker-py, not the
    supervisor's BufferedProtocol): the supervisor's attach request, read with a StreamReader."""
    reader, writer = await raw.endpoint.connect()
    writer.write(attach_request(f"/v{raw.api_version}", cid, stdin=stdin, logs=False))
    await writer.drain()
    status, _ = await read_head(reader)
    if status not in (101, 200):
        writer.close()
        raise RuntimeError(f"attach {cid[:12]}: HTTP {status}")
    return reader, writer


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 2)


# -- supervisor helpers -------------------------------------------------------------------


async def first_output(session: Session, task_id: str, timeout_s: float = 60.0) -> bool:
    """Wait (without polling) until the task's output file has its first byte."""
    await session.wait_output(task_id, 0, timeout_s)
    return (await session.get(task_id)).output_bytes > 0


async def wait_all_running(
    session: Session, task_ids: Iterable[str], timeout_s: float, progress: Progress | None = None
) -> tuple[int, int]:
    """Wait until every task runs (or has ended). Returns (running, ended-or-failed)."""
    ids = set(task_ids)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = 0
    while True:
        infos = [i for i in await session.list() if i.task_id in ids]
        running = sum(1 for i in infos if i.status == "running")
        ended = sum(1 for i in infos if i.ended)
        if progress is not None and running + ended > seen:
            progress.step(running + ended - seen)
            seen = running + ended
        if running + ended >= len(ids) or loop.time() > deadline:
            return running, ended
        await asyncio.sleep(0.1)


async def wait_done(session: Session, task_ids: Iterable[str], timeout_s: float = 60.0) -> None:
    """Wait until each task has ended and its container is removed."""

    async def one(tid: str) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.task_runner(tid).done.wait(), timeout_s)

    await asyncio.gather(*(one(t) for t in task_ids))


async def offload(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


# -- result files ---------------------------------------------------------------------------


def write_result(
    result: Result,
    *,
    out_dir: Path,
    command: str,
    machine: dict[str, Any],
    quick: bool,
    started: float,
) -> Path:
    """``<out_dir>/<name>-<timestamp>.json`` with the table, samples, machine and command."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    payload = {
        "name": result.name,
        "title": result.title,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "quick": quick,
        "command": command,
        "cwd": os.getcwd(),
        "machine": {**machine, "loadavg_end": _read("/proc/loadavg").split()[:3]},
        "config": result.config,
        "percentiles": list(result.percentiles),
        "rows": [asdict(r) for r in result.rows],
        "errors": result.errors,
        "notes": result.notes,
        "samples": result.samples,
    }
    path = out_dir / f"{result.name}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path


def _summary_sections(path: Path) -> dict[str, str]:
    """The ``## name: title`` sections of an existing summary, by benchmark name."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    sections: dict[str, str] = {}
    for part in text.split("\n## ")[1:]:
        name = part.split(":", 1)[0].strip()
        if name:
            sections[name] = "## " + part
    return sections


def rewrite_summary(out_dir: Path, order: Sequence[str]) -> Path:
    """``summary.md`` from the latest result of each benchmark (a full run wins over a newer
    quick one). A benchmark with no result file here keeps its section from the summary as
    it was (the JSON files are not committed, so a checkout has only the summary)."""
    out_dir.mkdir(parents=True, exist_ok=True)  # every benchmark may have failed
    kept = _summary_sections(out_dir / "summary.md")
    latest: dict[str, dict[str, Any]] = {}
    for path in sorted(out_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        name = data.get("name")
        if not name:
            continue
        prev = latest.get(name)
        key = (not data.get("quick"), data.get("timestamp", ""))
        if prev is None or key > (not prev.get("quick"), prev.get("timestamp", "")):
            data["_file"] = path.name
            latest[name] = data
    lines = [
        "# Benchmark summary",
        "",
        "Rewritten by `python -m bench.run` from the latest result of each benchmark in this",
        "folder (the JSON files themselves are not committed). Ratios are ours / baseline",
        "(medians), both measured in the same run, interleaved. See bench/README.md.",
        "",
    ]
    known = set(latest) | set(kept)
    names = [n for n in order if n in known] + sorted(known - set(order))
    for name in names:
        if name not in latest:
            lines += [kept[name].rstrip(), ""]
            continue
        data = latest[name]
        m = data.get("machine", {})
        eng = m.get("engine", {})
        res = Result(name, data.get("title", name))
        res.percentiles = tuple(data.get("percentiles") or ("p50", "p95"))
        res.rows = [Row(**r) for r in data.get("rows", [])]
        lines += [
            f"## {name}: {data.get('title', '')}",
            "",
            f"{data.get('timestamp')} · {'QUICK smoke run · ' if data.get('quick') else ''}"
            f"`{data.get('command')}` · {data.get('_file')}",
            "",
            f"{m.get('cpu_model')} · {m.get('cores')} cores · {m.get('ram_gib')} GiB · kernel "
            f"{m.get('kernel')} · Docker {eng.get('version')} ({eng.get('storage_driver')}, "
            f"cgroup v{eng.get('cgroup_version')}) · load {' '.join(m.get('loadavg', []))} → "
            f"{' '.join(m.get('loadavg_end', []))} · git {m.get('git')}",
            "",
            markdown_table(res),
            "",
        ]
        errors = {k: v for k, v in (data.get("errors") or {}).items() if v}
        if errors:
            lines += [f"Errors: {json.dumps(errors)}", ""]
        for note in data.get("notes", []):
            lines.append(f"- {note}")
        if data.get("notes"):
            lines.append("")
    path = out_dir / "summary.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
