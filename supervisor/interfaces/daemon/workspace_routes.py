"""Routes of a session's workspace: its changes listed, shown as a diff, applied, undone and
discarded.

They answer for an open session (its own token or the admin's) and, with the admin token,
for an ended session whose changes are kept (its tokens were revoked when it ended). Another
session's token gets the same 404 as a session that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import Enum
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query
from fastapi.responses import Response
from pydantic import AfterValidator

from supervisor.core.errors import SessionNotFound
from supervisor.core.workspace_pages import CURSOR_MAX, PAGE_DEFAULT, PAGE_MAX
from supervisor.interfaces.daemon.auth import Principal
from supervisor.interfaces.daemon.bodies import ApplyBody, DiscardBody, UndoBody
from supervisor.interfaces.daemon.deps import BOOLEAN, INTEGER, SessionId, Who
from supervisor.interfaces.daemon.replies import ChangesPage, Discarded, error_responses
from supervisor.runtime.session import Session
from supervisor.runtime.supervisor import Supervisor
from supervisor.runtime.workspace import Workspace
from supervisor.state.workspace import ApplyResult, ChangePage, UndoResult

_WS = "/sessions/{session_id}/workspace"
_TAGS: list[str | Enum] = ["workspace"]


class DiffResponse(Response):
    """A unified diff (documented as ``text/x-diff``, not JSON)."""

    media_type = "text/x-diff"


_DIFF: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The changes apply would make, as one unified diff that `git apply` "
        "accepts in the project (ignored changes and special files left out)",
        "content": {"text/x-diff": {"schema": {"type": "string"}}},
    }
}
#: Errors of the routes that change the host tree or the overlay.
_ACTING = (400, 404, 409, 413, 502, 503)


class _Target:
    """One session's workspace as a route acts on it: through the open session (which
    stops its tasks first when asked, and refuses while they run), or directly for an ended
    session whose changes are kept (nothing of it runs any more)."""

    def __init__(self, sup: Supervisor, session_id: str, who: Principal) -> None:
        if not who.admin and who.session_id != session_id:
            raise SessionNotFound(session_id)
        self.sup = sup
        self.session_id = session_id
        self.session: Session | None = None
        self.kept: Workspace | None = None
        try:
            self.session = sup.session(session_id)
        except SessionNotFound:
            if not who.admin:
                raise
            # Raises SessionNotFound when no changes of this session are kept either.
            self.kept = sup.workspace(session_id)

    async def changes(self, limit: int, after: str | None, ignored: bool) -> ChangePage:
        if self.session is not None:
            return await self.session.workspace_changes_page(
                limit=limit, after=after, ignored=ignored
            )
        assert self.kept is not None
        return await self.kept.changes_page(limit=limit, after=after, ignored=ignored)

    async def diff(self, full: bool, limit: int | None, after: str | None, ignored: bool) -> str:
        if self.session is not None:
            return await self.session.workspace_diff(
                full=full, limit=limit, after=after, ignored=ignored
            )
        assert self.kept is not None
        return await self.kept.diff(full=full, limit=limit, after=after, ignored=ignored)

    async def apply(self, body: ApplyBody) -> ApplyResult:
        if self.session is not None:
            return await self.session.apply_changes(
                force=body.force, stop_tasks=body.stop_tasks, reviewed=body.reviewed
            )
        assert self.kept is not None
        return await self.kept.apply(force=body.force, reviewed=body.reviewed)

    async def undo(self, body: UndoBody) -> UndoResult:
        if self.session is not None:
            return await self.session.undo_apply(force=body.force, stop_tasks=body.stop_tasks)
        assert self.kept is not None
        return await self.kept.undo(force=body.force)

    async def discard(self, body: DiscardBody) -> None:
        if self.session is not None:
            await self.session.discard_changes(stop_tasks=body.stop_tasks)
            return
        # An ended session's workspace holds nothing but its changes (and the backups of
        # its applies): discarding them is removing it.
        await self.sup.workspaces.drop(self.session_id)


def _encode_page(page: ChangePage) -> bytes:
    """The JSON answer (a worker thread's job: a page holds up to 10 000 changes)."""
    return json.dumps(page.to_dict()).encode()


def _page_size(limit: int | None) -> int | None:
    """The range checked here, so the 422 says all of it (``ge``/``le`` name one bound)."""
    if limit is not None and not 1 <= limit <= PAGE_MAX:
        raise ValueError(f"must be an integer from 1 to {PAGE_MAX} (got {limit})")
    return limit


#: The range in the OpenAPI document; ``_page_size`` enforces it.
_RANGE = {"minimum": 1, "maximum": PAGE_MAX}
#: ``limit``: changes in a page.
_Limit = Annotated[
    int,
    Query(description=f"Changes in the page, 1 to {PAGE_MAX}", json_schema_extra=_RANGE),
    INTEGER,
    AfterValidator(_page_size),
]
#: ``limit`` of the diff: none for the whole diff.
_DiffLimit = Annotated[
    int | None,
    Query(
        description=f"Only the changes of this page (1 to {PAGE_MAX}), as `changes` cuts it "
        "with the same `limit`, `after` and `ignored`; omitted: the whole diff",
        json_schema_extra=_RANGE,
    ),
    INTEGER,
    AfterValidator(_page_size),
]
#: ``after``: the cursor, a path.
_After = Annotated[
    str | None,
    Query(
        max_length=CURSOR_MAX,
        description="Only the changes after this path in the listing's order (a page's "
        "`next`); a name that is not UTF-8 or begins with `b64:` as `b64:` and the base64 of "
        "its bytes",
    ),
]


def add_workspace_routes(api: FastAPI, sup: Supervisor) -> None:
    """The workspace routes over ``sup`` (on the app itself, like the task routes)."""
    # Two applies (or an apply and an undo) of one workspace must not interleave: each
    # reads the upper and writes the host tree and the backup journal.
    locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @asynccontextmanager
    async def exclusive(session_id: str) -> AsyncIterator[None]:
        lock = locks.get(session_id)
        if lock is None:
            lock = locks[session_id] = asyncio.Lock()
        async with lock:
            yield

    @api.get(
        f"{_WS}/changes",
        tags=_TAGS,
        response_model=ChangesPage,
        responses=error_responses(400, 404, 409),
    )
    async def workspace_changes(
        session_id: SessionId,
        who: Who,
        ignored: Annotated[bool, Query(), BOOLEAN] = False,
        limit: _Limit = PAGE_DEFAULT,
        after: _After = None,
    ) -> Response:
        """A page of what the session's tasks changed in its overlay workspace, sorted by
        path (``ignored=true``: also what .gitignore and the default ignores leave out,
        such as node_modules or .venv): at most ``limit`` changes after ``after``, with
        ``total`` and ``next`` (the ``after`` of the next page, null after the last). Each
        change says whether it conflicts with a host edit. The first page walks the
        session's layer; the pages after it are cut from that walk for 60 s (one snapshot),
        and only a page's own files are hashed."""
        target = _Target(sup, session_id, who)
        page = await target.changes(limit, after, ignored)
        body = await asyncio.to_thread(_encode_page, page)
        return Response(body, media_type="application/json")

    @api.get(
        f"{_WS}/diff",
        tags=_TAGS,
        response_class=DiffResponse,
        responses={**_DIFF, **error_responses(400, 404, 409)},
    )
    async def workspace_diff(
        session_id: SessionId,
        who: Who,
        full: Annotated[bool, Query(), BOOLEAN] = False,
        limit: _DiffLimit = None,
        after: _After = None,
        ignored: Annotated[bool, Query(), BOOLEAN] = False,
    ) -> DiffResponse:
        """The changes as one unified diff (``git apply`` accepts it in the project). Files
        over 1 MiB are a comment with their sizes and sha256 unless ``full=true``. With
        ``limit``: the diff of one page of ``changes`` only (the same ``limit``, ``after``
        and ``ignored``; ignored changes are still left out of the diff itself)."""
        text = await _Target(sup, session_id, who).diff(full, limit, after, ignored)
        data = await asyncio.to_thread(text.encode, "utf-8", "surrogateescape")
        return DiffResponse(data, media_type="text/x-diff; charset=utf-8")

    @api.post(
        f"{_WS}/apply",
        tags=_TAGS,
        response_model=ApplyResult,
        responses=error_responses(*_ACTING),
    )
    async def workspace_apply(
        session_id: SessionId,
        who: Who,
        body: Annotated[ApplyBody | None, Body()] = None,
    ) -> ApplyResult:
        """Write the changes (not the ignored ones) into the host project, backing up what
        they overwrite; host files changed since the session started are a 409 naming them,
        unless ``force``. The session's running tasks are a 409 naming them, unless
        ``stop_tasks``."""
        target = _Target(sup, session_id, who)
        async with exclusive(session_id):
            return await target.apply(body or ApplyBody())

    @api.post(
        f"{_WS}/undo",
        tags=_TAGS,
        response_model=UndoResult,
        responses=error_responses(*_ACTING),
    )
    async def workspace_undo(
        session_id: SessionId,
        who: Who,
        body: Annotated[UndoBody | None, Body()] = None,
    ) -> UndoResult:
        """Put the host project back as it was before the last apply. The applied changes
        left the session's layer at apply, so they are not pending again. 404
        (workspace_no_backup) when nothing was applied."""
        target = _Target(sup, session_id, who)
        async with exclusive(session_id):
            return await target.undo(body or UndoBody())

    @api.post(
        f"{_WS}/discard",
        tags=_TAGS,
        response_model=Discarded,
        responses=error_responses(*_ACTING),
    )
    async def workspace_discard(
        session_id: SessionId,
        who: Who,
        body: Annotated[DiscardBody | None, Body()] = None,
    ) -> dict[str, Any]:
        """Drop every change (and every backup: no undo after it). For an ended session,
        this removes what was kept of it."""
        target = _Target(sup, session_id, who)
        async with exclusive(session_id):
            await target.discard(body or DiscardBody())
        return {"session_id": session_id, "discarded": True}
