"""Hostile commands against a session's workspace (the agent's project), on runc (policy
``default``) and gVisor (``untrusted``): links that point out of the project, special and
setuid files, names that look like options or climb with ``..``, a tree too deep to walk,
an upper filled to its last byte, a root chmod-ed shut, and a repository's git files.

Each case asserts the safe outcome, that nothing of the host outside the project changed
(and the project itself only through a reviewed apply), and in ``Arena.finish`` that no
container, volume or overlay mount is left.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from supervisor import StateStorageError
from supervisor.core.workspace_errors import WorkspaceConflict, WorkspaceError, WorkspaceFull
from tests.adversarial.harness import Arena
from tests.integration.workspaces.support import OWNER, chown_tree, tree_hash
from tests.unit.workspace_tools import File, Link, Spec, build, git_apply, snapshot
from tests.users import root_only

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.serial(
        "the arena checks the host's processes, memory and free disk after every case; "
        "other workers' tests move those machine-wide numbers"
    ),
]

DENIED = {"EPERM", "EACCES", "EROFS"}


def case_name(arena: Arena) -> str:
    name = arena.node.name if arena.node is not None else "ws-case"
    return str(name).split("[")[0].removeprefix("test_")[:40].replace("_", "-")


async def open_project(arena: Arena, spec: Spec, mode: str = "overlay") -> Path:
    """Build ``spec`` as ``proj`` in the workspace root, owned by ``OWNER`` (uid 1000 as
    root, else the user running the tests), and open the case's session on it."""
    project = arena.workspace / "proj"
    build(project, spec)
    chown_tree(project)
    await arena.open_workspace(case_name(arena), project, mode)  # type: ignore[arg-type]
    return project


def around(arena: Arena) -> dict[str, tuple[object, ...]]:
    """Everything of the case's tmp dir outside the project (the host around it) and the
    state dir (whose overlay work dirs hold the kernel's, root-owned and mode 000)."""
    project = arena.project
    assert project is not None
    inside = str(project.relative_to(arena.tmp_path))
    return snapshot(arena.tmp_path, owners=True, prune=(inside, "state"))


async def discard_and_finish(arena: Arena) -> None:
    await arena.session.discard_changes()
    await arena.finish()


# -- links ----------------------------------------------------------------------------------


async def test_ws_symlinks_to_host_files_resolve_inside(ws_arena: Arena) -> None:
    arena = ws_arena
    token = secrets.token_hex(16)
    secret = arena.tmp_path / "secret.txt"
    secret.write_text(token)
    (arena.workspace / "rel-secret.txt").write_text(token)
    project = await open_project(
        arena,
        {
            "a.txt": "a\n",
            "shadow": Link("/etc/shadow"),
            "hostsecret": Link(str(secret)),
            "relsecret": Link("../rel-secret.txt"),
            "hostroot": Link("/"),
            "tmpdir": Link(str(arena.tmp_path)),
        },
    )
    before = around(arena)
    r = await arena.probe(
        """
def read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(200).decode(errors="replace")
    except OSError as exc:
        return ename(exc.errno)
open("/tmp/container-only", "w").write("mine")
for name in ("shadow", "hostsecret", "relsecret", "tmpdir/secret.txt", "hostroot/tmp/container-only"):
    R[name] = read(name)
    R[name + ":real"] = os.path.realpath(name)
R["via-root"] = read("hostroot" + ARGS["secret"])
R["hostroot:real"] = os.path.realpath("hostroot")
# Writing through the links lands in the container (its /tmp tmpfs), never on the host.
for name in ("hostsecret", "relsecret", "tmpdir/planted"):
    R["write:" + name] = oserr(lambda n=name: open(n, "w").write("pwned"))
""",
        {"secret": str(secret)},
    )
    assert r.info.status == "completed", r.text
    res = r.result()
    assert token not in r.text
    # /etc/shadow is the image's (root-only), not the host's.
    assert res["shadow"] in DENIED and res["shadow:real"] == "/etc/shadow", res
    for name in ("hostsecret", "relsecret", "tmpdir/secret.txt"):
        assert res[name] in {"ENOENT", *DENIED}, (name, res[name])
    # (This gVisor build answers a path through a link to "/" with EISDIR when the rest
    # of the path does not exist.)
    unreadable = {"ENOENT", *DENIED} | ({"EISDIR"} if arena.runtime == "runsc" else set())
    assert res["via-root"] in unreadable, res
    # "/" through a link is the container's root.
    assert res["hostroot:real"] == "/", res
    if arena.runtime == "runc":
        assert res["hostroot/tmp/container-only"] == "mine", res
    assert secret.read_text() == token
    assert (arena.workspace / "rel-secret.txt").read_text() == token
    assert around(arena) == before
    assert await arena.session.workspace_changes() == []
    assert project.joinpath("hostsecret").is_symlink()
    await discard_and_finish(arena)


async def test_ws_planted_symlinks_apply_as_links(ws_arena: Arena) -> None:
    arena = ws_arena
    victim = arena.tmp_path / "victim.txt"
    victim.write_text("victim\n")
    victim_dir = arena.tmp_path / "victimdir"
    victim_dir.mkdir()
    project = await open_project(
        arena, {"config.txt": "cfg\n", "d/keep": "k\n", "d2/keep": "k\n", "a.txt": "a\n"}
    )
    before = around(arena)
    r = await arena.run(
        f"ln -s /etc/passwd passwd-link; ln -s {victim} victim-link; "
        f"rm config.txt; ln -s {victim} config.txt; rm -r d; ln -s {victim_dir} d; "
        f"ln -s ../../.. up3; echo pwned >> victim-link; echo payload > d2/payload; echo ok"
    )
    assert r.info.status == "completed" and r.text.endswith("ok\n"), r.text
    changes = {c.path: c for c in await arena.session.workspace_changes()}
    assert changes["passwd-link"].target == "/etc/passwd"
    assert changes["config.txt"].kind == "replaced" and changes["config.txt"].target == str(victim)
    assert changes["d"].kind == "replaced" and changes["d"].file_type == "symlink"

    # Meanwhile the host swaps d2 for a link out of the project: a conflict, nothing
    # written; forced, the link is replaced by a directory of the project (backed up),
    # never written through.
    shutil.move(project / "d2", arena.tmp_path / "d2.real")
    os.symlink(victim_dir, project / "d2")
    swapped = tree_hash(project)
    with pytest.raises(WorkspaceConflict) as err:
        await arena.session.apply_changes()
    assert err.value.paths == ["d2"]
    assert tree_hash(project) == swapped
    result = await arena.session.apply_changes(force=True)
    assert result.forced == ["d2"] and "config.txt" in result.applied
    assert not (project / "d2").is_symlink() and (project / "d2").is_dir()
    assert list(victim_dir.iterdir()) == []

    # Links stay links, with their targets as written: nothing was followed.
    for rel, target in {
        "passwd-link": "/etc/passwd",
        "victim-link": str(victim),
        "config.txt": str(victim),
        "d": str(victim_dir),
        "up3": "../../..",
    }.items():
        assert os.readlink(project / rel) == target, rel
        assert os.lstat(project / rel).st_uid == OWNER[0]
    assert (project / "d2/payload").read_text() == "payload\n"
    assert victim.read_text() == "victim\n"
    assert list(victim_dir.iterdir()) == []
    # Undo puts the host's own link back.
    await arena.session.undo_apply()
    assert os.readlink(project / "d2") == str(victim_dir)
    assert (project / "config.txt").read_text() == "cfg\n"
    assert list(victim_dir.iterdir()) == []
    os.unlink(project / "d2")
    shutil.move(arena.tmp_path / "d2.real", project / "d2")
    assert around(arena) == before
    await discard_and_finish(arena)


async def test_ws_hard_links_never_reach_outside(ws_arena: Arena) -> None:
    arena = ws_arena
    outside = arena.workspace / "outside.txt"
    outside.write_text("outside\n")
    project = arena.workspace / "proj"
    build(project, {"a.txt": "a\n"})
    os.link(outside, project / "linked.txt")  # a host hard link into the project
    chown_tree(project)
    await arena.open_workspace(case_name(arena), project)
    before = around(arena)
    r = await arena.probe(
        """
open("/tmp/mine", "w").write("x")
R["etc"] = oserr(os.link, "/etc/passwd", "hl-passwd")
R["tmp"] = oserr(os.link, "/tmp/mine", "hl-tmp")
R["inside"] = oserr(os.link, "a.txt", "hl-a")
with open("linked.txt", "a") as fh:
    fh.write("agent\\n")
R["linked"] = open("linked.txt").read()
"""
    )
    assert r.info.status == "completed", r.text
    res = r.result()
    assert res["etc"] in {"EXDEV", "EPERM"} and res["tmp"] == "EXDEV", res
    assert res["inside"] is None and res["linked"] == "outside\nagent\n", res
    assert outside.read_text() == "outside\n"
    changes = {c.path: c.kind for c in await arena.session.workspace_changes()}
    assert changes == {"hl-a": "added", "linked.txt": "modified"}
    await arena.session.apply_changes()
    # The apply replaced the project's link with a file of its own: outside is untouched
    # (the backup keeps the old inode, by a hard link, for undo).
    assert (project / "linked.txt").read_text() == "outside\nagent\n"
    assert outside.read_text() == "outside\n"
    assert os.stat(project / "linked.txt").st_ino != os.stat(outside).st_ino
    assert (project / "hl-a").read_text() == "a\n"
    assert around(arena) == before
    await discard_and_finish(arena)


# -- special files ----------------------------------------------------------------------------


async def test_ws_fifos_and_sockets_are_skipped(ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"data.txt": "data\n"})
    r = await arena.probe(
        """
import socket
os.mkfifo("pipe")
os.unlink("data.txt")
os.mkfifo("data.txt")
s = socket.socket(socket.AF_UNIX)
s.bind("sock")
open("ok.txt", "w").write("ok\\n")
"""
    )
    assert r.info.status == "completed", r.text
    changes = {c.path: c for c in await arena.session.workspace_changes()}
    special = {p for p, c in changes.items() if not c.applicable}
    if arena.runtime == "runc":
        assert changes["pipe"].file_type == "fifo" and changes["sock"].file_type == "socket"
        assert changes["data.txt"].kind == "replaced" and changes["data.txt"].file_type == "fifo"
        assert special == {"pipe", "sock", "data.txt"}
    else:
        # gVisor keeps FIFOs and sockets in its own kernel: they never reach the upper
        # (a later task does not see them), only the removal of data.txt does.
        assert special == set() and changes["data.txt"].kind == "deleted", changes
        arena.note("FIFOs and unix sockets made in the workspace stay inside the sandbox")
    # Apply never opens a FIFO (it would block): it skips them, and the socket.
    result = await asyncio.wait_for(arena.session.apply_changes(), 60)
    skipped = {s.path: s.reason for s in result.skipped}
    assert skipped == dict.fromkeys(special, "special_file")
    if arena.runtime == "runsc":
        assert sorted(result.applied) == ["data.txt", "ok.txt"]
        assert sorted(os.listdir(project)) == ["ok.txt"]
        await discard_and_finish(arena)
        return
    assert result.applied == ["ok.txt"]
    assert sorted(os.listdir(project)) == ["data.txt", "ok.txt"]
    assert (project / "data.txt").read_text() == "data\n"
    await discard_and_finish(arena)


async def test_ws_setuid_bits_are_stripped_at_apply(ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"script.sh": File(b"#!/bin/sh\necho hi\n", 0o644)})
    r = await arena.run(
        "cp /bin/sh suid-sh && chmod 4755 suid-sh && chmod 6755 script.sh && "
        "mkdir sgid-dir && chmod 2775 sgid-dir && touch sgid-dir/f && "
        "cp /bin/sh sgid-sh && chmod 2711 sgid-sh && echo ok"
    )
    assert r.info.status == "completed" and r.text.endswith("ok\n"), r.text
    modes = {c.path: c.new_mode for c in await arena.session.workspace_changes()}
    # The review shows the bits as the task set them...
    assert modes["suid-sh"] == 0o4755 and modes["script.sh"] == 0o6755, modes
    assert modes["sgid-dir"] == 0o2775 and modes["sgid-sh"] == 0o2711, modes
    await arena.session.apply_changes()
    # ...the host never gets them, nor group write on what it did not have (item 15).
    expected = {"suid-sh": 0o755, "script.sh": 0o755, "sgid-dir": 0o755, "sgid-sh": 0o711}
    for rel, mode in expected.items():
        st = os.lstat(project / rel)
        assert stat.S_IMODE(st.st_mode) == mode, (rel, oct(st.st_mode))
        assert (st.st_uid, st.st_gid) == OWNER, rel
    for dirpath, dirs, files in os.walk(project):
        for name in dirs + files:
            assert not os.lstat(os.path.join(dirpath, name)).st_mode & (stat.S_ISUID | stat.S_ISGID)
    await discard_and_finish(arena)


# -- names ------------------------------------------------------------------------------------

ODD_NAMES = [
    "-rf",
    "--force",
    "-",
    "--",
    "--help",
    "-n",
    " lead",
    "trail ",
    "new\nline",
    "$(touch pwned)",
    "`touch pwned2`",
    "*",
    "a\\b",
    "tab\there",
]


async def test_ws_option_like_names_apply_as_written(ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"-rf": "old\n", "--force/keep": "k\n"})
    original = arena.tmp_path / "original"
    shutil.copytree(project, original, symlinks=True)
    r = await arena.probe(
        """
os.unlink("--force/keep")
os.rmdir("--force")
for name in ARGS["names"]:
    with open(name, "w") as fh:
        fh.write(name + "\\n")
open(b"\\xff\\xfe-latin1.bin", "wb").write(b"not utf-8 name\\n")
os.makedirs("-d/--x", exist_ok=True)
open("-d/--x/-f", "w").write("nested\\n")
""",
        {"names": ODD_NAMES},
    )
    assert r.info.status == "completed", r.text
    changes = await arena.session.workspace_changes()
    assert not any(c.conflict for c in changes)
    paths = {c.path_bytes for c in changes}
    assert b"\xff\xfe-latin1.bin" in paths and b"new\nline" in paths and b"-rf" in paths
    patch = await arena.session.workspace_diff()
    git_apply(patch, original)
    await arena.session.apply_changes()
    view = snapshot(project)
    for name in ODD_NAMES:
        assert view[name][2] == (name + "\n").encode(), name
    assert view[os.fsdecode(b"\xff\xfe-latin1.bin")][2] == b"not utf-8 name\n"
    assert view["-d/--x/-f"][2] == b"nested\n"
    assert view["--force"][0] == "file"
    # git apply of the diff gave the same files (names, bytes, exec bits).
    same = {k: v[2] for k, v in snapshot(original).items() if v[0] == "file"}
    assert same == {k: v[2] for k, v in view.items() if v[0] == "file"}
    assert not list(arena.tmp_path.rglob("pwned*"))
    await discard_and_finish(arena)


async def test_ws_dotdot_names_stay_inside(ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"a.txt": "a\n"})
    before = around(arena)
    r = await arena.probe(
        """
for name in ("...", "..a", "a..", ".. ", " ..", "..\\n", "x/..y/...z/f"):
    os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
    open(name, "w").write(name)
R["dotdot"] = oserr(lambda: open("..", "w"))
R["up"] = oserr(lambda: open("../escaped.txt", "w").write("x"))
R["up2"] = oserr(lambda: open("x/../../escaped2.txt", "w").write("x"))
os.symlink("..", "up")
os.symlink("../../..", "esc")
os.symlink("x/../../..", "deep")
"""
    )
    assert r.info.status == "completed", r.text
    res = r.result()
    assert res["dotdot"] in {"EISDIR", "EEXIST", *DENIED}, res
    await arena.session.apply_changes()
    view = snapshot(project)
    for name in ("...", "..a", "a..", ".. ", " ..", "..\n", "x/..y/...z/f"):
        assert view[name] == ("file", 0o644, name.encode()), name
    assert {k: v for k, v in view.items() if v[0] == "link"} == {
        "up": ("link", ".."),
        "esc": ("link", "../../.."),
        "deep": ("link", "x/../../.."),
    }
    # What the task wrote above the project stayed in the container.
    assert around(arena) == before
    assert not list(arena.tmp_path.rglob("escaped*"))
    await discard_and_finish(arena)


# -- trees and space ------------------------------------------------------------------------


async def test_ws_a_tree_too_deep_to_review(ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"a.txt": "a\n"})
    pristine = tree_hash(project)
    deep = "import os\nfor i in range({n}):\n    os.mkdir('d'); os.chdir('d')\nopen('bottom', 'w').write('x')\n"
    r = await arena.run(f'python3 -c "{deep.format(n=1500)}" && echo made')
    assert r.info.status == "completed" and "made" in r.text, r.text
    for review in (arena.session.workspace_changes, arena.session.apply_changes):
        # Refused, saying why not deeper and what to do (issue 22, item 15).
        with pytest.raises(WorkspaceError, match=r"nested deeper than 256.*PATH_MAX.*discard"):
            await review()
    assert tree_hash(project) == pristine
    await arena.session.discard_changes()
    assert await arena.session.workspace_changes() == []
    # A deep tree within the limit is reviewed and applied like any other.
    r = await arena.run(f'python3 -c "{deep.format(n=200)}" && echo made')
    assert r.info.status == "completed", r.text
    assert len(await arena.session.workspace_changes()) == 201
    await arena.session.apply_changes()
    assert project.joinpath(*["d"] * 200, "bottom").read_text() == "x"
    await discard_and_finish(arena)


@root_only("the state dir on a 64 MiB tmpfs (small_state): mounting one needs root")
async def test_ws_filling_the_upper(small_state: Path, ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"a.txt": "a\n"})
    arena.concurrency = 2
    pristine = tree_hash(project)
    beat = await arena.start(
        "i=0; while true; do i=$((i+1)); echo beat$i; sleep 0.1; done",
        persistent=True,
        timeout_ms=None,
    )
    await arena.session.wait_for(beat.task_id, "^beat3$", timeout_s=60)
    filler = await arena.start(
        "dd if=/dev/zero of=big bs=1M count=512 2>/tmp/err; echo dd-rc=$? >> /tmp/err; "
        "read go; rm big; cat /tmp/err; echo freed"
    )
    deadline = time.monotonic() + 60
    while os.statvfs(small_state).f_bavail * os.statvfs(small_state).f_frsize > 1 << 20:
        assert time.monotonic() < deadline, "the upper never filled the state volume"
        assert not (await arena.session.get(filler.task_id)).ended
        await asyncio.sleep(0.1)
    # Full: new tasks are refused with a clear error; the running ones carry on.
    with pytest.raises(StateStorageError, match="full"):
        await arena.start("echo refused")
    assert not (await arena.session.get(beat.task_id)).ended
    await arena.session.send_input(filler.task_id, "go\n")
    r = await arena.wait(filler)
    assert r.info.status == "completed", r.text
    assert "No space left on device" in r.text and "dd-rc=1" in r.text and "freed" in r.text
    n = max(int(m) for m in re.findall(r"beat(\d+)\n", Path(beat.output_path).read_text()))
    await arena.session.wait_for(beat.task_id, f"^beat{n + 5}$", timeout_s=60)
    later = await arena.run("echo later > later.txt; echo ok")
    assert later.info.status == "completed" and later.text == "ok\n", later.text
    assert [c.path for c in await arena.session.workspace_changes()] == ["later.txt"]
    assert tree_hash(project) == pristine
    await arena.session.stop(beat.task_id)
    await discard_and_finish(arena)


#: The layer cap of the capped policy below, and what the filler would write.
CAP_MB = 16
FILL_MB = 2048


@pytest.fixture
def capped_policy(policies_dir: Path, runtime: str) -> str:
    """The runtime's shipped policy with a 16 MB workspace layer. Ask for it before
    ``ws_arena`` (the supervisor reads its policies when it starts)."""
    base = "default" if runtime == "runc" else "untrusted"
    text = (policies_dir / f"{base}.toml").read_text()
    text, n = re.subn(r"(?m)^workspace_max_mb = \d+", f"workspace_max_mb = {CAP_MB}", text)
    assert n == 1
    (policies_dir / f"adv-cap-{runtime}.toml").write_text(text)
    return f"adv-cap-{runtime}"


async def test_ws_a_layer_past_its_cap_stops_the_task(capped_policy: str, ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"a.txt": "a\n"})
    pristine = tree_hash(project)
    assert arena.session.workspace is not None
    upper = arena.session.workspace.upper
    # 8 MB files, one after the other (each under the policy's fsize), until stopped.
    filler = await arena.start(
        f"i=0; while [ $i -lt {FILL_MB // 8} ]; do i=$((i+1)); "
        "dd if=/dev/zero of=f$i bs=1M count=8 2>/dev/null; echo wrote$i; done; echo all-written",
        policy=capped_policy,
    )
    r = await arena.wait(filler)
    assert (r.info.status, r.info.reason) == ("killed", "workspace_full"), r.text
    assert "all-written" not in r.text
    wrote = max(int(m) for m in re.findall(r"wrote(\d+)\n", r.text))
    held = sum(e.stat().st_blocks * 512 for e in os.scandir(upper) if e.is_file())
    print(
        f"\ncap: {CAP_MB} MB cap; the task wrote {wrote * 8} MB before it was killed, "
        f"the layer holds {held >> 20} MB"
    )
    # Measured from outside every 0.25 s, then killed at once: a task writing to the page
    # cache at about 1 GB/s gets a look's worth past the cap (16-40 MB on a quiet machine,
    # up to 280 MB at a load of 10), never the whole of what it would write.
    assert held <= FILL_MB * (1 << 20) // 4, "the cap did not bound the layer"
    with pytest.raises(WorkspaceFull, match=r"session\.workspace_max_mb"):
        await arena.start("echo refused", policy=capped_policy)
    # The project is untouched, and after a discard the policy runs again.
    assert tree_hash(project) == pristine
    await arena.session.discard_changes()
    again = await arena.run("echo ok", policy=capped_policy)
    assert again.info.status == "completed" and again.text == "ok\n", again.text
    await discard_and_finish(arena)


async def test_ws_root_chmod_and_chown(ws_arena: Arena) -> None:
    arena = ws_arena
    project = await open_project(arena, {"sub/f": "f\n", "a.txt": "a\n"})
    pristine = tree_hash(project)
    r = await arena.run(
        "chmod 000 sub; chown 0:0 . ; echo chown=$?; chown 0 a.txt; echo chown-file=$?; "
        "chmod 000 .; echo chmod=$?"
    )
    assert r.info.status == "completed", r.text
    assert "chown=1" in r.text and "chown-file=1" in r.text and "chmod=0" in r.text, r.text
    assert tree_hash(project) == pristine  # the host's root and sub keep their modes
    changes = {c.path: (c.kind, c.new_mode) for c in await arena.session.workspace_changes()}
    assert changes == {"sub": ("mode", 0)}
    # The task shut the workspace for the session's later tasks (its own choice); the host
    # is untouched, and a discard opens it again.
    shut = await arena.run("ls >/dev/null && echo listed")
    assert "listed" not in shut.text, shut.text
    arena.note(
        f"after chmod 000 of the root, the next task: {shut.info.status}/{shut.info.reason} "
        f"{shut.info.exit_code}: {shut.text.strip()[:120]!r}"
    )
    await arena.session.discard_changes()
    again = await arena.run("cat a.txt sub/f")
    assert again.info.status == "completed" and again.text == "a\nf\n", again.text
    assert tree_hash(project) == pristine
    await discard_and_finish(arena)


# -- git --------------------------------------------------------------------------------------


def _git_repo(path: Path) -> None:
    path.mkdir(parents=True)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "."], cwd=path, check=True)
    (path / "a.txt").write_text("a\n")
    subprocess.run([*git, "add", "a.txt"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=path, check=True)


def _git_status(project: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """What the user does next on the host: ``git status`` in the project. (With the project
    trusted: as root, the test's tmp dir is not reachable by uid 1000; the user's own git
    would run the same configuration.)"""
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "status", "--short"],
        cwd=project,
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_ws_rw_git_cannot_run_code_on_the_host(ws_arena: Arena) -> None:
    arena = ws_arena
    project = arena.workspace / "proj"
    _git_repo(project)
    chown_tree(project)
    home = arena.tmp_path / "home"
    home.mkdir()
    await arena.open_workspace(case_name(arena), project, "rw")
    marker = home / "PWNED"
    evil = f'printf "[core]\\n\\tfsmonitor = \\"touch {marker}; false\\"\\n"'
    # Both ways around the read-only hooks and config, each then checked from the host.
    vectors = {
        "commondir": f"mkdir .evil && cp -r .git/. .evil/ && {evil} >> .evil/config && "
        "echo ../.evil > .git/commondir && echo planted",
        "rename": f"mv .git .git-old && cp -r .git-old .git && {evil} >> .git/config && "
        "echo planted",
    }
    pwned = []
    for name, command in vectors.items():
        r = await arena.run(command)
        planted = "planted" in r.text
        _git_status(project, home)
        if marker.exists():
            pwned.append(f"{name} (planted={planted})")
            marker.unlink()
        if name == "commondir":
            (project / ".git/commondir").unlink(missing_ok=True)
    await arena.finish()
    assert pwned == [], f"host git ran the task's code after: {', '.join(pwned)}"
