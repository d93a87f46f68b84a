"""Pure: a session's workspace (the agent's project directory) and how tasks see it.

A workspace is a host directory and a mode, fixed when the session opens:
- ``overlay`` (default): the project as it is on disk, every write going to a per-session
  upper layer that the user reviews and applies (or discards);
- ``ro``: a read-only bind; ``rw``: a read-write bind (opt-in) with the repository's
  ``.git`` kept read-only (hooks, config and refs could run code or rewrite history on
  the host).
Tasks see it at the host's own absolute path (so paths in errors, stack traces and a host
venv's scripts mean the same inside and out) and run in it, as the uid:gid that owns it.
The I/O (realpath, stat) happens in the caller; this module decides from values.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from supervisor.core.container import Mount
from supervisor.core.errors import PolicyError
from supervisor.core.workspace_errors import WorkspaceOutsideRoots

WorkspaceMode = Literal["overlay", "ro", "rw"]
RootOwner = Literal["nobody", "root", "refuse"]

#: Where the workspace appears when its own path cannot be used inside the container.
FALLBACK_PATH = "/workspace"
#: uid:gid of ``nobody``: tasks of a root-owned workspace under ``workspace_root_owner =
#: "nobody"``.
NOBODY = (65534, 65534)
#: Container paths a workspace may not take: it would hide the image's own files or the
#: kernel's interfaces. Equal to or under these; "/" only when equal.
RESERVED_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/boot",
)
#: Host paths a workspace may neither be, lie under, nor contain: the engine's API socket,
#: its exec root and containerd's sockets, and the data roots (every container's files).
#: Compared after realpath; the /var/run spellings matter where it is not a symlink.
ENGINE_PATHS = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/docker",
    "/run/docker",
    "/var/run/containerd",
    "/run/containerd",
    "/var/lib/docker",
    "/var/lib/containerd",
)
#: Image directories closed to other users (Debian's /root is 0700). A workspace below one
#: gets, bound read-only over it, a host directory of the session's holding only the empty
#: directories on the way (0755): a non-root task can reach its working directory, and sees
#: nothing of the image's own files there. (A tmpfs cannot do it: runc gives a tmpfs the
#: mode of the directory it covers.)
PRIVATE_PARENTS = ("/root",)
#: Characters the overlay mount options cannot carry in a path.
_OPTION_CHARS = (",", ":", "\\", "\n")
#: What of a git repository a ``rw`` task must not change: all of ``.git``. Hooks and config
#: name programs the host's git runs, and a writable ``.git`` lets a task point git at a
#: config of its own (``commondir``); a mount point cannot be renamed away either.
GIT_PROTECTED = (".git",)


class WorkspaceSpec(BaseModel):
    """A session's workspace, as the caller asks for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, max_length=4096)
    """The project directory on the host (absolute, or relative to the caller's cwd)."""
    mode: WorkspaceMode = "overlay"
    """``overlay`` (copy-on-write, reviewed and applied later), ``ro`` or ``rw``."""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("path must not contain NUL bytes")
        return value


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class WorkspacePlan:
    """A validated workspace: where it is, where tasks see it, whom they run as."""

    host: str
    """The host directory (realpath)."""
    container_path: str
    """Where tasks see it (the host path, or FALLBACK_PATH)."""
    mode: WorkspaceMode
    owner: tuple[int, int]
    """uid, gid that own the host directory."""
    warning: str | None = None
    """Why the workspace is not at its own path, when it is not."""
    identity: tuple[int, int] | None = None
    """(st_dev, st_ino) of the host directory when the session opened: every mount, list,
    diff, apply, undo and discard first checks that the path (walked without following a
    symlink) still leads to this very directory."""

    @property
    def root_owned(self) -> bool:
        return self.owner[0] == 0


def check_host_path(real: str, *, roots: Sequence[str], state_dir: str) -> None:
    """Raise PolicyError unless ``real`` (a realpath) may be a workspace: under an allowed
    root, not touching the engine's files or the supervisor's state, expressible in overlay
    options."""
    if not real.startswith("/"):
        raise PolicyError(f"workspace {real!r}: must be an absolute path")
    if any(c in real for c in _OPTION_CHARS):
        raise PolicyError(
            f"workspace {real!r}: paths containing ',', ':', '\\' or a newline cannot be "
            "mounted (they are separators in the overlay's mount options); rename it"
        )
    if not any(_under(real, os.path.realpath(r)) for r in roots):
        allowed = ", ".join(roots) or "none configured"
        raise WorkspaceOutsideRoots(
            f"workspace {real!r} is not under an allowed workspace root ({allowed}); "
            "add one with --workspace-root or SANDVISOR_WORKSPACE_ROOTS",
            roots,
        )
    if real == "/":
        raise PolicyError("workspace '/': the whole host cannot be a workspace")
    for bad in ENGINE_PATHS:
        if _under(real, bad) or _under(bad, real):
            raise PolicyError(f"workspace {real!r} would expose the engine's files ({bad})")
    state = os.path.realpath(state_dir)
    if _under(real, state) or _under(state, real):
        raise PolicyError(
            f"workspace {real!r} would expose the supervisor's state directory ({state}): "
            "its tokens and every session's output; choose a project directory"
        )


def container_path_for(real: str, tmpfs_paths: Sequence[str]) -> tuple[str, str | None]:
    """Where tasks see the workspace: its own path, or FALLBACK_PATH and why."""
    reason = None
    if real == "/" or any(_under(real, bad) for bad in RESERVED_PATHS):
        reason = f"{real} is a system path inside the container"
    else:
        for t in tmpfs_paths:
            # Under a tmpfs is fine (the mount goes on top); the same path or a parent of
            # one would hide the policy's scratch space.
            if real == t or _under(t, real):
                reason = f"{real} would cover the policy's tmpfs {t}"
                break
    if reason is None:
        return real, None
    return FALLBACK_PATH, f"{reason}; tasks see the workspace at {FALLBACK_PATH} instead"


def plan(
    spec: WorkspaceSpec,
    real: str,
    owner: tuple[int, int],
    *,
    roots: Sequence[str],
    state_dir: str,
    tmpfs_paths: Sequence[str] = ("/tmp",),
    identity: tuple[int, int] | None = None,
) -> WorkspacePlan:
    """Validate a workspace whose realpath is ``real`` and whose root ``owner`` owns
    (``identity``: its (st_dev, st_ino))."""
    check_host_path(real, roots=roots, state_dir=state_dir)
    where, warning = container_path_for(real, tmpfs_paths)
    return WorkspacePlan(real, where, spec.mode, owner, warning, identity)


def task_user(workspace: WorkspacePlan, policy_name: str, runtime: str, root: RootOwner) -> str:
    """uid:gid a task runs as: the workspace's owner; for a root-owned workspace the
    policy's ``workspace_root_owner`` decides."""
    uid, gid = workspace.owner
    if uid != 0:
        return f"{uid}:{gid}"
    if root == "nobody":
        return f"{NOBODY[0]}:{NOBODY[1]}"
    if root == "root":
        if runtime != "runsc":
            raise PolicyError(
                f"policy {policy_name!r}: workspace_root_owner = 'root' needs runtime runsc "
                f"(its kernel has a root user of its own); {workspace.host} is owned by root"
            )
        return "0:0"
    raise PolicyError(
        f"workspace {workspace.host} is owned by root and policy {policy_name!r} has "
        "workspace_root_owner = 'refuse'; use a directory owned by a user, or a policy "
        "with workspace_root_owner = 'nobody'"
    )


def private_parent(container_path: str) -> tuple[str, str] | None:
    """(the ``PRIVATE_PARENTS`` entry above ``container_path``, the path below it), or None
    when the way to it is open."""
    for parent in PRIVATE_PARENTS:
        if container_path != parent and _under(container_path, parent):
            return parent, container_path[len(parent) :].strip("/")
    return None


def mounts(
    workspace: WorkspacePlan, volume: str | None, git_protected: Sequence[str]
) -> list[Mount]:
    """The container mounts that show the workspace. ``volume``: the session's overlay
    volume (overlay mode); ``git_protected``: the GIT_PROTECTED entries that exist in the
    workspace (rw mode re-binds them read-only; never creates them)."""
    target = workspace.container_path
    if workspace.mode == "overlay":
        if volume is None:
            raise PolicyError("overlay workspace without its volume")
        return [Mount(type="volume", source=volume, target=target, read_only=False)]
    if workspace.mode == "ro":
        return [Mount(source=workspace.host, target=target, read_only=True, non_recursive=True)]
    out = [Mount(source=workspace.host, target=target, read_only=False, non_recursive=True)]
    for rel in git_protected:
        out.append(
            Mount(
                source=str(PurePosixPath(workspace.host) / rel),
                target=str(PurePosixPath(target) / rel),
                read_only=True,
                non_recursive=True,
            )
        )
    return out
