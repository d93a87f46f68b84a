"""The pure workspace rules: allowed roots, refused paths, same path or fallback, owner."""

from __future__ import annotations

import pytest

from supervisor.core.errors import PolicyError
from supervisor.core.workspace import (
    FALLBACK_PATH,
    WorkspacePlan,
    WorkspaceSpec,
    container_path_for,
    mounts,
    plan,
    task_user,
)

ROOTS = ["/home/ada", "/srv/projects"]
STATE = "/home/ada/.local/state/sandvisor"


def _plan(path: str, owner: tuple[int, int] = (1000, 1000), mode: str = "overlay") -> WorkspacePlan:
    spec = WorkspaceSpec(path=path, mode=mode)  # type: ignore[arg-type]
    return plan(spec, path, owner, roots=ROOTS, state_dir=STATE, tmpfs_paths=["/tmp", "/workspace"])


def test_a_project_under_a_root_is_seen_at_its_own_path() -> None:
    p = _plan("/home/ada/proj")
    assert (p.host, p.container_path, p.warning) == ("/home/ada/proj", "/home/ada/proj", None)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/opt/proj", "not under an allowed workspace root"),
        ("/home/ada", "state directory"),  # contains the state dir (tokens!)
        ("/home/ada/.local/state/sandvisor/sessions", "state directory"),
        ("/home/ada/my,proj", "separators"),
        ("/home/ada/my:proj", "separators"),
        ("/home/ada/back\\slash", "separators"),
    ],
)
def test_refused_paths_name_the_reason(path: str, why: str) -> None:
    with pytest.raises(PolicyError, match=why):
        _plan(path)


def test_engine_paths_are_refused_even_under_a_root() -> None:
    with pytest.raises(PolicyError, match="engine"):
        plan(
            WorkspaceSpec(path="/var/lib/docker/x"),
            "/var/lib/docker/x",
            (0, 0),
            roots=["/var"],
            state_dir=STATE,
        )
    with pytest.raises(PolicyError, match="engine"):
        plan(WorkspaceSpec(path="/var"), "/var", (0, 0), roots=["/"], state_dir=STATE)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/home/ada/proj", "/home/ada/proj"),
        ("/tmp/proj", "/tmp/proj"),  # under a tmpfs: mounted on top of it, fine
        ("/usr/local/src/proj", FALLBACK_PATH),
        ("/etc/app", FALLBACK_PATH),
        ("/run/user/1000/p", FALLBACK_PATH),
        ("/tmp", FALLBACK_PATH),  # the tmpfs itself
        ("/", FALLBACK_PATH),
    ],
)
def test_reserved_container_paths_fall_back_to_workspace(path: str, expected: str) -> None:
    where, warning = container_path_for(path, ["/tmp"])
    assert where == expected
    assert (warning is None) == (expected == path)


def test_a_parent_of_a_tmpfs_path_falls_back() -> None:
    where, warning = container_path_for("/srv", ["/tmp", "/srv/cache"])
    assert where == FALLBACK_PATH
    assert warning is not None and "/srv/cache" in warning


@pytest.mark.parametrize(
    ("owner", "root", "runtime", "expected"),
    [
        ((1000, 100), "nobody", "runc", "1000:100"),
        ((1000, 100), "refuse", "runc", "1000:100"),
        ((0, 0), "nobody", "runc", "65534:65534"),
        ((0, 0), "root", "runsc", "0:0"),
    ],
)
def test_tasks_run_as_the_owner_or_as_the_policy_says(
    owner: tuple[int, int], root: str, runtime: str, expected: str
) -> None:
    assert task_user(_plan("/home/ada/p", owner), "p", runtime, root) == expected  # type: ignore[arg-type]


def test_a_root_owned_workspace_as_root_needs_runsc_and_refuse_refuses() -> None:
    ws = _plan("/home/ada/p", (0, 0))
    with pytest.raises(PolicyError, match="runsc"):
        task_user(ws, "default", "runc", "root")
    with pytest.raises(PolicyError, match="refuse"):
        task_user(ws, "strict", "runc", "refuse")


def test_mounts_per_mode() -> None:
    (ov,) = mounts(_plan("/home/ada/p"), "sandvisor-ws-s", [])
    assert (ov.type, ov.source, ov.target, ov.read_only) == (
        "volume",
        "sandvisor-ws-s",
        "/home/ada/p",
        False,
    )
    (ro,) = mounts(_plan("/home/ada/p", mode="ro"), None, [])
    assert (ro.type, ro.read_only, ro.non_recursive) == ("bind", True, True)
    rw, hooks, config = mounts(_plan("/home/ada/p", mode="rw"), None, [".git/hooks", ".git/config"])
    assert not rw.read_only
    assert (hooks.source, hooks.target, hooks.read_only) == (
        "/home/ada/p/.git/hooks",
        "/home/ada/p/.git/hooks",
        True,
    )
    assert config.read_only
    with pytest.raises(PolicyError):
        mounts(_plan("/home/ada/p"), None, [])


def test_spec_refuses_unknown_fields_and_modes() -> None:
    with pytest.raises(ValueError, match="mode"):
        WorkspaceSpec(path="/x", mode="cow")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="extra"):
        WorkspaceSpec.model_validate({"path": "/x", "writable": True})
