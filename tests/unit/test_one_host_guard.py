"""One host-path guard (issue 24, item 3): every path that mounts a host directory goes
through ``core.workspace.check_host_path``, and its list of the engine's files is the only
one. A second copy drifts (the policy workspace's copy never refused the state directory)."""

from __future__ import annotations

import ast
from pathlib import Path

from supervisor.core.workspace import ENGINE_PATHS

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"
#: Where naming an engine path is not a guard: the client's default socket.
NOT_A_GUARD = {("engine/endpoint.py", "/var/run/docker.sock")}


def test_the_engine_paths_are_listed_once() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "core/workspace.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and node.value in ENGINE_PATHS
                and (rel, node.value) not in NOT_A_GUARD
            ):
                found.append(f"{rel}:{node.lineno}: {node.value}")
    assert found == [], "a second list of the engine's paths; use check_host_path"


def test_every_host_mount_calls_the_guard() -> None:
    """The modules that build bind mounts of host directories call check_host_path."""
    builders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if "Mount(" in text and "source=" in text and "def " in text:
            builders.append((str(path.relative_to(PACKAGE)), "check_host_path" in text))
    unguarded = {
        rel
        for rel, guarded in builders
        if not guarded
        # Mounts of a session's own, already-validated workspace plan or of its state.
        and rel not in {"core/workspace.py", "runtime/workspace.py", "runtime/workspace_git.py"}
        and not rel.startswith("engine/")
    }
    assert unguarded == set(), unguarded
