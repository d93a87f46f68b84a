"""Container engine backends behind one small Protocol (Docker first; Kubernetes later)."""

from supervisor.backend.base import (
    AttachedStream,
    Backend,
    ContainerRequest,
    ContainerState,
    ContainerSummary,
)

__all__ = ["AttachedStream", "Backend", "ContainerRequest", "ContainerState", "ContainerSummary"]
