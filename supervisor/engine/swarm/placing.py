"""Which nodes may take a task: Swarm places by constraints alone, so the backend first
rules out nodes that are down, drained, mute, or run another runtime by default (a service
cannot choose its runtime), and fails closed when none is left."""

from __future__ import annotations

import asyncio

from supervisor.core.container import ContainerRequest
from supervisor.core.placement import matches_all, parse_constraint
from supervisor.engine.swarm.nodes import NodeRegistry, NodeView


async def eligible_nodes(
    nodes: NodeRegistry, request: ContainerRequest
) -> tuple[list[NodeView], list[str]]:
    """Nodes that may take the task (ready, active, engine answering as that node,
    default runtime = the policy's, matching its placement), and why each other one
    may not."""
    wanted = [parse_constraint(c) for c in request.placement]
    views = list((await nodes.refresh()).values())
    facts = await asyncio.gather(*(nodes.facts(v.id) for v in views))
    ok: list[NodeView] = []
    why: list[str] = []
    for view, fact in zip(views, facts, strict=True):
        if not view.schedulable:
            why.append(f"{view.name()}: {view.state}/{view.availability}")
        elif not fact.answers:
            why.append(f"{view.name()}: engine does not answer ({fact.error})")
        elif fact.default_runtime != request.runtime:
            why.append(f"{view.name()}: runs {fact.default_runtime}, not {request.runtime}")
        elif not matches_all(wanted, view.attrs()):
            why.append(f"{view.name()}: does not match {', '.join(request.placement)}")
        else:
            ok.append(view)
    return ok, why
