"""The client's calls of a session's workspace routes: its changes (page by page, or all of
them), the diff, apply, undo and discard. An ended session whose changes are kept answers
them too (to the admin token)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from supervisor.core.workspace_pages import PAGE_DEFAULT, PAGE_MAX

if TYPE_CHECKING:
    from supervisor.interfaces.http import Response


class WorkspaceCalls:
    """Mixed into ``SandvisorClient``, which sends the requests."""

    if TYPE_CHECKING:

        async def _json(self, method: str, path: str, **kwargs: Any) -> Any: ...

        async def _request(
            self,
            method: str,
            path: str,
            *,
            params: dict[str, Any] | None = None,
            json: Any = None,
            ids: tuple[str | None, str | None] = (None, None),
        ) -> Response: ...

    async def workspace_changes_page(
        self,
        session_id: str,
        *,
        ignored: bool = False,
        limit: int = PAGE_DEFAULT,
        after: str | None = None,
    ) -> dict[str, Any]:
        """One page of the changes: ``{"changes": [Change.to_dict(), ...], "total", "next"}``,
        at most ``limit`` (1 to 10 000) after the cursor ``after`` (a page's ``next``);
        ``ignored``: also those .gitignore and the default ignores leave out."""
        path = f"/sessions/{session_id}/workspace/changes"
        params: dict[str, Any] = {"ignored": str(ignored).lower(), "limit": limit}
        if after is not None:
            params["after"] = after
        return dict(await self._json("GET", path, params=params, ids=(session_id, None)))

    async def workspace_changes(
        self,
        session_id: str,
        *,
        ignored: bool = False,
        after: str | None = None,
        on_page: Callable[[int, int], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Every change (after ``after``), read page by page (``PAGE_MAX`` each, one
        snapshot: see ``GET .../workspace/changes``); ``on_page(listed, total)`` after each
        page."""
        found: list[dict[str, Any]] = []
        cursor = after
        while True:
            page = await self.workspace_changes_page(
                session_id, ignored=ignored, limit=PAGE_MAX, after=cursor
            )
            found += page["changes"]
            if on_page is not None:
                on_page(len(found), int(page["total"]))
            cursor = page.get("next")
            if cursor is None or not page["changes"]:
                return found

    @staticmethod
    def reviewed(changes: list[dict[str, Any]]) -> dict[str, str]:
        """The ``reviewed`` argument of ``apply_changes`` for changes as listed."""
        return {
            (f"b64:{c['path_b64']}" if c.get("path_b64") else str(c["path"])): str(c["digest"])
            for c in changes
            if c.get("digest")
        }

    async def workspace_diff(
        self,
        session_id: str,
        *,
        full: bool = False,
        limit: int | None = None,
        after: str | None = None,
        ignored: bool = False,
    ) -> str:
        """The changes as one unified diff that ``git apply`` accepts (``full``: files over
        1 MiB too, else their sizes and hashes); with ``limit``, of the changes of that page
        only (``workspace_changes_page`` with the same ``limit``, ``after``, ``ignored``)."""
        path = f"/sessions/{session_id}/workspace/diff"
        params: dict[str, Any] = {"full": "true"} if full else {}
        if limit is not None:
            params.update(limit=limit, ignored=str(ignored).lower())
            if after is not None:
                params["after"] = after
        response = await self._request("GET", path, params=params, ids=(session_id, None))
        return response.content.decode("utf-8", "surrogateescape")

    async def apply_changes(
        self,
        session_id: str,
        *,
        force: bool = False,
        stop_tasks: bool = False,
        reviewed: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Write the changes into the host project (``ApplyResult``). WorkspaceConflict
        (with ``paths``) for host edits unless ``force``, and when ``reviewed`` (path ->
        digest from ``workspace_changes``) is not exactly what would be applied;
        WorkspaceBusy (with ``task_ids``) while tasks run unless ``stop_tasks``."""
        path = f"/sessions/{session_id}/workspace/apply"
        body: dict[str, Any] = {"force": force, "stop_tasks": stop_tasks}
        if reviewed is not None:
            body["reviewed"] = dict(reviewed)
        return dict(await self._json("POST", path, json=body, ids=(session_id, None)))

    async def discard_changes(self, session_id: str, *, stop_tasks: bool = False) -> None:
        """Drop every change (and the backups: no undo after it)."""
        path = f"/sessions/{session_id}/workspace/discard"
        await self._request("POST", path, json={"stop_tasks": stop_tasks}, ids=(session_id, None))

    async def undo_apply(
        self, session_id: str, *, force: bool = False, stop_tasks: bool = False
    ) -> dict[str, Any]:
        """Put the host project back as before the last apply (``UndoResult``); NoBackup
        when nothing was applied."""
        path = f"/sessions/{session_id}/workspace/undo"
        body = {"force": force, "stop_tasks": stop_tasks}
        return dict(await self._json("POST", path, json=body, ids=(session_id, None)))
