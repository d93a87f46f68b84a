"""The Docker Engine backend: ``backend`` (control calls), ``attach`` (the stdio stream),
``http`` (raw asyncio HTTP to the engine), ``convert`` (API bodies and errors)."""

from __future__ import annotations

from supervisor.engine.docker.backend import DockerBackend
from supervisor.engine.docker.convert import request_to_config
from supervisor.engine.docker.http import attach_request

__all__ = ["DockerBackend", "attach_request", "request_to_config"]
