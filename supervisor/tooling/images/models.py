"""What the image tooling reports: an image's state against its sources, a build's outcome."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageStatus(_Model):
    """What the engine has for one sandbox image, compared with its sources."""

    name: str
    """Image name (``minimal``, ``debian``, ``dev``)."""
    repository: str
    """``sandvisor/<name>``."""
    source_hash: str
    """Content hash of the image's current sources."""
    tag: str
    """``sandvisor/<name>:<source_hash>``: the tag an up-to-date build carries."""
    present: bool
    """Whether ``sandvisor/<name>:latest`` exists."""
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
    """``sandvisor/<name>:<source_hash>``."""
    image_id: str
    """Image id both ``tag`` and ``latest`` point at."""
    built: bool
    """False when an image for the current sources existed and was reused."""
    method: Literal["cached", "dockerfile", "debootstrap"]
    """How the image came to be: reused, ``docker build``, or debootstrap + import."""
    seconds: float
    """Wall time of the call."""
