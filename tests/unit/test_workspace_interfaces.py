"""The interfaces' own workspace logic, without a daemon: the CLI's session per directory
and what it takes as the workspace, its error texts, the MCP texts (bounded, per mode),
the workspace errors on the wire."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.ids import SESSION_ID_RE
from supervisor.core.workspace_errors import NoWorkspace, WorkspaceBusy, WorkspaceOutsideRoots
from supervisor.interfaces.cli.project import dir_session_id, workspace_choice
from supervisor.interfaces.cli.remote import CliError
from supervisor.interfaces.cli.workspace import SHOWN_PATHS, _conflict_text, _notes, _size
from supervisor.interfaces.http_errors import from_wire, status_of
from supervisor.interfaces.mcp import workspace_texts as wt
from supervisor.interfaces.mcp.texts import MAX_OUTPUT_CHARS


def test_dir_session_ids_name_the_directory_and_differ_by_path(tmp_path: Path) -> None:
    a, b = tmp_path / "my app", tmp_path / "other" / "my app"
    a.mkdir()
    b.mkdir(parents=True)
    sa, sb = dir_session_id(a), dir_session_id(b)
    assert sa.startswith("ws-my-app-") and sb.startswith("ws-my-app-")
    assert sa != sb
    assert dir_session_id(a) == sa  # stable
    link = tmp_path / "link"
    link.symlink_to(a)
    assert dir_session_id(link) == sa  # the realpath counts


@given(st.text(min_size=1, max_size=300).filter(lambda s: "/" not in s and "\x00" not in s))
def test_dir_session_ids_are_always_valid_session_ids(name: str) -> None:
    sid = dir_session_id(f"/projects/{name}")
    assert SESSION_ID_RE.match(sid), sid
    assert len(sid) <= 64


def _args(**over: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"no_workspace": False, "workspace": None, "workspace_mode": None}
    return argparse.Namespace(**{**base, **over})


def test_workspace_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "p"
    project.mkdir()
    monkeypatch.chdir(project)
    assert workspace_choice(_args(no_workspace=True)) is None
    here = workspace_choice(_args())
    assert here is not None and here.path == str(project) and here.mode == "overlay"
    assert not here.explicit and not here.mode_explicit
    named = workspace_choice(_args(workspace=tmp_path / "p", workspace_mode="ro"))
    assert named is not None and named.explicit and named.mode == "ro" and named.mode_explicit
    with pytest.raises(CliError, match="not a directory"):
        workspace_choice(_args(workspace=tmp_path / "missing"))
    # The home directory is nobody's project: never taken implicitly.
    monkeypatch.setenv("HOME", str(project))
    assert workspace_choice(_args()) is None
    with pytest.raises(CliError, match="pass --workspace DIR"):
        workspace_choice(_args(workspace_mode="rw"))
    assert workspace_choice(_args(workspace=project)) is not None


def test_conflict_text_lists_paths_and_says_how_to_force() -> None:
    paths = [f"f{i}.txt" for i in range(SHOWN_PATHS + 5)]
    text = _conflict_text("apply", paths)
    lines = text.splitlines()
    assert lines[0].startswith(f"apply refused, nothing was written: {len(paths)} path(s)")
    assert lines[1] == "  f0.txt" and "  ... and 5 more" in lines
    assert "--force overwrites them" in lines[-1]
    assert "--force undoes the rest" in _conflict_text("undo", ["a"])


def test_change_notes_and_sizes() -> None:
    change = {
        "kind": "modified",
        "file_type": "file",
        "old_mode": 0o644,
        "new_mode": 0o755,
        "conflict": True,
        "conflict_reason": "changed on the host since the session started",
        "ignored": False,
        "binary": True,
    }
    notes = _notes(change)
    assert notes.startswith("CONFLICT: changed on the host") and "mode 644 -> 755" in notes
    assert "binary" in notes
    assert _size(5000, plain=True) == "5000" and _size(5000, plain=False) == "4.9 KiB"
    assert _size(3 * 1024**3, plain=False) == "3.0 GiB"


WS = {"path": "/p", "container_path": "/p", "mode": "overlay", "owner": {"uid": 1, "gid": 1}}


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("overlay", "until the user reviews and applies"),
        ("ro", "read-only: writes to it fail, and nothing persists"),
        ("rw", "writes go straight to the project on the host"),
    ],
)
def test_the_bash_description_says_what_persists(mode: str, says: str) -> None:
    text = wt.bash_description({**WS, "mode": mode})
    assert says in text and "/tmp and HOME are fresh" in text
    assert "reach each other by task id" in text
    assert says in wt.instructions({**WS, "mode": mode})


def test_without_a_workspace_nothing_persists() -> None:
    assert "nothing persists between calls" in wt.bash_description(None)
    assert wt.not_reviewable(None) is not None
    assert wt.not_reviewable({**WS, "mode": "ro"}) is not None
    assert wt.not_reviewable(WS) is None


def _page(found: list[dict[str, Any]], total: int, following: str | None) -> dict[str, Any]:
    return {"changes": found, "total": total, "next": following}


def test_changes_text_is_bounded_and_gives_the_next_pages_cursor() -> None:
    found = [
        {"path": f"f{i:04}", "kind": "added", "file_type": "file", "size": 10}
        for i in range(wt.MAX_LISTED)
    ]
    diff = "".join(f"diff --git a/f{i} b/f{i}\n+{'x' * 1000}\n" for i in range(wt.MAX_LISTED))
    text = wt.changes_text(WS, "s1", _page(found, 1000, "f0199"), diff)
    assert len(text) <= MAX_OUTPUT_CHARS
    assert "1000 change(s) not applied to the project yet; 200 of them here" in text
    assert "diff truncated" in text
    # One line, with the cursor as a JSON string the agent passes back exactly.
    assert 'call workspace_changes with after="f0199" for the next ones.\n' in text
    assert text.endswith("(`sandvisor workspace apply --session s1`).")
    small = wt.changes_text(WS, "s1", _page(found[:1], 1, None), "diff --git a/f0 b/f0\n+x\n")
    assert "added     f0000 (10 bytes)" in small and "--- diff ---\ndiff --git" in small
    assert "More changes follow" not in small and "of them here" not in small
    assert "no changes" in wt.changes_text(WS, "s1", _page([], 0, None), "")


def test_changes_text_of_a_later_page_and_a_hostile_cursor() -> None:
    hostile = 'a "quoted"\nname\u202e'
    one = [{"path": "z", "kind": "deleted", "file_type": "dir", "size": 0}]
    text = wt.changes_text(WS, "s1", _page(one, 5, hostile), None, after="y")
    assert 'of them here, sorted by path, after "y"' in text
    assert "deleted   z/" in text
    # Newline, quotes and the bidi override come as JSON escapes: one line, exact.
    assert 'after="a \\"quoted\\"\\nname\\u202e" for the next ones.' in text
    assert "no changes after" in wt.changes_text(WS, "s1", _page([], 5, None), None, after="z")


@pytest.mark.parametrize(
    "exc",
    [
        WorkspaceBusy("apply: still runs 1 task(s)", ["bg-00000001"]),
        WorkspaceOutsideRoots("workspace '/x' is not under an allowed root", ["/home/u"]),
        NoWorkspace("changes: session 's' has no workspace"),
    ],
)
def test_workspace_errors_round_trip(exc: Any) -> None:
    back = from_wire(exc.to_wire(), status_of(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert back.wire_detail() == exc.wire_detail()
    assert isinstance(WorkspaceOutsideRoots("x"), ValueError)  # still a PolicyError


class _RacingClient:
    """A daemon where another command opens ``sid`` (no workspace) between the CLI's look-up
    and its create: the create is refused as a daemon refuses a changed workspace."""

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.open: dict[str, Any] | None = None
        self.creates = 0

    async def session(self, session_id: str) -> dict[str, Any]:
        from supervisor.core.errors import SessionNotFound  # noqa: PLC0415

        if self.open is None:
            self.open = {"session_id": session_id, "workspace": None}  # the other command
            raise SessionNotFound(session_id)
        return self.open

    async def create_session(self, session_id: str, **_: Any) -> None:
        from supervisor.core.errors import PolicyError  # noqa: PLC0415

        self.creates += 1
        raise PolicyError(f"session {session_id!r} is open with workspace none; ...")


def _run_args(**kw: Any) -> argparse.Namespace:
    base = {"session": "s2", "no_workspace": False, "workspace": None, "workspace_mode": None}
    return argparse.Namespace(**{**base, **kw})


async def test_a_session_opened_by_another_command_meanwhile_is_the_one_run_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.interfaces.cli.project import open_run_session  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)  # the current directory: only a default workspace
    client = _RacingClient("s2")
    assert await open_run_session(client, _run_args()) == "s2"  # type: ignore[arg-type]
    assert client.creates == 1
    # Named outright, a different workspace is still an error that says which one is fixed.
    client = _RacingClient("s2")
    with pytest.raises(CliError, match=r"session s2 is open with no workspace"):
        await open_run_session(client, _run_args(workspace=tmp_path))  # type: ignore[arg-type]
