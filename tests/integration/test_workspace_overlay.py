"""A real overlay: a task writes through Docker's ``local`` volume driver (runc, runsc);
``list_changes`` names exactly what it did and ``apply`` makes the host tree equal the
merged view the engine showed. Plus random operations through a kernel overlay mount."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.types import Mount
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.state.workspace import (
    Manifest,
    apply,
    diff,
    list_changes,
    prune_upper,
    reset_upper,
    undo,
)
from tests.conftest import examples, owned_label, require_engine
from tests.unit.workspace_tools import (
    OVERLAY_OPTS,
    File,
    Link,
    build,
    can_mount_overlay,
    git_apply,
    git_view,
    kernel_overlay,
    snapshot,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

LOWER = {
    "edit.txt": "v1\n",
    "touched.txt": "same\n",
    "gone.txt": "bye\n",
    "gonedir/a": "a",
    "gonedir/b/c": "c",
    "old-name.txt": "rename me\n",
    "olddir/x": "x",
    "olddir/y/z": "z",
    "script.sh": File(b"#!/bin/sh\necho hi\n", 0o644),
    "privdir/p": "p",
    "opq/old": "old",
    "opq/keep": "keep\n",
    "link": Link("edit.txt"),
}

SCRIPT = """set -e
cd /ws
echo v2 > edit.txt
touch touched.txt
echo new > new.txt
mkdir -p newdir/sub
echo deep > newdir/sub/deep.txt
rm gone.txt
rm -rf gonedir
mv old-name.txt new-name.txt
mv olddir newdir2
chmod 755 script.sh
chmod 700 privdir
rm -rf opq
mkdir opq
echo keep > opq/keep
echo fresh > opq/fresh
ln -s new.txt link-to-new
ln -sf /etc/passwd link
printf 'bin\\000ary' > bin.dat
"""

EXPECTED = {
    "bin.dat": "added",
    "edit.txt": "modified",
    "gone.txt": "deleted",
    "gonedir": "deleted",
    "link": "modified",
    "link-to-new": "added",
    "new-name.txt": "added",
    "new.txt": "added",
    "newdir": "added",
    "newdir/sub": "added",
    "newdir/sub/deep.txt": "added",
    "newdir2": "added",
    "newdir2/x": "added",
    "newdir2/y": "added",
    "newdir2/y/z": "added",
    "old-name.txt": "deleted",
    "olddir": "deleted",
    "opq": "replaced",
    "opq/fresh": "added",
    "opq/old": "deleted",
    "privdir": "mode",
    "script.sh": "mode",
}


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for rel, entry in sorted(snapshot(root, times=True, owners=True).items()):
        h.update(repr((rel, entry)).encode())
    return h.hexdigest()


def extract(archive: bytes, into: Path) -> Path:
    """The merged view as the engine archived it (``/ws`` of the stopped container)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, numeric_owner=True, filter="fully_trusted")
    return into / "ws"


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    require_engine()
    c = docker.from_env(timeout=120)
    yield c
    label = f"io.sandvisor.test={os.getpid()}"
    for container in c.containers.list(all=True, filters={"label": label}):
        container.remove(force=True)
    for volume in c.volumes.list(filters={"label": label}):
        volume.remove(force=True)
    c.close()


@pytest.mark.parametrize("runtime", ["runc", pytest.param("runsc", marks=pytest.mark.runsc)])
def test_overlay_volume_changes_apply(
    client: docker.DockerClient, tmp_path: Path, runtime: str
) -> None:
    if runtime not in client.info().get("Runtimes", {}):
        pytest.fail(f"runtime {runtime} is not registered with the engine")
    lower, upper, work = tmp_path / "lower", tmp_path / "upper", tmp_path / "work"
    build(lower, LOWER)
    upper.mkdir()
    work.mkdir()
    reset_upper(upper, work, lower)
    manifest = Manifest.take(lower)
    before = tree_hash(lower)
    name = f"sandvisor-ws-test-{os.getpid()}-{runtime}-{time.monotonic_ns()}"
    opts = f"lowerdir={lower},upperdir={upper},workdir={work},{OVERLAY_OPTS}"
    volume = client.volumes.create(
        name,
        driver="local",
        driver_opts={"type": "overlay", "device": "overlay", "o": opts},
        labels=owned_label(),
    )
    container = client.containers.create(
        "sandvisor/minimal:latest",
        ["sh", "-c", SCRIPT],
        mounts=[Mount(target="/ws", source=name, type="volume")],
        labels=owned_label(),
        network_mode="none",
        runtime=runtime,
        user="0:0",
    )
    try:
        container.start()
        status = container.wait(timeout=120)
        assert status["StatusCode"] == 0, container.logs().decode()
        archive = b"".join(container.get_archive("/ws")[0])
    finally:
        container.remove(force=True)
        volume.remove(force=True)
    assert tree_hash(lower) == before  # the host tree is untouched until apply
    merged = extract(archive, tmp_path / "merged")

    changes = list_changes(lower, upper, manifest)
    assert {c.path: c.kind for c in changes} == EXPECTED
    assert not any(c.conflict or c.ignored for c in changes)
    by_path = {c.path: c for c in changes}
    assert by_path["bin.dat"].binary and by_path["link"].target == "/etc/passwd"
    assert (by_path["script.sh"].old_mode, by_path["script.sh"].new_mode) == (0o644, 0o755)

    patch = diff(lower, upper, changes)
    assert "GIT binary patch" in patch and "\nrename from " not in patch
    result = apply(lower, upper, changes, tmp_path / "backup", owner=(os.getuid(), os.getgid()))
    assert len(result.applied) == len(EXPECTED)
    assert snapshot(lower) == snapshot(merged)
    undo(lower, tmp_path / "backup")
    assert tree_hash(lower) == before


# -- random operations through a kernel overlay -----------------------------------------

NAMES = ["a", "b", "d/c", "d/e", "f/g/h", "d", "f", "x.log", "d/y.log", "build", "build/o"]
OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["write", "append", "rm", "rmtree", "mkdir", "mv", "chmod", "symlink", "touch"]
        ),
        st.sampled_from(NAMES),
        st.sampled_from(NAMES),
        st.binary(max_size=20),
    ),
    max_size=12,
)


def git_view_of(view: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    """``git_view`` of a snapshot: files (bytes, exec bit) and symlinks."""
    out: dict[str, tuple[object, ...]] = {}
    for rel, entry in view.items():
        if entry[0] == "link":
            out[rel] = entry
        elif entry[0] == "file":
            out[rel] = ("file", bool(int(entry[1]) & 0o100), entry[2])  # type: ignore[call-overload]
    return out


def run_op(root: Path, op: str, a: str, b: str, data: bytes) -> None:
    pa, pb = root / a, root / b
    try:
        if op == "write":
            pa.parent.mkdir(parents=True, exist_ok=True)
            pa.write_bytes(data)
        elif op == "append":
            with pa.open("ab") as fh:
                fh.write(data or b"+")
        elif op == "rm":
            pa.unlink()
        elif op == "rmtree":
            shutil.rmtree(pa)
        elif op == "mkdir":
            pa.mkdir(parents=True)
        elif op == "mv":
            pb.parent.mkdir(parents=True, exist_ok=True)
            os.rename(pa, pb)
        elif op == "chmod":
            pa.chmod(0o700 if stat.S_IMODE(pa.stat().st_mode) != 0o700 else 0o644)
        elif op == "symlink":
            pa.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(b, pa)
        elif op == "touch":
            os.utime(pa)
    except OSError:
        pass  # an operation that makes no sense in the current tree just fails, as in a shell


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_kernel_overlay_random_operations(
    tmp_path: Path, ops: list[tuple[str, str, str, bytes]]
) -> None:
    if not can_mount_overlay(tmp_path / "probe"):
        pytest.skip("overlay mounts are not permitted here")
    base = tmp_path / f"case-{time.monotonic_ns()}"
    lower, upper, work = base / "lower", base / "upper", base / "work"
    build(
        lower,
        {
            ".gitignore": "*.log\nbuild/\n",
            "a": "a\n",
            "d/c": "c\n",
            "d/e": File(b"e\n", 0o755),
            "f/g/h": "h\n",
            "l": Link("a"),
            "build/old": "o",
            "z.log": "log",
        },
    )
    upper.mkdir()
    work.mkdir()
    reset_upper(upper, work, lower)
    manifest = Manifest.take(lower)
    with kernel_overlay(lower, upper, work, base / "merged") as merged:
        for op in ops:
            run_op(merged, *op)
        view = snapshot(merged)
    changes = list_changes(lower, upper, manifest)
    assert not any(c.conflict for c in changes)
    patch = diff(lower, upper, changes, include_ignored=True)
    if patch:
        copy = base / "copy"
        shutil.copytree(lower, copy, symlinks=True)
        git_apply(patch, copy)
        assert git_view(copy) == git_view_of(view)
    # Apply what is not ignored, keep the rest in the upper: the merged view is unchanged.
    apply(lower, upper, changes, base / "backup", owner=(0, 0))
    prune_upper(upper, work, changes)
    with kernel_overlay(lower, upper, work, base / "merged") as merged:
        assert snapshot(merged) == view
    # Then the ignored rest too: the lower is the merged view.
    rest = list_changes(lower, upper, Manifest.take(lower))
    # (An opaque directory kept for its ignored entries lists as replaced: a no-op.)
    assert all(c.ignored or (c.kind == "replaced" and c.old_mode == c.new_mode) for c in rest)
    apply(lower, upper, rest, base / "backup", owner=(0, 0), include_ignored=True)
    assert snapshot(lower) == view
    shutil.rmtree(base, ignore_errors=True)
