"""The one network Swarm tasks join: Swarm offers services no ``none`` network, so tasks get
``sandvisor-tasks``, an internal overlay network (no route out of the cluster, no gateway).

Not a bridge made from per-node config networks (which could turn traffic between
containers off): Engine 20.10 loses such a network's local part when a node's engine
restarts and then rejects every task there with "network … exists". On an overlay, tasks
can reach each other; docs/swarm.md says so, and gVisor nodes (runsc --network=none) have
no network at all."""

from __future__ import annotations

from supervisor.core.errors import EngineError
from supervisor.engine.swarm.manager import ManagerAPI
from supervisor.engine.swarm.spec import ISOLATED_NETWORK, LABEL_INFRA


async def ensure_isolated_network(manager: ManagerAPI) -> None:
    """Create the network unless it exists (it is kept: it holds no task state)."""
    if await manager.network(ISOLATED_NETWORK) is not None:
        return
    try:
        await manager.create_network(
            {
                "Name": ISOLATED_NETWORK,
                "Driver": "overlay",
                "Scope": "swarm",
                "Internal": True,
                "Attachable": False,
                "Labels": {LABEL_INFRA: "swarm-network"},
            }
        )
    except EngineError as exc:
        if "already exists" not in str(exc):
            raise
