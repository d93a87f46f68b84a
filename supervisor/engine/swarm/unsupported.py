"""What a Swarm backend's tasks do not get from the host: session networks, named volumes
(workspaces) and live-restore; callers check ``EngineCapabilities`` before asking."""

from __future__ import annotations

from supervisor.core.container import NetworkSummary, VolumeRequest, VolumeSummary
from supervisor.core.errors import Unsupported


class WithoutHostResources:
    """The Protocol's network and volume calls, refused or empty."""

    async def live_restore(self) -> bool:
        return False  # incompatible with swarm mode

    async def ensure_network(
        self, name: str, labels: dict[str, str], *, internal: bool = False
    ) -> None:
        raise Unsupported("the swarm backend has no session networks")

    async def remove_network(self, name: str) -> None:
        return None

    async def list_networks(self, label: str) -> list[NetworkSummary]:
        # Its one network (sandvisor-tasks) is infrastructure, kept: no session has one.
        return []

    async def create_volume(self, request: VolumeRequest) -> None:
        raise Unsupported("the swarm backend has no workspaces (volumes)")

    async def remove_volume(self, name: str) -> None:
        return None

    async def list_volumes(self, label: str) -> list[VolumeSummary]:
        return []
