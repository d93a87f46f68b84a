"""Which engine backend the supervisor runs on: ``docker`` (one engine, the default) or
``swarm`` (a Swarm cluster through a manager), from ``SANDVISOR_BACKEND`` or
``sandvisor serve --backend``. TLS to a Swarm's node engines: ``SANDVISOR_SWARM_TLS_DIR``
(ca.pem, cert.pem, key.pem). The docker backend's calls each have a deadline
(engine/deadlines.py): ``engine_timeout_s``, else ``SANDVISOR_ENGINE_TIMEOUT_S``, else 30 s."""

from __future__ import annotations

import math
import os

from supervisor.core.errors import PolicyError
from supervisor.engine.base import Backend
from supervisor.engine.deadlines import ENGINE_TIMEOUT_S, Deadlines, deadlines_for

BACKENDS = ("docker", "swarm")


def backend_kind() -> str:
    kind = os.environ.get("SANDVISOR_BACKEND", "").strip() or "docker"
    if kind not in BACKENDS:
        raise PolicyError(f"SANDVISOR_BACKEND={kind!r}: expected one of {', '.join(BACKENDS)}")
    return kind


def engine_timeout_s() -> float:
    """The deadline of an engine call: ``SANDVISOR_ENGINE_TIMEOUT_S``, else 30 s."""
    text = os.environ.get("SANDVISOR_ENGINE_TIMEOUT_S", "").strip()
    if not text:
        return ENGINE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise PolicyError(
            f"SANDVISOR_ENGINE_TIMEOUT_S={text!r}: expected a positive number of seconds"
        )
    return value


def make_backend(
    docker_host: str | None, kind: str | None = None, *, engine_timeout: float | None = None
) -> Backend:
    """The backend for ``kind`` (default: SANDVISOR_BACKEND), its engine (or manager) at
    ``docker_host`` (default: DOCKER_HOST). A docker backend's calls each have a deadline of
    ``engine_timeout`` seconds (default: :func:`engine_timeout_s`)."""
    kind = kind or backend_kind()
    if kind == "swarm":
        from supervisor.engine.swarm.backend import SwarmBackend  # noqa: PLC0415

        return SwarmBackend(docker_host, tls_dir=os.environ.get("SANDVISOR_SWARM_TLS_DIR") or None)
    from supervisor.engine.docker import DockerBackend  # noqa: PLC0415 - optional dep

    timeout = engine_timeout if engine_timeout is not None else engine_timeout_s()
    return Deadlines(DockerBackend(docker_host), deadlines_for(timeout))
