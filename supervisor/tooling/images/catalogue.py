"""The image catalogue: which sandbox images exist, where their sources are, their content hash."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from supervisor.core.errors import SupervisorError
from supervisor.core.paths import shipped_data_dir

#: Bump when the build procedure changes in a way that changes the images, so every
#: image is rebuilt once even though its source files did not change.
BUILDER_VERSION = "1"
REPOSITORY_PREFIX = "sandvisor/"
LABEL_IMAGE = "io.sandvisor.image"
LABEL_SOURCE_HASH = "io.sandvisor.image.source-hash"
#: Build scratch folder inside each image's sources: gitignored and never hashed.
BUILD_DIR = ".build"

Recipe = Literal["busybox", "debian"]
Installer = Literal["debootstrap", "apt"]


class ImageBuildError(SupervisorError):
    """A sandbox image could not be built; the message names the step and the cause."""

    code = "image_build_failed"


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """One image of the catalogue: its name and how it is built."""

    name: str
    """``sandvisor/<name>``; also the folder of its sources under ``sandbox_images/``."""
    recipe: Recipe
    """``busybox``: Debian's busybox-static fetched, then ``docker build`` on ``scratch``.
    ``debian``: ``docker build`` when the Dockerfile's base is at hand, else debootstrap of
    ``packages.txt`` + ``docker import``."""
    summary: str
    """One line for people."""
    installer: Installer = "debootstrap"
    """How the offline path installs ``packages.txt``: ``debootstrap``'s ``--include``, or
    ``apt``: ``apt-get install`` chrooted into a bare minbase root, for package sets whose
    dependencies name virtual packages (npm's do), which debootstrap's resolver ignores."""


#: The images ``sandvisor images build`` knows, in build order.
CATALOGUE: tuple[ImageSpec, ...] = (
    ImageSpec("minimal", "busybox", "Debian's static busybox on scratch"),
    ImageSpec("debian", "debian", "Debian bookworm with bash, python3, git and curl"),
    ImageSpec(
        "dev",
        "debian",
        "Debian bookworm toolchain: gcc, make, git, python3 with pip/venv/pytest, node and npm",
        installer="apt",
    ),
)
IMAGES: tuple[str, ...] = tuple(spec.name for spec in CATALOGUE)


def spec(name: str) -> ImageSpec:
    """The catalogue entry of ``name``; ImageBuildError naming the known images otherwise."""
    for entry in CATALOGUE:
        if entry.name == name:
            return entry
    raise ImageBuildError(f"unknown image {name!r}; known images: {', '.join(IMAGES)}")


def images_dir() -> Path:
    """``$SANDVISOR_IMAGES_DIR``, else the image sources shipped in the wheel, else the
    ``sandbox_images/`` folder of this checkout."""
    env = os.environ.get("SANDVISOR_IMAGES_DIR")
    if env:
        return Path(env)
    shipped = shipped_data_dir("sandbox_images")
    if shipped is None:
        raise ImageBuildError(
            "the image sources (sandbox_images/) are not installed with this copy of "
            "sandvisor; reinstall it from its wheel, or set SANDVISOR_IMAGES_DIR"
        )
    return shipped


def image_dir(name: str, *, root: Path | None = None) -> Path:
    """The source folder of image ``name``."""
    spec(name)
    directory = (root or images_dir()) / name
    if not directory.is_dir():
        raise ImageBuildError(f"sources of image {name!r} not found at {directory}")
    return directory


def source_files(directory: Path) -> list[str]:
    """Relative POSIX paths of the files that define an image (sorted; ``.build/`` excluded)."""
    out = []
    for path in directory.rglob("*"):
        rel = path.relative_to(directory)
        if rel.parts[0] == BUILD_DIR or "__pycache__" in rel.parts or not path.is_file():
            continue
        out.append(rel.as_posix())
    return sorted(out)


def hash_sources(directory: Path, name: str) -> str:
    """First 12 hex digits of a sha256 over the builder version, name, paths and bytes."""
    digest = hashlib.sha256(f"sandvisor-images/{BUILDER_VERSION}/{name}\0".encode())
    for rel in source_files(directory):
        data = (directory / rel).read_bytes()
        # Lengths delimit the fields, so moving bytes between a name and a file can't collide.
        digest.update(f"{len(rel)}:{rel}\0{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()[:12]


def source_hash(name: str, *, root: Path | None = None) -> str:
    """Content hash of image ``name``'s sources: the tag an up-to-date image carries."""
    return hash_sources(image_dir(name, root=root), name)


def repository(name: str) -> str:
    """``sandvisor/<name>``."""
    return f"{REPOSITORY_PREFIX}{name}"


def read_packages(path: Path) -> list[str]:
    """Package names from a ``packages.txt`` (one per line, ``#`` comments)."""
    names = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.extend(line.split())
    return names
