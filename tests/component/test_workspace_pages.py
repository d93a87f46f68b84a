"""``GET .../workspace/changes`` in pages, through the daemon's app on the fake engine: the
changes written straight into the session's upper (no container needed to list them), read
page by page with ``limit`` and ``after`` (hostile names included), the range errors, the
pages after a first one cut from its walk, the diff of one page, and the project's client
reading every page for an apply's review."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import httpx

from supervisor.core.workspace_pages import PAGE_MAX
from tests.component.daemon_app import InProcessDaemon
from tests.e2e.projects import make_project
from tests.unit.workspace_tools import build, needs_root, whiteout

pytestmark = needs_root

SID = "pages"
CHANGES = f"/sessions/{SID}/workspace/changes"
NAMES = [
    "a",
    "a-b",
    "a.b",
    "a/b",
    "a0",
    "line\nbreak",
    'quote"d',
    "bidi\u202etxt",
    "caf\u00e9",
    "b64:aGk=",
    os.fsdecode(b"latin1-\xe9"),
]


async def _open(daemon: InProcessDaemon, tmp_path: Path) -> Path:
    """A session on a project with a directory to delete; its upper, filled with changes."""
    project = make_project(tmp_path / "projects" / "p", {"README": "r\n", "old/x.txt": "x\n"})
    async with daemon.client() as c:
        r = await c.post("/sessions", json={"session_id": SID, "workspace": {"path": str(project)}})
        assert r.status_code == 201, r.text
    upper = daemon.sup.workspace(SID).upper
    build(upper, {n: os.fsencode(n) + b"\n" for n in NAMES if n != "a"})
    build(upper, {"a/b": b"under a\n", "node_modules/m.js": b"m\n"})
    whiteout(upper, "old")  # a deleted directory
    return upper


def _path(change: dict[str, Any]) -> str:
    raw = change.get("path_b64")
    return os.fsdecode(base64.b64decode(raw)) if raw else str(change["path"])


async def _pages(c: httpx.AsyncClient, limit: int, **params: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        query: dict[str, Any] = {"limit": limit, **params}
        if after is not None:
            query["after"] = after
        r = await c.get(CHANGES, params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["changes"]) <= limit
        seen += page["changes"]
        if page["next"] is None:
            return seen
        after = page["next"]


async def test_pages_read_in_turn_are_the_whole_listing(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    await _open(daemon, tmp_path)
    everything = await daemon.sup.session(SID).workspace_changes()
    visible = [c for c in everything if not c.ignored]
    async with daemon.client() as c:
        whole = (await c.get(CHANGES)).json()
        assert whole["next"] is None and whole["total"] == len(visible) == len(whole["changes"])
        assert sum(1 for ch in whole["changes"] if ch.get("path_b64")) == 1
        for limit in (1, 2, 3, PAGE_MAX):
            seen = await _pages(c, limit)
            assert [(_path(ch), ch["digest"]) for ch in seen] == [
                (ch.path, ch.digest) for ch in visible
            ]
        with_ignored = await _pages(c, 2, ignored="true")
        assert [_path(ch) for ch in with_ignored] == [ch.path for ch in everything]
        first = (await c.get(CHANGES, params={"limit": 2})).json()
        assert first["total"] == len(visible) and first["next"] == "a-b"
        gone = [ch for ch in seen if ch["path"] == "old"]
        assert [(ch["kind"], ch["file_type"]) for ch in gone] == [("deleted", "dir")]


async def test_the_range_and_the_cursor_are_checked(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    await _open(daemon, tmp_path)
    async with daemon.client() as c:
        for bad in ("0", str(PAGE_MAX + 1), "-3", "1.5", "many"):
            r = await c.get(CHANGES, params={"limit": bad})
            assert r.status_code == 422, r.text
            error = r.json()["error"]
            assert [f["field"] for f in error["fields"]] == ["query.limit"], error
            if bad in ("0", "-3", str(PAGE_MAX + 1)):
                assert error["message"].startswith(
                    f"query.limit: must be an integer from 1 to {PAGE_MAX} (got "
                ), error
        r = await c.get(CHANGES, params={"after": "b64:not base64!"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "after", r.text
        r = await c.get(f"/sessions/{SID}/workspace/diff", params={"limit": "0"})
        assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "query.limit", (
            r.text
        )


async def test_the_pages_after_the_first_are_one_snapshot(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    upper = await _open(daemon, tmp_path)
    async with daemon.client() as c:
        first = (await c.get(CHANGES, params={"limit": 1})).json()
        assert first["changes"][0]["path"] == "a"
        (upper / "a-a").write_bytes(b"new, before the cursor\n")
        (upper / "zz").write_bytes(b"new, after it\n")
        rest = await _pages(c, 3)  # a first page again: a new walk
        assert {"a-a", "zz"} <= {ch["path"] for ch in rest}
        first = (await c.get(CHANGES, params={"limit": 1})).json()
        (upper / "zzz").write_bytes(b"written between two pages\n")
        later = (await c.get(CHANGES, params={"limit": PAGE_MAX, "after": first["next"]})).json()
        assert "zzz" not in {ch["path"] for ch in later["changes"]}, "cut from the first's walk"
        assert later["total"] == first["total"]
        # What a page shows of a file is read as the page is cut: its digest is of now.
        (upper / "zz").write_bytes(b"changed\n")
        again = (await c.get(CHANGES, params={"limit": PAGE_MAX, "after": first["next"]})).json()
        zz = [ch["digest"] for ch in (later, again) for ch in ch["changes"] if ch["path"] == "zz"]
        assert zz[0] != zz[1]


async def test_the_diff_of_a_page_and_an_apply_reviewed_page_by_page(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    await _open(daemon, tmp_path)
    async with daemon.client() as c:
        page = (await c.get(CHANGES, params={"limit": 2, "after": "a"})).json()
        assert [ch["path"] for ch in page["changes"]] == ["a-b", "a.b"]
        r = await c.get(
            f"/sessions/{SID}/workspace/diff", params={"limit": 2, "after": "a", "full": "true"}
        )
        assert r.status_code == 200
        assert {
            line[len("diff --git a/") :].split()[0]
            for line in r.text.splitlines()
            if line.startswith("diff --git")
        } == {"a-b", "a.b"}
        whole = (await c.get(f"/sessions/{SID}/workspace/diff")).text
        assert "diff --git a/a/b b/a/b" in whole and whole.count("diff --git") > 2
    client = daemon.sandvisor_client()
    progress: list[tuple[int, int]] = []
    listed = await client.workspace_changes(SID, on_page=lambda n, t: progress.append((n, t)))
    review = client.reviewed(listed)
    assert len(review) == len(listed) == progress[-1][0] == progress[-1][1]
    result = await client.apply_changes(SID, reviewed=review)
    assert len(result["applied"]) >= len(NAMES)
    assert (await client.workspace_changes_page(SID, limit=1))["total"] == 0
