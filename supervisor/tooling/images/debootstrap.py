"""The offline driver: debootstrap a Debian root filesystem, slim it, ``docker import`` it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from supervisor.tooling.images.catalogue import ImageBuildError, Installer, read_packages
from supervisor.tooling.images.dockerfile import import_changes
from supervisor.tooling.images.engine import engine_errors, inspect
from supervisor.tooling.images.host import (
    apt,
    remove,
    remove_tree,
    run,
    stop,
    stream_lines,
    which,
)
from supervisor.tooling.images.mirror import DEBIAN_SUITE, host_debian_mirror
from supervisor.tooling.images.progress import AptProgress, Build, DebootstrapProgress


def _ensure_debootstrap(b: Build) -> str:
    found = which("debootstrap")
    if found:
        return found
    if os.geteuid() == 0 and Path("/etc/debian_version").exists() and shutil.which("apt-get"):
        b.report("install debootstrap", "apt-get install debootstrap")
        apt(["install", "-y", "--no-install-recommends", "debootstrap"], "install debootstrap", b)
        found = which("debootstrap")
        if found:
            return found
    raise ImageBuildError(
        "debootstrap is not installed and cannot be installed here (that needs root on "
        "Debian): install it (`apt-get install debootstrap`), or make the base image "
        "available to the engine"
    )


def _scratch_parent() -> str:
    env = os.environ.get("SANDVISOR_BUILD_TMPDIR")
    if env:
        return env
    # The root filesystem takes 0.4 to 1.2 GB and /tmp is often a small RAM-backed tmpfs. mkdtemp
    # makes a private folder inside, so the shared parent is safe.
    var_tmp = "/var/tmp"
    return var_tmp if os.path.isdir(var_tmp) else tempfile.gettempdir()


def debootstrap_import(b: Build, *, installer: Installer = "debootstrap") -> str:
    """Debootstrap the image's ``packages.txt``, clean it, import it with its Dockerfile's
    config; the image id. ``installer="apt"`` debootstraps a bare minbase and installs the
    packages with apt-get inside it."""
    debootstrap = _ensure_debootstrap(b)
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap needs root (it chroots and creates device nodes): run "
            f"`sandvisor images build {b.name}` as root, or make the base image available"
        )
    mirror = host_debian_mirror()
    if installer == "apt" and not mirror.startswith(("http://", "https://")):
        # apt runs inside the new root, where a file: path of the host does not exist.
        raise ImageBuildError(
            f"image {b.name} installs its packages with apt-get inside the new root, which "
            f"cannot read the mirror {mirror}: set SANDVISOR_DEBIAN_MIRROR to an http(s) mirror"
        )
    packages = read_packages(b.directory / "packages.txt")
    work = Path(tempfile.mkdtemp(prefix=f"sandvisor-{b.name}-", dir=_scratch_parent()))
    try:
        # A subfolder, because mkdtemp's 0700 would become the image's / and lock out uid 65534.
        rootfs = work / "rootfs"
        if installer == "apt":
            _debootstrap(b, debootstrap, rootfs, [], mirror)
            _apt_install(b, rootfs, packages)
        else:
            _debootstrap(b, debootstrap, rootfs, packages, mirror)
        _slim_rootfs(b, rootfs)
        return _import_rootfs(b, rootfs)
    finally:
        remove_tree(work)


def _debootstrap(
    b: Build, debootstrap: str, rootfs: Path, packages: Sequence[str], mirror: str
) -> None:
    argv = [
        debootstrap,
        "--variant=minbase",
        *([f"--include={','.join(packages)}"] if packages else []),
        DEBIAN_SUITE,
        str(rootfs),
        mirror,
    ]
    b.report("debootstrap: preparing", f"{DEBIAN_SUITE} from {mirror}")
    parser = DebootstrapProgress()
    try:
        for line in stream_lines(argv, f"debootstrap {DEBIAN_SUITE} from {mirror}"):
            event = parser.feed(line)
            if event is None:
                continue
            step, detail = event
            if step != b.step:
                b.report(step)
            if detail:
                b.detail(detail)
    except ImageBuildError as exc:
        log = rootfs / "debootstrap" / "debootstrap.log"
        with contextlib.suppress(OSError):
            lines = log.read_text(errors="replace").strip().splitlines()[-8:]
            if lines:
                raise ImageBuildError(
                    f"{exc}\n  debootstrap.log ends with:\n  " + "\n  ".join(lines)
                ) from exc
        raise


def _apt_install(b: Build, rootfs: Path, packages: Sequence[str]) -> None:
    """``apt-get install`` the packages chrooted into the fresh root, from the mirror
    debootstrap wrote into its sources.list (reached with the host's resolv.conf, which
    debootstrap copied in and _slim_rootfs removes)."""
    chroot = which("chroot")
    if chroot is None:
        raise ImageBuildError("apt-get install in the new root: chroot is not installed")
    # LC_ALL=C: the output is parsed for progress. Use-Pty=0: the chroot has no /dev/pts.
    env = {
        **os.environ,
        "DEBIAN_FRONTEND": "noninteractive",
        "LC_ALL": "C",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    apt_get = [chroot, str(rootfs), "apt-get", "-o", "Dpkg::Use-Pty=0"]
    apt_get += ["-o", "Acquire::Retries=3"]
    b.report("apt-get update", "in the new root")
    run([*apt_get, "update"], "apt-get update in the new root", env=env)
    b.report("apt-get: resolving", f"{len(packages)} packages and their dependencies")
    # The root lives for this build only (deleted afterwards, whatever happens): dpkg's
    # fsync after every unpacked file protects nothing here and is slow on a VM's disk.
    argv = [*apt_get, "-o", "Dpkg::Options::=--force-unsafe-io", "install", "-y"]
    argv += ["--no-install-recommends", *packages]
    parser = AptProgress()
    for line in stream_lines(argv, "apt-get install in the new root", env=env):
        event = parser.feed(line)
        if event is None:
            continue
        step, detail = event
        if step != b.step:
            b.report(step)
        b.detail(detail)


def _slim_rootfs(b: Build, rootfs: Path) -> None:
    """Drop what an image does not need: apt caches and lists, logs, docs, host files."""
    b.report("clean rootfs", "apt caches, package lists, logs, docs")
    doomed: list[Path] = [
        *rootfs.glob("var/cache/apt/archives/*.deb"),
        *rootfs.glob("var/cache/apt/*.bin"),
        *(p for p in rootfs.glob("var/lib/apt/lists/*") if p.name not in ("partial", "lock")),
        *rootfs.glob("usr/share/man/*"),
        *rootfs.glob("usr/share/info/*"),
        # The engine provides these per container; the host's copies do not belong here.
        rootfs / "etc" / "resolv.conf",
        rootfs / "etc" / "hostname",
    ]
    for doc in rootfs.glob("usr/share/doc/*"):
        if doc.is_symlink() or not doc.is_dir():
            doomed.append(doc)
        else:
            doomed.extend(p for p in doc.iterdir() if p.name != "copyright")
    for dirpath, _dirs, files in os.walk(rootfs / "var" / "log"):
        doomed.extend(Path(dirpath) / f for f in files)
    for path in doomed:
        remove(path)


def _import_rootfs(b: Build, rootfs: Path) -> str:
    changes = import_changes((b.directory / "Dockerfile").read_text(encoding="utf-8"), b.labels)
    b.report("docker import", b.tag)
    with tempfile.TemporaryFile() as errors:
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
            stdout=subprocess.PIPE,
            stderr=errors,
            stdin=subprocess.DEVNULL,
        )
        assert tar.stdout is not None
        stdout = tar.stdout

        def chunks() -> Iterator[bytes]:
            sent = reported = 0
            while data := stdout.read(1 << 20):
                sent += len(data)
                if sent - reported >= 32 << 20:
                    reported = sent
                    b.detail(f"{sent >> 20} MiB sent")
                yield data

        try:
            with engine_errors(f"docker import {b.tag}"):
                b.client.import_image(
                    src=chunks(),
                    repository=b.repo,
                    tag=b.source_hash,
                    changes=changes,
                    stream_src=True,
                )
            code = tar.wait()
        finally:
            stop(tar)
            stdout.close()
        if code != 0:
            errors.seek(0)
            text = errors.read().decode(errors="replace").strip()[-400:]
            raise ImageBuildError(f"tar of {rootfs} failed (exit {code}): {text}")
    with engine_errors(f"inspect {b.tag}"):
        data = inspect(b.client, b.tag)
    if data is None:
        raise ImageBuildError(f"docker import finished but {b.tag} does not exist")
    return str(data["Id"])
