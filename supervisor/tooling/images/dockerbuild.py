"""The Dockerfile driver: ``docker build`` of an image folder, and minimal's busybox fetch."""

from __future__ import annotations

import collections
import re
import shutil

from supervisor.tooling.images.catalogue import BUILD_DIR, ImageBuildError
from supervisor.tooling.images.engine import engine_errors, inspect
from supervisor.tooling.images.host import apt, remove, run
from supervisor.tooling.images.progress import Build


def docker_build(b: Build) -> str:
    """``docker build`` the image folder, reporting each Dockerfile step; the image id."""
    image_id: str | None = None
    tail: collections.deque[str] = collections.deque(maxlen=10)
    b.report("docker build", str(b.directory))
    with engine_errors(f"docker build {b.tag}"):
        stream = b.client.build(
            path=str(b.directory),
            tag=b.tag,
            labels=b.labels,
            rm=True,
            forcerm=True,
            pull=False,
            nocache=b.force,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                lines = "".join(f"\n  {t}" for t in tail)
                raise ImageBuildError(
                    f"docker build of {b.tag} failed: {str(chunk['error']).strip()}{lines}"
                )
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = str(aux["ID"])
            for line in str(chunk.get("stream") or "").splitlines():
                text = line.strip()
                if text:
                    tail.append(text)
                    _report_line(b, text)
        if image_id is None:
            data = inspect(b.client, b.tag)
            if data is None:
                raise ImageBuildError(f"docker build of {b.tag} finished without an image")
            image_id = str(data["Id"])
    return image_id


def _report_line(b: Build, text: str) -> None:
    """A ``Step n/m : INSTRUCTION`` line starts a step; any other line is a detail of it."""
    match = re.match(r"^Step (\d+/\d+) : (.*)$", text)
    if match:
        instruction = match.group(2)
        if len(instruction) > 60:
            instruction = instruction[:57] + "..."
        b.report(f"docker build: step {match.group(1)} {instruction}")
    else:
        b.detail(text)


def fetch_busybox(b: Build) -> None:
    """Debian's static busybox binary into the image's ``.build/busybox``, for its Dockerfile."""
    scratch = b.directory / BUILD_DIR
    scratch.mkdir(exist_ok=True)
    for stale in (scratch / "busybox", scratch / "root", *scratch.glob("*.deb")):
        remove(stale)
    b.report("fetch busybox-static", "apt-get download busybox-static")
    if shutil.which("apt-get") is None:
        raise ImageBuildError(
            "fetch busybox-static: apt-get is not installed; the minimal image is built from "
            "Debian's busybox-static package, so build it on a Debian or Ubuntu host"
        )
    apt(["download", "busybox-static"], "fetch busybox-static", b, cwd=scratch)
    debs = sorted(scratch.glob("busybox-static_*.deb"))
    if not debs:
        raise ImageBuildError(f"fetch busybox-static: apt-get download left no .deb in {scratch}")
    b.report("unpack busybox-static", debs[-1].name)
    run(["dpkg-deb", "-x", str(debs[-1]), str(scratch / "root")], "unpack busybox-static")
    for candidate in ("bin/busybox", "usr/bin/busybox"):
        path = scratch / "root" / candidate
        if path.is_file():
            shutil.copy2(path, scratch / "busybox")
            break
    else:
        raise ImageBuildError(f"unpack busybox-static: no busybox binary in {debs[-1].name}")
    remove(scratch / "root")
