"""The arena hostile commands run in: a supervisor, a session, and a watch on the host.

Every case runs on runc (policy ``default``) and on gVisor (policy ``untrusted``), with the
shipped limits; a case may only tighten them per task. ``Arena.finish()`` ends the session
and then asserts what every case must leave behind: no container, the engine answering, and
the host's process count, free memory and free disk where they were (within a tolerance;
other work shares this machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from supervisor import MemorySink, Supervisor, TaskInfo, TaskOutput, TaskSpec
from supervisor.core.events import BaseEvent
from supervisor.core.labels import LABEL_OWNER
from supervisor.core.workspace import WorkspaceMode, WorkspaceSpec
from tests.conftest import labelled_containers

MIB = 1024 * 1024
#: runtime -> the shipped policy that runs it.
POLICY = {"runc": "default", "runsc": "untrusted"}
# Host-wide figures move with whatever else runs on this machine (other test suites, image
# builds), so the host checks have two parts: "back where it was" is re-checked for up to
# SETTLE_S (another workload's temporary use passes; harm the case left behind does not),
# and peaks during the case only catch gross escapes (more than one container's limits).
#: Host processes another workload may add.
PID_SLACK = 64
#: Free memory another workload (or the page cache) may take.
MEM_SLACK = 1024 * MIB
#: Free disk another workload may take (the state dir and json logs are checked exactly).
DISK_SLACK = 2048 * MIB
#: How much this process's RSS (the supervisor runs in it) may grow over a case.
RSS_SLACK = 96 * MIB
#: What the state dir may hold beyond the output files: the SQLite store and its WAL.
STATE_SLACK = 64 * MIB
#: How long "back where it was" may take to become true.
SETTLE_S = 10.0

PROBE_PRELUDE = r"""
import ctypes, errno, json, os, socket, stat, sys, time
libc = ctypes.CDLL(None, use_errno=True)
ARGS = json.loads(os.environ.get("SANDVISOR_ARGS") or "{}")
R = {}
def ename(code):
    return errno.errorcode.get(code, str(code))
def call(fn, *args):
    # A libc call: None when it worked, else the errno name.
    ctypes.set_errno(0)
    ret = fn(*args)
    return ename(ctypes.get_errno()) if ret == -1 else None
def oserr(fn, *args):
    try:
        fn(*args)
    except OSError as exc:
        return ename(exc.errno)
    return None
def in_child(fn):
    # Run fn() in a forked child (so namespace changes do not stick); its dict result.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn()
        except BaseException as exc:
            out = {"crash": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data or b"{}")
def done():
    sys.stdout.write("RESULT " + json.dumps(R) + "\n")
    sys.stdout.flush()
"""


def probe_command() -> str:
    return 'python3 -c "$SANDVISOR_PROBE"'


def parse_result(output: bytes) -> dict[str, Any]:
    """The ``RESULT {json}`` line a probe printed last."""
    for line in reversed(output.splitlines()):
        if line.startswith(b"RESULT "):
            data: dict[str, Any] = json.loads(line[7:])
            return data
    raise AssertionError(f"the probe printed no RESULT line; output:\n{output[-4000:]!r}")


# -- the host ----------------------------------------------------------------------------------


_CGROUP_CONTAINER = re.compile(rb"/docker/([0-9a-f]{64})")
_SHIM_CONTAINER = re.compile(rb"containerd-shim[^\0]*\0.*?-id\0([0-9a-f]{64})", re.S)


def container_of_pid(pid: int) -> str | None:
    """The container a host process belongs to: its cgroup (the container's processes, and
    gVisor's sandbox processes), or the shim's ``-id``; None for ordinary host processes."""
    try:
        found = _CGROUP_CONTAINER.search(Path(f"/proc/{pid}/cgroup").read_bytes())
        if found is None:
            found = _SHIM_CONTAINER.search(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def disk_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def host_cmdlines_containing(needle: str) -> list[int]:
    """Host pids whose command line mentions ``needle`` (ourselves excluded)."""
    raw = needle.encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if raw in Path(f"/proc/{name}/cmdline").read_bytes():
                out.append(int(name))
    return out


@dataclass
class Sample:
    pids: int
    """Host processes, not counting those of other owners' containers (other work)."""
    ours: int
    """Host processes of this supervisor's containers (their processes and shims)."""
    mem: int
    disk: int
    rss: int


class HostWatch:
    """Samples the host every 100 ms in a thread (so a busy event loop cannot hide a peak).

    The machine is shared, so processes are attributed: those in a container's cgroup (or a
    container's shim) count only when the container carries this supervisor's owner label.
    """

    def __init__(
        self, disk_path: Path, owner: str, in_pool: Callable[[str], bool] = lambda _: False
    ) -> None:
        self.disk_path = disk_path
        self.owner = owner
        #: Whether a task id is a warm container still waiting in one of the supervisor's
        #: shared pools (it belongs to no case until a task takes it).
        self.in_pool = in_pool
        self._owners: dict[str, bool] = {}
        self._pooled: dict[str, str] = {}
        self._lock = threading.Lock()
        self._client = engine()
        self.before = self.sample()
        self.peak_pids = self.before.pids
        self.peak_ours = self.before.ours
        self.min_mem = self.before.mem
        self.min_disk = self.before.disk
        self.peak_rss = self.before.rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-watch", daemon=True)
        self._thread.start()

    def _is_ours(self, cid: str) -> bool:
        known = self._owners.get(cid)
        if known is None:
            try:
                labels = self._client.inspect_container(cid)["Config"]["Labels"] or {}
                known = labels.get("io.sandvisor.owner") == self.owner
                if known and labels.get("io.sandvisor.kind") == "pooled":
                    self._pooled[cid] = labels.get("io.sandvisor.task", "")
            except docker.errors.NotFound:
                known = False  # gone before we saw it; not on this engine
            self._owners[cid] = known
        # A warm container counts from the moment a task takes it (its labels never change).
        return known and not (cid in self._pooled and self.in_pool(self._pooled[cid]))

    def sample(self) -> Sample:
        with self._lock:
            pids = ours = 0
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                cid = container_of_pid(int(name))
                if cid is None:
                    pids += 1
                elif self._is_ours(cid):
                    pids += 1
                    ours += 1
            return Sample(pids, ours, mem_available(), disk_free(self.disk_path), rss_bytes())

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            s = self.sample()
            self.peak_pids = max(self.peak_pids, s.pids)
            self.peak_ours = max(self.peak_ours, s.ours)
            self.min_mem = min(self.min_mem, s.mem)
            self.min_disk = min(self.min_disk, s.disk)
            self.peak_rss = max(self.peak_rss, s.rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def close(self) -> None:
        self.stop()
        self._client.close()


# -- the engine ------------------------------------------------------------------------------


def engine() -> Any:
    return docker.APIClient(version="auto", timeout=60)


def full_id(short: str) -> str:
    c = engine()
    try:
        return str(c.inspect_container(short)["Id"])
    finally:
        c.close()


def json_log_bytes(container_id: str, root: str = "/var/lib/docker") -> int:
    """Bytes of the engine's json-file logs of one container (all rotated files)."""
    folder = Path(root) / "containers" / container_id
    total = 0
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            if "-json.log" in entry.name:
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
    return total


def cgroup_file(container_id: str, controller: str, name: str) -> Path | None:
    """A cgroup v1 file of the container (cgroupfs driver), if this host has it."""
    path = Path("/sys/fs/cgroup") / controller / "docker" / container_id / name
    return path if path.exists() else None


# -- the arena ---------------------------------------------------------------------------------


def owned_by(instance_id: str) -> list[dict[str, Any]]:
    """Every container (running or not) labelled with this supervisor instance as owner."""
    return labelled_containers(LABEL_OWNER, instance_id)


class ArenaSink(MemorySink):
    """Keeps every event, but with ``slim`` a ``task.output`` event's text is replaced by
    nothing (its length and characters are kept in ``outputs``), so that the test itself
    does not hold the output it is measuring the supervisor's memory for."""

    def __init__(self) -> None:
        super().__init__()
        self.slim = False
        #: (len(text), set of characters, cut, eol) of each task.output, when slim.
        self.outputs: list[tuple[int, frozenset[str], bool, bool]] = []

    async def send(self, event: BaseEvent) -> None:
        if self.slim and isinstance(event, TaskOutput):
            self.outputs.append((len(event.text), frozenset(event.text), event.cut, event.eol))
            event = event.model_copy(update={"text": ""})
        await super().send(event)


@dataclass
class Result:
    """A finished task: its final info, its output bytes, and its events."""

    info: TaskInfo
    output: bytes
    events: list[BaseEvent] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", "replace")

    def result(self) -> dict[str, Any]:
        return parse_result(self.output)


class Arena:
    """One case on one runtime: a supervisor, a session, a host watch."""

    def __init__(
        self,
        runtime: str,
        sup: Supervisor,
        tmp_path: Path,
        workspace: Path,
        node: Any = None,
    ) -> None:
        self.runtime = runtime
        self.node = node
        self.policy = POLICY[runtime]
        self.ws_policy = f"adv-ws-{runtime}"
        self.sup = sup
        self.tmp_path = tmp_path
        self.workspace = workspace
        self.sink = ArenaSink()
        self.session: Any = None
        self.watch: HostWatch | None = None
        self.finished = False
        #: Bytes the case keeps on the host on purpose outside the state dir (disk check).
        self.kept_bytes = 0
        #: How many containers run at once at most (each may use its full memory limit).
        self.concurrency = 1
        #: The session's project (``open_workspace``): a directory owned by uid 1000.
        self.project: Path | None = None

    def note(self, text: str) -> None:
        """Record how this runtime behaved; printed under the suite's summary line."""
        if self.node is not None:
            self.node.user_properties.append(("note", f"{self.runtime}: {text}"))

    @property
    def limits(self) -> Any:
        return self.sup.policies.get(self.policy).limits

    async def open(self, name: str) -> None:
        self.watch = HostWatch(self.sup.state_dir, self.sup.instance_id, self.sup.pools.holds)
        self.session = await self.sup.open_session(name, sinks=[self.sink])

    async def open_workspace(
        self, name: str, project: Path, mode: WorkspaceMode = "overlay"
    ) -> None:
        """Open the case's session on ``project`` (under the supervisor's workspace root):
        tasks run in it, at its host path, as its owner."""
        self.project = project
        self.watch = HostWatch(self.sup.state_dir, self.sup.instance_id, self.sup.pools.holds)
        self.session = await self.sup.open_session(
            name,
            sinks=[self.sink],
            workspace=WorkspaceSpec(path=str(project), mode=mode),
            policy=self.policy,
        )

    async def start(self, command: str, **spec: Any) -> TaskInfo:
        spec.setdefault("policy", self.policy)
        spec.setdefault("timeout_ms", 60_000)
        info: TaskInfo = await self.session.start(TaskSpec(command=command, **spec))
        return info

    async def wait(self, info: TaskInfo, timeout_s: float = 120, *, read: bool = True) -> Result:
        """The final state, events and (with ``read``) the whole output file."""
        final: TaskInfo = await self.session.wait(info.task_id, timeout_s=timeout_s)
        # Sinks are fed asynchronously: wait until ours has the terminal event too.
        await self.sink.wait_for(
            lambda e: e.task_id == info.task_id and e.type in ("task.stopped", "task.failed"),
            timeout=30,
        )
        output = Path(final.output_path).read_bytes() if read else b""
        events = [e for e in self.sink.events if e.task_id == info.task_id]
        return Result(final, output, events)

    async def run(self, command: str, *, wait_s: float = 120, **spec: Any) -> Result:
        return await self.wait(await self.start(command, **spec), wait_s)

    async def probe(self, source: str, args: dict[str, Any] | None = None, **spec: Any) -> Result:
        env = dict(spec.pop("env", {}))
        env["SANDVISOR_PROBE"] = PROBE_PRELUDE + source + "\ndone()\n"
        env["SANDVISOR_ARGS"] = json.dumps(args or {})
        return await self.run(probe_command(), env=env, **spec)

    async def container_of(self, info: TaskInfo, timeout_s: float = 60) -> str:
        """The full id of the task's container, once it runs."""
        cid = await self.container_if_running(info, timeout_s)
        if cid is None:
            raise AssertionError(f"task {info.task_id} ended before its container was seen")
        return cid

    async def container_if_running(self, info: TaskInfo, timeout_s: float = 60) -> str | None:
        """The full id of the task's container, or None when the task ended first."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = await self.session.get(info.task_id)
            if now.container_id:
                with contextlib.suppress(docker.errors.NotFound):
                    return full_id(now.container_id)
            if now.ended:
                return None
            if time.monotonic() > deadline:
                raise AssertionError(f"task {info.task_id} never got a container: {now}")
            await asyncio.sleep(0.02)

    def owned_volumes(self) -> list[str]:
        c = engine()
        try:
            found = c.volumes(filters={"label": f"io.sandvisor.owner={self.sup.instance_id}"})
        finally:
            c.close()
        return [v["Name"] for v in (found or {}).get("Volumes") or []]

    def workspace_mounts(self) -> list[str]:
        """Mount-table lines naming the supervisor's workspace state (overlays in use)."""
        ws = str(self.sup.state_dir / "ws")
        text = Path("/proc/self/mountinfo").read_text()
        return [line for line in text.splitlines() if ws in line]

    def owned_containers(self) -> list[dict[str, Any]]:
        """This supervisor's containers, except the warm ones its shared pools keep ready:
        they belong to no session until a task takes one (checked at close instead)."""
        return [
            row
            for row in owned_by(self.sup.instance_id)
            if not (
                row["Labels"].get("io.sandvisor.kind") == "pooled"
                and not row["Labels"].get("io.sandvisor.session")
            )
        ]

    async def finish(self) -> None:
        """End the session, then check the host and the engine."""
        assert self.watch is not None
        await self.session.end()
        assert self.sink.events and self.sink.events[-1].type == "session.ended"
        assert self.owned_containers() == [], "containers left behind"
        assert self.owned_volumes() == [], "volumes left behind"
        assert self.workspace_mounts() == [], "workspace overlays still mounted"
        watch = self.watch
        watch.stop()
        before = watch.before
        lim = self.limits
        # Engine: answers a ping promptly.
        t0 = time.monotonic()
        c = engine()
        try:
            assert c.ping() is True
        finally:
            c.close()
        assert time.monotonic() - t0 < 5, "the engine is slow to answer after the case"
        # The supervisor's own disk: the output files (capped) and a small store, no more.
        outputs = sum(p.stat().st_size for p in self.sup.state_dir.rglob("*.output"))
        state = sum(p.stat().st_size for p in self.sup.state_dir.rglob("*") if p.is_file())
        # The store also holds the text of every monitor event the policy let through
        # (its byte bucket allows burst_bytes, then bytes_per_s: the longer a flood takes,
        # the more of it): that text once, nothing more.
        events = sum(size for size, _, _, _ in self.sink.outputs)
        assert state <= outputs + events + STATE_SLACK, (
            f"the state dir holds {state / MIB:.0f} MiB, of which output files "
            f"{outputs / MIB:.0f} MiB and monitor event text {events / MIB:.0f} MiB"
        )
        kept = self.kept_bytes + state
        # Peaks: never more than the containers' limits (plus other work on the machine).
        # A container's processes are at most its pids limit; its shim is one more.
        ours_allowed = self.concurrency * (lim.pids + 1)
        assert watch.peak_ours <= ours_allowed, (watch.peak_ours, ours_allowed)
        peak_allowed = before.pids + ours_allowed + PID_SLACK
        assert watch.peak_pids <= peak_allowed, (watch.peak_pids, peak_allowed)
        floor = before.mem - self.concurrency * lim.memory_mb * MIB - MEM_SLACK
        assert watch.min_mem >= floor, (watch.min_mem, floor)
        logs = self.concurrency * 4 * 64 * MIB  # the engine's json logs, rotated
        assert watch.min_disk >= before.disk - kept - logs - DISK_SLACK, (watch.min_disk, kept)
        # Back where it was: processes, memory, disk, and this process's RSS.
        deadline = time.monotonic() + SETTLE_S
        while True:
            after = watch.sample()
            problems = []
            if after.ours:
                problems.append(f"{after.ours} host processes of our containers remain")
            if after.pids > before.pids + PID_SLACK:
                problems.append(f"host processes {before.pids} -> {after.pids}")
            if after.mem < before.mem - MEM_SLACK:
                problems.append(f"free memory {before.mem >> 20} -> {after.mem >> 20} MiB")
            if after.disk < before.disk - kept - DISK_SLACK:
                problems.append(
                    f"free disk {before.disk >> 20} -> {after.disk >> 20} MiB "
                    f"(kept on purpose: {kept >> 20} MiB)"
                )
            if after.rss > before.rss + RSS_SLACK:
                problems.append(f"supervisor RSS {before.rss >> 20} -> {after.rss >> 20} MiB")
            if not problems:
                break
            assert time.monotonic() < deadline, "host not back after the case: " + "; ".join(
                problems
            )
            await asyncio.sleep(0.25)
        watch.close()
        self.finished = True
