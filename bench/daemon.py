"""``sandvisor serve`` as a subprocess on a private state dir, for the benchmarks that measure the
daemon itself (its HTTP server, its event loop) rather than the library in-process."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.common import Ctx


class Daemon:
    """``sandvisor serve`` on a private state dir, stopped (and its tasks with it) at the end."""

    def __init__(self, ctx: Ctx, name: str, *extra: str) -> None:
        self.state = ctx.scratch(name) / "state"
        self.log = self.state.parent / "daemon.log"
        # Started as a login shell or a systemd unit starts it: with a soft nofile limit of
        # 1024 (the reproduction; the daemon raises it to the hard limit itself).
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        args = [
            "prlimit",
            f"--nofile=1024:{hard if hard != resource.RLIM_INFINITY else 'unlimited'}",
        ]
        args += ["--", sys.executable, "-m", "supervisor.interfaces.cli.main", "serve"]
        args += ["--state-dir", str(self.state), "--policies-dir", str(ctx.policies_dir)]
        args += ["--stop-tasks-on-exit", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for name in ("SANDVISOR_URL", "SANDVISOR_TOKEN"):
            env.pop(name, None)
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(args, stdout=fh, stderr=fh, env=env)
        info_file = self.state / "daemon" / "daemon.json"
        deadline = time.monotonic() + 60
        while not info_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"sandvisor serve did not start:\n{self.log.read_text()[-2000:]}"
                )
            time.sleep(0.05)
        self.socket = Path(json.loads(info_file.read_text())["socket"])
        self.token = (self.state / "daemon" / "admin.token").read_text().strip()

    def client(self, token: str | None = None, timeout: float = 120) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://sandvisor",
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=timeout,
        )

    def session(self, sid: str) -> str:
        with self.client() as c:
            r = c.post("/sessions", json={"session_id": sid})
            r.raise_for_status()
            token: str = r.json()["token"]
            return token

    def connect(self) -> socket.socket:
        """A raw connection to the unix socket (waiting while the listen queue is full)."""
        deadline = time.monotonic() + 30
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            try:
                s.connect(str(self.socket))
                return s
            except BlockingIOError:
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
