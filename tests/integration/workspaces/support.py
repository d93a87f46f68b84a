"""Helpers of the workspace integration tests: projects owned by an ordinary user (uid 1000
as root, else the user running the tests: ``tests/users.py``), tasks that print
a listing of the tree they see, the same listing taken on the host, and what a session's
workspace leaves on the engine and in the mount table."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from supervisor import Supervisor, TaskInfo, TaskSpec
from supervisor.core.workspace import WorkspaceMode, WorkspaceSpec
from supervisor.runtime.session import Session
from tests.unit.workspace_tools import Spec, build, snapshot
from tests.users import PROJECT_OWNER

#: The uid:gid that owns the test projects: an ordinary user, like a developer's (uid 1000 as
#: root; as a non-root user, that user's own files).
OWNER = PROJECT_OWNER
#: runtime -> the shipped policy that runs it (as in tests/adversarial).
POLICY = {"runc": "default", "runsc": "untrusted"}

#: Prints ``LISTING {json}``: path -> [type, mode, uid, gid, sha256 | target] of every entry
#: under the working directory, plus the root's owner, mode and writability. Python's
#: os.lstat, not coreutils: this gVisor build answers statx(2) with EINVAL.
LISTING = r"""
import hashlib, json, os, stat
out = {}
for dirpath, dirs, files in os.walk(".", followlinks=False):
    for name in dirs + files:
        path = os.path.join(dirpath, name)
        st = os.lstat(path)
        rel = os.path.relpath(path, ".")
        kind, extra = "other", None
        if stat.S_ISLNK(st.st_mode):
            kind, extra = "link", os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            kind = "dir"
        elif stat.S_ISREG(st.st_mode):
            kind = "file"
            with open(path, "rb") as fh:
                extra = hashlib.sha256(fh.read()).hexdigest()
        out[rel] = [kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, extra]
root = os.stat(".")
print("LISTING " + json.dumps({
    "cwd": os.getcwd(), "tree": out, "root": [root.st_uid, root.st_gid, stat.S_IMODE(root.st_mode)],
    "root_writable": os.access(".", os.W_OK), "id": [os.getuid(), os.getgid()],
}))
"""


def chown_tree(root: Path, owner: tuple[int, int] = OWNER) -> None:
    """``chown -hR`` (symlinks themselves, never their targets). To ``OWNER`` as a non-root
    user: its own files already, the same calls change nothing."""
    os.lchown(root, *owner)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), *owner)


def host_listing(root: Path) -> dict[str, list[Any]]:
    """The LISTING tree of a host directory."""
    out: dict[str, list[Any]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            kind, extra = "other", None
            if stat.S_ISLNK(st.st_mode):
                kind, extra = "link", os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                kind = "dir"
            elif stat.S_ISREG(st.st_mode):
                kind = "file"
                extra = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            out[rel] = [kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, extra]
    return out


def tree_hash(root: Path) -> str:
    """Everything about a tree: types, modes, bytes, targets, owners, mtimes of files."""
    h = hashlib.sha256()
    for rel, entry in sorted(snapshot(root, times=True, owners=True).items()):
        h.update(repr((rel, entry)).encode())
    st = os.stat(root)
    h.update(repr((st.st_uid, st.st_gid, st.st_mode)).encode())
    return h.hexdigest()


def parse_listing(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith("LISTING "):
            data: dict[str, Any] = json.loads(line[8:])
            return data
    raise AssertionError(f"the task printed no LISTING line:\n{output[-3000:]}")


async def run(
    session: Session, command: str, *, policy: str = "default", timeout_s: float = 120, **spec: Any
) -> tuple[TaskInfo, str]:
    """Run a task to its end; its final info and its whole output."""
    spec.setdefault("timeout_ms", 90_000)
    info = await session.start(TaskSpec(command=command, policy=policy, **spec))
    final = await session.wait(info.task_id, timeout_s=timeout_s)
    return final, Path(final.output_path).read_text(errors="replace")


async def run_ok(session: Session, command: str, **kw: Any) -> str:
    final, out = await run(session, command, **kw)
    assert final.status == "completed" and final.exit_code == 0, (final, out)
    return out


async def merged_listing(session: Session, policy: str = "default") -> dict[str, Any]:
    """What a task of the session sees in its working directory."""
    out = await run_ok(
        session, 'python3 -c "$SANDVISOR_LIST"', policy=policy, env={"SANDVISOR_LIST": LISTING}
    )
    return parse_listing(out)


def engine() -> Any:
    return docker.APIClient(version="auto", timeout=60)


def our_volumes(sup: Supervisor) -> list[str]:
    """Volumes this supervisor labelled as its own."""
    client = engine()
    try:
        found = client.volumes(filters={"label": f"io.sandvisor.owner={sup.instance_id}"})
    finally:
        client.close()
    return sorted(v["Name"] for v in (found or {}).get("Volumes") or [])


def mounts_mentioning(*needles: Path | str) -> list[str]:
    """Lines of the host's mount table (our namespace is the engine's) naming any needle."""
    text = Path("/proc/self/mountinfo").read_text()
    return [line for line in text.splitlines() if any(str(n) in line for n in needles)]


@dataclass
class WsEnv:
    """A supervisor with one workspace root, and projects made in that root."""

    sup: Supervisor
    roots: Path

    def project(self, spec: Spec, name: str = "proj", owner: tuple[int, int] = OWNER) -> Path:
        path = self.roots / name
        build(path, spec)
        chown_tree(path, owner)
        return path

    async def open(
        self, sid: str, project: Path, mode: WorkspaceMode = "overlay", policy: str = "default"
    ) -> Session:
        return await self.sup.open_session(
            sid, workspace=WorkspaceSpec(path=str(project), mode=mode), policy=policy
        )

    def ws_dir(self, sid: str) -> Path:
        """Where the supervisor keeps a session's upper, work dir and backups."""
        return self.sup.state_dir / "ws" / sid
