"""A real daemon (``sandvisor serve`` as a subprocess) for end-to-end tests through real clients."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import require_engine

REPO = Path(__file__).resolve().parents[2]
SANDVISOR = [sys.executable, "-m", "supervisor.interfaces.cli.main"]


@dataclass
class Daemon:
    """A running ``sandvisor serve``: where it listens and how to authenticate."""

    proc: subprocess.Popen[bytes]
    state_dir: Path
    socket: Path
    token: str
    tcp: str | None
    log: Path
    env: dict[str, str]

    def client(self, token: str | None = None) -> httpx.Client:
        """httpx over the unix socket, authenticated as admin unless told otherwise."""
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://sandvisor",
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=60,
        )

    def sandvisor(
        self,
        *args: str,
        input: bytes | None = None,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run the ``sandvisor`` CLI against this daemon (in ``cwd``: the project it runs on)."""
        env = self.env
        if cwd is not None:
            # The package is imported from the checkout, wherever the command runs.
            env = {
                **env,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
            }
        return subprocess.run(
            [*SANDVISOR, *args],
            env=env,
            input=input,
            capture_output=True,
            timeout=timeout,
            check=False,
            cwd=cwd,
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_daemon(
    state_dir: Path,
    policies_dir: Path,
    *extra: str,
    stop_tasks_on_exit: bool = True,
    env_extra: dict[str, str] | None = None,
    nofile: tuple[int, int] | None = None,
) -> Daemon:
    """Start ``sandvisor serve`` and wait until it answers (bounded). ``nofile``: the (soft, hard)
    open-files limit the daemon starts with."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir.parent / f"{state_dir.name}-daemon.log"
    env = {
        **os.environ,
        "SANDVISOR_STATE_DIR": str(state_dir),
        "SANDVISOR_POLICIES_DIR": str(policies_dir),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("SANDVISOR_URL", None)
    env.pop("SANDVISOR_TOKEN", None)
    env.pop("SANDVISOR_TEST_CRASH_AT", None)
    env.update(env_extra or {})
    args = [*SANDVISOR, "serve", "--state-dir", str(state_dir), "--policies-dir", str(policies_dir)]
    if stop_tasks_on_exit:
        args.append("--stop-tasks-on-exit")
    args += list(extra)
    with open(log, "ab") as fh:
        if nofile is not None:
            # prlimit execs the daemon: the same pid, started with these limits.
            args = ["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", "--", *args]
        proc = subprocess.Popen(args, stdout=fh, stderr=fh, env=env, cwd=REPO)
    info_file = state_dir / "daemon" / "daemon.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sandvisor serve exited with {proc.returncode}:\n{log.read_text()}")
        if info_file.exists():
            info = json.loads(info_file.read_text())
            sock = Path(info["socket"])
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as c:
                    if c.get("http://sandvisor/healthz").status_code in (200, 503):
                        token = (state_dir / "daemon" / "admin.token").read_text().strip()
                        return Daemon(proc, state_dir, sock, token, info.get("tcp"), log, env)
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"sandvisor serve did not answer within 30 s:\n{log.read_text()}")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path, for tests that make a state dir per cycle:
    under a parallel worker's longer tmp_path, the daemon's socket path would outgrow what
    a unix socket takes (107 bytes). Removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="sv-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def projects_root(tmp_path: Path) -> Path:
    """The workspace root of the fixture's daemon: projects made under it may be workspaces."""
    root = tmp_path / "projects"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture
def daemon(tmp_path: Path, policies_dir: Path) -> Iterator[Daemon]:
    """A private daemon with its own state dir, the test policies, loopback TCP on a free port
    and ``<tmp_path>/projects`` as its one workspace root. Stopped with SIGTERM at the end (it
    stops its tasks on exit, leaving no containers)."""
    require_engine()
    d = start_daemon(
        tmp_path / "state",
        policies_dir,
        "--listen",
        "127.0.0.1:0",
        "--workspace-root",
        str(projects_root(tmp_path)),
    )
    try:
        yield d
    finally:
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc}:\n{d.log.read_text()[-3000:]}"
