"""``sandvisor doctor`` on a Swarm: one check per node (role, state, availability, its engine
endpoint from the ``io.sandvisor.engine`` label, whether that engine answers as that node, its
default runtime and labels), plus what Swarm cannot express and what stands in for it."""

from __future__ import annotations

import asyncio

from supervisor.core.errors import SupervisorError
from supervisor.engine.base import Backend
from supervisor.engine.swarm.backend import SwarmBackend
from supervisor.engine.swarm.nodes import NodeView, endpoint_problem
from supervisor.engine.swarm.spec import UNEXPRESSED
from supervisor.tooling.doctor_model import Check, CheckStatus


async def node_checks(backend: Backend) -> list[Check]:
    """Checks for a Swarm backend's nodes (none for another backend)."""
    if not isinstance(backend, SwarmBackend):
        return []
    try:
        views = list((await backend.nodes.refresh()).values())
    except SupervisorError as exc:
        return [Check(name="swarm nodes", status="fail", detail=f"cannot list nodes: {exc}")]
    checks = await asyncio.gather(*(_node_check(backend, v) for v in views))
    schedulable = [c for c in checks if c.status == "ok"]
    summary = Check(
        name="swarm nodes",
        status="ok" if schedulable else "fail",
        detail=f"{len(schedulable)} of {len(views)} nodes can take tasks",
        facts={"nodes": len(views), "usable": len(schedulable), "unexpressed": UNEXPRESSED},
    )
    return [summary, *sorted(checks, key=lambda c: c.name)]


async def _node_check(backend: SwarmBackend, view: NodeView) -> Check:
    facts = await backend.nodes.facts(view.id, fresh=True)
    url = view.engine_url
    problem = endpoint_problem(url, backend.nodes.tls_dir)
    status: CheckStatus = "ok"
    if problem is not None or not facts.answers:
        status = "fail" if view.schedulable else "warn"
    elif not view.schedulable:
        status = "warn"
    labels = ", ".join(
        f"{k}={v}" for k, v in sorted(view.labels.items()) if k != "io.sandvisor.engine"
    )
    answer = (
        f"answers, default runtime {facts.default_runtime}"
        if facts.answers
        else f"does not answer ({problem or facts.error})"
    )
    return Check(
        name=f"node {view.hostname}",
        status=status,
        detail=(
            f"{view.role}, {view.state}/{view.availability}, engine {url or '(no label)'} "
            f"{answer}; labels: {labels or 'none'}"
        ),
        facts={
            "id": view.id,
            "role": view.role,
            "state": view.state,
            "availability": view.availability,
            "engine": url,
            "answers": facts.answers,
            "default_runtime": facts.default_runtime,
            "runtimes": sorted(facts.runtimes),
            "labels": view.labels,
            "engine_version": view.engine_version,
        },
    )
