"""Which engine backend the supervisor runs on: ``docker`` (one engine, the default) or
``swarm`` (a Swarm cluster through a manager), from ``SANDVISOR_BACKEND`` or
``sandvisor serve --backend``. TLS to a Swarm's node engines: ``SANDVISOR_SWARM_TLS_DIR``
(ca.pem, cert.pem, key.pem)."""

from __future__ import annotations

import os

from supervisor.core.errors import PolicyError
from supervisor.engine.base import Backend

BACKENDS = ("docker", "swarm")


def backend_kind() -> str:
    kind = os.environ.get("SANDVISOR_BACKEND", "").strip() or "docker"
    if kind not in BACKENDS:
        raise PolicyError(f"SANDVISOR_BACKEND={kind!r}: expected one of {', '.join(BACKENDS)}")
    return kind


def make_backend(docker_host: str | None, kind: str | None = None) -> Backend:
    """The backend for ``kind`` (default: SANDVISOR_BACKEND), its engine (or manager) at
    ``docker_host`` (default: DOCKER_HOST)."""
    kind = kind or backend_kind()
    if kind == "swarm":
        from supervisor.engine.swarm.backend import SwarmBackend  # noqa: PLC0415

        return SwarmBackend(docker_host, tls_dir=os.environ.get("SANDVISOR_SWARM_TLS_DIR") or None)
    from supervisor.engine.docker import DockerBackend  # noqa: PLC0415 - optional dep

    return DockerBackend(docker_host)
