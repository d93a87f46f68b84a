"""Every workspace this supervisor holds: those of open sessions, and those of ended
sessions whose changes wait to be applied or discarded (kept for a retention time).
Validates a new workspace (allowed roots, reserved paths, owner), restores them after a
restart, and reaps what is past retention or belongs to no one."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from supervisor.core.errors import PolicyError, SupervisorError
from supervisor.core.labels import LABEL_OWNER, LABEL_SESSION
from supervisor.core.logs import get_logger
from supervisor.core.policy import Policy
from supervisor.core.workspace import WorkspacePlan, WorkspaceSpec, plan, task_user
from supervisor.engine.base import Backend
from supervisor.runtime.ownership import owner_alive
from supervisor.runtime.workspace import Workspace
from supervisor.state.store import StateStore

log = get_logger("supervisor.workspaces")

_META = "workspace:"
#: How long the changes of an ended session are kept by default (7 days).
RETENTION_S = 7 * 24 * 3600.0


def _inspect(path: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
    """(realpath, (uid, gid) of its owner, (st_dev, st_ino)); PolicyError when it is not a
    directory."""
    real = os.path.realpath(os.path.abspath(path))
    try:
        st = os.stat(real)
    except OSError as exc:
        raise PolicyError(f"workspace {path!r}: {exc.strerror or exc}") from exc
    if not os.path.isdir(real):
        raise PolicyError(f"workspace {path!r} is not a directory")
    return real, (st.st_uid, st.st_gid), (st.st_dev, st.st_ino)


def same_spec(a: WorkspaceSpec, b: WorkspaceSpec) -> bool:
    """The same directory (after realpath) in the same mode."""
    return os.path.realpath(a.path) == os.path.realpath(b.path) and a.mode == b.mode


class Workspaces:
    """The registry; owned by the Supervisor."""

    def __init__(
        self,
        *,
        backend: Backend,
        io: Executor,
        store: StateStore,
        state_dir: Path,
        instance_id: str,
        labels: Callable[..., dict[str, str]],
        roots: Sequence[Path],
        retention_s: float = RETENTION_S,
        orphan_grace_s: float = 600.0,
    ) -> None:
        self.backend = backend
        self.io = io
        self.store = store
        self.state_dir = state_dir
        self.instance_id = instance_id
        self.labels = labels
        self.roots = [str(r) for r in roots]
        self.retention_s = retention_s
        self.orphan_grace_s = orphan_grace_s
        self._by_session: dict[str, Workspace] = {}

    def get(self, session_id: str) -> Workspace | None:
        return self._by_session.get(session_id)

    def retained(self) -> list[Workspace]:
        """Workspaces of ended sessions whose changes are still kept."""
        return [w for w in self._by_session.values() if w.ended_at is not None]

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    # -- opening ------------------------------------------------------------------------

    async def for_session(
        self, sid: str, spec: WorkspaceSpec | None, policy: Policy
    ) -> Workspace | None:
        """The workspace of a session being opened: the one it had (a restart, or changes
        kept after it ended), or a new one (None: it has none)."""
        known = self.get(sid)
        if known is not None:
            if spec is not None and not same_spec(known.spec, spec):
                raise PolicyError(
                    f"session {sid!r} keeps workspace {known.plan.host} ({known.plan.mode}) "
                    "with changes not yet applied or discarded; use another session id, or "
                    "apply or discard them first"
                )
            if known.ended_at is not None:
                known.ended_at = None
                await self.save(known)
            return known
        if spec is None:
            return None
        return await self.open(sid, spec, policy)

    async def open(self, session_id: str, spec: WorkspaceSpec, policy: Policy) -> Workspace:
        """A validated, prepared workspace for a new session (PolicyError when refused)."""
        real, owner, identity = await self._run(_inspect, spec.path)
        tmpfs = [t.path for t in policy.tmpfs]
        ws_plan = plan(
            spec,
            real,
            owner,
            roots=self.roots,
            state_dir=str(self.state_dir),
            tmpfs_paths=tmpfs,
            identity=identity,
        )
        if ws_plan.warning:
            log.warning("workspace_path_fallback", session_id=session_id, why=ws_plan.warning)
        user = task_user(ws_plan, policy.name, policy.runtime, policy.workspace_root_owner)
        uid, _, gid = user.partition(":")
        ws = self._make(session_id, ws_plan, (int(uid), int(gid or uid)))
        await ws.prepare()
        await self.save(ws)
        self._by_session[session_id] = ws
        return ws

    def _make(
        self, session_id: str, ws_plan: WorkspacePlan, upper_owner: tuple[int, int]
    ) -> Workspace:
        return Workspace(
            ws_plan,
            session_id=session_id,
            root=self.state_dir / "ws" / session_id,
            volume=f"sandvisor-ws-{session_id}-{self.instance_id[:8]}",
            labels=self.labels(session_id=session_id, kind="workspace"),
            backend=self.backend,
            io=self.io,
            upper_owner=upper_owner,
        )

    async def save(self, ws: Workspace) -> None:
        await self.store.set_meta(_META + ws.session_id, ws.to_json())

    async def load(self) -> None:
        """After a restart: every workspace the store knows (open or retained)."""
        for key, raw in (await self.store.metas(_META)).items():
            sid = key.removeprefix(_META)
            try:
                data = json.loads(raw)
                ws = self._make(
                    sid,
                    Workspace.plan_from_json(data),
                    (int(data["upper_owner"][0]), int(data["upper_owner"][1])),
                )
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("workspace_record_unreadable", session_id=sid, error=str(exc))
                continue
            ws.ended_at = data.get("ended_at")
            ws.repositories.restore(data)
            if ws.plan.mode == "rw":
                await ws.prepare()  # finds the read-only git binds again
            self._by_session[sid] = ws

    # -- ending -------------------------------------------------------------------------

    async def session_ended(self, session_id: str) -> None:
        """Its tasks are gone: unmount, and keep the changes until applied, discarded or
        past retention (a workspace with nothing to review goes at once)."""
        ws = self._by_session.get(session_id)
        if ws is None:
            return
        try:
            await ws.unmount()
        except SupervisorError as exc:
            log.warning("workspace_unmount_failed", session_id=session_id, error=str(exc))
        if ws.plan.mode != "overlay" or not await ws.has_changes():
            await self.drop(session_id)
            return
        ws.ended_at = time.time()
        await self.save(ws)

    async def drop(self, session_id: str) -> None:
        """Remove a workspace's volume and state for good."""
        ws = self._by_session.pop(session_id, None)
        if ws is not None:
            await ws.remove()
        await self.store.delete_meta(_META + session_id)

    async def reap(self, open_sessions: Sequence[str]) -> int:
        """Remove retained workspaces past retention, and volumes of ours that no
        workspace knows. Returns how many went."""
        removed = 0
        now = time.time()
        for ws in self.retained():
            if ws.ended_at is not None and now - ws.ended_at > self.retention_s:
                log.info("workspace_retention_over", session_id=ws.session_id)
                await self.drop(ws.session_id)
                removed += 1
        try:
            volumes = await self.backend.list_volumes(LABEL_OWNER)
        except SupervisorError:
            return removed
        known = {w.volume for w in self._by_session.values()}
        for v in volumes:
            if v.name in known:
                continue  # a workspace of ours, whichever run made its volume
            if v.labels.get(LABEL_OWNER) != self.instance_id:
                # Another supervisor's: reaped like its containers, once it is gone for good.
                gone = await self._run(owner_alive, v.labels, self.orphan_grace_s) is False
            else:
                gone = v.labels.get(LABEL_SESSION, "") not in open_sessions
            if gone:
                try:
                    await self.backend.remove_volume(v.name)
                    removed += 1
                except SupervisorError as exc:
                    log.warning("volume_reap_failed", volume=v.name, error=str(exc))
        return removed
