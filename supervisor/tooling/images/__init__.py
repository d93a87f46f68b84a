"""Sandbox images: content-hashed, offline builds of ``sandbox_images/<name>/`` with docker-py.

The package's modules, from the bottom up: ``catalogue`` (which images, their sources and
content hash), ``dockerfile`` and ``mirror`` (reading a Dockerfile, the host's Debian
mirror), ``models`` and ``progress`` (what a build reports), ``engine`` (docker-py client
and image state), ``host`` (subprocesses, apt-get), the two build drivers ``dockerbuild``
and ``debootstrap``, and ``build``, which picks a driver per image. The public names are
re-exported here: import them from ``supervisor.tooling.images``.
"""

from __future__ import annotations

from supervisor.engine.docker.convert import root_cause
from supervisor.tooling.images.build import build, ensure_built
from supervisor.tooling.images.catalogue import (
    BUILD_DIR,
    BUILDER_VERSION,
    CATALOGUE,
    IMAGES,
    LABEL_IMAGE,
    LABEL_SOURCE_HASH,
    REPOSITORY_PREFIX,
    ImageBuildError,
    ImageSpec,
    Installer,
    hash_sources,
    image_dir,
    images_dir,
    read_packages,
    repository,
    source_files,
    source_hash,
    spec,
)
from supervisor.tooling.images.dockerfile import (
    dockerfile_base,
    dockerfile_instructions,
    import_changes,
)
from supervisor.tooling.images.engine import connect, image_status
from supervisor.tooling.images.mirror import (
    DEBIAN_SUITE,
    DEFAULT_DEBIAN_MIRROR,
    AptSource,
    host_debian_mirror,
    parse_deb822,
    parse_sources_list,
    pick_debian_mirror,
)
from supervisor.tooling.images.models import BuildResult, ImageStatus
from supervisor.tooling.images.progress import (
    AptProgress,
    BuildProgress,
    DebootstrapProgress,
    Progress,
)

__all__ = [
    "BUILDER_VERSION",
    "BUILD_DIR",
    "CATALOGUE",
    "DEBIAN_SUITE",
    "DEFAULT_DEBIAN_MIRROR",
    "IMAGES",
    "LABEL_IMAGE",
    "LABEL_SOURCE_HASH",
    "REPOSITORY_PREFIX",
    "AptProgress",
    "AptSource",
    "BuildProgress",
    "BuildResult",
    "DebootstrapProgress",
    "ImageBuildError",
    "ImageSpec",
    "ImageStatus",
    "Installer",
    "Progress",
    "build",
    "connect",
    "dockerfile_base",
    "dockerfile_instructions",
    "ensure_built",
    "hash_sources",
    "host_debian_mirror",
    "image_dir",
    "image_status",
    "images_dir",
    "import_changes",
    "parse_deb822",
    "parse_sources_list",
    "pick_debian_mirror",
    "read_packages",
    "repository",
    "root_cause",
    "source_files",
    "source_hash",
    "spec",
]
