"""The suite's engine watchdog: a wedged engine ends the run fast, with dockerd's goroutine dump.

A deadlocked engine (Docker 20.10's libnetwork, moby #46661/#44682) answers ``/_ping`` but
never completes an operation. Without this every later test would wait for pytest's 300 s
timeout, and a run would spend CI's whole budget failing one test at a time.

A daemon thread asks the engine for ``/info`` (which the deadlock blocks, as it does
container inspect, kill and remove) every ``PERIOD_S``. When one answer takes longer than
``SANDVISOR_TEST_WEDGE_S`` (default 120 s, far above a loaded 2-core machine's worst), the
thread asks dockerd for its goroutine dump (SIGUSR1, only to the engine this run's
``scripts/engine.sh`` started or the one at ``/var/run/docker.pid``), prints where the dump
is and the stacks that wait on a lock, and interrupts the main thread (SIGUSR2, whose
handler calls ``pytest.exit``): pytest stops with its summary and exit status 3, instead of
hanging.

An engine that does not answer at all is *down*, not wedged: the tests that need it fail
on their own, quickly.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.tooling.engine_owner import alive, cmdline, is_dockerd

PERIOD_S = 10.0
#: The watchdog interrupts the main thread with this (pytest-timeout uses SIGALRM).
STOP_SIGNAL = signal.SIGUSR2
#: The run's exit status when the watchdog stopped it.
EXIT_WEDGED = 3
WEDGE_S = float(os.environ.get("SANDVISOR_TEST_WEDGE_S", "120"))
#: Where the watched dockerd's pid is: the engine scripts/engine.sh started, or the system's.
PIDFILES = tuple(
    Path(p)
    for p in os.environ.get(
        "SANDVISOR_TEST_DOCKERD_PIDFILE",
        "/var/run/sandvisor-engine/dockerd.pid:/var/run/docker.pid",
    ).split(":")
)
DUMP_DIRS = (Path("/var/run/docker"), Path("/var/lib/docker"))


class EngineWatchdog:
    """Probes the engine from a thread; ``wedged`` holds what it saw once it gives up."""

    def __init__(
        self, wedge_s: float = WEDGE_S, period_s: float = PERIOD_S, docker_host: str | None = None
    ) -> None:
        self.docker_host = docker_host or os.environ.get(
            "DOCKER_HOST", "unix:///var/run/docker.sock"
        )
        self.wedge_s = wedge_s
        self.period_s = period_s
        self.wedged: str | None = None
        self._client: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._client is not None:
            self._client.close()

    def probe(self) -> float | None:
        """Seconds ``/info`` took; None when the engine does not answer at all (down)."""
        import docker  # noqa: PLC0415
        import requests  # noqa: PLC0415

        started = time.monotonic()
        try:
            if self._client is None:
                # The API version is asked once, while the engine answers: a wedged engine
                # would block the question itself.
                self._client = docker.APIClient(
                    base_url=self.docker_host,
                    version="auto",
                    timeout=self.wedge_s,
                )
            self._client.info()
        except requests.exceptions.ReadTimeout:
            return time.monotonic() - started
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return None
        return time.monotonic() - started

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            took = self.probe()
            if took is not None and took >= self.wedge_s:
                self.wedged = self._report(took)
                # A signal of our own, not SIGINT: a run started in the background (CI's)
                # inherits SIGINT ignored, and Python then never installs its handler.
                signal.pthread_kill(threading.main_thread().ident or 0, STOP_SIGNAL)
                return

    def _report(self, took: float) -> str:
        lines = [
            f"engine wedged: `docker info` did not answer within {took:.0f} s "
            "(the engine answers /_ping but completes no operation).",
            "Restart it: `make engine-down engine` (the engine scripts/engine.sh started).",
        ]
        dump = goroutine_dump()
        if dump is None:
            lines.append("no goroutine dump: no dockerd pid file this run may signal")
        else:
            lines.append(f"dockerd's goroutine dump: {dump}")
            lines += [f"  {line}" for line in waiting_stacks(dump)]
        text = "\n".join(lines)
        print(f"\n{text}", file=sys.stderr, flush=True)
        return text


def goroutine_dump(wait_s: float = 10.0) -> Path | None:
    """Ask dockerd for its goroutine dump (SIGUSR1); the file it wrote, or None."""
    pid = None
    for pidfile in PIDFILES:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if alive(pid) and is_dockerd(cmdline(pid)):  # the rule engine.sh and doctor use
            break
        pid = None
    if pid is None:
        return None
    before = time.time()
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        dumps = [
            p
            for d in DUMP_DIRS
            if d.is_dir()
            for p in d.glob("goroutine-stacks-*.log")
            if p.stat().st_mtime >= before - 1
        ]
        if dumps:
            return max(dumps, key=lambda p: p.stat().st_mtime)
        time.sleep(0.2)
    return None


def waiting_stacks(dump: Path, limit: int = 40) -> list[str]:
    """The headers of goroutines blocked for minutes, with their first engine frame."""
    out: list[str] = []
    blocks = dump.read_text(errors="replace").split("\n\n")
    for block in blocks:
        head, _, rest = block.partition("\n")
        if "minutes]" not in head:
            continue
        frame = next((ln.strip() for ln in rest.splitlines() if "docker/docker" in ln), "")
        out.append(f"{head.strip()} {frame}")
        if len(out) >= limit:
            break
    return out


@pytest.fixture(scope="session", autouse=True)
def engine_watchdog() -> Iterator[EngineWatchdog | None]:
    """Watch the engine for the whole run when one answers at its start."""
    dog = EngineWatchdog()
    if dog.probe() is None:
        yield None
        return

    def stop_the_run(signum: int, frame: object) -> None:
        del signum, frame
        pytest.exit(f"the run was stopped by the engine watchdog:\n{dog.wedged}", EXIT_WEDGED)

    before = signal.signal(STOP_SIGNAL, stop_the_run)
    dog.start()
    try:
        yield dog
    finally:
        dog.stop()
        signal.signal(STOP_SIGNAL, before)
