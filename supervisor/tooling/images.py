"""Sandbox images: content-hashed, offline builds of ``sandbox_images/<name>/`` with docker-py."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

import docker
import docker.errors
import requests.exceptions
from pydantic import BaseModel, ConfigDict

from supervisor.core.errors import EngineError, EngineUnavailable, SupervisorError
from supervisor.engine.endpoint import docker_host

#: Bump when the build procedure changes in a way that changes the images, so every
#: image is rebuilt once even though its source files did not change.
BUILDER_VERSION = "1"
#: The images ``sbx images build`` knows, in build order.
IMAGES: tuple[str, ...] = ("minimal", "debian")
REPOSITORY_PREFIX = "sbx/"
LABEL_IMAGE = "io.sbx.image"
LABEL_SOURCE_HASH = "io.sbx.image.source-hash"
DEBIAN_SUITE = "bookworm"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Build scratch folder inside each image's sources: gitignored and never hashed.
BUILD_DIR = ".build"

_DEBIAN_CODENAMES = frozenset(
    {"buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid"}
    | {"oldoldstable", "oldstable", "stable", "testing", "unstable"}
)
_IMPORT_INSTRUCTIONS = frozenset({"ENV", "LABEL", "WORKDIR", "USER", "CMD", "ENTRYPOINT"})
_ENGINE_TIMEOUT_S = 600


class ImageBuildError(SupervisorError):
    """A sandbox image could not be built; the message names the step and the cause."""

    code = "image_build_failed"


@dataclass(frozen=True, slots=True)
class BuildProgress:
    """One progress report of a build: a new ``step`` or finer ``detail`` within it."""

    image: str
    """Image name."""
    step: str
    """What the build is doing (``docker build: step 3/8 RUN ...``, ``debootstrap: unpacking``)."""
    detail: str
    """Finer progress within the step (a package count, an output line); may be empty."""
    elapsed_s: float
    """Seconds since this image's build started."""


Progress = Callable[[BuildProgress], None]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageStatus(_Model):
    """What the engine has for one sandbox image, compared with its sources."""

    name: str
    """Image name (``minimal``, ``debian``)."""
    repository: str
    """``sbx/<name>``."""
    source_hash: str
    """Content hash of the image's current sources."""
    tag: str
    """``sbx/<name>:<source_hash>``: the tag an up-to-date build carries."""
    present: bool
    """Whether ``sbx/<name>:latest`` exists."""
    up_to_date: bool
    """Whether ``latest`` was built from the current sources."""
    state: Literal["yes", "no", "missing"]
    """``yes`` up to date, ``no`` stale, ``missing`` not built."""
    image_id: str | None = None
    """Id of ``latest`` (``sha256:...``)."""
    size_bytes: int | None = None
    """Size of ``latest``."""
    created: datetime | None = None
    """When ``latest`` was created."""
    built_hash: str | None = None
    """The source hash ``latest`` was built from (its label)."""


class BuildResult(_Model):
    """The outcome of ``build()``."""

    name: str
    """Image name."""
    tag: str
    """``sbx/<name>:<source_hash>``."""
    image_id: str
    """Image id both ``tag`` and ``latest`` point at."""
    built: bool
    """False when an image for the current sources existed and was reused."""
    method: Literal["cached", "dockerfile", "debootstrap"]
    """How the image came to be: reused, ``docker build``, or debootstrap + import."""
    seconds: float
    """Wall time of the call."""


# -- sources and content hash ---------------------------------------------------------


def images_dir() -> Path:
    """``$SBX_IMAGES_DIR``, else the ``sandbox_images/`` folder of this checkout."""
    env = os.environ.get("SBX_IMAGES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "sandbox_images"


def _check_name(name: str) -> None:
    if name not in IMAGES:
        raise ImageBuildError(f"unknown image {name!r}; known images: {', '.join(IMAGES)}")


def image_dir(name: str, *, root: Path | None = None) -> Path:
    """The source folder of image ``name``."""
    _check_name(name)
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
    digest = hashlib.sha256(f"sbx-images/{BUILDER_VERSION}/{name}\0".encode())
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
    """``sbx/<name>``."""
    return f"{REPOSITORY_PREFIX}{name}"


def read_packages(path: Path) -> list[str]:
    """Package names from a ``packages.txt`` (one per line, ``#`` comments)."""
    names = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.extend(line.split())
    return names


def dockerfile_base(dockerfile: Path) -> str:
    """The image of the Dockerfile's first ``FROM``."""
    for instr, args in dockerfile_instructions(dockerfile.read_text(encoding="utf-8")):
        if instr == "FROM":
            return args.split()[0]
    raise ImageBuildError(f"{dockerfile} has no FROM line")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, with continuation lines joined and comments gone."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            instr, _, args = full.partition(" ")
            out.append((instr.upper(), args.strip()))
    if pending.strip():
        instr, _, args = pending.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def import_changes(dockerfile_text: str, labels: dict[str, str]) -> list[str]:
    """``docker import --change`` lines: the Dockerfile's image config, plus our labels."""
    changes = [
        f"{i} {a}" for i, a in dockerfile_instructions(dockerfile_text) if i in _IMPORT_INSTRUCTIONS
    ]
    changes.extend(f"LABEL {k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return changes


# -- the host's Debian mirror ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AptSource:
    """One ``deb`` source: where, which suites, which components."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...] = ()


def parse_sources_list(text: str) -> list[AptSource]:
    """``deb [options] URI suite component...`` lines of a one-line-style sources.list."""
    out: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "deb":
            out.append(AptSource(uri=parts[1], suites=(parts[2],), components=tuple(parts[3:])))
    return out


def parse_deb822(text: str) -> list[AptSource]:
    """Stanzas of a deb822 ``*.sources`` file with ``Types: deb`` and not ``Enabled: no``."""
    out: list[AptSource] = []
    for stanza in _deb822_stanzas(text):
        if "deb" not in stanza.get("types", "").split():
            continue
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        suites = tuple(stanza.get("suites", "").split())
        components = tuple(stanza.get("components", "").split())
        out.extend(
            AptSource(uri=uri, suites=suites, components=components)
            for uri in stanza.get("uris", "").split()
        )
    return out


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    key: str | None = None
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                yield fields
            fields, key = {}, None
            continue
        if raw[0] in " \t" and key is not None:
            fields[key] += " " + raw.strip()
            continue
        name, sep, value = raw.partition(":")
        if sep:
            key = name.strip().lower()
            fields[key] = value.strip()


def pick_debian_mirror(sources: Sequence[AptSource], suite: str = DEBIAN_SUITE) -> str | None:
    """The archive that serves ``suite``: one listing it, else one listing another codename."""
    # Vendor repositories (Docker's lists "bookworm stable") have no Debian "main" component.
    usable = [
        s
        for s in sources
        if s.uri.split(":", 1)[0] in ("http", "https", "file")
        and (not s.components or "main" in s.components)
    ]
    for src in usable:
        if suite in src.suites:
            return src.uri.rstrip("/")
    # A host on another release still points at a full Debian archive, which serves every
    # suite; -security and -updates archives do not, and neither do Ubuntu's.
    for src in usable:
        if any(s in _DEBIAN_CODENAMES for s in src.suites):
            return src.uri.rstrip("/")
    return None


def host_debian_mirror(*, etc_apt: Path = Path("/etc/apt"), suite: str = DEBIAN_SUITE) -> str:
    """``$SBX_DEBIAN_MIRROR``, else the host's apt mirror for ``suite``, else deb.debian.org."""
    env = os.environ.get("SBX_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    sources: list[AptSource] = []
    with contextlib.suppress(OSError):
        sources.extend(parse_sources_list((etc_apt / "sources.list").read_text()))
    list_d = etc_apt / "sources.list.d"
    with contextlib.suppress(OSError):
        for path in sorted(list_d.iterdir()):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if path.name.endswith(".sources"):
                    sources.extend(parse_deb822(path.read_text()))
                elif path.name.endswith(".list"):
                    sources.extend(parse_sources_list(path.read_text()))
    return pick_debian_mirror(sources, suite) or DEFAULT_DEBIAN_MIRROR


# -- debootstrap progress ---------------------------------------------------------------


class DebootstrapProgress:
    """Turns debootstrap's ``I:`` lines into ``(step, detail)`` with package counts.

    Steps are debootstrap's phases; lines that name no phase are details of the current one.
    """

    _PHASES: ClassVar[dict[str, str]] = {
        "Retrieving": "retrieving",
        "Validating": "retrieving",
        "Extracting": "extracting",
        "Unpacking": "unpacking",
        "Configuring": "configuring",
    }
    _INDEXES: ClassVar[tuple[str, ...]] = ("InRelease", "Release", "Packages")
    _GROUPS: ClassVar[tuple[str, ...]] = ("required packages", "the base system", "base packages")

    def __init__(self) -> None:
        self.total = 0
        """Packages retrieved: the denominator of the later phases."""
        self.step = "debootstrap: preparing"
        self._seen: dict[str, set[str]] = collections.defaultdict(set)

    def feed(self, line: str) -> tuple[str, str] | None:
        """The step and detail a line of output stands for, or None for noise."""
        text = line.strip()
        # W: and E: lines are not progress; they reach the user in the error when it fails.
        if not text.startswith("I: "):
            return None
        body = text[3:].strip()
        verb, _, rest = body.partition(" ")
        package = rest.split(" ", 1)[0].removesuffix("...").split(":", 1)[0]
        phase = self._PHASES.get(verb)
        if phase is None or package in self._INDEXES:
            if body.startswith("Base system installed"):
                self.step = "debootstrap: done"
                return (self.step, "")
            return (self.step, body)
        group = rest.removesuffix("...")
        if group in self._GROUPS:
            # debootstrap unpacks and configures twice (required, then base): name which.
            self.step = f"debootstrap: {phase} {group}"
            return (self.step, "")
        if not self.step.startswith(f"debootstrap: {phase}"):
            self.step = f"debootstrap: {phase}"
        if not package:
            return (self.step, "")
        seen = self._seen[phase]
        seen.add(package)
        if phase == "retrieving":
            self.total = len(seen)
            return (self.step, f"{len(seen)} {package}")
        return (self.step, f"{len(seen)}/{max(self.total, len(seen))} {package}")


# -- engine plumbing ---------------------------------------------------------------------


def root_cause(exc: BaseException) -> str:
    """The OS-level reason under docker-py's and requests' wrappers (``Connection refused``)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        # requests' errors are OSErrors too, but only the kernel's carry a strerror.
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += [a for a in current.args if isinstance(a, BaseException)]
        todo += [e for e in linked if isinstance(e, BaseException)]
    return str(exc)


def connect(timeout: int = _ENGINE_TIMEOUT_S) -> Any:
    """A docker-py ``APIClient`` for ``DOCKER_HOST`` (or the local socket)."""
    try:
        kwargs = docker.utils.kwargs_from_env()
        return docker.APIClient(version="auto", timeout=timeout, **kwargs)
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(
            f"no Docker engine answers at {docker_host()} ({root_cause(exc)}): "
            "is dockerd running? is DOCKER_HOST right?"
        ) from exc


@contextlib.contextmanager
def _engine_errors(what: str) -> Iterator[None]:
    try:
        yield
    except SupervisorError:
        raise
    except docker.errors.APIError as exc:
        raise EngineError(f"{what}: {exc.explanation or exc}") from exc
    except (requests.exceptions.ConnectionError, ConnectionError) as exc:
        raise EngineUnavailable(
            f"{what}: the Docker engine at {docker_host()} stopped answering ({root_cause(exc)})"
        ) from exc
    except docker.errors.DockerException as exc:
        raise EngineError(f"{what}: {exc}") from exc


def _inspect(client: Any, ref: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = client.inspect_image(ref)
    except docker.errors.NotFound:
        return None
    return data


def _created(data: dict[str, Any]) -> datetime | None:
    text = str(data.get("Created") or "")
    # Docker gives nanoseconds; fromisoformat takes at most microseconds.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def image_status(client: Any, name: str) -> ImageStatus:
    """Whether ``sbx/<name>:latest`` exists and was built from the current sources."""
    current = source_hash(name)
    repo = repository(name)
    with _engine_errors(f"inspect {repo}:latest"):
        data = _inspect(client, f"{repo}:latest")
    if data is None:
        return ImageStatus(
            name=name,
            repository=repo,
            source_hash=current,
            tag=f"{repo}:{current}",
            present=False,
            up_to_date=False,
            state="missing",
        )
    labels = (data.get("Config") or {}).get("Labels") or {}
    built = labels.get(LABEL_SOURCE_HASH)
    fresh = built == current
    return ImageStatus(
        name=name,
        repository=repo,
        source_hash=current,
        tag=f"{repo}:{current}",
        present=True,
        up_to_date=fresh,
        state="yes" if fresh else "no",
        image_id=str(data["Id"]),
        size_bytes=int(data.get("Size") or 0),
        created=_created(data),
        built_hash=built,
    )


# -- building ------------------------------------------------------------------------------

Method = Literal["dockerfile", "debootstrap"]


@dataclass
class _Build:
    """Everything one build needs, plus the step it is in (for progress reports)."""

    client: Any
    name: str
    directory: Path
    source_hash: str
    force: bool
    pull: bool
    progress: Progress | None
    started: float
    step: str = "start"

    @property
    def repo(self) -> str:
        return repository(self.name)

    @property
    def tag(self) -> str:
        return f"{self.repo}:{self.source_hash}"

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_IMAGE: self.name, LABEL_SOURCE_HASH: self.source_hash}

    def report(self, step: str, detail: str = "") -> None:
        self.step = step
        if self.progress is not None:
            self.progress(BuildProgress(self.name, step, detail, time.monotonic() - self.started))

    def detail(self, text: str) -> None:
        self.report(self.step, text)


def _run(
    argv: Sequence[str],
    what: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> str:
    """Run a short tool; its output on success, an ImageBuildError naming it on failure."""
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{what}: {argv[0]} did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n  ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ImageBuildError(
            f"{what}: `{' '.join(argv)}` exited with {done.returncode}:\n  {tail}"
        )
    return done.stdout


def _stream_lines(argv: Sequence[str], what: str) -> Iterator[str]:
    """Lines a long-running tool prints (stdout and stderr merged); raises when it fails."""
    tail: collections.deque[str] = collections.deque(maxlen=12)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip())
            yield line
        code = proc.wait()
    finally:
        # Reached early on Ctrl-C or a consumer error: the tool must not outlive the build.
        _stop(proc)
        proc.stdout.close()
    if code != 0:
        lines = "\n  ".join(t for t in tail if t)
        raise ImageBuildError(f"{what} failed (exit {code}); last output:\n  {lines}")


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _docker_build(b: _Build) -> str:
    """``docker build`` the image folder, reporting each Dockerfile step; the image id."""
    image_id: str | None = None
    tail: collections.deque[str] = collections.deque(maxlen=10)
    b.report("docker build", str(b.directory))
    with _engine_errors(f"docker build {b.tag}"):
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
                if not text:
                    continue
                tail.append(text)
                match = re.match(r"^Step (\d+/\d+) : (.*)$", text)
                if match:
                    instruction = match.group(2)
                    if len(instruction) > 60:
                        instruction = instruction[:57] + "..."
                    b.report(f"docker build: step {match.group(1)} {instruction}")
                else:
                    b.detail(text)
        if image_id is None:
            data = _inspect(b.client, b.tag)
            if data is None:
                raise ImageBuildError(f"docker build of {b.tag} finished without an image")
            image_id = str(data["Id"])
    return image_id


# minimal: Debian's static busybox on scratch.


def _build_minimal(b: _Build) -> tuple[str, Method]:
    _fetch_busybox(b, b.directory / BUILD_DIR)
    return _docker_build(b), "dockerfile"


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def _apt(args: Sequence[str], what: str, b: _Build, *, cwd: Path | None = None) -> None:
    """apt-get, refreshing the package lists once when they are missing or stale."""
    argv = ["apt-get", *args]
    if os.geteuid() == 0:
        # As root apt downloads as the _apt user, which cannot write into our build folder.
        argv[1:1] = ["-o", "APT::Sandbox::User=root"]
    try:
        _run(argv, what, cwd=cwd, env=_apt_env())
    except ImageBuildError as exc:
        if os.geteuid() != 0 or "apt-get is not installed" in str(exc):
            raise
        b.detail("apt-get update")
        _run(["apt-get", "update"], f"{what}: apt-get update", env=_apt_env())
        _run(argv, what, cwd=cwd, env=_apt_env())


def _fetch_busybox(b: _Build, scratch: Path) -> None:
    scratch.mkdir(exist_ok=True)
    for stale in (scratch / "busybox", scratch / "root", *scratch.glob("*.deb")):
        _remove(stale)
    b.report("fetch busybox-static", "apt-get download busybox-static")
    if shutil.which("apt-get") is None:
        raise ImageBuildError(
            "fetch busybox-static: apt-get is not installed; the minimal image is built from "
            "Debian's busybox-static package, so build it on a Debian or Ubuntu host"
        )
    _apt(["download", "busybox-static"], "fetch busybox-static", b, cwd=scratch)
    debs = sorted(scratch.glob("busybox-static_*.deb"))
    if not debs:
        raise ImageBuildError(f"fetch busybox-static: apt-get download left no .deb in {scratch}")
    b.report("unpack busybox-static", debs[-1].name)
    _run(["dpkg-deb", "-x", str(debs[-1]), str(scratch / "root")], "unpack busybox-static")
    for candidate in ("bin/busybox", "usr/bin/busybox"):
        path = scratch / "root" / candidate
        if path.is_file():
            shutil.copy2(path, scratch / "busybox")
            break
    else:
        raise ImageBuildError(f"unpack busybox-static: no busybox binary in {debs[-1].name}")
    _remove(scratch / "root")


# debian: docker build when the base image is at hand, else debootstrap + docker import.


def _build_debian(b: _Build) -> tuple[str, Method]:
    base = dockerfile_base(b.directory / "Dockerfile")
    if _base_available(b, base):
        return _docker_build(b), "dockerfile"
    return _debootstrap_import(b), "debootstrap"


def _base_available(b: _Build, base: str) -> bool:
    with _engine_errors(f"inspect {base}"):
        if _inspect(b.client, base) is not None:
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


def _which(tool: str) -> str | None:
    # Non-login root shells often lack the sbin directories where debootstrap lives.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(tool, path=path)


def _ensure_debootstrap(b: _Build) -> str:
    found = _which("debootstrap")
    if found:
        return found
    if os.geteuid() == 0 and Path("/etc/debian_version").exists() and shutil.which("apt-get"):
        b.report("install debootstrap", "apt-get install debootstrap")
        _apt(["install", "-y", "--no-install-recommends", "debootstrap"], "install debootstrap", b)
        found = _which("debootstrap")
        if found:
            return found
    raise ImageBuildError(
        "debootstrap is not installed and cannot be installed here (that needs root on "
        "Debian): install it (`apt-get install debootstrap`), or make the base image "
        "available to the engine"
    )


def _scratch_parent() -> str:
    env = os.environ.get("SBX_BUILD_TMPDIR")
    if env:
        return env
    # The root filesystem is ~400 MB and /tmp is often a small RAM-backed tmpfs. mkdtemp
    # makes a private folder inside, so the shared parent is safe.
    var_tmp = "/var/tmp"
    return var_tmp if os.path.isdir(var_tmp) else tempfile.gettempdir()


def _debootstrap_import(b: _Build) -> str:
    debootstrap = _ensure_debootstrap(b)
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap needs root (it chroots and creates device nodes): run "
            f"`sbx images build {b.name}` as root, or make the base image available"
        )
    mirror = host_debian_mirror()
    packages = read_packages(b.directory / "packages.txt")
    work = Path(tempfile.mkdtemp(prefix=f"sbx-{b.name}-", dir=_scratch_parent()))
    try:
        # A subfolder, because mkdtemp's 0700 would become the image's / and lock out uid 65534.
        rootfs = work / "rootfs"
        _debootstrap(b, debootstrap, rootfs, packages, mirror)
        _slim_rootfs(b, rootfs)
        return _import_rootfs(b, rootfs)
    finally:
        _remove_tree(work)


def _debootstrap(
    b: _Build, debootstrap: str, rootfs: Path, packages: Sequence[str], mirror: str
) -> None:
    argv = [
        debootstrap,
        "--variant=minbase",
        f"--include={','.join(packages)}",
        DEBIAN_SUITE,
        str(rootfs),
        mirror,
    ]
    b.report("debootstrap: preparing", f"{DEBIAN_SUITE} from {mirror}")
    parser = DebootstrapProgress()
    try:
        for line in _stream_lines(argv, f"debootstrap {DEBIAN_SUITE} from {mirror}"):
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


def _remove(path: Path) -> None:
    """Delete a file, symlink or folder without following symlinks out of a chroot."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _slim_rootfs(b: _Build, rootfs: Path) -> None:
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
        _remove(path)


def _import_rootfs(b: _Build, rootfs: Path) -> str:
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
            with _engine_errors(f"docker import {b.tag}"):
                b.client.import_image(
                    src=chunks(),
                    repository=b.repo,
                    tag=b.source_hash,
                    changes=changes,
                    stream_src=True,
                )
            code = tar.wait()
        finally:
            _stop(tar)
            stdout.close()
        if code != 0:
            errors.seek(0)
            text = errors.read().decode(errors="replace").strip()[-400:]
            raise ImageBuildError(f"tar of {rootfs} failed (exit {code}): {text}")
    with _engine_errors(f"inspect {b.tag}"):
        data = _inspect(b.client, b.tag)
    if data is None:
        raise ImageBuildError(f"docker import finished but {b.tag} does not exist")
    return str(data["Id"])


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 1:
                target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                if target.startswith(prefix):
                    found.append(target)
    return sorted(found, key=len, reverse=True)


def _remove_tree(directory: Path) -> None:
    """Delete a scratch folder, first unmounting what a failed debootstrap left mounted in it."""
    for target in _mounts_under(directory):
        with contextlib.suppress(ImageBuildError):
            _run(["umount", "-l", target], f"unmount {target}", timeout=60)
    if _mounts_under(directory):
        # rmtree would descend into a still-mounted /proc or /sys of the chroot.
        raise ImageBuildError(f"cannot unmount everything under {directory}; remove it by hand")
    shutil.rmtree(directory, ignore_errors=True)


_RECIPES: dict[str, Callable[[_Build], tuple[str, Method]]] = {
    "minimal": _build_minimal,
    "debian": _build_debian,
}


@contextlib.contextmanager
def _build_lock(b: _Build) -> Iterator[None]:
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


def _prune_old(client: Any, name: str, keep: str) -> None:
    """Untag older builds of ``name``; images a container still uses stay (no force)."""
    repo = repository(name)
    try:
        images = client.images(filters={"label": f"{LABEL_IMAGE}={name}"})
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        return
    for image in images:
        if image.get("Id") == keep:
            continue
        tags = [t for t in image.get("RepoTags") or [] if t.startswith(f"{repo}:")]
        for ref in tags or [image["Id"]]:
            with contextlib.suppress(docker.errors.APIError):
                client.remove_image(ref)


def build(
    name: str,
    *,
    progress: Progress | None = None,
    force: bool = False,
    pull: bool = True,
    client: Any = None,
) -> BuildResult:
    """Build ``sbx/<name>:<source hash>`` unless it exists, and point ``latest`` at it.

    ``force`` rebuilds without the build cache. ``pull`` allows pulling a Dockerfile's base
    image; without it (or when the pull fails) images that need one are built offline.
    """
    _check_name(name)
    started = time.monotonic()
    directory = image_dir(name)
    own = client is None
    if own:
        client = connect()
    try:
        b = _Build(
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
            with _engine_errors(f"inspect {b.tag}"):
                existing = None if force else _inspect(client, b.tag)
            if existing is not None:
                image_id, method = str(existing["Id"]), "cached"
            else:
                image_id, method = _RECIPES[name](b)
            with _engine_errors(f"tag {b.repo}:latest"):
                client.tag(image_id, b.repo, "latest", force=True)
            if method != "cached":
                _prune_old(client, name, image_id)
    finally:
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
        _check_name(name)
    own = client is None
    if own:
        client = connect()
    try:
        return [build(n, progress=progress, force=force, pull=pull, client=client) for n in wanted]
    finally:
        if own:
            client.close()
