"""Whether a runtime really starts a container: a throwaway probe container, labelled so
that no sweep mistakes it for a task."""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from supervisor.core.container import ContainerRequest
from supervisor.core.errors import SupervisorError
from supervisor.core.policy import PolicySet
from supervisor.engine.base import Backend

PROBE_LABEL = "io.sandvisor.probe"


async def probe_runtime(
    backend: Backend, runtime: str, policies: PolicySet | None = None
) -> str | None:
    """Start a throwaway container under ``runtime``; None if it ran ``true``, else why not."""
    image = "sandvisor/minimal:latest"
    if policies is not None:
        for p in policies.all():
            if p.runtime == runtime:
                image = p.image
                break
    if await backend.image_id(image) is None:
        image = "sandvisor/minimal:latest"
        if await backend.image_id(image) is None:
            return f"no image to probe with ({image} is missing; run `sandvisor images build`)"
    req = ContainerRequest(
        name=f"sandvisor-probe-{secrets.token_hex(4)}",
        image=image,
        command=["/bin/sh", "-c", "true"],
        labels={PROBE_LABEL: runtime},
        user="65534:65534",
        working_dir="/",
        runtime=runtime,
        memory_bytes=256 * 1024 * 1024,
        nano_cpus=1_000_000_000,
        pids_limit=128,
        stdin_open=False,
    )
    cid: str | None = None
    try:
        cid = await backend.create(req)
        await backend.start(cid)
        state = await asyncio.wait_for(backend.wait(cid), 60)
    except TimeoutError:
        return "probe container did not finish within 60 s"
    except SupervisorError as exc:
        return str(exc)
    else:
        if state.exit_code != 0:
            return f"probe container exited with {state.exit_code}: {state.error or ''}".strip()
        return None
    finally:
        if cid is not None:
            with contextlib.suppress(SupervisorError):
                await backend.remove(cid)
