"""Pure: combine a TaskSpec with its Policy into effective settings and a container request."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.container import ContainerRequest, Mount, Ulimit
from supervisor.core.errors import PolicyError, SpecError
from supervisor.core.models import MERGE_PREFIX, StdinMode, TaskSpec
from supervisor.core.policy import Limits, Policy
from supervisor.core.workspace import GIT_PROTECTED, check_host_path

# MERGE_PREFIX moved to models (the command length limit is computed from it); the warm
# pool still imports it from here.
__all__ = ["MERGE_PREFIX", "MIB", "Effective", "container_request", "resolve", "workspace_mount"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class Effective:
    """The settings a task actually runs with."""

    policy: Policy
    limits: Limits
    timeout_ms: int | None
    persistent: bool
    stdin: StdinMode
    stall_after_s: float | None
    poll_every_s: float | None
    poll_tail_chars: int
    poll_only_on_change: bool
    idle_timeout_ms: int | None
    env: dict[str, str]
    grace_s: float


def resolve(spec: TaskSpec, policy: Policy) -> Effective:
    """Apply the policy to the spec. Asking for more than the policy allows is a SpecError
    naming the field, the value and the allowed range; nothing is silently clamped."""
    pname = policy.name
    t = policy.timeouts
    if spec.persistent:
        if not t.allow_persistent:
            raise SpecError(f"persistent: policy {pname!r} does not allow persistent tasks")
        timeout_ms = None
    else:
        timeout_ms = spec.timeout_ms if spec.timeout_ms is not None else t.default_ms
        if timeout_ms > t.max_ms:
            raise SpecError(
                f"timeout_ms: {timeout_ms} is more than policy {pname!r} allows "
                f"(allowed: 1..{t.max_ms})"
            )

    limits = policy.limits
    if spec.limits is not None:
        updates: dict[str, object] = {}
        for name, value in spec.limits.model_dump(exclude_none=True).items():
            ceiling = getattr(policy.limits, name)
            if value > ceiling:
                raise SpecError(
                    f"limits.{name}: {value} is more than policy {pname!r} allows "
                    f"(a task may only tighten limits; allowed: up to {ceiling})"
                )
            updates[name] = value
        limits = policy.limits.model_copy(update=updates)

    env = dict(policy.env.fixed)
    for name, value in spec.env.items():
        if name in policy.env.fixed:
            raise SpecError(
                f"env.{name}: policy {pname!r} fixes this variable; tasks cannot override it"
            )
        if not policy.env.allows(name):
            allowed = ", ".join(policy.env.allow) or "none"
            raise SpecError(
                f"env.{name}: policy {pname!r} does not let tasks set this variable "
                f"(allowed names: {allowed})"
            )
        env[name] = value

    stdin = spec.stdin or policy.stdin
    stall_after = (
        spec.stall_after_s if spec.stall_after_s is not None else policy.watch.stall_after_s
    )
    idle = spec.idle_timeout_ms if spec.idle_timeout_ms is not None else t.idle_timeout_ms
    return Effective(
        policy=policy,
        limits=limits,
        timeout_ms=timeout_ms,
        persistent=spec.persistent,
        stdin=stdin,
        stall_after_s=stall_after if (stdin == "pipe" and policy.watch.stall_detection) else None,
        poll_every_s=spec.poll_every_s
        if spec.poll_every_s is not None
        else policy.watch.poll_every_s,
        poll_tail_chars=spec.poll_tail_chars or policy.watch.poll_tail_chars,
        poll_only_on_change=(
            spec.poll_only_on_change
            if spec.poll_only_on_change is not None
            else policy.watch.poll_only_on_change
        ),
        idle_timeout_ms=idle,
        env=env,
        grace_s=t.grace_s,
    )


def workspace_mount(policy: Policy, roots: Sequence[Path], state_dir: str | Path) -> list[Mount]:
    """The policy's ``[workspace]`` as bind mounts (none when it has none), through the same
    guard as a session's workspace (``check_host_path``: under a root, not the engine's
    files nor the state directory). Non-recursive, and in ``rw`` mode with the project's
    own ``.git`` (a plain directory or file, never a link) bound read-only on top."""
    ws = policy.workspace
    if ws is None:
        return []
    real = os.path.realpath(ws.host_path)
    try:
        check_host_path(real, roots=[str(r) for r in roots], state_dir=str(state_dir))
    except PolicyError as exc:
        raise PolicyError(f"policy {policy.name!r}: [workspace] host_path: {exc}") from exc
    if not os.path.isdir(real):
        raise PolicyError(f"policy {policy.name!r}: workspace {ws.host_path!r} is not a directory")
    out = [
        Mount(source=real, target=ws.container_path, read_only=ws.mode == "ro", non_recursive=True)
    ]
    if ws.mode == "rw":
        for rel in GIT_PROTECTED:
            try:
                st = os.lstat(os.path.join(real, rel))
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                out.append(
                    Mount(
                        source=os.path.join(real, rel),
                        target=f"{ws.container_path.rstrip('/')}/{rel}",
                        read_only=True,
                        non_recursive=True,
                    )
                )
    return out


def container_request(
    *,
    name: str,
    command: str,
    eff: Effective,
    labels: dict[str, str],
    network: str,
    workspace: Sequence[Mount] = (),
    image: str | None = None,
    aliases: list[str] | None = None,
    mounts: list[Mount] | None = None,
    user: str | None = None,
    working_dir: str | None = None,
) -> ContainerRequest:
    """The container for one task, hardened as the policy says. ``mounts``, ``user`` and
    ``working_dir`` come from the session's validated workspace (never from the task)."""
    p = eff.policy
    lim = eff.limits
    env = dict(eff.env)
    if p.init:
        # Forward SIGTERM to the command's whole process group, not just ``sh``.
        env["TINI_KILL_PROCESS_GROUP"] = "1"
    user = user or p.user
    uid, _, gid = user.partition(":")
    all_mounts = list(workspace)
    all_mounts += mounts or []
    covered = {m.target for m in all_mounts}
    tmpfs = {}
    for t in p.tmpfs:
        if t.path in covered:
            continue  # the workspace is there (it fell back to the policy's /workspace)
        # Owned by the task's user: Docker 20.10 loses ``mode`` when the working directory
        # is the mount point, so ownership is what keeps it writable. The engine defaults
        # to noexec, so say which one we mean.
        tmpfs[t.path] = (
            f"rw,{'exec' if t.exec_allowed else 'noexec'},nosuid,nodev,size={t.size_mb}m,"
            f"nr_inodes={t.nr_inodes},mode={t.mode},uid={uid},gid={gid or uid}"
        )
    return ContainerRequest(
        name=name,
        image=image or p.image,
        command=["/bin/sh", "-c", MERGE_PREFIX + command],
        env=env,
        labels=labels,
        user=user,
        working_dir=working_dir or p.working_dir,
        runtime=p.runtime,
        network=network,
        network_aliases=list(aliases or []),
        read_only=p.read_only_rootfs,
        tmpfs=tmpfs,
        memory_bytes=lim.memory_mb * MIB,
        nano_cpus=int(lim.cpus * 1e9),
        pids_limit=lim.pids,
        ulimits=[
            Ulimit(name="nofile", soft=lim.nofile, hard=lim.nofile),
            Ulimit(name="fsize", soft=lim.fsize_mb * MIB, hard=lim.fsize_mb * MIB),
            Ulimit(name="core", soft=lim.core_mb * MIB, hard=lim.core_mb * MIB),
        ],
        cap_add=list(p.cap_add),
        init=p.init,
        stdin_open=eff.stdin == "pipe",
        log_max_size=f"{p.logs.max_size_mb}m",
        log_max_files=p.logs.max_files,
        mounts=all_mounts,
        placement=list(p.placement),
    )
