"""The workspace routes of the HTTP API against a real daemon and engine: a session opened on
a project, its changes listed, diffed, applied (refused while tasks run, and on host edits
unless forced), undone and discarded; the token rules; an ended session's kept changes;
the refusals."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.e2e.conftest import Daemon, projects_root
from tests.e2e.projects import OWNER, contents, make_project, tree_hash
from tests.unit.workspace_tools import git_apply, git_view
from tests.users import root_only

pytestmark = pytest.mark.timeout(180)

FILES = {
    "a.txt": "v1\n",
    "gone.txt": "bye\n",
    "old-name.txt": "rename me\n",
    "run.sh": "#!/bin/sh\necho hi\n",
    "src/lib.py": "X = 1\n",
}
AGENT = (
    "set -e; echo v2 > a.txt; rm gone.txt; mv old-name.txt new-name.txt; chmod 755 run.sh; "
    "echo new > src/new.py; mkdir -p node_modules/dep; echo 'module.exports = 1' > "
    "node_modules/dep/index.js"
)
EXPECTED = {
    "a.txt": "modified",
    "gone.txt": "deleted",
    "new-name.txt": "added",
    "old-name.txt": "deleted",
    "run.sh": "mode",
    "src/new.py": "added",
}


def run(c: httpx.Client, sid: str, command: str, policy: str = "fast") -> dict[str, Any]:
    """Start ``command`` in session ``sid`` and wait for its end."""
    r = c.post(f"/sessions/{sid}/tasks", json={"command": command, "policy": policy})
    assert r.status_code == 201, r.text
    tid = r.json()["task_id"]
    done = c.post(f"/sessions/{sid}/tasks/{tid}/wait", json={"timeout_s": 60}).json()
    assert done["timed_out"] is False
    task: dict[str, Any] = done["task"]
    task["output"] = c.get(f"/sessions/{sid}/tasks/{tid}/tail").json()["text"]
    return task


def kinds(changes: list[dict[str, Any]]) -> dict[str, str]:
    return {c["path"]: c["kind"] for c in changes}


def error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body: dict[str, Any] = r.json()["error"]
    assert body["code"] == code, body
    return body


def open_session(c: httpx.Client, sid: str, path: Path, mode: str = "overlay") -> dict[str, Any]:
    r = c.post(
        "/sessions", json={"session_id": sid, "workspace": {"path": str(path), "mode": mode}}
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def volumes_of(sid: str) -> list[str]:
    client = docker.from_env()
    try:
        return [v.name for v in client.volumes.list() if v.name.startswith(f"sandvisor-ws-{sid}-")]
    finally:
        client.close()


def test_changes_diff_apply_undo_discard(daemon: Daemon, tmp_path: Path) -> None:
    project = make_project(projects_root(tmp_path) / "app", FILES)
    pristine = tree_hash(project)
    with daemon.client() as c:
        created = open_session(c, "w1", project)
        ws = created["workspace"]
        assert ws == {
            "path": str(project),
            "container_path": str(project),
            "mode": "overlay",
            "owner": {"uid": OWNER[0], "gid": OWNER[1]},
            "warning": None,
        }
        assert c.get("/sessions/w1").json()["workspace"] == ws
        assert [s["workspace"] for s in c.get("/sessions").json()] == [ws]

        task = run(c, "w1", f"pwd; id -u; {AGENT}")
        assert task["exit_code"] == 0, task
        assert task["output"].splitlines()[:2] == [str(project), str(OWNER[0])]
        assert tree_hash(project) == pristine  # nothing reached the host

        listed = c.get("/sessions/w1/workspace/changes").json()["changes"]
        assert kinds(listed) == EXPECTED
        by_path = {ch["path"]: ch for ch in listed}
        assert by_path["run.sh"]["old_mode"] == 0o644 and by_path["run.sh"]["new_mode"] == 0o755
        assert by_path["a.txt"]["size"] == 3 and not by_path["a.txt"]["conflict"]
        everything = c.get("/sessions/w1/workspace/changes", params={"ignored": "true"}).json()[
            "changes"
        ]
        ignored = {ch["path"] for ch in everything if ch["ignored"]}
        assert "node_modules" in ignored and set(kinds(everything)) >= set(EXPECTED)

        # The diff is what apply would write: git apply makes a copy of the project equal
        # the merged view (ignored node_modules left out).
        diff = c.get("/sessions/w1/workspace/diff")
        assert diff.status_code == 200
        assert diff.headers["content-type"].startswith("text/x-diff")
        copy = tmp_path / "copy"
        shutil.copytree(project, copy, symlinks=True)
        git_apply(diff.text, copy)
        view = git_view(copy)
        assert view["a.txt"][2] == b"v2\n" and view["src/new.py"][2] == b"new\n"
        assert "gone.txt" not in view and view["run.sh"][1] is True

        # A running task holds the overlay: apply names it and changes nothing.
        r = c.post("/sessions/w1/tasks", json={"command": "exec sleep 300", "policy": "fast"})
        sleeper = r.json()["task_id"]
        busy = error(c.post("/sessions/w1/workspace/apply", json={}), 409, "workspace_busy")
        assert busy["task_ids"] == [sleeper] and "stop_tasks" in busy["message"]

        # A host edit since the session started: refused, naming it, nothing written.
        (project / "a.txt").write_text("host edit\n")
        edited = tree_hash(project)
        conflict = error(
            c.post("/sessions/w1/workspace/apply", json={"stop_tasks": True}),
            409,
            "workspace_conflict",
        )
        assert conflict["paths"] == ["a.txt"]
        assert tree_hash(project) == edited
        assert c.get(f"/sessions/w1/tasks/{sleeper}").json()["status"] == "killed"

        applied = c.post("/sessions/w1/workspace/apply", json={"force": True})
        assert applied.status_code == 200, applied.text
        result = applied.json()
        assert result["forced"] == ["a.txt"]
        assert set(result["applied"]) == set(EXPECTED)
        assert {s["path"]: s["reason"] for s in result["skipped"]} == {"node_modules": "ignored"}
        after = contents(project)
        assert after["a.txt"] == "v2\n" and after["src/new.py"] == "new\n"
        assert "gone.txt" not in after and "new-name.txt" in after
        assert stat.S_IMODE(os.stat(project / "run.sh").st_mode) == 0o755
        assert os.stat(project / "src/new.py").st_uid == OWNER[0]
        assert not (project / "node_modules").exists()
        assert c.get("/sessions/w1/workspace/changes").json()["changes"] == []

        undone = c.post("/sessions/w1/workspace/undo")  # no body: the defaults
        assert undone.status_code == 200, undone.text
        assert set(undone.json()["removed"]) >= {"src/new.py", "new-name.txt"}
        assert contents(project)["a.txt"] == "host edit\n"
        # The applied changes left the session's layer at apply (so host edits after it
        # show through); undo puts the project back, not the layer: nothing to review.
        assert c.get("/sessions/w1/workspace/changes").json()["changes"] == []
        error(c.post("/sessions/w1/workspace/undo", json={}), 404, "workspace_no_backup")

        discarded = c.post("/sessions/w1/workspace/discard", json={"stop_tasks": False})
        assert discarded.json() == {"session_id": "w1", "discarded": True}
        assert (
            c.get("/sessions/w1/workspace/changes", params={"ignored": "true"}).json()["changes"]
            == []
        )
        # The overlay still serves the session's tasks after a discard, from the host tree.
        assert run(c, "w1", "cat a.txt")["output"] == "host edit\n"

        # Bodies: over the route's limit before it is read; strict types.
        big = c.post("/sessions/w1/workspace/undo", json={"force": False, "x": "y" * 2000})
        error(big, 413, "request_too_large")
        error(c.post("/sessions/w1/workspace/apply", json={"force": 1}), 422, "invalid_request")
        typo = c.get("/sessions/w1/workspace/changes", params={"ignore": "true"})
        assert error(typo, 422, "invalid_request")["fields"][0]["field"] == "query.ignore"
        ended = c.delete("/sessions/w1").json()
        assert ended["workspace_kept"] is False  # nothing left to review
    assert volumes_of("w1") == []
    assert not (daemon.state_dir / "ws" / "w1").exists()


def test_token_rules_and_an_ended_sessions_kept_changes(daemon: Daemon, tmp_path: Path) -> None:
    project = make_project(projects_root(tmp_path) / "app", FILES)
    pristine = tree_hash(project)
    routes = [
        ("GET", "changes"),
        ("GET", "diff"),
        ("POST", "apply"),
        ("POST", "undo"),
        ("POST", "discard"),
    ]
    with daemon.client() as admin:
        mine = open_session(admin, "mine", project)["token"]
        other = admin.post("/sessions", json={"session_id": "other"}).json()["token"]
        assert run(admin, "mine", "echo agent > agent.txt")["exit_code"] == 0
        with daemon.client(other) as c:
            for method, route in routes:
                r = c.request(method, f"/sessions/mine/workspace/{route}")
                error(r, 404, "session_not_found")
            # Its own session has no workspace: nothing to review.
            error(c.get("/sessions/other/workspace/changes"), 404, "no_workspace")
        with daemon.client(mine) as c:
            assert kinds(c.get("/sessions/mine/workspace/changes").json()["changes"]) == {
                "agent.txt": "added"
            }

        # Ended: the changes are kept, the session's token is revoked, the admin reviews.
        ended = admin.delete("/sessions/mine").json()
        assert ended == {
            "session_id": "mine",
            "ended": True,
            "tasks_stopped": 0,
            "workspace_kept": True,
        }
        error(admin.get("/sessions/mine"), 404, "session_not_found")
        with daemon.client(mine) as c:
            error(c.get("/sessions/mine/workspace/changes"), 401, "unauthorized")
        with daemon.client(other) as c:
            error(c.get("/sessions/mine/workspace/changes"), 404, "session_not_found")
        assert kinds(admin.get("/sessions/mine/workspace/changes").json()["changes"]) == {
            "agent.txt": "added"
        }
        assert "+agent" in admin.get("/sessions/mine/workspace/diff").text
        assert tree_hash(project) == pristine
        applied = admin.post("/sessions/mine/workspace/apply", json={})
        assert applied.json()["applied"] == ["agent.txt"], applied.text
        assert (project / "agent.txt").read_text() == "agent\n"
        assert admin.post("/sessions/mine/workspace/undo", json={}).json()["removed"] == [
            "agent.txt"
        ]
        assert tree_hash(project) == pristine
        assert admin.post("/sessions/mine/workspace/discard").json()["discarded"] is True
        # Discarding an ended session's changes is the end of what was kept of it.
        for method, route in routes:
            error(
                admin.request(method, f"/sessions/mine/workspace/{route}"), 404, "session_not_found"
            )
        assert not (daemon.state_dir / "ws" / "mine").exists()
    assert volumes_of("mine") == []
    assert tree_hash(project) == pristine


@pytest.fixture
def policies_dir(policies_dir: Path) -> Path:
    """The test policies, plus one that refuses root-owned workspaces."""
    (policies_dir / "refuse.toml").write_text(
        'image = "sandvisor/minimal:latest"\nworkspace_root_owner = "refuse"\n'
    )
    return policies_dir


def creator(c: httpx.Client) -> Callable[..., httpx.Response]:
    """``create(sid, path, mode="overlay", **extra)``: ``POST /sessions`` on a workspace."""

    def create(sid: str, path: Path, mode: str = "overlay", **extra: Any) -> httpx.Response:
        body = {"session_id": sid, "workspace": {"path": str(path), "mode": mode}, **extra}
        return c.post("/sessions", json=body)

    return create


@root_only("makes a project owned by root")
def test_a_root_owned_project_is_refused_or_run_as_nobody(daemon: Daemon, tmp_path: Path) -> None:
    rooted = make_project(projects_root(tmp_path) / "rooted", {"f": "x"}, owner=(0, 0))
    with daemon.client() as c:
        create = creator(c)
        message = error(create("r6", rooted, policy="refuse"), 400, "policy_error")["message"]
        assert "owned by root" in message
        assert c.get("/sessions/r6").status_code == 404
        # A root-owned project under the default policy runs its tasks as nobody.
        assert create("r8", rooted).json()["workspace"]["owner"] == {"uid": 0, "gid": 0}
        assert run(c, "r8", "id -u")["output"].strip() == "65534"


def test_refusals(daemon: Daemon, tmp_path: Path) -> None:
    root = projects_root(tmp_path)
    project = make_project(root / "app", {"f": "x"})
    outside = make_project(tmp_path / "elsewhere", {"f": "x"})
    colon = make_project(root / "a:b", {"f": "x"})
    with daemon.client() as c:
        create = creator(c)
        out = error(create("r1", outside), 400, "workspace_outside_roots")
        assert out["roots"] == [str(root)] and str(outside) in out["message"]
        assert "overlay" in error(create("r2", colon), 400, "policy_error")["message"]
        error(create("r3", daemon.state_dir), 400, "workspace_outside_roots")
        error(create("r4", project / "f"), 400, "policy_error")
        error(create("r5", root / "missing"), 400, "policy_error")
        error(create("r7", project, policy="no-such-policy"), 400, "policy_error")
        bad_mode = c.post("/sessions", json={"workspace": {"path": str(project), "mode": "x"}})
        error(bad_mode, 422, "invalid_request")
        assert not any(c.get(f"/sessions/r{i}").status_code == 200 for i in range(1, 8))

        # A session's workspace is fixed when it opens.
        assert create("fixed", project).status_code == 201
        assert create("fixed", project).status_code == 201  # the same one: idempotent
        message = error(create("fixed", project, mode="ro"), 400, "policy_error")["message"]
        assert "fixed" in message
        error(create("fixed", make_project(root / "other", {})), 400, "policy_error")

        # ro and rw keep no changes to review; ro refuses writes, rw writes as the owner.
        assert create("ro", project, "ro").json()["workspace"]["mode"] == "ro"
        refused = run(c, "ro", "echo x > f")
        assert refused["exit_code"] != 0 and "Read-only file system" in refused["output"]
        error(c.get("/sessions/ro/workspace/changes"), 400, "policy_error")
        (project / ".git" / "hooks").mkdir(parents=True)
        os.chown(project / ".git", *OWNER)
        os.chown(project / ".git" / "hooks", *OWNER)
        assert create("rw", project, "rw").status_code == 201
        wrote = run(c, "rw", "echo rw > new.txt && touch .git/hooks/pre-commit")
        assert "Read-only file system" in wrote["output"], wrote
        assert (project / "new.txt").read_text() == "rw\n"
        assert os.stat(project / "new.txt").st_uid == OWNER[0]
        assert not (project / ".git" / "hooks" / "pre-commit").exists()
