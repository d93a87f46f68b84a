"""Whose engine is it? Only a dockerd that ``scripts/engine.sh`` started may be restarted by
``sandvisor doctor --fix-engine``; this module tells that one from every other engine.

An engine is engine.sh's when all of these hold, in this order (each failing one is a
:class:`Verdict` that says why, and what the user should do instead):

1. ``DOCKER_HOST`` is a unix socket on this host (or unset: ``/var/run/docker.sock``);
2. engine.sh's pid file, ``$SANDVISOR_ENGINE_RUN_DIR/dockerd.pid`` (default
   ``/var/run/sandvisor-engine``), names a pid;
3. that pid is a live process (not gone, not a zombie);
4. its program is dockerd: the first field of ``/proc/<pid>/cmdline`` is ``dockerd`` or a
   path ending in ``/dockerd``. Steps 2 to 4 are engine.sh's ``our_pid`` (which checks the
   same first field);
5. that dockerd holds the listening socket at DOCKER_HOST's path (``/proc/net/unix`` and
   ``/proc/<pid>/fd``): the engine that does not answer is that process, not an engine
   elsewhere while engine.sh's runs fine. Reading another user's fds needs root; without
   it the verdict is ``unknown``.

Nothing here signals or changes anything: it reads files under ``/proc`` and the run dir.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from supervisor.engine.endpoint import DEFAULT_SOCKET

#: engine.sh's run dir (``SANDVISOR_ENGINE_RUN_DIR``) and the pid file dockerd writes there.
DEFAULT_RUN_DIR = Path("/var/run/sandvisor-engine")
PIDFILE_NAME = "dockerd.pid"
_PROC = Path("/proc")
#: /proc/net/unix: a listening socket has __SO_ACCEPTCON in its flags and state 01.
_SO_ACCEPTCON = 0x10000

OwnerKind = Literal["ours", "not_ours", "unknown"]


def engine_run_dir() -> Path:
    """``$SANDVISOR_ENGINE_RUN_DIR``, else engine.sh's default."""
    return Path(os.environ.get("SANDVISOR_ENGINE_RUN_DIR") or DEFAULT_RUN_DIR)


@dataclass(frozen=True)
class Verdict:
    """Whether the engine at ``host`` is the dockerd engine.sh started."""

    kind: OwnerKind
    host: str
    pidfile: Path
    why: str
    """One sentence: what was found."""
    todo: str = ""
    """What the user should do, when doctor will not restart it."""
    pid: int | None = None
    """engine.sh's dockerd (``ours``), or the pid the pid file names."""
    socket: str | None = None
    """DOCKER_HOST's socket path, when it is one."""

    @property
    def ours(self) -> bool:
        return self.kind == "ours"


def socket_path(host: str) -> str | None:
    """The unix socket of ``host`` (a DOCKER_HOST value), or None for tcp and the like."""
    parsed = urllib.parse.urlparse(host)
    if parsed.scheme in ("unix", "http+unix", ""):
        return parsed.path or DEFAULT_SOCKET
    return None


def cmdline(pid: int) -> list[str]:
    """``/proc/<pid>/cmdline`` as a list ([] when the process is gone)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1] if raw else []


def shown(argv: list[str], width: int = 100) -> str:
    """A command line for a message (cut at ``width``)."""
    text = " ".join(argv) or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


def is_dockerd(argv: list[str]) -> bool:
    """Whether a command line's program is dockerd (as engine.sh's ``our_pid`` checks)."""
    return bool(argv) and argv[0].rsplit("/", 1)[-1] == "dockerd"


def alive(pid: int) -> bool:
    """A process with this pid exists and is not a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def started_pid(run_dir: Path) -> tuple[int | None, str]:
    """engine.sh's ``our_pid``: the pid of the dockerd it started, or None and why not."""
    pidfile = run_dir / PIDFILE_NAME
    try:
        text = pidfile.read_text().strip()
    except FileNotFoundError:
        return None, f"there is no pid file {pidfile}"
    except OSError as exc:
        return None, f"the pid file {pidfile} cannot be read ({exc.strerror or exc})"
    if not text.isdigit() or int(text) <= 0:
        return None, f"the pid file {pidfile} does not hold a pid ({text[:40]!r})"
    pid = int(text)
    if not alive(pid):
        return None, f"the pid file {pidfile} names pid {pid}, which is not running"
    argv = cmdline(pid)
    if not is_dockerd(argv):
        return (
            None,
            f"the pid file {pidfile} names pid {pid}, which is `{shown(argv)}`, not dockerd",
        )
    return pid, ""


def listening_inodes(path: str) -> set[int]:
    """The socket inodes listening at the unix socket ``path`` (same file, any spelling)."""
    want = os.path.realpath(path)
    found: set[int] = set()
    try:
        lines = (_PROC / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        flags, state, inode, bound = int(fields[3], 16), fields[5], int(fields[6]), fields[7]
        if flags & _SO_ACCEPTCON and state == "01" and os.path.realpath(bound) == want:
            found.add(inode)
    return found


def holds_socket(pid: int, inodes: set[int]) -> bool:
    """Whether process ``pid`` has one of these socket inodes open (PermissionError when
    its fds cannot be read: another user's process, without root)."""
    fd_dir = _PROC / str(pid) / "fd"
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(fd_dir / fd) in wanted:
                return True
        except OSError:
            continue
    return False


def socket_holder(inodes: set[int]) -> int | None:
    """Some process that holds one of these sockets (the lowest pid: a socket-activating
    systemd before its dockerd), or None when none can be seen."""
    for name in sorted((n for n in os.listdir(_PROC) if n.isdigit()), key=int):
        try:
            if holds_socket(int(name), inodes):
                return int(name)
        except OSError:
            continue
    return None


def _restart_elsewhere(sock: str, inodes: set[int]) -> str:
    """What to do about an engine doctor will not touch, from who serves ``sock``."""
    holder = socket_holder(inodes) if inodes else None
    if holder is None:
        if not inodes and not os.path.exists("/etc/debian_version"):
            return (
                f"nothing listens at {sock}, and `make engine` installs and starts an engine "
                "only on Debian: start your Docker engine (e.g. `sudo systemctl start docker`), "
                "or point DOCKER_HOST at one"
            )
        if not inodes:
            return (
                f"nothing listens at {sock}: start an engine with `make engine` "
                "(scripts/engine.sh up, as root on Debian), or point DOCKER_HOST at yours"
            )
        return f"restart the engine at {sock} the way it was started"
    who = shown(cmdline(holder))
    try:
        cgroup = (_PROC / str(holder) / "cgroup").read_text()
    except OSError:
        cgroup = ""
    if "docker.service" in cgroup or "docker.socket" in cgroup or holder == 1:
        return (
            f"it is systemd's (pid {holder}, `{who}`): restart it with "
            "`sudo systemctl restart docker`"
        )
    return f"it is pid {holder} (`{who}`): restart it the way it was started"


def identify(host: str, run_dir: Path) -> Verdict:
    """Whether the engine at ``host`` is the dockerd engine.sh started (module docstring)."""
    pidfile = run_dir / PIDFILE_NAME
    sock = socket_path(host)
    if sock is None:
        return Verdict(
            "not_ours",
            host,
            pidfile,
            f"DOCKER_HOST={host} is not a socket on this host, and doctor restarts only the "
            "engine scripts/engine.sh started here",
            "restart that engine where it runs, or unset DOCKER_HOST to use this host's",
            socket=None,
        )
    pid, why = started_pid(run_dir)
    if pid is None:
        inodes = listening_inodes(sock)
        return Verdict(
            "not_ours",
            host,
            pidfile,
            f"it was not started by scripts/engine.sh: {why}",
            _restart_elsewhere(sock, inodes),
            socket=sock,
        )
    inodes = listening_inodes(sock)
    try:
        serves = bool(inodes) and holds_socket(pid, inodes)
    except PermissionError:
        return Verdict(
            "unknown",
            host,
            pidfile,
            f"the pid file names dockerd pid {pid}, and only root can see whether it is "
            f"the engine at {sock}",
            "run it as root: `sudo sandvisor doctor --fix-engine`",
            pid=pid,
            socket=sock,
        )
    except OSError:  # it exited meanwhile
        serves = False
    if not serves:
        if not inodes:
            todo = (
                "restart it with `make engine-down && make engine` (they stop only that "
                "one), or point DOCKER_HOST at the socket it listens on"
            )
        else:
            todo = _restart_elsewhere(sock, inodes)
        return Verdict(
            "not_ours",
            host,
            pidfile,
            f"it is not the dockerd scripts/engine.sh started (pid {pid}, which does not "
            f"listen at {sock})",
            todo,
            pid=pid,
            socket=sock,
        )
    return Verdict(
        "ours",
        host,
        pidfile,
        f"dockerd pid {pid} serves {sock} and was started by scripts/engine.sh (pid file "
        f"{pidfile})",
        pid=pid,
        socket=sock,
    )
