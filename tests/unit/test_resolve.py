"""resolve / container_request / workspace_mount: spec + policy -> a hardened container."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.container import ContainerRequest, Mount, Ulimit
from supervisor.core.errors import PolicyError, SpecError
from supervisor.core.models import TaskLimits, TaskSpec
from supervisor.core.policy import Env, Limits, Logs, Policy, Timeouts, Tmpfs, Watch, Workspace
from supervisor.core.resolve import MIB, Effective, container_request, resolve, workspace_mount
from supervisor.engine.docker import request_to_config

CEILINGS = Limits(
    memory_mb=256, cpus=1.5, pids=128, nofile=512, fsize_mb=100, output_cap_bytes=1 << 20
)


def policy(**kw: Any) -> Policy:
    base: dict[str, Any] = {
        "name": "p",
        "limits": CEILINGS,
        "timeouts": Timeouts(default_ms=60_000, max_ms=120_000, allow_persistent=True),
        "env": Env(fixed={"HOME": "/tmp"}, allow=["NODE_*", "CI"]),
    }
    base.update(kw)
    return Policy(**base)


def spec(**kw: Any) -> TaskSpec:
    return TaskSpec(command=kw.pop("command", "echo hi"), **kw)


# -- resolve -------------------------------------------------------------------------------


def test_defaults_come_from_the_policy() -> None:
    eff = resolve(spec(), policy())
    assert eff.timeout_ms == 60_000
    assert eff.persistent is False
    assert eff.limits == CEILINGS
    assert eff.stdin == "pipe"
    assert eff.stall_after_s == 3.0
    assert eff.poll_every_s is None
    assert eff.poll_tail_chars == 3000
    assert eff.poll_only_on_change is True
    assert eff.idle_timeout_ms is None
    assert eff.grace_s == 5.0
    assert eff.env == {"HOME": "/tmp", "PATH": policy().env.fixed["PATH"]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_mb", 257),
        ("cpus", 2.0),
        ("pids", 129),
        ("nofile", 513),
        ("fsize_mb", 101),
        ("output_cap_bytes", (1 << 20) + 1),
    ],
)
def test_asking_for_more_than_the_policy_names_the_limit_and_ceiling(
    field: str, value: float
) -> None:
    assert field in TaskLimits.model_fields
    with pytest.raises(SpecError) as info:
        resolve(spec(limits=TaskLimits(**{field: value})), policy())
    ceiling = getattr(CEILINGS, field)
    assert str(info.value) == (
        f"limits.{field}: {value} is more than policy 'p' allows "
        f"(a task may only tighten limits; allowed: up to {ceiling})"
    )
    assert isinstance(info.value, PolicyError)
    assert isinstance(info.value, ValueError)


def test_every_task_limit_is_checked() -> None:
    assert set(TaskLimits.model_fields) <= set(Limits.model_fields)


def test_a_task_may_tighten_limits() -> None:
    eff = resolve(
        spec(limits=TaskLimits(memory_mb=64, cpus=0.5, pids=128, output_cap_bytes=4096)), policy()
    )
    assert eff.limits.memory_mb == 64
    assert eff.limits.cpus == 0.5
    assert eff.limits.pids == 128  # equal to the ceiling is fine
    assert eff.limits.output_cap_bytes == 4096
    assert eff.limits.nofile == CEILINGS.nofile  # untouched fields keep the policy value
    assert eff.policy.limits == CEILINGS  # the policy itself is unchanged


def test_timeout_above_policy_max() -> None:
    with pytest.raises(SpecError) as info:
        resolve(spec(timeout_ms=120_001), policy())
    assert str(info.value) == (
        "timeout_ms: 120001 is more than policy 'p' allows (allowed: 1..120000)"
    )
    assert resolve(spec(timeout_ms=120_000), policy()).timeout_ms == 120_000


def test_policy_default_above_a_lower_max_cannot_happen() -> None:
    with pytest.raises(ValueError, match="must not exceed max_ms"):
        Timeouts(default_ms=5000, max_ms=1000)


def test_persistent() -> None:
    eff = resolve(spec(persistent=True), policy())
    assert (eff.persistent, eff.timeout_ms) == (True, None)
    strict = policy(timeouts=Timeouts(default_ms=1000, max_ms=1000, allow_persistent=False))
    with pytest.raises(SpecError) as info:
        resolve(spec(persistent=True), strict)
    assert str(info.value) == "persistent: policy 'p' does not allow persistent tasks"


def test_env_allowlist() -> None:
    eff = resolve(spec(env={"NODE_ENV": "production", "CI": "1"}), policy())
    assert eff.env["NODE_ENV"] == "production"
    assert eff.env["CI"] == "1"
    assert eff.env["HOME"] == "/tmp"
    with pytest.raises(SpecError) as info:
        resolve(spec(env={"LD_PRELOAD": "/x.so"}), policy())
    assert str(info.value) == (
        "env.LD_PRELOAD: policy 'p' does not let tasks set this variable "
        "(allowed names: NODE_*, CI)"
    )


def test_env_with_empty_allowlist_says_none() -> None:
    with pytest.raises(SpecError, match=r"env\.FOO: .*\(allowed names: none\)"):
        resolve(spec(env={"FOO": "1"}), policy(env=Env()))


@pytest.mark.parametrize("name", ["HOME", "PATH"])
def test_fixed_env_cannot_be_overridden_even_with_a_wildcard(name: str) -> None:
    open_policy = policy(env=Env(fixed={"HOME": "/tmp"}, allow=["*"]))
    with pytest.raises(SpecError, match=rf"^env\.{name}: "):
        resolve(spec(env={name: "/evil"}), open_policy)


def test_watch_settings() -> None:
    eff = resolve(
        spec(
            stdin="closed",
            poll_every_s=5,
            poll_tail_chars=100,
            poll_only_on_change=False,
            idle_timeout_ms=1000,
        ),
        policy(),
    )
    assert eff.stdin == "closed"
    assert eff.stall_after_s is None  # nothing can wait for input on a closed stdin
    assert eff.poll_every_s == 5
    assert eff.poll_tail_chars == 100
    assert eff.poll_only_on_change is False
    assert eff.idle_timeout_ms == 1000
    no_stalls = policy(watch=Watch(stall_detection=False))
    assert resolve(spec(stall_after_s=1.0), no_stalls).stall_after_s is None
    assert resolve(spec(stall_after_s=1.0), policy()).stall_after_s == 1.0
    closed_by_policy = policy(stdin="closed")
    assert resolve(spec(), closed_by_policy).stdin == "closed"
    assert resolve(spec(stdin="pipe"), closed_by_policy).stdin == "pipe"


# -- container_request + request_to_config ------------------------------------------------


def make_request(p: Policy, **kw: Any) -> tuple[Effective, ContainerRequest]:
    eff = resolve(spec(**kw), p)
    req = container_request(
        name="sandvisor-s1-bg-00000001",
        command=kw.get("command", "echo hi"),
        eff=eff,
        labels={"io.sandvisor.session": "s1", "io.sandvisor.task": "bg-00000001"},
        network="none",
        workspace=(),
    )
    return eff, req


def test_container_request_is_hardened() -> None:
    p = policy(
        tmpfs=[
            Tmpfs(path="/tmp", size_mb=64, nr_inodes=16384),
            Tmpfs(path="/scratch", size_mb=8, nr_inodes=100, mode="700", exec_allowed=False),
        ],
        logs=Logs(max_size_mb=16, max_files=3),
    )
    _, req = make_request(p, command="npm run dev 'x'")
    assert req.command == ["/bin/sh", "-c", "exec 2>&1; npm run dev 'x'"]
    assert req.image == "sandvisor/debian:latest"
    assert req.user == "65534:65534"
    assert req.working_dir == "/tmp"
    assert req.runtime == "runc"
    assert req.network == "none"
    assert req.read_only is True
    assert req.init is True
    assert req.stdin_open is True
    assert req.cap_add == []
    assert req.mounts == []
    assert req.memory_bytes == 256 * MIB
    assert req.nano_cpus == 1_500_000_000
    assert req.pids_limit == 128
    assert req.ulimits == [
        Ulimit(name="nofile", soft=512, hard=512),
        Ulimit(name="fsize", soft=100 * MIB, hard=100 * MIB),
        Ulimit(name="core", soft=0, hard=0),
    ]
    assert req.tmpfs == {
        "/tmp": "rw,exec,nosuid,nodev,size=64m,nr_inodes=16384,mode=1777,uid=65534,gid=65534",
        "/scratch": "rw,noexec,nosuid,nodev,size=8m,nr_inodes=100,mode=700,uid=65534,gid=65534",
    }
    assert req.env["TINI_KILL_PROCESS_GROUP"] == "1"
    assert req.env["HOME"] == "/tmp"
    assert (req.log_max_size, req.log_max_files) == ("16m", 3)
    assert req.labels == {"io.sandvisor.session": "s1", "io.sandvisor.task": "bg-00000001"}


def test_uid_only_user_owns_tmpfs_with_the_same_gid() -> None:
    _, req = make_request(policy(user="1000", init=False, stdin="closed"))
    assert req.tmpfs["/tmp"].endswith(",uid=1000,gid=1000")
    assert "TINI_KILL_PROCESS_GROUP" not in req.env
    assert req.init is False
    assert req.stdin_open is False


def test_tightened_limits_reach_the_request() -> None:
    _, req = make_request(policy(), limits=TaskLimits(memory_mb=32, pids=64, cpus=0.25))
    assert (req.memory_bytes, req.pids_limit, req.nano_cpus) == (32 * MIB, 64, 250_000_000)


def test_image_override_and_workspace_mount() -> None:
    eff = resolve(spec(), policy())
    ws = Mount(source="/srv/ws", target="/workspace", read_only=True)
    req = container_request(
        name="n",
        command="ls",
        eff=eff,
        labels={},
        network="sandvisor-s1",
        workspace=[ws],
        image="sha256:" + "a" * 64,
    )
    assert req.image == "sha256:" + "a" * 64
    assert req.network == "sandvisor-s1"
    assert req.mounts == [ws]


def test_request_to_config_engine_body() -> None:
    p = policy(cap_add=["NET_BIND_SERVICE"], logs=Logs(max_size_mb=16, max_files=3))
    _, req = make_request(p)
    body = request_to_config(req)
    hc = body["HostConfig"]
    assert hc["NetworkMode"] == "none"
    assert hc["CapDrop"] == ["ALL"]
    assert hc["CapAdd"] == ["NET_BIND_SERVICE"]
    assert hc["SecurityOpt"] == ["no-new-privileges:true"]
    assert hc["Privileged"] is False
    assert hc["ReadonlyRootfs"] is True
    assert hc["Memory"] == hc["MemorySwap"] == 256 * MIB
    assert hc["NanoCpus"] == 1_500_000_000
    assert hc["PidsLimit"] == 128
    assert hc["Ulimits"] == [
        {"Name": "nofile", "Soft": 512, "Hard": 512},
        {"Name": "fsize", "Soft": 100 * MIB, "Hard": 100 * MIB},
        {"Name": "core", "Soft": 0, "Hard": 0},
    ]
    assert hc["Init"] is True
    assert hc["Runtime"] == "runc"
    assert hc["AutoRemove"] is False
    assert hc["RestartPolicy"] == {"Name": "no"}
    assert hc["Tmpfs"] == req.tmpfs
    for opts in hc["Tmpfs"].values():
        assert "size=" in opts
        assert "nr_inodes=" in opts
        assert "uid=65534" in opts
        assert "gid=65534" in opts
        assert ",exec," in opts or ",noexec," in opts
    assert hc["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "16m", "max-file": "3"}}
    assert hc["Mounts"] == []
    assert "Binds" not in hc
    assert body["Cmd"] == ["/bin/sh", "-c", "exec 2>&1; echo hi"]
    assert body["Entrypoint"] == []
    assert body["User"] == "65534:65534"
    assert body["WorkingDir"] == "/tmp"
    assert body["Tty"] is False
    assert body["OpenStdin"] is True
    assert body["StdinOnce"] is True
    assert body["AttachStdin"] is True
    assert body["Labels"] == req.labels
    assert "HOME=/tmp" in body["Env"]
    assert "TINI_KILL_PROCESS_GROUP=1" in body["Env"]


def test_request_to_config_closed_stdin_and_mounts() -> None:
    _, req = make_request(policy(stdin="closed", runtime="runsc"))
    req = req.model_copy(update={"mounts": [Mount(source="/srv/ws", target="/workspace")]})
    body = request_to_config(req)
    assert body["OpenStdin"] is False
    assert body["StdinOnce"] is False
    assert body["AttachStdin"] is False
    assert body["HostConfig"]["Runtime"] == "runsc"
    assert body["HostConfig"]["Mounts"] == [
        {
            "Type": "bind",
            "Source": "/srv/ws",
            "Target": "/workspace",
            "ReadOnly": True,
            "BindOptions": {"Propagation": "rprivate", "NonRecursive": False},
        }
    ]


# -- workspace_mount -----------------------------------------------------------------------


def mount_of(
    p: Policy, roots: list[Path], state_dir: Path = Path("/nonexistent-state")
) -> Mount | None:
    """The policy workspace's main bind (None: it has none)."""
    found = workspace_mount(p, roots, state_dir)
    return found[0] if found else None


def ws_policy(host_path: str | Path, mode: str = "ro") -> Policy:
    return policy(workspace=Workspace.model_validate({"host_path": str(host_path), "mode": mode}))


def test_no_workspace_no_mount(tmp_path: Path) -> None:
    assert mount_of(policy(), [tmp_path]) is None


def test_workspace_under_a_root(tmp_path: Path) -> None:
    root = tmp_path / "roots"
    (root / "proj").mkdir(parents=True)
    mount = mount_of(ws_policy(root / "proj"), [tmp_path / "elsewhere", root])
    assert mount == Mount(
        source=os.path.realpath(root / "proj"),
        target="/workspace",
        read_only=True,
        non_recursive=True,
    )
    rw = mount_of(ws_policy(root / "proj", "rw"), [root])
    assert rw is not None
    assert rw.read_only is False
    assert mount_of(ws_policy(root), [root]) is not None  # the root itself


def test_workspace_outside_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "roots"
    root.mkdir()
    (tmp_path / "roots2").mkdir()  # shares the prefix, is not under the root
    for outside in (tmp_path / "roots2", tmp_path, Path("/etc")):
        with pytest.raises(PolicyError) as info:
            mount_of(ws_policy(outside), [root])
        assert "is not under an allowed workspace root" in str(info.value)
        assert str(root) in str(info.value)


def test_no_roots_configured(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"\(none configured\); add one with --workspace-root"):
        mount_of(ws_policy(tmp_path), [])


def test_symlink_escape_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "roots"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(PolicyError, match="is not under an allowed workspace root"):
        mount_of(ws_policy(root / "link"), [root])
    (root / "dotdot").symlink_to("..")
    with pytest.raises(PolicyError, match="is not under an allowed workspace root"):
        mount_of(ws_policy(root / "dotdot"), [root])


def test_symlink_inside_the_root_is_resolved(tmp_path: Path) -> None:
    root = tmp_path / "roots"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real")
    mount = mount_of(ws_policy(root / "alias"), [root])
    assert mount is not None
    assert mount.source == os.path.realpath(root / "real")  # the checked path is mounted


@pytest.mark.parametrize("host_path", ["/", "/run", "/var/run", "/var", "/run/docker.sock"])
def test_docker_socket_is_never_mounted(host_path: str) -> None:
    with pytest.raises(PolicyError, match=r"would expose|whole host"):
        mount_of(ws_policy(host_path), [Path("/")])


def test_policy_workspace_has_the_session_guard(tmp_path: Path) -> None:
    """Item 14 of the workspace review: one guard for both kinds of workspace. A policy may
    not mount the state directory (nor lie inside it), and its rw bind keeps the project's
    .git read-only, never a planted link."""
    root = tmp_path / "roots"
    state = root / "state"
    (state / "sessions").mkdir(parents=True)
    for host in (state, state / "sessions", root):
        with pytest.raises(PolicyError, match="state directory"):
            workspace_mount(ws_policy(host), [root], state)
    proj = root / "proj"
    (proj / ".git").mkdir(parents=True)
    mounts = workspace_mount(ws_policy(proj, "rw"), [root], tmp_path / "elsewhere")
    assert [(m.target, m.read_only, m.non_recursive) for m in mounts] == [
        ("/workspace", False, True),
        ("/workspace/.git", True, True),
    ]
    (proj / ".git").rmdir()
    (proj / ".git").symlink_to("/run")
    mounts = workspace_mount(ws_policy(proj, "rw"), [root], tmp_path / "elsewhere")
    assert [m.target for m in mounts] == ["/workspace"]


def test_workspace_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(PolicyError, match="is not a directory"):
        mount_of(ws_policy(tmp_path / "file"), [tmp_path])
    with pytest.raises(PolicyError, match="is not a directory"):
        mount_of(ws_policy(tmp_path / "missing"), [tmp_path])
