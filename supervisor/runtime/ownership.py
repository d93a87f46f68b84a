"""Who owns a container: owner labels, the state-dir lock held while a supervisor runs,
and telling a crashed owner (whose containers wait for it to re-adopt them) from a gone one
(whose containers are reaped). Blocking: call from a worker thread."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from supervisor.core.errors import StateStorageError
from supervisor.core.labels import LABEL_OWNER, LABEL_PREFIX

#: The state dir's lock file: held (flock) while a supervisor runs on it, touched as a
#: heartbeat.
LOCK_NAME = "supervisor.lock"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def pid_start(pid: int) -> str | None:
    """Kernel start time of ``pid`` (clock ticks since boot), or None if it is not alive."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _lock_state(path: str, grace_s: float) -> bool | None:
    """Owner state from its state-dir lock: True (held: alive), False (gone for good: no
    lock file, or not held and untouched for ``grace_s``), None (not held but recently alive:
    it may be restarting and will re-adopt its containers). The probe takes a shared lock for
    an instant; an owner starting at that moment retries its own lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        age = time.time() - os.fstat(fd).st_mtime
        return False if age > grace_s else None
    finally:
        os.close(fd)


def owner_alive(labels: dict[str, str], grace_s: float = 600.0) -> bool | None:
    """Is the supervisor that labeled a container still running? None when we cannot tell.

    Owners are identified by their state dir (its lock is held while a supervisor runs on
    it, and touched as a heartbeat), so a restarted supervisor is the same, live owner; a
    dead owner's containers are left to it for ``grace_s`` before anyone else reaps them."""
    boot = labels.get(LABEL_PREFIX + "owner.boot")
    host = labels.get(LABEL_PREFIX + "owner.host")
    if boot is None:
        return None
    if boot != boot_id():
        # Same host name but another boot: the machine restarted, the owner is gone.
        return False if host == socket.gethostname() else None
    lock = labels.get(LABEL_PREFIX + "owner.lock")
    if lock:
        return _lock_state(lock, grace_s)
    pid = labels.get(LABEL_PREFIX + "owner.pid")
    start = labels.get(LABEL_PREFIX + "owner.pidstart")
    if pid is None:
        return None
    try:
        actual = pid_start(int(pid))
    except ValueError:
        return None
    return actual is not None and actual == start


def owner_labels(instance_id: str, state_dir: Path) -> dict[str, str]:
    """The labels that say which supervisor (and which process of it) made a container."""
    return {
        LABEL_OWNER: instance_id,
        LABEL_PREFIX + "owner.host": socket.gethostname(),
        LABEL_PREFIX + "owner.boot": boot_id(),
        LABEL_PREFIX + "owner.pid": str(os.getpid()),
        LABEL_PREFIX + "owner.pidstart": pid_start(os.getpid()) or "",
        LABEL_PREFIX + "owner.lock": str(state_dir.resolve() / LOCK_NAME),
    }


def lock_state_dir(state_dir: Path) -> int:
    """Take the state dir's lock (exclusive) and return its fd; StateStorageError when
    another supervisor holds it."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    for attempt in range(50):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 49:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise StateStorageError(
                    f"state dir {state_dir} is in use by another supervisor (pid {holder})"
                ) from None
            # Another supervisor may be probing whether we are alive: that takes an instant.
            time.sleep(0.02)
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def heartbeat(state_dir: Path) -> None:
    """Touch the lock: other supervisors see we were alive just now (see owner_alive)."""
    # A state dir gone or read-only: the held lock still says we are alive.
    with contextlib.suppress(OSError):
        os.utime(state_dir / LOCK_NAME)
