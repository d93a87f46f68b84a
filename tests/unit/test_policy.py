"""Policy files: every field validated; errors name the file, the dotted key, the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from supervisor.core import paths
from supervisor.core.errors import PolicyError
from supervisor.core.policy import (
    SAFE_CAPABILITIES,
    Env,
    Limits,
    Logs,
    Monitor,
    Policy,
    PolicySet,
    Session,
    Timeouts,
    Tmpfs,
    Watch,
    Workspace,
    load_policy_file,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "policies"
SUBMODELS: dict[str, type[BaseModel]] = {
    "Policy": Policy,
    "Limits": Limits,
    "Tmpfs": Tmpfs,
    "Timeouts": Timeouts,
    "Env": Env,
    "Watch": Watch,
    "Monitor": Monitor,
    "Session": Session,
    "Logs": Logs,
    "Workspace": Workspace,
}


def write(tmp_path: Path, text: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str, name: str = "p") -> tuple[Path, str]:
    path = write(tmp_path, text, name)
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    return path, str(info.value)


# -- shipped files ------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_policy_loads(path: Path) -> None:
    policy = load_policy_file(path)
    assert policy.name == path.stem
    # Only the policy made for it has egress (a per-session bridge); dev reaches the other
    # tasks of its session (an internal network); the rest have none.
    expected = {"networked": "bridge", "dev": "session"}.get(policy.name, "none")
    assert policy.network == expected
    assert policy.read_only_rootfs is True
    assert policy.cap_add == []
    assert not policy.user.startswith("0")
    assert "PATH" in policy.env.fixed
    assert policy.tmpfs, "a read-only rootfs needs somewhere to write"


def test_shipped_directory_loads_as_a_set() -> None:
    policies = PolicySet(SHIPPED)
    assert set(policies.names()) >= {"default", "minimal"}
    assert {p.name for p in policies.all()} == set(policies.names())
    default = policies.get("default")
    assert default.runtime == "runc"
    assert default.limits.pids == 256
    assert default.limits.memory_mb == 512


def test_shipped_default_matches_the_design_defaults() -> None:
    p = load_policy_file(SHIPPED / "default.toml")
    assert p.user == "65534:65534"
    assert p.init is True
    assert {t.path for t in p.tmpfs} >= {"/tmp"}
    assert all(t.size_mb > 0 and t.nr_inodes > 0 for t in p.tmpfs)
    assert p.timeouts.default_ms == 300_000
    assert p.timeouts.max_ms == 3_600_000
    assert p.limits.core_mb == 0


# -- every field rejects a bad value, and says so ------------------------------------------

# (model, field, toml text, dotted key, bad value, what the message says is allowed)
BAD_VALUES: list[tuple[str, str, str, str, object, str]] = [
    ("Policy", "name", 'name = "other"', "name", "other", "must match the file name ('p')"),
    ("Policy", "description", "description = 5", "description", 5, "valid string"),
    ("Policy", "image", 'image = ""', "image", "", "at least 1 character"),
    (
        "Policy",
        "image_id",
        'image_id = "sha256:abc"',
        "image_id",
        "sha256:abc",
        "sha256:[0-9a-f]{64}",
    ),
    ("Policy", "pull", 'pull = "yes"', "pull", "yes", "valid boolean"),
    ("Policy", "pull", "pull = 1", "pull", 1, "valid boolean"),
    ("Policy", "runtime", 'runtime = "kata"', "runtime", "kata", "'runc' or 'runsc'"),
    ("Policy", "network", 'network = "host"', "network", "host", "'none', 'session' or 'bridge'"),
    (
        "Policy",
        "workspace_root_owner",
        'workspace_root_owner = "admin"',
        "workspace_root_owner",
        "admin",
        "'nobody', 'root' or 'refuse'",
    ),
    ("Policy", "user", 'user = "0:0"', "user", "0:0", "[1-9]"),
    ("Policy", "working_dir", 'working_dir = "tmp"', "working_dir", "tmp", "plain absolute path"),
    (
        "Policy",
        "read_only_rootfs",
        'read_only_rootfs = "maybe"',
        "read_only_rootfs",
        "maybe",
        "valid boolean",
    ),
    ("Policy", "stdin", 'stdin = "open"', "stdin", "open", "'pipe' or 'closed'"),
    ("Policy", "init", "init = 2", "init", 2, "valid boolean"),
    ("Policy", "cap_add", 'cap_add = ["SYS_ADMIN"]', "cap_add", ["SYS_ADMIN"], "allowed: CHOWN"),
    ("Policy", "limits", "limits = 5", "limits", 5, "valid dictionary"),
    ("Policy", "tmpfs", 'tmpfs = "/tmp"', "tmpfs", "/tmp", "valid list"),
    ("Policy", "timeouts", "timeouts = 5", "timeouts", 5, "valid dictionary"),
    ("Policy", "env", 'env = "A=1"', "env", "A=1", "valid dictionary"),
    ("Policy", "watch", "watch = []", "watch", [], "valid dictionary"),
    ("Policy", "monitor", "monitor = 1", "monitor", 1, "valid dictionary"),
    ("Policy", "session", "session = 1", "session", 1, "valid dictionary"),
    ("Policy", "logs", "logs = 1", "logs", 1, "valid dictionary"),
    ("Policy", "workspace", "workspace = 1", "workspace", 1, "valid dictionary"),
    ("Policy", "warm_pool", "warm_pool = 65", "warm_pool", 65, "less than or equal to 64"),
    (
        "Policy",
        "placement",
        'placement = ["node.colour==red"]',
        "placement",
        ["node.colour==red"],
        "unknown key",
    ),
    (
        "Policy",
        "warm_pool_max",
        "warm_pool_max = 257",
        "warm_pool_max",
        257,
        "less than or equal to 256",
    ),
    (
        "Policy",
        "warm_pool_idle_s",
        "warm_pool_idle_s = 0",
        "warm_pool_idle_s",
        0,
        "greater than or equal to 1",
    ),
    (
        "Limits",
        "memory_mb",
        "[limits]\nmemory_mb = 5",
        "limits.memory_mb",
        5,
        "greater than or equal to 6",
    ),
    (
        "Limits",
        "memory_mb",
        "[limits]\nmemory_mb = 65537",
        "limits.memory_mb",
        65537,
        "less than or equal to 65536",
    ),
    ("Limits", "cpus", "[limits]\ncpus = 0", "limits.cpus", 0, "greater than 0"),
    ("Limits", "cpus", "[limits]\ncpus = 64.5", "limits.cpus", 64.5, "less than or equal to 64"),
    ("Limits", "pids", "[limits]\npids = 15", "limits.pids", 15, "greater than or equal to 16"),
    ("Limits", "nofile", "[limits]\nnofile = 8", "limits.nofile", 8, "greater than or equal to 16"),
    (
        "Limits",
        "fsize_mb",
        "[limits]\nfsize_mb = 0",
        "limits.fsize_mb",
        0,
        "greater than or equal to 1",
    ),
    (
        "Limits",
        "core_mb",
        "[limits]\ncore_mb = -1",
        "limits.core_mb",
        -1,
        "greater than or equal to 0",
    ),
    (
        "Limits",
        "output_cap_bytes",
        "[limits]\noutput_cap_bytes = 1023",
        "limits.output_cap_bytes",
        1023,
        "greater than or equal to 1024",
    ),
    (
        "Tmpfs",
        "path",
        '[[tmpfs]]\npath = "/proc"',
        "tmpfs.0.path",
        "/proc",
        "shadow a system directory",
    ),
    ("Tmpfs", "path", '[[tmpfs]]\npath = "tmp"', "tmpfs.0.path", "tmp", "absolute path"),
    (
        "Tmpfs",
        "size_mb",
        '[[tmpfs]]\npath = "/tmp"\nsize_mb = 0',
        "tmpfs.0.size_mb",
        0,
        "greater than or equal to 1",
    ),
    (
        "Tmpfs",
        "nr_inodes",
        '[[tmpfs]]\npath = "/tmp"\nnr_inodes = 15',
        "tmpfs.0.nr_inodes",
        15,
        "greater than or equal to 16",
    ),
    (
        "Tmpfs",
        "mode",
        '[[tmpfs]]\npath = "/tmp"\nmode = "999"',
        "tmpfs.0.mode",
        "999",
        "[0-7]{3,4}",
    ),
    (
        "Tmpfs",
        "exec_allowed",
        '[[tmpfs]]\npath = "/tmp"\nexec_allowed = "maybe"',
        "tmpfs.0.exec_allowed",
        "maybe",
        "valid boolean",
    ),
    (
        "Timeouts",
        "default_ms",
        "[timeouts]\ndefault_ms = 0",
        "timeouts.default_ms",
        0,
        "greater than or equal to 1",
    ),
    (
        "Timeouts",
        "max_ms",
        "[timeouts]\nmax_ms = 3600001",
        "timeouts.max_ms",
        3600001,
        "less than or equal to 3600000",
    ),
    (
        "Timeouts",
        "allow_persistent",
        '[timeouts]\nallow_persistent = "maybe"',
        "timeouts.allow_persistent",
        "maybe",
        "valid boolean",
    ),
    (
        "Timeouts",
        "grace_s",
        "[timeouts]\ngrace_s = 61",
        "timeouts.grace_s",
        61,
        "less than or equal to 60",
    ),
    (
        "Timeouts",
        "idle_timeout_ms",
        "[timeouts]\nidle_timeout_ms = 99",
        "timeouts.idle_timeout_ms",
        99,
        "greater than or equal to 100",
    ),
    ("Env", "fixed", "[env]\nfixed = { A = 1 }", "env.fixed.A", 1, "valid string"),
    ("Env", "allow", '[env]\nallow = "NODE_*"', "env.allow", "NODE_*", "valid list"),
    ("Env", "allow", "[env]\nallow = [1]", "env.allow.0", 1, "valid string"),
    (
        "Watch",
        "stall_after_s",
        "[watch]\nstall_after_s = 0.4",
        "watch.stall_after_s",
        0.4,
        "greater than or equal to 0.5",
    ),
    (
        "Watch",
        "stall_detection",
        '[watch]\nstall_detection = "maybe"',
        "watch.stall_detection",
        "maybe",
        "valid boolean",
    ),
    (
        "Watch",
        "poll_every_s",
        "[watch]\npoll_every_s = 0.5",
        "watch.poll_every_s",
        0.5,
        "greater than or equal to 1",
    ),
    (
        "Watch",
        "poll_tail_chars",
        "[watch]\npoll_tail_chars = 0",
        "watch.poll_tail_chars",
        0,
        "greater than or equal to 1",
    ),
    (
        "Watch",
        "poll_only_on_change",
        '[watch]\npoll_only_on_change = "maybe"',
        "watch.poll_only_on_change",
        "maybe",
        "valid boolean",
    ),
    (
        "Monitor",
        "batch_window_ms",
        "[monitor]\nbatch_window_ms = -1",
        "monitor.batch_window_ms",
        -1,
        "greater than or equal to 0",
    ),
    (
        "Monitor",
        "max_chunk_bytes",
        "[monitor]\nmax_chunk_bytes = 1023",
        "monitor.max_chunk_bytes",
        1023,
        "greater than or equal to 1024",
    ),
    (
        "Monitor",
        "lines_per_s",
        "[monitor]\nlines_per_s = 0",
        "monitor.lines_per_s",
        0,
        "greater than 0",
    ),
    (
        "Monitor",
        "burst_lines",
        "[monitor]\nburst_lines = 0",
        "monitor.burst_lines",
        0,
        "greater than or equal to 1",
    ),
    (
        "Monitor",
        "bytes_per_s",
        "[monitor]\nbytes_per_s = 0",
        "monitor.bytes_per_s",
        0,
        "greater than 0",
    ),
    (
        "Monitor",
        "burst_bytes",
        "[monitor]\nburst_bytes = 10",
        "monitor.burst_bytes",
        10,
        "greater than or equal to 1024",
    ),
    (
        "Session",
        "max_running_tasks",
        "[session]\nmax_running_tasks = 0",
        "session.max_running_tasks",
        0,
        "greater than or equal to 1",
    ),
    (
        "Session",
        "workspace_max_mb",
        "[session]\nworkspace_max_mb = 0",
        "session.workspace_max_mb",
        0,
        "greater than or equal to 1",
    ),
    (
        "Session",
        "workspace_max_files",
        "[session]\nworkspace_max_files = 2000000000",
        "session.workspace_max_files",
        2000000000,
        "less than or equal to 100000000",
    ),
    (
        "Logs",
        "max_size_mb",
        "[logs]\nmax_size_mb = 0",
        "logs.max_size_mb",
        0,
        "greater than or equal to 1",
    ),
    (
        "Logs",
        "max_files",
        "[logs]\nmax_files = 33",
        "logs.max_files",
        33,
        "less than or equal to 32",
    ),
    (
        "Workspace",
        "host_path",
        '[workspace]\nhost_path = "src"',
        "workspace.host_path",
        "src",
        "must be absolute",
    ),
    (
        "Workspace",
        "container_path",
        '[workspace]\nhost_path = "/srv/ws"\ncontainer_path = "/etc"',
        "workspace.container_path",
        "/etc",
        "shadow a system directory",
    ),
    (
        "Workspace",
        "mode",
        '[workspace]\nhost_path = "/srv/ws"\nmode = "rx"',
        "workspace.mode",
        "rx",
        "'ro' or 'rw'",
    ),
]


@pytest.mark.parametrize(
    ("model", "field", "text", "key", "bad", "allowed"),
    BAD_VALUES,
    ids=[f"{r[3]}={r[4]!r}" for r in BAD_VALUES],
)
def test_bad_value_is_rejected_naming_file_key_value_and_allowed(
    tmp_path: Path, model: str, field: str, text: str, key: str, bad: object, allowed: str
) -> None:
    assert field in SUBMODELS[model].model_fields
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert f"{key} = {bad!r}" in message
    assert allowed in message


def test_the_bad_value_table_covers_every_field() -> None:
    covered = {(m, f) for m, f, *_ in BAD_VALUES}
    every = {(name, f) for name, model in SUBMODELS.items() for f in model.model_fields}
    assert every - covered == set()


# -- unknown keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "model"),
    [
        ("colour = 1", "colour", Policy),
        ("[limits]\nswap_mb = 1", "limits.swap_mb", Limits),
        ('[[tmpfs]]\npath = "/tmp"\nuid = 1', "tmpfs.0.uid", Tmpfs),
        ("[timeouts]\nkill_after = 1", "timeouts.kill_after", Timeouts),
        ("[env]\nunset = []", "env.unset", Env),
        ("[watch]\nstall = 1", "watch.stall", Watch),
        ("[monitor]\nrate = 1", "monitor.rate", Monitor),
        ("[session]\nmax = 1", "session.max", Session),
        ("[logs]\ndriver = 'local'", "logs.driver", Logs),
        ('[workspace]\nhost_path = "/srv"\nsource = "/"', "workspace.source", Workspace),
    ],
)
def test_unknown_key_lists_the_allowed_keys(
    tmp_path: Path, text: str, key: str, model: type[BaseModel]
) -> None:
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    allowed = ", ".join(sorted(model.model_fields))
    assert f"{key}: unknown key; allowed keys here: {allowed}" in message


# -- whole-file and cross-field checks ------------------------------------------------------


def test_invalid_toml(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, "image = ")
    assert message.startswith(f"policy file {path}: not valid TOML")


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "dir.toml"
    path.mkdir()
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(path)


def test_name_must_match_the_file_name(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, 'name = "prod"', name="dev")
    assert message == (f"policy file {path}: name = 'prod' must match the file name ('dev')")
    assert load_policy_file(write(tmp_path, 'name = "dev"', "dev")).name == "dev"


def test_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    assert load_policy_file(write(tmp_path, "", "quiet")).name == "quiet"


@pytest.mark.parametrize("pids", [16, 32, 63])
def test_runsc_needs_64_pids(tmp_path: Path, pids: int) -> None:
    path, message = load_error(tmp_path, f'runtime = "runsc"\n[limits]\npids = {pids}')
    assert str(path) in message
    assert (
        f"limits.pids must be at least 64 with runtime runsc (gVisor counts its own threads), got {pids}"
        in message
    )


def test_runsc_with_64_pids_and_runc_with_16_are_fine(tmp_path: Path) -> None:
    assert (
        load_policy_file(write(tmp_path, 'runtime = "runsc"\n[limits]\npids = 64')).limits.pids
        == 64
    )
    assert load_policy_file(write(tmp_path, "[limits]\npids = 16")).limits.pids == 16


@pytest.mark.parametrize(
    "cap",
    [
        "SYS_ADMIN",
        "CAP_SYS_ADMIN",
        "net_admin",
        "SYS_PTRACE",
        "SYS_MODULE",
        "DAC_READ_SEARCH",
        "ALL",
    ],
)
def test_forbidden_capability(tmp_path: Path, cap: str) -> None:
    path, message = load_error(tmp_path, f'cap_add = ["CHOWN", "{cap}"]')
    assert str(path) in message
    assert (
        f"capability {cap!r} is not allowed; allowed: {', '.join(sorted(SAFE_CAPABILITIES))}"
        in message
    )


def test_safe_capabilities_are_normalised(tmp_path: Path) -> None:
    policy = load_policy_file(write(tmp_path, 'cap_add = ["cap_net_bind_service", "KILL"]'))
    assert policy.cap_add == ["NET_BIND_SERVICE", "KILL"]


@pytest.mark.parametrize(
    "workdir",
    [
        "/proc",
        "/proc/self/fd/7",
        "/tmp/../proc",
        "/tmp/..",
        "/a/../b",
        "relative",
        "/tmp/",
        "/tmp//x",
    ],
)
def test_working_dir_must_be_plain(tmp_path: Path, workdir: str) -> None:
    path, message = load_error(tmp_path, f'working_dir = "{workdir}"')
    assert str(path) in message
    assert f"working_dir = {workdir!r}" in message
    assert "no /proc, no '..'" in message


@pytest.mark.parametrize(
    "target",
    ["/proc", "/proc/sys", "/etc", "/etc/ssl", "/", "/sys", "/dev", "/usr/lib", "/tmp/../etc"],
)
def test_tmpfs_may_not_shadow_system_directories(tmp_path: Path, target: str) -> None:
    path, message = load_error(tmp_path, f'[[tmpfs]]\npath = "{target}"')
    assert str(path) in message
    assert f"tmpfs.0.path = {target!r}" in message


@pytest.mark.parametrize(
    "text",
    ['[[tmpfs]]\npath = "//proc"', '[workspace]\nhost_path = "/srv"\ncontainer_path = "//etc"'],
)
def test_double_slash_cannot_bypass_the_system_directory_check(tmp_path: Path, text: str) -> None:
    _, message = load_error(tmp_path, text)
    assert "would shadow a system directory" in message


@pytest.mark.parametrize("name", ["A=B", "BAD NAME", "1ABC"])
def test_fixed_env_names_must_be_variable_names(tmp_path: Path, name: str) -> None:
    _, message = load_error(tmp_path, f'[env]\nfixed = {{ "{name}" = "x" }}')
    assert "env.fixed" in message


def test_mount_paths_must_be_distinct(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, '[[tmpfs]]\npath = "/tmp"\n[[tmpfs]]\npath = "/tmp/"')
    assert str(path) in message
    assert "mount paths must be distinct, got ['/tmp', '/tmp']" in message


def test_default_ms_may_not_exceed_max_ms(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, "[timeouts]\ndefault_ms = 5000\nmax_ms = 1000")
    assert str(path) in message
    assert "  timeouts: " in message  # a check across keys names the table, not a dump of it
    assert "default_ms (5000) must not exceed max_ms (1000)" in message


def test_path_is_always_fixed(tmp_path: Path) -> None:
    policy = load_policy_file(write(tmp_path, '[env]\nfixed = { HOME = "/tmp" }'))
    assert policy.env.fixed["HOME"] == "/tmp"
    assert policy.env.fixed["PATH"].startswith("/usr/local/sbin:")
    custom = load_policy_file(write(tmp_path, '[env]\nfixed = { PATH = "/bin" }'))
    assert custom.env.fixed["PATH"] == "/bin"


def test_env_allows() -> None:
    env = Env(fixed={"HOME": "/tmp"}, allow=["NODE_*", "CI"])
    assert env.allows("NODE_ENV")
    assert env.allows("CI")
    assert not env.allows("CIRCLE")
    assert not env.allows("node_env")  # case-sensitive
    assert not env.allows("HOME")
    assert not Env(fixed={"HOME": "/tmp"}, allow=["*"]).allows("HOME")
    assert not Env().allows("ANY")


def test_models_are_frozen() -> None:
    policy = Policy()
    with pytest.raises(ValueError, match="frozen"):
        policy.image = "x"  # type: ignore[misc]


# -- PolicySet ----------------------------------------------------------------------------


def test_unknown_policy_lists_the_known_ones(tmp_path: Path) -> None:
    write(tmp_path, 'image = "a"', "alpha")
    write(tmp_path, 'image = "b"', "beta")
    policies = PolicySet(tmp_path)
    assert policies.names() == ["alpha", "beta", "default"]
    with pytest.raises(PolicyError) as info:
        policies.get("gamma")
    assert str(info.value) == "unknown policy 'gamma'; known policies: alpha, beta, default"
    assert isinstance(info.value, LookupError | ValueError)


def test_policy_set_without_directory_has_the_builtin_default() -> None:
    policies = PolicySet(None)
    assert policies.names() == ["default"]
    assert policies.get("default").description == "built-in default"


def test_a_given_directory_overrides_or_adds_to_the_shipped_policies(tmp_path: Path) -> None:
    write(tmp_path, 'image = "mine/dev:1"\ndescription = "my dev"', "dev")
    write(tmp_path, 'image = "mine/extra:1"', "extra")
    policies = PolicySet(tmp_path, shipped=SHIPPED)
    shipped = {p.stem for p in SHIPPED.glob("*.toml")}
    assert set(policies.names()) == shipped | {"extra"}
    assert policies.get("dev").image == "mine/dev:1"
    assert policies.get("untrusted").runtime == "runsc"  # shipped, untouched
    assert policies.sources() == [SHIPPED, tmp_path]


def test_load_layers_the_shipped_policies_under_the_env_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, 'image = "mine/extra:1"', "extra")
    monkeypatch.setenv("SANDVISOR_POLICIES_DIR", str(tmp_path))
    policies = PolicySet.load()
    assert {"default", "dev", "untrusted", "extra"} <= set(policies.names())
    assert policies.shipped == SHIPPED.resolve() and policies.directory == tmp_path
    monkeypatch.delenv("SANDVISOR_POLICIES_DIR")
    assert "extra" not in PolicySet.load().names()


def test_shipped_data_is_the_checkouts_when_not_installed() -> None:
    # (The installed wheel's copy is what tests/e2e/test_wheel_user.py runs on.)
    package = Path(paths.__file__).resolve().parents[1]
    assert paths.shipped_data_dir("policies") == package.parent / "policies"  # a checkout
    assert paths.shipped_data_dir("no-such-folder") is None


def test_policy_set_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="does not exist"):
        PolicySet(tmp_path / "nope")


def test_policy_set_fails_on_any_invalid_file_and_reload_rereads(tmp_path: Path) -> None:
    write(tmp_path, 'image = "a"', "alpha")
    policies = PolicySet(tmp_path)
    write(tmp_path, 'image = "b"', "beta")
    assert "beta" not in policies.names()
    policies.reload()
    assert "beta" in policies.names()
    bad = write(tmp_path, "runtime = 1", "broken")
    with pytest.raises(PolicyError, match=str(bad)):
        policies.reload()
    assert "beta" in policies.names()  # a failed reload keeps the old set
