"""Local-engine process inspection: which container process is blocked reading its stdin.

Blocking file reads of ``/proc`` and ``/sys``; callers run ``probe`` in a worker thread.
Works for runc containers on this host (gVisor runs the program inside its own kernel,
so the host's ``/proc`` says nothing about it; remote engines have no local ``/proc``).
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass
from pathlib import Path

_ARCH = platform.machine()
if _ARCH in ("aarch64", "arm64"):
    _READS = {63, 65, 67, 69, 286}  # read, readv, pread64, preadv, preadv2
    _POLLS = {73}  # ppoll
    _SELECTS = {72}  # pselect6
    _EPOLLS = {22, 441}  # epoll_pwait, epoll_pwait2
else:
    _READS = {0, 17, 19, 295, 327}  # read, pread64, readv, preadv, preadv2
    _POLLS = {7, 271}  # poll, ppoll
    _SELECTS = {23, 270}  # select, pselect6
    _EPOLLS = {232, 281, 441}  # epoll_wait, epoll_pwait, epoll_pwait2
_POLLIN = 0x1
_MAX_FDS = 1024


@dataclass(frozen=True)
class StdinProbe:
    """One look at a container's processes."""

    ok: bool
    """False when the processes could not be read (then nothing else is meaningful)."""
    blocked: bool = False
    """Some process is blocked in read/poll/select/epoll on the container's stdin pipe."""
    pid: int | None = None
    syscall: int | None = None
    why: str = ""


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


_CGROUP_LAYOUTS = (
    "/sys/fs/cgroup/pids/docker/{id}",  # v1, cgroupfs driver
    "/sys/fs/cgroup/pids/system.slice/docker-{id}.scope",  # v1, systemd driver
    "/sys/fs/cgroup/system.slice/docker-{id}.scope",  # v2, systemd driver
    "/sys/fs/cgroup/docker/{id}",  # v2, cgroupfs driver
)


def cgroup_dir(container_id: str) -> str | None:
    """The container's cgroup folder under the usual Docker layouts (no engine call)."""
    for layout in _CGROUP_LAYOUTS:
        path = layout.format(id=container_id)
        if os.path.exists(path + "/cgroup.procs"):
            return path
    return None


def init_pid_in(cgroup: str) -> int | None:
    """The host pid of the container's PID 1 (its ``NSpid`` ends in 1)."""
    try:
        pids = [int(p) for p in Path(cgroup, "cgroup.procs").read_text().split()]
    except OSError:
        return None
    for pid in sorted(pids):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                if line.split()[-1] == "1":
                    return pid
                break
    return None


def container_pids(init_pid: int) -> list[int] | None:
    """Host pids in the container's cgroup (v1 pids controller, or v2 unified)."""
    try:
        lines = Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "pids":
            candidates.append(Path("/sys/fs/cgroup/pids") / path.lstrip("/"))
        elif controllers == "":
            candidates.append(Path("/sys/fs/cgroup") / path.lstrip("/"))
            candidates.append(Path("/sys/fs/cgroup/unified") / path.lstrip("/"))
    for cg in candidates:
        try:
            text = (cg / "cgroup.procs").read_text()
        except OSError:
            continue
        return [int(p) for p in text.split()]
    return None


def _read_mem(pid: int, address: int, size: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as fh:
            fh.seek(address)
            return fh.read(size)
    except (OSError, ValueError, OverflowError):
        return None


def _epoll_fds(pid: int, epfd: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/fdinfo/{epfd}").read_text()
    except OSError:
        return []
    fds = []
    for line in text.splitlines():
        if line.startswith("tfd:"):
            parts = line.split()
            try:
                fd = int(parts[1])
                events = int(parts[3], 16)
            except (IndexError, ValueError):
                continue
            if events & _POLLIN:
                fds.append(fd)
    return fds


def _syscall(pid: int) -> tuple[int, list[int]] | None:
    """(syscall number, its first six arguments) of a blocked process, else None.
    Raises PermissionError when this process may not look (not root)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except PermissionError:
        raise
    except OSError:
        return None
    if not fields or fields[0] in ("running", "-1"):
        return None
    try:
        nr = int(fields[0])
        args = [int(a, 16) for a in fields[1:7]]
    except ValueError:
        return None
    return (nr, args) if len(args) >= 3 else None


def _poll_fds(pid: int, pollfds: int, count: int) -> list[int]:
    """The fds a poll(2)/ppoll(2) waits to read: its ``struct pollfd`` array."""
    nfds = min(count, _MAX_FDS)
    raw = _read_mem(pid, pollfds, nfds * 8)
    if raw is None or len(raw) < nfds * 8:
        return []
    fds = []
    for i in range(nfds):
        fd, events, _ = struct.unpack_from("=ihh", raw, i * 8)
        if fd >= 0 and events & _POLLIN:
            fds.append(fd)
    return fds


def _select_fds(pid: int, count: int, readfds: int) -> list[int]:
    """The fds a select(2)/pselect6(2) waits to read: its read ``fd_set``."""
    nfds = min(count, _MAX_FDS)
    if readfds == 0 or nfds <= 0:
        return []
    raw = _read_mem(pid, readfds, (nfds + 63) // 64 * 8)
    if raw is None:
        return []
    bits = int.from_bytes(raw, "little")
    return [fd for fd in range(nfds) if bits >> fd & 1]


def waited_fds(pid: int) -> tuple[int, list[int]] | None:
    """(syscall number, fds it waits to read) for a process blocked in a read-like syscall.

    Raises PermissionError when this process may not look (not root)."""
    call = _syscall(pid)
    if call is None:
        return None
    nr, args = call
    if nr in _READS:
        fds = [args[0]]
    elif nr in _POLLS:
        fds = _poll_fds(pid, args[0], args[1])
    elif nr in _SELECTS:
        fds = _select_fds(pid, args[0], args[1])
    elif nr in _EPOLLS:
        fds = _epoll_fds(pid, args[0])
    else:
        return None
    return nr, fds


def probe(init_pid: int) -> StdinProbe:
    """Is any process of the container (whose PID 1 has host pid ``init_pid``) blocked
    waiting to read the container's stdin pipe (through any fd number)?"""
    stdin = _readlink(f"/proc/{init_pid}/fd/0")
    if stdin is None:
        return StdinProbe(ok=False, why="cannot read the init process's stdin")
    if not stdin.startswith("pipe:") and not stdin.startswith("/"):
        return StdinProbe(ok=True, blocked=False, why=f"stdin is {stdin}")
    pids = container_pids(init_pid)
    if pids is None:
        return StdinProbe(ok=False, why="cannot list the container's processes")
    denied = 0
    for pid in pids:
        try:
            waited = waited_fds(pid)
        except PermissionError:
            denied += 1
            continue
        if waited is None:
            continue
        nr, fds = waited
        targets = [_readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
        if stdin in targets and not any(t and t.startswith("socket:") for t in targets):
            return StdinProbe(ok=True, blocked=True, pid=pid, syscall=nr)
    if pids and denied == len(pids):
        return StdinProbe(ok=False, why="no permission to read process state (need root)")
    return StdinProbe(ok=True, blocked=False)


def procfs_usable() -> bool:
    """Whether this process can read other processes' syscall state at all."""
    return Path("/proc/self/syscall").exists() and Path("/sys/fs/cgroup").is_dir()
