"""Local gVisor inspection: ask a sandbox's sentry what its tasks are blocked in.

``runsc debug --stacks`` and ``--ps`` read the sentry of one sandbox (about 30 ms each).
They need the runtime's state root, the ``--root=`` argument its ``runsc-sandbox`` process
was started with (Docker's is ``/var/run/docker/runtime-runc/moby``), found in ``/proc``.
Local engines only, as root, like ``procfs``. Blocking: call from a worker thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from supervisor.core.gvisor import parse_ps, parse_stacks, waits_on_stdin
from supervisor.engine.procfs import StdinProbe

#: How long one ``runsc debug`` call may take before the probe gives up.
CALL_TIMEOUT_S = 5.0


def runsc_binary() -> str | None:
    """The runsc executable, if this host has one."""
    return shutil.which("runsc") or ("/usr/bin/runsc" if os.path.exists("/usr/bin/runsc") else None)


def sandbox_root(container_id: str) -> str | None:
    """The state root of the runsc sandbox running ``container_id`` (from its process's
    command line), or None when no such sandbox runs on this host."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"runsc-sandbox"):
            continue
        if not any(container_id.encode() in a for a in argv):
            continue
        for arg in argv:
            if arg.startswith(b"--root="):
                return arg[len(b"--root=") :].decode(errors="replace")
    return None


def _debug(runsc: str, root: str, container_id: str, flag: str) -> str:
    done = subprocess.run(
        [runsc, f"--root={root}", "debug", flag, container_id],
        capture_output=True,
        timeout=CALL_TIMEOUT_S,
        check=False,
    )
    # runsc writes its findings to stdout and stderr depending on the version.
    return (done.stdout + done.stderr).decode(errors="replace")


def probe(runsc: str, root: str, container_id: str) -> StdinProbe:
    """Is a task of the sandbox blocked reading its stdin (as far as the sentry shows)?"""
    try:
        stacks = _debug(runsc, root, container_id, "--stacks")
        ps = _debug(runsc, root, container_id, "--ps")
    except (OSError, subprocess.SubprocessError) as exc:
        return StdinProbe(ok=False, why=f"runsc debug failed: {exc}")
    blocked = parse_stacks(stacks)
    procs = parse_ps(ps)
    if not procs:
        return StdinProbe(ok=False, why="runsc debug --ps gave no process list")
    waiting, why = waits_on_stdin(blocked, procs)
    return StdinProbe(ok=True, blocked=waiting, why=why)
