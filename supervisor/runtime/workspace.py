"""A session's workspace on the host: its overlay (upper layer, work dir, the engine volume
that mounts them), the manifest of the project taken when the session opened, and the
review of its changes (list, diff, apply, discard, undo).

The overlay's lower is the live project directory. The kernel leaves changing a lower
(or an upper) while it is mounted undefined, so apply, discard and undo run with the volume
removed (unmounted): the session stops its tasks first. Listing and diffing only read the
upper, so they run beside the tasks and see a snapshot of it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from pathlib import Path
from typing import Any

import supervisor.state.workspace as changes_fs
from supervisor.core.container import Mount, VolumeRequest
from supervisor.core.errors import EngineError, PolicyError, SupervisorError
from supervisor.core.logs import get_logger
from supervisor.core.workspace import (
    WorkspacePlan,
    WorkspaceSpec,
    mounts,
    private_parent,
)
from supervisor.core.workspace_pages import PAGE_DEFAULT, check_limit, cursor_path
from supervisor.engine.base import Backend
from supervisor.runtime.workspace_git import RwRepositories
from supervisor.runtime.workspace_listing import KeptListing
from supervisor.state.workspace.usage import LayerUsage, layer_usage

log = get_logger("supervisor.workspace")

#: Overlay options beyond the three dirs: user xattrs (no trusted.* needed to read the
#: upper back), no redirects, no index, no metacopy, no xino: each keeps the upper a plain
#: tree a review can read, and lets the lower change while unmounted (overlayfs.rst).
OVERLAY_OPTIONS = "userxattr,redirect_dir=nofollow,index=off,metacopy=off,xino=off"


class Workspace:
    """One session's workspace. ``root`` holds its state: ``upper/``, ``work/``,
    ``backup/`` (what an apply overwrote, for undo) and ``manifest``."""

    def __init__(
        self,
        plan: WorkspacePlan,
        *,
        session_id: str,
        root: Path,
        volume: str,
        labels: dict[str, str],
        backend: Backend,
        io: Executor,
        upper_owner: tuple[int, int],
    ) -> None:
        self.plan = plan
        self.session_id = session_id
        self.root = root
        self.volume = volume
        self.labels = labels
        self.backend = backend
        self.io = io
        self.upper_owner = upper_owner
        self.ended_at: float | None = None
        self.repositories = RwRepositories(plan, root)
        self._volume_ready = False
        self._lock = asyncio.Lock()
        #: The last walk a first page made, for the pages after it.
        self.listing = KeptListing()
        self.log = log.bind(session_id=session_id, workspace=plan.host)

    # -- where things are ---------------------------------------------------------------

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def backup(self) -> Path:
        return self.root / "backup"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest"

    @property
    def parents(self) -> Path:
        """The directories on the way to the workspace through a private image directory
        (``private_parent``), bound read-only over it."""
        return self.root / "parents"

    @property
    def spec(self) -> WorkspaceSpec:
        return WorkspaceSpec(path=self.plan.host, mode=self.plan.mode)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    # -- life -----------------------------------------------------------------------------

    @property
    def lower_id(self) -> tuple[int, int] | None:
        return self.plan.identity

    def verify(self) -> None:
        """Raise WorkspaceMoved unless the project path still leads, without a symlink on
        the way, to the directory the session opened (a task of another session with the
        parent directory writable may have moved it and left a link in its place)."""
        changes_fs.check_project(self.plan.host, self.plan.identity)

    async def prepare(self) -> None:
        """Create the upper and work dirs (the merged root takes the upper's owner and
        mode) and take the manifest of the project, once."""
        await self._run(self.verify)
        await self._run(self._prepare_parents)
        if self.plan.mode == "rw":
            await self._run(self._survey)
        if self.plan.mode != "overlay":
            return
        await self._run(self._prepare_dirs)
        if not self.manifest_path.exists():
            manifest = await self._run(self._take_manifest)
            await self._run(manifest.save, self.manifest_path)

    def _survey(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.repositories.survey()

    def _prepare_parents(self) -> None:
        way = private_parent(self.plan.container_path)
        if way is None:
            return
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.parents
        for part in ["", *way[1].split("/")]:
            path = path / part if part else path
            path.mkdir(exist_ok=True, mode=0o755)
            os.chmod(path, 0o755)  # noqa: S103 - empty directories every task must traverse

    def _prepare_dirs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.upper.mkdir(exist_ok=True)
        changes_fs.take_work_dir(self.work)
        uid, gid = self.upper_owner
        os.chown(self.upper, uid, gid)
        os.chmod(self.upper, os.stat(self.plan.host).st_mode & 0o7777)

    def mount_list(self) -> list[Mount]:
        """What a task mounts to see the workspace (``ensure_volume`` first: it checks the
        project is still where it was, and makes the overlay's volume)."""
        volume = self.volume if self.plan.mode == "overlay" else None
        found = mounts(self.plan, volume, ())
        if self.plan.mode == "rw":
            found += self.repositories.mounts()
        way = private_parent(self.plan.container_path)
        if way is not None:
            found.insert(
                0,
                Mount(source=str(self.parents), target=way[0], read_only=True, non_recursive=True),
            )
        return found

    async def check(self) -> None:
        """Before every task's command (a warm container's too): the project is still where
        it was (WorkspaceMoved otherwise), and in ``rw`` mode the repositories tasks created
        since are renamed out of the host git's way."""
        await self._run(self.verify)
        if self.plan.mode == "rw":
            await self._run(self.repositories.sweep)

    async def ensure_volume(self) -> None:
        """Before every task's container: check the project (WorkspaceMoved when its path
        now leads elsewhere; the engine resolves the bind source or the overlay's lower by
        path when it mounts) and, in overlay mode, make the volume once."""
        await self.check()
        if self.plan.mode != "overlay":
            return
        async with self._lock:
            if self._volume_ready:
                return
            opts = (
                f"lowerdir={self.plan.host},upperdir={self.upper},workdir={self.work},"
                f"{OVERLAY_OPTIONS}"
            )
            await self.backend.create_volume(
                VolumeRequest(
                    name=self.volume,
                    driver_opts={"type": "overlay", "device": "overlay", "o": opts},
                    labels=self.labels,
                )
            )
            self._volume_ready = True

    async def unmount(self) -> None:
        """Remove the volume (the engine unmounts the overlay); no container may use it."""
        if self.plan.mode != "overlay":
            return
        async with self._lock:
            await self._unmount_locked()

    async def _unmount_locked(self) -> None:
        try:
            await self.backend.remove_volume(self.volume)
        except EngineError as exc:
            raise PolicyError(
                f"the workspace of session {self.session_id!r} is still mounted by a "
                f"container ({exc}); stop its tasks first"
            ) from exc
        self._volume_ready = False

    async def _offline(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` with the overlay unmounted, holding the lock a new task's volume needs:
        a task started meanwhile waits until the host tree is written."""
        async with self._lock:
            await self._unmount_locked()
            self.listing.forget()  # a page after it must not be cut from a walk before it
            try:
                return await self._run(fn, *args)
            finally:
                self.listing.forget()

    # -- review ---------------------------------------------------------------------------

    def _need_overlay(self, what: str) -> None:
        if self.plan.mode != "overlay":
            raise PolicyError(
                f"{what}: the workspace of session {self.session_id!r} is mode "
                f"{self.plan.mode!r}; only overlay workspaces keep changes to review"
            )

    async def changes(self) -> list[changes_fs.Change]:
        """Every change, each with its digest (what apply compares ``reviewed`` with)."""
        self._need_overlay("changes")
        found: list[changes_fs.Change] = await self._run(self._list)
        return found

    def _list(self) -> list[changes_fs.Change]:
        manifest = changes_fs.Manifest.load(self.manifest_path)
        return changes_fs.list_changes(
            Path(self.plan.host), self.upper, manifest, lower_id=self.lower_id
        )

    def _classify(self) -> list[changes_fs.Change]:
        manifest = changes_fs.Manifest.load(self.manifest_path)
        return changes_fs.classify(
            Path(self.plan.host), self.upper, manifest, lower_id=self.lower_id
        )

    async def changes_page(
        self, *, limit: int = PAGE_DEFAULT, after: str | None = None, ignored: bool = True
    ) -> changes_fs.ChangePage:
        """A page of the changes sorted by path: at most ``limit`` (1 to ``PAGE_MAX``)
        after the cursor ``after`` (see ``core.workspace_pages``), only the page's entries
        hashed. The first page (no ``after``) walks the upper; the pages after it are cut
        from that walk while it is under ``LISTING_KEPT_S`` old (``KeptListing``), else they
        walk again."""
        self._need_overlay("changes")
        check_limit(limit)
        path = None if after is None else cursor_path(after)
        listing = self.listing.get() if path is not None else None
        if listing is None:
            generation = self.listing.generation
            listing = await self._run(self._classify)
            self.listing.put(listing, generation)
        page: changes_fs.ChangePage = await self._run(
            partial(
                changes_fs.page_of, self.upper, listing, limit=limit, after=path, ignored=ignored
            )
        )
        return page

    async def diff(
        self,
        *,
        full: bool = False,
        limit: int | None = None,
        after: str | None = None,
        ignored: bool = False,
    ) -> str:
        """The changes as one unified diff; files over ``LARGE_BYTES`` as sizes and hashes
        unless ``full``. With ``limit``: only the changes of that page (``changes_page``
        with the same ``limit``, ``after`` and ``ignored``). Built off the event loop."""
        self._need_overlay("diff")
        if limit is None:
            return str(await self._run(self._diff, full))
        page = await self.changes_page(limit=limit, after=after, ignored=ignored)
        return str(await self._run(self._diff, full, page.changes))

    def _diff(self, full: bool = False, changes: list[changes_fs.Change] | None = None) -> str:
        return changes_fs.diff(
            Path(self.plan.host),
            self.upper,
            self._classify() if changes is None else changes,
            lower_id=self.lower_id,
            reader=self.reader,
            full=full,
        )

    @property
    def reader(self) -> changes_fs.Reader:
        """Whose permissions decide which old contents a review may show: the tasks' user
        (the upper's owner). A task that deleted a file it could not read must not get its
        bytes through the diff."""
        uid, gid = self.upper_owner
        return changes_fs.Reader(uid, (gid,))

    async def apply(
        self, *, force: bool = False, reviewed: Mapping[str, str] | None = None
    ) -> changes_fs.ApplyResult:
        """Write the non-ignored changes into the host tree (backed up, for undo); with
        ``reviewed`` (path -> the change's digest, as listed), only if they are exactly
        those (WorkspaceConflict otherwise, nothing written)."""
        self._need_overlay("apply")
        result: changes_fs.ApplyResult = await self._offline(self._apply, force, reviewed)
        return result

    def _apply(self, force: bool, reviewed: Mapping[str, str] | None) -> changes_fs.ApplyResult:
        lower = Path(self.plan.host)
        manifest = changes_fs.Manifest.load(self.manifest_path)
        found = changes_fs.list_changes(lower, self.upper, manifest, lower_id=self.lower_id)
        result = changes_fs.apply(
            lower,
            self.upper,
            found,
            self.backup,
            owner=self.plan.owner,
            force=force,
            manifest=manifest,
            lower_id=self.lower_id,
            reviewed=reviewed,
        )
        # What was applied leaves the upper, so the tasks see the host tree again (and the
        # user's later edits to it); what was not (ignored entries: node_modules, .venv)
        # stays and keeps serving them. The apply itself is done and recorded for undo:
        # tidying up after it never turns it into an error (an upper entry left behind
        # equals the host's now, so it lists as no change).
        try:
            changes_fs.prune_upper(self.upper, self.work, found)
        except (OSError, changes_fs.WorkspaceError) as exc:
            self.log.warning("workspace_prune_failed", error=str(exc))
        self._retake_manifest()
        return result

    def _take_manifest(self) -> changes_fs.Manifest:
        return changes_fs.Manifest.take(Path(self.plan.host), lower_id=self.lower_id)

    def _retake_manifest(self) -> None:
        self._take_manifest().save(self.manifest_path)

    async def undo(self, *, force: bool = False) -> changes_fs.UndoResult:
        """Put back what the last apply overwrote, removed or created in the host tree (the
        applied changes themselves left the session's upper with the apply)."""
        self._need_overlay("undo")
        result: changes_fs.UndoResult = await self._offline(self._undo, force)
        return result

    def _undo(self, force: bool) -> changes_fs.UndoResult:
        result = changes_fs.undo(
            Path(self.plan.host), self.backup, force=force, lower_id=self.lower_id
        )
        self._retake_manifest()
        return result

    async def usage(
        self, *, stop_bytes: int | None = None, stop_files: int | None = None
    ) -> LayerUsage:
        """What the upper takes on the host disk (``layer_usage``), measured off the event
        loop."""
        found: LayerUsage = await self._run(
            functools.partial(layer_usage, self.upper, stop_bytes=stop_bytes, stop_files=stop_files)
        )
        return found

    async def has_changes(self) -> bool:
        """Whether the upper holds anything at all (cheap: one directory read)."""
        return bool(await self._run(_non_empty, self.upper))

    async def discard(self) -> None:
        """Drop every change (a fresh, empty upper) and every backup (no undo after it)."""
        self._need_overlay("discard")
        await self._offline(self._discard)

    def _discard(self) -> None:
        fd = changes_fs.open_project(self.plan.host, self.lower_id)
        try:
            mode = os.fstat(fd).st_mode & 0o7777
        finally:
            os.close(fd)
        changes_fs.discard(self.upper, self.work, self.backup, owner=self.upper_owner, mode=mode)
        self._retake_manifest()

    async def remove(self) -> None:
        """Remove everything: the volume and the whole state dir of the workspace (and in
        ``rw`` mode, the repositories' guard: see ``RwRepositories.release``)."""
        await self.unmount()
        if self.plan.mode == "rw":
            try:
                await self._run(self.repositories.release)
            except (OSError, SupervisorError) as exc:
                self.log.warning("workspace_git_release_failed", error=str(exc))
        await self._run(changes_fs.remove_workspace, self.root)

    # -- persistence ----------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(
            {
                "host": self.plan.host,
                "container_path": self.plan.container_path,
                "mode": self.plan.mode,
                "owner": list(self.plan.owner),
                "warning": self.plan.warning,
                "volume": self.volume,
                "upper_owner": list(self.upper_owner),
                "identity": list(self.plan.identity) if self.plan.identity else None,
                "ended_at": self.ended_at,
                **self.repositories.to_json(),
            }
        )

    @staticmethod
    def plan_from_json(data: dict[str, Any]) -> WorkspacePlan:
        return WorkspacePlan(
            host=data["host"],
            container_path=data["container_path"],
            mode=data["mode"],
            owner=(int(data["owner"][0]), int(data["owner"][1])),
            warning=data.get("warning"),
            identity=(int(ident[0]), int(ident[1])) if (ident := data.get("identity")) else None,
        )


def _non_empty(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False
