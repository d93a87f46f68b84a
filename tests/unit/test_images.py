"""Sandbox image tooling without an engine: content hash, mirror parsing, Dockerfile reading."""

from __future__ import annotations

import importlib
import io
import shutil
from pathlib import Path

import pytest

from supervisor.interfaces.cli.images import BuildDisplay
from supervisor.tooling import images
from supervisor.tooling.images import (
    AptProgress,
    AptSource,
    BuildProgress,
    DebootstrapProgress,
    catalogue,
    dockerfile_base,
    dockerfile_instructions,
    hash_sources,
    host_debian_mirror,
    import_changes,
    parse_deb822,
    parse_sources_list,
    pick_debian_mirror,
    read_packages,
    source_files,
)

REPO_IMAGES = Path(__file__).resolve().parents[2] / "sandbox_images"

#: The module (the package exports its ``build`` function under the same name).
build_module = importlib.import_module("supervisor.tooling.images.build")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    root = tmp_path / "img"
    (root / "etc").mkdir(parents=True)
    (root / "Dockerfile").write_text("FROM scratch\nCOPY etc/passwd /etc/passwd\n")
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    return root


# -- content hash -------------------------------------------------------------------------


def test_hash_is_stable_and_independent_of_location(image: Path, tmp_path: Path) -> None:
    first = hash_sources(image, "img")
    assert first == hash_sources(image, "img")
    assert len(first) == 12
    assert all(c in "0123456789abcdef" for c in first)
    moved = tmp_path / "elsewhere" / "img"
    shutil.copytree(image, moved)
    assert hash_sources(moved, "img") == first


def test_hash_changes_when_a_file_changes(image: Path) -> None:
    before = hash_sources(image, "img")
    (image / "etc" / "passwd").write_text("root:x:0:0::/:/bin/bash\n")
    assert hash_sources(image, "img") != before


def test_hash_changes_when_a_file_is_added_or_renamed(image: Path) -> None:
    before = hash_sources(image, "img")
    (image / "extra").write_text("")
    added = hash_sources(image, "img")
    assert added != before
    (image / "extra").rename(image / "extra2")
    assert hash_sources(image, "img") not in (before, added)


def test_hash_ignores_the_build_folder(image: Path) -> None:
    before = hash_sources(image, "img")
    build = image / images.BUILD_DIR
    build.mkdir()
    (build / "busybox").write_bytes(b"\x7fELF" + bytes(100))
    (build / "root" / "bin").mkdir(parents=True)
    (build / "root" / "bin" / "busybox").write_bytes(b"x")
    assert hash_sources(image, "img") == before
    assert all(not p.startswith(".build") for p in source_files(image))


def test_hash_covers_name_and_builder_version(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = hash_sources(image, "img")
    assert hash_sources(image, "other") != before
    # hash_sources reads the version where it is defined, not the package's re-export.
    monkeypatch.setattr(catalogue, "BUILDER_VERSION", images.BUILDER_VERSION + "-next")
    assert hash_sources(image, "img") != before


def test_path_and_content_boundaries_do_not_collide(tmp_path: Path) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "ab").write_text("c")
    (b / "a").write_text("bc")
    assert hash_sources(a, "x") != hash_sources(b, "x")


def test_shipped_images_hash_and_list_their_sources() -> None:
    for name in images.IMAGES:
        assert len(images.source_hash(name, root=REPO_IMAGES)) == 12
        assert "Dockerfile" in source_files(REPO_IMAGES / name)


def test_unknown_image_names_are_refused() -> None:
    with pytest.raises(images.ImageBuildError, match="known images: minimal, debian, dev"):
        images.source_hash("nope")


# -- Debian mirror ------------------------------------------------------------------------

DEB822 = """\
# the main archive
Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm
"""


def test_deb822_stanzas() -> None:
    sources = parse_deb822(DEB822)
    assert [(s.uri, s.suites) for s in sources] == [
        ("http://mirror.example/debian/", ("bookworm", "bookworm-updates")),
        ("http://security.example/debian-security", ("bookworm-security",)),
    ]
    assert sources[0].components == ("main",)
    assert pick_debian_mirror(sources) == "http://mirror.example/debian"


def test_deb822_continuation_lines_and_multiple_uris() -> None:
    text = "Types: deb\nURIs: http://one.example/debian\n http://two.example/debian\nSuites: sid\n"
    assert [s.uri for s in parse_deb822(text)] == [
        "http://one.example/debian",
        "http://two.example/debian",
    ]


def test_deb822_without_deb_type_is_ignored() -> None:
    assert parse_deb822("Types: deb-src\nURIs: http://x.example/debian\nSuites: bookworm\n") == []


def test_one_line_sources_list() -> None:
    text = (
        "# comment\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://ftp.example/debian bookworm main contrib\n"
        "deb http://security.example/debian-security bookworm-security main\n"
    )
    sources = parse_sources_list(text)
    assert sources[0] == AptSource(
        uri="http://ftp.example/debian", suites=("bookworm",), components=("main", "contrib")
    )
    assert pick_debian_mirror(sources) == "http://ftp.example/debian"


def test_vendor_repositories_are_not_picked() -> None:
    sources = parse_sources_list(
        "deb [arch=amd64] https://download.docker.com/linux/debian bookworm stable\n"
        "deb http://deb.example/debian bookworm main\n"
    )
    assert pick_debian_mirror(sources) == "http://deb.example/debian"


def test_security_only_archive_is_not_picked() -> None:
    sources = [
        AptSource(uri="http://security.example/debian-security", suites=("bookworm-security",))
    ]
    assert pick_debian_mirror(sources) is None


def test_host_on_another_release_still_gives_its_mirror() -> None:
    sources = [AptSource(uri="https://trixie.example/debian", suites=("trixie", "trixie-updates"))]
    assert pick_debian_mirror(sources) == "https://trixie.example/debian"


def test_ubuntu_and_odd_schemes_fall_back() -> None:
    sources = [
        AptSource(uri="http://archive.ubuntu.com/ubuntu", suites=("noble",)),
        AptSource(uri="cdrom:[Debian]/", suites=("bookworm",)),
    ]
    assert pick_debian_mirror(sources) is None


def test_host_mirror_reads_etc_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDVISOR_DEBIAN_MIRROR", raising=False)
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    assert host_debian_mirror(etc_apt=etc) == images.DEFAULT_DEBIAN_MIRROR
    (etc / "sources.list.d" / "debian.sources").write_text(DEB822)
    (etc / "sources.list.d" / "other.list.disabled").write_text(
        "deb http://no.example/d bookworm main\n"
    )
    assert host_debian_mirror(etc_apt=etc) == "http://mirror.example/debian"
    # sources.list is read first, as apt does.
    (etc / "sources.list").write_text("deb http://first.example/debian bookworm main\n")
    assert host_debian_mirror(etc_apt=etc) == "http://first.example/debian"


def test_host_mirror_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDVISOR_DEBIAN_MIRROR", "http://override.example/debian/")
    assert host_debian_mirror(etc_apt=tmp_path) == "http://override.example/debian"


# -- package list and Dockerfiles ----------------------------------------------------------


def test_read_packages(tmp_path: Path) -> None:
    path = tmp_path / "packages.txt"
    path.write_text("# header\nbash\n\npython3  # the interpreter\ngit curl\n")
    assert read_packages(path) == ["bash", "python3", "git", "curl"]


def test_debian_package_list_is_shared_by_both_build_paths() -> None:
    debian = REPO_IMAGES / "debian"
    packages = read_packages(debian / "packages.txt")
    for wanted in ("bash", "coreutils", "procps", "python3", "git", "ca-certificates", "curl"):
        assert wanted in packages
    steps = dockerfile_instructions((debian / "Dockerfile").read_text())
    assert ("COPY", "packages.txt /tmp/sandvisor-packages.txt") in steps
    assert dockerfile_base(debian / "Dockerfile") == "debian:bookworm-slim"


def test_dev_image_has_the_toolchains_and_the_debian_build_paths() -> None:
    dev = REPO_IMAGES / "dev"
    packages = read_packages(dev / "packages.txt")
    for wanted in (
        *read_packages(REPO_IMAGES / "debian" / "packages.txt"),
        "build-essential",
        "make",
        "python3-pip",
        "python3-venv",
        "python3-pytest",
        "nodejs",
        "npm",
    ):
        assert wanted in packages
    # Docker's init (tini) is injected by the policies' init = true, as for sandvisor/debian.
    assert "tini" not in packages
    steps = dockerfile_instructions((dev / "Dockerfile").read_text())
    assert ("COPY", "packages.txt /tmp/sandvisor-packages.txt") in steps
    assert dockerfile_base(dev / "Dockerfile") == "debian:bookworm-slim"
    assert images.spec("dev").recipe == images.spec("debian").recipe == "debian"


def test_catalogue_names_the_shipped_folders_in_build_order() -> None:
    assert images.IMAGES == ("minimal", "debian", "dev")
    assert [s.name for s in images.CATALOGUE] == list(images.IMAGES)
    shipped = {p.name for p in REPO_IMAGES.iterdir() if p.is_dir()}
    assert shipped == set(images.IMAGES)


def test_images_dir_is_the_checkouts_sandbox_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDVISOR_IMAGES_DIR", raising=False)
    assert images.images_dir() == REPO_IMAGES
    monkeypatch.setenv("SANDVISOR_IMAGES_DIR", "/elsewhere")
    assert images.images_dir() == Path("/elsewhere")


def test_minimal_dockerfile_installs_busybox_from_the_build_folder() -> None:
    minimal = REPO_IMAGES / "minimal"
    steps = dockerfile_instructions((minimal / "Dockerfile").read_text())
    assert steps[0] == ("FROM", "scratch")
    assert ("COPY", ".build/busybox /bin/busybox") in steps
    assert any(i == "RUN" and "--install -s /bin" in a for i, a in steps)
    passwd = (minimal / "passwd").read_text()
    assert "nobody:x:65534:65534:" in passwd
    assert "65534" in (minimal / "group").read_text()


def test_dockerfile_continuations_and_comments() -> None:
    text = "# c\nFROM x AS y\nRUN a \\\n  # inner\n  && b\nENV A=1\n"
    assert dockerfile_instructions(text) == [("FROM", "x AS y"), ("RUN", "a && b"), ("ENV", "A=1")]


def test_import_changes_keep_config_and_add_labels() -> None:
    text = 'FROM d\nARG X=1\nRUN apt-get update\nENV LANG=C.UTF-8\nWORKDIR /tmp\nCMD ["bash"]\n'
    changes = import_changes(
        text, {"io.sandvisor.image": "debian", "io.sandvisor.image.source-hash": "abc"}
    )
    assert changes == [
        "ENV LANG=C.UTF-8",
        "WORKDIR /tmp",
        'CMD ["bash"]',
        'LABEL io.sandvisor.image="debian"',
        'LABEL io.sandvisor.image.source-hash="abc"',
    ]


# -- progress ------------------------------------------------------------------------------

DEBOOTSTRAP_LOG = """\
I: Retrieving InRelease
I: Checking Release signature
I: Retrieving adduser 3.134
I: Validating adduser 3.134
I: Retrieving libc6 2.36-9+deb12u10
I: Validating libc6 2.36-9+deb12u10
I: Retrieving zlib1g 1:1.2.13.dfsg-1
I: Extracting adduser...
I: Installing core packages...
I: Unpacking required packages...
I: Unpacking libc6:amd64...
I: Configuring required packages...
I: Configuring libc6:amd64...
W: something odd
I: Unpacking the base system...
I: Unpacking zlib1g:amd64...
I: Base system installed successfully.
"""


def test_debootstrap_progress_counts_packages() -> None:
    parser = DebootstrapProgress()
    events = [e for line in DEBOOTSTRAP_LOG.splitlines() if (e := parser.feed(line))]
    assert events[0] == ("debootstrap: preparing", "Retrieving InRelease")
    assert ("debootstrap: retrieving", "3 zlib1g") in events
    assert parser.total == 3
    assert ("debootstrap: extracting", "1/3 adduser") in events
    assert ("debootstrap: extracting", "Installing core packages...") in events
    assert ("debootstrap: unpacking required packages", "1/3 libc6") in events
    assert ("debootstrap: configuring required packages", "1/3 libc6") in events
    assert ("debootstrap: unpacking the base system", "2/3 zlib1g") in events
    assert events[-1] == ("debootstrap: done", "")
    assert all("something odd" not in d for _, d in events)


APT_LOG = """\
Reading package lists...
The following NEW packages will be installed:
  libc6 nodejs npm
0 upgraded, 3 newly installed, 0 to remove and 0 not upgraded.
Get:1 http://deb.example/debian bookworm/main amd64 libc6 amd64 2.36-9+deb12u10 [2757 kB]
Get:2 http://deb.example/debian bookworm/main amd64 npm all 9.2.0~ds1-1 [1150 kB]
Fetched 3907 kB in 1s (3907 kB/s)
Selecting previously unselected package libc6:amd64.
Preparing to unpack .../0-libc6_2.36-9+deb12u10_amd64.deb ...
Unpacking libc6:amd64 (2.36-9+deb12u10) ...
Unpacking npm (9.2.0~ds1-1) ...
Setting up libc6:amd64 (2.36-9+deb12u10) ...
Processing triggers for libc-bin (2.36-9+deb12u10) ...
"""


def test_apt_progress_counts_packages() -> None:
    parser = AptProgress()
    events = [e for line in APT_LOG.splitlines() if (e := parser.feed(line))]
    assert events == [
        ("apt-get: resolving", "3 packages to install"),
        ("apt-get: downloading", "1/3 libc6"),
        ("apt-get: downloading", "2/3 npm"),
        ("apt-get: unpacking", "1/3 libc6"),
        ("apt-get: unpacking", "2/3 npm"),
        ("apt-get: configuring", "1/3 libc6"),
    ]
    assert parser.total == 3


def _progress(step: str, detail: str = "", t: float = 1.0) -> BuildProgress:
    return BuildProgress(image="debian", step=step, detail=detail, elapsed_s=t)


def test_piped_display_prints_one_line_per_step() -> None:
    out = io.StringIO()
    display = BuildDisplay(out, live=False)
    display(_progress("debootstrap: retrieving"))
    display(_progress("debootstrap: retrieving", "1 adduser"))
    display(_progress("debootstrap: retrieving", "2 apt"))
    display(_progress("docker import", "sandvisor/debian:abc", 40.0))
    assert out.getvalue().splitlines() == [
        "[debian] 1.0s debootstrap: retrieving",
        "[debian] 40.0s docker import: sandvisor/debian:abc",
    ]
    assert "\r" not in out.getvalue()


def test_live_display_redraws_the_step_line() -> None:
    out = io.StringIO()
    display = BuildDisplay(out, live=True)
    display(_progress("debootstrap: unpacking", "44/120 libc6"))
    display(_progress("debootstrap: unpacking", "45/120 libgcc-s1", 2.0))
    display(_progress("docker import", "", 3.0))
    display.end_line()
    screen = [line.split("\r")[-1].replace("\x1b[K", "") for line in out.getvalue().split("\n")]
    assert screen[0] == "[debian]    2.0s  debootstrap: unpacking  45/120 libgcc-s1"
    assert screen[1] == "[debian]    3.0s  docker import"


def test_read_only_sources_build_from_a_private_copy_with_the_same_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = tmp_path / "minimal"
    shutil.copytree(
        images.images_dir() / "minimal", sources, ignore=shutil.ignore_patterns(".build")
    )
    with build_module._writable_sources(sources) as same:
        assert same == sources
    # A wheel installed by root, used by someone else: the sources cannot take the scratch.
    monkeypatch.setattr(build_module.os, "access", lambda path, mode: False)
    with build_module._writable_sources(sources) as copy:
        assert copy != sources and copy.name == "minimal"
        assert images.hash_sources(copy, "minimal") == images.hash_sources(sources, "minimal")
    assert not copy.exists()


def test_image_tooling_translates_engine_errors_as_the_backend_does() -> None:
    """One translator (``engine.docker.convert.translate_error``) for the backend and the
    image tooling: the same docker-py error is the same error of ours in both."""
    import docker.errors  # noqa: PLC0415
    import requests.exceptions  # noqa: PLC0415

    from supervisor.core.errors import EngineError, EngineUnavailable, ImageMissing  # noqa: PLC0415
    from supervisor.engine.docker.convert import translate_error  # noqa: PLC0415
    from supervisor.tooling.images.engine import engine_errors  # noqa: PLC0415

    refused = requests.exceptions.ConnectionError(ConnectionRefusedError(111, "Connection refused"))
    cases = [
        (docker.errors.ImageNotFound("No such image: x"), ImageMissing),
        (docker.errors.APIError("boom"), EngineError),
        (refused, EngineUnavailable),
    ]
    for raw, kind in cases:
        with pytest.raises(kind) as caught, engine_errors("inspect x"):
            raise raw
        assert str(caught.value) == str(translate_error(raw, "inspect x"))
    assert "Connection refused" in str(translate_error(refused, "inspect x"))
