"""The stall watching service: one loop for all tasks with an open stdin.

For each task it picks the signal it can use: process state from the host kernel (local
engine, runc, root) or the heuristic (silence + idle CPU + prompt-like tail) elsewhere.
All ``/proc`` reads for one round go to a worker thread in a single call.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal

from supervisor.core.errors import SupervisorError
from supervisor.core.logs import get_logger
from supervisor.core.stall import StallDetector, Verdict, looks_like_prompt
from supervisor.engine import gvisor, procfs
from supervisor.engine.base import Backend
from supervisor.runtime.task.ports import Watchable
from supervisor.state.output import read_tail

log = get_logger("supervisor.core.stall")

_TICK_S = 0.2


Mode = Literal["process_state", "sentry_state", "heuristic", "pending"]


@dataclass
class _Watched:
    task: Watchable
    detector: StallDetector
    mode: Mode
    init_pid: int | None = None
    #: gVisor: the sandbox's state root (``runsc debug`` needs it).
    runsc_root: str | None = None
    seen_output: float = 0.0
    failures: int = 0


class StallWatcher:
    """Registry + loop. Runners call register/unregister/input_sent; output is noticed by
    comparing each runner's last-output time (no per-chunk call on the capture path)."""

    def __init__(self, backend: Backend, io: Executor, *, use_procfs: bool | None = None) -> None:
        self._backend = backend
        self._io = io
        self._watched: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._use_procfs = (
            (backend.local and procfs.procfs_usable()) if use_procfs is None else use_procfs
        )
        #: gVisor's own view of its tasks, where runsc runs on this host and we may ask it.
        self._runsc = gvisor.runsc_binary() if self._use_procfs else None

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def register(self, task: Watchable) -> None:
        if task.stall_after_s is None:
            return
        mode: Mode = "pending"
        if (
            not self._use_procfs
            or task.runtime not in ("runc", "runsc")
            or (task.runtime == "runsc" and self._runsc is None)
        ):
            mode = "heuristic"
        self._watched[task.task_id] = _Watched(
            task, StallDetector(task.stall_after_s, self._now()), mode
        )
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="stall-watcher")
        self._wake.set()

    def unregister(self, task_id: str) -> None:
        self._watched.pop(task_id, None)

    def input_sent(self, task_id: str) -> None:
        w = self._watched.get(task_id)
        if w is not None:
            w.detector.input_sent(self._now())

    def signal_for(self, task_id: str) -> str | None:
        """Which signal is watching a task (for tests and diagnostics)."""
        w = self._watched.get(task_id)
        return None if w is None else w.mode

    async def aclose(self) -> None:
        self._watched.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- the loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        while self._watched:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher must outlive any one odd task
                log.exception("stall_round_failed")
            await asyncio.sleep(_TICK_S)

    def _due(self, now: float) -> list[_Watched]:
        """The tasks whose detector wants a look now."""
        due: list[_Watched] = []
        for w in list(self._watched.values()):
            r = w.task
            if not r.watching:
                continue
            # New output ends an episode: whatever it waited for, it is making progress.
            if r.last_output_mono != w.seen_output:
                w.seen_output = r.last_output_mono
                if r.last_output_mono > r.started_mono:
                    w.detector.output(r.last_output_mono)
            if now - r.last_output_mono < 0.25 and r.last_output_mono > r.started_mono:
                continue
            if w.detector.due(now):
                due.append(w)
        return due

    async def _round(self) -> None:
        due = self._due(self._now())
        if not due:
            return
        pending = [w for w in due if w.mode == "pending"]
        if pending:
            await asyncio.gather(*(self._resolve_mode(w) for w in pending))
        procs = [w for w in due if w.mode == "process_state" and w.init_pid]
        if procs:
            await self._process_state(procs)
        sentries = [w for w in due if w.mode == "sentry_state" and w.runsc_root]
        if sentries:
            await asyncio.gather(*(self._sentry_state(w) for w in sentries))
        heuristic = [w for w in due if w.mode == "heuristic"]
        if heuristic:
            await asyncio.gather(*(self._heuristic(w) for w in heuristic))

    async def _process_state(self, procs: list[_Watched]) -> None:
        """One thread hop reads every task's process state; each detector judges its own."""
        loop = asyncio.get_running_loop()
        probes = await loop.run_in_executor(self._io, _probe_all, [w.init_pid for w in procs])
        for w, probe in zip(procs, probes, strict=True):
            await self._observe(w, probe)

    async def _sentry_state(self, w: _Watched) -> None:
        """gVisor: ask the sandbox's sentry (``runsc debug``) what its tasks wait in."""
        assert self._runsc is not None
        assert w.runsc_root is not None
        cid = w.task.container_id
        if cid is None:
            return
        loop = asyncio.get_running_loop()
        probe = await loop.run_in_executor(self._io, gvisor.probe, self._runsc, w.runsc_root, cid)
        await self._observe(w, probe)

    async def _observe(self, w: _Watched, probe: procfs.StdinProbe) -> None:
        if not probe.ok:
            w.failures += 1
            if w.failures >= 3:
                log.info("stall_signal_fallback", task_id=w.task.task_id, why=probe.why)
                w.mode = "heuristic"
            return
        verdict = w.detector.observe_process(self._now(), blocked_on_stdin=probe.blocked)
        if verdict is not None:
            await self._report(w, verdict)

    async def _resolve_mode(self, w: _Watched) -> None:
        cid = w.task.container_id
        if cid is None:
            return
        loop = asyncio.get_running_loop()
        if w.task.runtime == "runsc":
            root = await loop.run_in_executor(self._io, gvisor.sandbox_root, cid)
            w.runsc_root = root
            w.mode = "sentry_state" if root is not None else "heuristic"
            return
        # Straight from the cgroup: no engine round trip (the engine is slowest exactly when
        # many tasks start at once).
        pid = await loop.run_in_executor(self._io, _init_pid_local, cid)
        if pid is not None:
            w.init_pid = pid
            w.mode = "process_state"
            return
        try:
            state = await self._backend.inspect(cid)
        except SupervisorError:
            return
        if state is None or not state.pid:
            w.mode = "heuristic"
            return
        w.init_pid = state.pid
        w.mode = "process_state"

    async def _heuristic(self, w: _Watched) -> None:
        r = w.task
        now = self._now()
        tail = await read_tail(r.output_path, 400, self._io)
        prompt = looks_like_prompt(tail)
        cpu: int | None = None
        if prompt and r.container_id is not None:
            with contextlib.suppress(SupervisorError):
                cpu = await self._backend.cpu_time_ns(r.container_id)
        verdict = w.detector.observe_heuristic(
            now, quiet_since=r.last_output_mono, cpu_ns=cpu, prompt_like=prompt
        )
        if verdict is not None:
            await self._report(w, verdict)

    async def _report(self, w: _Watched, verdict: Verdict) -> None:
        await w.task.report_stall(verdict.signal, verdict.waiting_s)


def _init_pid_local(container_id: str) -> int | None:
    cgroup = procfs.cgroup_dir(container_id)
    return None if cgroup is None else procfs.init_pid_in(cgroup)


def _probe_all(pids: list[int | None]) -> list[procfs.StdinProbe]:
    out = []
    for pid in pids:
        if pid is None:
            out.append(procfs.StdinProbe(ok=False, why="no init pid"))
        else:
            out.append(procfs.probe(pid))
    return out
