"""Engine access for image builds: a docker-py client, error translation, image inspection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import docker
import docker.errors
import requests.exceptions

from supervisor.core.errors import EngineUnavailable, SupervisorError
from supervisor.core.text import parse_engine_time
from supervisor.engine.docker.convert import root_cause, translate_error
from supervisor.engine.endpoint import docker_host
from supervisor.tooling.images.catalogue import (
    LABEL_IMAGE,
    LABEL_SOURCE_HASH,
    repository,
    source_hash,
)
from supervisor.tooling.images.models import ImageStatus

#: A build step (a long RUN, a big import) can keep one response silent for minutes; the
#: client's read timeout must outlast it.
ENGINE_TIMEOUT_S = 600


def connect(timeout: int = ENGINE_TIMEOUT_S) -> Any:
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
def engine_errors(what: str) -> Iterator[None]:
    """docker-py's and requests' errors as the supervisor's, naming ``what`` was being done
    (the engine port's translator, as every backend call)."""
    try:
        yield
    except SupervisorError:
        raise
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise translate_error(exc, what) from exc


def inspect(client: Any, ref: str) -> dict[str, Any] | None:
    """The engine's inspect data of image ``ref``, or None when it does not exist."""
    try:
        data: dict[str, Any] = client.inspect_image(ref)
    except docker.errors.NotFound:
        return None
    return data


def _created(data: dict[str, Any]) -> datetime | None:
    stamp = parse_engine_time(str(data.get("Created") or ""))
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC)


def image_status(client: Any, name: str) -> ImageStatus:
    """Whether ``sandvisor/<name>:latest`` exists and was built from the current sources."""
    current = source_hash(name)
    repo = repository(name)
    with engine_errors(f"inspect {repo}:latest"):
        data = inspect(client, f"{repo}:latest")
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


def prune_old(client: Any, name: str, keep: str) -> None:
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
