"""The one network Swarm tasks join: Swarm offers services no ``none`` network, so tasks get
``sbx-isolated``, a swarm-scoped bridge that is internal (no route out), with traffic between
its containers off and no address on the node's side. Its per-node settings live in a
config-only network on every node's engine."""

from __future__ import annotations

import json
import urllib.parse

from supervisor.core.errors import EngineError, SupervisorError
from supervisor.core.logs import get_logger
from supervisor.engine.docker import http
from supervisor.engine.swarm.manager import ManagerAPI
from supervisor.engine.swarm.nodes import NodeRegistry
from supervisor.engine.swarm.spec import (
    API_VERSION,
    ISOLATED_CONFIG,
    ISOLATED_NETWORK,
    ISOLATED_OPTIONS,
    LABEL_INFRA,
)

log = get_logger("supervisor.engine.swarm")


async def ensure_isolated_network(manager: ManagerAPI, nodes: NodeRegistry) -> None:
    """Create the config-only network on every node whose engine answers, then the swarm
    network from it (both are kept: they hold no task state)."""
    prefix = f"/v{API_VERSION}"
    body = json.dumps(
        {
            "Name": ISOLATED_CONFIG,
            "ConfigOnly": True,
            "Options": ISOLATED_OPTIONS,
            "Labels": {LABEL_INFRA: "swarm-network"},
        }
    ).encode()
    query = urllib.parse.quote(json.dumps({"name": [ISOLATED_CONFIG]}))
    for node_id in list(nodes.nodes):
        try:
            engine = nodes.engine(node_id)
            # The engine creates config-only networks of the same name again and again (and
            # a swarm network made from one is then ambiguous): create only when missing.
            status, raw = await http.exchange(
                engine.endpoint, prefix, "GET", f"/networks?filters={query}", timeout=10.0
            )
            if status == 200 and any(n.get("Name") == ISOLATED_CONFIG for n in json.loads(raw)):
                continue
            status, raw = await http.exchange(
                engine.endpoint, prefix, "POST", "/networks/create", timeout=10.0, body=body
            )
        except (SupervisorError, TimeoutError, OSError, ValueError) as exc:
            log.warning("swarm_network_node_skipped", node=node_id, error=str(exc))
            continue
        if status >= 400:
            raise EngineError(f"{nodes.describe(node_id)}: config network: {raw[:200]!r}")
    if await manager.network(ISOLATED_NETWORK) is not None:
        return
    try:
        await manager.create_network(
            {
                "Name": ISOLATED_NETWORK,
                "Driver": "bridge",
                "Scope": "swarm",
                "Internal": True,
                # No labels: a network made from a config network takes no settings of its
                # own (the engine refuses them); it is found by name.
                "ConfigFrom": {"Network": ISOLATED_CONFIG},
            }
        )
    except EngineError as exc:
        if "already exists" not in str(exc):
            raise
