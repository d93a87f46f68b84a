"""``sandvisor doctor --fix-engine``: restart an engine that does not answer or is wedged,
but only the dockerd ``scripts/engine.sh`` started (tooling/engine_owner.py tells which).

The restart is done here, in Python, and not by running engine.sh (shipped as package
data) because:

* ``engine.sh up`` is an installer as much as a starter: it installs packages, replaces
  Debian 12's docker.io with Debian 13's and may write ``/etc/docker/daemon.json``. A
  repair must do none of that, and must not run a root shell script out of site-packages.
* ``up`` starts dockerd with engine.sh's own fixed arguments. Re-executing the command line
  read from ``/proc/<pid>/cmdline`` before the stop (its binary, environment, working
  directory and log too) brings back the *same* engine, whatever its arguments: a private
  test engine with its own socket, data root and pid file comes back as itself.
* ``down`` sends SIGTERM and gives up after 30 s. A wedged engine may not act on SIGTERM,
  and a SIGSTOPped one cannot until it is continued, so the stop sends SIGCONT with the
  SIGTERM and SIGKILL after the timeout.

Otherwise the steps are engine.sh's ``down`` + ``up``: find the dockerd by the pid file and
its ``/proc/<pid>/cmdline`` (``our_pid``), SIGTERM it, wait until it is gone, start it again
in a session of its own (``setsid``: it outlives doctor) appending to the same log, wait
until the API answers (``SANDVISOR_ENGINE_WAIT_S``, 90 s, like engine.sh). The process is
signalled through a pidfd opened after it was identified, so a pid reused meanwhile is
never hit; its exit is waited for on that pidfd (no polling of ``kill -0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from supervisor.core.container import EngineState
from supervisor.core.errors import SupervisorError
from supervisor.engine.deadlines import ALIVE_S
from supervisor.engine.docker.http import exchange
from supervisor.engine.endpoint import Endpoint, docker_host
from supervisor.runtime.engine_checks import CANARY_LABEL, CANARY_S
from supervisor.tooling.engine_owner import (
    Verdict,
    alive,
    cmdline,
    engine_run_dir,
    identify,
    is_dockerd,
)

#: How long a stopped engine may take to exit after SIGTERM before it gets SIGKILL (as
#: engine.sh's ``down``), and after SIGKILL.
STOP_S = 30.0
KILL_S = 10.0
#: How long a started engine may take to answer (engine.sh's ``SANDVISOR_ENGINE_WAIT_S``).
START_S = 90.0
#: engine.sh's log, for an engine whose stdout is not a file.
DEFAULT_LOG = "/var/log/sandvisor-dockerd.log"

#: What to do when no engine of engine.sh's is left to restart.
_START_TODO = "start an engine with `make engine` (scripts/engine.sh up, as root on Debian)"

Action = Literal["none", "restarted", "refused", "failed"]


@dataclass(frozen=True)
class Look:
    """One look at the engine, as the supervisor's watchdog takes it."""

    state: EngineState
    why: str = ""
    version: str | None = None


async def look(
    host: str | None = None, *, ping_s: float = ALIVE_S, canary_s: float = CANARY_S
) -> Look:
    """``down`` when the engine refuses; ``wedged`` when a ping is not answered within
    ``ping_s`` or a container listing (the watchdog's canary) not within ``canary_s``;
    else ``up``, with its version. Raw requests on their own connections: no thread stays
    blocked on a wedged engine."""
    host = host or docker_host()
    try:
        endpoint = Endpoint(host)
    except SupervisorError as exc:
        return Look("down", str(exc))
    canary = urllib.parse.quote(json.dumps({"label": [CANARY_LABEL]}))
    steps = (
        ("/_ping", ping_s, "a ping"),
        (f"/containers/json?all=1&filters={canary}", canary_s, "a container listing"),
        ("/version", canary_s, "a version query"),
    )
    body = b""
    for path, limit, what in steps:
        try:
            status, body = await asyncio.wait_for(exchange(endpoint, "", "GET", path), limit)
        except TimeoutError:
            return Look("wedged", f"{what} was taken but not answered within {limit:g} s")
        except SupervisorError as exc:
            return Look("down", str(exc))
        if status != 200:
            return Look("down", f"GET {path}: HTTP {status}")
    try:
        version = str(json.loads(body).get("Version", "?"))
    except (ValueError, AttributeError):
        version = "?"
    return Look("up", version=version)


@dataclass(frozen=True)
class Recorded:
    """How a running dockerd was started, read from /proc before it is stopped."""

    argv: list[str]
    executable: str
    env: dict[str, str]
    cwd: str
    log: str

    @classmethod
    def of(cls, pid: int) -> Recorded:
        proc = Path("/proc") / str(pid)
        argv = cmdline(pid)
        try:
            exe = os.readlink(proc / "exe").removesuffix(" (deleted)")  # an upgraded binary
        except OSError:
            exe = argv[0]
        try:
            raw = (proc / "environ").read_bytes()
            env = dict(
                item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if item
            )
        except (OSError, ValueError):
            env = dict(os.environ)
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            cwd = "/"
        if not os.path.isdir(cwd):
            cwd = "/"
        try:
            out = os.readlink(proc / "fd" / "1")
        except OSError:
            out = ""
        if not (out.startswith("/") and os.path.isfile(out)):
            out = os.environ.get("SANDVISOR_ENGINE_LOG") or DEFAULT_LOG
        return cls(argv, exe, env, cwd, out)


class FixOutcome(BaseModel):
    """What ``doctor --fix-engine`` found and did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    """``none``: the engine is up; ``restarted``; ``refused``: not engine.sh's (or not
    root), left alone; ``failed``: the restart did not bring it back."""
    host: str
    state_before: EngineState
    why_before: str = ""
    state_after: EngineState | None = None
    """After the restart (or ``up`` when nothing was done); None when it was refused."""
    version: str | None = None
    """The engine's version, when it answers."""
    old_pid: int | None = None
    new_pid: int | None = None
    took_s: float | None = None
    """From the SIGTERM until the API answered."""
    message: str
    """For people: what was found and done."""
    todo: str = ""
    """What the user should do, when doctor did not (or could not) fix it."""
    log: str | None = None


def _stop(pidfd: int, pid: int, stop_s: float) -> bool:
    """SIGTERM (and SIGCONT: a stopped process acts on nothing), wait for the exit on the
    pidfd; SIGKILL after ``stop_s``. Whether it is gone."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    except ProcessLookupError:
        return True
    if select.select([pidfd], [], [], stop_s)[0]:
        return True
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    return bool(select.select([pidfd], [], [], KILL_S)[0]) or not alive(pid)


def _start(rec: Recorded) -> subprocess.Popen[bytes]:
    with open(rec.log, "ab") as log:
        return subprocess.Popen(
            rec.argv,
            executable=rec.executable,
            env=rec.env,
            cwd=rec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid, as engine.sh: the engine outlives doctor
            close_fds=True,
        )


def _log_tail(path: str, lines: int = 10) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


async def _wait_up(host: str, proc: subprocess.Popen[bytes], start_s: float) -> Look | None:
    """Until the new engine is up (its look), None when it exits first or ``start_s``
    passes. Looks every 0.2 s: the condition is the engine's answer."""
    deadline = time.monotonic() + start_s
    while True:
        if proc.poll() is not None:
            return None
        seen = await look(host)
        if seen.state == "up":
            return seen
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.2)


def _refused(verdict: Verdict, before: Look, why: str, todo: str) -> FixOutcome:
    return FixOutcome(
        action="refused",
        host=verdict.host,
        state_before=before.state,
        why_before=before.why,
        old_pid=verdict.pid,
        message=f"the engine at {verdict.host} is {before.state}, and doctor did not "
        f"restart it: {why}",
        todo=todo,
    )


async def restart(
    verdict: Verdict, before: Look, *, stop_s: float = STOP_S, start_s: float = START_S
) -> FixOutcome:
    """Stop engine.sh's dockerd (``verdict.ours``) and start it again as it was started."""
    if not verdict.ours or verdict.pid is None:
        raise ValueError(f"not engine.sh's engine: {verdict.why}")
    pid = verdict.pid
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return _refused(verdict, before, f"dockerd pid {pid} exited meanwhile", _START_TODO)
    try:
        # The pidfd pins the process: check it is still that dockerd, then record it.
        rec = Recorded.of(pid)
        if not is_dockerd(rec.argv):
            return _refused(verdict, before, f"pid {pid} is no longer dockerd", _START_TODO)
        began = time.monotonic()
        gone = await asyncio.to_thread(_stop, pidfd, pid, stop_s)
    finally:
        os.close(pidfd)
    base = {
        "host": verdict.host,
        "state_before": before.state,
        "why_before": before.why,
        "old_pid": pid,
        "log": rec.log,
    }
    if not gone:
        return FixOutcome(
            action="failed",
            **base,
            message=f"dockerd pid {pid} did not exit within {stop_s + KILL_S:g} s of "
            "SIGTERM and SIGKILL (stuck in the kernel?)",
            todo=f"look at `cat /proc/{pid}/stack`; a reboot may be needed",
        )
    # dockerd refuses to start while its pid file names a process that exists (a zombie
    # its parent has not reaped yet counts): it is gone, so its pid file goes too.
    with contextlib.suppress(OSError):
        if verdict.pidfile.read_text().strip() == str(pid):
            verdict.pidfile.unlink()
    proc = _start(rec)
    seen = await _wait_up(verdict.host, proc, start_s)
    if seen is None:
        ended = proc.poll()
        what = f"exited with {ended}" if ended is not None else f"did not answer in {start_s:g} s"
        tail = _log_tail(rec.log)
        return FixOutcome(
            action="failed",
            **base,
            state_after=(await look(verdict.host)).state,
            new_pid=proc.pid,
            message=f"dockerd pid {pid} was stopped; the one started again (pid {proc.pid}) "
            f"{what}; last lines of {rec.log}:\n{tail}",
            todo=f"read {rec.log}, then {_START_TODO}",
        )
    with contextlib.suppress(OSError):
        if verdict.pidfile.read_text().strip() != str(proc.pid):
            verdict.pidfile.write_text(f"{proc.pid}")  # keep it engine.sh's to stop
    took = time.monotonic() - began
    return FixOutcome(
        action="restarted",
        **base,
        state_after=seen.state,
        version=seen.version,
        new_pid=proc.pid,
        took_s=round(took, 2),
        message=f"the engine at {verdict.host} was {before.state} ({before.why}): restarted "
        f"dockerd (pid {pid} -> {proc.pid}) in {took:.1f} s; it is {seen.state}, "
        f"Docker {seen.version}",
    )


async def fix_engine(
    host: str | None = None,
    run_dir: Path | None = None,
    *,
    euid: int | None = None,
    stop_s: float = STOP_S,
    start_s: float | None = None,
) -> FixOutcome:
    """Look at the engine; when it is down or wedged and it is engine.sh's dockerd (and we
    are root), restart it; else say why not and what to do. Never touches another engine."""
    host = host or docker_host()
    run_dir = run_dir or engine_run_dir()
    euid = os.geteuid() if euid is None else euid
    if start_s is None:
        try:
            start_s = float(os.environ.get("SANDVISOR_ENGINE_WAIT_S") or START_S)
        except ValueError:
            start_s = START_S
    before = await look(host)
    if before.state == "up":
        return FixOutcome(
            action="none",
            host=host,
            state_before="up",
            state_after="up",
            version=before.version,
            message=f"the engine at {host} is up (Docker {before.version}): nothing to restart",
        )
    verdict = identify(host, run_dir)
    if not verdict.ours:
        return _refused(verdict, before, verdict.why, verdict.todo)
    if euid != 0:
        return _refused(
            verdict,
            before,
            f"restarting dockerd pid {verdict.pid} (started by scripts/engine.sh as root) "
            "needs root",
            "run it as root: `sudo sandvisor doctor --fix-engine`",
        )
    return await restart(verdict, before, stop_s=stop_s, start_s=start_s)
