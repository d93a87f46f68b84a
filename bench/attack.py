"""attack: one client's ``/healthz`` and task start while another client attacks the daemon
(a catastrophic regex, wait-for over a 300 MB line, 1000 half-open connections), next to
the same client on the same daemon idle, in the same run.

The daemon runs as ``sandvisor serve`` (a subprocess on a private state dir): the attacks are on
its HTTP server and its event loop, which the in-process benchmarks never touch. Phases:
idle, each attack alone, all three at once, idle again; the victim samples throughout and
each sample counts for the phase it started in. Setup between phases is not measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import httpx

from bench.common import Ctx, Progress, Result, percentile, row
from bench.daemon import Daemon

NAME = "attack"
TITLE = "one client's /healthz and task start while another attacks the daemon (sandvisor serve)"
POLICY = "bench"
#: The pattern from issue 14: nested quantifiers, exponential for a backtracking engine on a
#: run of ``a`` that ends without a match.
EVIL_PATTERN = "(a+)+$"
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: sandvisor\r\n"


@dataclass
class Plan:
    """Sizes of one run (``--quick``: a smoke version)."""

    window_s: float
    regex_as: int
    line_bytes: int
    line_waiters: int
    half_open: int
    healthz_every_s: float = 0.05
    start_every_s: float = 1.0

    @classmethod
    def for_run(cls, quick: bool) -> Plan:
        if quick:
            return cls(
                window_s=2.0, regex_as=18, line_bytes=5_000_000, line_waiters=2, half_open=100
            )
        return cls(
            window_s=15.0, regex_as=25, line_bytes=300_000_000, line_waiters=5, half_open=1000
        )


# -- the daemon ------------------------------------------------------------------------------


# -- the victim --------------------------------------------------------------------------------


@dataclass
class Victim:
    """Samples /healthz and task starts on its own connections, tagged with the phase."""

    daemon: Daemon
    plan: Plan
    token: str
    phase: str = "setup"
    samples: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self, kind: str, every: float, call: Callable[[httpx.Client], bool]) -> None:
        with self.daemon.client(self.token, timeout=60) as c:
            while not self.stop.is_set():
                phase = self.phase
                t0 = time.perf_counter()
                try:
                    ok = call(c)
                except httpx.HTTPError:
                    ok = False
                took = time.perf_counter() - t0
                if ok:
                    self.samples[(phase, kind)].append(took * 1000)
                else:
                    self.errors[f"{kind} ({phase})"] += 1
                self.stop.wait(max(0.0, every - took))

    def run(self) -> list[threading.Thread]:
        # The admin's /healthz, the full answer (engine and load): with the session's token
        # it is liveness only, which does less work than the bench has always measured.
        admin = {"Authorization": f"Bearer {self.daemon.token}"}

        def healthz(c: httpx.Client) -> bool:
            return c.get("/healthz", headers=admin).status_code == 200

        def start(c: httpx.Client) -> bool:
            r = c.post("/sessions/victim/tasks", json={"command": "true", "policy": POLICY})
            return r.status_code == 201

        threads = [
            threading.Thread(
                target=self._loop, args=("healthz", self.plan.healthz_every_s, healthz)
            ),
            threading.Thread(target=self._loop, args=("start", self.plan.start_every_s, start)),
        ]
        for t in threads:
            t.start()
        return threads


# -- the attacks ---------------------------------------------------------------------------------


class Attack:
    """Threads that attack until ``stop`` is set."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.calls = 0

    def spawn(self, target: Callable[[], None], n: int = 1) -> None:
        for _ in range(n):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def join(self, timeout_s: float = 180) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))


def _task(c: httpx.Client, command: str) -> str:
    r = c.post("/sessions/attacker/tasks", json={"command": command, "policy": POLICY})
    r.raise_for_status()
    tid: str = r.json()["task_id"]
    return tid


def _wait_for_loop(
    attack: Attack, c: httpx.Client, tid: str, pattern: str, timeout_s: float
) -> None:
    while not attack.stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            c.post(
                f"/sessions/attacker/tasks/{tid}/wait-for",
                json={"pattern": pattern, "timeout_s": timeout_s},
            )
        attack.calls += 1


def regex_attack(daemon: Daemon, token: str, plan: Plan, tids: dict[str, str]) -> Attack:
    """``wait-for (a+)+$`` with a 2 s timeout, over and over, on a line of ``a``s and ``!``."""
    attack = Attack()
    client = daemon.client(token, timeout=600)
    attack.spawn(lambda: _wait_for_loop(attack, client, tids["regex"], EVIL_PATTERN, 2.0))
    return attack


def line_attack(daemon: Daemon, token: str, plan: Plan, tids: dict[str, str]) -> Attack:
    """Parallel ``wait-for`` (5 s) of a pattern that is not there, over a single 300 MB line."""
    attack = Attack()
    for _ in range(plan.line_waiters):
        client = daemon.client(token, timeout=600)
        attack.spawn(lambda c=client: _wait_for_loop(attack, c, tids["line"], "b", 5.0))  # type: ignore[misc]
    return attack


def half_open_attack(daemon: Daemon, token: str, plan: Plan, tids: dict[str, str]) -> Attack:
    """``plan.half_open`` connections that send half a request and stay silent; each one the
    daemon closes (its header deadline) is opened again at once."""
    attack = Attack()

    def hold() -> None:
        sel = selectors.DefaultSelector()

        def open_one() -> None:
            s = daemon.connect()
            s.sendall(PARTIAL_HEAD)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)

        for _ in range(plan.half_open):
            open_one()
        while not attack.stop.is_set():
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                sel.unregister(s)
                s.close()
                attack.calls += 1  # closed by the daemon: reopen
                with contextlib.suppress(OSError):
                    open_one()
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()

    attack.spawn(hold)
    return attack


Launcher = Callable[[Daemon, str, Plan, dict[str, str]], Attack]


# -- the run ---------------------------------------------------------------------------------------


def _setup(daemon: Daemon, token: str, plan: Plan) -> dict[str, str]:
    """The attacker's tasks: one printing the regex's victim line, one printing a single line
    of ``plan.line_bytes`` bytes (waited for until it is all in the output file)."""
    with daemon.client(token) as c:
        regex_tid = _task(c, f"printf '{'a' * plan.regex_as}!\\n'; exec sleep 3600")
        line_tid = _task(c, f"head -c {plan.line_bytes} /dev/zero | tr '\\0' a; exec sleep 3600")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            info = c.get(f"/sessions/attacker/tasks/{line_tid}").json()
            if info["output_bytes"] >= plan.line_bytes:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the {plan.line_bytes}-byte line did not arrive in 300 s")
    return {"regex": regex_tid, "line": line_tid}


PHASES: list[tuple[str, list[str]]] = [
    ("idle", []),
    ("catastrophic regex", ["regex"]),
    ("300 MB line wait-for", ["line"]),
    ("half-open connections", ["half-open"]),
    ("all three", ["regex", "line", "half-open"]),
    ("idle again", []),
]
LAUNCHERS: dict[str, Launcher] = {
    "regex": regex_attack,
    "line": line_attack,
    "half-open": half_open_attack,
}


def _scenario(ctx: Ctx, plan: Plan) -> tuple[Victim, dict[str, int], float]:
    daemon = Daemon(ctx, NAME)
    try:
        victim = Victim(daemon, plan, daemon.session("victim"))
        attacker = daemon.session("attacker")
        threads = victim.run()
        calls: dict[str, int] = {}
        prog = Progress("attack: phases", len(PHASES))
        tids: dict[str, str] = {}
        try:
            for name, attacks in PHASES:
                if attacks and not tids:
                    victim.phase = "setup"
                    tids = _setup(daemon, attacker, plan)
                running = []
                for key in attacks:
                    running.append((key, LAUNCHERS[key](daemon, attacker, plan, tids)))
                if running:
                    time.sleep(0.5)  # let the attack take hold before it is measured
                victim.phase = name
                time.sleep(plan.window_s)
                victim.phase = "setup"
                for key, attack in running:
                    attack.join()
                    calls[f"{key} ({name})"] = attack.calls
                prog.step(extra=name)
        finally:
            victim.stop.set()
            for t in threads:
                t.join(120)
        rss = _rss_mb(daemon.proc.pid)
        return victim, calls, rss
    finally:
        daemon.stop()
        _remove_leftovers()


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _remove_leftovers() -> None:
    """Containers of this benchmark's sessions the daemon did not stop (it was killed)."""
    client = docker.APIClient(version="auto", timeout=60)
    try:
        for sid in ("victim", "attacker"):
            for c in client.containers(
                all=True, filters={"label": f"io.sandvisor.session-id={sid}"}
            ):
                with contextlib.suppress(docker.errors.APIError):
                    client.remove_container(c["Id"], force=True)
    finally:
        client.close()


async def run(ctx: Ctx) -> Result:
    plan = Plan.for_run(ctx.quick)
    res = Result(NAME, TITLE, percentiles=("p50", "p95", "p99"))
    res.config = {
        "window_s": plan.window_s,
        "phases": [name for name, _ in PHASES],
        "regex": f"{EVIL_PATTERN} over one line of {plan.regex_as} 'a' and '!' (timeout_s 2)",
        "long_line": f"{plan.line_waiters} parallel wait-for (timeout_s 5) over "
        f"{plan.line_bytes} bytes, no newline",
        "half_open": f"{plan.half_open} connections on the unix socket: half a request line, "
        "then silence",
        "victim": f"GET /healthz every {plan.healthz_every_s * 1000:.0f} ms, POST a task "
        f"(true) every {plan.start_every_s:g} s, own connections",
        "policy": POLICY,
    }
    victim, calls, rss = await asyncio.to_thread(_scenario, ctx, plan)
    s = victim.samples
    idle = s[("idle", "healthz")] + s[("idle again", "healthz")]
    idle_start = s[("idle", "start")] + s[("idle again", "start")]
    res.rows.append(row("/healthz, idle", "ms", idle))
    for name, _ in PHASES[1:-1]:
        got = s[(name, "healthz")]
        target, passed = "", None
        if name == "all three":
            target, passed = "p99 < 100 ms", bool(got) and percentile(got, 99) < 100
        res.rows.append(
            row(
                f"/healthz, {name}",
                "ms",
                got,
                baseline="idle",
                base=idle,
                target=target,
                passed=passed,
            )
        )
    res.rows.append(row("task start (POST -> 201), idle", "ms", idle_start))
    for name in (
        "catastrophic regex",
        "300 MB line wait-for",
        "half-open connections",
        "all three",
    ):
        got = s[(name, "start")]
        target, passed = "", None
        if name == "all three":
            target, passed = "max < 1 s", bool(got) and max(got) < 1000
        res.rows.append(
            row(
                f"task start, {name}",
                "ms",
                got,
                baseline="idle",
                base=idle_start,
                target=target,
                passed=passed,
            )
        )
    res.rows.append(row("daemon peak RSS (VmHWM)", "MB", rss))
    res.errors = dict(victim.errors)
    res.samples = {f"{phase}/{kind}": [round(v, 3) for v in vs] for (phase, kind), vs in s.items()}
    res.config["attack_calls"] = calls
    res.notes.append(
        "The victim uses its own session and its own connections to the same unix socket as "
        "the attacker. Each sample counts for the phase it started in; a sample that fails "
        "(timeout, error status) is counted in errors, not in the table. A phase ends only "
        "when its attack threads have returned (a blocked wait-for may outlast the window)."
    )
    res.notes.append(
        "The regex and long-line attacks depend on how the runtime matches wait-for patterns "
        "(on the event loop with `re`, or off it with a linear-time matcher and a deadline); "
        "the half-open one on the daemon's header deadline and connection cap."
    )
    return res
