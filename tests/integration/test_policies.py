"""Policies against the real engine: shipped files, effective container settings, refusals,
workspaces, networked sessions, image pins, a missing gVisor, and ``sandvisor policies``."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import docker
import pytest

from supervisor import MemorySink, PolicyError, SpecError, Supervisor, TaskSpec
from supervisor.core.policy import Policy, PolicySet, load_policy_file
from supervisor.interfaces.cli.main import main as sandvisor_main
from supervisor.interfaces.cli.policies import to_toml
from supervisor.tooling.images import source_hash
from tests.conftest import POLICIES, REPO, require_engine

pytest.register_assert_rewrite("tests.private_engine")
from tests.private_engine import EngineConfig, PrivateEngine  # noqa: E402

pytestmark = pytest.mark.timeout(300)
#: The private-engine fixtures (``private_engine``, ``private_engine_factory``).
pytest_plugins = ("tests.private_engine",)

MIB = 1024 * 1024
SHIPPED = ("default", "minimal", "untrusted", "networked", "ci")
#: The settings every shipped policy shares with ``default`` unless it says otherwise.
HARDENING = ("user", "read_only_rootfs", "init", "cap_add", "limits", "tmpfs", "logs")


def client(host: str | None = None) -> Any:
    return docker.APIClient(base_url=host, version="auto", timeout=60)


def owned(sup: Supervisor, host: str | None = None) -> list[dict[str, Any]]:
    """Every container (any state) this supervisor instance labeled, but those waiting in
    its warm pools (they belong to no session, and stay until the supervisor closes)."""
    c = client(host)
    try:
        rows: list[dict[str, Any]] = c.containers(
            all=True, filters={"label": f"io.sandvisor.owner={sup.instance_id}"}
        )
        return [r for r in rows if not sup.pools.holds(r["Labels"].get("io.sandvisor.task", ""))]
    finally:
        c.close()


def write_policy(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def shipped_text(name: str) -> str:
    return (POLICIES / f"{name}.toml").read_text()


# -- the shipped files ----------------------------------------------------------------------


def test_every_shipped_policy_loads_and_is_documented() -> None:
    policies = PolicySet(POLICIES)
    assert set(SHIPPED) <= set(policies.names())
    for name in SHIPPED:
        path = POLICIES / f"{name}.toml"
        policy = load_policy_file(path)
        assert policy.name == name
        assert policy.description, f"{path} has no description"
        text = path.read_text()
        assert text.startswith("#"), f"{path} must open with a comment saying what it is for"
        # Hardened everywhere: non-root, read-only rootfs, nothing added back, an init.
        assert not policy.user.startswith("0")
        assert policy.read_only_rootfs and policy.init and policy.cap_add == []
        assert policy.limits.memory_mb <= 512
        # gVisor counts its own ~66 threads (and ~9 per process) against pids: more room.
        assert policy.limits.pids <= (1024 if policy.runtime == "runsc" else 256)
        assert policy.workspace is None
        assert all(t.nr_inodes <= 65_536 for t in policy.tmpfs)


def test_networked_is_default_plus_egress() -> None:
    default = load_policy_file(POLICIES / "default.toml").model_dump()
    networked = load_policy_file(POLICIES / "networked.toml").model_dump()
    assert networked.pop("network") == "bridge" and default.pop("network") == "none"
    # Warm containers of a networked task join its session's network: kept per session,
    # made on demand only (no floor).
    assert (networked["warm_pool"], default["warm_pool"]) == (0, 2)
    for key in ("name", "description", "warm_pool", "warm_pool_max"):
        networked.pop(key)
        default.pop(key)
    assert networked == default


def test_ci_is_closed_offline_and_pinned() -> None:
    ci = load_policy_file(POLICIES / "ci.toml")
    default = load_policy_file(POLICIES / "default.toml")
    assert ci.stdin == "closed" and ci.network == "none" and ci.runtime == "runc"
    assert not ci.timeouts.allow_persistent
    assert ci.env.fixed["CI"] == "true"
    for key in HARDENING:
        assert getattr(ci, key) == getattr(default, key), key
    assert ci.image.startswith("sandvisor/debian:") and not ci.image.endswith(":latest")


def test_ci_pin_equals_the_current_debian_source_hash() -> None:
    """Changing sandbox_images/debian changes its hash: ci.toml must be re-pinned on purpose."""
    pinned = load_policy_file(POLICIES / "ci.toml").image
    current = f"sandvisor/debian:{source_hash('debian')}"
    assert pinned == current, (
        f"policies/ci.toml pins {pinned} but the debian image sources now hash to {current}; "
        "rebuild (`sandvisor images build debian`) and update the pin in policies/ci.toml"
    )


# -- effective settings of running containers ---------------------------------------------


def assert_matches_policy(
    data: dict[str, Any], policy: Policy, *, network: str, image_id: str
) -> None:
    """``docker inspect`` of a running task container against its policy, field by field."""
    hc, cfg = data["HostConfig"], data["Config"]
    lim = policy.limits
    assert data["State"]["Running"] is True
    assert hc["Memory"] == lim.memory_mb * MIB
    assert hc["MemorySwap"] == lim.memory_mb * MIB  # no swap
    assert hc["NanoCpus"] == int(lim.cpus * 1e9)
    assert hc["PidsLimit"] == lim.pids
    assert sorted((u["Name"], u["Soft"], u["Hard"]) for u in hc["Ulimits"]) == [
        ("core", lim.core_mb * MIB, lim.core_mb * MIB),
        ("fsize", lim.fsize_mb * MIB, lim.fsize_mb * MIB),
        ("nofile", lim.nofile, lim.nofile),
    ]
    assert hc["CapDrop"] == ["ALL"]
    assert (hc["CapAdd"] or []) == policy.cap_add == []
    assert hc["SecurityOpt"] == ["no-new-privileges:true"]
    assert hc["Privileged"] is False
    assert hc["ReadonlyRootfs"] is True
    uid, _, gid = policy.user.partition(":")
    assert set(hc["Tmpfs"]) == {t.path for t in policy.tmpfs}
    for t in policy.tmpfs:
        options = hc["Tmpfs"][t.path].split(",")
        for wanted in (
            "nosuid",
            "nodev",
            f"size={t.size_mb}m",
            f"nr_inodes={t.nr_inodes}",
            f"mode={t.mode}",
            f"uid={uid}",
            f"gid={gid}",
            "exec" if t.exec_allowed else "noexec",
        ):
            assert wanted in options, (t.path, wanted, options)
    assert hc["NetworkMode"] == network
    assert cfg["User"] == policy.user
    assert cfg["WorkingDir"] == policy.working_dir
    assert hc["Runtime"] == policy.runtime
    assert hc["Init"] is True
    assert not hc.get("Binds")
    assert not hc.get("Mounts")
    assert data["Mounts"] == []
    assert hc["LogConfig"] == {
        "Type": "json-file",
        "Config": {
            "max-size": f"{policy.logs.max_size_mb}m",
            "max-file": str(policy.logs.max_files),
        },
    }
    # Never a host namespace, never a device, never restarted behind our back.
    assert hc["PidMode"] == "" and hc["UTSMode"] == "" and hc["UsernsMode"] == ""
    assert hc["IpcMode"] == "private"
    assert not hc.get("Devices") and not hc.get("VolumesFrom")
    assert hc["RestartPolicy"]["Name"] in ("", "no") and hc["AutoRemove"] is False
    assert cfg["Image"] == policy.image and data["Image"] == image_id
    assert cfg["OpenStdin"] is (policy.stdin == "pipe")
    env = dict(e.split("=", 1) for e in cfg["Env"])
    for key, value in policy.env.fixed.items():
        assert env[key] == value


@pytest.mark.parametrize("name", ["default", "untrusted", "networked", "ci"])
async def test_running_container_has_the_policy_limits(sup: Supervisor, name: str) -> None:
    session = await sup.open_session(f"inspect-{name}")
    policy = sup.policies.get(name)
    info = await session.start(
        TaskSpec(command="echo ready; sleep 600", policy=name, timeout_ms=120_000)
    )
    await session.wait_for(info.task_id, "^ready$", timeout_s=60)
    running = await session.get(info.task_id)
    assert running.status == "running" and running.container_id
    c = client()
    try:
        data = c.inspect_container(running.container_id)
        image_id = c.inspect_image(policy.image)["Id"]
    finally:
        c.close()
    network = session.network_name() if name == "networked" else "none"
    assert_matches_policy(data, policy, network=network, image_id=image_id)
    if name == "networked":
        endpoint = data["NetworkSettings"]["Networks"][session.network_name()]
        assert info.task_id in endpoint["Aliases"]
        assert set(data["NetworkSettings"]["Networks"]) == {session.network_name()}
    final = await session.stop(info.task_id)
    assert final.status == "killed" and final.reason == "user_stopped"
    await session.end()
    assert owned(sup) == []


# -- tasks asking for more than their policy allows -------------------------------------------

STRICT_ENV = """
# tests: only NODE_* variables, short timeouts
description = "tests: env allowlist"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
default_ms = 1000
max_ms = 2000
allow_persistent = false
[env]
allow = ["NODE_*"]
"""


@pytest.mark.parametrize(
    ("spec", "field", "allowed"),
    [
        ({"limits": {"memory_mb": 1024}}, "limits.memory_mb", "up to 512"),
        ({"limits": {"cpus": 2.0}}, "limits.cpus", "up to 1.0"),
        ({"limits": {"pids": 4096}}, "limits.pids", "up to 256"),
        ({"limits": {"nofile": 65536}}, "limits.nofile", "up to 1024"),
        ({"limits": {"fsize_mb": 4096}}, "limits.fsize_mb", "up to 1024"),
        ({"limits": {"output_cap_bytes": 1 << 30}}, "limits.output_cap_bytes", "up to 268435456"),
        ({"timeout_ms": 3_600_001}, "timeout_ms", "3600000"),
        ({"policy": "envonly", "timeout_ms": 5000}, "timeout_ms", "allowed: 1..2000"),
        ({"policy": "envonly", "persistent": True}, "persistent", "does not allow persistent"),
        ({"policy": "ci", "persistent": True}, "persistent", "does not allow persistent"),
        ({"env": {"PATH": "/evil"}}, "env.PATH", "fixes this variable"),
        ({"policy": "envonly", "env": {"FOO": "1"}}, "env.FOO", "allowed names: NODE_*"),
        ({"env": {"1BAD": "x"}}, "env", "not a valid variable name"),
        ({"working_dir": "/proc/self/fd/7"}, "working_dir", "unknown field"),
        ({"image": "alpine"}, "image", "unknown field"),
        ({"policy": "Bad Name!"}, "policy", "should match pattern"),
    ],
)
async def test_asking_for_more_than_the_policy_allows_starts_nothing(
    sup: Supervisor, policies_dir: Path, spec: dict[str, Any], field: str, allowed: str
) -> None:
    write_policy(policies_dir, "envonly", STRICT_ENV)
    sup.policies.reload()
    session = await sup.open_session("overask")
    with pytest.raises(SpecError) as err:
        await session.start({"command": "echo should-not-run", **spec})
    message = str(err.value)
    assert message.startswith(field) or f"{field}:" in message, message
    assert allowed in message, message
    assert await session.list() == []
    assert owned(sup) == []


async def test_allowed_env_and_tightened_limits_do_run(sup: Supervisor, policies_dir: Path) -> None:
    write_policy(policies_dir, "envonly", STRICT_ENV)
    sup.policies.reload()
    session = await sup.open_session("within")
    info = await session.start(
        TaskSpec(
            command='echo "$NODE_ENV"; ulimit -n',
            policy="envonly",
            env={"NODE_ENV": "production"},
            limits={"nofile": 64},
        )
    )
    final = await session.wait(info.task_id, timeout_s=60)
    assert final.status == "completed"
    assert Path(final.output_path).read_bytes() == b"production\n64\n"


async def test_unknown_policy_name_lists_the_known_ones(sup: Supervisor) -> None:
    session = await sup.open_session("unknown")
    with pytest.raises(PolicyError) as err:
        await session.start(TaskSpec(command="true", policy="nosuchpolicy"))
    known = sup.policies.names()
    assert set(SHIPPED) <= set(known)
    assert str(err.value) == (
        f"unknown policy 'nosuchpolicy'; known policies: {', '.join(sorted(known))}"
    )
    assert await session.list() == [] and owned(sup) == []


# -- malformed policy files ---------------------------------------------------------------------

MALFORMED = [
    ("badtoml", "memory_mb = \n", ["not valid TOML", "line 1"]),
    ("unknowntop", 'netwrok = "none"\n', ["netwrok: unknown key", "network", "allowed keys here"]),
    (
        "unknownnested",
        "[limits]\nmemroy_mb = 64\n",
        ["limits.memroy_mb: unknown key", "allowed keys here: core_mb, cpus, fsize_mb, memory_mb"],
    ),
    ("lowmem", "[limits]\nmemory_mb = 1\n", ["limits.memory_mb = 1", "greater than or equal to 6"]),
    (
        "highpids",
        "[limits]\npids = 100000\n",
        ["limits.pids = 100000", "less than or equal to 32768"],
    ),
    ("cpustr", '[limits]\ncpus = "two"\n', ["limits.cpus = 'two'", "valid number"]),
    (
        "runscpids",
        'runtime = "runsc"\n[limits]\npids = 32\n',
        ["limits.pids must be at least 64 with runtime runsc", "got 32"],
    ),
    (
        "sysadmin",
        'cap_add = ["SYS_ADMIN"]\n',
        ["cap_add = ['SYS_ADMIN']", "'SYS_ADMIN' is not allowed", "allowed: CHOWN"],
    ),
    (
        "procwd",
        'working_dir = "/proc/self/fd/7"\n',
        ["working_dir = '/proc/self/fd/7'", "no /proc"],
    ),
    ("rootuser", 'user = "0"\n', ["user = '0'", "should match pattern"]),
    ("hostnet", 'network = "host"\n', ["network = 'host'", "'none', 'session' or 'bridge'"]),
    ("kata", 'runtime = "kata"\n', ["runtime = 'kata'", "'runc' or 'runsc'"]),
    ("tmpproc", '[[tmpfs]]\npath = "/proc"\n', ["tmpfs.0.path = '/proc'", "system directory"]),
    (
        "timeorder",
        "[timeouts]\ndefault_ms = 5000\nmax_ms = 1000\n",
        ["timeouts", "default_ms (5000) must not exceed max_ms (1000)"],
    ),
    ("wrongname", 'name = "other"\n', ["name = 'other' must match the file name ('wrongname')"]),
    ("relws", '[workspace]\nhost_path = "ws"\n', ["workspace.host_path = 'ws'", "absolute"]),
]


@pytest.mark.parametrize(("name", "text", "fragments"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_policy_file_errors_name_file_key_value_and_allowed(
    tmp_path: Path, name: str, text: str, fragments: list[str]
) -> None:
    directory = tmp_path / "policies"
    directory.mkdir()
    write_policy(directory, "default", shipped_text("default"))
    path = write_policy(directory, name, text)
    with pytest.raises(PolicyError) as err:
        PolicySet(directory)
    message = str(err.value)
    assert message.startswith(f"policy file {path}"), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_supervisor_refuses_to_start_with_a_malformed_policy(tmp_path: Path) -> None:
    directory = tmp_path / "policies"
    directory.mkdir()
    path = write_policy(directory, "broken", "[limits]\nmemory_mb = 0\n")
    with pytest.raises(PolicyError, match=rf"policy file {path}:\n  limits.memory_mb = 0"):
        Supervisor(state_dir=tmp_path / "state", policies_dir=directory)


# -- workspaces ---------------------------------------------------------------------------------


@pytest.fixture
def workspace_root(tmp_path: Path) -> Path:
    root = tmp_path / "roots" / "projects"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "hello.txt").write_text("hello from the host\n")
    (root / "proj").chmod(0o777)
    return root


def ws_policy(host_path: Path | str, mode: str = "ro") -> str:
    return (
        'description = "tests: a workspace"\nimage = "sandvisor/minimal:latest"\nworking_dir = "/tmp"\n'
        f'[workspace]\nhost_path = "{host_path}"\ncontainer_path = "/project"\nmode = "{mode}"\n'
    )


async def test_workspace_is_read_only_by_default(
    state_dir: Path, policies_dir: Path, workspace_root: Path
) -> None:
    require_engine()
    write_policy(policies_dir, "wsro", ws_policy(workspace_root / "proj"))
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[workspace_root]
    ) as sup:
        session = await sup.open_session("wsro")
        info = await session.start(
            TaskSpec(
                command="cat /project/hello.txt; echo x > /project/new 2>&1 || echo refused; "
                "echo ready; sleep 600",
                policy="wsro",
            )
        )
        await session.wait_for(info.task_id, "^ready$", timeout_s=60)
        running = await session.get(info.task_id)
        c = client()
        try:
            data = c.inspect_container(running.container_id)
        finally:
            c.close()
        assert data["Mounts"] == [
            {
                "Type": "bind",
                "Source": str(workspace_root / "proj"),
                "Destination": "/project",
                "Mode": "",
                "RW": False,
                "Propagation": "rprivate",
            }
        ]
        assert not data["HostConfig"].get("Binds")
        await session.stop(info.task_id)
        text = Path(info.output_path).read_text()
        assert text.startswith("hello from the host\n")
        assert "Read-only file system" in text and "refused\nready\n" in text
        assert not (workspace_root / "proj" / "new").exists()
        await session.end()
        assert owned(sup) == []


async def test_workspace_is_writable_when_the_policy_says_rw(
    state_dir: Path, policies_dir: Path, workspace_root: Path
) -> None:
    require_engine()
    write_policy(policies_dir, "wsrw", ws_policy(workspace_root / "proj", "rw"))
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[workspace_root]
    ) as sup:
        session = await sup.open_session("wsrw")
        info = await session.start(
            TaskSpec(command="echo built > /project/out.txt && cat /project/out.txt", policy="wsrw")
        )
        final = await session.wait(info.task_id, timeout_s=60)
        assert final.status == "completed", Path(final.output_path).read_text()
        out = workspace_root / "proj" / "out.txt"
        assert out.read_text() == "built\n"
        assert (out.stat().st_uid, out.stat().st_gid) == (65534, 65534)
        await session.end()
        assert owned(sup) == []


@pytest.mark.parametrize(
    ("host_path", "roots", "fragment"),
    [
        ("{tmp}/elsewhere", ["{root}"], "is not under an allowed workspace root ({root})"),
        ("{root}/../escape", ["{root}"], "is not under an allowed workspace root"),
        ("{root}/link-out", ["{root}"], "is not under an allowed workspace root"),
        # No roots given: the home directory of the user running the supervisor.
        ("{root}/proj", [], "is not under an allowed workspace root ({home})"),
        ("/var/run", ["/var/run"], "would expose the engine's files (/run/docker.sock)"),
        ("/run", ["/"], "would expose the engine's files"),
        ("/run/docker", ["/run"], "would expose the engine's files (/run/docker)"),
        ("/var/lib/docker", ["/var/lib"], "would expose the engine's files (/var/lib/docker)"),
        ("/", ["/"], "the whole host cannot be a workspace"),
    ],
)
async def test_workspace_outside_roots_or_over_the_engine_is_refused(
    state_dir: Path,
    policies_dir: Path,
    workspace_root: Path,
    tmp_path: Path,
    host_path: str,
    roots: list[str],
    fragment: str,
) -> None:
    require_engine()
    (tmp_path / "elsewhere").mkdir()
    (workspace_root / "link-out").symlink_to(tmp_path / "elsewhere")
    fill = {"tmp": str(tmp_path), "root": str(workspace_root), "home": str(Path.home())}
    write_policy(policies_dir, "wsbad", ws_policy(host_path.format(**fill)))
    async with Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
        workspace_roots=[r.format(**fill) for r in roots],
    ) as sup:
        session = await sup.open_session("wsbad")
        with pytest.raises(PolicyError) as err:
            await session.start(TaskSpec(command="ls /project", policy="wsbad"))
        assert "workspace" in str(err.value) and fragment.format(**fill) in str(err.value), str(
            err.value
        )
        assert await session.list() == [] and owned(sup) == []


# -- the networked policy ------------------------------------------------------------------------

CURL = (
    "curl -sS --max-time 3 -o /dev/null -w 'code=%{{http_code}}\\n' http://{host}:8000/marker.txt"
)


async def test_networked_tasks_reach_each_other_by_task_id_only_within_a_session(
    sup: Supervisor,
) -> None:
    marker = secrets.token_hex(8)
    a = await sup.open_session("net-a")
    b = await sup.open_session("net-b")
    server = await a.start(
        TaskSpec(
            command=f"echo {marker} > /workspace/marker.txt && exec python3 -m http.server 8000",
            policy="networked",
            persistent=True,
        )
    )
    # Same session, by task id: retried inside the container until the server listens.
    fetch = (
        f"for i in $(seq 1 200); do curl -sf --max-time 2 http://{server.task_id}:8000/marker.txt "
        "&& exit 0; sleep 0.1; done; exit 1"
    )
    same = await a.start(TaskSpec(command=fetch, policy="networked"))
    got = await a.wait(same.task_id, timeout_s=90)
    assert got.status == "completed", Path(got.output_path).read_text()
    assert Path(got.output_path).read_text() == f"{marker}\n"

    c = client()
    try:
        running = await a.get(server.task_id)
        ip = c.inspect_container(running.container_id)["NetworkSettings"]["Networks"][
            a.network_name()
        ]["IPAddress"]
    finally:
        c.close()
    assert ip

    async def attempt(session: Any, policy: str, host: str) -> tuple[int | None, str]:
        info = await session.start(TaskSpec(command=CURL.format(host=host), policy=policy))
        final = await session.wait(info.task_id, timeout_s=60)
        return final.exit_code, Path(final.output_path).read_text()

    # Another session: the name does not resolve and the address is on an isolated bridge.
    code, text = await attempt(b, "networked", server.task_id)
    assert code == 6 and "Could not resolve host" in text, (code, text)
    code, text = await attempt(b, "networked", ip)
    assert code in (7, 28) and "code=200" not in text, (code, text)
    # A no-network task of the same session reaches nothing at all.
    for host in (server.task_id, ip):
        code, text = await attempt(a, "default", host)
        assert code in (6, 7) and "code=200" not in text, (code, text)

    await a.end()
    await b.end()
    c = client()
    try:
        names = {n["Name"] for n in c.networks()}
    finally:
        c.close()
    assert a.network_name() not in names and b.network_name() not in names
    assert owned(sup) == []


# -- image pins ---------------------------------------------------------------------------------


async def test_image_id_pin_runs_only_the_pinned_image(sup: Supervisor, policies_dir: Path) -> None:
    c = client()
    try:
        real = c.inspect_image("sandvisor/minimal:latest")["Id"]
        pinned_tag = c.inspect_image(load_policy_file(POLICIES / "ci.toml").image)["Id"]
    finally:
        c.close()
    assert pinned_tag.startswith("sha256:")  # the ci pin names an image that exists
    base = 'image = "sandvisor/minimal:latest"\nworking_dir = "/tmp"\n'
    write_policy(policies_dir, "pinok", f'{base}image_id = "{real}"\n')
    write_policy(policies_dir, "pinbad", f'{base}image_id = "sha256:{"0" * 64}"\n')
    sup.policies.reload()
    sink = MemorySink()
    session = await sup.open_session("pins", sinks=[sink])
    ok = await session.start(TaskSpec(command="echo pinned", policy="pinok"))
    bad = await session.start(TaskSpec(command="echo never", policy="pinbad"))
    ok_final = await session.wait(ok.task_id, timeout_s=60)
    bad_final = await session.wait(bad.task_id, timeout_s=60)
    assert ok_final.status == "completed" and Path(ok_final.output_path).read_text() == "pinned\n"
    assert bad_final.status == "failed" and bad_final.reason is None
    assert bad_final.error_code == "policy_error"
    assert bad_final.error == (
        f"policy 'pinbad' pins image_id sha256:{'0' * 64} but 'sandvisor/minimal:latest' is {real}; "
        "rebuild or update the pin"
    )
    assert Path(bad_final.output_path).read_bytes() == b""
    await session.end()
    (failed,) = [e for e in sink.events if e.task_id == bad.task_id and e.type == "task.failed"]
    assert failed.error_code == "policy_error"  # type: ignore[attr-defined]
    assert not [e for e in sink.events if e.task_id == bad.task_id and e.type == "task.started"]
    assert owned(sup) == []


# -- untrusted without gVisor: a private engine -------------------------------------------------


def creates_since(engine: PrivateEngine, since: float) -> list[dict[str, Any]]:
    """Container ``create`` events of the engine since ``since`` (probe and warm-pool
    containers excluded)."""
    c = engine.client()
    try:
        events = c.events(
            since=int(since) - 1,
            until=int(time.time()) + 1,
            filters={"type": "container", "event": "create"},
            decode=True,
        )
        return [
            e
            for e in events
            if "io.sandvisor.probe" not in e["Actor"]["Attributes"]
            and e["Actor"]["Attributes"].get("io.sandvisor.kind") != "pooled"
        ]
    finally:
        c.close()


async def _untrusted_fails_closed(
    engine: PrivateEngine, state_dir: Path, policies_dir: Path, fragment: str
) -> None:
    t0 = time.time()
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, docker_host=engine.docker_host
    ) as sup:
        sink = MemorySink()
        session = await sup.open_session("nogvisor", sinks=[sink])
        specs = [
            TaskSpec(command="echo should-not-run", policy="untrusted"),
            TaskSpec(command="echo should-not-run", policy="untrusted", kind="monitor"),
            TaskSpec(command="sleep 600", policy="untrusted", persistent=True),
        ]
        infos = [await session.start(s) for s in specs]
        for info in infos:
            final = await session.wait(info.task_id, timeout_s=90)
            assert final.status == "failed" and final.reason is None
            assert final.error_code == "runtime_unavailable"
            assert fragment in (final.error or ""), final.error
            assert "never falls back to runc" in (final.error or "")
            assert Path(final.output_path).read_bytes() == b""
        c = engine.client()
        try:
            assert c.containers(all=True) == []
        finally:
            c.close()
        assert creates_since(engine, t0) == []
        # The engine itself is fine: a runc task of the same session runs.
        ok = await session.start(TaskSpec(command="echo runc-works", policy="default"))
        ok_final = await session.wait(ok.task_id, timeout_s=60)
        assert ok_final.status == "completed"
        assert Path(ok_final.output_path).read_text() == "runc-works\n"
        # ... and the event query above does see creates: exactly that one.
        assert len(creates_since(engine, t0)) == 1
        await session.end()
        for info in infos:
            evs = [e for e in sink.events if e.task_id == info.task_id]
            assert [e.type for e in evs] == ["task.failed"]
            assert evs[0].error_code == "runtime_unavailable"  # type: ignore[attr-defined]
        # Only the default policy's warm pool waits for the next task (the supervisor's, not
        # the session's); it goes with the supervisor.
        assert owned(sup, engine.docker_host) == []
    c = engine.client()
    try:
        assert c.containers(all=True) == []
    finally:
        c.close()


async def test_untrusted_without_runsc_fails_closed(
    private_engine: PrivateEngine, state_dir: Path, policies_dir: Path
) -> None:
    c = private_engine.client()
    try:
        assert "runsc" not in c.info()["Runtimes"]
    finally:
        c.close()
    await _untrusted_fails_closed(
        private_engine, state_dir, policies_dir, "runtime 'runsc' is not registered"
    )


@pytest.mark.parametrize(
    "private_engine", [EngineConfig(runtimes={"runsc": {"path": "/bin/false"}})], indirect=True
)
async def test_untrusted_with_a_broken_runsc_fails_closed(
    private_engine: PrivateEngine, state_dir: Path, policies_dir: Path
) -> None:
    await _untrusted_fails_closed(
        private_engine, state_dir, policies_dir, "runtime runsc is registered but cannot start"
    )


# -- sandvisor policies ---------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = sandvisor_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "policies", "list", "--policies-dir", str(POLICIES))
    assert code == 0 and err == ""
    rows = [line.split("\t") for line in out.splitlines()]
    by_name = {r[0]: r for r in rows}
    assert [r[0] for r in rows] == PolicySet(POLICIES).names()
    assert set(SHIPPED) <= set(by_name)
    ci = load_policy_file(POLICIES / "ci.toml")
    assert by_name["ci"] == ["ci", "runc", "none", ci.image, ci.description]
    assert by_name["untrusted"][1:3] == ["runsc", "none"]
    assert by_name["networked"][1:3] == ["runc", "bridge"]
    code, out, _ = run_cli(capsys, "policies", "list", "--json", "--policies-dir", str(POLICIES))
    assert code == 0
    data = json.loads(out)
    assert [d["name"] for d in data] == PolicySet(POLICIES).names()
    assert set(data[0]) == {"name", "runtime", "network", "image", "description"}


@pytest.mark.parametrize("name", SHIPPED)
def test_cli_show_prints_every_effective_value_as_loadable_toml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    code, out, err = run_cli(capsys, "policies", "show", name, "--policies-dir", str(POLICIES))
    assert code == 0 and err == ""
    policy = load_policy_file(POLICIES / f"{name}.toml")
    # Valid TOML that loads back into the very same policy, defaults included.
    parsed = tomllib.loads(out)
    assert set(parsed) | {"image_id", "workspace"} >= set(Policy.model_fields)
    again = tmp_path / f"{name}.toml"
    again.write_text(out)
    assert load_policy_file(again) == policy
    assert "# image_id: not set" in out and "[limits]" in out and "[[tmpfs]]" in out
    code, out, _ = run_cli(
        capsys, "policies", "show", name, "--json", "--policies-dir", str(POLICIES)
    )
    assert code == 0 and json.loads(out) == policy.model_dump(mode="json")


def test_to_toml_quotes_what_needs_quoting(tmp_path: Path) -> None:
    policy = Policy(
        name="quoted",
        description='say "hi"\\ and \t tab, ünïcode',
        env={"fixed": {"A_B": 'x"y'}, "allow": ["NODE_*"]},
    )
    path = tmp_path / "quoted.toml"
    path.write_text(to_toml(policy.model_dump(mode="json")))
    assert load_policy_file(path) == policy


def test_cli_errors_exit_1_with_the_loader_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(capsys, "policies", "show", "nope", "--policies-dir", str(POLICIES))
    assert (code, out) == (1, "")
    known = ", ".join(PolicySet(POLICIES).names())
    assert err == f"sandvisor: error: unknown policy 'nope'; known policies: {known}\n"
    bad = tmp_path / "bad"
    bad.mkdir()
    path = write_policy(bad, "oops", "[limits]\nmemroy_mb = 64\n")
    for argv in (("list",), ("show", "default")):
        code, out, err = run_cli(capsys, "policies", *argv, "--policies-dir", str(bad))
        assert (code, out) == (1, "")
        assert err.startswith(
            f"sandvisor: error: policy file {path}:\n  limits.memroy_mb: unknown key"
        )
    code, out, err = run_cli(capsys, "policies", "list", "--policies-dir", str(tmp_path / "no"))
    assert code == 1 and "does not exist" in err


def test_cli_help_has_examples_and_the_real_binary_exits_1(tmp_path: Path) -> None:
    sandvisor = [sys.executable, "-m", "supervisor.interfaces.cli.main"]
    for argv in (
        ["policies", "--help"],
        ["policies", "list", "--help"],
        ["policies", "show", "--help"],
    ):
        proc = subprocess.run(
            [*sandvisor, *argv], capture_output=True, text=True, cwd=REPO, check=False
        )
        assert (
            proc.returncode == 0
            and "examples:" in proc.stdout
            and "sandvisor policies" in proc.stdout
        )
    write_policy(tmp_path, "x", "not toml at all [\n")
    proc = subprocess.run(
        [*sandvisor, "policies", "list", "--policies-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(
        f"sandvisor: error: policy file {tmp_path / 'x.toml'}: not valid TOML"
    )


@pytest.fixture(autouse=True)
def _no_env_policy_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDVISOR_POLICIES_DIR", raising=False)


def test_cli_default_dir_is_the_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "policies", "list", "--json")
    assert code == 0 and [d["name"] for d in json.loads(out)] == PolicySet(POLICIES).names()
