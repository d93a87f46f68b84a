"""Start the local daemon when none answers: ``sandvisor serve`` detached, in the background.

The CLI's daemon commands and the MCP server use :func:`ensure_daemon` to get a client.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from supervisor.core.paths import default_state_dir
from supervisor.interfaces.client import SandvisorClient
from supervisor.interfaces.http_errors import DaemonNotRunning

__all__ = ["ensure_daemon"]


async def ensure_daemon(
    state_dir: Path | None = None, *, quiet: bool = False, wait_s: float = 30.0
) -> SandvisorClient:
    """A client for the local daemon, starting ``sandvisor serve`` in the background if none
    answers (and saying so on stderr). ``$SANDVISOR_DAEMON_ARGS`` adds options to that command."""
    if os.environ.get("SANDVISOR_URL"):
        return SandvisorClient.for_state_dir(state_dir)
    if await _answers(state_dir):
        return SandvisorClient.for_state_dir(state_dir)
    state = state_dir or default_state_dir()
    log_path = state / "daemon" / "daemon.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # e.g. the state directory is not writable
        raise DaemonNotRunning(f"cannot create {log_path.parent}: {exc}") from exc
    cmd = [sys.executable, "-m", "supervisor.interfaces.cli.main", "serve"]
    cmd += ["--state-dir", str(state)]
    # Extra `sandvisor serve` options for daemons started this way (e.g. --stop-tasks-on-exit).
    cmd += shlex.split(os.environ.get("SANDVISOR_DAEMON_ARGS", ""))
    proc = await asyncio.to_thread(_spawn, cmd, log_path)
    if not quiet:
        sys.stderr.write(
            f"sandvisor: no daemon was running; started one in the background "
            f"(pid {proc.pid}, log {log_path})\n"
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise DaemonNotRunning(f"the daemon exited with {proc.returncode}:\n{tail}")
        if await _answers(state_dir):
            return SandvisorClient.for_state_dir(state_dir)
        await asyncio.sleep(0.1)
    raise DaemonNotRunning(f"the daemon did not answer within {wait_s:.0f} s (log: {log_path})")


async def _answers(state_dir: Path | None) -> bool:
    """Whether the daemon of ``state_dir`` accepts connections. The client callers use is
    built only afterwards: a daemon writes its admin token before it listens, so a client
    built before the daemon answered could lack the token (and get 401 from a daemon it
    just started)."""
    return await SandvisorClient.for_state_dir(state_dir).reachable()


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the daemon detached from our session, logging to ``log_path``."""
    with open(log_path, "ab") as log_fh:
        return subprocess.Popen(
            cmd, stdout=log_fh, stderr=log_fh, stdin=subprocess.DEVNULL, start_new_session=True
        )
