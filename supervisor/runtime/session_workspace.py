"""A session's workspace review: changes, diff, apply, undo, discard.

Applying (and undoing, and discarding) needs the overlay unmounted, so no container of the
session may hold it: running tasks are refused (or stopped, when asked), the session's warm
containers go, and new starts wait at a gate until the host tree is written.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TypeVar

from supervisor.core.workspace_errors import NoWorkspace, WorkspaceBusy
from supervisor.core.workspace_pages import PAGE_DEFAULT
from supervisor.runtime.session_end import stop_all
from supervisor.runtime.session_ports import SessionServices
from supervisor.runtime.task.runner import TaskRunner
from supervisor.runtime.workspace import Workspace
from supervisor.runtime.workspace_cap import LayerCap
from supervisor.state.workspace import ApplyResult, Change, ChangePage, UndoResult

T = TypeVar("T")


class WorkspaceReview:
    """Mixed into ``Session``: the review operations and the gate starts pass."""

    session_id: str
    workspace: Workspace | None
    _svc: SessionServices
    _runners: dict[str, TaskRunner]
    _cap: LayerCap

    def _layer_changed(self) -> None:
        """Apply, undo and discard rewrite the layer: its last measure is stale."""
        self._cap.forget()

    def _init_review(self) -> None:
        #: Set while starts may proceed; cleared while the workspace is offline.
        self._ws_gate = asyncio.Event()
        self._ws_gate.set()
        #: Set when no start is between the gate and its runner being registered.
        self._no_starts = asyncio.Event()
        self._no_starts.set()
        self._starting = 0
        self._ws_ops = asyncio.Lock()

    @asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """Held by a start from before its checks until its runner is registered."""
        while not self._ws_gate.is_set():
            await self._ws_gate.wait()
        self._starting += 1
        self._no_starts.clear()
        try:
            yield
        finally:
            self._starting -= 1
            if self._starting == 0:
                self._no_starts.set()

    def _ws(self, what: str) -> Workspace:
        if self.workspace is None:
            raise NoWorkspace(f"{what}: session {self.session_id!r} has no workspace")
        return self.workspace

    async def workspace_changes(self) -> builtins.list[Change]:
        """What the session's tasks changed in the workspace (overlay mode): all of it, each
        change hashed (``workspace_changes_page`` for a page of a long listing)."""
        return await self._ws("changes").changes()

    async def workspace_changes_page(
        self, *, limit: int = PAGE_DEFAULT, after: str | None = None, ignored: bool = True
    ) -> ChangePage:
        """A page of the changes: at most ``limit`` (1 to 10 000) after the cursor
        ``after`` (a path, as a page's ``next`` gives it), with ``total`` and ``next``;
        ``ignored=False`` leaves the ignored ones out. Only the page's entries are hashed."""
        return await self._ws("changes").changes_page(limit=limit, after=after, ignored=ignored)

    async def workspace_diff(
        self,
        *,
        full: bool = False,
        limit: int | None = None,
        after: str | None = None,
        ignored: bool = False,
    ) -> str:
        """The changes as one unified diff that ``git apply`` accepts (files over 1 MiB as
        their sizes and hashes unless ``full``); with ``limit``, of the changes of that page
        (as ``workspace_changes_page`` cuts it) only."""
        return await self._ws("diff").diff(full=full, limit=limit, after=after, ignored=ignored)

    async def apply_changes(
        self,
        *,
        force: bool = False,
        stop_tasks: bool = False,
        reviewed: Mapping[str, str] | None = None,
    ) -> ApplyResult:
        """Write the (non-ignored) changes to the host tree, backing up what they overwrite;
        then start from a fresh upper. Conflicts (host files changed since the session
        began) are refused unless ``force``; running tasks unless ``stop_tasks``. With
        ``reviewed`` (path -> ``Change.digest`` as the caller saw them), the changes listed
        after the tasks stopped must be exactly those, or nothing is written
        (WorkspaceConflict): what a stopping task writes is never applied unseen."""
        ws = self._ws("apply")
        return await self._offline(
            "apply", stop_tasks, lambda: ws.apply(force=force, reviewed=reviewed)
        )

    async def discard_changes(self, *, stop_tasks: bool = False) -> None:
        """Drop every change."""
        ws = self._ws("discard")
        await self._offline("discard", stop_tasks, ws.discard)

    async def undo_apply(self, *, force: bool = False, stop_tasks: bool = False) -> UndoResult:
        """Put the host tree back as it was before the last apply (the applied changes left
        the session's layer at apply: they are not pending again). Host edits made since
        the apply are refused unless ``force``."""
        ws = self._ws("undo")
        return await self._offline("undo", stop_tasks, lambda: ws.undo(force=force))

    async def _offline(self, what: str, stop_tasks: bool, op: Callable[[], Awaitable[T]]) -> T:
        async with self._ws_ops:
            self._ws_gate.clear()
            try:
                await self._no_starts.wait()
                await self._quiesce(what, stop_tasks)
                return await op()
            finally:
                self._layer_changed()
                self._ws_gate.set()

    async def _quiesce(self, what: str, stop_tasks: bool) -> None:
        """No container may hold the overlay: stop the tasks (if asked) and empty the pool."""
        running = [r for r in self._runners.values() if not r.ended]
        if running and not stop_tasks:
            names = ", ".join(f"{r.task_id} ({r.ident.spec.label[:40]})" for r in running)
            raise WorkspaceBusy(
                f"{what}: session {self.session_id!r} still runs {len(running)} task(s): "
                f"{names}; stop them first, or ask to stop them (stop_tasks)",
                [r.task_id for r in running],
            )
        await stop_all(
            list(self._runners.values()), "user_stopped", timeout_s=self._svc.end_timeout_s
        )
        # The session's own warm containers mount the overlay too.
        await self._svc.pools.close_scope(self.session_id)
