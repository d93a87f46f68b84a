"""The cap on what a session's workspace layer may take on the host disk.

An overlay's changes land in its upper, a plain directory under the state dir: without a
cap, a task can fill the host's disk or its inodes. Each policy's ``session`` table caps it
(``workspace_max_mb``, ``workspace_max_files``) for the tasks of that policy. While any task
of the session runs, the layer is measured every ``period_s`` (0.25 s, and never oftener
than ten times the last measure took, so a big layer costs at most a tenth of a core); a
running task whose policy's cap the layer is past is killed at once (SIGKILL, no grace
period) with reason ``workspace_full``, and a start of such a task is refused
(``WorkspaceFull``) until the changes are applied or discarded.

The supervisor measures from outside, so a task can get past the cap by what it writes
between two looks. The kernel is not asked to refuse the write itself (ENOSPC in the task):
that needs a size-limited filesystem under the upper, which a supervisor not running as
root cannot mount. Where a hard limit is needed, put the state dir on a filesystem of its
own size: a full one gives the task ENOSPC, and the supervisor refuses new starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from structlog.stdlib import BoundLogger

from supervisor.core.policy import Policy
from supervisor.core.workspace_errors import WorkspaceFull
from supervisor.runtime.task.runner import TaskRunner
from supervisor.runtime.workspace import Workspace
from supervisor.state.workspace.usage import LayerUsage

MB = 1 << 20
#: The least time between two measures while a task runs (a task writing at disk speed
#: gets this far past the cap, and is then killed at once).
PERIOD_S = 0.25
#: A measure may take at most this share of the time between two (a layer of 200,000
#: entries takes about a second to measure: it is looked at every ten).
MAX_SHARE = 0.1


def cap_of(policy: Policy) -> tuple[int, int]:
    """(bytes, entries) the layer may hold while a task of ``policy`` runs."""
    return policy.session.workspace_max_mb * MB, policy.session.workspace_max_files


def describe(usage: LayerUsage, policy: Policy) -> str:
    max_bytes, max_files = cap_of(policy)
    held = f"{usage.bytes / MB:,.0f} MB in {usage.files:,} entries"
    if not usage.complete:
        held = "more than " + held
    return (
        f"the workspace's changes hold {held}; policy {policy.name!r} allows "
        f"{max_bytes // MB:,} MB (session.workspace_max_mb) and {max_files:,} entries "
        f"(session.workspace_max_files): apply or discard the changes, or use a policy "
        f"with a larger cap"
    )


class LayerCap:
    """Measures one session's overlay layer and holds its tasks to their policies' caps
    (a session with no overlay has nothing to measure: every call is then a no-op)."""

    def __init__(
        self,
        workspace: Workspace | None,
        runners: Callable[[], Iterable[TaskRunner]],
        log: BoundLogger,
        *,
        period_s: float = PERIOD_S,
    ) -> None:
        self._ws = workspace if workspace is not None and workspace.plan.mode == "overlay" else None
        self._runners = runners
        self._log = log
        self._period_s = period_s
        self._wake = asyncio.Event()
        #: The last measure (None before the first).
        self.last: LayerUsage | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closed = False

    def task_started(self) -> None:
        """A task of the session started (or was re-adopted): watch the layer, starting
        the watch with the session's first task."""
        if self._closed or self._ws is None:
            return
        if self._watch is None:
            self._watch = asyncio.create_task(self.run(), name="workspace-layer-cap")
        self._wake.set()

    def close(self) -> None:
        """The session ends or lets go: no more watching."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def forget(self) -> None:
        """The layer changed under us (applied, discarded): the last measure is stale."""
        self.last = None

    async def measure(self, max_bytes: int, max_files: int) -> LayerUsage:
        if self._ws is None:
            return LayerUsage(0, 0)
        usage = await self._ws.usage(stop_bytes=max_bytes, stop_files=max_files)
        self.last = usage
        return usage

    async def check_start(self, policy: Policy) -> None:
        """Refuse a task of ``policy`` while the layer is past its cap. Only a look that
        found it past the cap costs a fresh measure; otherwise nothing is read."""
        cap = cap_of(policy)
        if self.last is None or not self.last.over(*cap):
            return
        usage = await self.measure(*cap)
        if usage.over(*cap):
            raise WorkspaceFull(
                f"cannot start a task of policy {policy.name!r}: " + describe(usage, policy)
            )

    async def run(self) -> None:
        """Until cancelled (the session ends): while a task runs, measure and stop those
        whose cap the layer is past."""
        loop = asyncio.get_running_loop()
        while True:
            running = [r for r in self._runners() if not r.ended]
            if not running:
                self._wake.clear()
                await self._wake.wait()
                continue
            caps = [cap_of(r.eff.policy) for r in running]
            began = loop.time()
            try:
                # Past the largest cap every task is over; no need to read further.
                usage = await self.measure(max(b for b, _ in caps), max(f for _, f in caps))
            except OSError as exc:  # the upper is being rewritten (apply): look again later
                self._log.warning("workspace_measure_failed", error=str(exc))
                usage = None
            took = loop.time() - began
            if usage is not None:
                for runner in running:
                    if usage.over(*cap_of(runner.eff.policy)) and runner.request_stop(
                        "workspace_full"
                    ):
                        self._log.warning(
                            "workspace_full",
                            task_id=runner.task_id,
                            bytes=usage.bytes,
                            files=usage.files,
                            complete=usage.complete,
                            why=describe(usage, runner.eff.policy),
                        )
            await asyncio.sleep(max(self._period_s, took / MAX_SHARE))
