"""Building catalogue images: pick a driver per recipe, skip unchanged sources, tag, prune."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
import requests.exceptions

from supervisor.tooling.images.catalogue import (
    BUILD_DIR,
    IMAGES,
    Recipe,
    hash_sources,
    image_dir,
    spec,
)
from supervisor.tooling.images.debootstrap import debootstrap_import
from supervisor.tooling.images.dockerbuild import docker_build, fetch_busybox
from supervisor.tooling.images.dockerfile import dockerfile_base
from supervisor.tooling.images.engine import connect, engine_errors, inspect, prune_old
from supervisor.tooling.images.models import BuildResult
from supervisor.tooling.images.progress import Build, Progress

Method = Literal["dockerfile", "debootstrap"]


# busybox (minimal): Debian's static busybox on scratch.


def _build_busybox(b: Build) -> tuple[str, Method]:
    fetch_busybox(b)
    return docker_build(b), "dockerfile"


# debian (debian, dev): docker build when the base image is at hand, else debootstrap +
# docker import.


def _build_debian(b: Build) -> tuple[str, Method]:
    base = dockerfile_base(b.directory / "Dockerfile")
    if _base_available(b, base):
        return docker_build(b), "dockerfile"
    return debootstrap_import(b, installer=spec(b.name).installer), "debootstrap"


def _base_available(b: Build, base: str) -> bool:
    with engine_errors(f"inspect {base}"):
        if inspect(b.client, base) is not None:
            return True
    if not b.pull:
        b.report("base image", f"{base} is not present and pulling is off: building offline")
        return False
    b.report(f"pull {base}")
    repo, tag = docker.utils.parse_repository_tag(base)
    try:
        b.client.pull(repo, tag=tag or "latest")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        reason = str(getattr(exc, "explanation", None) or exc).splitlines()[0][:160]
        b.report("pull failed", f"{reason}; building offline with debootstrap")
        return False
    return True


_RECIPES: dict[Recipe, Callable[[Build], tuple[str, Method]]] = {
    "busybox": _build_busybox,
    "debian": _build_debian,
}


@contextlib.contextmanager
def _writable_sources(directory: Path) -> Iterator[Path]:
    """The sources themselves when the build may write its scratch there (a checkout, a
    user's venv), else a private copy (a wheel installed by root): same files, same hash."""
    if os.access(directory, os.W_OK):
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix="sandvisor-image-") as tmp:
        copy = Path(tmp) / directory.name
        shutil.copytree(directory, copy, ignore=shutil.ignore_patterns(BUILD_DIR))
        yield copy


@contextlib.contextmanager
def _build_lock(b: Build) -> Iterator[None]:
    """One build of an image at a time on this host; the second then finds it built."""
    scratch = b.directory / BUILD_DIR
    try:
        scratch.mkdir(exist_ok=True)
        handle = (scratch / ".lock").open("a")
    except OSError:
        # Read-only sources (an installed copy): nothing else can build from them either.
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            b.report("waiting", "another build of this image is running")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(
    name: str,
    *,
    progress: Progress | None = None,
    force: bool = False,
    pull: bool = True,
    client: Any = None,
) -> BuildResult:
    """Build ``sandvisor/<name>:<source hash>`` unless it exists, and point ``latest`` at it.

    ``force`` rebuilds without the build cache. ``pull`` allows pulling a Dockerfile's base
    image; without it (or when the pull fails) images that need one are built offline.
    """
    recipe = _RECIPES[spec(name).recipe]
    stack = contextlib.ExitStack()
    started = time.monotonic()
    own = client is None
    if own:
        client = connect()
    try:
        directory = stack.enter_context(_writable_sources(image_dir(name)))
        b = Build(
            client=client,
            name=name,
            directory=directory,
            source_hash=hash_sources(directory, name),
            force=force,
            pull=pull,
            progress=progress,
            started=started,
        )
        method: Literal["cached", "dockerfile", "debootstrap"]
        with _build_lock(b):
            with engine_errors(f"inspect {b.tag}"):
                existing = None if force else inspect(client, b.tag)
            if existing is not None:
                image_id, method = str(existing["Id"]), "cached"
            else:
                image_id, method = recipe(b)
            with engine_errors(f"tag {b.repo}:latest"):
                client.tag(image_id, b.repo, "latest", force=True)
            if method != "cached":
                prune_old(client, name, image_id)
    finally:
        stack.close()
        if own:
            client.close()
    return BuildResult(
        name=name,
        tag=b.tag,
        image_id=image_id,
        built=method != "cached",
        method=method,
        seconds=round(time.monotonic() - started, 3),
    )


def ensure_built(
    names: Iterable[str] | None = None,
    *,
    progress: Progress | None = None,
    force: bool = False,
    pull: bool = True,
    client: Any = None,
) -> list[BuildResult]:
    """Build each image (default: all of ``IMAGES``) whose sources changed; in order."""
    wanted = list(IMAGES if names is None else names)
    for name in wanted:
        spec(name)
    own = client is None
    if own:
        client = connect()
    try:
        return [build(n, progress=progress, force=force, pull=pull, client=client) for n in wanted]
    finally:
        if own:
            client.close()
