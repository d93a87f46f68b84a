"""Pure: is a gVisor sandbox waiting for its stdin? Read from the sentry's own view.

gVisor serves every syscall in its user-space kernel, so the host's ``/proc`` shows only the
sandbox's own threads. ``runsc debug --stacks`` prints the sentry's goroutine stacks: a
task blocked in a syscall has a goroutine in ``(*Task).block`` whose frames name the
syscall with its arguments (``syscalls/linux.Read(t, {{0x0}, ...})``: the first is the fd)
and the task's thread id (``(*Task).run(t, 0x4)``). ``runsc debug --ps`` lists the
processes with their threads and parents.

What can be told from that:
- a ``read``/``readv``/``pread`` of fd 0 waits on the task's stdin, unless that process
  is a later stage of a pipeline (``sleep 60 | cat``: cat's fd 0 is a pipe from its
  sibling), which shows as an earlier-started sibling that is not itself reading fd 0;
- a ``select``/``pselect`` with ``nfds == 1`` can only wait on fd 0.
What cannot: which fd a ``poll``/``epoll`` waits on (their sets live in the task's memory),
and a read of a duplicated stdin (fd 3 after ``exec 3<&0``). Those are left to the
heuristic; a miss is better than a false alarm.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass

_GOROUTINE = re.compile(r"^goroutine \d+ \[", re.MULTILINE)
_SYSCALL = re.compile(
    r"syscalls/linux\.([A-Z][A-Za-z0-9]*)\(0x[0-9a-f]+\??, \{((?:\{[^{}]*\}, ?)*\{[^{}]*\})\}"
)
_ARG = re.compile(r"\{(0x[0-9a-f]+)\??\}")
_RUN = re.compile(r"kernel\.\(\*Task\)\.run\(0x[0-9a-f]+\??, (0x[0-9a-f]+)\)")
_BLOCKED = ("(*Task).block(", "(*Task).BlockWith")

#: Syscalls that read one fd given as their first argument.
READS = frozenset({"Read", "Readv", "Pread64", "Preadv", "Preadv2"})
#: Syscalls whose first argument is ``nfds`` of select(2)'s fd sets.
SELECTS = frozenset({"Select", "Pselect", "Pselect6"})


@dataclass(frozen=True)
class Blocked:
    """A task thread blocked in a syscall."""

    tid: int
    call: str
    args: tuple[int, ...]


@dataclass(frozen=True)
class Proc:
    """One process of the sandbox (``runsc debug --ps``)."""

    pid: int
    ppid: int
    threads: tuple[int, ...]
    cmd: str


def parse_stacks(text: str) -> list[Blocked]:
    """The task threads blocked in a syscall, from ``runsc debug --stacks``."""
    starts = [m.start() for m in _GOROUTINE.finditer(text)] + [len(text)]
    out: list[Blocked] = []
    for begin, end in itertools.pairwise(starts):
        block = text[begin:end]
        if not any(b in block for b in _BLOCKED):
            continue
        call = _SYSCALL.search(block)
        run = _RUN.search(block)
        if call is None or run is None:
            continue
        args = tuple(int(a, 16) for a in _ARG.findall(call.group(2)))
        out.append(Blocked(int(run.group(1), 16), call.group(1), args))
    return out


def parse_ps(text: str) -> list[Proc]:
    """The processes from ``runsc debug --ps`` (its JSON follows some log noise)."""
    start = re.search(r"\[\s*\{", text)
    if start is None:
        return []
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start.start() :])
    except ValueError:
        return []
    procs = []
    for p in data if isinstance(data, list) else []:
        try:
            threads = tuple(int(t) for t in p.get("threads") or [p["pid"]])
            procs.append(Proc(int(p["pid"]), int(p["ppid"]), threads, str(p.get("cmd", ""))))
        except (KeyError, TypeError, ValueError):
            continue
    return procs


def waits_on_stdin(blocked: list[Blocked], procs: list[Proc]) -> tuple[bool, str]:
    """Whether some task waits to read the sandbox's stdin, and the evidence."""
    pid_of = {tid: p.pid for p in procs for tid in p.threads}
    by_pid = {p.pid: p for p in procs}
    readers = {pid_of.get(b.tid, b.tid) for b in blocked if b.call in READS and b.args[:1] == (0,)}
    for b in blocked:
        if b.call in SELECTS and b.args[:1] == (1,):
            return True, f"thread {b.tid} waits in {b.call.lower()} on fd 0 only"
        if b.call not in READS or b.args[:1] != (0,):
            continue
        pid = pid_of.get(b.tid, b.tid)
        proc = by_pid.get(pid)
        if proc is not None and _after_a_sibling(proc, procs, readers):
            continue  # a later pipeline stage: its fd 0 is a pipe from a sibling
        return True, f"thread {b.tid} ({proc.cmd if proc else '?'}) reads fd 0"
    return False, "no thread waits on stdin"


def _after_a_sibling(proc: Proc, procs: list[Proc], readers: set[int]) -> bool:
    """Started after a sibling that is not itself reading fd 0: the shape of ``a | b``."""
    return any(
        p.ppid == proc.ppid and p.pid < proc.pid and p.pid not in readers
        for p in procs
        if p.pid != proc.pid
    )
